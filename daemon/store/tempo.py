"""The ``tempo`` eviction policy: every conversation kept as long as its own pace says it comes back.

In multi-turn chat the users set the pace: one answers within seconds, the
next after minutes, and each keeps their pace turn after turn. LRU treats
them alike, so in a small arena the slow ones push out the fast ones before
they come back, and neither hits. ``tempo`` learns each conversation's pace
(the gaps, in ticks, between its turns) and evicts first what is least likely
to come back soon per page held: the largest of

    pace x max(1, age / pace) ** OVERDUE

over the candidates, where age = ticks since the last access. A leaf not yet
overdue (age < pace) scores its pace: the slowest conversations go first; a
leaf long overdue (its user left) scores more the longer it stays away, and
goes first too. Content with no known pace (a new conversation, a one-off
prompt) gets DEFAULT_PACE x the typical pace seen so far; when every pace is
the same, the order is LRU's.

Where a pace comes from (in ticks, so replays in process and through the
daemon agree): a new leaf below a private parent that was just hit (the next
turn) takes the parent's gap; a leaf hit again takes its new gap; a new leaf
whose first page is in the ghost of recently evicted leaves (the
conversation came back after it was evicted) takes the time since its last
access then. Each new gap is blended into the conversation's previous pace
in log space (weight SMOOTH): one gap alone predicts the next poorly.

Cost: candidates are bucketed by half-octaves of their pace, one lazy heap
of access ticks per bucket; inside a bucket paces differ by less than
sqrt(2), so the oldest is (within that factor) the best there, and a victim
is the best of the bucket heads: O(buckets + log n) per eviction, O(log n)
per access, like ``hybrid``. Memory: one (pace, freq) pair per node
(``Node.tempo``) and a ghost bounded as ``ghost``'s. Per-namespace instances
(EVICT commands) order by the paces the global instance set.
"""

from __future__ import annotations

import heapq
import itertools
import math
import zlib
from collections import OrderedDict

from .policies import _COMPACT_SLACK, GHOST_MAX, GHOST_MIN, GHOST_PER_LEAF

PACE_BUCKETS = 48  # half-octave buckets of a pace in ticks: up to 2**24 ticks
OVERDUE = 2.0  # how fast an overdue leaf's score grows with age / pace
SMOOTH = 0.5  # weight of the newest gap in a conversation's pace (log space)
DEFAULT_PACE = 1.0  # new content: this x its typical return gap / the share of it that returns
MIN_SHARE = 0.02  # ... that share counted as at least this
HALFLIFE = 2048  # new leaves after which the counts of new content weigh half


def _bucket(pace: float) -> int:
    return min(PACE_BUCKETS - 1, int(2 * math.log2(pace))) if pace > 1.0 else 0


def _blend(gap: float, pace: float) -> float:
    """The newest gap blended into the previous pace, in log space."""
    return math.exp(SMOOTH * math.log(gap) + (1.0 - SMOOTH) * math.log(pace))


class PaceModel:
    """What the global instance learns and its per-namespace instances share: the clock, new content's pace.

    New content (no pace of its own yet) gets the typical gap after which new content came back, divided by
    the share of it that came back at all (counts that halve every HALFLIFE new leaves): where most new
    content never returns, it goes before the conversations that do.
    """

    __slots__ = ("log_gap", "news", "now", "returns")

    def __init__(self) -> None:
        self.now = 0  # latest tick pushed
        self.news = 0.0  # new leaves given the default pace
        self.returns = 0.0  # ... that came back (a hit, a next turn, through the ghost)
        self.log_gap = 0.0  # mean log of their first return gaps (weights as the counts)

    def new(self) -> None:
        self.news += 1.0
        if self.news >= 2 * HALFLIFE:
            self.news *= 0.5
            self.returns *= 0.5

    def returned(self, gap: int) -> None:
        self.returns += 1.0
        self.log_gap += (math.log(max(gap, 1)) - self.log_gap) / max(self.returns, 1.0)

    def default(self) -> float:
        if self.returns < 1.0:
            return 1.0
        share = min(1.0, self.returns / max(self.news, 1.0))
        return DEFAULT_PACE * math.exp(self.log_gap) / max(share, MIN_SHARE)


