"""The ``guard`` eviction policy: the order of whichever expert would have hit most, never much below LRU.

Each policy wins on the shape it suits and can lose to plain LRU elsewhere
(reuse kept 0.83x of LRU on tests/test_guard_policy.py's fooling workload).
The guard indexes every candidate in the order of five experts, ``lru``,
``reuse``, ``hybrid`` (in ticks), ``tempo`` and ``lhd``, one lazy heap (or
bucket set, or lhd's array of candidates) each over the same leaves, and lets
the one that would have hit most, recently, choose the victims (``lhd``
joined when loops came: workloads that read a set larger than the cache over
and over, an evaluation rerun over its dataset, where every recency order
keeps nothing but the shared prefix and LHD's hit densities keep a part of
the loop: 1.00x -> 2.96x LRU on a loop of 40 documents in half its
footprint, scripts/README.md "Loops"; on the suite's tuning half, before,
it had changed nothing; ``ghost`` was one until ``tempo`` came: on the
tuning half it then never changed a figure by more than 0.01x, and it cost a
sixth of the guard's work; ``lfu`` was one until a held-out real trace: its
miniature led early, it took the arena and fell behind LRU, 0.98x, as
``lfu`` alone fell to 0.60x-0.71x LRU on two real traces; without it the
suite keeps every goal, sysprompts 0.5 % 1.92x -> 1.64x LRU). "Would
have hit" comes from miniature simulations (SHARDS: Waldspurger et al., "Cache Modeling and Optimization
using Miniature Simulations", USENIX ATC 2017): one metadata-only prefix
cache per expert, all fed the same spatially sampled stream of pages, each
holding ``rate`` x the store's capacity, rate = min(1, SAMPLE_PAGES /
capacity). The experts are the "arms" of LeCaR / Cacheus, judged by
simulation instead of by regret (judging them also by regret, the real
cache's hits while each drove against its miniature's, was tried: at rate 1,
where a miniature is its expert exactly, it marked honest experts down for
what a switch had cost, and one expert so at a point of seed 2: reverted).

Spatial sampling of a prefix tree: a page's identity is a hash of its
namespace and every token up to its end; the page is in the sample when that
hash is below rate x 2**64. So a page is always or never sampled, and two
requests share a sampled page exactly when they share the prefix up to it: a
request's sampled pages, in order, are a chain of one-token pages in the
miniature caches, and the prefix structure survives the sampling. The LRU
miniature predicts LRU on the whole (a page's ancestors are never less
recent than the page); the others are their policy at scale ``rate``.

Decisions, every DECIDE_EVERY sampled lookups, on hit counts that halve
every HALFLIFE of them. LRU drives at the start and whenever in doubt. An
expert takes over when its miniature beat the driving one by MARGIN and by
SWITCH_Z standard deviations of the difference; LRU takes back over on
BACK_Z of them (and BACK_MARGIN). The deviation is that of the sum of the
per-lookup differences (the differences squared, summed with the squared
weights), not of Poisson counts of pages: a lookup hits or misses its whole
prefix, so hits come in lumps of a request's length. On Mooncake's traces,
at hit rates of 1 %-5 %, the miniatures' leads were a handful of 30- to
150-page lookups, that "significant" under the Poisson view, and every
switch on one was a gamble: 0.86x LRU at 152 pages of the first half,
where the expert that led fell behind after the switch. With the paired
deviation and 3 deviations to leave LRU, nothing switches there (1.00x),
and the suite's gains stay (the shared trace at 2 % 1.79x -> 1.69x LRU;
chat 0.5 % 1.33x -> 1.32x). Leaving LRU takes more evidence than coming
back: a wrong switch away costs the winner's lead, one back costs at
most what LRU loses. While LRU drives, an expert must also beat the real
cache's hits on the sampled pages: that is LRU itself, with the pins of
requests in flight that no miniature models (with 4 in flight on held-out
sessions the real cache hit 1.9x its LRU miniature; hybrid's miniature,
1.9x too, took the arena and the real cache fell to 0.96x LRU).

And a budget, the goal itself kept as an account: while experts other than
LRU drove, and until LRU had settled what they left (the cache refilled
twice), since the start, the real cache may hit BUDGET (0.5 %, half the
goal's 1 %) less than LRU would have, no more. "Would have" is the LRU
miniature's hits on the sampled pages times what the real cache hit per
miniature hit while LRU drove a settled cache (with requests in flight the real cache stores later and pins more than
the miniature: under LRU it hit 0.975 per miniature hit on scans at 6 % with
16 in flight, and against the bare miniature the budget sent tempo back
there, 1.13x -> 1.08x LRU). LRU leaves only while the account is within it;
spent, the driver goes back to LRU once the cache has been refilled under its
order (before that its losses are the switch's cost), or at once past twice
the budget, and LRU drives until its own hits have earned the budget back
(Wu et al., "Conservative Bandits", ICML 2016, for the idea). The windowed
rules above forget: on phases of Zipf prompts and of a loop, in turn,
hybrid's miniature led in each prompt phase, each switch to it and back cost
the real cache more than hybrid won, and the guard fell to 0.98x LRU
(tests/test_guard_policy.py; 0.99x with the budget). Sending the driver back
at once, before the refills, took tempo's gains at tenants 0.5 % (1.18x ->
0.99x: its switch cost 12 sampled pages in its first 32 lookups, against a
budget of 7); leaving out what LRU hit while it settled took them at chat
0.5 % (1.31x -> 1.19x: there, back under LRU, the cache tempo had shaped
won back 57 of the 61 pages its switch had cost, and tempo could drive again).

And a check that needs no model: while another expert drives, the real
cache's hits on the sampled pages are compared with the LRU miniature's;
when they fall more than VETO_MARGIN and VETO_Z (paired) deviations below,
LRU takes over and the others sit out VETO_DECISIONS decisions, twice as
long each further time (at trace 3 % the one veto, on a burst that tempo
lost, kept LRU driving 64 decisions while tempo's miniature led by half:
1.23x LRU; with 16, 1.29x). The veto judges a driver only once the cache
has been refilled under its order VETO_TURNOVERS times (sampled pages
missed since the switch, against the miniatures' capacity): until then the
real cache still holds what the previous order kept, and its hits are the
switch's cost, not the driver's. The constants were chosen on the tuning
half of the suite (pfxcache.tools.workloads.TUNING), the fooling workload's
test and Mooncake's synthetic trace (whole and halves) with 16
kv-cache-tester sessions (scripts/README.md).

A miniature stores what it missed at the lookup, not when the worker stores
it: with requests in flight (scripts/suite --in-flight), it then counts hits
on pages the real cache does not hold yet, so the veto hands the arena back
to LRU sooner, a bias towards safety. Storing at the worker's store instead,
as the real cache does, kept more of the gains with 16 requests in flight
(the suite's geometric mean 1.067x -> 1.081x LRU, before the rule on the
real cache above) but let tempo take over late, at lookup 928 of Mooncake's
synthetic first half at 10 %, where the real cache then fell to 0.92x-0.93x
LRU (4 and 16 in flight): reverted. Pinning each miniature's hit under the
lookup's lease until the lease ends (the store's pins, modelled) was tried
too, with either store: the LRU miniature then was the real cache, but tempo
took over at that same point and the real cache fell to 0.94x LRU (16 in
flight), a switch not inheriting the miniature's lead; with stores at the
lookup, the shared trace at 0.5 % with 16 in flight fell 1.31x -> 1.00x.
Reverted (scripts/README.md, "Requests in flight").

Costs: per lookup and store, one vectorised hash of the prompt (numpy,
O(tokens)) and the miniature caches' own O(log n) steps on the sampled pages;
per candidate, one heap entry per expert. Extra memory is bounded: five
miniatures of at most SAMPLE_PAGES pages, reuse's and tempo's ghosts. A
smaller sample would save memory but buys less evidence (scripts/suite
--guard-sample-pages N): 2,048 kept the suite's and the real traces'
figures (none below 0.99x LRU), 1,024 fell below 0.99x at 4 points of
Mooncake's traces (worst 0.94x) and 512 at 2 (0.95x, 0.96x); 4,096 keeps a
factor of 4 from that. Every
expert counts in ticks and events, never seconds, so replays in process and
through the daemon agree to the token.
"""

