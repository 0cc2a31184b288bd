"""PrefixCache (redis-py, blocking) and AsyncPrefixCache (redis.asyncio): the worker's API.

Both wrap a redis-py client without changing it. Every operation is
described once, in :mod:`.core` (requests built by :mod:`.commands`, replies
decoded by :mod:`.replies` into dataclasses); a front end only sends each
request with the client's ``execute_command``, blocking or awaited. Bytes
move one of two ways, and every result says which (``via``):

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

import asyncio
import threading
from typing import Any, Self

import redis
import redis.asyncio
from redis.client import NEVER_DECODE

from .core import CacheCore, Steps
from .errors import PrefixCacheError, translate
from .replies import Allocation, EvictResult, Info, Match, StoreResult


class PrefixCache(CacheCore):
    """The prefix cache, for a worker using blocking redis-py.

    ``PrefixCache(client)`` wraps a ``redis.Redis``; ``PrefixCache.from_url(url)``
    makes its own. ``attach``: None (default) maps the daemon's arena when the
    daemon is on this host and its file is there, else falls back to RESP;
    True requires the mapping (AttachError otherwise); False never maps it.
    Not thread-safe beyond what the single connection serialises.
    """

    def __init__(self, client: redis.Redis | str, *, attach: bool | None = None, _owned: bool = False) -> None:
        if isinstance(client, str):
            client, _owned = self._connect(client), True
        if not isinstance(client, redis.Redis):
            raise TypeError(f"PrefixCache needs a redis.Redis or a redis:// URL, got {type(client).__name__} "
                            "(PrefixCache.from_url(url, **redis_kwargs) takes connection options; "
                            "use AsyncPrefixCache for redis.asyncio)")
        super().__init__(attach)
        # Held while a command is on the wire: a result finalised meanwhile (by the GC, maybe in
        # another thread) queues its lease instead of writing into the middle of an exchange.
        self._io = threading.Lock()
        self._owned = _owned
        self._derived = False
        if client.connection is None:
            # A pooled client may run each command on a different connection, and
            # leases are per connection: take one connection from the same pool.
            client = redis.Redis(connection_pool=client.connection_pool, single_connection_client=True)
            self._derived = True
        self._client = client
        self._watch_connection()

    @classmethod
    def from_url(cls, url: str, *, attach: bool | None = None, **kwargs: Any) -> PrefixCache:
        """Connect to ``redis://host:port/0`` (RESP3 unless ``?protocol=2`` or protocol=2 is given).

        ``PrefixCache(url)`` does the same with no connection options.
        """
        return cls(cls._connect(url, **kwargs), attach=attach, _owned=True)

    @staticmethod
    def _connect(url: str, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("protocol", 3)
        kwargs["single_connection_client"] = True
        return redis.Redis.from_url(url, **kwargs)

    # -- plumbing ----------------------------------------------------------------------------------

    def _execute(self, *args: Any) -> Any:
        try:
            # NEVER_DECODE: WITHDATA payloads are binary even on a decode_responses client.
            return self._client.execute_command(*args, **{NEVER_DECODE: True})
        except redis.ResponseError as exc:
            raise translate(exc) from None

    def _run(self, steps: Steps) -> Any:
        """Carry an operation's steps out, one blocking round trip per request (see .core)."""
        with self._io:
            self._release_dropped()
            try:
                request = next(steps)
                while True:
                    try:
                        result = request.decode(self._execute(*request.args))
                    except BaseException as exc:
                        request = steps.throw(exc)
                    else:
                        request = steps.send(result)
            except StopIteration as done:
                return done.value

    def _release_dropped(self) -> None:
        request = self._dropped_request()
        if request is not None:
            try:
                self._execute(*request.args)
            except PrefixCacheError:
                pass  # the daemon refused: nothing of the caller's operation depends on it

    def _lease_dropped(self, lease: int) -> bool:
        """A result with ``lease`` was garbage-collected unreleased: release it now if the connection is free."""
        if not self._queue_dropped(lease):
            return False
        if self._io.acquire(blocking=False):
            try:
                self._release_dropped()
            finally:
                self._io.release()
        return True

    def attach(self) -> Any:
        """Map the daemon's arena now (if not yet) and return the view; AttachError says why not."""
        return self._run(self._attach_steps())

    @property
    def attached(self) -> bool:
        """Whether the arena is mapped (the first access tries, which sends one PFXINFO)."""
        return self._run(self._ensure_attached_steps()) is not None

    # -- commands ----------------------------------------------------------------------------------

    def lookup(self, key: Any, tokens: Any, *, lease: bool = True, ttl_ms: int | None = None,
               with_data: bool | None = None) -> Match:
        """PFXGET: the longest cached whole-page prefix of ``tokens`` in namespace ``key``.

        ``lease``: pin the matched blocks until the Match is released (use it as a
        context manager). ``ttl_ms``: the lease's lifetime (default: the daemon's
        lease-ttl). ``with_data``: bring the pages' bytes in ``Match.data``; None
        means "when the arena is not attached", so the bytes are reachable either way.
        """
        return self._run(self._lookup_steps(key, tokens, lease, ttl_ms, with_data))

    def store(self, key: Any, tokens: Any, data: Any, offset: int = 0) -> StoreResult:
        """PFXSET DATA: cache the whole pages of ``tokens`` from ``offset`` (tokens) with their KV bytes.

        ``data``: bytes / numpy / torch, exactly (pages from offset) x block_bytes bytes.
        The pages before ``offset`` must be cached (NoPrefixError otherwise).
        """
        return self._run(self._store_steps(key, tokens, data, offset))

    def alloc(self, key: Any, n: int, ttl_ms: int | None = None) -> Allocation:
        """PFXALLOC: ``n`` fresh blocks pinned for this worker to fill (CacheFullError when none can be had)."""
        return self._run(self._alloc_steps(key, n, ttl_ms))

    def commit(self, key: Any, tokens: Any, blocks: Any, offset: int = 0) -> StoreResult:
        """PFXSET BLOCKS: hand blocks filled in the arena (from alloc()) over as the pages from ``offset``."""
        return self._run(self._commit_steps(key, tokens, blocks, offset))

    def evict(self, key: Any, tokens: Any = None, pages: int | None = None, bytes: int | None = None,
              all: bool = False) -> EvictResult:
        """PFXEVICT one of: the cached sequences starting with ``tokens``, ``pages`` pages,
        ``bytes`` bytes, or ``all`` the namespace's unpinned pages."""
        return self._run(self._evict_steps(key, tokens, pages, bytes, all))

    def lookup_keys(self, key: Any, keys: Any, *, lease: bool = True, ttl_ms: int | None = None,
                    with_data: bool | None = None) -> Match:
        """PFXGET HASHES: the leading run of page ``keys`` (engine page keys in prefix order) cached in
        namespace ``key``; ``Match.pages`` (and ``matched_tokens``) count keys. Otherwise as :meth:`lookup`."""
        return self._run(self._lookup_keys_steps(key, keys, lease, ttl_ms, with_data))

    def store_keys(self, key: Any, keys: Any, data: Any, offset: int = 0) -> StoreResult:
        """PFXSET HASHES DATA: cache the pages of ``keys`` from key number ``offset`` with their bytes
        (exactly (len(keys) - offset) x block_bytes)."""
        return self._run(self._store_keys_steps(key, keys, data, None, offset))

    def commit_keys(self, key: Any, keys: Any, blocks: Any, offset: int = 0) -> StoreResult:
        """PFXSET HASHES BLOCKS: hand blocks filled in the arena (from alloc()) over as the pages of
        ``keys`` from key number ``offset``."""
        return self._run(self._store_keys_steps(key, keys, None, blocks, offset))

    def evict_keys(self, key: Any, keys: Any) -> EvictResult:
        """PFXEVICT HASHES: forget the last key's page and every page linked below it."""
        return self._run(self._evict_keys_steps(key, keys))

    def release(self, *leases: Any) -> int:
        """PFXRELEASE: end leases (ids, Match or Allocation objects); returns how many ended."""
        return self._run(self._release_steps(leases))

    def renew(self, lease: Any, ttl_ms: int | None = None) -> bool:
        """PFXRENEW: a new deadline (``ttl_ms``, default lease-ttl) for a live lease (an id, Match or
        Allocation); False when it is gone or already expired (then its blocks must not be used)."""
        return self._run(self._renew_steps(lease, ttl_ms))

    def info(self, key: Any = None) -> Info:
        """PFXINFO: geometry, arena, policy and the global (or ``key``'s) stats."""
        return self._run(self._info_steps(key))

    # -- moving KV bytes -----------------------------------------------------------------------------

    def load(self, key: Any, tokens: Any, out: Any, *, ttl_ms: int | None = None) -> Match:
        """Look ``tokens`` up and copy the matched pages' bytes into the start of ``out``.

        ``out``: a numpy array, torch tensor or bytearray; when it holds fewer pages
        than ``tokens`` has, only that many are looked up. Attached: the blocks are
        pinned, copied from the arena with one vectorised copy, and released
        (``via="shm"``); otherwise one PFXGET WITHDATA NOLEASE (``via="resp"``).
        The returned Match holds no lease and no data: the bytes are in ``out``.
        """
        return self._run(self._load_steps(key, tokens, out, ttl_ms))

    def save(self, key: Any, tokens: Any, src: Any, offset: int = 0, *, ttl_ms: int | None = None) -> StoreResult:
        """Cache the whole pages of ``tokens`` from ``offset`` with their bytes from ``src``.

        Attached: PFXALLOC, one vectorised write into the arena, PFXSET BLOCKS,
        release (``via="shm"``); otherwise PFXSET DATA (``via="resp"``). ``src``
        must hold exactly (pages from offset) x block_bytes bytes (ValueError).
        """
        return self._run(self._save_steps(key, tokens, src, offset, ttl_ms))

    # -- lifetime ------------------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap the arena and close this cache's connection (the daemon then ends its leases).

        A client passed in by the caller stays open when it was a single-connection
        client (it is the caller's); the connection taken from a pooled client's pool
        is disconnected and given back.
        """
        self._closed = True
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


class AsyncPrefixCache(CacheCore):
    """The prefix cache for asyncio workers (redis.asyncio); the same API as PrefixCache, awaited.

    Results with a lease are released with ``await result.release()`` or
    ``async with``. ``attached`` reports the state without I/O: the attach
    happens on ``await cache.attach()``, ``async with cache``, or the first
    call that needs it.
    """

    _is_async = True

    def __init__(self, client: redis.asyncio.Redis | str, *, attach: bool | None = None,
                 _owned: bool = False) -> None:
        if isinstance(client, str):
            client, _owned = self._connect(client), True
        if not isinstance(client, redis.asyncio.Redis):
            raise TypeError(f"AsyncPrefixCache needs a redis.asyncio.Redis or a redis:// URL, got "
                            f"{type(client).__name__} (AsyncPrefixCache.from_url(url, **redis_kwargs) takes "
                            "connection options; use PrefixCache for redis.Redis)")
        super().__init__(attach)
        self._loop: asyncio.AbstractEventLoop | None = None  # where releases of dropped results run
        self._release_tasks: set[asyncio.Task] = set()
        self._owned = _owned
        self._derived = False
        if not client.single_connection_client:
            # Leases are per connection: pin one connection of the caller's pool.
            client = redis.asyncio.Redis(connection_pool=client.connection_pool, single_connection_client=True)
            self._derived = True
        self._client = client

    @classmethod
    def from_url(cls, url: str, *, attach: bool | None = None, **kwargs: Any) -> AsyncPrefixCache:
        """Connect to ``redis://host:port/0`` (RESP3 unless ``?protocol=2`` or protocol=2 is given).

        ``AsyncPrefixCache(url)`` does the same with no connection options.
        """
        return cls(cls._connect(url, **kwargs), attach=attach, _owned=True)

    @staticmethod
    def _connect(url: str, **kwargs: Any) -> redis.asyncio.Redis:
        kwargs.setdefault("protocol", 3)
        kwargs["single_connection_client"] = True
        return redis.asyncio.Redis.from_url(url, **kwargs)

    async def _execute(self, *args: Any) -> Any:
        try:
            return await self._client.execute_command(*args, **{NEVER_DECODE: True})
        except redis.ResponseError as exc:
            raise translate(exc) from None
        finally:
            if self._watching is None:
                self._watch_connection()  # redis.asyncio makes the connection on the first command

    async def _run(self, steps: Steps) -> Any:
        """Carry an operation's steps out, one awaited round trip per request (see .core)."""
        self._loop = asyncio.get_running_loop()
        await self._release_dropped()
        try:
            request = next(steps)
            while True:
                try:
                    result = request.decode(await self._execute(*request.args))
                except BaseException as exc:
                    request = steps.throw(exc)
                else:
                    request = steps.send(result)
        except StopIteration as done:
            return done.value

    async def _release_dropped(self) -> None:
        request = self._dropped_request()
        if request is not None:
            try:
                await self._execute(*request.args)
            except PrefixCacheError:
                pass  # the daemon refused: nothing of the caller's operation depends on it

    def _lease_dropped(self, lease: int) -> bool:
        """A result with ``lease`` was garbage-collected unreleased: release it from a task on the cache's loop."""
        if not self._queue_dropped(lease):
            return False
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._start_release_task)
        return True

    def _start_release_task(self) -> None:
        if self._dropped and not self._closed:
            task = asyncio.ensure_future(self._release_dropped_quietly())
            self._release_tasks.add(task)  # a task only weakly referenced by the loop could vanish
            task.add_done_callback(self._release_tasks.discard)

    async def _release_dropped_quietly(self) -> None:
        try:
            await self._release_dropped()
        except Exception:
            pass  # e.g. the connection is gone, which ended the lease anyway

    async def attach(self) -> Any:
        """Map the daemon's arena now (if not yet) and return the view; AttachError says why not."""
        return await self._run(self._attach_steps())

    @property
    def attached(self) -> bool:
        """Whether the arena is mapped now (no I/O: see the class docstring)."""
        return self._arena is not None

    async def lookup(self, key: Any, tokens: Any, *, lease: bool = True, ttl_ms: int | None = None,
                     with_data: bool | None = None) -> Match:
        """PFXGET (see PrefixCache.lookup)."""
        return await self._run(self._lookup_steps(key, tokens, lease, ttl_ms, with_data))

    async def store(self, key: Any, tokens: Any, data: Any, offset: int = 0) -> StoreResult:
        """PFXSET DATA (see PrefixCache.store)."""
        return await self._run(self._store_steps(key, tokens, data, offset))

    async def lookup_keys(self, key: Any, keys: Any, *, lease: bool = True, ttl_ms: int | None = None,
                          with_data: bool | None = None) -> Match:
        """PFXGET HASHES (see PrefixCache.lookup_keys)."""
        return await self._run(self._lookup_keys_steps(key, keys, lease, ttl_ms, with_data))

    async def store_keys(self, key: Any, keys: Any, data: Any, offset: int = 0) -> StoreResult:
        """PFXSET HASHES DATA (see PrefixCache.store_keys)."""
        return await self._run(self._store_keys_steps(key, keys, data, None, offset))

    async def commit_keys(self, key: Any, keys: Any, blocks: Any, offset: int = 0) -> StoreResult:
        """PFXSET HASHES BLOCKS (see PrefixCache.commit_keys)."""
        return await self._run(self._store_keys_steps(key, keys, None, blocks, offset))

    async def evict_keys(self, key: Any, keys: Any) -> EvictResult:
        """PFXEVICT HASHES (see PrefixCache.evict_keys)."""
        return await self._run(self._evict_keys_steps(key, keys))

    async def alloc(self, key: Any, n: int, ttl_ms: int | None = None) -> Allocation:
        """PFXALLOC (see PrefixCache.alloc)."""
        return await self._run(self._alloc_steps(key, n, ttl_ms))

    async def commit(self, key: Any, tokens: Any, blocks: Any, offset: int = 0) -> StoreResult:
        """PFXSET BLOCKS (see PrefixCache.commit)."""
        return await self._run(self._commit_steps(key, tokens, blocks, offset))

    async def evict(self, key: Any, tokens: Any = None, pages: int | None = None, bytes: int | None = None,
                    all: bool = False) -> EvictResult:
        """PFXEVICT (see PrefixCache.evict)."""
        return await self._run(self._evict_steps(key, tokens, pages, bytes, all))

    async def release(self, *leases: Any) -> int:
        """PFXRELEASE (see PrefixCache.release)."""
        return await self._run(self._release_steps(leases))

    async def renew(self, lease: Any, ttl_ms: int | None = None) -> bool:
        """PFXRENEW (see PrefixCache.renew)."""
        return await self._run(self._renew_steps(lease, ttl_ms))

    async def info(self, key: Any = None) -> Info:
        """PFXINFO (see PrefixCache.info)."""
        return await self._run(self._info_steps(key))

    async def load(self, key: Any, tokens: Any, out: Any, *, ttl_ms: int | None = None) -> Match:
        """Look up and copy the matched pages into ``out`` (see PrefixCache.load)."""
        return await self._run(self._load_steps(key, tokens, out, ttl_ms))

    async def save(self, key: Any, tokens: Any, src: Any, offset: int = 0, *,
                   ttl_ms: int | None = None) -> StoreResult:
        """Cache pages with their bytes from ``src`` (see PrefixCache.save)."""
        return await self._run(self._save_steps(key, tokens, src, offset, ttl_ms))

    async def aclose(self) -> None:
        """Unmap the arena and close this cache's connection (see PrefixCache.close)."""
        self._closed = True
        self._release_arena()
        if self._owned:
            await self._client.aclose()
        elif self._derived:
            connection = self._client.connection
            if connection is not None:
                await connection.disconnect()
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        await self._run(self._ensure_attached_steps())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
