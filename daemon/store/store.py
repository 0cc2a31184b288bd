"""PrefixStore: the facade the daemon maps RESP commands onto.

Plain synchronous data structures: the store is NOT thread safe and every
method must be called from one thread (the daemon's event loop). Only the
arena's bytes may be touched from other threads or processes, and only those
of blocks pinned for the toucher (an insert plan's new blocks, a lease's
blocks).

Shards: a namespace has one radix tree per shard; the shard of a sequence is
a stable hash of (namespace, first page), so a sequence and all its prefixes
live in one tree. ``shard_of`` tells the daemon which reader-writer lock to
take; the store itself has no locks.

Every method validates its arguments before changing anything: when it raises
a StoreError, the store is as it was (splitting an edge in two is the only
change a refused call may leave behind, and it changes no content).
"""

from __future__ import annotations

import itertools
import math
import time
import zlib
from array import array

from .allocator import LEASED, TREE, BlockAllocator
from .arguments import TOKEN_BYTES, integer, namespace_name, packed_tokens, page_span
from .errors import BadRequest, NoPrefix, OutOfMemory
from .events import StoreEvents, announce_drop, announce_stored, announce_trim, check_hashes
from .evictions import EvictionCommands
from .figures import StoreFigures
from .inserts import InsertPlan
from .invariants import check_store
from .keyspace import NamespaceKeys
from .leases import ALLOC, READ, Lease, LeaseTable
from .namespaces import Namespace
from .policies import EvictionIndex
from .radix import Node, RadixTree, Totals
from .registry import POLICIES
from .partitions import StorePartitions
from .quotas import QuotaBook, StoreQuotas
from .results import AllocResult, EvictResult, InsertResult, MatchResult

# Why pages were evicted: room for an insert or allocation, the background low-watermark task,
# a command (PFXEVICT, DEL), FLUSHALL/FLUSHDB.
EVICTION_CAUSES = ("pressure", "watermark", "command", "flush", "quota")


