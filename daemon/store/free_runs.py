"""The allocator's stack of returned block ids, held as runs.

An entry ``(first, length)`` stands for the ids ``first, first + s, ...`` pushed in that order,
``|length|`` of them, ``s`` the sign of ``length`` (a single id is a run of one). Popping ``k`` ids
off the top of an entry gives a run again, the other way round, and leaves the entry ``k`` shorter;
so the ids come off in exactly the order a stack of single ids would give them, while a run of a
million ids costs one entry to push and one to pop. A push that continues the top entry (the next
id, the same way) lengthens it.

Entries live in two typed arrays (ids 4 bytes when the arena has fewer than 2^32 blocks, lengths 4
bytes under 2^31): no Python object per entry. Pops of many entries, pushes of many ids and the
expansion back to ids are numpy.
"""

from __future__ import annotations

import sys
from array import array

import numpy as np

#: numpy's dtype for the typecodes of the stack's arrays.
_DTYPES = {"I": np.uint32, "Q": np.uint64, "i": np.int32, "q": np.int64}

#: A pop of more entries than this finds and cuts them with numpy instead of one Python step each.
PIECES_IN_PYTHON = 64

#: Pushes of fewer ids than this go id by id (merging into runs as they come); more are cut with numpy.
_NUMPY_FROM = 64


def expand(starts, counts, steps) -> np.ndarray:
    """The ids of the runs ``starts[j], starts[j] + steps[j], ...`` (``counts[j]`` each), joined in order."""
    starts = np.asarray(starts, np.int64)
    counts = np.asarray(counts, np.int64)
    steps = np.asarray(steps, np.int64)
    total = int(counts.sum())
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(starts, counts) + (np.arange(total, dtype=np.int64) - offsets) * np.repeat(steps, counts)


