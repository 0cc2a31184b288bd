"""Eviction policies and the index of eviction candidates.

Candidates are the unpinned leaves of every tree. The radix tree tells the
index whenever a node enters or leaves that set (or, by leaving and entering
again, when its priority changes), so picking the next victim never walks the
tree: it costs O(log n) for lru, lfu, ghost and reuse, O(buckets + log n) for
hybrid.

Heaps use lazy deletion: every entry records the node's ``version`` when it was
pushed; any change bumps the version, so stale entries are recognised and
skipped when they reach the top, and the heap is compacted when they dominate.

A policy instance exists globally (for evictions on allocation and the
watermark) and per scope (namespace), for EVICT commands on one namespace
(``for_scope()`` when a policy shares state between the two).
Policies are looked up in ``POLICIES``; nothing else branches on their names.
"""

from __future__ import annotations

import heapq
import itertools
import math
import zlib
from collections import OrderedDict

from .reuse import Access, ReuseLearner

_COMPACT_SLACK = 64
HYBRID_BUCKETS = 33  # freq.bit_length() of 0 .. 2**32-1, capped


class HeapPolicy:
    """Base of policies whose priority is time-invariant: one lazy heap, smallest key evicted first."""

    name = "abstract"

    def __init__(self) -> None:
        self._heap: list[tuple] = []
        self._seq = itertools.count()  # unique tie-breaker: nodes themselves are never compared
        self.live = 0

    @staticmethod
    def key(node) -> tuple:
        raise NotImplementedError

    def push(self, node, uncovered: bool = False) -> None:
        """Index an evictable node (its version was just bumped); ``uncovered``: its last child was evicted."""
        heapq.heappush(self._heap, (*self.key(node), next(self._seq), node.version, node))
        self.live += 1

    def drop(self) -> None:
        """One indexed node left the candidate set (its version was bumped, so its entry is stale)."""
        self.live -= 1
        if len(self._heap) > 2 * self.live + _COMPACT_SLACK:
            self._heap = [e for e in self._heap if e[-2] == e[-1].version]
            heapq.heapify(self._heap)

    def peek(self, now: float):
        """The node to evict next, or None; the node stays indexed."""
        heap = self._heap
        while heap:
            entry = heap[0]
            if entry[-2] == entry[-1].version:
                return entry[-1]
            heapq.heappop(heap)
        return None

    def nodes(self) -> list:
        """The indexed (valid) nodes, for consistency checks."""
        return [e[-1] for e in self._heap if e[-2] == e[-1].version]


class LRUPolicy(HeapPolicy):
    """Least recently used first."""

    name = "lru"

    @staticmethod
    def key(node) -> tuple:
        return (node.last_access,)


class LFUPolicy(HeapPolicy):
    """Least frequently hit first; the older of equally frequent nodes first."""

    name = "lfu"

    @staticmethod
    def key(node) -> tuple:
        return (node.freq, node.last_access)


def _bucket(freq: int) -> int:
    return min(freq.bit_length(), HYBRID_BUCKETS - 1)


class HybridPolicy:
    """Evict the highest age / (freq + 1) (the seed article's score).

    The order between two nodes changes as time passes, so no single heap can
    hold it. Nodes are bucketed by log2 of their frequency; inside a bucket
    frequencies differ by less than 2x, so the oldest node is (within that
    factor) the best there. A victim is the bucket head with the highest
    score, computed with the head's own frequency.
    """

    name = "hybrid"

    def __init__(self) -> None:
        self._buckets: list[list[tuple]] = [[] for _ in range(HYBRID_BUCKETS)]
        self._seq = itertools.count()
        self.live = 0
        self._entries = 0

    def push(self, node, uncovered: bool = False) -> None:
        heapq.heappush(self._buckets[_bucket(node.freq)], (node.last_access, next(self._seq), node.version, node))
        self.live += 1
        self._entries += 1

    def drop(self) -> None:
        self.live -= 1
        if self._entries > 2 * self.live + _COMPACT_SLACK:
            self._entries = 0
            for i, heap in enumerate(self._buckets):
                kept = [e for e in heap if e[-2] == e[-1].version]
                heapq.heapify(kept)
                self._buckets[i] = kept
                self._entries += len(kept)

    def peek(self, now: float):
        best = None
        best_score = -1.0
        for heap in self._buckets:
            while heap and heap[0][-2] != heap[0][-1].version:
                heapq.heappop(heap)
                self._entries -= 1
            if heap:
                last_access, _, _, node = heap[0]
                score = (now - last_access) / (node.freq + 1)
                if score > best_score:  # strict: on ties the lower-frequency bucket goes first
                    best, best_score = node, score
        return best

    def nodes(self) -> list:
        return [e[-1] for heap in self._buckets for e in heap if e[-2] == e[-1].version]


