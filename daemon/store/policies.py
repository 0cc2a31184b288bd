"""The generic eviction policies (lru, lfu, hybrid, ghost) and the index of eviction candidates.

Candidates are the unpinned leaves of every tree. The radix tree tells the
index whenever a node enters or leaves that set (or, by leaving and entering
again, when its priority changes), so picking the next victim never walks the
tree: it costs O(log n) for lru, lfu and ghost, O(buckets + log n) for
hybrid. The learned policies live next to what they learn from: ``reuse`` in
reuse.py, ``guard`` in guard.py; registry.py names them all.

Heaps use lazy deletion: every entry records the node's ``version`` when it was
pushed; any change bumps the version, so stale entries are recognised and
skipped when they reach the top, and the heap is compacted when they dominate.
A heap policy keeps its entries in two parts: a queue of entries pushed in
ascending order (an access makes a node the most recently used: its new key
is the largest, so most pushes of lru land there, in O(1)) and a heap for
the rest (a parent uncovered by an eviction, a node unpinned, lfu's keys).
The next victim is the smaller of the two heads, so the order is exactly
one heap's; a stale entry leaves the queue in O(1), not O(log n) -- and
every access leaves one.

A policy instance exists globally (for evictions on allocation and the
watermark) and per scope (namespace), for EVICT commands on one namespace
(``for_scope()`` when a policy shares state between the two).
Policies are looked up in ``registry.POLICIES``; nothing else branches on their names.
"""

from __future__ import annotations

import heapq
import itertools
import zlib
from collections import OrderedDict, deque

_COMPACT_SLACK = 64
HYBRID_BUCKETS = 33  # freq.bit_length() of 0 .. 2**32-1, capped
# What INFO's used_memory_policy counts per entry of an order (its tuple, list slot and push
# number; stale entries too), as pfxcache.tools.policy_memory measures it on CPython 3.11
ORDER_ENTRY_BYTES = 100


class SharedSeq:
    """A tie-breaker count several orders share: ``next()`` gives the number their owner set for this push.

    Orders fed the same pushes (guard's experts) count the same numbers; one int object per push
    for all of them instead of one each (28 bytes an entry of every order but one).
    """

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def __next__(self) -> int:
        return self.value

    @classmethod
    def share(cls, orders) -> SharedSeq:
        """One SharedSeq for those of ``orders`` that number pushes with an itertools.count of their own."""
        seq = cls()
        for order in orders:
            if isinstance(getattr(order, "_seq", None), itertools.count):
                order._seq = seq
        return seq


