"""Eviction: making room for writes, and PFXEVICT's forms, FLUSHALL and the low-watermark sweep.

The :class:`Evictor` takes pages out of the trees in two ways: by the policy (``evict``: the
victims an eviction index orders, trailing pages of a leaf first, globally, in one arena
partition or in one namespace) and by position (``drop``: a subtree, for PFXEVICT TOKENS,
EVICT ALL and a deleted namespace). Both free the blocks, tell the listeners, count the pages
in the namespace, its tenant quota and the global counters by cause, and retire a namespace
left empty.

Room for a write: ``fits`` says whether n blocks can be had (free ones, plus evictable pages
unless the policy is noeviction), ``reserve`` evicts just enough and takes them, and
``refuse`` builds the OutOfMemory that says why not. Pinned pages are never evicted: a page is
evictable only while no lease or insert in flight pins it (radix.py).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

from .allocator import LEASED
from .arguments import integer, namespace_name, packed_tokens
from .block_ids import BlockRun
from .errors import BadRequest, OutOfMemory
from .events import announce_drop, announce_survivors, announce_trim
from .results import EvictResult

if TYPE_CHECKING:
    from .listeners import Listeners
    from .namespaces import Namespace, Namespaces
    from .partitions import ArenaPartitions
    from .radix import Node, RadixTree

# Why pages were evicted: room for an insert or allocation, the background low-watermark task,
# a command (PFXEVICT, DEL), FLUSHALL/FLUSHDB, a tenant's quota.
EVICTION_CAUSES = ("pressure", "watermark", "command", "flush", "quota")
#: The causes whose pages a lower tier keeps (Listeners.demote): room being made, not a command to forget.
DEMOTING_CAUSES = frozenset(("pressure", "watermark", "quota"))


#: From this many pages on, an evicted leaf's blocks are released on their own (no copy into the batch).
_RELEASED_ALONE = 1024


class Evictor:
    """Evicts pages and counts what it evicted (see the module docstring).

    ``evicting`` is False under maxmemory-policy noeviction: a full arena then refuses writes
    (-OOM) instead of evicting; PFXEVICT still evicts by the policy in force.
    """

    def __init__(self, *, namespaces: Namespaces, partitions: ArenaPartitions, listeners: Listeners,
                 clock: Callable[[], float], shard_of: Callable[[bytes, bytes], int], page_size: int,
                 page_bytes: int, block_bytes: int) -> None:
        self._names = namespaces
        self._records = namespaces.records
        self._partitions = partitions
        self._alloc = partitions.alloc
        self._totals = partitions.totals
        self._listeners = listeners
        self._clock = clock
        self._shard_of = shard_of
        self._page_size = page_size
        self._page_bytes = page_bytes
        self._block_bytes = block_bytes
        self.evicting = True
        self.evictions = 0
        self.evictions_by_cause = dict.fromkeys(EVICTION_CAUSES, 0)  # pages; sums to evictions
        # Inserts and allocations refused with OutOfMemory: a count of requests, not state,
        # so stats() (which a refused call must leave as it was) does not show it.
        self.oom_refusals = 0

    # -- room for writes ------------------------------------------------------------------------

    def fits(self, n: int, pin_cost: int = 0, part=None) -> bool:
        """Whether ``n`` blocks can be had, freeing some by eviction; within ``part`` when there are
        partitions (the namespace's: a full one makes room with its own pages only)."""
        if part is None:
            alloc, totals = self._alloc, self._totals
        else:
            alloc, totals = part.alloc, part.totals
        if not self.evicting:  # noeviction: only free blocks count
            return alloc.free_count >= n
        return alloc.free_count + totals.unpinned - pin_cost >= n

    def refuse(self, n: int, part=None) -> OutOfMemory:
        """The OutOfMemory refusing ``n`` blocks (``fits`` said no), counted in oom_refusals."""
        self.oom_refusals += 1
        alloc, t = (self._alloc, self._totals) if part is None else (part.alloc, part.totals)
        where = "" if part is None else f" in arena partition '{part.name}'"
        if not self.evicting:
            return OutOfMemory(f"cannot allocate {n} blocks{where}: {alloc.free_count} free and "
                               f"maxmemory-policy is noeviction")
        return OutOfMemory(f"cannot allocate {n} blocks{where}: {alloc.free_count} free, {t.unpinned} evictable, "
                           f"{t.pages - t.unpinned} cached pages pinned, {alloc.count(LEASED)} leased")

    @staticmethod
    def pin_cost(node: Node, child: Node | None, extra: int) -> int:
        """Unpinned pages that pinning this match would take away from the evictable pool."""
        cost = extra if child is not None and child.lock_ref == 0 else 0
        while node.parent is not None and node.lock_ref == 0:  # pinned nodes have pinned ancestors
            cost += len(node.blocks)
            node = node.parent
        return cost

    def reserve(self, n: int, part=None, *, packed: bool = False):
        """Evict just enough, then take n blocks into state LEASED (the caller checked ``fits``);
        from ``part`` and with its own pages when there are partitions. ``packed``: as an
        ``array('q')`` (an insert's: they become a node's blocks), else a list."""
        alloc = self._alloc if part is None else part.alloc
        short = n - alloc.free_count
        if short > 0:
            self.evict(short, None, "pressure", part)
        return alloc.take(n, LEASED, packed=packed)

    # -- the two ways out -----------------------------------------------------------------------

    def evict(self, n: int, scope: bytes | None, cause: str, part=None) -> int:
        """Evict up to n pages chosen by the policy (globally, in one partition, or in one
        namespace); O(k log n)."""
        now = self._clock()
        records = self._records
        if part is None and scope is not None and self._partitions.parts:
            scoped = records.get(scope)
            part = scoped.part if scoped is not None else None
        victim = (self._partitions.index if part is None else part.index).victims(scope)
        events, touched = self._listeners.events, self._listeners.touched
        demote = self._listeners.demote if cause in DEMOTING_CAUSES else None
        evicted = 0
        # Freed blocks go back in the order they were evicted (the free stack's order is that of one
        # release of them all): runs (BlockRun) collected into ``runs``, other short arrays joined at C
        # speed into ``freed``; at most one of the two holds anything at a time.
        release, release_runs = self._alloc.release, self._alloc.release_runs
        runs: list = []
        freed = array("q")
        tree = rec = None
        owed = 0  # pages evicted from rec's namespace not yet counted there
        while evicted < n:
            node = victim(now)
            if node is None:
                break
            # Trailing pages of one leaf in one go: the node keeps its priority while it shrinks,
            # so this is the same as evicting them one page at a time.
            k = len(node.blocks)
            if k > n - evicted:
                k = n - evicted
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
            if demote is not None:
                demote(tree.scope, node, k)
            pages = tree.trim(node, k)
            if type(pages) is BlockRun:  # one stack entry: collected, released in one call
                if freed:
                    release(freed)
                    freed = array("q")
                runs.append(pages)
            elif len(pages) >= _RELEASED_ALONE:
                # A long leaf's array goes back as it is, without copying it into ``freed``.
                release_runs(runs)
                runs = []
                if freed:
                    release(freed)
                    freed = array("q")
                release(pages)
            else:
                if runs:
                    release_runs(runs)
                    runs = []
                freed.extend(pages)
            owed += k
            evicted += k
            if not tree.pages:
                self._count_evicted(rec, owed)
                owed = 0
                self._names.retire_if_empty(rec)
                tree = rec = None  # they may be gone
        if owed:
            self._count_evicted(rec, owed)
        release_runs(runs)
        release(freed)
        self.evictions += evicted
        self.evictions_by_cause[cause] += evicted
        return evicted

    @staticmethod
    def _count_evicted(rec: Namespace, pages: int) -> None:
        rec.evictions += pages
        if rec.quota is not None:
            rec.quota.pages -= pages

    def drop(self, tree: RadixTree, top: Node, cause: str = "command") -> tuple[int, int]:
        """Free the unpinned pages of ``top``'s subtree; returns (pages freed, pages kept pinned)."""
        events, touched = self._listeners.events, self._listeners.touched
        if events is not None:
            announce_drop(events, tree, top)
        freed, pinned = tree.drop_subtree(top)
        self._alloc.release(freed)
        if freed and touched is not None:
            touched(tree.scope)
        self._count_evicted(self._records[tree.scope], len(freed))
        self.evictions += len(freed)
        self.evictions_by_cause[cause] += len(freed)
        return len(freed), pinned

    def sweep_deleted(self, rec: Namespace) -> None:
        """Free the pages of a deleted namespace that no lease pins any more."""
        for tree in rec.trees.values():
            if tree.unpinned:
                self.drop(tree, tree.root)

    # -- the commands ---------------------------------------------------------------------------

    def _result(self, evicted: int, pinned: int) -> EvictResult:
        return EvictResult(evicted, evicted * self._block_bytes, pinned)

    def evict_prefix(self, ns, tokens) -> EvictResult:
        """Forget every cached sequence that starts with the whole pages of ``tokens``
        (the last of those pages and everything below it); pinned pages stay and are counted."""
        name = namespace_name(ns)
        tokens = packed_tokens(tokens)
        npages = len(tokens) // self._page_bytes
        if not npages:
            raise BadRequest(f"the prefix must hold at least one whole page ({self._page_size} tokens)")
        rec = self._records.get(name)
        tree = rec.trees.get(self._shard_of(name, tokens)) if rec is not None else None
        if tree is None:
            return self._result(0, 0)
        if tree.keys is None:
            node, pages, child, extra = tree.walk(tokens, npages)
        else:  # key pages: the chain may start below the root (page_keys.py)
            node, pages, child, extra, _ = tree.walk_keys(tokens, npages)
        if pages + extra < npages:
            return self._result(0, 0)
        # Make the last page of the prefix start a node: that node's subtree is exactly what goes.
        if child is not None:
            target = child
            if extra > 1:
                tree.split(child, extra - 1)
        else:
            target = node
            if len(node.blocks) > 1:
                tree.split(node, len(node.blocks) - 1)
        return self._result(*self.drop(tree, target))

    def evict_pages(self, ns, n: int) -> EvictResult:
        """Evict up to n pages of ``ns`` chosen by the policy."""
        name = namespace_name(ns)
        n = integer(n, "the page count", 0)
        rec = self._records.get(name)
        if rec is None:
            return self._result(0, 0)
        evicted = self.evict(n, name, "command")
        return self._result(evicted, rec.pinned)

    def evict_bytes(self, ns, nbytes: int) -> EvictResult:
        """Evict pages of ``ns`` by policy until at least nbytes of blocks are freed (or nothing is left)."""
        nbytes = integer(nbytes, "the byte count", 0)
        return self.evict_pages(ns, -(-nbytes // self._block_bytes))

    def evict_all(self, ns, *, cause: str = "command") -> EvictResult:
        """Drop every unpinned page of ``ns`` (``cause``: how INFO counts them, one of EVICTION_CAUSES)."""
        rec = self._records.get(namespace_name(ns))
        if rec is None:
            return self._result(0, 0)
        evicted = pinned = 0
        for tree in rec.trees.values():
            e, p = self.drop(tree, tree.root, cause)
            evicted += e
            pinned += p
        result = self._result(evicted, pinned)
        self._names.retire_if_empty(rec)
        return result

    def flush(self) -> EvictResult:
        """Drop every unpinned page of every namespace, and what the eviction policy learned from them.

        KV events: one "all cleared" for the lot, then the pages leases kept are announced again.
        """
        listeners = self._listeners
        events, listeners.events = listeners.events, None
        names = [name for name in self._names.names() if type(name) is bytes]  # not DEL's tombstones
        evicted = pinned = 0
        try:
            for name in list(self._records):
                e, _, p = self.evict_all(name, cause="flush")
                evicted += e
                pinned += p
        finally:
            listeners.events = events
        partitions = self._partitions
        partitions.set_policy(partitions.policy, self._records.values())  # a fresh index: a learning policy starts over
        if events is not None:
            events.all_cleared(names)
            for rec in self._records.values():
                for tree in rec.trees.values():
                    announce_survivors(events, tree)
        return self._result(evicted, pinned)

    def evict_to_watermark(self, low_free_blocks: int) -> EvictResult:
        """Evict by policy across namespaces until at least ``low_free_blocks`` blocks are free
        (with arena partitions: until each has its proportional share of them free)."""
        low = integer(low_free_blocks, "the free-block watermark", 0)
        totals = self._totals
        parts = self._partitions.parts
        if parts:  # each arena partition keeps its share free, with its own pages
            evicted = 0
            nblocks = self._partitions.nblocks
            for part in parts:
                short = low * part.nblocks // nblocks - part.alloc.free_count
                evicted += self.evict(short, None, "watermark", part) if short > 0 and self.evicting else 0
            return self._result(evicted, totals.pages - totals.unpinned)
        short = low - self._alloc.free_count
        evicted = self.evict(short, None, "watermark") if short > 0 and self.evicting else 0
        return self._result(evicted, totals.pages - totals.unpinned)