GHOST_MIN = 4096  # ghost entries kept at least (first-page hashes of evicted leaves)
GHOST_PER_LEAF = 4  # ... and up to this many per indexed leaf
GHOST_MAX = 1 << 18  # ... but never more (about 25 MB of dict per policy instance)
THRASH_ALPHA = 0.01  # weight of one observation in the thrashing estimate (an EWMA)
THRASH_ON = 0.5  # insert cold leaves at the LRU end while the estimate is above this
BIMODAL_SHARE = 1 << 27  # crc32 below this (1 in 32 leaves) still goes in at the MRU end


class GhostPolicy(HeapPolicy):
    """LRU with ghost-guided bimodal insertion: scan- and thrash-resistant, O(log n).

    One lazy heap like LRU, but a leaf that nothing marks as valuable may be
    placed at the LRU end (key = the key of the last victim) instead of the
    MRU end, so it is the next to go unless it is hit first. That is the
    bimodal insertion of Qureshi et al. (ISCA 2007) adapted to a prefix tree:

    * a leaf is a *continuation* when its parent is private to it (the
      parent's only child, not the root) and was hit (a multi-turn
      conversation going on), or when the hash of its first page is in the
      *ghost*: the first pages of recently evicted leaves (a prefix that was
      cached, evicted too early, and is back). Continuations always go to the
      MRU end;
    * the other new leaves go to the LRU end only while the cache *thrashes*:
      an EWMA over continuations of "it came back through the ghost" (1) vs
      "it came back as a hit" (0) is above 1/2. A cache that holds its
      working set sees continuations as hits and behaves exactly like LRU;
    * even then 1 leaf in 32 (by its first page's crc32) goes in at the MRU
      end, so new content keeps a way in.

    Priorities depend only on the order of events (never on clock values), so
    replays through the daemon and in process agree. The ghost is bounded:
    max(4096, min(4 x indexed leaves, 2**18)) crc32 values, oldest dropped first.
    """

    name = "ghost"

    def __init__(self) -> None:
        super().__init__()
        self._floor = None  # key of the last victim: "the LRU end"
        self._ghost: OrderedDict[int, None] = OrderedDict()
        self.thrash = 0.0

    @staticmethod
    def _first_page(node) -> int:
        return zlib.crc32(node.key[: node.tree.page_bytes])

    @staticmethod
    def _continues(node) -> bool:
        parent = node.parent
        return (parent is not None and parent.parent is not None and parent.freq > 0
                and len(parent.children) == 1)

    def push(self, node, uncovered: bool = False) -> None:
        key = node.last_access
        if node.freq == 0 and not node.children:  # a leaf never hit: just stored (or a cold parent)
            h = self._first_page(node)
            ghost = h in self._ghost
            continues = self._continues(node)
            if ghost or continues:
                self.thrash += THRASH_ALPHA * ((0.0 if continues else 1.0) - self.thrash)
            elif self.thrash > THRASH_ON and self._floor is not None and h >= BIMODAL_SHARE:
                key = self._floor
        heapq.heappush(self._heap, (key, next(self._seq), node.version, node))
        self.live += 1

    def peek(self, now: float):
        node = super().peek(now)
        if node is not None:
            key = self._heap[0][0]
            if self._floor is None or key > self._floor:
                self._floor = key
            h = self._first_page(node)
            if h not in self._ghost:
                ghost = self._ghost
                ghost[h] = None
                limit = max(GHOST_MIN, min(GHOST_PER_LEAF * self.live, GHOST_MAX))
                while len(ghost) > limit:
                    ghost.popitem(last=False)
        return node


def _typical(gap: int | None, prev: int) -> int | None:
    """The gap a class is made of: the latest, or the geometric mean of the last two when both are known."""
    if gap is None or not prev:
        return gap
    return max(math.isqrt(gap * prev), 1)