class HeapPolicy:
    """Base of policies whose priority is time-invariant: one lazy heap, smallest key evicted first."""

    name = "abstract"
    scope_shares_order = False  # see LRUPolicy

    def __init__(self) -> None:
        # Entries are (key..., seq, version, node); seq is unique, so two entries never compare nodes.
        self._heap: list[tuple] = []  # entries pushed out of order (subclasses may heappush here directly)
        self._run: deque[tuple] = deque()  # entries pushed in ascending order: a sorted queue
        self._seq = itertools.count()  # unique tie-breaker: nodes themselves are never compared
        self.live = 0
        self._heaped = None  # the latest entry filed into the heap, while it may be the latest push
        self._heap_stale = 0  # heap entries seen going stale since the heap was last compacted

    @staticmethod
    def key(node) -> tuple:
        raise NotImplementedError

    def push(self, node, uncovered: bool = False) -> None:
        """Index an evictable node (its version was just bumped); ``uncovered``: its last child was evicted."""
        self._enqueue((*self.key(node), next(self._seq), node.version, node))
        self.live += 1

    def _enqueue(self, entry: tuple) -> None:
        """File a new entry: at the end of the queue when no queued entry is larger, else into the heap."""
        run = self._run
        if not run or entry > run[-1]:
            run.append(entry)
            self._heaped = None
        else:
            heapq.heappush(self._heap, entry)
            self._heaped = entry

    def drop(self) -> None:
        """One indexed node left the candidate set (its version was bumped, so its entry is stale)."""
        self.live -= 1
        heaped = self._heaped
        if heaped is not None and heaped[-2] != heaped[-1].version:
            # Filed into the heap and dropped right away: an insert unpins its prefix (the leaf
            # re-enters with its old key) and touches it at once. Such entries have old keys and
            # would be popped one by one ahead of the next victims: past half the heap, filter it
            # (O(heap), paid for by the drops counted since the last time).
            self._heaped = None
            self._heap_stale += 1
            if self._heap_stale > len(self._heap) // 2 + _COMPACT_SLACK:
                self._compact_heap()
        if len(self._heap) + len(self._run) > 2 * self.live + _COMPACT_SLACK:
            self._compact_heap()
            self._run = deque(e for e in self._run if e[-2] == e[-1].version)  # still sorted

    def _compact_heap(self) -> None:
        self._heap = [e for e in self._heap if e[-2] == e[-1].version]
        heapq.heapify(self._heap)
        self._heap_stale = 0

    def _top(self):
        """The smallest valid entry (it stays indexed), or None; stale entries ahead of it are dropped."""
        heap, run = self._heap, self._run
        while heap:
            entry = heap[0]
            if entry[-2] == entry[-1].version:
                break
            heapq.heappop(heap)
        while run:
            entry = run[0]
            if entry[-2] == entry[-1].version:
                return heap[0] if heap and heap[0] < entry else entry
            run.popleft()
        return heap[0] if heap else None

    def peek(self, now: float):
        """The node to evict next, or None; the node stays indexed."""
        entry = self._top()
        return entry[-1] if entry is not None else None

    def _entries(self) -> list:
        return [e for part in (self._heap, self._run) for e in part if e[-2] == e[-1].version]

    def nodes(self) -> list:
        """The indexed (valid) nodes, for consistency checks."""
        return [e[-1] for e in self._entries()]

    def pushed(self) -> list:
        """The indexed (valid) nodes in the order they were pushed."""
        return [e[-1] for e in sorted(self._entries(), key=lambda e: e[-3])]

    def memory_bytes(self, nodes: int, pages: int) -> int:
        """About what the policy holds for a store of ``nodes`` nodes and ``pages`` pages (INFO)."""
        return (len(self._heap) + len(self._run)) * ORDER_ENTRY_BYTES


class LRUPolicy(HeapPolicy):
    """Least recently used first."""

    name = "lru"
    # A namespace's own instance evicts exactly as this one does (keys from the node, ties by
    # push order, no state of its own): while one namespace has candidates, both can be this one.
    scope_shares_order = True

    @staticmethod
    def key(node) -> tuple:
        return (node.last_access,)


class LFUPolicy(HeapPolicy):
    """Least frequently hit first; the older of equally frequent nodes first."""

    name = "lfu"
    scope_shares_order = True

    @staticmethod
    def key(node) -> tuple:
        return (node.freq, node.last_access)


def _bucket(freq: int) -> int:
    return min(freq.bit_length(), HYBRID_BUCKETS - 1)


class BucketedHeaps:
    """Heaps of ``(key, seq, ..., version, node)`` entries, one per bucket, for scores no single heap can hold.

    A subclass files entries with :meth:`_file` and scores the live bucket heads that :meth:`_heads`
    gives; stale entries (their node's version moved on) are dropped on the way and compacted away
    once they outnumber the live ones.
    """

    def __init__(self, nbuckets: int) -> None:
        self._buckets: list[list[tuple]] = [[] for _ in range(nbuckets)]
        self._seq = itertools.count()
        self.live = 0
        self._entries = 0

    def _file(self, bucket: int, entry: tuple) -> None:
        heapq.heappush(self._buckets[bucket], entry)
        self.live += 1
        self._entries += 1

    def drop(self) -> None:
        self.live -= 1
        if self._entries > 2 * self.live + _COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        self._entries = 0
        for i, heap in enumerate(self._buckets):
            kept = [e for e in heap if e[-2] == e[-1].version]
            heapq.heapify(kept)
            self._buckets[i] = kept
            self._entries += len(kept)

    def _heads(self) -> list[tuple]:
        """The live head entry of each non-empty bucket, in bucket order."""
        heads = []
        for heap in self._buckets:
            while heap and heap[0][-2] != heap[0][-1].version:
                heapq.heappop(heap)
                self._entries -= 1
            if heap:
                heads.append(heap[0])
        return heads

    def nodes(self) -> list:
        return [e[-1] for heap in self._buckets for e in heap if e[-2] == e[-1].version]

    def pushed(self) -> list:
        entries = sorted((e for heap in self._buckets for e in heap), key=lambda e: e[1])
        return [e[-1] for e in entries if e[-2] == e[-1].version]

    def memory_bytes(self, nodes: int, pages: int) -> int:
        """About what the policy holds (see HeapPolicy.memory_bytes)."""
        return self._entries * ORDER_ENTRY_BYTES


