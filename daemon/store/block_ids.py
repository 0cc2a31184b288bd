"""Sequences of block ids as the store keeps them: ``array('q')``, 8 bytes a block and no Python int per block.

:class:`BlockIds` is such an array that compares equal to a list of the same ids (what the store
returned before it kept arrays) and slices to its own type.

:class:`BlockRun` is one whose ids form a *run*: consecutive ids, ascending or descending by one
(``first, first + step, ...`` with ``step`` 1 or -1), or a few runs one after the other, each
named in ``runs``. Only the allocator makes one (a take of fresh blocks, or of runs from its free
stack), and the type is the proof: a slice of it (step 1; -1 too for a single run) is made of the
same runs, cut; dropping ids at either end cuts them too; every other change raises TypeError. So
whoever holds a BlockRun knows its ids from its runs, without reading them: the allocator frees
or moves one in O(runs) Python steps (a slice of the state bytes and one entry of its free stack
per run), however many pages a tree node holds.
"""

from __future__ import annotations

from array import array

import numpy as np

#: Below this many ids a run is built from a range, above it from numpy's arange (one memcpy).
_ARANGE_FROM = 64


class BlockIds(array):
    """Block ids as an ``array('q')`` that compares equal to a list of the same ids and slices to its own type."""

    __slots__ = ()

    def __new__(cls, *args) -> BlockIds:
        return super().__new__(cls, "q", *args)

    def __eq__(self, other) -> bool:
        if isinstance(other, list):
            return self.tolist() == other
        return array.__eq__(self, other)

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    __hash__ = None

    def __getitem__(self, index):
        got = array.__getitem__(self, index)
        return BlockIds(got) if type(got) is array else got


def _refuse(self, *args, **kwargs):
    raise TypeError("a BlockRun only loses ids at its ends (it must stay made of its runs)")


def _cut(runs: tuple, a: int, b: int) -> tuple | None:
    """The runs of positions ``a..b-1`` of the ids that ``runs`` make; None when that is one run (or none)."""
    out = []
    pos = 0
    for start, count, step in runs:
        lo, hi = max(a, pos), min(b, pos + count)
        if lo < hi:
            out.append((start + (lo - pos) * step, hi - lo, step))
        pos += count
        if pos >= b:
            break
    return tuple(out) if len(out) > 1 else None


class BlockRun(BlockIds):
    """Block ids that form one run, or a few runs one after the other (see the module docstring).

    ``runs``: None for one run (its ends say which), else the ``(start, count, step)`` of each run
    in order, as the allocator handed them out. Made by ``BlockRun.of`` and ``BlockRun.joined``.
    """

    __slots__ = ("runs",)

    def __new__(cls, *args) -> BlockRun:
        self = array.__new__(cls, "q", *args)
        self.runs = None
        return self

    @classmethod
    def of(cls, first: int, n: int, step: int = 1) -> BlockRun:
        """The run ``first, first + step, ...`` of ``n`` ids (``step`` 1 or -1)."""
        if n < _ARANGE_FROM:
            return cls(range(first, first + n * step, step))
        run = cls()
        array.frombytes(run, np.arange(first, first + n * step, step, dtype=np.int64).view(np.uint8))
        return run

    @classmethod
    def joined(cls, pieces) -> BlockRun:
        """The runs ``pieces`` (``(start, count, step)`` each, distinct ids) one after the other."""
        pieces = tuple(pieces)
        if len(pieces) == 1:
            return cls.of(*pieces[0])
        out = cls()
        for start, count, step in pieces:
            if count < _ARANGE_FROM:
                array.extend(out, array("q", range(start, start + count * step, step)))
            else:
                array.frombytes(out, np.arange(start, start + count * step, step, dtype=np.int64).view(np.uint8))
        out.runs = pieces
        return out

    def pieces(self) -> tuple:
        """``(start, count, step)`` of each run, in order (one for a single run, none when empty)."""
        if self.runs is not None:
            return self.runs
        n = len(self)
        if not n:
            return ()
        first, last = array.__getitem__(self, 0), array.__getitem__(self, -1)
        return ((first, n, 1 if last >= first else -1),)

    def bounds(self) -> tuple[int, int]:
        """The lowest and the highest id (the run is not empty)."""
        ends = [end for start, count, step in self.pieces() for end in (start, start + (count - 1) * step)]
        return min(ends), max(ends)

    @property
    def step(self) -> int:
        """1 for an ascending run (or one id), -1 for a descending one (of a single run)."""
        return 1 if len(self) < 2 or array.__getitem__(self, 1) > array.__getitem__(self, 0) else -1

    def __getitem__(self, index):
        got = array.__getitem__(self, index)
        if type(got) is not array:
            return got
        if self.runs is None:
            if index.step is None or index.step in (1, -1):
                return BlockRun(got)  # array's constructor copies an array with one memcpy
            return BlockIds(got)
        if index.step is None or index.step == 1:
            out = BlockRun(got)
            out.runs = _cut(self.runs, *index.indices(len(self))[:2])
            return out
        return BlockIds(got)

    def __delitem__(self, index) -> None:
        if isinstance(index, slice) and index.step in (None, 1):
            n = len(self)
            start, stop, _ = index.indices(n)
            if start >= stop:
                return
            if start == 0 or stop == n:  # a head or a tail
                if self.runs is not None:
                    self.runs = _cut(self.runs, stop, n) if start == 0 else _cut(self.runs, 0, start)
                array.__delitem__(self, index)
                return
        _refuse(self)

    __setitem__ = append = extend = insert = pop = remove = frombytes = fromlist = fromfile = _refuse
    fromunicode = byteswap = __iadd__ = __imul__ = _refuse


class BlockPath(BlockIds):
    """The block ids of a path from the root, in page order, joined from its nodes' arrays with
    one copy per node.

    ``nodes`` are the path's nodes, root side first, whose blocks it concatenates:
    per-node work on the ids (the daemon's reply encoding) is then done once per
    node and reused, instead of once per page and request. A slice is a plain BlockIds.
    """

    __slots__ = ("nodes",)

    def __init__(self, *args) -> None:
        self.nodes: list = []
