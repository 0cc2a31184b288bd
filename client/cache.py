"""PrefixCache (redis-py, blocking) and AsyncPrefixCache (redis.asyncio): the worker's API.

Both wrap a redis-py client without changing it: requests are built by
:mod:`.commands`, sent with the client's ``execute_command`` and decoded by
:mod:`.replies` into dataclasses. Bytes move one of two ways, and every
result says which (``via``):

* ``"shm"`` (or ``"cuda"``): the daemon's arena is mapped into this process
  (:meth:`PrefixCache.attach`); KV bytes are copied straight between the
  worker's arrays and the arena, and only block ids cross the socket.
* ``"resp"``: the daemon is on another host, its arena file is absent, or
  ``attach=False``; the same calls carry the bytes in ``WITHDATA`` replies
  and ``DATA`` arguments.

Leases belong to a connection (the daemon ends them when it closes, which is
how a dead worker's pins are freed), so a cache always talks over ONE
connection: its own single-connection client, or, when handed a pooled
client, a single-connection client on that client's pool.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any, Self

import redis
import redis.asyncio
from redis.client import NEVER_DECODE

from . import commands, replies
from .arena import copy_to_output, nbytes_of, open_arena
from .errors import AttachError, translate
from .replies import Allocation, EvictResult, Info, Match, StoreResult, _Leased


def _is_local_host(host: str | None) -> bool:
    """True when ``host`` is this machine's loopback (or a unix socket: host None)."""
    if host is None:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def _daemon_host(pool: Any) -> str | None:
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    if "path" in kwargs and "host" not in kwargs:
        return None  # a unix socket: same machine
    return kwargs.get("host", "localhost")


def _lease_ids(leases: tuple) -> tuple[list[int], list[_Leased]]:
    ids: list[int] = []
    results: list[_Leased] = []
    for item in leases:
        if isinstance(item, (list, tuple)):
            more, objs = _lease_ids(tuple(item))
            ids += more
            results += objs
        elif isinstance(item, _Leased):
            if not item.released:
                ids.append(item.lease)
                results.append(item)
        else:
            ids.append(item)
    return ids, results


class _Base:
    """What the sync and async caches share: attach state, geometry, planning of load/save."""

    _client: Any

    def __init__(self, attach: bool | None) -> None:
        if attach not in (None, True, False):
            raise ValueError("attach must be None (when local), True (required) or False (never)")
        self._attach_mode = attach
        self._arena: Any = None
        self._attach_tried = attach is False
        self._attach_error: str | None = "attach=False" if attach is False else None
        self._geometry: Info | None = None

    # -- state -----------------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The redis-py client this cache sends its commands through (one connection)."""
        return self._client

    @property
    def arena(self) -> Any:
        """The mapped arena view (ShmArenaView or the CUDA one), or None (no I/O)."""
        return self._arena

    @property
    def attach_error(self) -> str | None:
        """Why the arena is not mapped (None while attached or not yet tried)."""
        return self._attach_error

    @property
    def via(self) -> str:
        """How bytes move now: the arena backend (``"shm"``/``"cuda"``) when attached, else ``"resp"``."""
        return self._arena.backend if self._arena is not None else "resp"

    @property
    def geometry(self) -> Info | None:
        """The PFXINFO read when the cache first needed page size / block size / arena (None before)."""
        return self._geometry

    def _open(self, info: Info) -> Any:
        """Map the arena ``info`` describes; AttachError with the reason when it cannot be."""
        if self._attach_mode is False:
            raise AttachError("this cache was made with attach=False")
        host = _daemon_host(self._client.connection_pool)
        if self._attach_mode is None and not _is_local_host(host):
            raise AttachError(f"the daemon at {host} is not on this host (pass attach=True to map its arena anyway)")
        return open_arena(info.arena)

    def _attached_now(self, info: Info, explicit: bool) -> Any:
        self._attach_tried = True
        try:
            self._arena = self._open(info)
            self._attach_error = None
        except AttachError as exc:
            self._attach_error = str(exc)
            if explicit or self._attach_mode is True:
                raise
        return self._arena

    def _release_arena(self) -> None:
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    # -- load / save planning ----------------------------------------------------------------------

    @staticmethod
    def _load_tokens(packed: bytes, out: Any, info: Info) -> bytes:
        """The tokens to look up for load(): cut to the whole pages ``out`` can hold (if it is short)."""
        capacity = nbytes_of(out) // info.block_bytes
        if len(packed) // 4 // info.page_size > capacity:
            return packed[: capacity * info.page_size * 4]
        return packed

    @staticmethod
    def _save_pages(packed: bytes, src: Any, offset: int, info: Info) -> int | None:
        """Pages save() writes from ``offset`` (None: let the daemon judge the offset over RESP)."""
        npages = len(packed) // 4 // info.page_size
        if not isinstance(offset, int) or offset < 0 or offset % info.page_size or offset > npages * info.page_size:
            return None
        pages = npages - offset // info.page_size
        need = pages * info.block_bytes
        if nbytes_of(src) != need:
            raise ValueError(f"src is {nbytes_of(src)} bytes; {pages} pages from offset {offset} "
                             f"x block_bytes {info.block_bytes} = {need}")
        return pages


