"""The ``guard`` eviction policy: the order of whichever expert would have hit most, never much below LRU.

Rule. Every candidate is indexed in the order of five experts, ``lru``,
``reuse``, ``hybrid`` (in ticks), ``tempo`` and ``lhd`` (one lazy heap, bucket
set or array of candidates each, over the same leaves), and the expert that
would have hit most, recently, chooses the victims; LRU chooses at the start
and whenever in doubt. Each expert wins on the shape it suits and can lose to
plain LRU elsewhere; the guard takes the wins and bounds the losses.

"Would have hit" comes from miniature simulations (SHARDS: Waldspurger et al.,
"Cache Modeling and Optimization using Miniature Simulations", USENIX ATC
2017): one metadata-only prefix cache per expert, all fed the same spatially
sampled stream of pages, each holding ``rate`` x the store's capacity, rate =
min(1, SAMPLE_PAGES / capacity). The experts are the "arms" of LeCaR /
Cacheus, judged by simulation instead of by regret. How pages are sampled,
and what a miniature models of the store (pins of requests in flight, stores
at the worker's pace), is miniatures.py.

Decisions, every DECIDE_EVERY sampled lookups, on hit counts that halve
every HALFLIFE of them:

* an expert takes over when its miniature beat the driving one by MARGIN and
  by SWITCH_Z standard deviations of the difference; LRU takes back over on
  BACK_MARGIN and BACK_Z (leaving LRU takes more evidence than coming back: a
  wrong switch away costs the winner's lead, one back at most what LRU
  loses). The deviation is that of the sum of the per-lookup differences (a
  lookup hits or misses its whole prefix, so hits come in lumps of a
  request's length; Poisson counts of pages would call a few lumps
  significant). While LRU drives, an expert must also beat the real cache's
  hits on the sampled pages: that is LRU itself;
* a budget, the goal kept as an account (the idea of Wu et al.,
  "Conservative Bandits", ICML 2016): while other experts drove, and until
  LRU has settled what they left (the cache refilled twice), the real cache
  may hit BUDGET less than LRU would have since the start. "Would have" is
  the LRU miniature's hits times what the real cache hit per miniature hit
  while LRU drove a settled cache. LRU leaves only while the account is
  within it; spent, the driver goes back to LRU once the cache has been
  refilled under its order (before that its losses are the switch's cost),
  or at once past twice the budget, and LRU drives until its own hits have
  earned the budget back. A switch must also be affordable: what is left of
  the budget must cover the most the expert's miniature hit less than LRU's
  in one window between two decisions (``risk``, halving every HALFLIFE),
  since a loss of one window lands before the budget is next checked;
* a veto that needs no model: while another expert drives, the real cache's
  hits on the sampled pages are compared with the LRU miniature's; when they
  fall more than VETO_MARGIN and VETO_Z (paired) deviations below, LRU takes
  over and the others sit out VETO_DECISIONS decisions, twice as long each
  further time. The veto judges a driver only once the cache has been
  refilled under its order VETO_TURNOVERS times: until then the real cache
  still holds what the previous order kept.

An expert that learns from what became of the cache's own candidates learns,
while another drives, only what that one's evictions let it see: ``lhd``'s
order, under LRU, sees no hit past LRU's eviction age. Its miniature drove
its own cache and learned the ages that pay, so a switch to ``lhd`` gives its
order the miniature's histograms (HitDensityModel.adopt: ages scaled by the
two clocks' ratio), only at rate 1, where the miniature's nodes are the
store's page for page. The other experts learn from hits and ghosts, which
any driver lets them see.

Node state: each node's ``policy_data`` is a GuardState, the experts' state
(each expert reads and writes its own field: policy.field_of) and the pages'
sampling identities, cut with the pages on a split or a trim.

Costs: per lookup and store, one vectorised hash of the prompt (numpy,
O(tokens)) and the miniature caches' own O(log n) steps on the sampled pages;
per candidate, one heap entry per expert. Extra memory is bounded: five
miniatures of at most SAMPLE_PAGES pages, reuse's and tempo's ghosts; the
leases whose hits the miniatures pin are at most HELD_MAX. Every expert
counts in ticks and events, never seconds, so replays in process and
through the daemon agree to the token. Why each constant has its value, and
what was tried instead: scripts/research/policies/NOTES.md.
"""

from __future__ import annotations

import heapq
import itertools
import math

import numpy as np

from .lhd import MIN_EVENTS, LHDPolicy
from .miniatures import MiniCache, PageSampler
from .policies import HybridPolicy, LRUPolicy, SharedSeq, bucket
from .policy import Policy, field_of
from .reuse import ReusePolicy
from .tempo import TempoPolicy