class HybridPolicy(BucketedHeaps):
    """Evict the highest age / (freq + 1) (the seed article's score).

    The order between two nodes changes as time passes, so no single heap can
    hold it. Nodes are bucketed by log2 of their frequency; inside a bucket
    frequencies differ by less than 2x, so the oldest node is (within that
    factor) the best there. A victim is the bucket head with the highest
    score, computed with the head's own frequency.
    """

    name = "hybrid"
    scope_shares_order = True

    def __init__(self) -> None:
        super().__init__(HYBRID_BUCKETS)

    def push(self, node, uncovered: bool = False) -> None:
        self._file(_bucket(node.freq), (node.last_access, next(self._seq), node.version, node))

    def peek(self, now: float):
        best = None
        best_score = -1.0
        for last_access, _, _, node in self._heads():
            score = (now - last_access) / (node.freq + 1)
            if score > best_score:  # strict: on ties the lower-frequency bucket goes first
                best, best_score = node, score
        return best


GHOST_MIN = 4096  # ghost entries kept at least (first-page hashes of evicted leaves)
GHOST_PER_LEAF = 4  # ... and up to this many per indexed leaf
GHOST_MAX = 1 << 18  # ... but never more (ghost's ~25 MB; reuse's and tempo's packed records ~45 MB each)
THRASH_ALPHA = 0.01  # weight of one observation in the thrashing estimate (an EWMA)
THRASH_ON = 0.5  # insert cold leaves at the LRU end while the estimate is above this
BIMODAL_SHARE = 1 << 27  # crc32 below this (1 in 32 leaves) still goes in at the MRU end
GHOST_POLICY_ENTRY_BYTES = 100  # an OrderedDict entry of an int key and None


class GhostPolicy(HeapPolicy):
    """LRU with ghost-guided bimodal insertion: scan- and thrash-resistant, O(log n).

    One lazy heap like LRU, but a leaf that nothing marks as valuable may be
    placed at the LRU end (key = the key of the last victim) instead of the
    MRU end, so it is the next to go unless it is hit first. That is the
    bimodal insertion of Qureshi et al. (ISCA 2007) adapted to a prefix tree:

    * a leaf is a *continuation* when its parent is private to it (the
      parent's only child, not the root) and was hit (a multi-turn
      conversation going on), or when the hash of its first page is in the
      *ghost*: the first pages of recently evicted leaves (a prefix that was
      cached, evicted too early, and is back). Continuations always go to the
      MRU end;
    * the other new leaves go to the LRU end only while the cache *thrashes*:
      an EWMA over continuations of "it came back through the ghost" (1) vs
      "it came back as a hit" (0) is above 1/2. A cache that holds its
      working set sees continuations as hits and behaves exactly like LRU;
    * even then 1 leaf in 32 (by its first page's crc32) goes in at the MRU
      end, so new content keeps a way in.

    Priorities depend only on the order of events (never on clock values), so
    replays through the daemon and in process agree. The ghost is bounded:
    max(4096, min(4 x indexed leaves, 2**18)) crc32 values, oldest dropped first.
    """

    name = "ghost"
    # A namespace's instance has a floor and a ghost of its own, set by its evictions (until the
    # first, it holds what the global one would give it: the keys of lru, thrash 0).
    scope_shares_order = False

    def __init__(self) -> None:
        super().__init__()
        self._floor = None  # key of the last victim: "the LRU end"
        self._ghost: OrderedDict[int, None] = OrderedDict()
        self.thrash = 0.0

    @staticmethod
    def _first_page(node) -> int:
        return zlib.crc32(node.key[: node.tree.page_bytes])

    @staticmethod
    def _continues(node) -> bool:
        parent = node.parent
        return (parent is not None and parent.parent is not None and parent.freq > 0
                and len(parent.children) == 1)

    def push(self, node, uncovered: bool = False) -> None:
        key = node.last_access
        if node.freq == 0 and not node.children:  # a leaf never hit: just stored (or a cold parent)
            h = self._first_page(node)
            ghost = h in self._ghost
            continues = self._continues(node)
            if ghost or continues:
                self.thrash += THRASH_ALPHA * ((0.0 if continues else 1.0) - self.thrash)
            elif self.thrash > THRASH_ON and self._floor is not None and h >= BIMODAL_SHARE:
                key = self._floor
        self._enqueue((key, next(self._seq), node.version, node))
        self.live += 1

    def memory_bytes(self, nodes: int, pages: int) -> int:
        return super().memory_bytes(nodes, pages) + len(self._ghost) * GHOST_POLICY_ENTRY_BYTES

    def peek(self, now: float):
        entry = self._top()
        node = entry[-1] if entry is not None else None
        if node is not None:
            key = entry[0]
            if self._floor is None or key > self._floor:
                self._floor = key
            h = self._first_page(node)
            if h not in self._ghost:
                ghost = self._ghost
                ghost[h] = None
                limit = max(GHOST_MIN, min(GHOST_PER_LEAF * self.live, GHOST_MAX))
                while len(ghost) > limit:
                    ghost.popitem(last=False)
        return node


