"""The ``odds`` eviction policy (research, not shipped): LRU, each leaf held longer by the odds that leaves
like it come back.

A leaf's key is its last access tick plus SCALE x the store's turnover (the
ticks it takes to fill with new pages: LRU's horizon, whatever this policy
keeps) x the share of returns that came later than one turnover x p(class),
where p is the share of the class's leaves seen coming back within HORIZON
turnovers. Returns that LRU catches anyway need no boost: where they are
most of them (a roomy arena) the boosts vanish and the order is LRU's. A
class: log2 of the pages the access added (the new leaf's pages, or what
lies past an evicted leaf it brings back) and the conversation's turn (its
parent's turn + 1, or the turn of the evicted leaf it brings back + 1).
Counts halve every HALFLIFE new leaves; a class with fewer than MIN_STARTS
gets the pooled share. "Came back": a lookup through it (its next push sees
``node.freq`` moved), or a new leaf covering its end after it was evicted
(a ghost of ends: last page and namespace, bounded by ghosts.limit). The
turnover needs the store's capacity (``for_store``); a miniature cache
without one takes the most pages it held when it evicted.

Everything is in ticks (the store's logical clock), so replays in process
and through the daemon agree. Cost: one heap entry per candidate change,
O(log n) (keys are fixed when pushed, as ``lru``'s); a new leaf probes the
ghost once per page (what storing them costs anyway). Memory: a small
tuple per node (its ``policy_data``: class, freq, turn, came back), the
ghost, two arrays of CLASSES counts. Why it was made, and what it measured:
NOTES.md.
"""

from __future__ import annotations

import zlib

from pfxcache.daemon.store.ghosts import Ghost, limit
from pfxcache.daemon.store.policies import HeapPolicy

PAGE_CLASSES = 9  # log2 buckets of pages added: 1, 2-3, .. 128+ (and 0)
TURN_CLASSES = 7  # turns 0 .. 5, 6+
CLASSES = PAGE_CLASSES * TURN_CLASSES
SCALE = 16.0  # a class that always comes back is kept up to SCALE turnovers longer
HORIZON = 8.0  # "came back": within HORIZON turnovers
HALFLIFE = 4096  # new leaves after which counts weigh half
MIN_STARTS = 16.0  # a class with fewer (weighted) leaves gets the pooled share
LEARN_EVERY = 64  # new leaves between recomputations of the boosts
EVICTION_AGE_WEIGHT = 0.01  # EWMA weight of one evicted leaf's age in the typical one
NODE_BYTES = 72  # a node's 4-tuple


def classify(pages: int, turn: int) -> int:
    return min(PAGE_CLASSES - 1, pages.bit_length()) * TURN_CLASSES + min(turn, TURN_CLASSES - 1)


class OddsModel:
    """What the global instance learns and its per-namespace instances read: shares, boosts, the clock."""

    __slots__ = ("boost", "capacity", "full", "eviction_age", "last_new", "news", "now", "pending", "rate_pages",
                 "rate_ticks", "returns", "starts", "late", "back")

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity  # pages of the store (0: not known ...
        self.full = 0  # ... then the most pages cached when an eviction came: full, by definition)
        self.rate_pages = 0.0  # EWMA of the pages of a new leaf ...
        self.rate_ticks = 0.0  # ... and of the ticks between two new leaves
        self.last_new = 0
        self.back = 0.0  # returns seen (weights as the counts) ...
        self.late = 0.0  # ... of which later than the turnover: the ones LRU misses
        self.now = 0
        self.starts = [0.0] * CLASSES
        self.returns = [0.0] * CLASSES
        self.boost = [0.0] * CLASSES  # ticks added to a leaf's key, per class
        self.eviction_age = 0.0
        self.news = 0
        self.pending = 0

    def turnover(self) -> float:
        """Ticks the store takes to fill with new pages: LRU's horizon, whatever the policy keeps."""
        capacity = self.capacity or self.full
        if capacity and self.rate_pages > 0.0:
            return capacity * self.rate_ticks / self.rate_pages
        return self.eviction_age

    def started(self, cls: int, pages: int, tick: int) -> None:
        self.rate_pages += EVICTION_AGE_WEIGHT * (pages - self.rate_pages)
        self.rate_ticks += EVICTION_AGE_WEIGHT * (max(tick - self.last_new, 0) - self.rate_ticks)
        self.last_new = tick
        self.starts[cls] += 1.0
        self.news += 1
        if self.news >= HALFLIFE:
            self.news = 0
            self.starts = [x * 0.5 for x in self.starts]
            self.returns = [x * 0.5 for x in self.returns]
            self.back *= 0.5
            self.late *= 0.5
        self.pending += 1
        if self.pending >= LEARN_EVERY:
            self.learn()

    def returned(self, cls: int, gap: int) -> None:
        turnover = self.turnover()
        if gap <= HORIZON * turnover:
            self.returns[cls] += 1.0
            self.back += 1.0
            self.late += gap > turnover

    def learn(self) -> None:
        self.pending = 0
        total = sum(self.starts)
        pooled = sum(self.returns) / total if total else 0.0
        w = SCALE * self.turnover() * (self.late / self.back if self.back else 1.0)
        self.boost = [w * (min(1.0, r / s) if s >= MIN_STARTS else pooled)
                      for s, r in zip(self.starts, self.returns)]


