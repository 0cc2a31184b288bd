"""The ``lhd`` eviction order, one of the guard's experts: evict the candidate of least hit density.

LHD (Beckmann, Chen and Cidon, "LHD: Improving Cache Hit Rate by Maximizing
Hit Density", NSDI 2018) ranks an object by what it is expected to give per
unit of cache space and time from its age on:

    density(class, age) = E[hits after age] / E[ticks in the cache after age]

estimated from what became of earlier objects of its class: how many were
hit, and how many evicted, at each age. A class whose leaves come back
(conversations) is kept over one whose leaves do not (one-off prompts), and
within a class an age past which nothing comes back goes first. Sizes do not
divide the density: a hit on a leaf is worth its pages, and so is its room.

Here:

* an object is a candidate (an unpinned leaf); its age is the ticks since its
  last access (``node.tick``, the store's logical clock: the same in process
  and through the daemon); a hit is a lookup through it, seen on its next
  push (``node.freq`` moved: it was hit at age ``node.gap``; a leaf that got a
  child since is pushed again when the child is evicted);
* its class: hits so far (0, 1, 2, 3+), its pages (log2: 1, 2-3, .. 32+) and
  its turns (log2 of 1 + its parent's turns: a conversation's depth in new
  contents), since whether a conversation comes back depends on how much a
  turn added and on how deep the conversation already is;
* histograms of hits and evictions per class and age (4 buckets per octave),
  decayed by DECAY and turned into densities every RECOMPUTE events (numpy:
  O(classes x buckets), bounded); a class with fewer than MIN_EVENTS events
  ranks by the pooled densities;
* explorers (LHD's answer to "a policy never sees hits past the age it
  evicts at"): one new leaf in EXPLORE_ONE_IN, and the next turns of an
  explorer, while explorers are at most EXPLORE_SHARE of the candidates, is
  not evicted before EXPLORE_REACH x the typical eviction age, so hits at
  older ages get into the histograms;
* a victim: the least dense of SAMPLES candidates drawn with a seeded
  generator from an array of entries (stale ones removed in O(1) when drawn,
  the array compacted when they are half of it); ties, and no data yet, go
  to the oldest: with nothing learned it is a sampled LRU.

Cost: O(1) per access (an append), O(SAMPLES) per eviction, O(classes x
buckets) numpy work every RECOMPUTE events. Memory: a small tuple per node
(its ``policy_data``: class, freq, turns, explorer), CLASSES x AGE_BUCKETS
floats twice. Per-namespace instances (EVICT commands) draw from their own
array and rank by the global instance's densities. Not a ``maxmemory-policy``
choice on its own (registry.py).
"""

from __future__ import annotations

import itertools
import math
import random
from array import array

import numpy as np

from .policies import ORDER_ENTRY_BYTES
from .policy import OWN, NodeState, Policy

SAMPLES = 32  # candidates drawn per eviction (LHD's associativity)
RECOMPUTE = 512  # events (hits, evictions) between two recomputations of the densities
DECAY = 0.9  # ... each of which weighs the histograms down by this (workloads drift)
SEED = 0x1AD  # the sampler's seed: the same draws in process and through the daemon
HIT_CLASSES = 4  # hits so far: 0, 1, 2, 3+
SIZE_CLASSES = 6  # log2 of the pages a candidate holds: 1, 2-3, 4-7, 8-15, 16-31, 32+
TURN_CLASSES = 4  # log2 of the nodes above it that were new content once: 1, 2-3, 4-7, 8+
CLASSES = HIT_CLASSES * SIZE_CLASSES * TURN_CLASSES
MAX_BITS = 26  # ages up to 2**26 ticks; older ones share the last bucket
AGE_BUCKETS = 8 + 4 * (MAX_BITS - 3)
MIN_EVENTS = 32.0  # a class with fewer (weighted) events ranks by the pooled densities
_COMPACT_SLACK = 64
NODE_BYTES = 72  # a node's 4-tuple (INFO's used_memory_policy; research.policy_memory measures it)
EXPLORE_ONE_IN = 32  # a new leaf (a new conversation) explores with probability 1 / 32 ...
EXPLORE_SHARE = 0.05  # ... while explorers are at most 5 % of the candidates ...
EXPLORE_REACH = 4.0  # ... and it is not evicted before 4 x the typical eviction age (unless all drawn are)
EVICTION_AGE_WEIGHT = 0.01  # EWMA weight of one eviction's age in the typical one