from __future__ import annotations

import heapq
import itertools
import math
import zlib

import numpy as np

from .lhd import LHDPolicy
from .policies import HybridPolicy, LRUPolicy, SharedSeq, _bucket
from .radix import RadixTree, Totals
from .reuse import ReusePolicy
from .tempo import TempoPolicy

SAMPLE_PAGES = 4096  # pages each miniature cache holds at most (its sampling rate follows) ...
MAX_RATE = 1.0  # ... and the largest share of pages sampled
DECIDE_EVERY = 32  # sampled lookups between two decisions
HALFLIFE = 1024  # sampled lookups after which a hit counts half
START = "lru"  # LRU drives until an expert has shown it does better
MARGIN = 0.01  # an expert takes over once its miniature hits 1 % more than the driver's ...
SWITCH_Z = 3.0  # ... and by 3 standard deviations of the difference (2 and 2.5 switched on lumps: 0.93x-0.95x)
BACK_MARGIN = 0.01  # ... LRU likewise ...
BACK_Z = 1.0  # ... by 1 (back to LRU takes less evidence than leaving it)
VETO_MARGIN = 0.01  # the real cache more than 1 % below the LRU miniature: LRU takes over ...
VETO_Z = 1.0  # ... and by 1 standard deviation (2: a driver that fell behind LRU kept the arena, 0.95x)
VETO_TURNOVERS = 2.0  # ... but not before the driver has refilled the cache twice (a switch costs hits for a while)
VETO_DECISIONS = 16  # ... for 16 decisions, twice as long each further time (64 kept trace 3 % on LRU while tempo led)
BUDGET = 0.005  # the real cache may hit this share less than LRU would have, since the start (GuardPolicy.budget)

