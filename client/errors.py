"""Exceptions of the worker client.

The daemon's refusals (``-OOM``, ``-NOPREFIX``, ``-ERR ...``) arrive from
redis-py as ``redis.ResponseError`` (or its ``OutOfMemoryError`` subclass);
:func:`translate` turns them into the classes below, keeping the daemon's
message, so a worker can catch ``CacheFullError`` without parsing text. They
stay ``redis.ResponseError`` subclasses so code that already catches redis-py
errors keeps working.
"""

from __future__ import annotations

import redis
from redis.exceptions import OutOfMemoryError


class PrefixCacheError(redis.ResponseError):
    """The daemon refused a request (``-ERR``): bad arguments, unknown lease, etc.

    ``str(exc)`` is the daemon's message without the error code; ``exc.code``
    is the code (``"ERR"``, ``"OOM"``, ``"NOPREFIX"``).
    """

    code = "ERR"

    def __init__(self, message: str, code: str | None = None) -> None:
        try:
            super().__init__(message, status_code=code or self.code)
        except TypeError:  # redis-py before 6 has no status_code
            super().__init__(message)
            self.status_code = code or self.code
        self.message = message
        if code:
            self.code = code


class CacheFullError(PrefixCacheError, OutOfMemoryError):
    """``-OOM``: the arena has no free or evictable block left (everything else is pinned by leases)."""

    code = "OOM"


class NoPrefixError(PrefixCacheError):
    """``-NOPREFIX``: a store at an OFFSET whose preceding pages are not cached."""

    code = "NOPREFIX"


class LeaseLostError(PrefixCacheError):
    """A lease an operation relied on was gone when it ended (its TTL passed, or the connection was
    re-established and the daemon ended the old one's leases): the bytes it moved cannot be trusted."""


class AttachError(RuntimeError):
    """The daemon's arena cannot be mapped into this process (another host, no file, no CUDA support...)."""


def translate(exc: redis.ResponseError) -> PrefixCacheError:
    """The client exception for an error reply redis-py raised (already translated ones pass through)."""
    if isinstance(exc, PrefixCacheError):
        return exc
    text = str(exc)
    # redis-py strips the code of the errors it knows (ERR, OOM) and records it in
    # status_code; unknown codes such as NOPREFIX stay at the front of the message,
    # unrecorded before redis-py 8.2 and recorded since.
    code = getattr(exc, "status_code", None)
    if code is None:
        head, _, rest = text.partition(" ")
        if head.isupper() and head.isalpha() and rest:
            code, text = head, rest
        else:
            code = "ERR"
    elif text.startswith(code + " "):
        text = text[len(code) + 1 :]
    if code == "OOM" or isinstance(exc, OutOfMemoryError):
        return CacheFullError(text)
    if code == "NOPREFIX":
        return NoPrefixError(text)
    return PrefixCacheError(text, code)
