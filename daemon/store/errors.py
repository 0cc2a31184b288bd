"""Errors the store raises for requests it refuses.

Each error carries the RESP error code the daemon sends (``-CODE message``).
When a store method raises one of these, the store is exactly as it was
before the call: validation always happens before any mutation.
"""

from __future__ import annotations


class StoreError(Exception):
    """A refused request: ``code`` is the RESP error code, ``message`` the text after it."""

    code = "ERR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def line(self) -> str:
        """The full RESP error line without the leading '-': ``"CODE message"``."""
        return f"{self.code} {self.message}"

    def __str__(self) -> str:
        return self.message


class BadRequest(StoreError):
    """Malformed or out-of-range arguments."""

    code = "ERR"


class OutOfMemory(StoreError):
    """Not enough free or evictable blocks: the rest of the arena is pinned."""

    code = "OOM"


class NoPrefix(StoreError):
    """An insert at an offset whose preceding pages are not cached."""

    code = "NOPREFIX"
