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
How pages are sampled, and what a miniature models of the store, is
pfxcache.daemon.store.miniatures.

An expert that learns from what became of the cache's own candidates
learns, while another drives, only what that one's evictions let it see:
``lhd``'s order, under LRU, sees no hit past LRU's eviction age, so once a
loop outgrows the cache it learns that nothing comes back, and as driver
it would keep what LRU kept. Its miniature drove its own cache and learned
the ages that pay. So a switch to ``lhd`` gives its order the miniature's
histograms (HitDensityModel.adopt: ages scaled by the two clocks' ratio),
and from there it learns from the real cache it now drives (adversarial's
growing-loop at 6 %: 1.00x -> 3.8x LRU; the others learn from hits and
ghosts, which any driver lets them see). Only at rate 1, where the
miniature's nodes are the store's page for page: below it a miniature's
node holds about rate x the pages, and the size classes, moved by 1 / rate
or not, misled (the stress set's scans in 64-token pages at 2 % with 16 in flight,
rate 0.59: the real cache under the adopted order hit half what LRU would
have, 1.13x -> 0.99x LRU; the suite's sysprompts at 20 %, rate 0.46, had
gained 1.01x -> 1.06x).

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
cache's hits on the sampled pages: that is LRU itself (made when the
miniatures did not yet pin: with 4 in flight on held-out sessions the real
cache hit 1.9x its LRU miniature; hybrid's miniature, 1.9x too, took the
arena and the real cache fell to 0.96x LRU).

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
A switch must also be affordable: what is left of the budget must cover the
most the expert's miniature hit less than LRU's in one window between two
decisions (``risk``, halving every HALFLIFE), since a loss of one window
lands before the budget is next checked. On Mooncake's synthetic first half
at 10 % with 4 in flight tempo, ahead by 900 sampled pages, took over at
lookup 928 of 1,145 with 7 pages of budget left, its risk 70; six windows
later one window lost 157 pages (bursts LRU kept and tempo did not) and the
real cache fell to 0.93x LRU (0.994x with 16 in flight). Affordable switches
keep both at 1.00x; the price is later switches elsewhere (the shared trace
at 2 % with none in flight 1.69x -> 1.55x LRU, tenants 0.5 % 1.18x -> 1.10x).

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

Requests in flight (scripts/suite --in-flight): a miniature does what the
store does (pfxcache.daemon.store.miniatures). Its hit is pinned under the
lookup's lease until the lease ends (the store calls released()), what it
missed is stored when the worker stores it, and when the real cache hit the
whole prompt, so that no store comes, when the lease ends; at rate 1 the LRU
miniature is LRU alone, page for page, whoever drives. Before, a miniature
stored at the lookup and pinned nothing: it counted hits on pages still in
flight and lost what the pins keep, the real cache under LRU beat every
miniature, and with 64 in flight the guard never left LRU (the shared trace
at 0.5 %: 1.00x, where tempo alone gets 1.27x). Two earlier tries modelled
one or both but never stored a miniature's misses of a prompt the real
cache hit whole, so the LRU miniature fell behind LRU alone whenever
another expert drove; they lost the shared trace (16 in flight, 1.31x ->
1.00x) or Mooncake's first half at 10 % (0.94x). (scripts/README.md,
"Requests in flight".) The leases' entries are bounded by HELD_MAX and
hold a prompt's sampled ids at most (4 bytes a sampled page, less than the
store's own lease keeps per page).

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

import numpy as np

from .lhd import MIN_EVENTS, LHDPolicy
from .miniatures import MiniCache, PageSampler
from .policies import HybridPolicy, LRUPolicy, SharedSeq, _bucket
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
HELD_MAX = 1 << 16  # leases whose hits the miniatures pin, at most (beyond: the oldest are let go)

