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
goes first too. New content (no pace of its own yet: a new conversation, a
one-off prompt) gets the typical gap after which new content came back,
divided by the share of new content that came back at all: where most of it
never returns it goes before the conversations that do. When every pace is
the same, the order is LRU's.

Where a pace comes from (in ticks, so replays in process and through the
daemon agree): a leaf hit again takes its new gap; a new leaf below a private
parent that ended the access before and was just hit (the next turn) takes
the parent's gap; a new leaf that covers the end of a recently evicted leaf
(the conversation came back after it was evicted: its ghost, keyed by the
last page, its depth and the namespace) takes the time since that leaf's last
access. A shared prompt whose other continuations were all evicted is private
too, but ended no access of its own: a conversation starting on it is new
content, not its next turn (so the ghost is keyed by last pages, not first
pages: every conversation on one system prompt shares its first page).
Each new gap is blended into the conversation's pace in log space: the mean
of its log gaps, then an EWMA of weight SMOOTH (one gap alone predicts the
next poorly).

Dead tails: where a prompt ends in tokens the next turn does not share (a
per-request suffix, or a partial last block cut into smaller pages), the
next turn forks off a few pages before the end of the leaf the access before
ended on. Its parent is then the upper part of that leaf, cut by the lookup,
with two children, and it looks like another conversation starting on a
shared prompt; and the ghost, keyed by the evicted leaf's last page, a dead
one, never sees the conversation come back. So a fork off the leaf that
ended the access before is a next turn when it adds at least TAIL_SHARE x
the pages it leaves behind (an answer and a new message against a dead tail;
another conversation on a shared prompt adds about what the first one had
there: its own message) and leaves at most ``PaceModel.tail`` pages,
learned: 0 until at least TAIL_FORKS of the next turns fork off, then as
many as TAIL_QUANTILE of those forks leave. Where none fork off, nothing
changes. A whole evicted leaf's ghost is keyed that many pages before its
end as well (a second entry in the same bounded ghost).

Cost: candidates are bucketed by half-octaves of their pace, one lazy heap
of access ticks per bucket; inside a bucket paces differ by less than
sqrt(2), so the oldest is (within that factor) the best there, and a victim
is the best of the bucket heads: O(buckets + log n) per eviction, O(log n)
per access, like ``hybrid``; a new leaf looks its pages up in the ghost
(O(its pages), what storing them costs anyway), a fork looks at its
parent's other child, and both a new leaf and an evicted one walk to the
root for their depth. Memory: a small tuple per node (its ``policy_data``:
pace, freq, gaps, tick, whether it ended an access), a bounded ghost
(ghosts.limit), and 64 counts of what next turns left behind. Per-namespace
instances (EVICT commands) order by the paces the global instance set.
"""

from __future__ import annotations

import math
import zlib

from .ghosts import Ghost, limit
from .policies import BucketedHeaps
from .policy import OWN, NodeState

PACE_BUCKETS = 48  # half-octave buckets of a pace in ticks: up to 2**24 ticks
OVERDUE = 2.0  # how fast an overdue leaf's score grows with age / pace
SMOOTH = 0.5  # weight of the newest gap in a conversation's pace (log space)
MIN_SHARE = 0.02  # new content's pace: its typical return gap / the share that returns, at least this share
HALFLIFE = 2048  # new leaves after which the counts of new content weigh half
PACE_BYTES = 104  # a node's tuple and its pace float (INFO's used_memory_policy)
TAIL_CLASSES = 64  # pages a next turn left behind of the access before, counted up to this many
TAIL_SHARE = 4  # a next turn adds at least 4x the pages it leaves behind (another request: about as many)
TAIL_FORKS = 0.15  # a dead tail once this share of next turns fork off before the end ...
TAIL_QUANTILE = 0.9  # ... as long as this share of those forks leave behind


def _bucket(pace: float) -> int:
    return min(PACE_BUCKETS - 1, int(2 * math.log2(pace))) if pace > 1.0 else 0


def _blend(gap: int, pace: float, gaps: int) -> tuple[float, int]:
    """A conversation's pace over ``gaps`` gaps with one more: the running mean of log gaps, then an EWMA."""
    w = max(SMOOTH, 1.0 / (gaps + 1))
    return math.exp(w * math.log(max(gap, 1)) + (1.0 - w) * math.log(pace)), gaps + 1