def age_bucket(age: int) -> int:
    """Four buckets per octave (exact below 8 ticks): integer arithmetic only."""
    if age < 8:
        return age if age > 0 else 0
    bits = age.bit_length()
    if bits > MAX_BITS:
        return AGE_BUCKETS - 1
    return 4 * bits - 8 + ((age >> (bits - 3)) & 3)


def _bucket_edges() -> np.ndarray:
    lo = [float(b) for b in range(8)]
    for b in range(8, AGE_BUCKETS + 1):
        k, r = divmod(b - 8, 4)
        lo.append(float((4 + r) << (k + 1)))
    return np.asarray(lo)


_PROTECTED = float("inf")
# two float histograms and the densities, 8 bytes a float each
TABLE_BYTES = CLASSES * AGE_BUCKETS * (2 * 8 + 8)
_EDGES = _bucket_edges()
_WIDTHS = np.diff(_EDGES)


def classify(freq: int, pages: int, turns: int) -> int:
    """A candidate's class: its hits so far, its pages and its turns (all but hits in log2 buckets)."""
    c = min(freq, HIT_CLASSES - 1) * SIZE_CLASSES + min(SIZE_CLASSES - 1, pages.bit_length() - 1)
    return c * TURN_CLASSES + min(TURN_CLASSES - 1, turns.bit_length() - 1)


