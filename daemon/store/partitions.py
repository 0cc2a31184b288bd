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
of another partition, and no other namespace ever gets one of its blocks. The store's part
:class:`ArenaPartitions` holds the whole arena's allocator, index and counters and the
partitions' own; the store asks a namespace's partition where it would ask the whole arena's,
and with no partitions configured there is only the whole arena's.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from fnmatch import fnmatchcase
from math import gcd

import numpy as np

from .allocator import STATE_NAMES, TREE, BlockAllocator
from .block_ids import BlockRun
from .errors import BadRequest
from .policies import EvictionIndex
from .radix import Totals
from .registry import POLICIES

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
        if type(ids) is BlockRun:  # its runs' ends bound it
            lo, hi = ids.bounds()
        elif len(ids) < 64:
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

    def release_runs(self, runs: list[BlockRun]) -> None:
        for run in runs:  # a run is taken from one partition: its own allocator frees it
            self.part_of(run[0]).alloc.release(run)

    def move(self, ids: list[int], src: int, dst: int) -> None:
        for alloc, group in self._split(ids):
            alloc.move(group, src, dst)

    def check(self) -> list[str]:
        return [f"{part!r}: {problem}" for part in self.parts for problem in part.alloc.check()]


class ArenaPartitions:
    """Where each namespace's blocks come from and which eviction index orders its pages.

    Holds the whole arena's allocator, eviction index and page counters (``alloc``, ``index``,
    ``totals``) and, when partitions are configured, each partition's own (``parts``, the
    remainder last; ``alloc`` then spans them all and ``index`` is the remainder's, which
    namespace-less evictions use). With none configured ``parts`` is empty and a namespace's
    ``part`` is None: the store then asks the whole arena's allocator, index and counters.
    """

    def __init__(self, nblocks: int, *, policy: str, page_bytes: int, sizes: Sequence[tuple[bytes, int]] = (),
                 match: Callable[[bytes, bytes], bool] | None = None, align: int = 1) -> None:
        if policy not in POLICIES:
            raise BadRequest(f"unknown eviction policy {policy!r} (known: {', '.join(POLICIES)})")
        self.nblocks = nblocks
        self.totals = Totals()
        self.alloc: BlockAllocator | PartitionedAllocator = BlockAllocator(nblocks)
        self.index = EvictionIndex(POLICIES[policy], capacity=nblocks, page_bytes=page_bytes)
        self.parts: list[Partition] = []
        if not sizes:
            return
        # The daemon passes Redis's glob (stringmatchlen), as for tenant quotas.
        self._match = match or (lambda pattern, name: fnmatchcase(name, pattern))
        state = bytearray(nblocks)
        for number, (pattern, first, count) in enumerate(plan_layout(sizes, nblocks, align)):
            alloc = BlockAllocator(count, first=first, state=state)
            index = EvictionIndex(POLICIES[policy], capacity=count, page_bytes=page_bytes)
            self.parts.append(Partition(number, pattern, first, count, alloc, index, PartitionTotals(self.totals)))
        self.alloc = PartitionedAllocator(self.parts, state)
        self.index = self.parts[-1].index  # the remainder's: namespace-less evictions use it

    def part_of(self, name: bytes) -> Partition | None:
        """The partition namespace ``name`` stores into (None: there are no partitions)."""
        if not self.parts:
            return None
        for part in self.parts[:-1]:
            if self._match(part.pattern, name):
                return part
        return self.parts[-1]

    def index_of(self, rec):
        """The eviction index holding a namespace's candidates."""
        return self.index if rec.part is None else rec.part.index

    @staticmethod
    def _foreign_blocks(part: Partition | None, blocks: Iterable[int]) -> int | None:
        """The first of ``blocks`` outside ``part`` (None: all inside, or no partitions)."""
        if part is None:
            return None
        return next((b for b in blocks if not part.first <= b < part.end), None)

    def refuse_foreign(self, part: Partition, blocks: Iterable[int]) -> None:
        """Refuse (BadRequest) committing into a namespace of ``part`` blocks allocated elsewhere."""
        outside = self._foreign_blocks(part, blocks)
        if outside is not None:
            raise BadRequest(f"block {outside} is not in the arena partition of this namespace "
                             f"('{part.name}'): allocate its blocks with PFXALLOC on this key")

    # -- the policy ---------------------------------------------------------------------------

    @property
    def policy(self) -> str:
        """The name of the eviction policy in force."""
        return self.index.policy

    def set_policy(self, name: str, records: Iterable) -> None:
        """Rebuild every eviction index (one per partition, or the whole arena's) under policy
        ``name``, from the unpinned leaves of the namespace ``records``: O(n log n) once."""
        if name not in POLICIES:
            raise BadRequest(f"unknown eviction policy {name!r} (known: {', '.join(POLICIES)})")
        indexes = [part.index for part in self.parts] or [self.index]
        candidates: dict[int, list] = {id(index): [] for index in indexes}
        for rec in records:
            candidates[id(self.index_of(rec))] += [node for tree in rec.trees.values()
                                                   for node in tree.subtree(tree.root) if node.evictable]
        for index in indexes:
            index.rebuild(POLICIES[name], candidates[id(index)])

    # -- figures and invariants ---------------------------------------------------------------

    def describe(self) -> list[dict]:
        """Each partition's range and what it holds (empty: none configured)."""
        return [part.describe() for part in self.parts]

    def check(self, records: dict, leases: Iterable, plans: Iterable) -> list[str]:
        """Partition invariants: each namespace's trees use its partition's index and counters, every
        block of a namespace's pages (and of its leases and inserts in flight) lies in its partition,
        and each partition's counters add up."""
        problems: list[str] = []
        if not self.parts:
            return problems
        pages = {part.number: 0 for part in self.parts}
        unpinned = dict(pages)
        for rec in records.values():
            part = rec.part
            if part is not self.part_of(rec.name):
                problems.append(f"namespace {rec.name!r} filed under {part!r}, its pattern says "
                                f"{self.part_of(rec.name)!r}")
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
        for lease in leases:
            rec = records.get(lease.scope)
            if rec is not None:
                outside = self._foreign_blocks(rec.part, lease.blocks)
                if outside is not None:
                    problems.append(f"{lease!r} of {lease.scope!r} holds block {outside} outside {rec.part!r}")
        for plan in plans:
            outside = self._foreign_blocks(self.part_of(plan.ns), plan.new_blocks + plan.dup_blocks)
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
