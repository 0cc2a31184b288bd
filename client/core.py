"""What PrefixCache and AsyncPrefixCache share: their state, and every operation described once.

An operation is a generator of steps (sans-IO, as :mod:`.commands` and
:mod:`.replies` are): it yields a :class:`Request` (the arguments
:mod:`.commands` built, and the :mod:`.replies` decoder for the answer),
receives the decoded result, and finally returns what the public method
returns. The blocking front end runs the steps with blocking calls, the
asyncio one with awaited calls (:meth:`CacheCore._run`), so both send the
same commands in the same order and differ only in how they wait. A daemon
error is thrown into the generator where it yielded, so its ``finally``
(releasing a lease) runs under both.
"""

from __future__ import annotations

import ipaddress
import socket
import weakref
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from . import commands, replies
from .arena import copy_to_output, nbytes_of, open_arena
from .partitioned import PartitionedArenaView
from .errors import AttachError, LeaseLostError
from .replies import Allocation, EvictResult, Info, Match, StoreResult, _Leased


class Request(NamedTuple):
    """One command to send: its arguments, and how to decode its reply."""

    args: tuple
    decode: Callable[[Any], Any]


Steps = Generator[Request, Any, Any]  # yields requests, is sent their decoded replies, returns the result


def is_local_host(host: str | None) -> bool:
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


def packed_tokens(blob: bytes) -> Any:
    """Already packed tokens (little-endian uint32 bytes) as an input pack_tokens takes without copying."""
    import numpy as np

    return np.frombuffer(blob, dtype="<u4")


