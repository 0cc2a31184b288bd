"""SGLang HiCache's storage tier (L3) in pfxcache: ``PrefixCacheStorage``, a ``HiCacheStorage`` backend.

SGLang loads it without a patch, through its ``dynamic`` backend::

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
      '{"backend_name": "pfxcache", "module_path": "pfxcache.client.sglang",
        "class_name": "PrefixCacheStorage", "pfxcache_url": "redis://127.0.0.1:6390/0",
        "interface_v1": 1, "hicache_storage_pass_prefix_keys": true}'

Rules:

* **Keys.** SGLang names a page by the hex SHA-256 chain of its tokens (:func:`page_keys` is the same
  function); a batch is up to 128 pages in prefix order. They go to the daemon as they are, in
  ``PFXGET`` / ``PFXSET ... HASHES``.
* **Namespaces.** ``<pfxcache_namespace>:<model>:<shard>:<layout>:<dtype>`` (base ``sglang``): the
  shard is ``tp<rank>of<size>`` (plus ``pp``, ``cp`` and ``dcp`` parts where those are used), or ``mla``
  for MLA models, whose ranks hold the same KV: all ranks read one namespace and only SGLang's one
  writer per shard stores. A rank never reads another rank's shard, a layout or dtype never reads
  another's bytes, and tenants (``pfxcache_namespace`` and the URL's ACL user) never meet. SGLang
  reduces the hit counts of its ranks with MIN before it loads, so ranks agree on what they use.
* **A page is one block.** Its bytes are SGLang's flat data page (``get_data_page(flat=True)``: for
  ``page_first``, the page's K then its V), so ``block-bytes`` must be one page of this rank:
  ``register_mem_pool_host`` checks it against ``PFXINFO`` and raises, naming the value to use.
  ``batch_get_v1`` / ``batch_set_v1`` copy the same bytes straight between the host pool and the
  daemon's shared-memory arena when it is mapped (the daemon on this host), over RESP otherwise.
* **What batch_exists reports, batch_get reads.** ``batch_exists`` is one ``PFXGET ... HASHES`` that
  pins the leading run under a lease of ``pfxcache_lease_ttl_ms``; the next get of that batch reads
  the pinned pages and ends the lease. Without such a pin, a get takes its own lease for the copy.
  Pages after the first miss are ``None`` (or ``False``): SGLang counts anything else as loaded.
* **Stores send only what is missing**: ``PFXGET ... NOLEASE``, then ``PFXSET ... OFFSET`` of the rest.
  With ``hicache_storage_pass_prefix_keys`` a v1 batch hangs below the page before it, so a prompt's
  pages are one chain and eviction takes its tail first.
* **Failures never reach SGLang.** The daemon unreachable, restarted or refusing: misses and
  ``False``, each cause logged once; after ``pfxcache_retry_seconds`` the next call reconnects.

Theory of operation: one blocking :class:`~pfxcache.client.PrefixCache` (one connection: leases belong
to it), kept by an :class:`~pfxcache.client.engine_link.EngineLink` and shared by SGLang's prefetch, I/O
and backup threads; each command holds the connection only for its round trip, and the copies run
outside it.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from redis.backoff import NoBackoff
from redis.retry import Retry

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo

from .arena import ShmArenaView, kv_buffer, readable_bytes, writable_bytes
from .cache import PrefixCache
from .engine_link import EngineLink
from .errors import NoPrefixError
from .sglang_host_pool import HostPages, Sink, Source

log = logging.getLogger("pfxcache.sglang")

DEFAULT_URL = "redis://127.0.0.1:6390/0"
LEASE_MARGIN_S = 1.0  # a pin is read only this long before its lease could end
MAX_PINS = 256  # batch_exists pins held at once; past it the oldest end



def page_keys(token_ids: Any, page_size: int, prior_hash: str | None = None) -> list[str]:
    """SGLang's storage keys of ``token_ids``, one per page (the last may be partial), as hex strings.

    Page i's key is SHA-256 of the previous key's 32 bytes (``prior_hash`` for the first page, none
    when it is None) and the page's token ids as little-endian u32 (u64 after a 0xff byte when one
    is past 2**32): ``sglang.srt.mem_cache.utils.get_hash_str``, for tools that must find SGLang's pages.
    """
    digest = bytes.fromhex(prior_hash) if prior_hash else b""
    tokens = [int(t) for t in token_ids]
    keys = []
    for start in range(0, len(tokens), page_size):
        page = tokens[start:start + page_size]
        if any(t > 0xFFFFFFFF for t in page):
            body = b"\xff" + struct.pack(f"<{len(page)}Q", *page)
        else:
            body = struct.pack(f"<{len(page)}I", *page)
        digest = hashlib.sha256(digest + body).digest()
        keys.append(digest.hex())
    return keys


def shard_name(config: HiCacheStorageConfig) -> str:
    """The part of the namespace that tells one rank's shard of a page from another's."""
    parts = ["mla" if config.is_mla_model else f"tp{config.tp_rank}of{config.tp_size}"]
    if config.pp_size > 1:
        parts.append(f"pp{config.pp_rank}of{config.pp_size}")
    if config.attn_cp_size > 1:
        parts.append(f"cp{config.attn_cp_rank}of{config.attn_cp_size}")
    if getattr(config, "dcp_size", 1) > 1:
        parts.append(f"tp{config.tp_size}dcp{config.dcp_rank}of{config.dcp_size}page{config.logical_page_size}")
    return ":".join(parts)


class _Pin:
    """A batch_exists lease: the Match holding it (kept alive, or its collection would end the lease),
    the keys it pins and until when it can be trusted."""

    __slots__ = ("keys", "match", "valid_until")

    def __init__(self, keys: list[str], match: Any, valid_until: float) -> None:
        self.keys = keys
        self.match = match
        self.valid_until = valid_until


class PrefixCacheStorage(HiCacheStorage):
    """SGLang ``HiCacheStorage`` over a pfxcache daemon (see the module docstring)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict | None = None) -> None:
        self.storage_config = storage_config
        extra = dict(storage_config.extra_config or {})
        stats = {"gets": 0, "pages_read": 0, "pages_stored": 0, "errors": 0, "reconnects": 0}
        self.link = EngineLink(str(extra.get("pfxcache_url", DEFAULT_URL)), str(extra.get("pfxcache_transfer", "auto")),
                               self._block_bytes_problem, logger=log, engine="SGLang", role="backend", unit="pages",
                               retry_seconds=float(extra.get("pfxcache_retry_seconds", 5.0)),
                               timeout_seconds=float(extra.get("pfxcache_timeout_seconds", 5.0)), stats=stats,
                               on_drop=self._forget_pins, retry=Retry(NoBackoff(), 1))
        self.url, self.stats = self.link.url, self.link.stats
        self.lease_ttl_ms = int(extra.get("pfxcache_lease_ttl_ms", 10_000))  # batch_exists pins; 0: none
        model = storage_config.model_name or "model"
        self.base_namespace = f"{extra.get('pfxcache_namespace', 'sglang')}:{model}:{shard_name(storage_config)}"
        self.namespace = self.base_namespace  # + the host pool's layout and dtype, once it is registered
        self.is_writer = getattr(storage_config, "is_storage_writer",
                                 not storage_config.is_mla_model or storage_config.tp_rank == 0)
        self.page_bytes: int | None = None  # one page of this rank, once the host pool is known
        self.host: HostPages | None = None
        self._lock = self.link.lock  # the connection and the pins (each command holds it for itself)
        self._pins: OrderedDict[str, _Pin] = OrderedDict()  # first key of a batch -> its pin
        self._connection()

    # -- setup ----------------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Learn the host pool: its page bytes (checked against the daemon's block-bytes: ValueError
        when they differ), the namespace's layout and dtype, and where v1 copies find each page."""
        super().register_mem_pool_host(mem_pool_host)
        page = mem_pool_host.get_dummy_flat_data_page()
        self.page_bytes = page.numel() * page.element_size()
        dtype = str(getattr(mem_pool_host, "dtype", page.dtype)).replace("torch.", "")
        self.namespace = f"{self.base_namespace}:{getattr(mem_pool_host, 'layout', 'flat')}:{dtype}"
        self.host = HostPages(mem_pool_host, self.page_bytes)
        with self._lock:
            block_bytes = self._block_bytes
            if self._cache is not None and block_bytes != self.page_bytes:
                self.link.drop()
                raise ValueError(self._block_bytes_problem(block_bytes))

    def _block_bytes_problem(self, block_bytes: int) -> str | None:
        """What is wrong with the daemon's block-bytes for this rank's pages (None: nothing, or no pool yet)."""
        if self.page_bytes is not None and block_bytes != self.page_bytes:
            return (f"pfxcache at {self.url} has block-bytes {block_bytes}, and one SGLang page of this rank is "
                    f"{self.page_bytes} bytes: start pfxcached with --block-bytes {self.page_bytes}")
        return None

    # -- the connection ---------------------------------------------------------------------------------

    @property
    def _cache(self) -> PrefixCache | None:
        return self.link.cache

    @property
    def _block_bytes(self) -> int:
        """The daemon's block-bytes (0 before the first connection)."""
        return self.link.info.block_bytes if self.link.info is not None else 0

    def _warn(self, cause: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        self.link.warn(cause, message, *args, level=level)

    def _connection(self) -> PrefixCache | None:
        """The cache, connecting first when there is none and the retry delay has passed."""
        return self.link.connect()

    def _forget_pins(self) -> None:
        """The connection is closed: its leases, and so the pins, are gone."""
        self._pins.clear()

    def _guard(self, what: str, miss: Any, fn: Callable[[PrefixCache], Any]) -> Any:
        """``fn(cache)``, or ``miss`` when there is no daemon or anything fails (logged once per cause)."""
        return self.link.guard(what, miss, fn)  # each command holds the connection only for its round trip

    @staticmethod
    def _rows(cache: PrefixCache, blocks: list[int], write: bool = False) -> list[np.ndarray] | None:
        """Views of the blocks in the mapped arena (None: not mapped here, the bytes go over RESP)."""
        arena = cache.arena
        if arena is None or getattr(arena, "backend", None) != "shm":
            return None
        if not blocks:
            return []
        maps = getattr(arena, "maps", None)
        if maps is not None and not maps(blocks, write):
            return None
        if type(arena) is ShmArenaView and arena.array is not None:
            return [arena.array[b] for b in blocks]
        return [arena.blocks(int(b)) for b in blocks]

    # -- pins -------------------------------------------------------------------------------------------

    def _pin(self, cache: PrefixCache, keys: list[str], match: Any, ttl_ms: int, sent: float) -> None:
        ended = []
        with self._lock:
            if self._cache is not cache:
                return  # the connection went meanwhile, and the lease with it
            old = self._pins.pop(keys[0], None)
            if old is not None:
                ended.append(old.match)
            self._pins[keys[0]] = _Pin(keys[:match.pages], match, sent + ttl_ms / 1000 - LEASE_MARGIN_S)
            now = time.monotonic()
            for first in [f for f, p in self._pins.items() if p.valid_until < now]:
                ended.append(self._pins.pop(first).match)
            while len(self._pins) > MAX_PINS:
                ended.append(self._pins.popitem(last=False)[1].match)
        if ended:
            cache.release(*ended)

    def _take_pin(self, keys: list[str]) -> tuple[_Pin | None, int]:
        """The live pin of this batch and how many of ``keys`` it covers (taken off the table)."""
        with self._lock:
            pin = self._pins.pop(keys[0], None) if keys else None
        if pin is None or time.monotonic() > pin.valid_until:
            return pin, 0  # an expired pin is still released (harmless), but nothing relies on it
        covered = 0
        for mine, pinned in zip(keys, pin.keys):
            if mine != pinned:
                break
            covered += 1
        return pin, covered

    # -- the two data paths -------------------------------------------------------------------------------

    def _read(self, cache: PrefixCache, keys: list[str], sink: Sink) -> int:
        """Hand the leading run of cached pages of ``keys`` to ``sink``; how many it got (0 on doubt)."""
        self.stats["gets"] += 1
        pin, covered = self._take_pin(keys)
        try:
            if cache.via == "shm":
                if covered == len(keys):  # pinned by batch_exists: their blocks stay put until the pin ends
                    match = cache.lookup_keys(self.namespace, keys, lease=False, with_data=False)
                    holder, pin = pin.match, None
                else:
                    match = holder = cache.lookup_keys(self.namespace, keys, lease=True, with_data=False)
                rows = self._rows(cache, match.blocks)
                if rows is None:
                    cache.release(holder)  # not mapped here after all: over RESP below
                else:
                    try:
                        for i, row in enumerate(rows):
                            sink(i, row)
                    finally:
                        ended = cache.release(holder)
                    if holder.lease and not ended:
                        return 0  # the lease ended before the copy did: those blocks may hold other pages
                    return self._counted(match.pages)
            match = cache.lookup_keys(self.namespace, keys, lease=False, with_data=True)
            data = np.frombuffer(match.data or b"", dtype=np.uint8)
            size = self._block_bytes
            for i in range(match.pages):
                sink(i, data[i * size:(i + 1) * size])
            return self._counted(match.pages)
        finally:
            if pin is not None:  # a pin this read did not rely on: end it too
                cache.release(pin.match)

    def _counted(self, pages: int) -> int:
        self.stats["pages_read"] += pages
        return pages

    def _write(self, cache: PrefixCache, keys: list[str], extra_info: Any, source: Source) -> bool:
        """Store the pages of ``keys`` the daemon lacks, their bytes from ``source``; True when all are held."""
        parent = getattr(extra_info, "prefix_keys", None)
        for attempt in (1, 2):
            chain, first = keys, 0
            if parent:  # hang the batch below the page before it, when that page is held
                held = cache.lookup_keys(self.namespace, [parent[-1], *keys], lease=False, with_data=False).pages
                if held:
                    chain, first = [parent[-1], *keys], 1
            if first == 0:
                held = cache.lookup_keys(self.namespace, keys, lease=False, with_data=False).pages
            if held >= len(chain):
                return True
            count = len(chain) - held
            try:
                if cache.via == "shm":
                    with cache.alloc(self.namespace, count) as allocation:
                        rows = self._rows(cache, allocation.blocks, write=True)
                        if rows is not None:
                            for j, row in enumerate(rows):
                                source(held + j - first, row)
                            result = cache.commit_keys(self.namespace, chain, allocation.blocks, offset=held)
                            self.stats["pages_stored"] += result.stored
                            return True
                data = kv_buffer((count, self._block_bytes))
                for j in range(count):
                    source(held + j - first, data[j])
                result = cache.store_keys(self.namespace, chain, memoryview(data.reshape(-1)), offset=held)
                self.stats["pages_stored"] += result.stored
                return True
            except NoPrefixError:
                if attempt == 2:  # the prefix went between the lookup and the store, twice
                    raise
        return False

    def _sized(self, what: str, tensors: list[Any]) -> bool:
        """Whether every tensor is one page of the daemon's block-bytes (a refusal is logged once)."""
        for tensor in tensors:
            if tensor is None or tensor.numel() * tensor.element_size() != self._block_bytes:
                got = None if tensor is None else tensor.numel() * tensor.element_size()
                self._warn(f"{what}:size:{got}", "pfxcache: %s refused: a page of %s bytes, the daemon's pages are "
                           "%d bytes (--block-bytes)", what, got, self._block_bytes, level=logging.ERROR)
                return False
        return True

    # -- HiCacheStorage --------------------------------------------------------------------------------

    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """Pages of ``keys`` cached, a leading run: one PFXGET that pins them for the get that follows."""
        if not keys:
            return 0

        def run(cache: PrefixCache) -> int:
            sent = time.monotonic()
            match = cache.lookup_keys(self.namespace, keys, lease=self.lease_ttl_ms > 0,
                                      ttl_ms=self.lease_ttl_ms or None, with_data=False)
            if match.lease:
                self._pin(cache, keys, match, self.lease_ttl_ms, sent)
            return match.pages
        return self._guard("batch_exists", 0, run)

    def exists(self, key: str) -> bool:
        """Whether the page of ``key`` is cached (a lone key is found wherever the namespace holds it)."""
        return self._guard("exists", False, lambda cache: cache.lookup_keys(
            self.namespace, [key], lease=False, with_data=False).pages == 1)

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> list[Any]:
        """Each page's bytes in its target tensor (a new uint8 tensor when none is given); None from the
        first page not cached on."""
        missing: list[Any] = [None] * len(keys)
        if not keys:
            return missing
        targets = list(target_locations) if target_locations is not None else [None] * len(keys)

        def run(cache: PrefixCache) -> list[Any]:
            if target_locations is not None and not self._sized("batch_get", targets):
                return missing
            got = list(targets)

            def sink(i: int, row: np.ndarray) -> None:
                if got[i] is None:
                    got[i] = torch.empty(row.size, dtype=torch.uint8)
                np.copyto(writable_bytes(got[i]), row)
            found = self._read(cache, keys, sink)
            return got[:found] + missing[found:]
        return self._guard("batch_get", missing, run)

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Store the pages the daemon lacks from ``values`` (one flat tensor per page); True when all are held."""
        if not keys:
            return True
        if not self.is_writer:
            return True  # MLA: another rank writes this shard
        values = list(values or [])

        def run(cache: PrefixCache) -> bool:
            if len(values) != len(keys) or not self._sized("batch_set", values):
                return False
            return self._write(cache, keys, None, lambda i, row: np.copyto(row, readable_bytes(values[i])))
        return self._guard("batch_set", False, run)

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """Copy the cached leading run of ``keys`` into the host pool at ``host_indices`` (one page each)."""
        if not keys:
            return []

        def run(cache: PrefixCache) -> list[bool]:
            host = self._host("batch_get_v1", keys, host_indices)
            found = self._read(cache, keys, host.sink(host_indices, len(keys))) if host else 0
            return [True] * found + [False] * (len(keys) - found)
        return self._guard("batch_get_v1", [False] * len(keys), run)

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """Store the pages of ``keys`` the daemon lacks, from the host pool at ``host_indices``."""
        if not keys:
            return []
        if not self.is_writer:
            return [True] * len(keys)

        def run(cache: PrefixCache) -> list[bool]:
            host = self._host("batch_set_v1", keys, host_indices)
            stored = bool(host) and self._write(cache, keys, extra_info, host.source(host_indices, len(keys)))
            return [stored] * len(keys)
        return self._guard("batch_set_v1", [False] * len(keys), run)

    def _host(self, what: str, keys: list[str], host_indices: Any) -> HostPages | None:
        host = self.host
        if host is None:
            self._warn(f"{what}:pool", "pfxcache: %s needs the host pool (register_mem_pool_host)", what,
                       level=logging.ERROR)
            return None
        if len(host_indices) != len(keys) * host.page_size or self.page_bytes != self._block_bytes:
            self._warn(f"{what}:indices", "pfxcache: %s refused: %d keys, %d host indices (page size %d)", what,
                       len(keys), len(host_indices), host.page_size, level=logging.ERROR)
            return None
        return host

    def clear(self) -> None:
        """Evict this rank's namespace (its unpinned pages)."""
        self._guard("clear", None, lambda cache: cache.evict(self.namespace, all=True))

    def close(self) -> None:
        """Close the connection (the daemon ends its leases)."""
        self.link.close()
