"""The ``reuse`` eviction order, one of the guard's experts, and what it learns: how soon prefixes come back.

ReusePolicy reports every access of a prefix and every return (the prefix
came back, as a hit or through its ghost after eviction); ReuseLearner turns
those into one boost per class, in ticks, that the policy adds to the access
time. Plain synchronous code (numpy for the per-class tables): testable on
its own. Not a ``maxmemory-policy`` choice on its own (registry.py).
"""

from __future__ import annotations

import bisect
import heapq
import math
import zlib

import numpy as np

from .ghosts import Ghost, limit
from .policies import HeapPolicy
from .policy import OWN, NodeState

GAP_BUCKETS = 48  # half-octave buckets of a reuse gap in ticks: up to 2**24 ticks
SIZE_BUCKETS = (4, 16, 64)  # pages an access added: < 4, < 16, < 64, more (and a bucket for "not known")
LEARN_EVERY = 64  # accesses between recomputations of the boosts
LEARN_HALFLIFE = 2048  # accesses: older observations weigh half (workloads drift; stale boosts cost hits)
BOOST_SCALE = 2.0  # a class twice as likely as average to come back soon is kept 2 median gaps longer
BOOST_MAX = 4.0  # ... the lift (p_c / p - 1) counts up to this
BOOST_Z = 2.0  # ... and only when 2 standard deviations above average: no boosts for noise
PENALTY_SCALE = 1.0  # a class significantly below average goes PENALTY_SCALE x K x (p_c / p - 1) earlier
SHRINK_WEIGHT = 1.0  # boosts shrink as K / (K + eviction age): a large cache keeps things long anyway
ACCESS_BYTES = 112  # a node's Access and its key float (INFO's used_memory_policy)


def _gap_bucket(gap: int) -> int:
    """Half-octave bucket of a gap >= 1 tick."""
    return min(GAP_BUCKETS - 1, int(2 * math.log2(gap))) if gap > 1 else 0


def _size_bucket(pages: int | None) -> int:
    """Bucket of the pages an access added; None (not known) has a bucket of its own."""
    return len(SIZE_BUCKETS) + 1 if pages is None else bisect.bisect_right(SIZE_BUCKETS, pages)


class ReuseLearner:
    """Online statistics of reuse gaps per class of access, and the boost each class earns.

    A class is (the gap after which the prefix last came back, or "new";
    how many pages that access added). Every access *starts* a period of its
    class; when the prefix comes back, that period ends with a *return* after
    its gap. From counts that halve every LEARN_HALFLIFE accesses: K = the
    median return gap, p_c = the share of class c's periods that ended
    within K, p = the same over all classes. A class whose p_c is
    significantly above p (BOOST_Z standard deviations) earns a boost of
    BOOST_SCALE x K x (p_c / p - 1) ticks, one significantly below gets a
    negative one, PENALTY_SCALE x K x (p_c / p - 1); both times
    K / (K + eviction age), since a large cache keeps everything long anyway.
    Classes not significantly different get none: when nothing predicts a
    quick return, the policy is exactly LRU.
    """

    def __init__(self) -> None:
        nclasses = (GAP_BUCKETS + 1) * (len(SIZE_BUCKETS) + 2)
        self.starts = np.zeros(nclasses)
        self.returns = np.zeros((nclasses, GAP_BUCKETS))
        self.boost = [0.0] * nclasses  # a list: read once per access, in the heap key
        self.median_gap = 0.0
        self.eviction_age = 0.0  # EWMA of (now - key) of victims, in ticks
        self._pending = 0

    @staticmethod
    def classify(gap: int | None, pages: int | None) -> int:
        """Class of an access: the reuse gap that brought it back (None: new content), the pages it added."""
        g = 0 if gap is None else 1 + _gap_bucket(gap)
        return g * (len(SIZE_BUCKETS) + 2) + _size_bucket(pages)

    def start(self, cls: int) -> None:
        """An access of class ``cls`` (every LEARN_EVERY of them, the boosts are recomputed)."""
        self.starts[cls] += 1.0
        self._pending += 1
        if self._pending >= LEARN_EVERY:
            self._pending = 0
            self._recompute()

    def unstart(self, cls: int) -> None:
        """Take back a start counted for an access that turned out to be part of a later one."""
        self.starts[cls] = max(self.starts[cls] - 1.0, 0.0)

    def returned(self, cls: int, gap: int) -> None:
        """A prefix last accessed in class ``cls`` came back after ``gap`` ticks."""
        self.returns[cls, _gap_bucket(gap)] += 1.0

    def evicted(self, age: float) -> None:
        """A victim was evicted ``age`` ticks after its key (negative: before its boost ran out)."""
        self.eviction_age += 0.01 * (age - self.eviction_age)

    def _recompute(self) -> None:
        returns = self.returns
        by_gap = returns.sum(axis=0)
        total = by_gap.sum()
        if total < 50:  # too little to learn from (and nothing to forget yet)
            return
        kb = int(np.searchsorted(np.cumsum(by_gap), total / 2))  # the median's bucket
        k = 2 ** ((kb + 1) / 2)  # its upper edge
        self.median_gap = k
        soon = returns[:, : kb + 1].sum(axis=1)
        starts = self.starts
        p_all = soon.sum() / max(starts.sum(), 1e-9)
        if 0.0 < p_all < 1.0:
            shrink = k / (k + SHRINK_WEIGHT * max(self.eviction_age, 0.0))
            expected = starts * p_all
            excess = soon - expected
            noise = BOOST_Z * np.sqrt(expected * (1.0 - p_all))
            with np.errstate(divide="ignore", invalid="ignore"):
                lift = np.where(expected > 0, soon / expected - 1.0, 0.0)
            boost = np.where(excess > noise, BOOST_SCALE * k * np.minimum(lift, BOOST_MAX) * shrink, 0.0)
            # below average (lift < 0): evicted sooner than LRU would
            boost = np.where(-excess > noise, PENALTY_SCALE * k * lift * shrink, boost)
            boost[starts <= 10] = 0.0  # too few accesses of the class to say anything
            self.boost = boost.tolist()
        else:
            self.boost = [0.0] * len(self.boost)
        decay = 0.5 ** (LEARN_EVERY / LEARN_HALFLIFE)
        starts *= decay
        returns *= decay


