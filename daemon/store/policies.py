"""The generic eviction orders (lru, lfu, hybrid) and the index of eviction candidates.

Candidates are the unpinned leaves of every tree. The radix tree tells the
index whenever a node enters or leaves that set (or, by leaving and entering
again, when its priority changes), so picking the next victim never walks the
tree: it costs O(log n) for lru and lfu, O(buckets + log n) for hybrid. What
the index asks of a policy is policy.EvictionOrder; the learned policies live
in files of their own (tempo.py, guard.py and guard's experts reuse.py and
lhd.py); registry.py names them all.

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
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from collections import deque

from .policy import EvictionOrder, Policy

_COMPACT_SLACK = 64
HYBRID_BUCKETS = 33  # freq.bit_length() of 0 .. 2**32-1, capped
# What INFO's used_memory_policy counts per entry of an order (its tuple, list slot and push
# number; stale entries too), as research.policy_memory measures it on CPython 3.11
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
            if isinstance(order._seq, itertools.count):
                order._seq = seq
        return seq


class HeapPolicy(Policy):
    """Base of policies whose priority is time-invariant: one lazy heap, smallest key evicted first."""

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
        return None if entry is None else entry[-1]

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
    summary = "least recently used"
    # A namespace's own instance evicts exactly as this one does (keys from the node, ties by
    # push order, no state of its own): while one namespace has candidates, both can be this one.
    scope_shares_order = True

    @staticmethod
    def key(node) -> tuple:
        return (node.last_access,)

    def push(self, node, uncovered: bool = False) -> None:
        """HeapPolicy.push with its key and ``_enqueue`` inline (once per access and eviction)."""
        entry = (node.last_access, next(self._seq), node.version, node)
        run = self._run
        if not run or entry > run[-1]:
            run.append(entry)
            self._heaped = None
        else:
            heapq.heappush(self._heap, entry)
            self._heaped = entry
        self.live += 1


class LFUPolicy(HeapPolicy):
    """Least frequently hit first; the older of equally frequent nodes first."""

    name = "lfu"
    summary = "least frequently used, then least recent"
    scope_shares_order = True

    @staticmethod
    def key(node) -> tuple:
        return (node.freq, node.last_access)


def bucket(freq: int) -> int:
    """The hybrid heap a frequency files under: its bit length, capped (``hybrid``, ``guard``)."""
    return min(freq.bit_length(), HYBRID_BUCKETS - 1)


class BucketedHeaps(Policy):
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
    summary = "highest age / (frequency + 1)"
    scope_shares_order = True

    def __init__(self) -> None:
        super().__init__(HYBRID_BUCKETS)

    def push(self, node, uncovered: bool = False) -> None:
        self._file(bucket(node.freq), (node.last_access, next(self._seq), node.version, node))

    def peek(self, now: float):
        best = None
        best_score = -1.0
        for last_access, _, _, node in self._heads():
            score = (now - last_access) / (node.freq + 1)
            if score > best_score:  # strict: on ties the lower-frequency bucket goes first
                best, best_score = node, score
        return best


def _ignore(*args) -> None:
    """What the index calls for policies that do not watch lookups and stores (nothing)."""


def _nothing(now: float) -> None:
    """The victims of a scope with no candidates."""
    return None


class EvictionIndex:
    """The unpinned leaves, indexed by the current policy globally and per scope.

    The radix tree calls ``add``/``remove``; ``node.evictable`` mirrors
    membership. One version counter per node invalidates its entries in both
    the global and the scope structure at once.
    """

    def __init__(self, factory: type[EvictionOrder], capacity: int = 0, page_bytes: int = 0) -> None:
        self.capacity = capacity  # pages of the store (policies that simulate a cache need it)
        self.page_bytes = page_bytes
        self.trees: weakref.WeakSet = weakref.WeakSet()  # whose nodes a switch of policy resets
        self._start(factory)

    def _start(self, factory: type[EvictionOrder]) -> None:
        self.factory = factory
        self.all: EvictionOrder = factory.for_store(self.capacity, self.page_bytes)
        self.scopes: dict[bytes, EvictionOrder] = {}
        # While only one namespace has candidates, the global index is its index too: one heap
        # entry per candidate change, not two. ``solo`` names that namespace. A second namespace,
        # or a namespace eviction under a policy whose namespace instances keep state of their
        # own (``scope_shares_order`` False: lhd's draws), first gives it its own index, built
        # in push order from the global one: exactly what it would hold had it been kept all along.
        self._peeks_shared = factory.scope_shares_order
        self.solo: bytes | None = None
        # Policies that watch the request stream (guard) get every lookup and store; others pay nothing.
        observes = factory.observes_requests
        self.looked_up = self.all.looked_up if observes else _ignore
        self.stored = self.all.stored if observes else _ignore
        self.released = self.all.released if observes else _ignore
        # Pages of a node are being evicted: its tail, or ``whole`` it (None: the policy learns nothing from it).
        self.evicted = None if type(self.all).evicted is Policy.evicted else self.all.evicted
        self.split = self.all.split  # the tree cut an edge: the policy sets the upper part's state
        self.trimmed = self.all.trimmed  # a node kept its first pages

    def attach(self, tree) -> None:
        """``tree`` reports to this index (a switch of policy resets its nodes' state)."""
        self.trees.add(tree)

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
            index = self.scopes[scope] = self.all.for_scope()
        return index

    def _unshare(self) -> None:
        """A second namespace gets candidates: the solo one gets its own index, in the same order."""
        scope, self.solo = self.solo, None
        index = self.scopes[scope] = self.all.for_scope()
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
        return self.all.describe()

    def memory_bytes(self, nodes: int, pages: int) -> int:
        """About what the policy holds globally and per namespace (INFO's used_memory_policy)."""
        return self.all.memory_bytes(nodes, pages) + sum(index.memory_bytes(0, 0) for index in self.scopes.values())

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

    def rebuild(self, factory: type[EvictionOrder], nodes) -> None:
        """Switch policy (a class of the registry): reset every node's state, then index ``nodes`` (every
        current candidate) afresh, O(n log n)."""
        self._start(factory)
        reset = self.all.reset
        for tree in list(self.trees):
            for node in tree.subtree(tree.root):
                reset(node)
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