class CacheCore:
    """Attach state, geometry and the operations' steps; the front ends add only the I/O."""

    _client: Any
    _is_async = False  # results' release() returns a coroutine when True

    def __init__(self, attach: bool | None) -> None:
        if attach not in (None, True, False):
            raise ValueError("attach must be None (when local), True (required) or False (never)")
        self._attach_mode = attach
        self._arena: Any = None
        self._attach_tried = attach is False
        self._attach_error: str | None = "attach=False" if attach is False else None
        self._geometry: Info | None = None
        # Daemon restarts: redis-py reconnects silently, and a new daemon has a new arena. Every
        # (re)connect of the cache's connection counts here (_on_connect); the geometry and the
        # mapping remember the count they were read at, and block ids that came over a newer
        # connection are used only after re-reading PFXINFO and, for a new arena, re-mapping.
        self._connects = 0
        self._watching = None  # the connection whose connects are counted
        self._geometry_at = 0
        self._mapped_at = 0
        self._arena_id: str | None = None
        self._closed = False
        # Leases of results garbage-collected unreleased (see replies._Leased), released by the
        # front end as soon as the connection is free. A deque: appends may come from any thread.
        self._dropped: deque[int] = deque()
        # lease id -> the result holding it, so release(id) marks the result released too.
        self._results: weakref.WeakValueDictionary[int, _Leased] = weakref.WeakValueDictionary()

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
        if self._attach_mode is None and not is_local_host(host):
            raise AttachError(f"the daemon at {host} is not on this host (pass attach=True to map its arena anyway)")
        kwargs = getattr(self._client.connection_pool, "connection_kwargs", {}) or {}
        if kwargs.get("path") and info.arena.get("backend") == "shm":
            # Over the unix socket: the partitions this user may map, as descriptors (PFXATTACH).
            try:
                view = PartitionedArenaView.attach(kwargs["path"], kwargs.get("username"), kwargs.get("password"))
            except AttachError:
                if not info.arena.get("path"):
                    raise
            else:
                if view.arena_id == info.arena.get("id"):
                    return view
                view.close()  # a restart between PFXINFO and PFXATTACH: the caller retries
                raise AttachError("the daemon's arena changed during the attach")
        return open_arena(info.arena)

    @staticmethod
    def _arena_for(arena: Any, key: Any, write: bool = False) -> Any:
        """``arena`` when it maps ``key``'s blocks (a partitioned view may map only some), else None."""
        serves = getattr(arena, "serves", None)
        return arena if arena is None or serves is None or serves(key, write) else None

    @staticmethod
    def _maps(arena: Any, ids: Any, write: bool = False) -> bool:
        maps = getattr(arena, "maps", None)
        return maps is None or maps(ids, write)

    def _on_connect(self, connection: Any) -> None:
        self._connects += 1

    def _watch_connection(self) -> None:
        """Count the (re)connects of the cache's connection from now on (see __init__)."""
        connection = self._client.connection
        if connection is not None and connection is not self._watching:
            connection.register_connect_callback(self._on_connect)
            self._watching = connection

    def _attached_now(self, info: Info, explicit: bool) -> Any:
        self._attach_tried = True
        try:
            self._arena = self._open(info)
            self._arena_id = info.arena.get("id")
            self._mapped_at = self._geometry_at
            self._attach_error = None
        except AttachError as exc:
            self._attach_error = str(exc)
            if explicit or self._attach_mode is True:
                raise
        return self._arena

    def _leased(self, result: _Leased) -> _Leased:
        """Remember a result that holds a lease (its release by id then marks it too)."""
        if result.lease:
            self._results[result.lease] = result
        return result

    def _dropped_request(self) -> Request | None:
        """The PFXRELEASE of the leases of dropped results, taking them off the queue (None if none)."""
        ids = []
        while self._dropped:
            ids.append(self._dropped.popleft())
        return Request(commands.pfxrelease(ids), replies.released) if ids else None

    def _queue_dropped(self, lease: int) -> bool:
        """Queue the lease of a result collected unreleased; False when the cache is closed (the
        connection's end ended the lease). Each front end's ``_lease_dropped`` then sends the queue."""
        if self._closed:
            return False
        self._dropped.append(lease)
        return True

    def _lease_dropped(self, lease: int) -> bool:  # each front end releases it its own way
        raise NotImplementedError

    def _release_arena(self) -> None:
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    # -- the steps of each operation -----------------------------------------------------------------

    def _geometry_steps(self) -> Steps:
        if self._geometry is None or self._geometry_at != self._connects:
            seen = self._connects
            self._geometry = yield from self._info_steps(None)
            self._geometry_at = seen
        return self._geometry

    def _current_arena_steps(self) -> Steps:
        """The mapping to use for block ids just received: re-checked first when the connection was
        re-established since it was mapped (the ids may come from a restarted daemon)."""
        if self._arena is None or self._mapped_at == self._connects:
            return self._arena
        seen = self._connects
        info = yield from self._info_steps(None)
        if self._connects != seen:
            raise LeaseLostError("the connection to the daemon was re-established twice in one operation: "
                                 "its block ids cannot be trusted")
        self._geometry, self._geometry_at = info, seen
        if info.arena.get("id") != self._arena_id:
            # A new daemon or arena: the old mapping must never be read or written again.
            self._release_arena()
            try:
                self._attached_now(info, explicit=True)
            except AttachError as exc:
                raise LeaseLostError(f"the daemon restarted and its new arena cannot be mapped: {exc}") from exc
        self._mapped_at = seen
        return self._arena

    def _ensure_attached_steps(self) -> Steps:
        if not self._attach_tried:
            self._attached_now((yield from self._geometry_steps()), explicit=False)
        return self._arena

    def _attach_steps(self) -> Steps:
        if self._arena is None:
            self._attached_now((yield from self._geometry_steps()), explicit=True)
        return self._arena

    def _lookup_steps(self, key: Any, tokens: Any, lease: bool, ttl_ms: int | None,
                      with_data: bool | None) -> Steps:
        packed = commands.pack_tokens(tokens)  # validated before anything is sent
        if with_data is None:
            with_data = self._arena_for((yield from self._ensure_attached_steps()), key) is None

        def decode(reply: Any) -> Match:
            return self._leased(replies.match(reply, self.release, self._is_async, self._lease_dropped))

        match = yield Request(commands.pfxget(key, packed, lease=lease, ttl_ms=ttl_ms, with_data=with_data), decode)
        if with_data:
            match.via = "resp"
        elif match.blocks:
            yield from self._current_arena_steps()  # the caller reads these blocks through cache.arena
        return match

    def _lookup_keys_steps(self, key: Any, keys: Any, lease: bool, ttl_ms: int | None,
                           with_data: bool | None) -> Steps:
        keys = commands.page_keys(keys)
        if with_data is None:
            with_data = self._arena_for((yield from self._ensure_attached_steps()), key) is None

        def decode(reply: Any) -> Match:
            return self._leased(replies.match(reply, self.release, self._is_async, self._lease_dropped))

        args = commands.pfxget_keys(key, keys, lease=lease, ttl_ms=ttl_ms, with_data=with_data)
        match = yield Request(args, decode)
        if with_data:
            match.via = "resp"
        elif match.blocks:
            yield from self._current_arena_steps()
        return match

    def _store_keys_steps(self, key: Any, keys: Any, data: Any, blocks: Any, offset: int) -> Steps:
        keys = commands.page_keys(keys)
        if isinstance(blocks, Allocation):
            blocks = blocks.blocks
        via = "resp" if blocks is None else (self._arena.backend if self._arena is not None else "shm")

        def decode(reply: Any) -> StoreResult:
            return replies.store_result(reply, via=via)

        return (yield Request(commands.pfxset_keys(key, keys, data=data, blocks=blocks, offset=offset), decode))

    def _evict_keys_steps(self, key: Any, keys: Any) -> Steps:
        result: EvictResult = yield Request(commands.pfxevict_keys(key, commands.page_keys(keys)),
                                            replies.evict_result)
        return result

    def _store_steps(self, key: Any, tokens: Any, data: Any, offset: int) -> Steps:
        packed = commands.pack_tokens(tokens)
        return (yield Request(commands.pfxset_data(key, packed, data, offset), replies.store_result))

    def _alloc_steps(self, key: Any, n: int, ttl_ms: int | None) -> Steps:
        def decode(reply: Any) -> Allocation:
            return self._leased(replies.allocation(reply, self.release, self._is_async, self._lease_dropped))

        allocation = yield Request(commands.pfxalloc(key, n, ttl_ms), decode)
        yield from self._current_arena_steps()  # the caller writes these blocks through cache.arena
        return allocation

    def _commit_steps(self, key: Any, tokens: Any, blocks: Any, offset: int) -> Steps:
        if isinstance(blocks, Allocation):
            blocks = blocks.blocks
        packed = commands.pack_tokens(tokens)
        via = self._arena.backend if self._arena is not None else "shm"

        def decode(reply: Any) -> StoreResult:
            return replies.store_result(reply, via=via)

        return (yield Request(commands.pfxset_blocks(key, packed, blocks, offset), decode))

    def _evict_steps(self, key: Any, tokens: Any, pages: int | None, nbytes: int | None, all_: bool) -> Steps:
        packed = commands.pack_tokens(tokens) if tokens is not None else None
        args = commands.pfxevict(key, packed=packed, pages=pages, nbytes=nbytes, all_=all_)
        result: EvictResult = yield Request(args, replies.evict_result)
        return result

    def _release_steps(self, leases: tuple) -> Steps:
        ids, results = _lease_ids(leases)
        for result in results:
            result._released = True
        for lease in ids:
            result = self._results.pop(lease, None) if isinstance(lease, int) else None
            if result is not None:
                result._released = True  # released by id: its finaliser must not release it again
        if not ids:
            return 0
        return (yield Request(commands.pfxrelease(ids), replies.released))

    def _renew_steps(self, lease: Any, ttl_ms: int | None) -> Steps:
        lease_id = lease.lease if isinstance(lease, _Leased) else lease
        return bool((yield Request(commands.pfxrenew(lease_id, ttl_ms), replies.released)))

    def _info_steps(self, key: Any) -> Steps:
        return (yield Request(commands.pfxinfo(key), replies.info))

    def _load_steps(self, key: Any, tokens: Any, out: Any, ttl_ms: int | None) -> Steps:
        packed = commands.pack_tokens(tokens)
        arena = self._arena_for((yield from self._ensure_attached_steps()), key)
        packed = self._load_tokens(packed, out, (yield from self._geometry_steps()))
        if arena is not None:
            match = yield from self._lookup_steps(key, packed_tokens(packed), True, ttl_ms, False)
            try:
                arena = self._arena  # re-mapped by the lookup when the daemon restarted
                if match.blocks and not self._maps(arena, match.blocks):
                    arena = None  # in a partition not mapped here: the bytes come over RESP below
                elif match.blocks:
                    arena.read_into(match.blocks, out)
            finally:
                released = yield from self._release_steps((match,))
            if arena is None:
                return (yield from self._load_over_resp(key, packed, out))
            if match.lease and not released:
                # The pin was gone before the copy ended: the blocks may hold other pages by now.
                raise LeaseLostError(f"the lease of this lookup ended before its {len(match.blocks)} blocks were "
                                     f"read (TTL passed or the connection was re-established): out is not trusted")
            match.via = arena.backend
            return match
        return (yield from self._load_over_resp(key, packed, out))

    def _load_over_resp(self, key: Any, packed: bytes, out: Any) -> Steps:
        match = yield from self._lookup_steps(key, packed_tokens(packed), False, None, True)
        if match.data:
            copy_to_output(out, match.data)
        match.data = None
        return match

    def _save_steps(self, key: Any, tokens: Any, src: Any, offset: int, ttl_ms: int | None) -> Steps:
        packed = commands.pack_tokens(tokens)
        arena = self._arena_for((yield from self._ensure_attached_steps()), key, write=True)
        pages = self._save_pages(packed, src, offset, (yield from self._geometry_steps()))
        if arena is None or not pages:
            return (yield from self._store_steps(key, packed_tokens(packed), src, offset))
        allocation = yield from self._alloc_steps(key, pages, ttl_ms)
        if not self._maps(self._arena, allocation.blocks, write=True):  # not a partition writable here
            yield from self._release_steps((allocation,))
            return (yield from self._store_steps(key, packed_tokens(packed), src, offset))
        try:
            self._arena.write_from(allocation.blocks, src)  # re-mapped by the alloc after a restart
            return (yield from self._commit_steps(key, packed_tokens(packed), allocation.blocks, offset))
        finally:
            yield from self._release_steps((allocation,))

    def release(self, *leases: Any) -> Any:  # each front end defines it (blocking or awaited)
        raise NotImplementedError

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