class PaceModel:
    """What the global instance learns and its per-namespace instances share: the clock, new content's pace.

    New content (no pace of its own yet) gets the typical gap after which new content came back, divided by
    the share of it that came back at all (counts that halve every HALFLIFE new leaves): where most new
    content never returns, it goes before the conversations that do.
    """

    __slots__ = ("log_gap", "news", "now", "returns", "tails", "_turns", "tail")

    def __init__(self) -> None:
        self.now = 0  # latest tick pushed
        self.news = 0.0  # new leaves given the default pace
        self.returns = 0.0  # ... that came back (a hit, a next turn, through the ghost)
        self.log_gap = 0.0  # mean log of their first return gaps (weights as the counts)
        # next turns by the pages they left behind of the access before (0: it went on from its end),
        # halving every HALFLIFE of them; ``tail``: the dead tail those that forked off left (0: none)
        self.tails = [0.0] * TAIL_CLASSES
        self._turns = 0
        self.tail = 0

    def turned(self, left: int) -> None:
        """A next turn went on from ``left`` pages before the end of the access before."""
        tails = self.tails
        tails[min(left, TAIL_CLASSES - 1)] += 1.0
        self._turns += 1
        if self._turns % 64 == 0:  # (the tail moves slowly: a histogram walk now and then)
            if self._turns >= 2 * HALFLIFE:
                self._turns = HALFLIFE
                for i, n in enumerate(tails):
                    tails[i] = 0.5 * n
            forks = sum(tails) - tails[0]
            tail = 0
            if forks >= TAIL_FORKS * (forks + tails[0]):
                seen = 0.0
                for tail in range(1, TAIL_CLASSES):
                    seen += tails[tail]
                    if seen >= TAIL_QUANTILE * forks:
                        break
            self.tail = tail

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
        return math.exp(self.log_gap) / max(share, MIN_SHARE)