def _ignore(*args) -> None:
    """What the index calls for policies that do not watch lookups and stores."""


def _nothing(now: float) -> None:
    """The victims of a scope with no candidates."""
    return None


class EvictionIndex:
    """The unpinned leaves, indexed by the current policy globally and per scope.

    The radix tree calls ``add``/``remove``; ``node.evictable`` mirrors
    membership. One version counter per node invalidates its entries in both
    the global and the scope structure at once.
    """

    def __init__(self, factory, capacity: int = 0, page_bytes: int = 0) -> None:
        self.capacity = capacity  # pages of the store (policies that simulate a cache need it)
        self.page_bytes = page_bytes
        self._start(factory)

    def _start(self, factory) -> None:
        self.factory = factory
        sized = getattr(factory, "for_store", None)
        self.all = sized(self.capacity, self.page_bytes) if sized is not None else factory()
        self.scopes: dict[bytes, object] = {}
        # While only one namespace has candidates, the global index is its index too: one heap
        # entry per candidate change, not two. ``solo`` names that namespace. A second namespace,
        # or a namespace eviction under a policy whose namespace instances keep state of their
        # own (``scope_shares_order`` False: ghost's floor), first gives it its own index, built
        # in push order from the global one: exactly what it would hold had it been kept all along.
        self._peeks_shared = getattr(factory, "scope_shares_order", False)
        self.solo: bytes | None = None
        # Policies that watch the request stream (guard) get every lookup and store; others pay nothing.
        self.looked_up = getattr(self.all, "looked_up", _ignore)
        self.stored = getattr(self.all, "stored", _ignore)
        self.released = getattr(self.all, "released", _ignore)
        self._evicted = getattr(self.all, "evicted", None)

    @property
    def policy(self) -> str:
        return self.factory.name

    def _scoped(self, scope: bytes):
        index = self.scopes.get(scope)
        if index is None:
            if not self.scopes:
                if self.solo is None or self.solo == scope:
                    self.solo = scope
                    return None
                self._unshare()
            index = self.scopes[scope] = self._new_scoped()
        return index

    def _new_scoped(self):
        for_scope = getattr(self.all, "for_scope", None)
        return for_scope() if for_scope is not None else self.factory()

    def _unshare(self) -> None:
        """A second namespace gets candidates: the solo one gets its own index, in the same order."""
        scope, self.solo = self.solo, None
        index = self.scopes[scope] = self._new_scoped()
        for node in self.all.pushed():  # push order: ties break as they would have
            if node.tree.scope == scope:  # (the node being added is the other namespace's)
                index.push(node)

    def add(self, node, uncovered: bool = False) -> None:
        """``node`` became an unpinned leaf (or its priority changed after remove()).

        ``uncovered``: it became a leaf because its last child was evicted (not an access).
        """
        node.version += 1
        node.evictable = True
        self.all.push(node, uncovered)
        scope = node.tree.scope
        if scope != self.solo:
            index = self._scoped(scope)
            if index is not None:
                index.push(node, uncovered)

    def evicted(self, node, whole: bool) -> None:
        """Pages of ``node`` are being evicted (by policy or by command): its tail, or ``whole`` it."""
        if self._evicted is not None:
            self._evicted(node, whole)

    def remove(self, node) -> None:
        """``node`` is no longer an unpinned leaf (pinned, got a child, left the tree, or is being touched)."""
        node.version += 1
        node.evictable = False
        self.all.drop()
        scope = node.tree.scope
        if scope != self.solo:
            self.scopes[scope].drop()

    def forget_scope(self, scope: bytes) -> None:
        """Drop the (empty) index of a namespace that no longer exists."""
        if scope == self.solo:
            if not self.all.live:
                self.solo = None
            return
        index = self.scopes.get(scope)
        if index is not None and not index.live:
            del self.scopes[scope]

    def describe(self) -> dict:
        """Policy-specific figures (what a learning policy has learned); empty for the others."""
        describe = getattr(self.all, "describe", None)
        return describe() if describe is not None else {}

    def memory_bytes(self, nodes: int, pages: int) -> int:
        """About what the policy holds globally and per namespace (INFO's used_memory_policy); 0 for a
        policy that does not say."""
        total = 0
        for policy in (self.all, *self.scopes.values()):
            estimate = getattr(policy, "memory_bytes", None)
            if estimate is not None:
                total += estimate(nodes, pages) if policy is self.all else estimate(0, 0)
        return total

    def best(self, now: float, scope: bytes | None = None):
        """The next victim, globally or within one scope; None when nothing is evictable."""
        if scope is None:
            return self.all.peek(now)
        if scope == self.solo:
            if self._peeks_shared:
                return self.all.peek(now)
            self._unshare()
        index = self.scopes.get(scope)
        return index.peek(now) if index is not None else None

    def victims(self, scope: bytes | None = None):
        """``best`` for one eviction loop over ``scope``: a function of ``now`` giving the next victim.

        Resolved once per loop: evicting only ever indexes parents of the scope's own victims,
        which changes neither which index serves the scope nor whether it shares the global one.
        """
        if scope is None:
            return self.all.peek
        if scope == self.solo:
            if not self._peeks_shared:
                self._unshare()
            else:
                return self.all.peek
        index = self.scopes.get(scope)
        return index.peek if index is not None else _nothing

    def rebuild(self, factory, nodes) -> None:
        """Switch policy (a class of the registry): index ``nodes`` (every current candidate) afresh, O(n log n)."""
        self._start(factory)
        for node in nodes:
            self.add(node)

    def check(self, expected: set) -> list[str]:
        """Compare the indexed nodes with the set of unpinned leaves computed from the trees."""
        problems = []
        indexed = self.all.nodes()
        if len(indexed) != len(set(map(id, indexed))):
            problems.append("a node has two valid entries in the global index")
        if {id(n) for n in indexed} != {id(n) for n in expected}:
            problems.append(f"global index holds {len(indexed)} candidates, trees have {len(expected)} unpinned leaves")
        if self.all.live != len(expected):
            problems.append(f"global index live count {self.all.live} != {len(expected)}")
        by_scope: dict[bytes, set] = {}
        for node in expected:
            by_scope.setdefault(node.tree.scope, set()).add(id(node))
            if not node.evictable:
                problems.append("an unpinned leaf is not flagged evictable")
        for scope, index in self.scopes.items():
            got = {id(n) for n in index.nodes()}
            want = by_scope.get(scope, set())
            if got != want or index.live != len(want):
                problems.append(f"scope {scope!r} index holds {len(got)} (live {index.live}), expected {len(want)}")
        for scope in by_scope:
            if scope == self.solo:
                if len(by_scope) > 1:
                    problems.append(f"scope {scope!r} shares the global index, but {len(by_scope)} scopes have candidates")
            elif scope not in self.scopes:
                problems.append(f"scope {scope!r} has candidates but no index")
        return problems
