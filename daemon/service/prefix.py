"""The prefix store inside the daemon: arena, shard locks, leases, background work.

The store core (:mod:`pfxcache.daemon.store`) is synchronous and knows nothing
of trio. This module adds what a concurrent server needs around it.

Every operation a command runs is one method here (:meth:`PrefixService.lookup`,
:meth:`~PrefixService.insert`, :meth:`~PrefixService.alloc`,
:meth:`~PrefixService.release`, :meth:`~PrefixService.evict`); the command
handlers parse arguments and shape replies, and never see a lock or a shard.

Locks and awaits — exactly which operation holds which lock across which await:

* Store calls themselves never await: each runs to completion on the event
  loop, so the store's structures are always consistent between awaits.
* :meth:`~PrefixService.insert` with DATA holds the **write lock of its
  shard** from ``begin_insert`` (blocks allocated, the cached prefix pinned)
  across the await that copies DATA into the arena (in a worker thread when
  the data is large, so the loop keeps serving) until ``commit_insert``. Why:
  a reader of the same shard then waits for the insert to land instead of
  missing pages a moment before they exist (and recomputing them), and two
  writers of the same prefix do not both copy the same pages. If the task is
  cancelled during the copy, ``abort_insert`` returns every block in
  ``finally``. With BLOCKS (written by the worker already) there is no copy,
  and the lock is held for the synchronous begin/commit only.
* :meth:`~PrefixService.lookup` holds the **read lock of its shard** for the
  match only — no await inside. With ``with_data`` the copy out of the arena
  happens after the lock is released, under the lease's pin (a temporary
  lease when no lease was asked for), which is what keeps those blocks from
  being evicted or reused meanwhile.
* Evictions (``PFXEVICT``, allocation-triggered, the low-watermark task), lease
  expiry and releases take no lock: they are synchronous, and they only touch
  unpinned, fully linked leaves, never the pinned prefix or the fresh blocks of
  an insert in flight in another shard.

A writer on one shard therefore never delays readers of another shard.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from typing import Any, NamedTuple

import trio

from pfxcache.daemon.service.forked_check import check_in_child, checks_inline
from pfxcache.daemon.observability.memory import MemoryAccount, MemoryFigures
from pfxcache.daemon.service.rwlock import RWLock
from pfxcache.daemon.store import PrefixStore
from pfxcache.daemon.config.partitions import partition_blocks
from pfxcache.daemon.store.arena import MemfdArena, MemoryArena, ShmArena
from pfxcache.daemon.store.partitioned_arena import PartitionedMemfdArena
from pfxcache.daemon.store.partitions import block_alignment, plan_layout
from pfxcache.daemon.store.cuda_arena import CudaArena
from pfxcache.daemon.store.errors import BadRequest
from pfxcache.daemon.store.quotas import QuotaBook
from pfxcache.daemon.store.results import AllocResult, EvictResult, InsertResult

log = logging.getLogger("pfxcached")

#: Copies at least this large go to a worker thread instead of blocking the loop.
THREAD_COPY_THRESHOLD = 1 << 20
CHECK_TIMEOUT_S = 600.0
#: Leases a closing connection releases between two checkpoints (about 10 ms of work).
RELEASE_SLICE = 10_000


class Lookup(NamedTuple):
    """What :meth:`PrefixService.lookup` found."""

    matched_tokens: int
    lease_id: int  # 0: no lease (not asked for, or nothing matched)
    blocks: list[int]  # one block id per matched page, in order
    data: bytes | None  # the matched blocks' bytes, when asked for


def _store_policy(name: str, current: str) -> str:
    """The store's eviction order for a maxmemory-policy value (noeviction keeps ``current``)."""
    return current if name == "noeviction" else name


