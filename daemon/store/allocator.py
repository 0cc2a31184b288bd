"""Block ids of the arena: a free stack plus a state per block.

Every block is in exactly one state: FREE, TREE (owned by a cached page of a
radix tree) or LEASED (held by an allocation lease or an insert in progress).
The state array exists so that invariants can be checked and client-supplied
block ids validated in O(1).

Start-up costs nothing per block: the free blocks are the ones never handed
out yet (``_fresh`` and above, handed out in ascending order) plus a stack of
returned ones, which are reused first. That is exactly the order a stack of
every id from 0 up would give, without building it: a stack of Python ints
costs ~36 bytes and ~30 ns per block at start-up (1.2 GB and seconds for
33 M blocks), this one 1 byte of state per block and 4 or 8 bytes per block
ever returned, in a typed array.

No Python loop runs per block: blocks move as runs. A set of ids that forms
one run of consecutive blocks (fresh blocks always do, and so do the pages of
a node they were stored into) changes state with one slice of the state
array and is checked with one ``find``/``count``; other sets go through C-level
``map`` (few ids) or one numpy gather/scatter (many).
"""

from __future__ import annotations

import sys
from array import array
from collections import deque
from itertools import repeat

import numpy as np

FREE, TREE, LEASED = 0, 1, 2
STATE_NAMES = ("free", "tree", "leased")

#: From this many scattered ids on, one numpy gather/scatter beats a C-level map over them.
_NUMPY_FROM = 64


#: numpy's dtype for the typecodes of the stack of returned ids.
_ID_DTYPES = {"I": np.uint32, "Q": np.uint64}


#: Up to this many state bytes per id, ids are proven distinct by counting the state bytes of their span
#: (two passes at memory speed) rather than by sorting them (n log n, and a copy).
_SPAN_PER_ID = 32


def _distinct_sorted(idx: np.ndarray, what: str) -> np.ndarray:
    """``idx`` sorted; RuntimeError when an id repeats (a store bug that would corrupt the free stack)."""
    ordered = np.sort(idx)
    if (ordered[1:] == ordered[:-1]).any():
        raise RuntimeError(f"allocator: duplicate ids in one {what}")
    return ordered


