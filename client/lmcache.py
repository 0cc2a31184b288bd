"""LMCache's remote tier in pfxcache: ``PrefixCacheConnector``, a ``RemoteConnector`` plugin.

LMCache loads it through ``remote_storage_plugins: [pfxcache]`` with
``remote_storage_plugin.pfxcache.module_path: pfxcache.client.lmcache`` and
``.class_name: PrefixCacheConnector`` in ``extra_config``; the daemon's URL is
``remote_storage_plugin.pfxcache.pfxcache_url`` or ``pfxcache_url`` there.

Rules:

* **Keys.** A chunk key ``model@world_size@worker_id@chunk_hash@dtype[@tags]``
  names a namespace, ``<pfxcache_namespace>:model@world_size@worker_id@dtype[@tags]``
  (base ``lmcache``), and a page key in it, the chunk hash's hex. So models,
  dtypes, tensor-parallel ranks and tagged tenants never share pages, and
  each rank's pages are evicted leaf first along its own chains.
* **A page is a chunk: data and metadata are never evicted apart.** With
  ``save_chunk_meta: False`` a page is exactly the chunk's bytes (the daemon's
  ``block-bytes`` is the full chunk's size) and a chunk shorter than a full
  one is not stored. Otherwise a page is the chunk's bytes, zero-padded to
  a full chunk, then LMCache's own ``RemoteMetadata`` (length, format, shapes,
  dtypes) as a trailer: ``block-bytes`` = full chunk + ``remote_metadata_bytes``.
  :attr:`PrefixCacheConnector.page_bytes` says which (the daemon's ``page-size``
  only needs to be 4 or more).
* **What contains reports, get reads.** ``batched_contains`` is one
  ``PFXGET ... HASHES`` under a lease that pins the leading run; a later get
  of those chunks reads the pinned pages (straight from the mapped arena when
  the daemon is on this host), and ``batched_get`` ends the leases it read
  from. A lease no get consumes ends after its TTL (less a margin), or when
  :data:`~pfxcache.client.lmcache_pins.MAX_LEASES` newer ones are held
  (``lmcache_pins.py`` keeps the leases and their pins). ``exists`` pins nothing (a hint).
* **Chains.** A batch in prefix order is stored as one chain. LMCache stores
  a prompt's chunks in several batches (each skips what is already saved),
  so the connector remembers each chunk's parent from the chains it saw and
  hangs a batch below its first chunk's parent; only missing pages are sent
  (``PFXGET NOLEASE`` first, then ``PFXSET ... OFFSET``). A batch whose
  parent it never saw starts a chain of its own (a lookup starting at its
  first chunk finds it); a later store that knows the parent links a copy.
* **Failures never reach LMCache.** The daemon unreachable, refusing or
  restarted: gets are misses, contains is 0, puts are dropped; each cause is
  logged once, and after ``pfxcache_retry_seconds`` the next call reconnects.

Theory of operation: one blocking :class:`~pfxcache.client.PrefixCache` (one
connection: leases belong to it), kept by an
:class:`~pfxcache.client.engine_link.EngineLink` behind its lock. LMCache calls the sync
methods from its lookup threads and awaits the async ones on its event loop;
those run the same code in the loop's executor, so the loop never blocks on
the socket. A lookup's lease is remembered per chunk (its block id); a get
of pinned chunks copies them out of the arena and then ends the lease, whose
release count says whether the pin held throughout (else the copy is thrown
away and the chunks are read again). Over RESP the pins only keep the chunks
cached while a ``PFXGET ... WITHDATA`` reads them, in slices of at most
:data:`WITHDATA_BYTES` (one reply of hundreds of megabytes costs redis-py far
more than several of a few), and stores go in slices the same way.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from .cache import PrefixCache
from .engine_link import EngineLink
from .errors import NoPrefixError
from .lmcache_pins import LookupPins

log = logging.getLogger("pfxcache.lmcache")

DEFAULT_URL = "redis://127.0.0.1:6390/0"
MAX_PARENTS = 1 << 16  # chunk -> parent links remembered for later batches
WITHDATA_BYTES = 16 << 20  # the most chunk bytes one PFXGET ... WITHDATA brings


class PrefixCacheConnector(RemoteConnector):
    """LMCache ``RemoteConnector`` over a pfxcache daemon (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any, config: Any,
                 metadata: Any = None, url: str | None = None) -> None:
        metadata = metadata if metadata is not None else getattr(local_cpu_backend, "metadata", None)
        if metadata is None:
            raise ValueError("PrefixCacheConnector needs LMCache's metadata (a worker's local CPU backend)")
        super().__init__(config, metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        option = _options(config)
        self.base = option("pfxcache_namespace", "lmcache")
        stats = {"lookups": 0, "hits": 0, "gets": 0, "stored": 0, "errors": 0, "reconnects": 0}
        self.link = EngineLink(url or option("pfxcache_url", DEFAULT_URL), option("pfxcache_transfer", "auto"),
                               self._block_bytes_problem, logger=log, engine="LMCache", role="connector", unit="chunks",
                               retry_seconds=float(option("pfxcache_retry_seconds", 5.0)),
                               timeout_seconds=float(option("pfxcache_timeout_seconds",
                                                            getattr(config, "blocking_timeout_secs", 10))),
                               stats=stats, on_drop=self._forget_all)
        self.url, self.stats = self.link.url, self.link.stats
        self.lease_ttl_ms = int(option("pfxcache_lease_ttl_ms", 0)) or None  # None: the daemon's lease-ttl
        self.page_bytes = self.full_chunk_size_bytes + (self.remote_metadata_bytes if self.save_chunk_meta else 0)
        self._lock = self.link.lock  # held through each command: the connection and the lease tables
        self._pins = LookupPins(lambda: self._ttl_s)  # the lookups' leases: under self._lock
        self._parents: OrderedDict[tuple[str, bytes], bytes] = OrderedDict()
        with self._lock:
            self._connection()

    # -- keys ----------------------------------------------------------------------------------------

    def _split(self, key: CacheEngineKey) -> tuple[str, bytes]:
        """(namespace, page key) of a chunk key: the key's string without its chunk hash, and the hash."""
        chunk = key.chunk_hash_hex
        head = f"{key.model_name}@{key.world_size}@{key.worker_id}@"
        tail = key.to_string()[len(head) + len(chunk) + 1:]  # dtype, tags, a layer id: what follows the hash
        namespace = f"{self.base}:{head}{tail}"
        return namespace, chunk.encode()

    def _groups(self, keys: list[CacheEngineKey]) -> list[tuple[str, int, list[bytes]]]:
        """Runs of consecutive keys in one namespace: (namespace, index of the first, page keys)."""
        groups: list[tuple[str, int, list[bytes]]] = []
        for i, key in enumerate(keys):
            namespace, page = self._split(key)
            if groups and groups[-1][0] == namespace:
                groups[-1][2].append(page)
            else:
                groups.append((namespace, i, [page]))
        return groups

    def _learn_chain(self, namespace: str, pages: list[bytes]) -> None:
        for parent, child in zip(pages, pages[1:]):
            link = (namespace, child)
            self._parents[link] = parent
            self._parents.move_to_end(link)
        while len(self._parents) > MAX_PARENTS:
            self._parents.popitem(last=False)

    # -- the connection --------------------------------------------------------------------------------

    @property
    def _cache(self) -> PrefixCache | None:
        return self.link.cache

    @property
    def _ttl_s(self) -> float:
        """How long a lookup's lease lasts, in seconds (this connector's lease TTL, else the daemon's)."""
        return (self.lease_ttl_ms or self.link.info.lease_ttl_ms) / 1000

    def _warn(self, cause: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        self.link.warn(cause, message, *args, level=level)

    def _connection(self) -> PrefixCache | None:
        """The cache, connecting first when there is none and the retry delay has passed."""
        return self.link.connect()

    def _block_bytes_problem(self, block_bytes: int) -> str | None:
        """What is wrong with the daemon's block-bytes for LMCache's chunks (None: nothing)."""
        if block_bytes != self.page_bytes:
            return (f"pfxcache at {self.url} has block-bytes {block_bytes}, and LMCache's chunks need "
                    f"--block-bytes {self.page_bytes}")
        return None

    @property
    def via(self) -> str | None:
        """How chunks move now: ``"shm"`` (the daemon's arena, mapped), ``"resp"``, or None (not connected)."""
        return None if self._cache is None else self._cache.via

    def _arena(self, namespace: str, write: bool = False) -> Any:
        """The mapped arena when it holds ``namespace``'s blocks, else None (the bytes go over RESP)."""
        arena = self._cache.arena if self._cache is not None else None
        if arena is None or getattr(arena, "backend", None) != "shm":
            return None
        serves = getattr(arena, "serves", None)
        return arena if serves is None or serves(namespace, write) else None

    def _forget_all(self) -> None:
        """The connection is closed: its leases, and so the pins, are gone."""
        self._pins.clear()

    def _guard(self, what: str, fn: Any, miss: Any) -> Any:
        """Run ``fn(cache)`` under the lock; ``miss`` when there is no daemon or anything fails."""
        return self.link.guard(what, miss, fn, hold_lock=True)

    async def _off_loop(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))

    # -- leases -----------------------------------------------------------------------------------------

    def _pin(self, cache: PrefixCache, namespace: str, pages: list[bytes]) -> int:
        """One PFXGET HASHES under a lease: the leading run cached, pinned for the gets that follow."""
        stale = self._pins.forget(self._pins.stale())
        if stale:
            cache.release(*stale)
        self._learn_chain(namespace, pages)
        sent = time.monotonic()
        match = cache.lookup_keys(namespace, pages, lease=True, ttl_ms=self.lease_ttl_ms, with_data=False)
        if match.lease:
            self._pins.record(match, namespace, pages[:match.pages], sent)
        return match.pages

    # -- pages <-> memory objects ----------------------------------------------------------------------

    def _page(self, page: np.ndarray) -> MemoryObj | None:
        """A memory object holding the chunk in ``page`` (block_bytes uint8); None: no memory, or a bad page."""
        full = self.full_chunk_size_bytes
        shapes, dtypes, fmt, length = self.meta_shapes, self.meta_dtypes, self.meta_fmt, full
        if self.save_chunk_meta:
            try:
                meta = RemoteMetadata.deserialize(page[full:full + self.remote_metadata_bytes].tobytes())
                shapes, dtypes, fmt, length = meta.shapes, meta.dtypes, meta.fmt, meta.length
            except (ValueError, KeyError, struct.error):
                length = 0
            if not 0 < length <= full:
                self._warn("layout", "pfxcache: a page whose trailer is not LMCache metadata of this model's chunks "
                           "(not LMCache's pages?): read as a miss", level=logging.ERROR)
                return None
        obj = self.local_cpu_backend.allocate(shapes, dtypes, fmt)
        if obj is None:
            self._warn("alloc", "pfxcache: LMCache's local CPU buffer is full: cached chunks read as misses")
            return None
        dest = np.frombuffer(obj.byte_array, dtype=np.uint8)
        if dest.size != length:
            obj.ref_count_down()
            return None
        np.copyto(dest, page[:length])
        return obj

    def _fill(self, obj: MemoryObj, page: np.ndarray) -> None:
        """Write ``obj`` (a chunk _storable allows) into ``page`` in the page layout."""
        src = np.frombuffer(obj.byte_array, dtype=np.uint8)
        full = self.full_chunk_size_bytes
        page[:src.size] = src
        if self.save_chunk_meta:
            page[src.size:] = 0
            meta = RemoteMetadata(src.size, obj.get_shapes(), obj.get_dtypes(), obj.get_memory_format())
            page[full:full + self.remote_metadata_bytes] = np.frombuffer(meta.serialize(), dtype=np.uint8)

    def _storable(self, objs: list[MemoryObj]) -> int:
        """How many leading chunks can be pages (a short chunk, always a prompt's last, cannot without metadata)."""
        for i, obj in enumerate(objs):
            size = obj.get_size()
            if size > self.full_chunk_size_bytes or (size < self.full_chunk_size_bytes and not self.save_chunk_meta):
                self._warn("short", "pfxcache: a chunk of %d bytes (a full one is %d) is not stored: partial chunks "
                           "need save_chunk_meta", size, self.full_chunk_size_bytes, level=logging.INFO)
                return i
        return len(objs)

    # -- reads -------------------------------------------------------------------------------------------

    def _read(self, cache: PrefixCache, keys: list[CacheEngineKey], finish: bool) -> list[MemoryObj | None]:
        """The leading run of ``keys`` as memory objects (None from the first miss on)."""
        out: list[MemoryObj | None] = [None] * len(keys)
        for namespace, first, pages in self._groups(keys):
            got = self._read_group(cache, namespace, pages, finish)
            out[first:first + len(got)] = got
            if len(got) < len(pages):
                break
        self.stats["gets"] += sum(obj is not None for obj in out)
        return out

    def _read_group(self, cache: PrefixCache, namespace: str, pages: list[bytes], finish: bool) -> list[MemoryObj]:
        """Pinned chunks straight from the arena (no round trip), the rest with one PFXGET; then the leases
        read from end (``finish``) or, while they pin chunks not read yet, are renewed."""
        pins = []
        for page in pages:
            pin = self._pins.pinned(namespace, page)
            if pin is None:
                break
            pins.append(pin)
        read_from = list({id(lease): lease for lease, _block in pins}.values())
        others = {id(lease): lease for lease in self._pins.leases_of(namespace, pages, expired_only=not finish)}
        others.update((id(lease), lease) for lease in self._pins.stale())  # stale ones end at the next get too
        for lease in read_from:
            others.pop(id(lease), None)
        got: list[MemoryObj] = []
        try:
            arena = self._arena(namespace)
            if arena is None:  # over RESP: the pins keep the chunks cached until this PFXGET has read them
                got = self._fetch(cache, namespace, pages)
                self._pins.settle(cache, read_from, list(others.values()), pages[:len(got)], finish, self.lease_ttl_ms)
                return got
            complete = True
            for _lease, block in pins:
                obj = self._page(arena.blocks(block))
                if obj is None:  # LMCache's buffer is full: stop here
                    complete = False
                    break
                got.append(obj)
            if not self._pins.settle(cache, read_from, list(others.values()), pages[:len(got)], finish, self.lease_ttl_ms):
                self._free(got)  # a pin ended before the copy did: these bytes may be another page's
                got = []
            if complete and len(got) < len(pages):
                got += self._fetch(cache, namespace, pages[len(got):])
        except BaseException:
            self._free(got)
            raise
        return got

    def _fetch(self, cache: PrefixCache, namespace: str, pages: list[bytes]) -> list[MemoryObj]:
        """The leading run of ``pages`` read now: under a lease through the arena, else WITHDATA in slices
        of at most WITHDATA_BYTES (one huge reply costs redis-py far more than several smaller ones)."""
        if self._arena(namespace) is not None:
            return self._fetch_leased(cache, namespace, pages)
        got: list[MemoryObj] = []
        step = max(1, WITHDATA_BYTES // self.page_bytes)
        try:
            for start in range(0, len(pages), step):
                part = pages[start:start + step]
                match = cache.lookup_keys(namespace, part, lease=False, with_data=True)
                rows = np.frombuffer(match.data or b"", dtype=np.uint8).reshape(-1, self.page_bytes)
                for row in rows:
                    obj = self._page(row)
                    if obj is None:
                        return got
                    got.append(obj)
                if len(rows) < len(part):
                    break
        except BaseException:
            self._free(got)
            raise
        return got

    def _fetch_leased(self, cache: PrefixCache, namespace: str, pages: list[bytes]) -> list[MemoryObj]:
        match = cache.lookup_keys(namespace, pages, lease=True, ttl_ms=self.lease_ttl_ms, with_data=False)
        got: list[MemoryObj] = []
        try:
            arena = self._arena(namespace)  # after the lookup: re-mapped if the daemon restarted
            for block in match.blocks if arena is not None else ():
                obj = self._page(arena.blocks(block))
                if obj is None:
                    break
                got.append(obj)
            trusted = not match.lease or cache.release(match) == 1
        except BaseException:
            self._free(got)  # (a Match dropped unreleased has its lease ended by the client)
            raise
        if not trusted:
            self._free(got)
            return []
        return got

    @staticmethod
    def _free(objs: list[MemoryObj]) -> None:
        for obj in objs:
            obj.ref_count_down()

    # -- writes ------------------------------------------------------------------------------------------

    def _store(self, cache: PrefixCache, keys: list[CacheEngineKey], objs: list[MemoryObj]) -> None:
        for namespace, first, pages in self._groups(keys):
            chunk_objs = objs[first:first + len(pages)]
            n = self._storable(chunk_objs)
            if n:
                self._learn_chain(namespace, pages[:n])
                try:
                    self._store_group(cache, namespace, pages[:n], chunk_objs[:n])
                except NoPrefixError:  # evicted between the lookup and the store: once more, afresh
                    self._store_group(cache, namespace, pages[:n], chunk_objs[:n])
            if n < len(pages):
                return

    def _store_group(self, cache: PrefixCache, namespace: str, pages: list[bytes], objs: list[MemoryObj]) -> None:
        parent = self._parents.get((namespace, pages[0]))
        chain = [parent, *pages] if parent is not None else pages
        cached = cache.lookup_keys(namespace, chain, lease=False, with_data=False).pages
        if parent is not None and cached == 0:  # the parent is gone: the batch starts a chain of its own
            chain = pages
            cached = cache.lookup_keys(namespace, chain, lease=False, with_data=False).pages
        skip = len(chain) - len(pages)
        new = objs[max(0, cached - skip):]
        if not new:
            return
        if self._arena(namespace, write=True) is not None:
            allocation = cache.alloc(namespace, len(new), self.lease_ttl_ms)
            try:
                arena = self._arena(namespace, write=True)  # after the alloc: re-mapped if the daemon restarted
                if arena is not None:
                    for obj, block in zip(new, allocation.blocks):
                        self._fill(obj, arena.blocks(block))
                    self.stats["stored"] += cache.commit_keys(namespace, chain, allocation.blocks, cached).stored
                    return
            finally:
                cache.release(allocation)
        # Over RESP, in slices (as reads are): each hangs below the last chunk of the one before.
        step = max(1, WITHDATA_BYTES // self.page_bytes)
        for start in range(cached, len(chain), step):
            part = new[start - cached:start - cached + step]
            data = np.zeros((len(part), self.page_bytes), dtype=np.uint8)
            for obj, row in zip(part, data):
                self._fill(obj, row)
            low = max(0, start - 1)
            result = cache.store_keys(namespace, chain[low:start + len(part)], data, offset=start - low)
            self.stats["stored"] += result.stored

    # -- LMCache's RemoteConnector -------------------------------------------------------------------------

    def exists_sync(self, key: CacheEngineKey) -> bool:
        """Whether the chunk is cached (one PFXGET NOLEASE, or none when a lookup pinned it): pins nothing."""
        namespace, page = self._split(key)

        def run(cache: PrefixCache) -> bool:
            if self._pins.pinned(namespace, page) is not None:
                return True
            return cache.lookup_keys(namespace, [page], lease=False, with_data=False).pages == 1

        return bool(self._guard("exists", run, False))

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._off_loop(self.exists_sync, key)

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        """Leading chunks cached, pinned under a lease (one PFXGET per namespace) until a get reads them."""
        if not keys:
            return 0

        def run(cache: PrefixCache) -> int:
            total = 0
            for namespace, _first, pages in self._groups(keys):
                hits = self._pin(cache, namespace, pages)
                total += hits
                if hits < len(pages):
                    break
            self.stats["lookups"] += 1
            self.stats["hits"] += total
            return total

        return self._guard("lookup", run, 0)

    def support_batched_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False) -> int:
        return await self._off_loop(self.batched_contains, keys)

    def support_batched_async_contains(self) -> bool:
        return True

    def get_sync(self, key: CacheEngineKey) -> MemoryObj | None:
        """The chunk, or None; its lookup's lease ends once every chunk it pinned has been read."""
        return self._guard("get", lambda cache: self._read(cache, [key], finish=False)[0], None)

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        return await self._off_loop(self.get_sync, key)

    def batched_get_sync(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        """The leading run of the chunks (None from the first miss on); ends the leases read from."""
        if not keys:
            return []
        return self._guard("get", lambda cache: self._read(cache, keys, finish=True), [None] * len(keys))

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        return await self._off_loop(self.batched_get_sync, keys)

    def support_batched_get(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[CacheEngineKey]) -> list[MemoryObj]:
        got = await self.batched_get(keys)
        return got[:got.index(None)] if None in got else got

    def support_batched_get_non_blocking(self) -> bool:
        return True

    def batched_put_sync(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        """Store the chunks LMCache hands over, in prefix order, sending only the pages the daemon lacks.
        LMCache's own wrapper drops its references to ``memory_objs`` afterwards."""
        if keys:
            self._guard("store", lambda cache: self._store(cache, list(keys), list(memory_objs)), None)

    async def batched_put(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        await self._off_loop(self.batched_put_sync, keys, memory_objs)

    def support_batched_put(self) -> bool:
        return True

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self._off_loop(self.batched_put_sync, [key], [memory_obj])

    def remove_sync(self, key: CacheEngineKey) -> bool:
        """PFXEVICT of the chunk (and every chunk cached below it); True when something was dropped."""
        namespace, page = self._split(key)
        return bool(self._guard("remove", lambda cache: cache.evict_keys(namespace, [page]).evicted > 0, False))

    async def list(self) -> list[str]:
        """Always empty: the daemon keeps a 128-bit digest of each page key, not the key."""
        return []

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """0 when the daemon answers, 1 otherwise (LMCache's health check)."""
        return await self._off_loop(lambda: 0 if self._guard("ping", lambda c: c.client.ping(), False) else 1)

    def close_sync(self) -> None:
        """End every lease and close the connection."""
        with self._lock:
            if self._cache is not None:
                try:
                    matches = self._pins.forget_all()
                    if matches:
                        self._cache.release(*matches)
                except Exception:
                    pass  # closing the connection ends them anyway
            self.link.close()

    async def close(self) -> None:
        await self._off_loop(self.close_sync)

    def __repr__(self) -> str:
        return f"<PrefixCacheConnector {self.url} {self.base}>"


def _options(config: Any) -> Any:
    """``option(name, default)``: ``remote_storage_plugin.<name>.<option>`` of the plugin that loads this class,
    else ``<option>``, from LMCache's ``extra_config``."""
    extra = dict(getattr(config, "extra_config", None) or {})
    plugins = [name for name in (getattr(config, "remote_storage_plugins", None) or [])
               if extra.get(f"remote_storage_plugin.{name}.class_name") == PrefixCacheConnector.__name__
               and extra.get(f"remote_storage_plugin.{name}.module_path") == __name__]

    def option(name: str, default: Any) -> Any:
        for plugin in plugins:
            value = extra.get(f"remote_storage_plugin.{plugin}.{name}")
            if value is not None:
                return value
        value = extra.get(name)
        return default if value is None else value

    return option