def runs_of(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cut the ids ``idx`` (in order) into runs: ``(firsts, lengths)``, a length's sign its step.

    A run continues while consecutive ids differ by the same 1 or -1; anything else starts a new one
    (a pair that could have joined the run before it may start one of its own: fewer entries would be
    a saving, not a correction).
    """
    n = idx.size
    d = np.diff(idx)
    breaks = (d != 1) & (d != -1)
    breaks[1:] |= d[1:] != d[:-1]
    starts = np.flatnonzero(np.concatenate(([True], breaks)))
    counts = np.diff(np.append(starts, n))
    steps = np.ones(starts.size, np.int64)
    longer = counts > 1
    steps[longer] = d[starts[longer]]
    return idx[starts], counts * steps


class FreeRuns:
    """A last-in first-out stack of block ids kept as runs (see the module docstring).

    ``firsts``, ``lengths``: the entries, bottom first; ``held``: the ids they stand for. The
    allocator appends entries itself on its hottest path (an eviction's runs) and then adds to
    ``held``; everything else goes through the methods.
    """

    __slots__ = ("firsts", "lengths", "held")

    def __init__(self, end: int, nblocks: int) -> None:
        self.firsts = array("I" if end <= 2**32 else "Q")
        self.lengths = array("i" if nblocks < 2**31 else "q")
        self.held = 0

    def __len__(self) -> int:
        """Entries on the stack."""
        return len(self.lengths)

    @property
    def metadata_bytes(self) -> int:
        return sys.getsizeof(self.firsts) + sys.getsizeof(self.lengths)

    def pop(self, need: int) -> list[tuple[int, int, int]]:
        """Pop ``need`` (<= ``held``) ids as runs ``(start, count, step)``, the top first."""
        firsts, lengths = self.firsts, self.lengths
        pieces = []
        left = need
        while left:
            if len(pieces) == PIECES_IN_PYTHON:
                pieces += self._pop_many(left)
                break
            length = lengths[-1]
            step = 1 if length > 0 else -1
            m = length * step
            top = firsts[-1] + (m - 1) * step
            if left >= m:
                pieces.append((top, m, -step))
                firsts.pop()
                lengths.pop()
                left -= m
            else:
                pieces.append((top, left, -step))
                lengths[-1] = length - left * step
                left = 0
        self.held -= need
        return pieces

    def _pop_many(self, need: int) -> list[tuple[int, int, int]]:
        """``pop`` of many entries: the entries it takes are found and cut with numpy."""
        firsts, lengths = self.firsts, self.lengths
        tail = 64
        while True:
            tail = min(tail, len(lengths))
            sizes = np.abs(np.asarray(lengths[len(lengths) - tail :], np.int64))[::-1]  # top first
            held = np.cumsum(sizes)
            if held[-1] >= need or tail == len(lengths):
                break
            tail *= 4
        k = int(np.searchsorted(held, need)) + 1  # entries touched, the last maybe in part
        top_first = np.asarray(firsts[len(firsts) - k :], np.int64)[::-1]
        top_len = np.asarray(lengths[len(lengths) - k :], np.int64)[::-1]
        steps = np.where(top_len > 0, 1, -1)
        counts = sizes[:k].copy()
        tops = top_first + (counts - 1) * steps
        taken_last = need - (int(held[k - 2]) if k > 1 else 0)
        whole = k if taken_last == counts[-1] else k - 1
        if whole < k:
            lengths[-k] = int(top_len[-1] - taken_last * steps[-1])
        del firsts[len(firsts) - whole :]
        del lengths[len(lengths) - whole :]
        counts[-1] = taken_last
        return list(zip(tops.tolist(), counts.tolist(), (-steps).tolist()))

    def push_run(self, first: int, length: int) -> None:
        """Push the run ``first, first + s, ...`` (``|length|`` ids, ``s`` the sign of ``length``)."""
        firsts, lengths = self.firsts, self.lengths
        size = length if length > 0 else -length
        if lengths:  # it continues the top entry (one id, or a run the same way): one longer entry
            top_len = lengths[-1]
            step = 1 if top_len > 0 else -1
            m = top_len * step
            d = first - (firsts[-1] + (m - 1) * step)
            if (d == 1 or d == -1) and (m == 1 or d == step) and (size == 1 or (length > 0) == (d > 0)):
                lengths[-1] = (m + size) * d
                self.held += size
                return
        firsts.append(first)
        lengths.append(length)
        self.held += size

    def push(self, ids, n: int) -> None:
        """Push ``n`` distinct ids in order, cut into runs."""
        if n < _NUMPY_FROM:
            push = self.push_run
            for b in ids:
                push(b, 1)
            return
        firsts, lengths = runs_of(np.asarray(ids, np.int64))
        self.push_runs(firsts, lengths, n)

    def push_runs(self, firsts: np.ndarray, lengths: np.ndarray, n: int) -> None:
        """Push the runs ``firsts``/``lengths`` (as ``runs_of`` gives them: ``n`` ids), in order."""
        self.firsts.frombytes(firsts.astype(_DTYPES[self.firsts.typecode]).view(np.uint8))
        self.lengths.frombytes(lengths.astype(_DTYPES[self.lengths.typecode]).view(np.uint8))
        self.held += n

    def ids(self) -> np.ndarray:
        """Every id on the stack, bottom first (the last is reused first)."""
        if not self.lengths:
            return np.empty(0, np.int64)
        lengths = np.asarray(self.lengths, np.int64)
        return expand(np.asarray(self.firsts, np.int64), np.abs(lengths), np.where(lengths > 0, 1, -1))

    def check(self) -> list[str]:
        """Violations of the stack's own invariants (empty when consistent)."""
        problems = []
        if 0 in self.lengths:
            problems.append("an empty run on the free stack")
        if len(self.firsts) != len(self.lengths):
            problems.append(f"{len(self.firsts)} run starts but {len(self.lengths)} lengths")
        counted = int(np.abs(np.asarray(self.lengths, np.int64)).sum()) if self.lengths else 0
        if counted != self.held:
            problems.append(f"the free stack holds {counted} ids, counted {self.held}")
        return problems
