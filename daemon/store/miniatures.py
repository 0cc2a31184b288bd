"""Miniature caches for the guard: metadata-only prefix caches fed a spatially sampled stream of pages.

Spatial sampling of a prefix tree: a page's identity is a hash of its
namespace and every token up to its end; the page is in the sample when that
hash is below rate x 2**64. So a page is always or never sampled, and two
requests share a sampled page exactly when they share the prefix up to it: a
request's sampled pages, in order, are a chain of one-token pages in the
miniature caches, and the prefix structure survives the sampling. The LRU
miniature predicts LRU on the whole (a page's ancestors are never less
recent than the page); the others are their policy at scale ``rate``.

A miniature does what the store does with requests in flight: its hit is
pinned under the lookup's lease until the lease ends, and what it missed is
stored when the worker stores (or, when the real cache hit the whole prompt
and no store comes, when the lease ends). At rate 1 the LRU miniature is
the store under LRU, page for page (tests/test_guard_policy.py).
"""

from __future__ import annotations

import zlib

import numpy as np

from .policy import NodeState
from .radix import RadixTree, Totals

# what INFO's used_memory_policy counts for a miniature's node: the object, its key, blocks, children and
# ints (research.policy_memory measures it, CPython 3.11)
MINI_NODE_BYTES = 520

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
    """Which pages of a prompt are in the sample, and their identities as one-token pages.

    ``hashes``: where a radix node keeps its pages' identities (path_hashes caches them there).
    """

    def __init__(self, page_bytes: int, rate: float, hashes: NodeState | None = None) -> None:
        self.hashes = hashes
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

        Each node keeps its pages' (in ``hashes``; the policy cuts them with the pages on a split or a
        trim), filled in on first use: a lookup that hits cached pages hashes only the pages it misses.
        """
        cached, keep = self.hashes.get, self.hashes.put
        nodes = []
        while node.parent is not None:
            nodes.append(node)
            node = node.parent
        parts = []
        depth = 0
        for node in reversed(nodes):
            part = cached(node)
            if part is None:
                carry = self.carry_after(parts[-1]) if parts else self.seed(scope)
                part = self.hash_pages(node.key, depth, carry)
                keep(node, part)
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
        self._push = self.all.push  # bound once: every miniature touch calls these twice per node
        self._drop = self.all.drop
        self.evicted = self.all.evicted
        self.split = self.all.split
        self.trimmed = self.all.trimmed

    def attach(self, tree) -> None:
        """A miniature never switches policy: nothing to keep."""

    def add(self, node, uncovered: bool = False) -> None:
        node.version += 1
        node.evictable = True
        self._push(node, uncovered)

    def remove(self, node) -> None:
        node.version += 1
        node.evictable = False
        self._drop()

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

    def access(self, scope: bytes, ids: bytes, held: list | None = None) -> int:
        """A lookup of ``ids``; returns the pages it hit (what it missed is stored when the worker stores).

        ``held``: the lookup is leased; the hit is pinned, as the lease pins the store's, and its node
        appended to ``held`` until release() hears that the lease ended.
        """
        n = len(ids) // 4
        if n > self.capacity:
            n = self.capacity
        tree = self.trees.get(scope) or self._tree(scope)
        node, pages = tree.locate(ids, n)
        if pages:
            totals = self.totals
            totals.ticks += 1
            if held is not None:
                tree.pin(node)  # before touching, as the store pins a leased match
                held.append(node)
            tree.touch(node, totals.ticks, hit=True)  # an int: last_access shares the tick's object
        return pages

    def store(self, scope: bytes, ids: bytes, missed_only: bool = False) -> None:
        """A store of ``ids``: what the miniature misses of them is added (its pages count no hits).

        ``missed_only``: a store the real cache did not make (it held them all): nothing when the
        miniature holds them all too, where the store's commit would touch them.
        """
        n = min(len(ids) // 4, self.capacity)
        tree = self._tree(scope)
        node, pages = tree.locate(ids, n)
        if pages < n or not missed_only:
            self._store(tree, node, ids, pages, n)

    @staticmethod
    def release(node) -> None:
        """A lease ended: unpin the hit that access() held under it."""
        node.tree.unpin(node)

    def _store(self, tree: RadixTree, node, ids: bytes, pages: int, n: int) -> None:
        totals = self.totals
        tree.pin(node)  # as the store's insert plan does: the prefix being extended stays
        short = (n - pages) - (self.capacity - totals.pages)
        index = self.index
        while short > 0:
            victim = index.best()
            if victim is None:  # pins hold it all: the store would refuse (OOM), the miniature goes over
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