SAMPLE_PAGES = 4096  # pages each miniature cache holds at most (its sampling rate follows) ...
MAX_RATE = 1.0  # ... and the largest share of pages sampled
DECIDE_EVERY = 32  # sampled lookups between two decisions
HALFLIFE = 1024  # sampled lookups after which a hit counts half
START = "lru"  # LRU drives until an expert has shown it does better
MARGIN = 0.01  # an expert takes over once its miniature hits 1 % more than the driver's ...
SWITCH_Z = 3.0  # ... and by 3 standard deviations of the difference
BACK_MARGIN = 0.01  # ... LRU likewise ...
BACK_Z = 1.0  # ... by 1 (back to LRU takes less evidence than leaving it)
VETO_MARGIN = 0.01  # the real cache more than 1 % below the LRU miniature: LRU takes over ...
VETO_Z = 1.0  # ... and by 1 standard deviation
VETO_TURNOVERS = 2.0  # ... but not before the driver has refilled the cache twice (a switch costs hits for a while)
VETO_DECISIONS = 16  # ... for 16 decisions, twice as long each further time
BUDGET = 0.005  # the real cache may hit this share less than LRU would have, since the start (GuardPolicy.budget)
HELD_MAX = 1 << 16  # leases whose hits the miniatures pin, at most (beyond: the oldest are let go)

# What INFO's used_memory_policy counts (research.policy_memory measures them, CPython 3.11):
SAMPLE_ARRAY_BYTES = 112  # a node's array of sampling identities, besides its 8 bytes a page
STATE_BYTES = 64  # a node's GuardState


class GuardState:
    """What the guard keeps on a node (its ``policy_data``): each expert's state, the pages' sampling identities."""

    __slots__ = ("lhd", "reuse", "samples", "tempo")

    def __init__(self, reuse=None, samples=None) -> None:
        self.reuse = reuse  # ReusePolicy's Access
        self.tempo = None  # TempoPolicy's tuple
        self.lhd = None  # LHDPolicy's tuple
        self.samples = samples  # the pages' sampling identities, a uint64 array (miniatures.PageSampler)


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
        heapq.heappush(self._buckets[bucket(node.freq)], (node.tick, next(self._seq), node.version, node))
        self.live += 1
        self._entries += 1

    def peek(self, now: float):
        return super().peek(float(self.clock.now))


EXPERTS = {"lru": LRUPolicy, "reuse": ReusePolicy, "hybrid": TickHybridPolicy, "tempo": TempoPolicy, "lhd": LHDPolicy}


class _Orders(Policy):
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
        return sum(order.memory_bytes(nodes, pages) for order in self._all)

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
    summary = ("the default: the order of whichever of lru, reuse, hybrid, tempo and lhd hit most in miniature "
               "simulations of a sample of the pages, LRU's as soon as the cache falls behind what LRU would hit "
               "or has spent its budget of 0.5 % of LRU's hits")
    observes_requests = True

    def __init__(self, capacity: int = SAMPLE_PAGES, page_bytes: int = 0) -> None:
        super().__init__({"reuse": ReusePolicy(state=field_of(GuardState, "reuse")), "lru": LRUPolicy(),
                          "hybrid": TickHybridPolicy(), "tempo": TempoPolicy(state=field_of(GuardState, "tempo")),
                          "lhd": LHDPolicy(state=field_of(GuardState, "lhd"))})
        self.reuse = self.orders["reuse"]
        self.lhd = self.orders["lhd"]
        self.tempo = self.orders["tempo"]
        capacity = max(int(capacity), 1)
        self.rate = min(MAX_RATE, SAMPLE_PAGES / capacity)
        mini = max(round(capacity * self.rate), 1)
        self.minis = {name: MiniCache(factory, mini) for name, factory in EXPERTS.items()}
        self._minis = tuple(self.minis.items())  # looked_up's loop, without a dict view per lookup
        self._mini_pages = self.minis["lru"].capacity
        self._sampler = PageSampler(page_bytes, self.rate, field_of(GuardState, "samples")) if page_bytes else None
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

    # -- node state: every node the experts may read holds a GuardState ------------------------

    def push(self, node, uncovered: bool = False) -> None:
        if node.policy_data is None:  # a new leaf
            node.policy_data = GuardState()
        if node.parent.policy_data is None:  # the root (the experts read a candidate's parent)
            node.parent.policy_data = GuardState()
        super().push(node, uncovered)

    def split(self, top, child, pages: int) -> None:
        """The upper part shares reuse's Access of the latest access through both (reuse never changes one),
        starts without tempo's and lhd's state (it ended no access of its own) and takes its pages' identities."""
        state = child.policy_data
        samples = state.samples
        if samples is None:
            top.policy_data = GuardState(state.reuse)
        else:
            top.policy_data = GuardState(state.reuse, samples[:pages])
            state.samples = samples[pages:]

    def trimmed(self, node, pages: int) -> None:
        state = node.policy_data
        if state.samples is not None:
            state.samples = state.samples[:pages]

    def reset(self, node) -> None:
        node.policy_data = GuardState()

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
        return (super().memory_bytes(nodes, pages) + nodes * STATE_BYTES + sampled
                + sum(m.memory_bytes() for m in self.minis.values()))

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
