"""The ``guard`` eviction policy: the learned ``reuse`` order where it pays, LRU's order everywhere else.

A learned order wins where its model of the workload holds and can lose to
plain LRU where it does not. The guard indexes every candidate in both
orders (two lazy heaps over the same leaves) and lets the one that would
have hit more, recently, choose the victims. "Would have hit" comes from
miniature simulations (SHARDS: Waldspurger et al., "Cache Modeling and
Optimization using Miniature Simulations", USENIX ATC 2017): two
metadata-only prefix caches, one ordered by ``lru`` and one by ``reuse``,
see the same spatially sampled stream of pages and hold ``rate`` x the
store's capacity, rate = min(1, SAMPLE_PAGES / capacity).

Spatial sampling of a prefix tree: a page's identity is a hash of its
namespace and every token up to its end; the page is in the sample when that
hash is below rate x 2**64. So a page is always or never sampled, and two
requests share a sampled page exactly when they share the prefix up to it: a
request's sampled pages, in order, are a chain of one-token pages in the
miniature caches and the prefix structure survives the sampling. The LRU
miniature predicts LRU on the whole (a page's ancestors are never less
recent than the page); the reuse miniature is the real policy at scale
``rate``.

Decisions, every DECIDE_EVERY sampled lookups, on hit counts that halve
every HALFLIFE of them: reuse drives once its miniature hit more than
(1 + MARGIN) x the LRU miniature, LRU drives again once reuse's falls below
LRU's. It starts with LRU. And a check that needs no model: while reuse
drives, the real cache's hits on the sampled pages are compared with the LRU
miniature's; when they fall more than MARGIN below, LRU takes over and reuse
is barred for VETO_DECISIONS decisions, twice as long each further time.

Costs: per lookup and store, one vectorised hash of the prompt (numpy,
O(tokens)) and the two miniature caches' own O(log n) steps on the sampled
pages; memory: one more heap entry per candidate, 2 x SAMPLE_PAGES pages of
miniature caches, reuse's ghost. Everything counts in ticks and events, never
seconds, so replays in process and through the daemon agree to the token.
"""

from __future__ import annotations

import zlib

import numpy as np

from .policies import EvictionIndex, LRUPolicy
from .radix import RadixTree, Totals
from .reuse import ReusePolicy

SAMPLE_PAGES = 4096  # pages each miniature cache holds at most (its sampling rate follows)
DECIDE_EVERY = 32  # sampled lookups between two decisions
HALFLIFE = 1024  # sampled lookups after which a hit counts half
MARGIN = 0.02  # reuse must hit 2 % more than LRU in miniature to take over
VETO_DECISIONS = 64  # decisions reuse sits out after the real cache fell behind the LRU miniature

_MASK32 = np.uint64(0xFFFFFFFF)
_DEPTH_CHUNK = 4096  # depth multipliers are made in chunks, each from its own seed (deterministic)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place on a uint64 array: every input bit reaches every output bit."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