class PrefixCache(_Base):
    """The prefix cache, for a worker using blocking redis-py.

    ``PrefixCache(client)`` wraps a ``redis.Redis``; ``PrefixCache.from_url(url)``
    makes its own. ``attach``: None (default) maps the daemon's arena when the
    daemon is on this host and its file is there, else falls back to RESP;
    True requires the mapping (AttachError otherwise); False never maps it.
    Not thread-safe beyond what the single connection serialises.
    """

    def __init__(self, client: redis.Redis, *, attach: bool | None = None, _owned: bool = False) -> None:
        if not isinstance(client, redis.Redis):
            raise TypeError("PrefixCache needs a redis.Redis (use AsyncPrefixCache for redis.asyncio)")
        super().__init__(attach)
        self._owned = _owned
        self._derived = False
        if client.connection is None:
            # A pooled client may run each command on a different connection, and
            # leases are per connection: take one connection from the same pool.
            client = redis.Redis(connection_pool=client.connection_pool, single_connection_client=True)
            self._derived = True
        self._client = client

    @classmethod
    def from_url(cls, url: str, *, attach: bool | None = None, **kwargs: Any) -> PrefixCache:
        """Connect to ``redis://host:port/0`` (RESP3 unless ``?protocol=2`` or protocol=2 is given)."""
        kwargs.setdefault("protocol", 3)
        kwargs["single_connection_client"] = True
        return cls(redis.Redis.from_url(url, **kwargs), attach=attach, _owned=True)

    # -- plumbing ----------------------------------------------------------------------------------

    def _execute(self, *args: Any) -> Any:
        try:
            # NEVER_DECODE: WITHDATA payloads are binary even on a decode_responses client.
            return self._client.execute_command(*args, **{NEVER_DECODE: True})
        except redis.ResponseError as exc:
            raise translate(exc) from None

    def _info(self) -> Info:
        if self._geometry is None:
            self._geometry = self.info()
        return self._geometry

    def _ensure_attached(self) -> Any:
        if not self._attach_tried:
            self._attached_now(self._info(), explicit=False)
        return self._arena

    def attach(self) -> Any:
        """Map the daemon's arena now (if not yet) and return the view; AttachError says why not."""
        if self._arena is None:
            self._attached_now(self._info(), explicit=True)
        return self._arena

    @property
    def attached(self) -> bool:
        """Whether the arena is mapped (the first access tries, which sends one PFXINFO)."""
        return self._ensure_attached() is not None

    # -- commands ----------------------------------------------------------------------------------

    def lookup(self, key: Any, tokens: Any, *, lease: bool = True, ttl_ms: int | None = None,
               with_data: bool | None = None) -> Match:
        """PFXGET: the longest cached whole-page prefix of ``tokens`` in namespace ``key``.

        ``lease``: pin the matched blocks until the Match is released (use it as a
        context manager). ``ttl_ms``: the lease's lifetime (default: the daemon's
        lease-ttl). ``with_data``: bring the pages' bytes in ``Match.data``; None
        means "when the arena is not attached", so the bytes are reachable either way.
        """
        packed = commands.pack_tokens(tokens)  # validated before anything is sent
        if with_data is None:
            with_data = self._ensure_attached() is None
        reply = self._execute(*commands.pfxget(key, packed, lease=lease, ttl_ms=ttl_ms, with_data=with_data))
        match = replies.match(reply, self.release)
        if with_data:
            match.via = "resp"
        return match

    def store(self, key: Any, tokens: Any, data: Any, offset: int = 0) -> StoreResult:
        """PFXSET DATA: cache the whole pages of ``tokens`` from ``offset`` (tokens) with their KV bytes.

        ``data``: bytes / numpy / torch, exactly (pages from offset) x block_bytes bytes.
        The pages before ``offset`` must be cached (NoPrefixError otherwise).
        """
        packed = commands.pack_tokens(tokens)
        return replies.store_result(self._execute(*commands.pfxset_data(key, packed, data, offset)))

    def alloc(self, key: Any, n: int, ttl_ms: int | None = None) -> Allocation:
        """PFXALLOC: ``n`` fresh blocks pinned for this worker to fill (CacheFullError when none can be had)."""
        reply = self._execute(*commands.pfxalloc(key, n, ttl_ms))
        return replies.allocation(reply, self.release)

    def commit(self, key: Any, tokens: Any, blocks: Any, offset: int = 0) -> StoreResult:
        """PFXSET BLOCKS: hand blocks filled in the arena (from alloc()) over as the pages from ``offset``."""
        if isinstance(blocks, Allocation):
            blocks = blocks.blocks
        packed = commands.pack_tokens(tokens)
        reply = self._execute(*commands.pfxset_blocks(key, packed, blocks, offset))
        return replies.store_result(reply, via=self._arena.backend if self._arena is not None else "shm")

    def evict(self, key: Any, tokens: Any = None, pages: int | None = None, bytes: int | None = None,
              all: bool = False) -> EvictResult:
        """PFXEVICT one of: the cached sequences starting with ``tokens``, ``pages`` pages,
        ``bytes`` bytes, or ``all`` the namespace's unpinned pages."""
        packed = commands.pack_tokens(tokens) if tokens is not None else None
        return replies.evict_result(self._execute(*commands.pfxevict(key, packed=packed, pages=pages,
                                                                     nbytes=bytes, all_=all)))

    def release(self, *leases: Any) -> int:
        """PFXRELEASE: end leases (ids, Match or Allocation objects); returns how many ended."""
        ids, results = _lease_ids(leases)
        for result in results:
            result._released = True
        if not ids:
            return 0
        return replies.released(self._execute(*commands.pfxrelease(ids)))

    def info(self, key: Any = None) -> Info:
        """PFXINFO: geometry, arena, policy and the global (or ``key``'s) stats."""
        return replies.info(self._execute(*commands.pfxinfo(key)))

    # -- moving KV bytes -----------------------------------------------------------------------------

    def load(self, key: Any, tokens: Any, out: Any, *, ttl_ms: int | None = None) -> Match:
        """Look ``tokens`` up and copy the matched pages' bytes into the start of ``out``.

        ``out``: a numpy array, torch tensor or bytearray; when it holds fewer pages
        than ``tokens`` has, only that many are looked up. Attached: the blocks are
        pinned, copied from the arena with one vectorised copy, and released
        (``via="shm"``); otherwise one PFXGET WITHDATA NOLEASE (``via="resp"``).
        The returned Match holds no lease and no data: the bytes are in ``out``.
        """
        packed = commands.pack_tokens(tokens)
        arena = self._ensure_attached()
        packed = self._load_tokens(packed, out, self._info())
        if arena is not None:
            match = self.lookup(key, packed_tokens(packed), lease=True, ttl_ms=ttl_ms, with_data=False)
            try:
                if match.blocks:
                    arena.read_into(match.blocks, out)
            finally:
                match.release()
            match.via = arena.backend
            return match
        match = self.lookup(key, packed_tokens(packed), lease=False, with_data=True)
        if match.data:
            copy_to_output(out, match.data)
        match.data = None
        return match

    def save(self, key: Any, tokens: Any, src: Any, offset: int = 0, *, ttl_ms: int | None = None) -> StoreResult:
        """Cache the whole pages of ``tokens`` from ``offset`` with their bytes from ``src``.

        Attached: PFXALLOC, one vectorised write into the arena, PFXSET BLOCKS,
        release (``via="shm"``); otherwise PFXSET DATA (``via="resp"``). ``src``
        must hold exactly (pages from offset) x block_bytes bytes (ValueError).
        """
        packed = commands.pack_tokens(tokens)
        arena = self._ensure_attached()
        pages = self._save_pages(packed, src, offset, self._info())
        if arena is None or not pages:
            return self.store(key, packed_tokens(packed), src, offset)
        with self.alloc(key, pages, ttl_ms) as allocation:
            arena.write_from(allocation.blocks, src)
            return self.commit(key, packed_tokens(packed), allocation.blocks, offset)

    # -- lifetime ------------------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap the arena and close this cache's connection (the daemon then ends its leases).

        A client passed in by the caller stays open when it was a single-connection
        client (it is the caller's); the connection taken from a pooled client's pool
        is disconnected and given back.
        """
        self._release_arena()
        if self._owned:
            self._client.close()
        elif self._derived:
            connection = self._client.connection
            if connection is not None:
                connection.disconnect()  # ends this cache's leases before the pool reuses it
            self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncPrefixCache(_Base):
    """The prefix cache for asyncio workers (redis.asyncio); the same API as PrefixCache, awaited.

    Results with a lease are released with ``await result.release()`` or
    ``async with``. ``attached`` reports the state without I/O: the attach
    happens on ``await cache.attach()``, ``async with cache``, or the first
    call that needs it.
    """

    def __init__(self, client: redis.asyncio.Redis, *, attach: bool | None = None, _owned: bool = False) -> None:
        if not isinstance(client, redis.asyncio.Redis):
            raise TypeError("AsyncPrefixCache needs a redis.asyncio.Redis (use PrefixCache for redis.Redis)")
        super().__init__(attach)
        self._owned = _owned
        self._derived = False
        if not client.single_connection_client:
            # Leases are per connection: pin one connection of the caller's pool.
            client = redis.asyncio.Redis(connection_pool=client.connection_pool, single_connection_client=True)
            self._derived = True
        self._client = client

    @classmethod
    def from_url(cls, url: str, *, attach: bool | None = None, **kwargs: Any) -> AsyncPrefixCache:
        """Connect to ``redis://host:port/0`` (RESP3 unless ``?protocol=2`` or protocol=2 is given)."""
        kwargs.setdefault("protocol", 3)
        kwargs["single_connection_client"] = True
        return cls(redis.asyncio.Redis.from_url(url, **kwargs), attach=attach, _owned=True)

    async def _execute(self, *args: Any) -> Any:
        try:
            return await self._client.execute_command(*args, **{NEVER_DECODE: True})
        except redis.ResponseError as exc:
            raise translate(exc) from None

    async def _info(self) -> Info:
        if self._geometry is None:
            self._geometry = await self.info()
        return self._geometry

    async def _ensure_attached(self) -> Any:
        if not self._attach_tried:
            self._attached_now(await self._info(), explicit=False)
        return self._arena

    async def attach(self) -> Any:
        """Map the daemon's arena now (if not yet) and return the view; AttachError says why not."""
        if self._arena is None:
            self._attached_now(await self._info(), explicit=True)
        return self._arena

    @property
    def attached(self) -> bool:
        """Whether the arena is mapped now (no I/O: see the class docstring)."""
        return self._arena is not None

    async def lookup(self, key: Any, tokens: Any, *, lease: bool = True, ttl_ms: int | None = None,
                     with_data: bool | None = None) -> Match:
        """PFXGET (see PrefixCache.lookup)."""
        packed = commands.pack_tokens(tokens)
        if with_data is None:
            with_data = await self._ensure_attached() is None
        reply = await self._execute(*commands.pfxget(key, packed, lease=lease, ttl_ms=ttl_ms, with_data=with_data))
        match = replies.match(reply, self.release, is_async=True)
        if with_data:
            match.via = "resp"
        return match

    async def store(self, key: Any, tokens: Any, data: Any, offset: int = 0) -> StoreResult:
        """PFXSET DATA (see PrefixCache.store)."""
        packed = commands.pack_tokens(tokens)
        return replies.store_result(await self._execute(*commands.pfxset_data(key, packed, data, offset)))

    async def alloc(self, key: Any, n: int, ttl_ms: int | None = None) -> Allocation:
        """PFXALLOC (see PrefixCache.alloc)."""
        reply = await self._execute(*commands.pfxalloc(key, n, ttl_ms))
        return replies.allocation(reply, self.release, is_async=True)

    async def commit(self, key: Any, tokens: Any, blocks: Any, offset: int = 0) -> StoreResult:
        """PFXSET BLOCKS (see PrefixCache.commit)."""
        if isinstance(blocks, Allocation):
            blocks = blocks.blocks
        packed = commands.pack_tokens(tokens)
        reply = await self._execute(*commands.pfxset_blocks(key, packed, blocks, offset))
        return replies.store_result(reply, via=self._arena.backend if self._arena is not None else "shm")

    async def evict(self, key: Any, tokens: Any = None, pages: int | None = None, bytes: int | None = None,
                    all: bool = False) -> EvictResult:
        """PFXEVICT (see PrefixCache.evict)."""
        packed = commands.pack_tokens(tokens) if tokens is not None else None
        return replies.evict_result(await self._execute(*commands.pfxevict(key, packed=packed, pages=pages,
                                                                           nbytes=bytes, all_=all)))

    async def release(self, *leases: Any) -> int:
        """PFXRELEASE (see PrefixCache.release)."""
        ids, results = _lease_ids(leases)
        for result in results:
            result._released = True
        if not ids:
            return 0
        return replies.released(await self._execute(*commands.pfxrelease(ids)))

    async def info(self, key: Any = None) -> Info:
        """PFXINFO (see PrefixCache.info)."""
        return replies.info(await self._execute(*commands.pfxinfo(key)))

    async def load(self, key: Any, tokens: Any, out: Any, *, ttl_ms: int | None = None) -> Match:
        """Look up and copy the matched pages into ``out`` (see PrefixCache.load)."""
        packed = commands.pack_tokens(tokens)
        arena = await self._ensure_attached()
        packed = self._load_tokens(packed, out, await self._info())
        if arena is not None:
            match = await self.lookup(key, packed_tokens(packed), lease=True, ttl_ms=ttl_ms, with_data=False)
            try:
                if match.blocks:
                    arena.read_into(match.blocks, out)
            finally:
                await match.release()
            match.via = arena.backend
            return match
        match = await self.lookup(key, packed_tokens(packed), lease=False, with_data=True)
        if match.data:
            copy_to_output(out, match.data)
        match.data = None
        return match

    async def save(self, key: Any, tokens: Any, src: Any, offset: int = 0, *,
                   ttl_ms: int | None = None) -> StoreResult:
        """Cache pages with their bytes from ``src`` (see PrefixCache.save)."""
        packed = commands.pack_tokens(tokens)
        arena = await self._ensure_attached()
        pages = self._save_pages(packed, src, offset, await self._info())
        if arena is None or not pages:
            return await self.store(key, packed_tokens(packed), src, offset)
        async with await self.alloc(key, pages, ttl_ms) as allocation:
            arena.write_from(allocation.blocks, src)
            return await self.commit(key, packed_tokens(packed), allocation.blocks, offset)

    async def aclose(self) -> None:
        """Unmap the arena and close this cache's connection (see PrefixCache.close)."""
        self._release_arena()
        if self._owned:
            await self._client.aclose()
        elif self._derived:
            connection = self._client.connection
            if connection is not None:
                await connection.disconnect()
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        await self._ensure_attached()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def packed_tokens(blob: bytes) -> Any:
    """Already packed tokens (little-endian uint32 bytes) as an input pack_tokens takes without copying."""
    import numpy as np

    return np.frombuffer(blob, dtype="<u4")