def densities(hits: np.ndarray, evictions: np.ndarray) -> np.ndarray:
    """Hit density per (class, age bucket): hits after that age over the ticks spent in the cache after it.

    An object ending (hit or evicted) in bucket x was alive through every bucket before it and, on
    average, half of bucket x; the ticks alive from age a on are the sum of those from a's bucket up.
    """
    ends = hits + evictions
    alive = np.cumsum(ends[:, ::-1], axis=1)[:, ::-1]  # objects still there at the start of each bucket
    lifetime = (alive - 0.5 * ends) * _WIDTHS
    later_hits = np.cumsum(hits[:, ::-1], axis=1)[:, ::-1]
    later_life = np.cumsum(lifetime[:, ::-1], axis=1)[:, ::-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(later_life > 0, later_hits / np.where(later_life > 0, later_life, 1.0), 0.0)
    return out


class HitDensityModel:
    """What the global instance learns and its per-namespace instances read: the clock and the densities."""

    __slots__ = ("epoch", "eviction_age", "evictions", "explorers", "hits", "now", "pending", "table")

    def __init__(self) -> None:
        self.now = 0  # latest tick pushed
        self.hits = np.zeros((CLASSES, AGE_BUCKETS))
        self.evictions = np.zeros((CLASSES, AGE_BUCKETS))
        self.pending = 0
        self.eviction_age = 0.0  # EWMA of the age of evicted non-explorers
        self.explorers = 0  # nodes in the trees flagged as explorers
        self.epoch = 0  # recomputations so far: an event recorded at epoch e weighs DECAY ** (epoch - e) now
        # density per class, then age bucket: a list of arrays of doubles, read per drawn candidate (no numpy
        # scalars) in 8 bytes a density, not a Python float each (the guard keeps two models)
        self.table: list[array] = [array("d", [0.0]) * AGE_BUCKETS for _ in range(CLASSES)]

    def hit(self, cls: int, age: int) -> None:
        self.hits[cls, age_bucket(age)] += 1.0
        self._event()

    def evicted(self, cls: int, age: int) -> None:
        self.evictions[cls, age_bucket(age)] += 1.0
        self._event()

    def returned(self, cls: int, evicted_age: int, age: int, epoch: int) -> None:
        """An object evicted at ``evicted_age`` (at ``epoch``) came back ``age`` ticks after its last access."""
        b = age_bucket(evicted_age)
        e = self.evictions
        e[cls, b] = max(0.0, e[cls, b] - DECAY ** (self.epoch - epoch))
        self.hit(cls, age)

    def adopt(self, other: HitDensityModel, age_scale: float = 1.0, size_scale: float = 1.0) -> None:
        """Learn what ``other`` learned, its ages times ``age_scale`` and its candidates' pages times ``size_scale``.

        For the guard (pfxcache.daemon.store.guard): a model that learned while another policy
        evicted saw no hit past that policy's eviction age, and as driver it then keeps what that
        policy kept; the miniature that drove its own cache learned the ages that pay. The
        histograms are moved by whole buckets (4 an octave, 1 a size class) and the densities made
        anew; the clock, the explorers and the epoch stay this model's own.
        """
        age_shift = round(4 * math.log2(age_scale)) if age_scale > 0 else 0
        size_shift = round(math.log2(size_scale)) if size_scale > 0 else 0
        shape = (HIT_CLASSES, SIZE_CLASSES, TURN_CLASSES, AGE_BUCKETS)
        sizes = np.clip(np.arange(SIZE_CLASSES) + size_shift, 0, SIZE_CLASSES - 1)
        ages = np.clip(np.arange(AGE_BUCKETS) + age_shift, 0, AGE_BUCKETS - 1)
        for mine, theirs in ((self.hits, other.hits), (self.evictions, other.evictions)):
            moved = np.zeros(shape)
            src = theirs.reshape(shape)
            for s in range(SIZE_CLASSES):  # (np.add.at: buckets clipped at an edge add up)
                np.add.at(moved[:, sizes[s]], (slice(None), slice(None), ages), src[:, s])
            mine[:] = moved.reshape(mine.shape)
        self.eviction_age = other.eviction_age * age_scale
        self.pending = 0
        self._tables()

    def _event(self) -> None:
        self.pending += 1
        if self.pending >= RECOMPUTE:
            self.recompute()

    def recompute(self) -> None:
        self.pending = 0
        self.epoch += 1
        self._tables()
        self.hits *= DECAY
        self.evictions *= DECAY

    def _tables(self) -> None:
        """The densities from the histograms as they are."""
        hits, evictions = self.hits, self.evictions
        table = densities(hits, evictions)
        pooled = densities(hits.sum(axis=0, keepdims=True), evictions.sum(axis=0, keepdims=True))
        thin = (hits.sum(axis=1) + evictions.sum(axis=1)) < MIN_EVENTS
        table[thin] = pooled[0]
        self.table = [array("d", row) for row in table.tolist()]


class LHDPolicy(Policy):
    """Evict the least hit-dense of SAMPLES drawn candidates; see the module docstring."""

    name = "lhd"
    summary = ("the least hit density: hits per tick expected from a leaf's age on, learned per class of "
               "hits, pages and turns from what became of earlier leaves, among 32 drawn candidates")
    scope_shares_order = False  # a namespace's instance draws from its own candidates

    def __init__(self, model: HitDensityModel | None = None, scoped: bool = False, state: NodeState = OWN) -> None:
        """``state``: where the node state lives (the guard runs lhd as one of its experts)."""
        self.model = model if model is not None else HitDensityModel()
        self.scoped = scoped
        self.state = state
        self._data = state.get  # a node's (class, freq, turns, explorer) as of its latest push, or None
        self._keep = state.put
        # (seq, version, node), laid out as the heap policies' entries: live while version is the node's
        self._candidates: list[tuple] = []
        self._seq = itertools.count()  # (guard shares one number per push among its orders: SharedSeq)
        self.live = 0
        self._rng = random.Random(SEED)

    def for_scope(self) -> LHDPolicy:
        """The instance for one namespace's index: the same densities and clock, no learning."""
        return LHDPolicy(self.model, scoped=True, state=self.state)

    def describe(self) -> dict:
        return {"lhd_recomputations": self.model.epoch}

    def memory_bytes(self, nodes: int, pages: int) -> int:
        """Candidate entries, every node's tuple and (globally) the histograms and densities (INFO)."""
        own = len(self._candidates) * ORDER_ENTRY_BYTES + nodes * NODE_BYTES
        return own if self.scoped else own + TABLE_BYTES

    # -- the candidate set ---------------------------------------------------------------------

    def push(self, node, uncovered: bool = False) -> None:
        tick = node.tick
        if not self.scoped:
            model = self.model
            if tick > model.now:
                model.now = tick
            data = self._data(node)
            if data is not None:
                if node.freq != data[1]:
                    if node.gap:  # hit since its last push (maybe while it had children), at age node.gap
                        model.hit(data[0], node.gap)
                    self._keep(node, (classify(node.freq, len(node.blocks), data[2]), node.freq, data[2], data[3]))
            else:
                prev = self._data(node.parent) if node.parent is not None else None
                turns = prev[2] + 1 if prev is not None else 1
                explorer = False
                if not node.freq and not node.children and model.explorers < EXPLORE_SHARE * self.live:
                    # a new leaf: explores when it continues an explorer, or by a draw
                    explorer = (prev is not None and prev[3]) or self._rng.random() * EXPLORE_ONE_IN < 1.0
                    model.explorers += explorer
                self._keep(node, (classify(node.freq, len(node.blocks), turns), node.freq, turns, explorer))
        self._candidates.append((next(self._seq), node.version, node))
        self.live += 1

    def drop(self) -> None:
        self.live -= 1
        if len(self._candidates) > 2 * self.live + _COMPACT_SLACK:
            self._candidates = [e for e in self._candidates if e[1] == e[2].version]

    def peek(self, now: float):
        """The least dense of SAMPLES drawn candidates, or of all when there are no more (ages in the model's
        ticks, not ``now``: the same in process and through the daemon)."""
        if self.live <= 0:
            return None
        candidates = self._candidates
        if self.live <= SAMPLES:  # few: every one of them, no draws
            if len(candidates) > self.live:
                candidates[:] = [e for e in candidates if e[1] == e[2].version]
            return min(candidates, key=self._rank)[2]
        rank = self._rank
        rand = self._rng.random
        best = best_key = None
        draws = SAMPLES
        while draws > 0 and candidates:
            i = int(rand() * len(candidates))
            entry = candidates[i]
            if entry[1] != entry[2].version:  # stale: out in O(1)
                last = candidates.pop()
                if i < len(candidates):
                    candidates[i] = last
                continue
            draws -= 1
            key = rank(entry)
            if best_key is None or key < best_key:
                best, best_key = entry[2], key
        return best

    def _rank(self, entry: tuple) -> tuple:
        """(hit density, -age, push number) of a live entry: the smallest goes first."""
        seq, _, node = entry
        model = self.model
        age = model.now - node.tick
        data = self._data(node)
        if data is None:
            density = 0.0
        elif data[3] and age < EXPLORE_REACH * model.eviction_age:
            density = _PROTECTED  # a young explorer: only when every candidate weighed is one
        else:
            density = model.table[data[0]][age_bucket(age)]
        return (density, -age, seq)

    def split(self, top, child, pages: int) -> None:
        """The upper part of a cut edge starts with no state of its own (its class is set when pushed)."""

    def nodes(self) -> list:
        return [e[2] for e in self._candidates if e[1] == e[2].version]

    def pushed(self) -> list:
        return [e[2] for e in sorted(self._candidates) if e[1] == e[2].version]

    def evicted(self, node, whole: bool) -> None:
        """A ``whole`` evicted leaf counts as an eviction at its age (a trimmed one is still there)."""
        if whole and not self.scoped:
            data = self._data(node)
            if data is not None:
                model = self.model
                age = max(model.now - node.tick, 0)
                model.evicted(data[0], age)
                if data[3]:  # (never below 0: a node may keep an explorer flag from an earlier lhd instance)
                    model.explorers = max(0, model.explorers - 1)
                else:
                    model.eviction_age += EVICTION_AGE_WEIGHT * (age - model.eviction_age)