# What INFO's used_memory_policy counts (pfxcache.tools.policy_memory measures them, CPython 3.11):
MINI_NODE_BYTES = 520  # a miniature's node: the object, its key, blocks, children and ints
SAMPLE_ARRAY_BYTES = 112  # a node's array of sampling identities, besides its 8 bytes a page

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


_MASK64 = (1 << 64) - 1
_UNMUL1 = pow(0xBF58476D1CE4E5B9, -1, 1 << 64)
_UNMUL2 = pow(0x94D049BB133111EB, -1, 1 << 64)


def _unmix(x: int) -> int:
    """_mix undone on one value (each step is a bijection of uint64): a page's running sum from its identity.

    Python ints, not numpy: on one value a numpy step costs microseconds, and lookups call this.
    """
    x ^= (x >> 31) ^ (x >> 62)
    x = (x * _UNMUL2) & _MASK64
    x ^= (x >> 27) ^ (x >> 54)
    x = (x * _UNMUL1) & _MASK64
    return x ^ (x >> 30) ^ (x >> 60)


class PageSampler:
    """Which pages of a prompt are in the sample, and their identities as one-token pages."""

    def __init__(self, page_bytes: int, rate: float) -> None:
        self.page_bytes = page_bytes
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

    def seed(self, scope: bytes) -> np.uint64:
        """The running sum before a namespace's first page (namespaces sample apart)."""
        return np.uint64(zlib.crc32(scope) + 1)

    def hash_pages(self, tokens: bytes, depth: int, carry: np.uint64) -> np.ndarray:
        """The identities of the whole pages of ``tokens``, at depths ``depth``.. below a running sum ``carry``.

        A page's identity is the running sum after it (a hash of each page times its depth's
        multiplier, added up from the namespace's seed: it covers every page before it), mixed;
        ``carry_after`` gets the sum back from the identity (8 bytes a page kept, not 16).
        """
        n = len(tokens) // self.page_bytes
        pages = np.frombuffer(tokens, np.uint32, n * self.page_tokens).reshape(n, self.page_tokens)
        h = pages.astype(np.uint64) @ self._coef  # a hash of each page (uint64 arithmetic wraps)
        h *= self._multipliers(depth + n)[depth:]  # the page's depth is part of its identity
        out = np.cumsum(h, dtype=np.uint64)  # ... and so is every page before it
        out += carry
        return _mix(out)

    @staticmethod
    def carry_after(ids: np.ndarray) -> np.uint64:
        """The running sum after the last of the pages with identities ``ids`` (at least one)."""
        return np.uint64(_unmix(int(ids[-1])))

    def path_hashes(self, scope: bytes, node) -> np.ndarray:
        """hash_pages() of the path from the root to radix node ``node``, from the hashes cached on its nodes.

        Each node keeps its pages' (``Node.sample_hashes``; splits and trims cut it with the pages),
        filled in on first use: a lookup that hits cached pages hashes only the pages it misses.
        """
        nodes = []
        while node.parent is not None:
            nodes.append(node)
            node = node.parent
        parts = []
        depth = 0
        for node in reversed(nodes):
            part = node.sample_hashes
            if part is None:
                carry = self.carry_after(parts[-1]) if parts else self.seed(scope)
                part = node.sample_hashes = self.hash_pages(node.key, depth, carry)
            parts.append(part)
            depth += len(part)
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, np.uint64)

    def select(self, ids: np.ndarray) -> tuple[bytes, np.ndarray]:
        """(the sampled pages as packed one-token pages, their depths) of pages with identities ``ids``."""
        x = ids
        if self._all:
            depths = np.arange(len(x))
        else:
            depths = np.flatnonzero(x < self._below)
            x = x[depths]
        return (x & _MASK32).astype("<u4").tobytes(), depths

    def sample(self, scope: bytes, tokens: bytes, npages: int) -> tuple[bytes, np.ndarray]:
        """(the sampled pages as packed one-token pages, their depths) of the first ``npages`` pages."""
        return self.select(self.hash_pages(tokens[: npages * self.page_bytes], 0, self.seed(scope)))

    def sample_lookup(self, scope: bytes, tokens: bytes, npages: int, node, matched: int
                      ) -> tuple[bytes, np.ndarray]:
        """sample() of a lookup whose first ``matched`` pages end at radix node ``node`` (same values)."""
        if node is None or not matched:
            return self.sample(scope, tokens, npages)
        hashes = self.path_hashes(scope, node)
        if matched < npages:
            P = self.page_bytes
            tail = self.hash_pages(tokens[matched * P : npages * P], matched, self.carry_after(hashes))
            hashes = np.concatenate((hashes, tail))
        return self.select(hashes)