class TempoPolicy(BucketedHeaps):
    """Evict the largest pace x max(1, age / pace) ** OVERDUE; see the module docstring."""

    name = "tempo"
    summary = ("each conversation kept as long as its own pace of turns says it comes back: "
               "the slowest and the long overdue go first")
    scope_shares_order = True  # a namespace's instance orders by the paces this one set

    def __init__(self, model: PaceModel | None = None, scoped: bool = False, state: NodeState = OWN) -> None:
        """``state``: where the node state lives (the guard runs tempo as one of its experts)."""
        self.model = model if model is not None else PaceModel()
        self.scoped = scoped
        self.state = state
        self._data = state.get  # a node's (pace, freq, gaps, tick, ended an access), or None
        self._keep = state.put
        super().__init__(PACE_BUCKETS)
        # the end of an evicted leaf (last page, depth, namespace) -> (its last access tick, pace, gaps, ended one)
        self._ghost = Ghost("qdq?")

    def for_scope(self) -> TempoPolicy:
        """The instance for one namespace's index: the same paces and clock, no learning."""
        return TempoPolicy(self.model, scoped=True, state=self.state)

    def describe(self) -> dict:
        return {"tempo_new_content_pace_ticks": round(self.model.default()), "tempo_ghost_entries": len(self._ghost),
                "tempo_dead_tail_pages": self.model.tail}

    def memory_bytes(self, nodes: int, pages: int) -> int:
        """Buckets, ghost and every node's tuple (see policies.HeapPolicy.memory_bytes)."""
        return super().memory_bytes(nodes, pages) + self._ghost.memory_bytes() + nodes * PACE_BYTES

    @staticmethod
    def _page_key(scope: bytes, page: bytes, depth: int) -> int:
        """A ghost key: a page, its depth in pages from the root and its namespace (a shared first page, as
        every conversation on one system prompt has, is not enough: the end of a conversation is its own)."""
        return zlib.crc32(page, (zlib.crc32(scope) + depth) & 0xFFFFFFFF)

    def _returned(self, node):
        """The ghost entry of the deepest evicted leaf whose end lies on ``node``'s new edge (popped), or None."""
        ghost = self._ghost
        if not len(ghost):
            return None
        tree = node.tree
        P = tree.page_bytes
        key = node.key
        seed = zlib.crc32(tree.scope) + tree.depth_pages(node)  # + depth: the last page's key
        crc32 = zlib.crc32
        end = len(key)
        for start in range(end - P, -1, -P):
            h = crc32(key[start : start + P], (seed - (end - P - start) // P) & 0xFFFFFFFF)
            if h in ghost:
                return ghost.pop(h)
        return None

    def _left_behind(self, node):
        """(pace, gaps) of the access before if ``node`` is its next turn that went on a few pages before its
        end (it left a dead tail: tokens unique to that request), else None; teaches the model either way.

        Its parent was cut from the leaf that ended the access before (the lookup's split: the other child,
        the leaf's rest, still holds that access's tick and data) and was just hit. A next turn is told from
        another conversation starting on a shared prompt by what it adds (TAIL_SHARE x what it left, at
        least) and what it left (``model.tail`` pages at most; see the module docstring).
        """
        parent = node.parent
        data_of = self._data
        if parent.parent is None or data_of(parent) is not None or len(parent.children) != 2 or not parent.gap:
            return None
        for rest in parent.children.values():
            if rest is not node:
                break
        data = data_of(rest)
        if (data is None or rest.children or not data[4] or rest.freq != data[1]
                or data[3] != rest.tick or rest.tick != parent.tick - parent.gap):
            return None
        left = len(rest.blocks)
        if TAIL_SHARE * left > len(node.blocks):  # it adds about what the other one left: a shared prompt's
            return None
        self.model.turned(left)
        return (data[0], data[2]) if left <= self.model.tail else None

    def _came_back(self, gap: int, pace: float, gaps: int) -> tuple[float, int, bool]:
        """_pace's answer for content back after ``gap`` ticks, whose pace so far was ``pace`` over ``gaps`` gaps
        (0: it was new content, and its first return teaches the model)."""
        if not gaps:
            self.model.returned(gap)
            return float(gap), 1, True
        return (*_blend(gap, pace, gaps), True)

    def _pace(self, node, uncovered: bool) -> tuple[float, int, bool]:
        """(the pace of ``node``'s latest access, the gaps it is made of (0: new content), whether it ended an
        access of its own); teaches the model."""
        model = self.model
        data_of = self._data
        data = data_of(node)
        if data is not None:
            pace, freq, gaps, _, end = data
            if node.freq != freq and not uncovered and node.gap:  # hit again since
                return self._came_back(node.gap, pace, gaps)
            return pace, gaps, end
        if node.freq or node.children:
            # an inner node uncovered (a shared prefix, a split's upper part: no access of its own ended
            # there), or a hit the policy never saw (a policy switch)
            return (float(node.gap), 1, False) if node.gap else (model.default(), 0, False)
        parent = node.parent
        prev = data_of(parent)
        if (prev is not None and parent.parent is not None and len(parent.children) == 1 and parent.gap
                and prev[3] in (parent.tick - parent.gap, parent.tick)):
            # The next turn of a conversation: its parent, the end of the access before (it was indexed
            # as a leaf then, not passed through by others since), came back after parent.gap ticks.
            # (A shared prompt whose other continuations were evicted is private too, but not an end.)
            if prev[1] == parent.freq - 1:  # (else a lookup without a lease re-indexed the parent: counted then)
                model.turned(0)
                return self._came_back(parent.gap, prev[0], prev[2])
            return prev[0], prev[2], True
        behind = self._left_behind(node)
        if behind is not None:
            return self._came_back(parent.gap, *behind)
        seen = self._returned(node)
        if seen is not None and seen[3]:  # back after it was evicted (a shared prefix's return is not its own)
            tick, pace, gaps, _ = seen
            return self._came_back(max(node.tick - tick, 1), pace, gaps)
        model.new()
        return model.default(), 0, True

    def push(self, node, uncovered: bool = False) -> None:
        tick = node.tick
        if self.scoped:
            data = self._data(node)
            pace = data[0] if data is not None else self.model.default()
        else:
            if tick > self.model.now:
                self.model.now = tick
            pace, gaps, end = self._pace(node, uncovered)
            self._keep(node, (pace, node.freq, gaps, tick, end))
        self._file(_bucket(pace), (tick, next(self._seq), pace, node.version, node))

    def evicted(self, node, whole: bool) -> None:
        """A ``whole`` evicted leaf goes into the ghost with its last access and pace."""
        if not whole or self.scoped:
            return
        data = self._data(node)
        ghost = self._ghost
        tree = node.tree
        P = tree.page_bytes
        depth = tree.depth_pages(node)
        h = self._page_key(tree.scope, node.key[-P:], depth)
        if data is not None:
            ghost.put(h, node.tick, data[0], data[2], data[4])
            tail = self.model.tail
            if tail and data[4] and len(node.blocks) > tail:  # its next turn may leave the last pages behind
                ghost.put(self._page_key(tree.scope, node.key[-(tail + 1) * P : -tail * P], depth - tail),
                          node.tick, data[0], data[2], data[4])
        else:
            ghost.put(h, node.tick, 1.0, 0, False)
        ghost.trim(limit(self.live))

    def split(self, top, child, pages: int) -> None:
        """The upper part of a cut edge ended no access of its own: it gets no pace (until pushed)."""

    def peek(self, now: float):
        """The next victim (ages in the model's ticks, not ``now``: the same in process and in the daemon)."""
        now = self.model.now
        best = None
        best_score = -1.0
        for tick, _, pace, _, node in self._heads():
            late = (now - tick) / pace
            score = pace * late**OVERDUE if late > 1.0 else pace
            if score > best_score:  # strict: on ties the faster bucket goes first
                best, best_score = node, score
        return best
