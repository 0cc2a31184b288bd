"""Arena partitions: ranges of blocks that only the namespaces of one tenant store into.

A partition is ``(pattern, first, nblocks)``: the namespaces matching ``pattern`` (the
first partition whose pattern matches, as for tenant quotas) keep their pages, their
allocations and their inserts in blocks ``first..first+nblocks-1`` only; every other
namespace uses the *remainder*, the range after the last partition. In shared memory each
partition is a memfd of its own (partitioned_arena.py), so the daemon can hand a tenant's
worker the memory of its partition and of nothing else.

Each partition has its own allocator over its range (one state array for the whole arena),
its own eviction index (the policy in force, run over that partition's candidates) and its
own page counters. A full partition evicts its own pages, by policy; it never takes a block
of another partition, and no other namespace ever gets one of its blocks. The store (a mixin
here: :class:`StorePartitions`) asks a namespace's partition where it would ask the global
allocator, index or counters; with no partitions configured none of this exists.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from fnmatch import fnmatchcase
from math import gcd

import numpy as np

from .allocator import STATE_NAMES, TREE, BlockAllocator
from .errors import BadRequest
from .radix import Totals

#: The pattern the remainder is reported under (it takes every namespace no partition matches).
REMAINDER = b"*"


class PartitionTotals(Totals):
    """A partition's page counters; every change also goes to the store's global ``whole``
    (so the global figures stay the sum), and logical time (``ticks``) is the global one."""

    __slots__ = ("_pages", "_unpinned", "whole")

    def __init__(self, whole: Totals) -> None:  # noqa: super().__init__ would write the global ticks
        self.whole = whole
        self._pages = 0
        self._unpinned = 0

    @property
    def pages(self) -> int:
        return self._pages

    @pages.setter
    def pages(self, value: int) -> None:
        self.whole.pages += value - self._pages
        self._pages = value

    @property
    def unpinned(self) -> int:
        return self._unpinned

    @unpinned.setter
    def unpinned(self, value: int) -> None:
        self.whole.unpinned += value - self._unpinned
        self._unpinned = value

    @property
    def ticks(self) -> int:
        return self.whole.ticks

    @ticks.setter
    def ticks(self, value: int) -> None:
        self.whole.ticks = value


class Partition:
    """One range of blocks, who stores there, and its allocator, eviction index and counters."""

    __slots__ = ("alloc", "first", "index", "nblocks", "number", "pattern", "totals")

    def __init__(self, number: int, pattern: bytes | None, first: int, nblocks: int, alloc: BlockAllocator,
                 index, totals: PartitionTotals) -> None:
        self.number = number
        self.pattern = pattern  # None: the remainder
        self.first = first
        self.nblocks = nblocks
        self.alloc = alloc
        self.index = index
        self.totals = totals

    @property
    def end(self) -> int:
        return self.first + self.nblocks

    @property
    def name(self) -> str:
        return "remainder" if self.pattern is None else self.pattern.decode("utf-8", "replace")

    def describe(self) -> dict:
        return {"pattern": REMAINDER if self.pattern is None else self.pattern, "first-block": self.first,
                "nblocks": self.nblocks, "free": self.alloc.free_count, "pages": self.totals.pages,
                "remainder": int(self.pattern is None)}

    def __repr__(self) -> str:
        return f"<partition {self.name} blocks {self.first}..{self.end - 1}>"


def block_alignment(block_bytes: int, page_bytes: int) -> int:
    """Blocks per smallest range whose bytes are a whole number of memory pages: each partition's
    size is a multiple of it, so that every partition starts on a page (and can be mapped there)."""
    return page_bytes // gcd(page_bytes, block_bytes)


def plan_layout(sizes: Sequence[tuple[bytes, int]], nblocks: int, align: int = 1) -> list[tuple[bytes | None, int, int]]:
    """``[(pattern, first, nblocks)]``: the partitions in the order given, each rounded up to a
    multiple of ``align`` blocks, then the remainder (pattern None) with what is left.
    ValueError when they do not fit with at least ``align`` blocks left for the remainder."""
    layout = []
    first = 0
    seen = set()
    for pattern, count in sizes:
        if pattern in seen:
            raise ValueError(f"arena-partition '{pattern.decode('utf-8', 'replace')}' is given twice")
        seen.add(pattern)
        if count < 1:
            raise ValueError(f"arena-partition '{pattern.decode('utf-8', 'replace')}' holds no block")
        count = -(-count // align) * align
        layout.append((pattern, first, count))
        first += count
    if sizes and nblocks - first < align:
        raise ValueError(f"the arena partitions take {first} blocks, but maxmemory holds {nblocks}: "
                         f"at least {align} must be left for the namespaces no partition matches")
    layout.append((None, first, nblocks - first))
    return layout


class PartitionedAllocator:
    """The allocator interface of the whole arena over the partitions' own allocators: states,
    counts and checks cover every block; ``take`` is always from one partition; ``release`` and
    ``move`` send each id to the partition whose range holds it."""

    def __init__(self, parts: Sequence[Partition], state: bytearray) -> None:
        self.parts = list(parts)
        self.nblocks = sum(part.nblocks for part in parts)
        self._state = state
        self._firsts = [part.first for part in parts]

    @property
    def free_count(self) -> int:
        return sum(part.alloc.free_count for part in self.parts)

    def count(self, state: int) -> int:
        return sum(part.alloc.count(state) for part in self.parts)

    def state(self, block: int) -> int:
        return self._state[block]

    @property
    def metadata_bytes(self) -> int:
        shared = sys.getsizeof(self._state)
        return shared + sum(part.alloc.metadata_bytes - shared for part in self.parts)

    def part_of(self, block: int) -> Partition:
        return self.parts[bisect_right(self._firsts, block) - 1]

    def _split(self, ids: list[int]) -> Iterable[tuple[BlockAllocator, list[int]]]:
        if not ids:
            return ()
        part = self.part_of(ids[0])
        if len(ids) < 64:
            lo, hi = min(ids), max(ids)
        else:
            idx = np.asarray(ids, np.int64)
            lo, hi = int(idx.min()), int(idx.max())
        if part.first <= lo and hi < part.end:  # always, unless a caller mixes partitions
            return ((part.alloc, ids),)
        groups: dict[int, list[int]] = {}
        for b in ids:
            groups.setdefault(self.part_of(b).number, []).append(b)
        return ((self.parts[number].alloc, group) for number, group in groups.items())

    def release(self, ids: list[int]) -> None:
        for alloc, group in self._split(ids):
            alloc.release(group)

    def move(self, ids: list[int], src: int, dst: int) -> None:
        for alloc, group in self._split(ids):
            alloc.move(group, src, dst)

    def check(self) -> list[str]:
        return [f"{part!r}: {problem}" for part in self.parts for problem in part.alloc.check()]


class StorePartitions:
    """The store's side of the partitions: a mixin of :class:`~.store.PrefixStore` (the
    attributes it uses are the store's). ``self.parts`` is empty when none are configured,
    and every namespace record's ``part`` is then None."""

    def _set_partitions(self, sizes: Sequence[tuple[bytes, int]], match: Callable[[bytes, bytes], bool] | None,
                        make_index: Callable[[int], object], align: int = 1) -> None:
        self.parts: list[Partition] = []
        if not sizes:
            return
        # The daemon passes Redis's glob (stringmatchlen), as for tenant quotas.
        self._part_match = match or (lambda pattern, name: fnmatchcase(name, pattern))
        state = bytearray(self.nblocks)
        for number, (pattern, first, count) in enumerate(plan_layout(sizes, self.nblocks, align)):
            alloc = BlockAllocator(count, first=first, state=state)
            self.parts.append(Partition(number, pattern, first, count, alloc, make_index(count),
                                        PartitionTotals(self._totals)))
        self._alloc = PartitionedAllocator(self.parts, state)
        self._index = self.parts[-1].index  # the remainder's: namespace-less evictions use it

    def _part_of(self, name: bytes) -> Partition | None:
        """The partition namespace ``name`` stores into (None: there are no partitions)."""
        if not self.parts:
            return None
        for part in self.parts[:-1]:
            if self._part_match(part.pattern, name):
                return part
        return self.parts[-1]

    def _index_of(self, rec):
        """The eviction index holding a namespace's candidates."""
        return self._index if rec.part is None else rec.part.index

    def _foreign_blocks(self, part: Partition | None, blocks: Iterable[int]) -> int | None:
        """The first of ``blocks`` outside ``part`` (None: all inside, or no partitions)."""
        if part is None:
            return None
        return next((b for b in blocks if not part.first <= b < part.end), None)

    def _given_in(self, part: Partition, given) -> None:
        """Refuse (BadRequest) committing into a namespace of ``part`` blocks allocated elsewhere."""
        outside = self._foreign_blocks(part, (b for b, _ in given))
        if outside is not None:
            raise BadRequest(f"block {outside} is not in the arena partition of this namespace "
                             f"('{part.name}'): allocate its blocks with PFXALLOC on this key")

    def _candidates_by_index(self) -> list[tuple[object, list]]:
        """Every eviction index (one per partition, or the store's) with the unpinned leaves it indexes."""
        indexes = [part.index for part in self.parts] or [self._index]
        candidates: dict[int, list] = {id(index): [] for index in indexes}
        for rec in self._ns.values():
            candidates[id(self._index_of(rec))] += [node for tree in rec.trees.values()
                                                    for node in tree.subtree(tree.root) if node.evictable]
        return [(index, candidates[id(index)]) for index in indexes]

    def partitions(self) -> list[dict]:
        """Each partition's range and what it holds (empty: none configured)."""
        return [part.describe() for part in self.parts]

    def check_partitions(self) -> list[str]:
        """Partition invariants: each namespace's trees use its partition's index and counters, every
        block of a namespace's pages lies in its partition, and each partition's counters add up."""
        problems: list[str] = []
        if not self.parts:
            return problems
        pages = {part.number: 0 for part in self.parts}
        unpinned = dict(pages)
        for rec in self._ns.values():
            part = rec.part
            if part is not self._part_of(rec.name):
                problems.append(f"namespace {rec.name!r} filed under {part!r}, its pattern says "
                                f"{self._part_of(rec.name)!r}")
                continue
            for tree in rec.trees.values():
                if tree.index is not part.index or tree.totals is not part.totals:
                    problems.append(f"tree {rec.name!r}/{tree.shard} uses another partition's index or counters")
                pages[part.number] += tree.pages
                unpinned[part.number] += tree.unpinned
                for node in tree.subtree(tree.root):
                    outside = self._foreign_blocks(part, node.blocks)
                    if outside is not None:
                        problems.append(f"block {outside} of {rec.name!r} lies outside {part!r}")
        for lease in self._leases:
            rec = self._ns.get(lease.scope)
            if rec is not None:
                outside = self._foreign_blocks(rec.part, lease.blocks)
                if outside is not None:
                    problems.append(f"{lease!r} of {lease.scope!r} holds block {outside} outside {rec.part!r}")
        for plan in self._plans.values():
            outside = self._foreign_blocks(self._part_of(plan.ns), plan.new_blocks + plan.dup_blocks)
            if outside is not None:
                problems.append(f"insert plan {plan.id} of {plan.ns!r} holds block {outside} outside its partition")
        for part in self.parts:
            counted = (part.totals.pages, part.totals.unpinned)
            if counted != (pages[part.number], unpinned[part.number]):
                problems.append(f"{part!r} counts pages/unpinned {counted}, its trees hold "
                                f"{(pages[part.number], unpinned[part.number])}")
            if part.totals.pages != part.alloc.count(TREE):
                problems.append(f"{part!r}: {part.totals.pages} cached pages but {part.alloc.count(TREE)} "
                                f"of its blocks {STATE_NAMES[TREE]}")
        return problems