class PrefixService:
    """The daemon's prefix store: one per server."""

    def __init__(self, config: Any, *, tcp_port: int, glob: Any = None, latency_event: Any = None) -> None:
        """``glob(pattern, name)``: how tenant-quota patterns match namespaces; the server passes
        Redis's stringmatchlen, the one ACL key patterns use (None: fnmatch, close to it).
        ``latency_event(event, ms)`` is told of work that may stall clients (LATENCY).

        The arena is reserved here; an error after that closes it again before it propagates.
        """
        self.config = config
        self._glob = glob
        #: Told of work that may stall clients: (event, milliseconds) for LATENCY.
        self.latency_event: Any = latency_event if latency_event is not None else (lambda _event, _ms: None)
        block_bytes = config["block-bytes"]
        nblocks = config["maxmemory"] // block_bytes
        if nblocks < 1:
            raise ValueError(
                f"maxmemory ({config['maxmemory']} bytes) holds no block of block-bytes {block_bytes}"
            )
        backend = config["arena"]
        partitions = partition_blocks(config["arena-partition"], block_bytes)
        align = block_alignment(block_bytes, mmap.PAGESIZE)
        if partitions and backend != "shm":
            raise ValueError(f"arena-partition needs the shm arena (arena is {backend}): only shared memory "
                             f"is handed to workers partition by partition")
        if backend == "shm":
            # Earlier versions kept the arena in a /dev/shm file: remove what dead ones left.
            ShmArena.cleanup_stale(prefix=f"{config['arena-name']}-")
            name = f"{config['arena-name']}-{os.getpid()}-{tcp_port}"
            if partitions:
                layout = plan_layout(partitions, nblocks, align)  # ValueError: they do not fit
                self.arena = PartitionedMemfdArena(
                    block_bytes, [(str(number), first, count) for number, (_, first, count) in enumerate(layout)],
                    name=name)
            else:
                self.arena = MemfdArena(block_bytes, nblocks, name=name)
        elif backend == "memory":
            self.arena = MemoryArena(block_bytes, nblocks)
        elif backend == "cuda":
            # CuPy is optional: the arena loads it when created. A missing CuPy or
            # GPU raises CudaUnavailable (a ValueError): a startup error.
            self.arena = CudaArena(block_bytes, nblocks, device=config["arena-device"])
        else:
            raise ValueError(f"arena '{backend}' is not available in this build")
        try:
            self._build_store(config, partitions, align)
        except BaseException:
            self.arena.close()
            raise

    def _build_store(self, config: Any, partitions: Any, align: int) -> None:
        """The store over the arena, and the directives that reach it at runtime."""
        glob = self._glob
        self.store = PrefixStore(
            self.arena,
            page_size=config["page-size"],
            shards=config["shards"],
            policy=_store_policy(config["maxmemory-policy"], "lru"),
            lease_ttl_ms=config["lease-ttl"],
            # Every lease owner here is a live connection whose worker may still touch its blocks
            # through the mapped arena: an expired lease is fenced, never recycled under it.
            fence_expired=True,
            quotas=self._quota_book(config["tenant-quota"]),
            max_leases_per_owner=config["client-lease-limit"],
            partitions=partitions, partition_match=glob, partition_align=align,
        )
        self.locks = [RWLock() for _ in range(config["shards"])]
        self._keyspace_baseline: dict[str, int] = {}
        self.ticks = 0
        #: The disk tier under the arena (service/tiering.py), set when disk-tier-size is not 0.
        self.tier: Any = None
        # KV bytes the daemon copied for requests: DATA into the arena, WITHDATA out of it
        # (a mapped arena's copies happen in the workers and are not seen here).
        self.copied_in_bytes = 0
        self.copied_out_bytes = 0
        self.memory = MemoryAccount(self.store)  # after the store: its start-up heap is the baseline
        self._apply_policy(config["maxmemory-policy"])
        config.on_change("maxmemory-policy", lambda _old, new: self._apply_policy(new))
        keys = self.store.keys
        keys.log_factor, keys.decay_minutes = config["lfu-log-factor"], config["lfu-decay-time"]
        config.on_change("lfu-log-factor", lambda _old, new: setattr(keys, "log_factor", new))
        config.on_change("lfu-decay-time", lambda _old, new: setattr(keys, "decay_minutes", new))
        config.on_change("lease-ttl", lambda _old, new: setattr(self.store, "lease_ttl_ms", new))
        config.on_change("tenant-quota", lambda _old, new: self.store.set_quotas(self._quota_book(new)))
        config.on_change("client-lease-limit",
                         lambda _old, new: setattr(self.store, "max_leases_per_owner", new))

    def _apply_policy(self, name: str) -> None:
        # noeviction keeps the policy in force for PFXEVICT and only stops evicting for space.
        self.store.evicting = name != "noeviction"
        self.store.set_policy(_store_policy(name, self.store.policy))

    def _quota_book(self, rules: Any) -> QuotaBook:
        """The tenant-quota rules as the store takes them, matched with the glob ACL key patterns use."""
        return QuotaBook(((pattern.encode("utf-8", "surrogateescape"), pages, leased, leases)
                          for pattern, pages, leased, leases in rules), match=self._glob)

    def attach_layout(self) -> list[dict] | None:
        """The partitions PFXATTACH may hand out (an unpartitioned shm arena is one remainder);
        None when the arena cannot be passed to a worker (memory, cuda)."""
        if self.store.parts:
            return self.store.partitions()
        if isinstance(self.arena, MemfdArena):
            return [{"pattern": b"*", "first-block": 0, "nblocks": self.arena.nblocks, "remainder": 1}]
        return None

    def close(self) -> None:
        """Release the arena (the shared-memory file is unlinked)."""
        self.arena.close()

    async def release_owner(self, owner: int) -> None:
        """A connection went away: end every lease it held, fenced ones too.

        In slices of RELEASE_SLICE leases with a checkpoint between them: a connection that
        held a million leases must not freeze every other client while they go.
        """
        released = 0
        while True:
            count = self.store.release_owner(owner, RELEASE_SLICE)
            released += count
            if count < RELEASE_SLICE:
                break
            await trio.sleep(0)
        if released:
            log.debug("Released %d leases of client id=%d", released, owner)

    def holds_leases(self, owner: int) -> bool:
        """Whether a connection holds leases (fenced ones included): ``timeout`` spares it, since
        closing it would recycle blocks its worker, only slow, may still be reading or writing."""
        return self.store.holds_leases(owner)

    def tick(self, *, paused: bool = False) -> None:
        """Periodic work (from the server cron, ``hz`` times a second): expire leases, keep free
        blocks above the low watermark. INFO's ``pfxcache_ticks`` counts the runs.

        ``paused`` (CLIENT PAUSE): namespaces do not expire and the watermark waits, as Redis
        pauses expiry and eviction; leases still expire (they are not data)."""
        self.ticks += 1
        self.memory.figures()  # keeps the peak of used_memory between INFO calls, as Redis's cron does
        self.store.expire()
        if paused:
            return
        start = time.perf_counter()
        if self.store.keys.expire_due():
            self.latency_event("expire-cycle", (time.perf_counter() - start) * 1000)
        low = self.arena.nblocks * self.config["evict-low-watermark"] // 100
        if low:
            start = time.perf_counter()
            if self.store.evict_to_watermark(low).evicted:
                self.latency_event("eviction-cycle", (time.perf_counter() - start) * 1000)

    # -- the operations commands run -------------------------------------------------

    @property
    def max_alloc(self) -> int:
        """The most blocks one :meth:`alloc` may ask for."""
        return self.store.max_alloc

    async def lookup(
        self,
        namespace: bytes,
        tokens: bytes,
        *,
        owner: int,
        lease: bool = True,
        ttl_ms: int | None = None,
        with_data: bool = False,
        keys: bool = False,
    ) -> Lookup:
        """PFXGET: the longest cached prefix of ``tokens``, leased to ``owner`` unless ``lease`` is False.

        With ``with_data`` the matched blocks' bytes are copied out too. ``keys``: ``tokens`` are
        key pages (HASHES, store/page_keys.py); a StoreError when the namespace holds the other kind.
        """
        self.store.use_keys(namespace, keys)
        lock = self.locks[self.store.shard_of(namespace, tokens)]
        if self.tier is not None:
            # Pages that continue the RAM match on disk come into RAM first (never an error):
            # the match below then answers for them exactly as for pages that never left.
            await self.tier.promote(namespace, tokens, lock)
        async with lock.read():
            # with_data pins the pages while their bytes are copied out, with no deadline:
            # lease expiry must not free (and reuse) blocks under the copy. The lease the
            # caller asked for gets its TTL once the copy is done.
            result = self.store.match(namespace, tokens, lease=lease or with_data,
                                      ttl_ms=0 if with_data else ttl_ms, owner=owner, transient=not lease)
        data = None
        if with_data:
            try:
                data = await self.copy_out(result.blocks)
            finally:
                if result.lease_id:
                    if lease:
                        self.store.renew(result.lease_id, owner, ttl_ms)
                    else:
                        self.store.release([result.lease_id], owner)
        return Lookup(result.matched_tokens, result.lease_id if lease else 0, result.blocks, data)

    def lookup_now(self, namespace: bytes, tokens: bytes, *, owner: int, lease: bool = True,
                   ttl_ms: int | None = None, keys: bool = False) -> Lookup | None:
        """:meth:`lookup` without WITHDATA, done at once when the shard's read lock is free
        (nobody writes or waits to): no await, no checkpoint. None: the lock is contended and
        nothing was done; await :meth:`lookup`, which queues fairly."""
        self.store.use_keys(namespace, keys)
        lock = self.locks[self.store.shard_of(namespace, tokens)]
        if not lock.try_acquire_read():
            return None
        try:
            # With a tier, a match that a lower tier continues is left undone (None): lookup() brings
            # those pages up first. Checked only when the RAM match is shorter than the prompt.
            result = self.store.match(namespace, tokens, lease=lease, ttl_ms=ttl_ms, owner=owner,
                                      transient=not lease, below=self.tier.below if self.tier is not None else None)
        finally:
            lock.release_read()
        if result is None:
            return None
        return Lookup(result.matched_tokens, result.lease_id if lease else 0, result.blocks, None)

    async def insert(
        self,
        namespace: bytes,
        tokens: bytes,
        *,
        owner: int,
        offset: int = 0,
        data: Any = None,
        blocks: list[int] | None = None,
        keys: bool = False,
    ) -> InsertResult:
        """PFXSET: cache the pages of ``tokens`` from page ``offset`` on.

        Their KV data is either ``data`` (copied into fresh blocks) or already in
        ``blocks`` (written by the worker into blocks it got from PFXALLOC).
        Raises a StoreError, changing nothing, for a refused insert.
        """
        self._check_data(tokens, offset, data)
        self.store.use_keys(namespace, keys, writing=True)
        lock = self.locks[self.store.shard_of(namespace, tokens)]
        async with lock.write():
            plan = self.store.begin_insert(namespace, tokens, offset=offset, owner=owner, blocks=blocks)
            committed = False
            try:
                if data is not None and plan.copy_needed:
                    await self.copy_in(plan.new_blocks, plan.new_data(data))
                result = self.store.commit_insert(plan)
                committed = True
            finally:
                if not committed:
                    self.store.abort_insert(plan)
        return result

    def insert_now(self, namespace: bytes, tokens: bytes, *, owner: int, offset: int = 0, data: Any = None,
                   blocks: list[int] | None = None, keys: bool = False) -> InsertResult | None:
        """:meth:`insert` done at once when the shard's lock is free and DATA is copied on the
        loop anyway (under THREAD_COPY_THRESHOLD): no await, no checkpoint. None: it would have
        to wait, and nothing was done; await :meth:`insert`. A StoreError as :meth:`insert`."""
        self._check_data(tokens, offset, data)
        if data is not None and len(data) >= THREAD_COPY_THRESHOLD:
            return None
        self.store.use_keys(namespace, keys, writing=True)
        lock = self.locks[self.store.shard_of(namespace, tokens)]
        if not lock.try_acquire_write():
            return None
        try:
            plan = self.store.begin_insert(namespace, tokens, offset=offset, owner=owner, blocks=blocks)
            committed = False
            try:
                if data is not None and plan.copy_needed:
                    self._copy_in_now(plan.new_blocks, plan.new_data(data))
                result = self.store.commit_insert(plan)
                committed = True
            finally:
                if not committed:
                    self.store.abort_insert(plan)
        finally:
            lock.release_write()
        return result

    def _check_data(self, tokens: bytes, offset: int, data: Any) -> None:
        if data is not None:
            expected = self.store.data_size(tokens, offset)
            if len(data) != expected:
                raise BadRequest(
                    f"DATA is {len(data)} bytes, expected {expected} "
                    f"(pages from OFFSET {offset} x block-bytes {self.arena.block_bytes})"
                )

    def alloc(self, namespace: bytes, count: int, *, owner: int, ttl_ms: int | None = None) -> AllocResult:
        """PFXALLOC: ``count`` fresh blocks leased to ``owner``, for a worker to write into."""
        return self.store.alloc(namespace, count, ttl_ms=ttl_ms, owner=owner)

    def release(self, lease_ids: list[int], owner: int) -> int:
        """PFXRELEASE: end the leases of ``owner`` among ``lease_ids``; how many ended."""
        return self.store.release(lease_ids, owner)

    def renew(self, lease_id: int, owner: int, ttl_ms: int | None = None) -> bool:
        """PFXRENEW: a new deadline, ``ttl_ms`` (default lease-ttl) from now, for a live lease of ``owner``."""
        return self.store.renew(lease_id, owner, ttl_ms)

    def evict(
        self,
        namespace: bytes,
        *,
        prefix: bytes | None = None,
        pages: int | None = None,
        nbytes: int | None = None,
        keys: bool = False,
    ) -> EvictResult:
        """PFXEVICT: the pages of ``prefix``, ``pages`` pages, ``nbytes`` bytes, or (none given) all.
        ``keys``: ``prefix`` is key pages (HASHES)."""
        if prefix is not None:
            self.store.use_keys(namespace, keys)
            result = self.store.evict_prefix(namespace, prefix)
            if self.tier is not None:
                self.tier.drop_prefix(namespace, prefix)
            return result
        if pages is not None:
            return self.store.evict_pages(namespace, pages)
        if nbytes is not None:
            return self.store.evict_bytes(namespace, nbytes)
        result = self.store.evict_all(namespace)
        if self.tier is not None:
            self.tier.drop_namespace(namespace)
        return result

    async def check(self) -> list[str]:
        """PFXCHECK: every invariant of the store, as a list of violations (empty: consistent).

        A small store is checked here, at once; a larger one (in pages and leases, or in
        blocks) in a forked copy of the daemon (:mod:`.forked_check`), so no check stalls a client."""
        tier = self.tier.check() if self.tier is not None else []
        if checks_inline(self.store.stats()):
            return self.store.check() + tier
        return tier + await check_in_child(self.store, timeout=CHECK_TIMEOUT_S,
                                    on_fork=lambda ms: self.latency_event("fork", ms))

    # -- copies between requests and the arena ----------------------------------------

    async def copy_in(self, blocks: list[int], data: Any) -> None:
        """Copy ``data`` into ``blocks`` of the arena, off the loop when it is large."""
        if len(data) < THREAD_COPY_THRESHOLD:
            self._copy_in_now(blocks, data)
            return
        self.copied_in_bytes += len(data)
        start = time.perf_counter()
        await trio.to_thread.run_sync(self.arena.write, blocks, data)
        self.latency_event("arena-copy", (time.perf_counter() - start) * 1000)

    def _copy_in_now(self, blocks: list[int], data: Any) -> None:
        """:meth:`copy_in` of a small ``data``, on the loop."""
        self.copied_in_bytes += len(data)
        start = time.perf_counter()
        self.arena.write(blocks, data)
        self.latency_event("arena-copy", (time.perf_counter() - start) * 1000)

    async def copy_out(self, blocks: list[int]) -> bytes:
        """The bytes of ``blocks``, concatenated, read off the loop when large."""
        self.copied_out_bytes += len(blocks) * self.arena.block_bytes
        start = time.perf_counter()
        if len(blocks) * self.arena.block_bytes >= THREAD_COPY_THRESHOLD:
            data = await trio.to_thread.run_sync(self.arena.read, blocks)
        else:
            data = self.arena.read(blocks)
        self.latency_event("arena-copy", (time.perf_counter() - start) * 1000)
        return data

    # -- the figures INFO, DBSIZE and PFXINFO read --------------------------------

    def stats(self, namespace: bytes | None = None) -> dict:
        """The store's counters and gauges, global or for one namespace."""
        return self.store.stats(namespace)

    def keyspace_stats(self) -> dict[str, int]:
        """INFO's Redis-named counters (keyspace_hits/misses in tokens, evicted_keys in pages,
        expired_keys in namespaces), counted from the last CONFIG RESETSTAT as Redis counts them.
        The pfxcache_* fields stay cumulative since start, as Prometheus counters are."""
        store = self.store.stats()
        now = {"keyspace_hits": store["hits_tokens"], "keyspace_misses": store["misses_tokens"],
               "evicted_keys": store["evictions"], "expired_keys": self.store.keys.expired}
        return {name: value - self._keyspace_baseline.get(name, 0) for name, value in now.items()}

    def reset_keyspace_stats(self) -> None:
        """CONFIG RESETSTAT: the Redis-named counters start again from zero."""
        self._keyspace_baseline = {}
        self._keyspace_baseline = self.keyspace_stats()

    def namespace_count(self) -> int:
        """Namespaces holding pages: DBSIZE and INFO keyspace's ``keys``."""
        return len(self.store.namespaces())

    def dataset_bytes(self) -> int:
        """Bytes of KV data held in the arena (INFO's ``used_memory_dataset``)."""
        return self.store.stats()["blocks_used"] * self.arena.block_bytes

    def memory_figures(self) -> MemoryFigures:
        """Arena, metadata and process memory (INFO memory, MEMORY STATS, the metrics endpoint)."""
        return self.memory.figures()

    def flush(self) -> None:
        """FLUSHALL / FLUSHDB: drop every unpinned page of every namespace (and every disk page)."""
        self.store.flush()
        if self.tier is not None:
            self.tier.flush()

    def describe(self, namespace: bytes | None = None, visible: Any = None) -> dict:
        """The PFXINFO map: geometry, arena, policy, and global or per-namespace stats.

        ``visible``: for a tenant confined to some namespaces (an ACL user without all keys), the
        predicate its key patterns make. Its keyless PFXINFO then sums only the namespaces it may
        use, and leaves out what would tell it about the others or where the arena lives: free
        blocks, what the policy learned, the arena's name and path (a tenant's worker moves bytes
        over RESP, see docs/operating.md#isolation).
        """
        store = self.store
        if visible is not None:
            # The arena's id (random, per arena) too: a tenant's worker that attached over the
            # unix socket must notice a restarted daemon.
            geometry = ("backend", "id", "block_bytes", "size", "nblocks")
            arena = {k: v for k, v in self.arena.describe().items() if k in geometry}
            return {
                "page-size": store.page_size,
                "block-bytes": self.arena.block_bytes,
                "arena": {**arena, "blocks-total": self.arena.nblocks},
                "policy": store.policy,
                "lease-ttl": store.lease_ttl_ms,
                "stats": store.stats(namespace) if namespace is not None else store.stats_of(visible),
            }
        return {
            "page-size": store.page_size,
            "block-bytes": self.arena.block_bytes,
            "arena": {
                **self.arena.describe(),
                "blocks-total": self.arena.nblocks,
                "blocks-free": store.stats()["blocks_free"],
                **({"partitions": store.partitions()} if store.parts else {}),
            },
            "policy": store.policy,
            "policy-state": {k.replace("_", "-"): v for k, v in store.policy_state().items()},
            "lease-ttl": store.lease_ttl_ms,
            "stats": store.stats(namespace),
            **({"tiers": self.tier.describe(namespace)} if self.tier is not None else {}),
        }

    def _partition_fields(self) -> list[tuple[str, object]]:
        """``arena_partitions`` and one ``arena_partition<n>`` line per partition, shaped like
        INFO keyspace's ``db0:keys=...`` lines (none without partitions)."""
        parts = self.store.partitions()
        if not parts:
            return []
        lines = [(f"arena_partition{n}", f"pattern={p['pattern'].decode('utf-8', 'replace')},first_block="
                  f"{p['first-block']},nblocks={p['nblocks']},free={p['free']},pages={p['pages']}")
                 for n, p in enumerate(parts)]
        return [("arena_partitions", len(parts)), *lines]

    def info_section(self) -> list[tuple[str, object]]:
        """The ``# Pfxcache`` INFO section, fields prefixed as a Redis module's are."""
        stats = self.store.stats()
        fields = [
            ("arena", self.arena.describe().get("backend")),
            ("arena_name", self.arena.describe().get("name", "")),
            ("page_size", stats["page_size"]),
            ("block_bytes", stats["block_bytes"]),
            ("shards", stats["shards"]),
            ("policy", stats["policy"]),
            ("namespaces", stats["namespaces"]),
            ("pages", stats["pages"]),
            ("pinned_pages", stats["pinned_pages"]),
            ("blocks_total", stats["blocks_total"]),
            ("blocks_used", stats["blocks_used"]),
            ("blocks_free", stats["blocks_free"]),
            ("blocks_leased", stats["blocks_leased"]),
            *self._partition_fields(),
            ("hits_tokens", stats["hits_tokens"]),
            ("misses_tokens", stats["misses_tokens"]),
            ("hit_rate", f"{stats['hit_rate']:.4f}"),
            ("evictions", stats["evictions"]),
            *((f"evictions_{cause}", pages) for cause, pages in self.store.evictions_by_cause.items()),
            ("oom_refusals", self.store.oom_refusals),
            ("copied_in_bytes", self.copied_in_bytes),
            ("copied_out_bytes", self.copied_out_bytes),
            ("inserts", stats["inserts"]),
            ("active_leases", stats["leases"]),
            ("ticks", self.ticks),
            *self.store.policy_state().items(),
        ]
        return [(f"pfxcache_{name}", value) for name, value in fields]
