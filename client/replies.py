"""Reply decoding for the PFX* commands, and the typed results they decode to.

Every PFX* reply is a map: a RESP3 map (a dict from redis-py) or, under RESP2,
a flat ``[name, value, name, value, ...]`` array; nested maps (PFXINFO's
``arena`` and ``stats``) come the same way. Names arrive as bytes (the client
reads replies undecoded so that WITHDATA's binary payload is never run through
a text codec) and are returned as ``str``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def _text(value: Any) -> Any:
    """bytes -> str when it is UTF-8 (names, policies, paths); anything else unchanged."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return bytes(value)  # e.g. a binary namespace: keep it exact
    return value


def as_map(reply: Any) -> dict[str, Any]:
    """A RESP3 map or a RESP2 flat name/value array as a dict with str names."""
    if isinstance(reply, dict):
        return {_text(k): v for k, v in reply.items()}
    if isinstance(reply, (list, tuple)) and len(reply) % 2 == 0:
        return {_text(reply[i]): reply[i + 1] for i in range(0, len(reply), 2)}
    raise TypeError(f"expected a map reply, got {type(reply).__name__}: {reply!r:.200}")


def _blocks(value: Any) -> list[int]:
    return [int(b) for b in (value or [])]


# -- results -----------------------------------------------------------------------------------------


class _Leased:
    """Mixin for results that may hold a lease: releasable once, usable as a (async) context manager.

    A result dropped with its lease unreleased hands the lease to its cache's
    ``_dropped`` callback when it is garbage collected (the cache releases it
    as soon as its connection is free) and warns with a ResourceWarning, as
    an unclosed file does.
    """

    lease: int
    _release: Callable[[int], Any] | None
    _dropped: Callable[[int], bool] | None
    _async: bool
    _released: bool

    @property
    def released(self) -> bool:
        """True once release() ran (or there was never a lease to release)."""
        return self._released or not self.lease

    def release(self) -> Any:
        """End the lease (no-op when there is none or it already ended).

        Returns how many leases ended (0 or 1); with an ``AsyncPrefixCache`` it
        returns a coroutine to await.
        """
        done = self.released or self._release is None
        self._released = True
        if done:
            return _zero() if self._async else 0
        return self._release(self.lease)

    def __del__(self) -> None:
        if self._released or not self.lease or self._dropped is None:
            return
        self._released = True
        try:
            # Released first: a warnings filter set to "error" must not keep the lease.
            if not self._dropped(self.lease):
                return  # its cache was closed, which ended the lease
            warnings.warn(f"{type(self).__name__} with lease {self.lease} was never released: released now "
                          "(use 'with' or release())", ResourceWarning, source=self)
        except Exception:
            pass  # never raise from a finaliser (interpreter shutdown, warnings as errors)

    def __enter__(self):
        if self._async:
            raise TypeError("this result belongs to an AsyncPrefixCache: use 'async with'")
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: object) -> None:
        result = self.release()
        if self._async:
            await result


async def _zero() -> int:
    return 0


@dataclass(repr=False)
class Match(_Leased):
    """What PFXGET found: the first ``matched_tokens`` tokens are cached in ``blocks`` (one per page).

    ``lease`` pins those blocks until released (0: no lease was taken, or nothing matched).
    ``data`` holds the pages' bytes when they came over RESP (WITHDATA), else None.
    ``via`` says how bytes moved for load(): ``"shm"``/``"cuda"`` (the mapped arena),
    ``"resp"`` (WITHDATA) or None (a lookup() without WITHDATA moves no bytes).
    Use it as a context manager (``with``, or ``async with`` for an AsyncPrefixCache)
    to release the lease on exit.
    """

    matched_tokens: int
    lease: int
    blocks: list[int]
    data: bytes | None = None
    via: str | None = None
    # Private bookkeeping: keyword-only (after the public fields), out of repr and ==.
    _release: Callable[[int], Any] | None = field(default=None, repr=False, compare=False, kw_only=True)
    _dropped: Callable[[int], bool] | None = field(default=None, repr=False, compare=False, kw_only=True)
    _async: bool = field(default=False, repr=False, compare=False, kw_only=True)
    _released: bool = field(default=False, repr=False, compare=False, kw_only=True)

    @property
    def pages(self) -> int:
        """Matched pages (== len(blocks))."""
        return len(self.blocks)

    def __bool__(self) -> bool:
        return self.matched_tokens > 0

    def __repr__(self) -> str:
        # The payload can be megabytes: show its size, not its bytes.
        data = "None" if self.data is None else f"<{len(self.data)} bytes>"
        return (f"Match(matched_tokens={self.matched_tokens}, lease={self.lease}, blocks={self.blocks}, "
                f"data={data}, via={self.via!r})")