class _MiniIndex:
    """EvictionIndex without per-namespace indexes: a miniature cache only ever evicts globally."""

    def __init__(self, factory) -> None:
        self.all = factory()
        self._evicted = getattr(self.all, "evicted", None)
        self._push = self.all.push  # bound once: every miniature touch calls these twice per node
        self._drop = self.all.drop

    def add(self, node, uncovered: bool = False) -> None:
        node.version += 1
        node.evictable = True
        self._push(node, uncovered)

    def remove(self, node) -> None:
        node.version += 1
        node.evictable = False
        self._drop()

    def evicted(self, node, whole: bool) -> None:
        if self._evicted is not None:
            self._evicted(node, whole)

    def best(self):
        return self.all.peek(0.0)


class MiniCache:
    """A miniature simulation: a metadata-only prefix cache of one-token pages under one policy.

    It does what the store does with a worker's requests (look up; store what
    was missing; evict leaf first, never the path being extended), on trees
    of its own, with its own ticks.
    """

    def __init__(self, factory, capacity: int) -> None:
        self.capacity = max(int(capacity), 1)
        self.index = _MiniIndex(factory)
        self.totals = Totals()
        self.trees: dict[bytes, RadixTree] = {}

    def memory_bytes(self) -> int:
        """About what the miniature holds: its nodes and its policy's orders, ghost and node data."""
        nodes = sum(tree.nodes for tree in self.trees.values())
        return nodes * MINI_NODE_BYTES + self.index.all.memory_bytes(nodes, self.totals.pages)

    def _tree(self, scope: bytes) -> RadixTree:
        tree = self.trees.get(scope)
        if tree is None:
            tree = self.trees[scope] = RadixTree(4, self.index, self.totals, scope)
        return tree

    def access(self, scope: bytes, ids: bytes) -> int:
        """A lookup of ``ids`` and the store of what it missed; returns the pages it hit."""
        n = len(ids) // 4
        if n > self.capacity:
            n = self.capacity
        tree = self.trees.get(scope) or self._tree(scope)
        node, pages = tree.locate(ids, n)
        if pages:
            totals = self.totals
            totals.ticks += 1
            tree.touch(node, totals.ticks, hit=True)  # an int: last_access shares the tick's object
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
            victim = index.best()
            if victim is None:
                break
            k = min(short, len(victim.blocks))
            victim.tree.trim(victim, k)
            short -= k
        totals.ticks += 1
        now = totals.ticks
        end = node
        if pages < n:  # (block ids: none, but one byte a page keeps len() and slicing: 7 bytes a page less)
            end = tree.add_leaf(node, ids[pages * 4 : n * 4], bytearray(n - pages), now)
        tree.unpin(node)
        tree.touch(end, now, hit=False)