class TempoPolicy:
    """Evict the largest pace x max(1, age / pace) ** OVERDUE; see the module docstring."""

    name = "tempo"
    scope_shares_order = True  # a namespace's instance orders by the paces this one set

    def __init__(self, model: PaceModel | None = None, scoped: bool = False) -> None:
        self.model = model if model is not None else PaceModel()
        self.scoped = scoped
        self._buckets: list[list[tuple]] = [[] for _ in range(PACE_BUCKETS)]
        self._seq = itertools.count()
        self.live = 0
        self._entries = 0
        # first page (in its namespace) of an evicted leaf -> (tick of its last access, its pace)
        self._ghost: OrderedDict[int, tuple[int, float, bool]] = OrderedDict()

    def for_scope(self) -> TempoPolicy:
        """The instance for one namespace's index: the same paces and clock, no learning."""
        return TempoPolicy(self.model, scoped=True)

    def describe(self) -> dict:
        return {"tempo_new_content_pace_ticks": round(self.model.default()), "tempo_ghost_entries": len(self._ghost)}

    @staticmethod
    def _ghost_key(node) -> int:
        tree = node.tree
        return zlib.crc32(node.key[: tree.page_bytes], zlib.crc32(tree.scope))

    def _pace(self, node, uncovered: bool) -> tuple[float, bool]:
        """(the pace of ``node``'s latest access, whether it is new content's default); teaches the model."""
        model = self.model
        data = node.tempo
        if data is not None:
            pace, freq, new = data
            if node.freq != freq and not uncovered and node.gap:  # hit again since
                if new:
                    model.returned(node.gap)
                return _blend(node.gap, pace) if not new else float(node.gap), False
            return pace, new
        if node.freq or node.children:  # an inner node or a hit the policy never saw (a policy switch)
            return (float(node.gap), False) if node.gap else (model.default(), False)
        parent = node.parent
        if parent.parent is not None and len(parent.children) == 1 and parent.gap:
            # the next turn of a conversation: its parent came back after parent.gap ticks
            prev = parent.tempo
            if prev is None or prev[2]:
                if prev is not None and prev[1] == parent.freq - 1:
                    model.returned(parent.gap)
                return float(parent.gap), False
            return _blend(parent.gap, prev[0]), False
        seen = self._ghost.pop(self._ghost_key(node), None)
        if seen is not None:  # back after it was evicted
            gap = max(node.tick - seen[0], 1)
            if seen[2]:
                model.returned(gap)
                return float(gap), False
            return _blend(gap, seen[1]), False
        model.new()
        return model.default(), True

    def push(self, node, uncovered: bool = False) -> None:
        tick = node.tick
        if self.scoped:
            data = node.tempo
            pace = data[0] if data is not None else self.model.default()
        else:
            if tick > self.model.now:
                self.model.now = tick
            pace, new = self._pace(node, uncovered)
            node.tempo = (pace, node.freq, new)
        heapq.heappush(self._buckets[_bucket(pace)], (tick, next(self._seq), pace, node.version, node))
        self.live += 1
        self._entries += 1

    def evicted(self, node, whole: bool) -> None:
        """A ``whole`` evicted leaf goes into the ghost with its last access and pace."""
        if not whole or self.scoped:
            return
        data = node.tempo
        ghost = self._ghost
        h = self._ghost_key(node)
        ghost[h] = (node.tick, data[0], data[2]) if data is not None else (node.tick, self.model.default(), True)
        ghost.move_to_end(h)
        limit = max(GHOST_MIN, min(GHOST_PER_LEAF * self.live, GHOST_MAX))
        while len(ghost) > limit:
            ghost.popitem(last=False)

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
        """The next victim (ages in the model's ticks, not ``now``: the same in process and in the daemon)."""
        now = self.model.now
        best = None
        best_score = -1.0
        for heap in self._buckets:
            while heap and heap[0][-2] != heap[0][-1].version:
                heapq.heappop(heap)
                self._entries -= 1
            if heap:
                tick, _, pace, _, node = heap[0]
                late = (now - tick) / pace
                score = pace * late**OVERDUE if late > 1.0 else pace
                if score > best_score:  # strict: on ties the faster bucket goes first
                    best, best_score = node, score
        return best

    def nodes(self) -> list:
        return [e[-1] for heap in self._buckets for e in heap if e[-2] == e[-1].version]

    def pushed(self) -> list:
        entries = sorted((e for heap in self._buckets for e in heap), key=lambda e: e[1])
        return [e[-1] for e in entries if e[-2] == e[-1].version]