class PageSampler:
    """Which pages of a prompt are in the sample, and their identities as one-token pages."""

    def __init__(self, page_bytes: int, rate: float) -> None:
        self.page_tokens = page_bytes // 4
        self.rate = rate
        self._all = rate >= 1.0
        self._below = np.uint64(min(int(rate * 2.0**64), 2**64 - 1))
        rng = np.random.default_rng(0x5EED)
        self._coef = rng.integers(1, 2**63, self.page_tokens, dtype=np.uint64) | np.uint64(1)
        self._depth = np.empty(0, np.uint64)

    def _multipliers(self, n: int) -> np.ndarray:
        while len(self._depth) < n:
            chunk = np.random.default_rng((0xDE97, len(self._depth) // _DEPTH_CHUNK))
            more = chunk.integers(1, 2**63, _DEPTH_CHUNK, dtype=np.uint64) | np.uint64(1)
            self._depth = np.concatenate([self._depth, more])
        return self._depth[:n]

    def sample(self, scope: bytes, tokens: bytes, npages: int) -> tuple[bytes, np.ndarray]:
        """(the sampled pages as packed one-token pages, their depths) of the first ``npages`` pages."""
        pages = np.frombuffer(tokens, np.uint32, npages * self.page_tokens).reshape(npages, self.page_tokens)
        h = (pages * self._coef).sum(axis=1, dtype=np.uint64)  # uint64 arithmetic wraps: a hash
        h *= self._multipliers(npages)  # the page's depth is part of its identity
        x = np.cumsum(h, dtype=np.uint64)  # ... and so is every page before it
        x += np.uint64(zlib.crc32(scope) + 1)
        _mix(x)
        if self._all:
            depths = np.arange(npages)
        else:
            depths = np.flatnonzero(x < self._below)
            x = x[depths]
        return (x & _MASK32).astype("<u4").tobytes(), depths


class MiniCache:
    """A miniature simulation: a metadata-only prefix cache of one-token pages under one policy.

    It does what the store does with a worker's requests (look up; store what
    was missing; evict leaf first, never the path being extended), on trees
    of its own, with its own ticks.
    """

    def __init__(self, factory, capacity: int) -> None:
        self.capacity = max(int(capacity), 1)
        self.index = EvictionIndex(factory)
        self.totals = Totals()
        self.trees: dict[bytes, RadixTree] = {}

    def _tree(self, scope: bytes) -> RadixTree:
        tree = self.trees.get(scope)
        if tree is None:
            tree = self.trees[scope] = RadixTree(4, self.index, self.totals, scope)
        return tree

    def access(self, scope: bytes, ids: bytes) -> int:
        """A lookup of ``ids`` and the store of what it missed; returns the pages it hit."""
        n = min(len(ids) // 4, self.capacity)
        tree = self._tree(scope)
        node, pages = tree.locate(ids, n)
        if pages:
            self.totals.ticks += 1
            tree.touch(node, float(self.totals.ticks), hit=True)
        if pages < n:
            self._store(tree, node, ids, pages, n)
        return pages

    def store(self, scope: bytes, ids: bytes) -> None:
        """A store of ``ids`` that no lookup announced (its pages count no hits)."""
        n = min(len(ids) // 4, self.capacity)
        tree = self._tree(scope)
        node, pages = tree.locate(ids, n)
        self._store(tree, node, ids, pages, n)

    def _store(self, tree: RadixTree, node, ids: bytes, pages: int, n: int) -> None:
        totals = self.totals
        tree.pin(node)  # as the store's insert plan does: the prefix being extended stays
        short = (n - pages) - (self.capacity - totals.pages)
        index = self.index
        while short > 0:
            victim = index.best(0.0)
            if victim is None:
                break
            k = min(short, len(victim.blocks))
            victim.tree.trim(victim, k)
            short -= k
        totals.ticks += 1
        now = float(totals.ticks)
        end = node
        if pages < n:
            end = tree.add_leaf(node, ids[pages * 4 : n * 4], [0] * (n - pages), now)
        tree.unpin(node)
        tree.touch(end, now, hit=False)


class _BothOrders:
    """Every candidate in the lru and the reuse order; ``driver()`` says which one evicts."""

    def __init__(self, reuse: ReusePolicy) -> None:
        self.lru = LRUPolicy()
        self.reuse = reuse
        self.live = 0

    def driver(self) -> str:
        raise NotImplementedError

    def push(self, node, uncovered: bool = False) -> None:
        self.reuse.push(node, uncovered)
        self.lru.push(node, uncovered)
        self.live += 1

    def drop(self) -> None:
        self.reuse.drop()
        self.lru.drop()
        self.live -= 1

    def peek(self, now: float):
        return (self.reuse if self.driver() == "reuse" else self.lru).peek(now)

    def nodes(self) -> list:
        return self.lru.nodes()


class _ScopedGuard(_BothOrders):
    """One namespace's candidates (EVICT commands): the orders of the global instance, its driver."""

    def __init__(self, guard: GuardPolicy) -> None:
        super().__init__(guard.reuse.for_scope())
        self.guard = guard

    def driver(self) -> str:
        return self.guard.driving


class GuardPolicy(_BothOrders):
    """reuse's order while miniature simulations say it beats LRU's, LRU's otherwise; see the module docstring."""

    name = "guard"

    def __init__(self, capacity: int = SAMPLE_PAGES, page_bytes: int = 0) -> None:
        super().__init__(ReusePolicy())
        capacity = max(int(capacity), 1)
        self.rate = min(1.0, SAMPLE_PAGES / capacity)
        mini = max(round(capacity * self.rate), 1)
        self.minis = {"lru": MiniCache(LRUPolicy, mini), "reuse": MiniCache(ReusePolicy, mini)}
        self._sampler = PageSampler(page_bytes, self.rate) if page_bytes else None
        self.driving = "lru"
        self.hits = {"lru": 0.0, "reuse": 0.0, "real": 0.0}  # sampled pages hit, halving every HALFLIFE
        self.sampled = 0.0  # sampled pages looked up, halving likewise
        self.lookups = 0  # sampled lookups seen
        self.switches = 0
        self.vetoes = 0
        self._veto_left = 0
        self._veto_length = VETO_DECISIONS
        self._last: tuple[bytes, bytes] | None = None  # the latest lookup: its store is already simulated

    @classmethod
    def for_store(cls, capacity: int, page_bytes: int) -> GuardPolicy:
        """The instance for a store of ``capacity`` pages of ``page_bytes`` each."""
        return cls(capacity or SAMPLE_PAGES, page_bytes)

    def driver(self) -> str:
        return self.driving

    def for_scope(self) -> _ScopedGuard:
        return _ScopedGuard(self)

    def evicted(self, node, whole: bool) -> None:
        self.reuse.evicted(node, whole)

    # -- the request stream ------------------------------------------------------------------

    def looked_up(self, scope: bytes, tokens: bytes, npages: int, matched: int) -> None:
        """A lookup of ``npages`` whole pages of ``tokens`` in namespace ``scope`` matched ``matched`` pages."""
        if self._sampler is None or not npages:
            return
        ids, depths = self._sampler.sample(scope, tokens, npages)
        self._last = (scope, ids)
        if not len(depths):
            return
        hits = self.hits
        hits["real"] += int(np.searchsorted(depths, matched))
        for name, mini in self.minis.items():
            hits[name] += mini.access(scope, ids)
        self.sampled += min(len(depths), self.minis["lru"].capacity)
        self.lookups += 1
        if self.lookups % DECIDE_EVERY == 0:
            self._decide()

    def stored(self, scope: bytes, tokens: bytes, npages: int) -> None:
        """An insert of ``npages`` whole pages was committed (its pages are cached now)."""
        if self._sampler is None or not npages:
            return
        ids, depths = self._sampler.sample(scope, tokens, npages)
        last = self._last
        if last is not None and last[0] == scope and last[1].startswith(ids):
            return  # the store of what the latest lookup missed: simulated with it
        if len(depths):
            for mini in self.minis.values():
                mini.store(scope, ids)

    def _decide(self) -> None:
        hits = self.hits
        lru, reuse, real = hits["lru"], hits["reuse"], hits["real"]
        if self._veto_left:
            self._veto_left -= 1
        elif self.driving == "lru":
            if reuse > (1.0 + MARGIN) * lru:
                self._drive("reuse")
        elif reuse < lru:
            self._drive("lru")
        elif real < (1.0 - MARGIN) * lru:  # the miniature misled: the real cache does worse than LRU would
            self._drive("lru")
            self.vetoes += 1
            self._veto_left = self._veto_length
            self._veto_length *= 2
        decay = 0.5 ** (DECIDE_EVERY / HALFLIFE)
        for name in hits:
            hits[name] *= decay
        self.sampled *= decay

    def _drive(self, name: str) -> None:
        self.driving = name
        self.switches += 1

    def describe(self) -> dict:
        """What INFO and PFXINFO show: who drives, what the miniatures saw, and what reuse learned."""
        sampled = self.sampled or 1.0
        return {
            "guard_driver": self.driving,
            "guard_sample_rate": round(self.rate, 6),
            "guard_sampled_lookups": self.lookups,
            "guard_lru_hit_share": round(self.hits["lru"] / sampled, 4),
            "guard_reuse_hit_share": round(self.hits["reuse"] / sampled, 4),
            "guard_real_hit_share": round(self.hits["real"] / sampled, 4),
            "guard_switches": self.switches,
            "guard_vetoes": self.vetoes,
            **self.reuse.describe(),
        }