class Clock:
    """The latest tick a policy has seen (node.tick of its pushes): "now" for orders that age."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0


class TickHybridPolicy(HybridPolicy):
    """hybrid's age / (freq + 1), with ages in ticks (the same in process and through the daemon)."""

    name = "hybrid"

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__()
        self.clock = clock if clock is not None else Clock()
        self._own = clock is None

    def push(self, node, uncovered: bool = False) -> None:
        if self._own and node.tick > self.clock.now:
            self.clock.now = node.tick
        heapq.heappush(self._buckets[_bucket(node.freq)], (node.tick, next(self._seq), node.version, node))
        self.live += 1
        self._entries += 1

    def peek(self, now: float):
        return super().peek(float(self.clock.now))


EXPERTS = {"lru": LRUPolicy, "reuse": ReusePolicy, "hybrid": TickHybridPolicy, "tempo": TempoPolicy, "lhd": LHDPolicy}


class _Orders:
    """Every candidate in every expert's order; ``driver()`` names the one that evicts."""

    def __init__(self, orders: dict) -> None:
        self.orders = orders
        self._all = tuple(orders.values())
        self.live = 0
        self._pushes = itertools.count()  # each order numbered its pushes alike: one number for all
        self._seq = SharedSeq.share(self._all)

    def driver(self) -> str:
        raise NotImplementedError

    def push(self, node, uncovered: bool = False) -> None:
        self._seq.value = next(self._pushes)
        for order in self._all:  # reuse first: a namespace's reuse order reads the key it sets
            order.push(node, uncovered)
        self.live += 1

    def drop(self) -> None:
        for order in self._all:
            order.drop()
        self.live -= 1

    def peek(self, now: float):
        return self.orders[self.driver()].peek(now)

    def nodes(self) -> list:
        return self.orders["lru"].nodes()

    def memory_bytes(self, nodes: int, pages: int) -> int:
        """The experts' orders and node data (INFO's used_memory_policy)."""
        return sum(order.memory_bytes(nodes, pages) for order in self._all if hasattr(order, "memory_bytes"))

    def pushed(self) -> list:
        return self.orders["lru"].pushed()


class _ScopedGuard(_Orders):
    """One namespace's candidates (EVICT commands): the experts' orders there, the global driver."""

    def __init__(self, guard: GuardPolicy) -> None:
        orders = guard.orders
        super().__init__({"reuse": orders["reuse"].for_scope(), "lru": LRUPolicy(),
                          "hybrid": TickHybridPolicy(orders["hybrid"].clock), "tempo": orders["tempo"].for_scope(),
                          "lhd": orders["lhd"].for_scope()})
        self.guard = guard

    def driver(self) -> str:
        return self.guard.driving