class OddsPolicy(HeapPolicy):
    """Evict the smallest last access + boost of the leaf's class; see the module docstring."""

    name = "odds"
    summary = ("LRU, each leaf held longer by the learned share of leaves like it, by pages added and turn, "
               "that came back")
    scope_shares_order = True  # keys come from the node and the shared boosts

    def __init__(self, model: OddsModel | None = None, scoped: bool = False) -> None:
        super().__init__()
        self.model = model if model is not None else OddsModel()
        self.scoped = scoped
        # the end of an evicted leaf (crc32 of its last page and namespace) -> (class, last access tick, turn)
        self._ghost = Ghost("qqq")

    @classmethod
    def for_store(cls, capacity: int, page_bytes: int) -> OddsPolicy:
        """The instance for a store of ``capacity`` pages."""
        return cls(OddsModel(capacity))

    def for_scope(self) -> OddsPolicy:
        return OddsPolicy(self.model, scoped=True)

    def describe(self) -> dict:
        m = self.model
        total = sum(m.starts)
        return {"odds_return_share": round(sum(m.returns) / total, 4) if total else 0.0,
                "odds_turnover_ticks": round(m.turnover()), "odds_ghost_entries": len(self._ghost)}

    def memory_bytes(self, nodes: int, pages: int) -> int:
        """Heap entries, ghost and every node's tuple (see policies.HeapPolicy.memory_bytes)."""
        return super().memory_bytes(nodes, pages) + self._ghost.memory_bytes() + nodes * NODE_BYTES

    def key(self, node) -> tuple:  # (HeapPolicy's push uses it)
        data = node.policy_data
        return (node.tick + (self.model.boost[data[0]] if data is not None else 0.0),)

    def push(self, node, uncovered: bool = False) -> None:
        if not self.scoped:
            model = self.model
            if node.tick > model.now:
                model.now = node.tick
            data = node.policy_data
            if data is None:
                node.policy_data = self._start(node)
            elif node.freq != data[1]:
                if not data[3] and node.gap:  # its first return since it was stored
                    model.returned(data[0], node.gap)
                node.policy_data = (data[0], node.freq, data[2], True)
        super().push(node, uncovered)

    def split(self, top, child, pages: int) -> None:
        """The upper part of a cut edge starts with no state of its own (set when it is pushed)."""

    def _start(self, node) -> tuple:
        """(class, freq, turn, came back) of a node the policy has not seen: a new leaf, or an inner one uncovered."""
        parent = node.parent
        prev = parent.policy_data if parent is not None and parent.parent is not None else None
        turn = prev[2] + 1 if prev is not None else (1 if parent is not None and parent.parent is not None else 0)
        pages = len(node.blocks)
        if node.freq or node.children:  # an inner node uncovered (a split's upper part): not a new access
            return (classify(pages, turn), node.freq, turn, True)
        back = self._returned(node)
        if back is not None:
            cls, tick, old_turn, after = back
            self.model.returned(cls, max(node.tick - tick, 1))
            turn, pages = old_turn + 1, after
        cls = classify(pages, turn)
        self.model.started(cls, len(node.blocks), node.tick)
        return (cls, node.freq, turn, False)

    def _returned(self, node):
        """The ghost entry of the deepest evicted end on ``node``'s edge (popped) and the pages after it, or None."""
        ghost = self._ghost
        if not ghost:
            return None
        tree = node.tree
        P = tree.page_bytes
        key = node.key
        seed = zlib.crc32(tree.scope)
        crc32 = zlib.crc32
        pop = ghost.pop
        end = len(key)
        for start in range(end - P, -1, -P):
            seen = pop(crc32(key[start : start + P], seed))
            if seen is not None:
                return (*seen, (end - start) // P - 1)
        return None

    def evicted(self, node, whole: bool) -> None:
        if not whole or self.scoped:
            return
        data = node.policy_data
        model = self.model
        if node.tree.totals.pages > model.full:
            model.full = node.tree.totals.pages
        model.eviction_age += EVICTION_AGE_WEIGHT * (max(model.now - node.tick, 0) - model.eviction_age)
        if data is None:
            return
        tree = node.tree
        h = zlib.crc32(node.key[-tree.page_bytes :], zlib.crc32(tree.scope))
        ghost = self._ghost
        ghost.put(h, data[0], node.tick, data[2])
        ghost.trim(limit(self.live))