# What INFO's used_memory_policy counts (pfxcache.tools.policy_memory measures them, CPython 3.11):
SAMPLE_ARRAY_BYTES = 112  # a node's array of sampling identities, besides its 8 bytes a page

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
        self._last: tuple[bytes, bytes] | None = None  # the latest lookup's pages (scope, tokens)
        # ... and their sample (ids, depths): a function of (scope, pages) alone, so a hot prompt
        # looked up again reuses it instead of hashing and selecting its pages again
        self._last_sample: tuple[bytes, np.ndarray] | None = None
        # lease id -> (the miniatures' nodes its lookup pinned, and the lookup's scope and sampled ids
        # when the real cache hit it whole: no store will come, the miniatures store their misses at the end)
        self._held: dict[int, tuple] = {}
        # per expert, the most its miniature hit less than LRU's between two decisions, halving every
        # HALFLIFE: what a switch to it can cost before the budget is next checked
        self.risk = dict.fromkeys(EXPERTS, 0.0)
        self._window = dict.fromkeys(EXPERTS, 0)  # each miniature's hits since the last decision

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

    def looked_up(self, scope: bytes, tokens: bytes, npages: int, matched: int, node=None, lease_id: int = 0
                  ) -> None:
        """A lookup of ``npages`` whole pages of ``tokens`` in namespace ``scope`` matched ``matched`` pages.

        ``node``: the radix node where the match ends (its path's hashes are cached on it).
        ``lease_id``: the lease pinning the match (0: none); each miniature pins its own hit until
        released() hears that the lease ended.
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
        held = [] if lease_id else None
        window = self._window
        for name, mini in self._minis:
            h = this[name] = mini.access(scope, ids, held)
            hits[name] += h
            window[name] += h
            same = same and h == real
        whole = matched >= npages  # the worker stores nothing: each miniature stores what it missed itself
        if lease_id:  # ... when the request is done, as a worker that missed would have
            self._held[lease_id] = (held, scope, ids) if whole else (held, None, None)
            if len(self._held) > HELD_MAX:  # more leases live than this (client-lease-limit 0: no limit):
                # the oldest are let go, unstored; the simulation drifts a little, nothing else
                for stale in self._held.pop(next(iter(self._held)))[0]:
                    MiniCache.release(stale)
        elif whole:  # ... now, with no lease to end
            self._store_missed(scope, ids)
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

    def released(self, lease_id: int) -> None:
        """A lease ended: the miniatures' hits held under it are unpinned (unknown ids: nothing)."""
        entry = self._held.pop(lease_id, None)
        if entry is not None:
            held, scope, ids = entry
            if ids is not None:
                self._store_missed(scope, ids)
            for node in held:
                MiniCache.release(node)

    def _store_missed(self, scope: bytes, ids: bytes) -> None:
        """Each miniature stores what it missed of a prompt the real cache held whole (no store comes)."""
        for mini in self.minis.values():
            mini.store(scope, ids, missed_only=True)

    def stored(self, scope: bytes, tokens: bytes, npages: int) -> None:
        """An insert of ``npages`` whole pages was committed (its pages are cached now)."""
        sampler = self._sampler
        if sampler is None or not npages:
            return
        last = self._last
        if last is not None and last[0] == scope and last[1].startswith(tokens[: npages * sampler.page_bytes]):
            ids, depths = self._last_sample  # the store of the latest lookup's prompt: its sample, cut
            if len(last[1]) > npages * sampler.page_bytes:
                k = int(np.searchsorted(depths, npages))
                ids, depths = ids[: 4 * k], depths[:k]
        else:
            ids, depths = sampler.sample(scope, tokens, npages)
        if len(depths):
            for mini in self.minis.values():
                mini.store(scope, ids)

    def _decide(self) -> None:
        hits = self.hits
        current = self.driving
        if self._turnover > 0:  # the sampled pages missed since the last decision were stored anew
            self._turnover -= (self.sampled - self._sampled_before) - (hits["real"] - self._real_before)
        best = max(EXPERTS, key=hits.__getitem__)  # on a tie the first in EXPERTS: lru
        window, risk = self._window, self.risk
        lru_window = window["lru"]
        for name in EXPERTS:
            risk[name] = max(risk[name], lru_window - window[name])
            window[name] = 0
        # While LRU drives, the real cache is LRU itself (module docstring): an expert must beat the
        # better of it and LRU's miniature.
        base = "real" if current == "lru" and hits["real"] > hits["lru"] else current
        # the budget (module docstring): a switch's cost may overdraw it while the cache is refilled under
        # the new order, but never twice over
        account, allowed = self.budget()
        within = account >= -allowed
        # ... and only while what is left of it covers the most the expert has lost to LRU between two
        # decisions, recently: a loss of one window lands before the budget can send it back
        affordable = account + allowed >= risk[best]
        spent = not within and (self._turnover <= 0 or account < -2 * allowed)
        if self._veto_left:
            self._veto_left -= 1
        elif current != "lru" and spent:
            self._drive("lru")  # spent: LRU drives until its own hits have earned the budget back
            self.overdrawn += 1
        elif best != current and ((within and affordable) or best == "lru") \
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
        for name in EXPERTS:
            risk[name] *= decay
        self.sampled *= decay
        self._sampled_before = self.sampled
        self._real_before = hits["real"]

    def budget(self) -> tuple[float, float]:
        """(what the real cache hit more than LRU would have while other experts drove, what it may lose).

        "LRU would have" is the LRU miniature's hits times the real cache's per miniature hit while LRU
        drove a settled cache (1 until there is any): about 1 now that the miniatures pin and store as
        the store does; below rate 1 the sample makes it a steady share more or less.
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
        # what its miniature learned driving its own cache, where the miniature is this cache page for page
        if name == "lhd" and self.rate >= 1.0:  # (module docstring)
            mini = self.minis["lhd"].index.all.model
            if mini.hits.sum() + mini.evictions.sum() >= MIN_EVENTS:  # (a miniature started late learned less)
                real = self.lhd.model
                real.adopt(mini, real.now / mini.now if mini.now else 1.0)
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