class GuardPolicy(_Orders):
    """The order of the expert whose miniature hit most, LRU's when in doubt; see the module docstring."""

    name = "guard"

    def __init__(self, capacity: int = SAMPLE_PAGES, page_bytes: int = 0) -> None:
        super().__init__({"reuse": ReusePolicy(), "lru": LRUPolicy(),
                          "hybrid": TickHybridPolicy(), "tempo": TempoPolicy(), "lhd": LHDPolicy()})
        self.reuse = self.orders["reuse"]
        self.lhd = self.orders["lhd"]
        self.tempo = self.orders["tempo"]
        capacity = max(int(capacity), 1)
        self.rate = min(MAX_RATE, SAMPLE_PAGES / capacity)
        mini = max(round(capacity * self.rate), 1)
        self.minis = {name: MiniCache(factory, mini) for name, factory in EXPERTS.items()}
        self._minis = tuple(self.minis.items())  # looked_up's loop, without a dict view per lookup
        self._mini_pages = self.minis["lru"].capacity
        self._sampler = PageSampler(page_bytes, self.rate) if page_bytes else None
        self.driving = START
        self.hits = {name: 0.0 for name in (*EXPERTS, "real")}  # sampled pages hit, halving every HALFLIFE
        names = (*EXPERTS, "real")
        self._pairs = tuple((a, b) for i, a in enumerate(names) for b in names[i + 1 :])
        # per pair, the per-lookup differences of hits squared, summed with the squared weights: the variance
        self.spread = {pair: 0.0 for pair in self._pairs}
        self._this = dict.fromkeys(names, 0)
        self.sampled = 0.0  # sampled pages looked up, halving likewise
        self.lookups = 0  # sampled lookups seen
        self.switches = 0
        self.vetoes = 0
        self.overdrawn = 0  # returns to LRU on a spent budget
        # The budget's sums of sampled pages hit, undecayed: the real cache and the LRU miniature while LRU
        # drove a settled cache (their ratio: what the real cache hits per miniature hit under LRU, pins of
        # requests in flight and stores at the worker's pace included), and otherwise
        self.lru_real = self.lru_mini = self.expert_real = self.expert_mini = 0
        self._veto_left = 0
        self._veto_length = VETO_DECISIONS
        self._turnover = 0.0  # sampled pages still to be stored anew before a veto may judge the driver
        self._sampled_before = self._real_before = 0.0  # self.sampled and hits["real"] after the last decision
        self._last: tuple[bytes, bytes] | None = None  # the latest lookup's pages: their store is simulated
        # ... and their sample (ids, depths): a function of (scope, pages) alone, so a hot prompt
        # looked up again reuses it instead of hashing and selecting its pages again
        self._last_sample: tuple[bytes, np.ndarray] | None = None

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
        self.tempo.evicted(node, whole)
        self.lhd.evicted(node, whole)

    # -- the request stream ------------------------------------------------------------------

    def looked_up(self, scope: bytes, tokens: bytes, npages: int, matched: int, node=None) -> None:
        """A lookup of ``npages`` whole pages of ``tokens`` in namespace ``scope`` matched ``matched`` pages.

        ``node``: the radix node where the match ends (its path's hashes are cached on it).
        """
        sampler = self._sampler
        if sampler is None or not npages:
            return
        pages = tokens[: npages * sampler.page_bytes]
        last = self._last
        if last is not None and last[1] == pages and last[0] == scope:
            ids, depths = self._last_sample  # the same prompt again: the same sample
        else:
            ids, depths = self._last_sample = sampler.sample_lookup(scope, tokens, npages, node, matched)
            self._last = (scope, pages)
        if not len(depths):
            return
        hits = self.hits
        this = self._this
        # the sampled pages the real cache hit (every page is sampled at rate 1)
        real = this["real"] = min(matched, npages) if sampler._all else int(np.searchsorted(depths, matched))
        hits["real"] += real
        same = True
        for name, mini in self._minis:
            h = this[name] = mini.access(scope, ids)
            hits[name] += h
            same = same and h == real
        if not same:
            spread = self.spread
            for a, b in self._pairs:
                d = this[a] - this[b]
                if d:
                    spread[a, b] += d * d
        if self.driving == "lru" and self._turnover <= 0:
            self.lru_real += real
            self.lru_mini += this["lru"]
        else:  # another expert drives, or LRU has not yet settled what one left (that counts both ways)
            self.expert_real += real
            self.expert_mini += this["lru"]
        self.sampled += min(len(depths), self._mini_pages)
        self.lookups += 1
        if self.lookups % DECIDE_EVERY == 0:
            self._decide()

    def stored(self, scope: bytes, tokens: bytes, npages: int) -> None:
        """An insert of ``npages`` whole pages was committed (its pages are cached now)."""
        if self._sampler is None or not npages:
            return
        last = self._last
        if last is not None and last[0] == scope and last[1].startswith(tokens[: npages * self._sampler.page_bytes]):
            return  # the store of what the latest lookup missed: simulated with it
        ids, depths = self._sampler.sample(scope, tokens, npages)
        if len(depths):
            for mini in self.minis.values():
                mini.store(scope, ids)

    def _decide(self) -> None:
        hits = self.hits
        current = self.driving
        if self._turnover > 0:  # the sampled pages missed since the last decision were stored anew
            self._turnover -= (self.sampled - self._sampled_before) - (hits["real"] - self._real_before)
        best = max(EXPERTS, key=hits.__getitem__)  # on a tie the first in EXPERTS: lru
        # While LRU drives, the real cache is LRU itself, pins of requests in flight included (module
        # docstring): an expert must beat the better of it and LRU's miniature.
        base = "real" if current == "lru" and hits["real"] > hits["lru"] else current
        # the budget (module docstring): a switch's cost may overdraw it while the cache is refilled under
        # the new order, but never twice over
        account, allowed = self.budget()
        within = account >= -allowed
        spent = not within and (self._turnover <= 0 or account < -2 * allowed)
        if self._veto_left:
            self._veto_left -= 1
        elif current != "lru" and spent:
            self._drive("lru")  # spent: LRU drives until its own hits have earned the budget back
            self.overdrawn += 1
        elif best != current and (within or best == "lru") \
                and hits[best] > (1.0 + (BACK_MARGIN if best == "lru" else MARGIN)) * hits[base] \
                and hits[best] - hits[base] > (BACK_Z if best == "lru" else SWITCH_Z) * self._sd(best, base):
            self._drive(best)
        elif current != "lru" and self._turnover <= 0 and hits["real"] < (1.0 - VETO_MARGIN) * hits["lru"] \
                and hits["lru"] - hits["real"] > VETO_Z * self._sd("lru", "real"):
            # the miniature misled: the real cache, settled under the driver's order, does worse than LRU would
            self._drive("lru")
            self.vetoes += 1
            self._veto_left = self._veto_length
            self._veto_length *= 2
        decay = 0.5 ** (DECIDE_EVERY / HALFLIFE)
        for name in hits:
            hits[name] *= decay
        square = decay * decay
        for pair in self._pairs:
            self.spread[pair] *= square
        self.sampled *= decay
        self._sampled_before = self.sampled
        self._real_before = hits["real"]

    def budget(self) -> tuple[float, float]:
        """(what the real cache hit more than LRU would have while other experts drove, what it may lose).

        "LRU would have" is the LRU miniature's hits times the real cache's per miniature hit while LRU
        drove a settled cache (1 until there is any): with requests in flight the real cache stores
        later and pins more than the miniature, and under LRU hits a steady share more or less than it.
        """
        scale = self.lru_real / self.lru_mini if self.lru_mini else 1.0
        return self.expert_real - scale * self.expert_mini, BUDGET * scale * (self.lru_mini + self.expert_mini)

    def _sd(self, a: str, b: str) -> float:
        """The standard deviation of hits[a] - hits[b] (from the per-lookup differences)."""
        spread = self.spread
        return math.sqrt(spread[a, b] if (a, b) in spread else spread[b, a])

    def _drive(self, name: str) -> None:
        self.driving = name
        self.switches += 1
        # no veto until the cache has been refilled under the new order, twice: its hits meanwhile are the switch's
        self._turnover = VETO_TURNOVERS * self._mini_pages

    def memory_bytes(self, nodes: int, pages: int) -> int:
        """Orders, node data, the pages' sampling identities and the miniatures (INFO's used_memory_policy)."""
        sampled = pages * 8 + nodes * SAMPLE_ARRAY_BYTES if self._sampler is not None else 0
        return super().memory_bytes(nodes, pages) + sampled + sum(m.memory_bytes() for m in self.minis.values())

    def describe(self) -> dict:
        """What INFO and PFXINFO show: who drives, what the miniatures saw, and what reuse learned."""
        sampled = self.sampled or 1.0
        return {
            "guard_driver": self.driving,
            "guard_sample_rate": round(self.rate, 6),
            "guard_sampled_lookups": self.lookups,
            **{f"guard_{name}_hit_share": round(self.hits[name] / sampled, 4) for name in (*EXPERTS, "real")},
            "guard_switches": self.switches,
            "guard_vetoes": self.vetoes,
            "guard_overdrawn": self.overdrawn,
            "guard_budget_left_pages": round(sum(self.budget()), 1),  # spent below 0
            **self.reuse.describe(),
        }