class PrefixStore(StoreFigures, EvictionCommands, StoreQuotas, StorePartitions):
    """Longest-prefix KV-cache store over an arena of blocks; see the module docstring."""

    def __init__(self, arena, *, page_size: int = 16, shards: int = 16, policy: str = "guard",
                 lease_ttl_ms: int = 30000, clock=time.monotonic, max_alloc: int | None = None,
                 fence_expired: bool = False, quotas: QuotaBook | None = None,
                 max_leases_per_owner: int = 0, partitions=(), partition_match=None,
                 partition_align: int = 1) -> None:
        if not isinstance(page_size, int) or page_size < 1:
            raise BadRequest("page_size must be a positive integer")
        if not isinstance(shards, int) or shards < 1:
            raise BadRequest("shards must be a positive integer")
        if policy not in POLICIES:
            raise BadRequest(f"unknown eviction policy {policy!r} (known: {', '.join(POLICIES)})")
        if not isinstance(lease_ttl_ms, int) or lease_ttl_ms < 0:
            raise BadRequest("lease_ttl_ms must be an integer >= 0")
        self.arena = arena
        self.page_size = page_size
        self.page_bytes = page_size * TOKEN_BYTES
        self.block_bytes = arena.block_bytes
        self.nblocks = arena.nblocks
        self.shards = shards
        self.lease_ttl_ms = lease_ttl_ms
        self.max_alloc = max_alloc if max_alloc is not None else arena.nblocks
        # True in the daemon, where every owner is a live connection whose worker may still touch
        # its blocks: expiry fences leases instead of ending them (see leases.py).
        self.fence_expired = fence_expired
        self.quotas = quotas or QuotaBook()  # per-tenant limits (quotas.py); none by default
        self.max_leases_per_owner = max_leases_per_owner  # 0: no limit (client-lease-limit)
        self._clock = clock
        self._alloc = BlockAllocator(arena.nblocks)
        self._index = EvictionIndex(POLICIES[policy], capacity=arena.nblocks, page_bytes=self.page_bytes)
        self._totals = Totals()
        self._set_partitions(partitions, partition_match, align=partition_align, make_index=lambda capacity:
                             EvictionIndex(POLICIES[policy], capacity=capacity, page_bytes=self.page_bytes))
        self._ns: dict[bytes, Namespace] = {}
        self._leases = LeaseTable()
        self._leased_by: dict[int, int] = {}  # block -> id of the ALLOC lease holding it
        self._plans: dict[int, InsertPlan] = {}
        # Counters of namespaces that no longer exist (emptied by EVICT ALL or
        # FLUSHALL) or never did (a PFXGET of an unknown key): kept so the
        # global counters still add up, without keeping a record per name.
        self._retired = Namespace(b"")
        self._plan_ids = itertools.count(1)
        #: False under maxmemory-policy noeviction: a full arena refuses writes (-OOM) instead of
        #: evicting; PFXEVICT still evicts by the policy in force.
        self.evicting = True
        self.namespace_epoch = 0  # changes whenever a namespace appears or goes (SCAN's order cache)
        self.keys = NamespaceKeys(self)
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.evictions_by_cause = dict.fromkeys(EVICTION_CAUSES, 0)  # pages; sums to evictions
        # Inserts and allocations refused with OutOfMemory: a count of requests, not state,
        # so stats() (which a refused call must leave as it was) does not show it.
        self.oom_refusals = 0
        self.inserts = 0
        self.stored = 0
        self._events: StoreEvents | None = None  # KV events listener (events.py); None: events off
        #: Called with a namespace's name when a page enters or leaves it, or its expiry changes
        #: (what WATCH watches); None: nobody watches (the daemon sets it only while someone does).
        self.touched = None

    # -- KV events ------------------------------------------------------------------------------

    @property
    def events(self) -> StoreEvents | None:
        """The listener told of every page stored and removed (None: none)."""
        return self._events

    def set_events(self, sink: StoreEvents | None) -> None:
        """Set (or with None remove) the KV events listener; it hears only of changes from now on."""
        self._events = sink  # WATCH's ``touched`` is apart: changing the listener leaves it alone

    # -- argument handling ----------------------------------------------------------------------

    def _deadline(self, ttl_ms) -> float:
        ttl = self.lease_ttl_ms if ttl_ms is None else integer(ttl_ms, "the lease TTL (ms)", 0)
        return math.inf if ttl == 0 else self._clock() + ttl / 1000.0

    def _pages_from(self, tokens: bytes, offset) -> tuple[int, int]:
        return page_span(tokens, offset, self.page_size)

    # -- small helpers --------------------------------------------------------------------------

    def shard_of(self, ns, tokens) -> int:
        """The shard holding ``tokens`` in ``ns``: stable hash of (namespace, first page) mod shards."""
        return self._shard(namespace_name(ns), packed_tokens(tokens))

    def _shard(self, name: bytes, tokens: bytes) -> int:
        if self.shards == 1:
            return 0
        return zlib.crc32(tokens[: self.page_bytes], zlib.crc32(name)) % self.shards

    def data_size(self, tokens, offset: int = 0) -> int:
        """Bytes of DATA an insert of ``tokens`` from ``offset`` must carry (whole pages x block_bytes)."""
        npages, off = self._pages_from(packed_tokens(tokens), offset)
        return (npages - off) * self.block_bytes

    def _tree(self, rec: Namespace, shard: int) -> RadixTree:
        tree = rec.trees.get(shard)
        if tree is None:
            part = rec.part
            tree = rec.trees[shard] = RadixTree(self.page_bytes, self._index if part is None else part.index,
                                                self._totals if part is None else part.totals, rec.name, shard)
        return tree

    def _namespace(self, name: bytes) -> Namespace:
        rec = self._ns.get(name)
        if rec is not None and rec.expires_at is not None and self.keys.live(name) is None:
            rec = None  # it expired just now
        if rec is None:
            rec = self._ns[name] = Namespace(name)
            if self.quotas:
                rec.quota = self.quotas.of(name)
            if self.parts:
                rec.part = self._part_of(name)
            self.namespace_epoch += 1
        return rec

    def _fits(self, n: int, pin_cost: int = 0, part=None) -> bool:
        """Whether ``n`` blocks can be had, freeing some by eviction; within ``part`` when there are
        partitions (the namespace's: a full one makes room with its own pages only)."""
        alloc, totals = (self._alloc, self._totals) if part is None else (part.alloc, part.totals)
        if not self.evicting:  # noeviction: only free blocks count
            return alloc.free_count >= n
        return alloc.free_count + totals.unpinned - pin_cost >= n

    def _oom(self, n: int, part=None) -> OutOfMemory:
        self.oom_refusals += 1
        alloc, t = (self._alloc, self._totals) if part is None else (part.alloc, part.totals)
        where = "" if part is None else f" in arena partition '{part.name}'"
        if not self.evicting:
            return OutOfMemory(f"cannot allocate {n} blocks{where}: {alloc.free_count} free and "
                               f"maxmemory-policy is noeviction")
        return OutOfMemory(f"cannot allocate {n} blocks{where}: {alloc.free_count} free, {t.unpinned} evictable, "
                           f"{t.pages - t.unpinned} cached pages pinned, {alloc.count(LEASED)} leased")

    @staticmethod
    def _pin_cost(node: Node, child: Node | None, extra: int) -> int:
        """Unpinned pages that pinning this match would take away from the evictable pool."""
        cost = extra if child is not None and child.lock_ref == 0 else 0
        while node.parent is not None and node.lock_ref == 0:  # pinned nodes have pinned ancestors
            cost += len(node.blocks)
            node = node.parent
        return cost

    def _reserve(self, n: int, part=None) -> list[int]:
        """Evict just enough, then take n blocks into state LEASED (the caller checked _fits);
        from ``part`` and with its own pages when there are partitions."""
        alloc = self._alloc if part is None else part.alloc
        short = n - alloc.free_count
        if short > 0:
            self._evict(short, None, "pressure", part)
        return alloc.take(n, LEASED)

    def _evict(self, n: int, scope: bytes | None, cause: str, part=None) -> int:
        """Evict up to n pages chosen by the policy (globally, in one partition, or in one
        namespace); O(k log n)."""
        now = self._clock()
        if part is None and scope is not None and self.parts:
            scoped = self._ns.get(scope)
            part = scoped.part if scoped is not None else None
        victim = (self._index if part is None else part.index).victims(scope)
        events, touched, records = self._events, self.touched, self._ns
        evicted = 0
        freed = array("q")  # the nodes' own arrays, joined at C speed: no Python int per page
        tree = rec = None
        owed = 0  # pages evicted from rec's namespace not yet counted there
        while evicted < n:
            node = victim(now)
            if node is None:
                break
            # Trailing pages of one leaf in one go: the node keeps its priority while it shrinks,
            # so this is the same as evicting them one page at a time.
            k = n - evicted
            if k > len(node.blocks):
                k = len(node.blocks)
            if node.tree is not tree:
                tree = node.tree
                if rec is None or rec.name != tree.scope:
                    if owed:
                        self._count_evicted(rec, owed)
                        owed = 0
                    rec = records[tree.scope]
                    if touched is not None:
                        touched(tree.scope)
            if events is not None:
                announce_trim(events, node, k)
            freed.extend(tree.trim(node, k))
            owed += k
            evicted += k
            if not tree.pages:
                self._count_evicted(rec, owed)
                owed = 0
                self._retire_if_empty(rec)
                tree = rec = None  # they may be gone
        if owed:
            self._count_evicted(rec, owed)
        self._alloc.release(freed)  # every evicted block in one call: runs and scatters, not pages
        self.evictions += evicted
        self.evictions_by_cause[cause] += evicted
        return evicted

    @staticmethod
    def _count_evicted(rec: Namespace, pages: int) -> None:
        rec.evictions += pages
        if rec.quota is not None:
            rec.quota.pages -= pages

    def _drop(self, tree: RadixTree, top: Node, cause: str = "command") -> tuple[int, int]:
        if self._events is not None:
            announce_drop(self._events, tree, top)
        freed, pinned = tree.drop_subtree(top)
        self._alloc.release(freed)
        if freed and self.touched is not None:
            self.touched(tree.scope)
        rec = self._ns[tree.scope]
        rec.evictions += len(freed)
        if rec.quota is not None:
            rec.quota.pages -= len(freed)
        self.evictions += len(freed)
        self.evictions_by_cause[cause] += len(freed)
        return len(freed), pinned

    def _result(self, evicted: int, pinned: int) -> EvictResult:
        return EvictResult(evicted, evicted * self.block_bytes, pinned)

    # -- reads ----------------------------------------------------------------------------------

    def match(self, ns, tokens, *, lease: bool = True, ttl_ms: int | None = None, owner: int = 0,
              transient: bool = False) -> MatchResult:
        """Longest cached whole-page prefix of ``tokens`` in ``ns``.

        Counts hits/misses in tokens, touches the matched path (time and
        frequency), and with ``lease`` pins it under a READ lease of ``owner``.
        Cost: O(len(tokens)) bytes compared at C speed, O(path nodes) Python steps.
        ``transient``: the lease only pins the pages while the daemon copies them out (a
        WITHDATA NOLEASE lookup): it is not held to client-lease-limit or the quotas.
        """
        name = namespace_name(ns)
        tokens = packed_tokens(tokens)
        deadline = self._deadline(ttl_ms) if lease else math.inf
        npages = len(tokens) // self.page_bytes
        # A lookup never creates a namespace: unknown keys cost no memory.
        rec = self._ns.get(name, self._retired)
        if rec.expires_at is not None and self.keys.live(name) is None:
            rec = self._retired
        if rec is not self._retired:
            self.keys.record_access(rec)
        pages = 0
        blocks: list[int] = []
        lease_id = 0
        tree = rec.trees.get(self._shard(name, tokens)) if npages else None
        node = None
        if tree is not None:
            node, pages = tree.locate(tokens, npages)  # split so a pin covers exactly the match
            if pages and lease and not transient:
                self._may_lease(owner, rec.quota, pages)  # refused: nothing but the split changed
            if pages:
                self._totals.ticks += 1
                if lease:
                    # Pin before touching: the leased path leaves the eviction index once
                    # and re-enters it (with its new priority) when the lease ends.
                    tree.pin(node)
                tree.touch(node, self._clock(), hit=True)
                blocks = tree.path_blocks(node, cache=True)
                if lease:
                    lease_id = self._leases.new(owner, READ, name, deadline, node, list(blocks)).id
                    rec.leases += 1
                    if rec.quota is not None:
                        rec.quota.leases += 1
                        rec.quota.leased += len(blocks)
        if npages:
            index = self._index if not self.parts else (rec.part or self._part_of(name)).index
            index.looked_up(name, tokens, npages, pages, node, lease_id)
        matched = pages * self.page_size
        missed = len(tokens) // TOKEN_BYTES - matched
        rec.hits += matched
        rec.misses += missed
        self.hits += matched
        self.misses += missed
        return MatchResult(matched, lease_id, blocks)

    def cached_tokens(self, ns, tokens) -> int:
        """Tokens of the longest cached whole-page prefix, without touching, counting or leasing anything."""
        name = namespace_name(ns)
        tokens = packed_tokens(tokens)
        npages = len(tokens) // self.page_bytes
        rec = self._ns.get(name)
        tree = rec.trees.get(self._shard(name, tokens)) if rec is not None and npages else None
        if tree is None:
            return 0
        _, pages, _, extra = tree.walk(tokens, npages)
        return (pages + extra) * self.page_size

    # -- writes ---------------------------------------------------------------------------------

    def _given_blocks(self, blocks, count: int, owner: int) -> list[tuple[int, Lease]]:
        try:
            blocks = list(blocks)
        except TypeError:
            raise BadRequest("blocks must be a sequence of block ids") from None
        if len(blocks) != count:
            raise BadRequest(f"{len(blocks)} block ids given for {count} pages")
        seen = set()
        out = []
        for b in blocks:
            integer(b, "a block id", 0, self.nblocks - 1)
            if b in seen:
                raise BadRequest(f"block {b} given twice")
            seen.add(b)
            lease = self._leases.find(self._leased_by.get(b, 0))
            if lease is None or lease.owner != owner:
                raise BadRequest(f"block {b} is not held by an allocation lease of this connection")
            if lease.fenced:
                raise BadRequest(f"the allocation lease of block {b} expired: its TTL passed before the commit "
                                 f"(release it, allocate again)")
            out.append((b, lease))
        return out

    def begin_insert(self, ns, tokens, *, offset: int = 0, owner: int = 0, blocks=None) -> InsertPlan:
        """Phase one of an insert of the whole pages of ``tokens`` (pages before ``offset`` must be cached).

        Pins the cached prefix and, in DATA mode (blocks=None), allocates blocks
        for the new pages, evicting just enough. In BLOCKS mode ``blocks`` gives
        one id per page from the offset, each held by an ALLOC lease of
        ``owner``; they move from the lease into the plan. Raises NoPrefix,
        OutOfMemory or BadRequest with nothing changed.
        """
        name = namespace_name(ns)
        tokens = packed_tokens(tokens)
        npages, off = self._pages_from(tokens, offset)
        owner = integer(owner, "the owner", 0)
        given = self._given_blocks(blocks, npages - off, owner) if blocks is not None else None
        shard = self._shard(name, tokens)
        rec = self._ns.get(name)
        if rec is not None and rec.expires_at is not None:
            rec = self.keys.live(name)
        tree = rec.trees.get(shard) if rec is not None else None
        if tree is not None:
            node, pages, child, extra = tree.walk(tokens, npages)
        else:
            node, pages, child, extra = None, 0, None, 0
        cached = pages + extra
        if cached < off:
            raise NoPrefix(f"the first {off * self.page_size} tokens (the offset) are not cached: "
                           f"only {cached * self.page_size} are")
        new = npages - cached
        quota = rec.quota if rec is not None else (self.quotas.of(name) if self.quotas else None)
        part = rec.part if rec is not None else self._part_of(name)
        if given is not None and part is not None:
            self._given_in(part, given)
        over = quota.pages_over(new) if quota is not None else 0
        if over:
            # The tenant's own pages make room, never the prefix this insert extends (pinned below
            # before anything is evicted); refused here, with nothing changed, if they cannot.
            cost = self._pin_cost(node, child, extra) if node is not None and rec.quota is quota else 0
            if self._quota_evictable(quota) - cost < over:
                raise quota.refuse_pages(new)
        if given is None and new:
            cost = self._pin_cost(node, child, extra) if node is not None else 0
            if not self._fits(new, cost, part) and self.expire():
                cost = self._pin_cost(node, child, extra) if node is not None else 0
            if not self._fits(new, cost, part):
                raise self._oom(new, part)
        # Validated: from here on nothing can fail.
        tree = self._tree(self._namespace(name), shard)
        if node is None:
            node = tree.root
        elif child is not None:
            node = tree.split(child, extra)
        tree.pin(node)
        plan = InsertPlan(next(self._plan_ids), name, shard, owner, tree, node, tokens, npages, off, cached,
                          self.block_bytes)
        # Registered before allocating: the evictions _reserve may cause must see the plan,
        # or they could retire this (still empty) namespace under it.
        self._plans[plan.id] = plan
        if over:
            self._evict_in_quota(quota, name, over)
        if given is None:
            plan.new_blocks = self._reserve(new, part)
        else:
            for b, lease in given:
                del lease.blocks[b]
                del self._leased_by[b]
                self._leased_changed(lease, -1)
            ids = [b for b, _ in given]
            plan.sources = [lease.id for _, lease in given]
            plan.dup_blocks = ids[: cached - off]
            plan.new_blocks = ids[cached - off :]
        if quota is not None:
            quota.pages += len(plan.new_blocks)  # reserved now, settled at commit or abort
        return plan

    def commit_insert(self, plan: InsertPlan) -> InsertResult:
        """Phase two: link the new pages into the tree and unpin the prefix.

        Pages some other insert cached since begin_insert count as existing and
        the plan's blocks for them go back to the free list.
        """
        if self._plans.get(plan.id) is not plan:
            raise BadRequest("this insert has already been committed or aborted")
        del self._plans[plan.id]
        plan.done = True
        tree = plan.tree
        P = self.page_bytes
        now = self._clock()
        self._totals.ticks += 1
        end = plan.node
        stored = 0
        if plan.new_blocks:
            node, reached, child, extra = tree.walk(plan.tokens, plan.npages, plan.node, plan.start)
            if child is not None:
                node = tree.split(child, extra)
                reached += extra
            dups = reached - plan.start
            if dups:
                self._alloc.release(plan.new_blocks[:dups])
            end = node
            if reached < plan.npages:
                fresh = plan.new_blocks[dups:]
                self._alloc.move(fresh, LEASED, TREE)
                end = tree.add_leaf(node, plan.tokens[reached * P : plan.npages * P], array("q", fresh), now)
                stored = len(fresh)
                if self._events is not None:
                    announce_stored(self._events, end)
        if plan.dup_blocks:
            self._alloc.release(plan.dup_blocks)
        tree.unpin(plan.node)
        tree.touch(end, now, hit=False)
        tree.index.stored(plan.ns, plan.tokens, plan.npages)
        rec = self._ns[plan.ns]
        rec.inserts += 1
        rec.stored += stored
        if rec.quota is not None:
            rec.quota.pages -= len(plan.new_blocks) - stored  # the reservation, less what was stored
        if stored and self.touched is not None:
            self.touched(plan.ns)
        self.inserts += 1
        self.stored += stored
        result = InsertResult(stored, plan.npages - plan.offset_pages - stored, tree.path_blocks(end))
        if rec.deleted:  # DEL'd during the insert: nobody may see these pages
            self._sweep_deleted(rec)
        else:
            self.keys.record_access(rec)
        self._retire_if_empty(rec)  # an insert of no whole page leaves no key behind
        return result

    def abort_insert(self, plan: InsertPlan) -> None:
        """Undo begin_insert: unpin, free DATA-mode blocks, give BLOCKS-mode blocks back to their leases
        (or free them when the lease has ended). Idempotent."""
        if self._plans.get(plan.id) is not plan:
            return
        del self._plans[plan.id]
        plan.done = True
        rec = self._ns.get(plan.ns)
        if rec is not None and rec.quota is not None:
            rec.quota.pages -= len(plan.new_blocks)
        if plan.sources is None:
            self._alloc.release(plan.new_blocks)
        else:
            orphans = []
            for b, lease_id in zip(plan.dup_blocks + plan.new_blocks, plan.sources):
                lease = self._leases.get(lease_id)
                if lease is None:
                    orphans.append(b)
                else:
                    lease.blocks[b] = None
                    self._leased_by[b] = lease_id
                    self._leased_changed(lease, 1)
            self._alloc.release(orphans)
        plan.tree.unpin(plan.node)
        rec = self._ns.get(plan.ns)
        if rec is not None:
            if rec.deleted:
                self._sweep_deleted(rec)
            self._retire_if_empty(rec)

    def insert(self, ns, tokens, *, offset: int = 0, data=None, blocks=None, owner: int = 0) -> InsertResult:
        """begin_insert + arena.write + commit_insert in one call.

        DATA (blocks=None) must be exactly data_size(tokens, offset) bytes;
        data=None skips the copy (the pages then hold whatever their blocks held).
        """
        if data is not None:
            if blocks is not None:
                raise BadRequest("give either DATA or BLOCKS, not both")
            want = self.data_size(tokens, offset)
            if len(memoryview(data).cast("B")) != want:
                raise BadRequest(f"DATA is {len(memoryview(data).cast('B'))} bytes, expected {want} "
                                 f"(pages from the offset x {self.block_bytes})")
        plan = self.begin_insert(ns, tokens, offset=offset, owner=owner, blocks=blocks)
        try:
            if data is not None and plan.copy_needed:
                self.arena.write(plan.new_blocks, plan.new_data(data))
        except BaseException:
            self.abort_insert(plan)
            raise
        return self.commit_insert(plan)

    def alloc(self, ns, n: int, *, ttl_ms: int | None = None, owner: int = 0) -> AllocResult:
        """Fresh blocks for a writer under an ALLOC lease (evicting if needed; OutOfMemory if impossible)."""
        name = namespace_name(ns)
        n = integer(n, "the block count", 1, self.max_alloc)
        owner = integer(owner, "the owner", 0)
        deadline = self._deadline(ttl_ms)
        rec = self._ns.get(name)
        quota = rec.quota if rec is not None else (self.quotas.of(name) if self.quotas else None)
        self._may_lease(owner, quota, n)
        part = rec.part if rec is not None else self._part_of(name)
        if not self._fits(n, 0, part):
            self.expire()
            if not self._fits(n, 0, part):
                raise self._oom(n, part)
        blocks = self._reserve(n, part)  # first: its evictions may retire this namespace if it is empty
        # The writer may commit blocks it never wrote: they must not show their last owner's bytes.
        self.arena.zero(blocks)
        rec = self._namespace(name)
        lease = self._leases.new(owner, ALLOC, name, deadline, None, dict.fromkeys(blocks))
        for b in blocks:
            self._leased_by[b] = lease.id
        rec.leases += 1
        if rec.quota is not None:
            rec.quota.leases += 1
            rec.quota.leased += n
        return AllocResult(lease.id, blocks)

    # -- leases ---------------------------------------------------------------------------------

    def _end(self, lease: Lease) -> None:
        self._leases.remove(lease)
        rec = self._ns[lease.scope]
        rec.leases -= 1
        if rec.quota is not None:
            rec.quota.leases -= 1
            rec.quota.leased -= len(lease.blocks)
        if lease.kind == READ:
            lease.node.tree.unpin(lease.node)
            lease.node.tree.index.released(lease.id)  # (guard's miniatures held their hits under it too)
        else:
            freed = list(lease.blocks)
            for b in freed:
                del self._leased_by[b]
            self._alloc.release(freed)
        if rec.deleted:
            self._sweep_deleted(rec)
        self._retire_if_empty(rec)

    def _sweep_deleted(self, rec: Namespace) -> None:
        """Free the pages of a deleted namespace that no lease pins any more."""
        for tree in rec.trees.values():
            if tree.unpinned:
                self._drop(tree, tree.root)

    def renew(self, lease_id: int, owner: int, ttl_ms: int | None = None) -> bool:
        """Give a lease of ``owner`` a new deadline, ``ttl_ms`` from now (None: lease-ttl, 0: none).

        The daemon takes the pin that protects a WITHDATA copy with no deadline,
        so expiry cannot free blocks mid-copy, and sets the lease's real
        deadline once the copy is done. False when the lease is gone.
        """
        lease = self._leases.get(lease_id)
        if lease is None or lease.owner != owner:
            return False
        self._leases.set_deadline(lease, self._deadline(ttl_ms))
        return True

    def release(self, lease_ids, owner: int) -> int:
        """End the given leases of ``owner``; returns how many were live (others', unknown and fenced
        ids count 0: a fenced lease's blocks go back now, but its holder must learn it was too late)."""
        if isinstance(lease_ids, int):
            lease_ids = [lease_ids]
        count = 0
        for lease_id in lease_ids:
            lease = self._leases.find(lease_id) if isinstance(lease_id, int) else None
            if lease is not None and lease.owner == owner:
                count += not lease.fenced
                self._end(lease)
        return count

    def release_owner(self, owner: int, limit: int | None = None) -> int:
        """End the leases of ``owner`` (its connection closed), fenced ones too; returns how many.

        ``limit``: end at most that many (the daemon releases a huge table in slices so that
        other clients are served in between); call again until it returns less than ``limit``.
        """
        leases = self._leases.of_owner(owner, limit)
        for lease in leases:
            self._end(lease)
        return len(leases)

    def holds_leases(self, owner: int) -> bool:
        """Whether ``owner`` holds any lease, fenced ones included."""
        return self._leases.owns(owner)

    def expire(self) -> int:
        """End (or, with fence_expired, fence) every lease past its deadline; O(log n) per lease.
        Returns how many."""
        due = self._leases.due(self._clock())
        for lease in due:
            if self.fence_expired:
                self._leases.fence(lease)
            else:
                self._end(lease)
        return len(due)

    def next_expiry(self) -> float:
        """Clock time of the earliest lease deadline (inf if none): when the daemon should call expire()."""
        return self._leases.next_deadline()

    def _retire_if_empty(self, rec: Namespace) -> None:
        """Forget a namespace that holds no page, lease or insert in flight (its counters stay in the totals)."""
        if rec.holds_anything:
            return
        if self._ns.get(rec.name) is not rec or any(plan.ns == rec.name for plan in self._plans.values()):
            return
        self._retired.absorb(rec)
        del self._ns[rec.name]
        self._index_of(rec).forget_scope(rec.name)
        self.namespace_epoch += 1

    # -- policy ---------------------------------------------------------------------------------

    @property
    def policy(self) -> str:
        """The name of the eviction policy in force."""
        return self._index.policy

    def set_policy(self, name: str) -> None:
        """Switch the eviction policy at runtime (rebuilds the candidate index: O(n log n) once)."""
        if name not in POLICIES:
            raise BadRequest(f"unknown eviction policy {name!r} (known: {', '.join(POLICIES)})")
        for index, candidates in self._candidates_by_index():  # one index per arena partition
            index.rebuild(POLICIES[name], candidates)

    def policy_state(self) -> dict:
        """What the eviction policy has learned (empty unless it learns: see reuse.ReusePolicy.describe)."""
        return self._index.describe()

    # -- invariants ------------------------------------------------------------------------------

    def check(self) -> list[str]:
        """Verify every invariant; returns the violations (empty: consistent). O(n + nblocks)."""
        problems = check_store(self)
        if self._events is not None:  # cached block hashes are only kept up to date for a listener
            for rec in self._ns.values():
                for tree in rec.trees.values():
                    problems += check_hashes(tree)
        return problems