class BlockAllocator:
    """O(1)-per-block allocation and release of block ids ``first..first+nblocks-1``.

    ``first`` and ``state``: an arena partition's allocator owns the ids of its range only and
    keeps their states in the one state array of the whole arena (partitions.py), so a block's
    state is read the same way whatever partition holds it.
    """

    def __init__(self, nblocks: int, *, first: int = 0, state: bytearray | None = None) -> None:
        self.nblocks = nblocks
        self.first = first
        self.end = first + nblocks
        self._fresh = first  # blocks _fresh..end-1 were never handed out: all free
        self._returned = array("I" if self.end <= 2**32 else "Q")  # freed blocks, reused last-in first-out
        self._state = bytearray(nblocks) if state is None else state  # all FREE
        self._counts = [nblocks, 0, 0]

    @property
    def free_count(self) -> int:
        """Blocks that are free."""
        return len(self._returned) + self.end - self._fresh

    def count(self, state: int) -> int:
        """How many blocks are in ``state``."""
        return self._counts[state]

    def state(self, block: int) -> int:
        """The state of one block."""
        return self._state[block]

    @property
    def metadata_bytes(self) -> int:
        """Bytes this allocator holds: the state array and the stack of returned ids."""
        return sys.getsizeof(self._state) + sys.getsizeof(self._returned)

    def take(self, n: int, state: int = LEASED, *, packed: bool = False) -> list[int] | array:
        """Take ``n`` free blocks (most recently returned first) into ``state``; the caller made sure they exist.

        ``packed``: as an ``array('q')`` (what a tree node holds: 8 bytes a block, no int per block).
        """
        if n > self.free_count:
            raise RuntimeError(f"allocator: {n} blocks requested, {self.free_count} free")
        if n <= 0:
            return array("q") if packed else []
        returned = self._returned
        reuse = min(n, len(returned))
        top = returned[len(returned) - reuse :]  # a copy (an array slice): the stack can shrink under it
        if reuse:
            del returned[len(returned) - reuse :]
        fresh_from = self._fresh
        self._fresh = fresh_from + n - reuse
        if n < _NUMPY_FROM:
            ids = top.tolist()
            ids.reverse()
            ids += range(fresh_from, self._fresh)
            self._set_few(ids, n, state)
            if packed:
                ids = array("q", ids)
        else:
            idx = np.concatenate([np.frombuffer(top, _ID_DTYPES[top.typecode])[::-1],
                                  np.arange(fresh_from, self._fresh)]).astype(np.intp)
            self._set_many(idx, n, state, int(idx.min()), int(idx.max()))
            if packed:
                ids = array("q")
                ids.frombytes(idx.astype(np.int64, copy=False).view(np.uint8))
            else:
                ids = idx.tolist()
        self._counts[FREE] -= n
        self._counts[state] += n
        return ids

    def release(self, ids) -> None:
        """Return blocks to the free stack (they must not be free already).

        ``ids``: a list, or an ``array('q')`` (evicted pages: the tree's own arrays, which numpy
        reads in place).
        """
        n = len(ids)
        if not n:
            return
        # Validate first: a double free is a store bug, and must not corrupt the stack.
        if n < _NUMPY_FROM:
            if type(ids) is not list:
                ids = list(ids)
            states = bytes(map(self._state.__getitem__, ids))
            if FREE in states:
                raise RuntimeError(f"allocator: block {ids[states.index(FREE)]} freed twice")
            if n > 1 and len(set(ids)) != n:
                raise RuntimeError("allocator: duplicate ids in one release")
            leased = states.count(LEASED)
            self._set_few(ids, n, FREE)
            self._returned.extend(ids)
        else:
            idx = np.asarray(ids, np.intp)
            states = np.frombuffer(self._state, np.uint8)[idx]
            if not states.all():
                raise RuntimeError(f"allocator: block {int(idx[np.argmin(states)])} freed twice")
            leased = int(np.count_nonzero(states == LEASED))
            self._set_distinct(idx, states, n, FREE, "release")
            self._returned.frombytes(idx.astype(_ID_DTYPES[self._returned.typecode]).view(np.uint8))  # in place
        counts = self._counts
        counts[TREE] -= n - leased
        counts[LEASED] -= leased
        counts[FREE] += n

    def move(self, ids, src: int, dst: int) -> None:
        """Change the state of held blocks (LEASED -> TREE when a write is committed).

        ``ids``: a list, or an ``array('q')`` (which numpy reads in place).
        """
        n = len(ids)
        if not n:
            return
        if n < _NUMPY_FROM:
            states = bytes(map(self._state.__getitem__, ids))
            if states.count(src) != n:
                bad = next(i for i, state in enumerate(states) if state != src)  # only on a store bug
                raise RuntimeError(f"allocator: block {ids[bad]} is {STATE_NAMES[states[bad]]}, "
                                   f"expected {STATE_NAMES[src]}")
            if n > 1 and len(set(ids)) != n:
                raise RuntimeError("allocator: duplicate ids in one move")
            self._set_few(ids, n, dst)
        else:
            idx = np.asarray(ids, np.intp)
            states = np.frombuffer(self._state, np.uint8)[idx]
            wrong = np.flatnonzero(states != src)
            if wrong.size:
                bad = int(wrong[0])
                raise RuntimeError(f"allocator: block {ids[bad]} is {STATE_NAMES[states[bad]]}, "
                                   f"expected {STATE_NAMES[src]}")
            self._set_distinct(idx, states, n, dst, "move")
        self._counts[src] -= n
        self._counts[dst] += n

    # -- the state of many blocks at C speed ----------------------------------------------------

    def _set_few(self, ids: list[int], n: int, state: int) -> None:
        """Put ``n`` (< _NUMPY_FROM) distinct ids into ``state``: one slice for a run, else a C-level map."""
        st = self._state
        if n == 1:
            st[ids[0]] = state
            return
        lo, hi = min(ids), max(ids)
        if hi - lo + 1 == n:
            st[lo : hi + 1] = bytes((state,)) * n
        else:
            deque(map(st.__setitem__, ids, repeat(state, n)), maxlen=0)

    def _set_distinct(self, idx: np.ndarray, states: np.ndarray, n: int, state: int, what: str) -> None:
        """Put the ``n`` ids ``idx``, whose current states are ``states`` (none of them ``state``), into
        ``state``; RuntimeError, with every state as it was, when an id repeats (a store bug).

        One ascending run is distinct by construction and set with one slice. Other dense ids (an
        eviction's leaves) are proven distinct by counting:
        n distinct ids turn exactly n bytes of their span into ``state``, repeated ones fewer. Sparse
        ids are sorted instead.
        """
        lo, hi = int(idx.min()), int(idx.max())
        span = hi - lo + 1
        if span > _SPAN_PER_ID * n:
            _distinct_sorted(idx, what)
            self._set_many(idx, n, state, lo, hi)
            return
        window = np.frombuffer(self._state, np.uint8)[lo : hi + 1]
        if span == n and (np.diff(idx) == 1).all():  # one ascending run (fresh blocks, a node's pages)
            window[:] = state
            return
        before = span - np.count_nonzero(window != state) if state else span - np.count_nonzero(window)
        window[idx - lo] = state
        after = span - np.count_nonzero(window != state) if state else span - np.count_nonzero(window)
        if after - before != n:
            window[idx - lo] = states  # a repeated id had one state: this restores every byte
            raise RuntimeError(f"allocator: duplicate ids in one {what}")

    def _set_many(self, idx: np.ndarray, n: int, state: int, lo: int, hi: int) -> None:
        """Put the ``n`` distinct ids ``idx``, lowest ``lo`` and highest ``hi``, into ``state``."""
        if hi - lo + 1 == n:  # one run: one slice
            self._state[lo : hi + 1] = bytes((state,)) * n
        else:
            np.frombuffer(self._state, np.uint8)[idx] = state

    def check(self) -> list[str]:
        """Violations of the allocator's own invariants (empty when consistent)."""
        problems = []
        seen = set()
        for b in self._returned:
            if b in seen:
                problems.append(f"block {b} twice on the free stack")
            seen.add(b)
            if not self.first <= b < self._fresh:
                problems.append(f"block {b} on the free stack but never handed out")
            if self._state[b] != FREE:
                problems.append(f"block {b} on the free stack but {STATE_NAMES[self._state[b]]}")
        if self._state.count(FREE, self._fresh, self.end) != self.end - self._fresh:
            problems.append(f"a block at or above {self._fresh} (never handed out) is not free")
        actual = [self._state.count(s, self.first, self.end) for s in (FREE, TREE, LEASED)]
        if actual != self._counts:
            problems.append(f"state counts {self._counts} != actual {actual}")
        if actual[FREE] != self.free_count:
            problems.append(f"{actual[FREE]} blocks marked free but {self.free_count} on the free lists")
        return problems
