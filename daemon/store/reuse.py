"""What the ``reuse`` eviction policy learns: how soon prefixes come back, per class of access.

The policy (policies.ReusePolicy) reports every access of a prefix and every
return (the prefix came back, as a hit or through its ghost after eviction);
ReuseLearner turns those into one boost per class, in ticks, that the policy
adds to the access time. Plain synchronous code (numpy for the per-class
tables): testable on its own.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

GAP_BUCKETS = 48  # half-octave buckets of a reuse gap in ticks: up to 2**24 ticks
SIZE_BUCKETS = (4, 16, 64)  # pages an access added: < 4, < 16, < 64, more (and a bucket for "not known")
LEARN_EVERY = 64  # accesses between recomputations of the boosts
LEARN_HALFLIFE = 2048  # accesses: older observations weigh half (workloads drift; stale boosts cost hits)
BOOST_SCALE = 2.0  # a class twice as likely as average to come back soon is kept 2 median gaps longer
BOOST_MAX = 4.0  # ... the lift (p_c / p - 1) counts up to this
BOOST_Z = 2.0  # ... and only when 2 standard deviations above average: no boosts for noise
PENALTY_SCALE = 1.0  # a class significantly below average goes PENALTY_SCALE x K x (p_c / p - 1) earlier
SHRINK_WEIGHT = 1.0  # boosts shrink as K / (K + eviction age): a large cache keeps things long anyway


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
    """What ReusePolicy keeps on a node (``node.policy_data``): its latest access as the policy saw it."""

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
