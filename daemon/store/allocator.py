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


def _is_run(ids, n: int) -> tuple[int, int] | None:
    """(lo, hi + 1) when the ``n`` distinct ids are exactly the blocks lo..hi, else None."""
    lo = min(ids)
    hi = max(ids)
    return (lo, hi + 1) if hi - lo + 1 == n else None


class BlockAllocator:
    """O(1)-per-block allocation and release of block ids ``0..nblocks-1``."""

    def __init__(self, nblocks: int) -> None:
        self.nblocks = nblocks
        self._fresh = 0  # blocks _fresh..nblocks-1 were never handed out: all free
        self._returned = array("I" if nblocks <= 2**32 else "Q")  # freed blocks, reused last-in first-out
        self._state = bytearray(nblocks)  # all FREE
        self._counts = [nblocks, 0, 0]

    @property
    def free_count(self) -> int:
        """Blocks that are free."""
        return len(self._returned) + self.nblocks - self._fresh

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

    def take(self, n: int, state: int = LEASED) -> list[int]:
        """Take ``n`` free blocks (most recently returned first) into ``state``; the caller made sure they exist."""
        if n > self.free_count:
            raise RuntimeError(f"allocator: {n} blocks requested, {self.free_count} free")
        if n <= 0:
            return []
        returned = self._returned
        reuse = min(n, len(returned))
        ids = returned[len(returned) - reuse :].tolist()
        ids.reverse()
        if reuse:
            del returned[len(returned) - reuse :]
        if reuse < n:
            start = self._fresh
            self._fresh = start + n - reuse
            ids += range(start, self._fresh)
        self._set(ids, n, state)
        self._counts[FREE] -= n
        self._counts[state] += n
        return ids

    def release(self, ids: list[int]) -> None:
        """Return blocks to the free stack (they must not be free already)."""
        n = len(ids)
        if not n:
            return
        # Validate first: a double free is a store bug, and must not corrupt the stack.
        states = self._states(ids, n)
        if FREE in states:
            raise RuntimeError(f"allocator: block {ids[states.index(FREE)]} freed twice")
        if n > 1 and len(set(ids)) != n:
            raise RuntimeError("allocator: duplicate ids in one release")
        counts = self._counts
        counts[TREE] -= states.count(TREE)
        counts[LEASED] -= states.count(LEASED)
        counts[FREE] += n
        self._set(ids, n, FREE)
        self._returned.extend(ids)

    def move(self, ids: list[int], src: int, dst: int) -> None:
        """Change the state of held blocks (LEASED -> TREE when a write is committed)."""
        n = len(ids)
        if not n:
            return
        states = self._states(ids, n)
        if states.count(src) != n:
            bad = next(i for i, state in enumerate(states) if state != src)  # only on a store bug
            raise RuntimeError(f"allocator: block {ids[bad]} is {STATE_NAMES[states[bad]]}, "
                               f"expected {STATE_NAMES[src]}")
        if n > 1 and len(set(ids)) != n:
            raise RuntimeError("allocator: duplicate ids in one move")
        self._set(ids, n, dst)
        self._counts[src] -= n
        self._counts[dst] += n

    # -- state of many blocks at C speed ------------------------------------------------------

    def _states(self, ids, n: int) -> bytes:
        """The state of each of ``ids``, one byte each, in order."""
        st = self._state
        if n == 1:
            return bytes((st[ids[0]],))
        if n >= _NUMPY_FROM:
            return np.frombuffer(st, np.uint8)[np.asarray(ids, np.intp)].tobytes()
        return bytes(map(st.__getitem__, ids))

    def _set(self, ids, n: int, state: int) -> None:
        """Put ``n`` distinct ids into ``state``: one slice for a run, else one scatter."""
        st = self._state
        if n == 1:
            st[ids[0]] = state
            return
        run = _is_run(ids, n)
        if run is not None:
            st[run[0] : run[1]] = bytes((state,)) * n
        elif n >= _NUMPY_FROM:
            np.frombuffer(st, np.uint8)[np.asarray(ids, np.intp)] = state
        else:
            deque(map(st.__setitem__, ids, repeat(state, n)), maxlen=0)

    def check(self) -> list[str]:
        """Violations of the allocator's own invariants (empty when consistent)."""
        problems = []
        seen = set()
        for b in self._returned:
            if b in seen:
                problems.append(f"block {b} twice on the free stack")
            seen.add(b)
            if b >= self._fresh:
                problems.append(f"block {b} on the free stack but never handed out")
            if self._state[b] != FREE:
                problems.append(f"block {b} on the free stack but {STATE_NAMES[self._state[b]]}")
        if self._state.count(FREE, self._fresh) != self.nblocks - self._fresh:
            problems.append(f"a block at or above {self._fresh} (never handed out) is not free")
        actual = [self._state.count(s) for s in (FREE, TREE, LEASED)]
        if actual != self._counts:
            problems.append(f"state counts {self._counts} != actual {actual}")
        if actual[FREE] != self.free_count:
            problems.append(f"{actual[FREE]} blocks marked free but {self.free_count} on the free lists")
        return problems