class ReusePolicy(HeapPolicy):
    """LRU in logical time, plus a learned boost for prefixes that come back soon.

    Key = tick of the last access + boost(class of that access), smallest
    evicted first (a class that comes back less than average gets a
    negative boost). This is the inter-reference-recency idea of LIRS (a
    prefix whose last reuse came quickly tends to come back quickly), with
    the protection learned per class by ReuseLearner instead of fixed: a
    workload where past gaps predict nothing earns no boosts and gets LRU.

    A prefix is seen coming back three ways: a leaf hit again; a new leaf
    whose parent is private to it and was just hit (the next turn of a
    conversation); a new leaf whose first page is in the ghost of recent
    evictions (the conversation came back after it was evicted; the ghost
    keeps the class, tick and gap of its last access). The gap that makes a
    class is the geometric mean of the prefix's last two return gaps when it
    has two (one gap alone predicts the next poorly). Ticks count lookups and
    inserts, so a replay in process and one through the daemon agree. The
    parent of a new turn keeps the larger of its old key and the new one, as
    last-access times do. O(log n) per access and eviction, O(classes) every
    LEARN_EVERY accesses.

    Per-namespace instances (``scoped``) order by the keys the global
    instance computed and learn nothing themselves.
    """

    name = "reuse"

    def __init__(self, learner: ReuseLearner | None = None, scoped: bool = False) -> None:
        super().__init__()
        self.learner = learner if learner is not None else ReuseLearner()
        self.scoped = scoped
        # first page (in its namespace) -> class, tick, end and gap of the last access of the evicted node
        self._ghost: OrderedDict[int, tuple[int | None, int, int, int]] = OrderedDict()
        self._now = 0  # latest tick seen

    def describe(self) -> dict:
        """What the policy has learned, for INFO and PFXINFO."""
        boost = self.learner.boost
        return {
            "reuse_median_gap_ticks": round(self.learner.median_gap),
            "reuse_eviction_age_ticks": round(self.learner.eviction_age),
            "reuse_boosted_classes": sum(1 for b in boost if b > 0),
            "reuse_max_boost_ticks": round(max(boost)),
            "reuse_penalized_classes": sum(1 for b in boost if b < 0),
            "reuse_ghost_entries": len(self._ghost),
        }

    def for_scope(self) -> ReusePolicy:
        """The instance for one namespace's index: same keys, no learning."""
        return ReusePolicy(self.learner, scoped=True)

    @staticmethod
    def _ghost_key(node) -> int:
        """The first page of ``node``'s edge, within its namespace (tenants never share a ghost entry)."""
        tree = node.tree
        return zlib.crc32(node.key[: tree.page_bytes], zlib.crc32(tree.scope))

    def _classify(self, node, uncovered: bool) -> tuple[int, int, int, int]:
        """(class, conversation end in pages, return gap, the gap before) of ``node``'s latest access.

        Counts the periods it ends and starts. The class's gap is the geometric mean of the last
        two return gaps when both are known (one gap is a noisy predictor of the next).
        """
        learner = self.learner
        data = node.policy_data
        if data is None:
            end = node.tree.depth_pages(node)
            if node.freq or node.children:  # an inner node whose history the policy never saw
                return learner.classify(node.gap or None, None), end, node.gap, 0
            gap = None
            prev = 0
            added = len(node.blocks)
            parent = node.parent
            if parent.parent is not None and len(parent.children) == 1 and parent.gap:
                # the next turn of a conversation: its parent came back after parent.gap ticks
                gap = parent.gap
                pdata = parent.policy_data
                if pdata is not None:
                    prev = pdata.gap
                    if pdata.freq != parent.freq:
                        learner.returned(pdata.cls, gap)
                    elif pdata.tick == parent.tick and pdata.end == end - added:
                        # A lookup without a lease re-indexed the hit parent at once (it was a leaf,
                        # the end of that access) and counted this return then, with a start of its
                        # own that this leaf now replaces; its gap was this one.
                        learner.unstart(pdata.cls)
                        prev = pdata.prev
                cls = learner.classify(_typical(gap, prev), added)
                # The whole conversation now belongs to this class; like the path's pages, the
                # parent keeps the later of its old key and the new one.
                key = parent.tick + learner.boost[cls]
                if pdata is not None and pdata.key > key:
                    key = pdata.key
                parent.policy_data = Access(cls, parent.freq, key, end, parent.tick, gap, prev)
            else:
                seen = self._ghost.pop(self._ghost_key(node), None)
                if seen is not None:  # came back after being evicted
                    seen_cls, seen_tick, seen_end, prev = seen
                    gap = max(node.tick - seen_tick, 1)
                    if seen_cls is not None:
                        learner.returned(seen_cls, gap)
                    added = max(end - seen_end, 0)
                cls = learner.classify(_typical(gap, prev), added)
            learner.start(cls)
            return cls, end, gap or 0, prev
        if data.freq != node.freq and not uncovered:
            # hit since its class was set (not just uncovered by an eviction): a return that added nothing
            gap = node.gap or 1
            learner.returned(data.cls, gap)
            cls = learner.classify(_typical(gap, data.gap), 0)
            learner.start(cls)
            return cls, data.end, gap, data.gap
        return data.cls, data.end, data.gap, data.prev

    def push(self, node, uncovered: bool = False) -> None:
        if self.scoped:
            data = node.policy_data
            key = data.key if data is not None else node.tick
        else:
            tick = node.tick
            if tick > self._now:
                self._now = tick
            old = node.policy_data
            cls, end, gap, prev = self._classify(node, uncovered)
            key = tick + self.learner.boost[cls]
            if old is not None and old.key > key:  # keys only grow, as in LRU
                key = old.key
            node.policy_data = Access(cls, node.freq, key, end, tick, gap, prev)
        heapq.heappush(self._heap, (key, next(self._seq), node.version, node))
        self.live += 1

    def evicted(self, node, whole: bool) -> None:
        """Pages of ``node`` are evicted: note the eviction age; a ``whole`` node goes into the ghost."""
        data = node.policy_data
        if data is not None:
            self.learner.evicted(self._now - data.key)
        if not whole:
            return
        ghost = self._ghost
        h = self._ghost_key(node)
        ghost[h] = (data.cls, node.tick, data.end, data.gap) if data is not None else (None, node.tick, 0, 0)
        ghost.move_to_end(h)
        limit = max(GHOST_MIN, min(GHOST_PER_LEAF * self.live, GHOST_MAX))
        while len(ghost) > limit:
            ghost.popitem(last=False)