@dataclass
class Allocation(_Leased):
    """Fresh blocks from PFXALLOC, pinned by ``lease`` for a writer who fills them and commits them.

    Releasing it after a commit is harmless (the committed blocks have left the lease);
    releasing it before gives the blocks back. Use it as a context manager.
    """

    lease: int
    blocks: list[int]
    # Private bookkeeping: keyword-only (after the public fields), out of repr and ==.
    _release: Callable[[int], Any] | None = field(default=None, repr=False, compare=False, kw_only=True)
    _dropped: Callable[[int], bool] | None = field(default=None, repr=False, compare=False, kw_only=True)
    _async: bool = field(default=False, repr=False, compare=False, kw_only=True)
    _released: bool = field(default=False, repr=False, compare=False, kw_only=True)


@dataclass(frozen=True)
class StoreResult:
    """PFXSET: ``stored`` new pages, ``existing`` pages already cached, ``blocks`` of the whole sequence.

    ``via``: ``"resp"`` (the bytes went in a DATA argument) or the arena backend
    (``"shm"``/``"cuda"``: written in place, committed with BLOCKS).
    """

    stored: int
    existing: int
    blocks: list[int]
    via: str = "resp"


@dataclass(frozen=True)
class EvictResult:
    """PFXEVICT: ``evicted`` pages, ``freed_bytes``, ``pinned`` pages kept because leased."""

    evicted: int
    freed_bytes: int
    pinned: int


@dataclass(frozen=True)
class Info:
    """PFXINFO: geometry, the arena (as the daemon describes it), policy, lease TTL and stats.

    ``arena`` keeps the daemon's names (``backend``, ``name``, ``path``, ``size``,
    ``block_bytes``, ``nblocks``, ``blocks-total``, ``blocks-free``);
    ``stats`` is global, or the namespace's when PFXINFO was given a key.
    """

    page_size: int
    block_bytes: int
    arena: dict[str, Any]
    policy: str
    lease_ttl_ms: int
    stats: dict[str, Any]


# -- decoders ----------------------------------------------------------------------------------------


def match(reply: Any, release: Callable[[int], Any] | None = None, is_async: bool = False,
          dropped: Callable[[int], bool] | None = None) -> Match:
    fields = as_map(reply)
    data = fields.get("data")
    return Match(
        matched_tokens=int(fields["matched"]),
        lease=int(fields["lease"]),
        blocks=_blocks(fields["blocks"]),
        data=bytes(data) if data is not None and not isinstance(data, bytes) else data,
        _release=release,
        _dropped=dropped,
        _async=is_async,
    )


def store_result(reply: Any, via: str = "resp") -> StoreResult:
    fields = as_map(reply)
    return StoreResult(int(fields["stored"]), int(fields["existing"]), _blocks(fields["blocks"]), via)


def allocation(reply: Any, release: Callable[[int], Any] | None = None, is_async: bool = False,
               dropped: Callable[[int], bool] | None = None) -> Allocation:
    fields = as_map(reply)
    return Allocation(lease=int(fields["lease"]), blocks=_blocks(fields["blocks"]), _release=release,
                      _dropped=dropped, _async=is_async)


def evict_result(reply: Any) -> EvictResult:
    fields = as_map(reply)
    return EvictResult(int(fields["evicted"]), int(fields["freed"]), int(fields["pinned"]))


# Binary fields stay bytes even when they happen to be valid UTF-8 (the cuda arena's IPC handle).
_BINARY = frozenset({"handle"})


def _plain_map(reply: Any) -> dict[str, Any]:
    out = {}
    for name, value in as_map(reply).items():
        if name not in _BINARY:
            value = _text(value)
        if name == "hit_rate":
            value = float(value)  # a RESP3 double; text under RESP2
        out[name] = value
    return out


def info(reply: Any) -> Info:
    fields = as_map(reply)
    return Info(
        page_size=int(fields["page-size"]),
        block_bytes=int(fields["block-bytes"]),
        arena=_plain_map(fields["arena"]),
        policy=_text(fields["policy"]),
        lease_ttl_ms=int(fields["lease-ttl"]),
        stats=_plain_map(fields["stats"]),
    )


def released(reply: Any) -> int:
    return int(reply)