class Access:
    """What ReusePolicy keeps on a node (its ``policy_data``): its latest access as the policy saw it.

    Never changed once made (a new access makes a new one), so both parts of a cut edge share it.
    """

    __slots__ = ("cls", "end", "freq", "gap", "key", "prev", "tick")

    def __init__(self, cls: int | None, freq: int, key: float, end: int, tick: int, gap: int = 0,
                 prev: int = 0) -> None:
        self.cls = cls  # ReuseLearner class of the access
        self.freq = freq  # node.freq then: a higher freq later means it was hit since
        self.key = key  # heap key given (per-namespace instances reuse it)
        self.end = end  # pages from the root to the end of the conversation then
        self.tick = tick  # node.tick then
        self.gap = gap  # the return gap that brought that access (0: none known)
        self.prev = prev  # the one before it


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
    summary = ("LRU plus a learned boost for prefixes whose last reuse came quickly: the classes of access "
               "that come back sooner than average are kept longer; plain LRU when nothing predicts a return")
    scope_shares_order = True  # a namespace's instance orders by the keys this one gave

    def __init__(self, learner: ReuseLearner | None = None, scoped: bool = False, state: NodeState = OWN) -> None:
        """``state``: where the node state (an Access) lives (the guard runs reuse as one of its experts)."""
        super().__init__()
        self.learner = learner if learner is not None else ReuseLearner()
        self.scoped = scoped
        self.state = state
        self._data = state.get
        self._keep = state.put
        # first page (in its namespace) -> class (-1: none), tick, end and gap of the last access of the evicted node
        self._ghost = Ghost("hqqq")  # a class fits 16 bits: (GAP_BUCKETS + 1) x (len(SIZE_BUCKETS) + 2)
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

    def memory_bytes(self, nodes: int, pages: int) -> int:
        """Orders, ghost and the Access of every node (see HeapPolicy.memory_bytes)."""
        return super().memory_bytes(nodes, pages) + self._ghost.memory_bytes() + nodes * ACCESS_BYTES

    def for_scope(self) -> ReusePolicy:
        """The instance for one namespace's index: same keys, no learning."""
        return ReusePolicy(self.learner, scoped=True, state=self.state)

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
        data_of = self._data
        data = data_of(node)
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
                pdata = data_of(parent)
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
                self._keep(parent, Access(cls, parent.freq, key, end, parent.tick, gap, prev))
            else:
                seen = self._ghost.pop(self._ghost_key(node))
                if seen is not None:  # came back after being evicted
                    seen_cls, seen_tick, seen_end, prev = seen
                    gap = max(node.tick - seen_tick, 1)
                    if seen_cls >= 0:
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
            data = self._data(node)
            key = data.key if data is not None else node.tick
        else:
            tick = node.tick
            if tick > self._now:
                self._now = tick
            old = self._data(node)
            cls, end, gap, prev = self._classify(node, uncovered)
            key = tick + self.learner.boost[cls]
            if old is not None and old.key > key:  # keys only grow, as in LRU
                key = old.key
            self._keep(node, Access(cls, node.freq, key, end, tick, gap, prev))
        heapq.heappush(self._heap, (key, next(self._seq), node.version, node))
        self.live += 1

    def evicted(self, node, whole: bool) -> None:
        """Pages of ``node`` are evicted: note the eviction age; a ``whole`` node goes into the ghost."""
        data = self._data(node)
        if data is not None:
            self.learner.evicted(self._now - data.key)
        if not whole:
            return
        ghost = self._ghost
        h = self._ghost_key(node)
        if data is not None:
            ghost.put(h, -1 if data.cls is None else data.cls, node.tick, data.end, data.gap)
        else:
            ghost.put(h, -1, node.tick, 0, 0)
        ghost.trim(limit(self.live))