POLICIES = {cls.name: cls for cls in (LRUPolicy, LFUPolicy, HybridPolicy, GhostPolicy, ReusePolicy)}


class EvictionIndex:
    """The unpinned leaves, indexed by the current policy globally and per scope.

    The radix tree calls ``add``/``remove``; ``node.evictable`` mirrors
    membership. One version counter per node invalidates its entries in both
    the global and the scope structure at once.
    """

    def __init__(self, policy: str) -> None:
        self.factory = POLICIES[policy]
        self.all = self.factory()
        self.scopes: dict[bytes, object] = {}

    @property
    def policy(self) -> str:
        return self.factory.name

    def _scoped(self, scope: bytes):
        index = self.scopes.get(scope)
        if index is None:
            for_scope = getattr(self.all, "for_scope", None)
            index = self.scopes[scope] = for_scope() if for_scope is not None else self.factory()
        return index

    def add(self, node, uncovered: bool = False) -> None:
        """``node`` became an unpinned leaf (or its priority changed after remove()).

        ``uncovered``: it became a leaf because its last child was evicted (not an access).
        """
        node.version += 1
        node.evictable = True
        self.all.push(node, uncovered)
        self._scoped(node.tree.scope).push(node, uncovered)

    def evicted(self, node, whole: bool) -> None:
        """Pages of ``node`` are being evicted (by policy or by command): its tail, or ``whole`` it."""
        evicted = getattr(self.all, "evicted", None)
        if evicted is not None:
            evicted(node, whole)

    def remove(self, node) -> None:
        """``node`` is no longer an unpinned leaf (pinned, got a child, left the tree, or is being touched)."""
        node.version += 1
        node.evictable = False
        self.all.drop()
        self.scopes[node.tree.scope].drop()

    def forget_scope(self, scope: bytes) -> None:
        """Drop the (empty) index of a namespace that no longer exists."""
        index = self.scopes.get(scope)
        if index is not None and not index.live:
            del self.scopes[scope]

    def describe(self) -> dict:
        """Policy-specific figures (what a learning policy has learned); empty for the others."""
        describe = getattr(self.all, "describe", None)
        return describe() if describe is not None else {}

    def best(self, now: float, scope: bytes | None = None):
        """The next victim, globally or within one scope; None when nothing is evictable."""
        if scope is None:
            return self.all.peek(now)
        index = self.scopes.get(scope)
        return index.peek(now) if index is not None else None

    def rebuild(self, policy: str, nodes) -> None:
        """Switch policy: index ``nodes`` (every current candidate) afresh, O(n log n) once."""
        self.factory = POLICIES[policy]
        self.all = self.factory()
        self.scopes = {}
        for node in nodes:
            self.add(node)

    def check(self, expected: set) -> list[str]:
        """Compare the indexed nodes with the set of unpinned leaves computed from the trees."""
        problems = []
        indexed = self.all.nodes()
        if len(indexed) != len(set(map(id, indexed))):
            problems.append("a node has two valid entries in the global index")
        if {id(n) for n in indexed} != {id(n) for n in expected}:
            problems.append(f"global index holds {len(indexed)} candidates, trees have {len(expected)} unpinned leaves")
        if self.all.live != len(expected):
            problems.append(f"global index live count {self.all.live} != {len(expected)}")
        by_scope: dict[bytes, set] = {}
        for node in expected:
            by_scope.setdefault(node.tree.scope, set()).add(id(node))
            if not node.evictable:
                problems.append("an unpinned leaf is not flagged evictable")
        for scope, index in self.scopes.items():
            got = {id(n) for n in index.nodes()}
            want = by_scope.get(scope, set())
            if got != want or index.live != len(want):
                problems.append(f"scope {scope!r} index holds {len(got)} (live {index.live}), expected {len(want)}")
        for scope in by_scope:
            if scope not in self.scopes:
                problems.append(f"scope {scope!r} has candidates but no index")
        return problems
