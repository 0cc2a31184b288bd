"""The disk tier under the arena: demotion of evicted pages, promotion on PFXGET, recovery at start.

Two halves, as everywhere a tier meets the store: the *catalog* (store/disk_catalog.py: which
pages the tier holds, in which slot, which go next) runs on the event loop like the store, and
the *files* (tier/files.py: segment files, verified records) do blocking I/O in worker threads.
This module is the glue between them and the store.

Rules:

* **Demotion (write-back).** The store tells :meth:`TierService.demote` of every page the
  eviction policy is about to take out of RAM to make room (pressure, the low watermark, a
  tenant's quota; never PFXEVICT's or FLUSHALL's drops). Pages the tier holds already are clean
  and go; the others are copied once, on the loop, into a bounded queue (``disk-tier-queue``
  bytes; beyond it they are dropped and counted as skipped, never waited for), and the demoter
  task writes the queue in batches from a worker thread. A batch is reserved in the catalog
  (which evicts the tier's own least recently used leaves to make room), written, synced
  (``disk-tier-fsync``), then committed: a page is findable on disk only once it is durable.
* **Write-through** (``disk-tier-write through``): every page PFXSET stores is queued the same
  way when it is stored, so a kill -9 loses only what the queue held. Write-back is the
  fallback in both modes: a page evicted before its write-through copy landed is queued again
  only if it is not queued already.
* **Promotion.** When a prompt's RAM match ends before its last whole page, :meth:`promote`
  computes the idents of the pages after it (store/idents.py) and asks for the leading run the
  tier can supply: on disk, or still in the queue (served from its copy, so a page is never a
  miss for being between RAM and disk). The store's ``match(below=...)`` makes that check on the
  fast path at the cost of one ident, and only when the RAM match is shorter than the prompt.
  A run is read straight into fresh arena blocks of an insert plan
  (``os.preadv`` into the mapped arena: no extra copy; a staging buffer for the CUDA arena),
  each page verified, and the verified leading pages committed: the lookup that follows then
  answers exactly as for a RAM hit, with the same lease, block ids and bytes. The shard's write
  lock is held only to plan; the read runs in a thread without it (insert plans coexist: a page
  another writer stores meanwhile counts as a duplicate at commit). The request waits at most
  ``disk-tier-read-timeout`` ms; a read that is late, fails or does not verify costs a miss on
  those pages, never an error: a late read keeps its plan (its blocks cannot be reused under the
  thread) and commits or aborts when the thread returns. Two requests for the same pages share
  one read.
* **The prefix property across tiers** holds by construction: a lookup walks idents from the
  end of its RAM match and stops at the first page no tier holds, so no page is ever served past
  a hole. A disk record whose parent is in no tier is unreachable (not wrong) until the parent is
  stored again, and the catalog evicts leaves first so the tier keeps whole prefixes.
* **Tenants.** A namespace's disk pages count against its tenant quota, or else its arena
  partition (``PrefixStore.bound_of``), bounded on disk in proportion to their bound in RAM
  (``disk slots x max-pages / arena blocks``): a tenant at its disk bound demotes over its own
  least recently used disk pages, never over another tenant's.
* **Forgetting.** FLUSHALL/FLUSHDB forget the whole tier (the catalog at once; on disk by a
  flush sequence number in the tier's meta file, so no record older than it is loaded again);
  PFXEVICT TOKENS drops the disk subtree of the prefix, PFXEVICT ALL and DEL a namespace's disk
  pages (their record headers zeroed in the background). PFXEVICT PAGES/BYTES free RAM only.
* **Recovery.** At start the files' record headers are scanned in a thread (the tier answers
  misses meanwhile, INFO ``tier_disk_loading:1``) and the catalog rebuilt; payloads are verified
  when read. Nothing found on disk can fail a start: a bad record is a miss and a counter.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any

import trio

from pfxcache.daemon.store.block_hashes import HASH_BYTES, node_hashes, parent_hash
from pfxcache.daemon.store.disk_catalog import DiskCatalog
from pfxcache.daemon.store.errors import StoreError
from pfxcache.daemon.store.idents import IDENT_BYTES, chain, ident_before, namespace_ident, node_idents
from pfxcache.daemon.store.snapshot import fingerprint
from pfxcache.daemon.tier.faults import Faults
from pfxcache.daemon.tier.files import RecordHeader, TierFiles
from pfxcache.daemon.tier.format import MAX_NAMESPACE

log = logging.getLogger("pfxcached")

#: Pages one demoter batch writes at most (one reserve, one write, one sync, one commit).
BATCH_PAGES = 256


class _Queued:
    """A page waiting for the demoter: its identity and a copy of its bytes."""

    __slots__ = ("data", "event", "ident", "namespace", "parent")

    def __init__(self, namespace: bytes, parent: bytes, ident: bytes, data: memoryview, event=None) -> None:
        self.namespace = namespace
        self.parent = parent
        self.ident = ident
        self.data = data
        # KV events on: (parent block hash or None, block hash, tokens) for its BlockStored(DISK).
        self.event = event


class TierService:
    """The disk tier of one daemon (see the module docstring); built by the server's assembly when
    ``disk-tier-size`` is not 0, after the prefix service, and closed before it."""

    def __init__(self, config: Any, prefix: Any) -> None:
        self.config = config
        self.prefix = prefix
        self.store = store = prefix.store
        self.arena = arena = prefix.arena
        self.block_bytes = arena.block_bytes
        self.page_bytes = store.page_bytes
        self.page_size = store.page_size
        self.path = config["disk-tier-path"] or config["dir"]
        stride = -(-self.block_bytes // 4096) * 4096
        nslots = config["disk-tier-size"] // stride
        if nslots < 1:
            raise ValueError(f"disk-tier-size {config['disk-tier-size']} holds no page of {stride} bytes "
                             f"(block-bytes rounded up to 4 KiB)")
        self.files = TierFiles(self.path, nslots=nslots, block_bytes=self.block_bytes,
                               fingerprint=fingerprint(store.page_size, self.block_bytes),
                               fsync=config["disk-tier-fsync"],
                               faults=Faults.parse(os.environ.get("PFXCACHE_TIER_FAULTS")))
        self.catalog = DiskCatalog(nslots, group_of=self._group_of)
        self._bounds: dict[object, int] = {}  # group -> the RAM bound its disk limit was set from
        self.host_views = arena.backend != "cuda"
        self.loading = True
        self.state = "loading"  # ok | loading | failed
        self._queue: deque[_Queued] = deque()
        self._queued: dict[bytes, _Queued] = {}
        self._queue_bytes = 0
        self._writing = 0  # pages of the batch being written (still counted as queued)
        self._wake: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._inflight: dict[bytes, trio.Event] = {}
        self._hashes: dict[bytes, bytes] = {}  # ident -> block hash of disk pages announced stored
        self._present = self._present_ready
        # Counters (INFO # tiers, metrics).
        self.demotions = 0
        self.demotions_skipped = 0
        self.demotions_clean = 0
        self.promotions = 0
        self.promotion_reads = 0
        self.promotions_late = 0
        self.disk_hits = 0  # pages served from disk (promoted)
        self.read_misses = 0  # pages a promotion could not read or verify
        self.disk_evictions = 0
        store.listeners.demote = self.demote
        store.listeners.forget = self.drop_namespace
        if config["disk-tier-write"] == "through":
            store.listeners.stored = self.stored

    # -- life ---------------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Recover the catalog from the files, then demote what the queue receives, until cancelled."""
        self._wake = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await self._recover()
                while True:
                    if not self._queue:
                        self._wake = trio.Event()
                        await self._wake.wait()
                    await self._write_batch()
            finally:
                self._nursery = None

    async def _recover(self) -> None:
        start = time.monotonic()
        headers = await trio.to_thread.run_sync(self.files.scan)
        losers = self.catalog.load(headers)
        if losers:
            await trio.to_thread.run_sync(self.files.clear, losers)
        self.loading = False
        self.state = "ok"
        log.info("Disk tier at %s: %d pages found in %.3f seconds (%d slots)", self.files.directory,
                 self.catalog.pages, time.monotonic() - start, self.files.nslots)

    def close(self) -> None:
        """Write what the queue still holds (the shutdown's last demotions), then close the files."""
        try:
            if self._queue and not self.loading:
                while self._queue:
                    self._write_batch_now()
        except Exception:  # a failing disk at shutdown: the pages were a cache
            log.exception("Disk tier: the last demotions could not be written")
        finally:
            self.store.listeners.demote = None
            self.store.listeners.forget = None
            self.store.listeners.stored = None
            self.files.close()

    def _group_of(self, namespace: bytes) -> object:
        """The tenant quota or arena partition a namespace's disk pages count against (catalog
        groups): bounded on disk in proportion to their bound in RAM, so a tenant cannot fill the
        disk for the others."""
        bound = self.store.bound_of(namespace)
        if bound is None:
            return None
        key, pages = bound
        if self._bounds.get(key) != pages:
            self._bounds[key] = pages
            self.catalog.set_limit(key, max(1, pages * self.files.nslots // self.arena.nblocks))
        return key

    # -- demotion ---------------------------------------------------------------------------

    def demote(self, namespace: bytes, node: Any, k: int) -> None:
        """The last ``k`` pages of ``node`` leave RAM (store listener, on the loop): queue a copy of
        each one the tier does not hold yet."""
        n = len(node.blocks)
        self._enqueue(namespace, node, n - k, n, counted=True)

    def stored(self, namespace: bytes, node: Any, k: int) -> None:
        """Write-through: the last ``k`` pages of ``node`` were just stored (store listener)."""
        n = len(node.blocks)
        self._enqueue(namespace, node, n - k, n, counted=False)

    def _enqueue(self, namespace: bytes, node: Any, lo: int, hi: int, *, counted: bool) -> None:
        if self.state == "failed" or len(namespace) > MAX_NAMESPACE:
            if counted:
                self.demotions_skipped += hi - lo
            return
        idents = node_idents(node)
        catalog, queued = self.catalog, self._queued
        parent = ident_before(node, lo)
        pages: list[tuple[int, bytes, bytes]] = []
        for page in range(lo, hi):
            ident = idents[page * IDENT_BYTES : (page + 1) * IDENT_BYTES]
            if catalog.get(ident) is not None or ident in queued:
                if counted:
                    self.demotions_clean += 1
            else:
                pages.append((page, parent, ident))
            parent = ident
        if not pages:
            return
        need = len(pages) * self.block_bytes
        if self._queue_bytes + need > self.config["disk-tier-queue"]:
            if counted:
                self.demotions_skipped += len(pages)
            return
        blocks = node.blocks
        data = memoryview(self.arena.read([blocks[page] for page, _, _ in pages]))
        bb = self.block_bytes
        hashes = node_hashes(node) if self.store.listeners.events is not None else None
        P = self.page_bytes
        for i, (page, parent, ident) in enumerate(pages):
            event = None
            if hashes is not None:
                before = hashes[(page - 1) * HASH_BYTES : page * HASH_BYTES] if page else parent_hash(node)
                event = (before, hashes[page * HASH_BYTES : (page + 1) * HASH_BYTES], node.key[page * P : (page + 1) * P])
            entry = _Queued(namespace, parent, ident, data[i * bb : (i + 1) * bb], event)
            self._queue.append(entry)
            queued[ident] = entry
        self._queue_bytes += need
        if self._wake is not None:
            self._wake.set()

    def _take_batch(self) -> list[_Queued]:
        batch = []
        queue = self._queue
        while queue and len(batch) < BATCH_PAGES:
            batch.append(queue.popleft())
        return batch

    def _reserve(self, batch: list[_Queued]) -> tuple[list, list]:
        records, evicted = self.catalog.reserve([(q.ident, q.parent, q.namespace) for q in batch])
        self.disk_evictions += len(evicted)
        self._announce_gone(evicted)  # their slots are being reused by this batch: nothing to clear
        headers, payloads, kept = [], [], []
        for q, rec in zip(batch, records):
            if rec is None:
                continue
            headers.append(RecordHeader(rec.ident, rec.parent, rec.namespace, rec.seq, rec.slot))
            payloads.append(q.data)
            kept.append(rec)
        return kept, [headers, payloads]

    def _settle(self, batch: list[_Queued], kept: list, ok: list[bool]) -> None:
        for q in batch:
            if self._queued.get(q.ident) is q:
                del self._queued[q.ident]
            self._queue_bytes -= len(q.data)
        removed = self.catalog.commit(kept, ok)
        self._announce_stored(batch, kept, ok)
        good = sum(ok)
        self.demotions += good
        self.demotions_skipped += len(batch) - good
        if len(kept) != good and self.files.stats().get("last_error"):
            self._note_failure()
        if removed:
            self._clear_later([rec.slot for rec in self._announce_gone(removed)])

    def _announce_stored(self, batch: list[_Queued], kept: list, ok: list[bool]) -> None:
        """KV events: BlockStored(medium DISK) for each page now durable on disk."""
        events = self.store.listeners.events
        if events is None:
            return
        written = {rec.ident for rec, fine in zip(kept, ok) if fine and not rec.dead}
        for q in batch:
            if q.event is not None and q.ident in written:
                before, block_hash, tokens = q.event
                events.blocks_stored(q.namespace, before, block_hash, tokens, "DISK")
                self._hashes[q.ident] = block_hash

    def _announce_gone(self, records: list) -> list:
        """KV events: BlockRemoved(medium DISK) for disk pages that were announced stored; returns
        ``records``. (Pages found on disk at start were never announced: none is sent for them.)"""
        hashes, events = self._hashes, self.store.listeners.events
        for rec in records:
            block_hash = hashes.pop(rec.ident, None)
            if block_hash is not None and events is not None:
                events.blocks_removed(rec.namespace, block_hash, "DISK")
        return records

    async def _write_batch(self) -> None:
        batch = self._take_batch()
        if not batch:
            return
        kept, (headers, payloads) = self._reserve(batch)
        ok: list[bool] = []
        self._writing = len(batch)
        try:
            if kept:
                ok = await trio.to_thread.run_sync(self.files.write, headers, payloads)
        finally:
            self._writing = 0
            if len(ok) != len(kept):
                ok = [False] * len(kept)
            self._settle(batch, kept, ok)

    def _write_batch_now(self) -> None:
        batch = self._take_batch()
        kept, (headers, payloads) = self._reserve(batch)
        ok = self.files.write(headers, payloads) if kept else []
        self._settle(batch, kept, ok)

    def _note_failure(self) -> None:
        error = self.files.stats().get("last_error")
        if self.state == "ok":
            log.warning("Disk tier at %s: a write failed (%s); pages that could not be written are dropped",
                        self.files.directory, error)

    def _clear_later(self, slots: list[int]) -> None:
        """Zero the headers of dropped records in a thread (so they are not found after a restart)."""
        if not slots:
            return
        if self._nursery is None:
            self.files.clear(slots)
            return
        self._nursery.start_soon(trio.to_thread.run_sync, self.files.clear, slots)

    # -- promotion ----------------------------------------------------------------------------

    def _present_ready(self, ident: bytes) -> bool:
        return ident in self._queued or self.catalog.run((ident,)) == 1

    def below(self, ident: bytes) -> bool:
        """Whether the tier can supply the page ``ident`` (on disk, or still queued for it): the
        store's ``match(below=...)`` predicate. False while the tier is loading or empty."""
        if self.loading or not (self.catalog.pages or self._queued):
            return False
        return ident in self._queued or self.catalog.run((ident,)) == 1

    async def promote(self, namespace: bytes, tokens: bytes, lock: Any) -> None:
        """Bring the pages that continue the RAM match of ``tokens`` up from the tier (see the module
        docstring); returns when they are in, or when the wait ran out. Never raises a StoreError."""
        if self.loading or not (self.catalog.pages or self._queued) or self._nursery is None:
            return
        try:  # first without the lock (no await: consistent): most lookups have nothing to bring up
            _, found = self.store.tier_probe(namespace, tokens, self._present)
        except StoreError:
            return
        if not found:
            return
        async with lock.write():
            ram, found = self.store.tier_probe(namespace, tokens, self._present)
            if not found:
                return
            waiting = self._inflight.get(found[0])
            if waiting is None:
                waiting = self._start_read(namespace, tokens, ram, found)
        if waiting is not None:
            with trio.move_on_after(self.config["disk-tier-read-timeout"] / 1000) as scope:
                await waiting.wait()
            if scope.cancelled_caught:
                self.promotions_late += 1

    def _sources(self, found: list[bytes]) -> list:
        """Per page of ``found``, up to the first the tier cannot supply: its queued copy, or its
        disk record, pinned (no eviction or slot reuse under the read)."""
        sources: list = []
        for ident in found:
            queued = self._queued.get(ident)
            if queued is not None:
                sources.append(queued)
                continue
            pinned = self.catalog.pin((ident,))
            if not pinned:
                break
            sources.append(pinned[0])
        return sources

    def _start_read(self, namespace: bytes, tokens: bytes, ram: int, found: list[bytes]) -> trio.Event | None:
        sources = self._sources(found)
        if not sources:
            return None
        end = ram + len(sources)
        try:
            plan = self.store.begin_insert(namespace, tokens[: end * self.page_bytes], offset=ram * self.page_size,
                                           promotion=True)
        except StoreError:  # no room (noeviction, quota, partition): the pages stay a miss
            self._unpin_sources(sources)
            return None
        if plan.start != ram or len(plan.new_blocks) != len(sources):  # cannot happen: same loop step
            self.store.abort_insert(plan)
            self._unpin_sources(sources)
            return None
        done = trio.Event()
        self._inflight[found[0]] = done
        self._nursery.start_soon(self._read, plan, sources, found[0], done)
        return done

    async def _read(self, plan: Any, sources: list, key: bytes, done: trio.Event) -> None:
        ok: list[bool] = []
        try:
            ok = await trio.to_thread.run_sync(self._read_blocks, sources, list(plan.new_blocks))
        finally:
            good = 0
            while good < len(ok) and ok[good]:
                good += 1
            self.promotion_reads += 1
            records = [src for src in sources if not isinstance(src, _Queued)]
            if good < len(sources):
                self.read_misses += len(sources) - good
                failed = [src.ident for src, fine in zip(sources, ok or [False] * len(sources))
                          if not fine and not isinstance(src, _Queued)]
                self._clear_later([r.slot for r in self._announce_gone(self.catalog.remove(failed))])
            try:
                self.store.shorten_insert(plan, plan.start + good)
                if good:
                    self.store.commit_insert(plan)
            finally:
                self.catalog.touch([src for src in sources[:good] if not isinstance(src, _Queued)])
                self._unpin(records)
                self.promotions += good
                self.disk_hits += good
                del self._inflight[key]
                done.set()

    def _read_blocks(self, sources: list, blocks: list[int]) -> list[bool]:
        """Worker thread: each page's bytes into the plan's fresh blocks: a queued page from its copy,
        a disk page read and verified. One ``preadv`` per run of slots; no extra copy into a mapped
        arena, a staging buffer for the CUDA arena."""
        bb = self.block_bytes
        staging = None
        if self.host_views:
            targets = [self.arena.view(b) for b in blocks]
        else:
            staging = memoryview(bytearray(len(blocks) * bb))
            targets = [staging[i * bb : (i + 1) * bb] for i in range(len(blocks))]
        try:
            ok = [False] * len(sources)
            on_disk = [i for i, src in enumerate(sources) if not isinstance(src, _Queued)]
            for i, src in enumerate(sources):
                if isinstance(src, _Queued):
                    targets[i][:] = src.data
                    ok[i] = True
            if on_disk:
                headers = [RecordHeader(r.ident, r.parent, r.namespace, r.seq, r.slot)
                           for r in (sources[i] for i in on_disk)]
                for i, fine in zip(on_disk, self.files.read(headers, [targets[i] for i in on_disk])):
                    ok[i] = fine
            if staging is not None:
                good = 0
                while good < len(ok) and ok[good]:
                    good += 1
                if good:
                    self.arena.write(blocks[:good], staging[: good * bb])
            return ok
        finally:
            if staging is None:
                for view in targets:
                    view.release()

    def _unpin_sources(self, sources: list) -> None:
        self._unpin([src for src in sources if not isinstance(src, _Queued)])

    def _unpin(self, records: list) -> None:
        removed = self.catalog.unpin(records)
        if removed:
            self._clear_later([r.slot for r in self._announce_gone(removed)])

    # -- forgetting ----------------------------------------------------------------------------

    def _drop_queued(self, keep) -> None:
        kept = deque(q for q in self._queue if keep(q))
        for q in self._queue:
            if not keep(q):
                self._queued.pop(q.ident, None)
                self._queue_bytes -= len(q.data)
        self._queue = kept

    def flush(self) -> int:
        """FLUSHALL/FLUSHDB: forget every disk page, durably (the meta file's flush sequence)."""
        self._drop_queued(lambda q: False)
        removed = self.catalog.flush()
        self._hashes.clear()  # FLUSHALL's AllBlocksCleared covers every medium
        self.files.set_flush_seq(self.catalog.next_seq - 1)
        return len(removed)

    def drop_namespace(self, namespace: bytes) -> int:
        """PFXEVICT ALL, DEL, an expired namespace: its disk pages go."""
        self._drop_queued(lambda q: q.namespace != namespace)
        removed = self._announce_gone(self.catalog.drop_namespace(namespace))
        self._clear_later([r.slot for r in removed])
        return len(removed)

    def drop_prefix(self, namespace: bytes, tokens: bytes) -> int:
        """PFXEVICT TOKENS: the disk pages at and below the prefix's last whole page go."""
        npages = len(tokens) // self.page_bytes
        if not npages:
            return 0
        self._drop_queued(lambda q: q.namespace != namespace)
        packed = chain(namespace_ident(namespace), tokens[: npages * self.page_bytes], self.page_bytes)
        removed = self._announce_gone(self.catalog.drop_subtree(packed[-IDENT_BYTES:]))
        self._clear_later([r.slot for r in removed])
        return len(removed)

    # -- figures ------------------------------------------------------------------------------

    def info(self) -> list[tuple[str, object]]:
        """INFO's ``# tiers`` fields of the disk tier."""
        files = self.files.stats()
        catalog = self.catalog
        read_s, write_s = files["read_seconds"], files["write_seconds"]
        return [
            ("tier_disk_enabled", 1),
            ("tier_disk_state", self.state),
            ("tier_disk_loading", int(self.loading)),
            ("tier_disk_path", self.files.directory),
            ("tier_disk_write", self.config["disk-tier-write"]),
            ("tier_disk_slots", self.files.nslots),
            ("tier_disk_pages", catalog.pages),
            ("tier_disk_bytes", catalog.pages * self.block_bytes),
            ("tier_disk_capacity_bytes", self.files.nslots * self.block_bytes),
            ("tier_disk_hits", self.disk_hits),
            ("tier_disk_promotions", self.promotions),
            ("tier_disk_promotions_late", self.promotions_late),
            ("tier_disk_demotions", self.demotions),
            ("tier_disk_demotions_clean", self.demotions_clean),
            ("tier_disk_demotions_skipped", self.demotions_skipped),
            ("tier_disk_evictions", self.disk_evictions),
            ("tier_disk_queue_pages", len(self._queue) + self._writing),
            ("tier_disk_queue_bytes", self._queue_bytes),
            ("tier_disk_read_misses", self.read_misses),
            ("tier_disk_verify_failures", files["verify_failures"]),
            ("tier_disk_io_errors", files["io_errors"]),
            ("tier_disk_read_bytes", files["read_bytes"]),
            ("tier_disk_write_bytes", files["write_bytes"]),
            ("tier_disk_read_bytes_per_sec", int(files["read_bytes"] / read_s) if read_s else 0),
            ("tier_disk_write_bytes_per_sec", int(files["write_bytes"] / write_s) if write_s else 0),
        ]

    def describe(self, namespace: bytes | None = None) -> dict:
        """PFXINFO's ``tiers`` map: the disk tier's figures (one namespace's pages with ``namespace``)."""
        fields = {name.removeprefix("tier_disk_").replace("_", "-"): value for name, value in self.info()
                  if name not in ("tier_disk_enabled", "tier_disk_path")}
        if namespace is not None:
            fields["namespace-pages"] = self.catalog.by_namespace(namespace)
        return {"disk": fields}

    def check(self) -> list[str]:
        """PFXCHECK: the catalog's invariants."""
        return [f"disk tier: {problem}" for problem in self.catalog.check()]
