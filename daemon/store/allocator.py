"""Block ids of the arena: a free stack of runs plus a state per block.

Every block is in exactly one state: FREE, TREE (owned by a cached page of a
radix tree) or LEASED (held by an allocation lease or an insert in progress).
The state array exists so that invariants can be checked and client-supplied
block ids validated in O(1).

Start-up costs nothing per block: the free blocks are the ones never handed
out yet (``_fresh`` and above, handed out in ascending order) plus a stack of
returned ones, which are reused first, last in first out. That is exactly the
order a stack of every id from 0 up would give, without building it.

The stack holds *runs*, not ids (free_runs.py): a released :class:`BlockRun`
(block_ids.py: ids known to be made of a few runs, as every node's are) goes on
it as one entry per run, and its states change with one slice of the state
bytes per run, checked with a ``find`` at memchr speed: freeing a tree node
costs the same Python steps whatever its page count. Other sets of ids are cut
into the runs they contain (numpy for many ids), checked run by run (few runs)
or per id at C speed (a ``map`` over few ids, a numpy gather/scatter over many)
and proven distinct.

A packed take returns a BlockRun made of the runs it popped (and of fresh
blocks): the runs travel from the allocator through the tree and back, so a
store that allocates and evicts whole nodes keeps a stack of few long runs.
"""

from __future__ import annotations

import sys
from array import array
from collections import deque
from itertools import repeat

import numpy as np

from .block_ids import BlockRun
from .free_runs import PIECES_IN_PYTHON, FreeRuns, expand, runs_of

FREE, TREE, LEASED = 0, 1, 2
STATE_NAMES = ("free", "tree", "leased")

#: From this many scattered ids on, one numpy gather/scatter beats a C-level map over them.
_NUMPY_FROM = 64

#: Up to this many state bytes per id, ids are proven distinct by counting the state bytes of their span
#: (two passes at memory speed) rather than by sorting them (n log n, and a copy).
_SPAN_PER_ID = 32

#: A release of ids that hold at least this many ids per run (on average) is checked and set run by run.
_IDS_PER_RUN = 16

#: Below this many ids, one count of TREE bytes checks a run faster than two memchr finds (FREE, LEASED).
_COUNTED_BELOW = 256

_get = array.__getitem__  # a BlockRun's ends, without its Python-level __getitem__


def _distinct_sorted(idx: np.ndarray, what: str) -> np.ndarray:
    """``idx`` sorted; RuntimeError when an id repeats (a store bug that would corrupt the free stack)."""
    ordered = np.sort(idx)
    if (ordered[1:] == ordered[:-1]).any():
        raise RuntimeError(f"allocator: duplicate ids in one {what}")
    return ordered


class BlockAllocator:
    """O(1)-per-run allocation and release of block ids ``first..first+nblocks-1``.

    ``first`` and ``state``: an arena partition's allocator owns the ids of its range only and
    keeps their states in the one state array of the whole arena (partitions.py), so a block's
    state is read the same way whatever partition holds it.
    """

    def __init__(self, nblocks: int, *, first: int = 0, state: bytearray | None = None) -> None:
        self.nblocks = nblocks
        self.first = first
        self.end = first + nblocks
        self._fresh = first  # blocks _fresh..end-1 were never handed out: all free
        self._free = FreeRuns(self.end, nblocks)  # returned blocks, as runs, reused last-in first-out
        self._state = bytearray(nblocks) if state is None else state  # all FREE
        self._view = np.frombuffer(self._state, np.uint8)  # the same bytes, for memsets and gathers
        self._counts = [nblocks, 0, 0]

    @property
    def free_count(self) -> int:
        """Blocks that are free."""
        return self._free.held + self.end - self._fresh

    def count(self, state: int) -> int:
        """How many blocks are in ``state``."""
        return self._counts[state]

    def state(self, block: int) -> int:
        """The state of one block."""
        return self._state[block]

    @property
    def metadata_bytes(self) -> int:
        """Bytes this allocator holds: the state array and the stack of returned runs."""
        return sys.getsizeof(self._state) + self._free.metadata_bytes

    # -- take, release, move --------------------------------------------------------------------

    def take(self, n: int, state: int = LEASED, *, packed: bool = False) -> list[int] | array:
        """Take ``n`` free blocks (most recently returned first) into ``state``; the caller made sure they exist.

        ``packed``: as an ``array('q')`` (what a tree node holds: 8 bytes a block, no int per block),
        a BlockRun (its runs: the stack entries and fresh blocks it came from) unless it took from
        more than PIECES_IN_PYTHON entries.
        """
        if n > self.free_count:
            raise RuntimeError(f"allocator: {n} blocks requested, {self.free_count} free")
        if n <= 0:
            return array("q") if packed else []
        reuse = min(n, self._free.held)
        pieces = self._free.pop(reuse) if reuse else []
        if n > reuse:
            pieces.append((self._fresh, n - reuse, 1))
            self._fresh += n - reuse
        if len(pieces) <= PIECES_IN_PYTHON:
            for start, count, step in pieces:
                self._fill(start, count, step, state)
            if packed:
                ids = BlockRun.joined(pieces)
            elif n < _NUMPY_FROM:
                ids = []
                for start, count, step in pieces:
                    ids += range(start, start + count * step, step)
            else:
                ids = expand(*zip(*pieces)).tolist()
        else:
            idx = expand(*zip(*pieces))
            self._view[idx] = state
            ids = self._joined(idx, packed)
        self._counts[FREE] -= n
        self._counts[state] += n
        return ids

    @staticmethod
    def _joined(idx: np.ndarray, packed: bool):
        if not packed:
            return idx.tolist()
        ids = array("q")
        ids.frombytes(idx.view(np.uint8))
        return ids

    def _fill(self, start: int, count: int, step: int, state: int) -> None:
        """Put the run ``start, start + step, ...`` (``count`` ids) into ``state``."""
        lo = start if step > 0 else start - count + 1
        if count < _NUMPY_FROM:
            self._state[lo : lo + count] = bytes((state,)) * count
        else:
            self._view[lo : lo + count] = state  # a memset

    def _run_span(self, run: BlockRun) -> tuple[int, int, int]:
        """``(first, lo, hi)`` of a run: its first id and the lowest and highest."""
        first, last = _get(run, 0), _get(run, -1)
        return (first, first, last) if first <= last else (first, last, first)

    def release(self, ids) -> None:
        """Return blocks to the free stack (they must not be free already).

        ``ids``: a list, an ``array('q')`` (evicted pages: the tree's own arrays, which numpy
        reads in place) or a BlockRun (O(1) Python steps: one slice, one stack entry).
        """
        n = len(ids)
        if not n:
            return
        # Validate first: a double free is a store bug, and must not corrupt the stack.
        if type(ids) is BlockRun:
            if ids.runs is None:
                first, lo, hi = self._run_span(ids)
                st = self._state
                free_at = st.find(FREE, lo, hi + 1)
                if free_at >= 0:
                    raise RuntimeError(f"allocator: block {free_at} freed twice")
                leased = st.count(LEASED, lo, hi + 1) if st.find(LEASED, lo, hi + 1) >= 0 else 0
                self._fill(lo, n, 1, FREE)
                self._free.push_run(first, n if first <= _get(ids, -1) else -n)
            else:
                leased = self._release_pieces(ids.runs)
        elif n < _NUMPY_FROM:
            if type(ids) is not list:
                ids = list(ids)
            states = bytes(map(self._state.__getitem__, ids))
            if FREE in states:
                raise RuntimeError(f"allocator: block {ids[states.index(FREE)]} freed twice")
            if n > 1 and len(set(ids)) != n:
                raise RuntimeError("allocator: duplicate ids in one release")
            leased = states.count(LEASED)
            self._set_few(ids, n, FREE)
            self._free.push(ids, n)
        else:
            idx = np.asarray(ids, np.int64)
            firsts, lengths = runs_of(idx)
            if len(firsts) * _IDS_PER_RUN <= n:  # few runs (a node's blocks taken from several): per run
                leased = self._release_spans(firsts, lengths)
            else:
                states = self._view[idx]
                if not states.all():
                    raise RuntimeError(f"allocator: block {int(idx[np.argmin(states)])} freed twice")
                leased = int(np.count_nonzero(states == LEASED))
                self._set_distinct(idx, states, n, FREE, "release")
            self._free.push_runs(firsts, lengths, n)
        counts = self._counts
        counts[TREE] -= n - leased
        counts[LEASED] -= leased
        counts[FREE] += n

    def _release_pieces(self, pieces: tuple) -> int:
        """Free the runs of a BlockRun (distinct by construction) after checking that none is free, and
        push them in order; returns how many were LEASED."""
        st, find = self._state, self._state.find
        leased = 0
        spans = []
        for start, count, step in pieces:
            lo, hi = (start, start + count) if step > 0 else (start - count + 1, start + 1)
            at = find(FREE, lo, hi)
            if at >= 0:
                raise RuntimeError(f"allocator: block {at} freed twice")
            if find(LEASED, lo, hi) >= 0:
                leased += st.count(LEASED, lo, hi)
            spans.append((lo, hi))
        view, push = self._view, self._free.push_run
        for (lo, hi), (start, count, step) in zip(spans, pieces):
            view[lo:hi] = FREE
            push(start, count if step > 0 else -count)
        return leased

    def _release_spans(self, firsts: np.ndarray, lengths: np.ndarray) -> int:
        """Free the runs ``firsts``/``lengths`` (of one release) after checking them all: not free, and
        no two overlapping; returns how many were LEASED."""
        sizes = np.abs(lengths)
        lasts = firsts + (sizes - 1) * np.sign(lengths)
        los, his = np.minimum(firsts, lasts), np.maximum(firsts, lasts) + 1
        order = np.argsort(los, kind="stable")
        if (los[order][1:] < his[order][:-1]).any():
            raise RuntimeError("allocator: duplicate ids in one release")
        spans = list(zip(los.tolist(), his.tolist()))
        st, find = self._state, self._state.find
        leased = 0
        for lo, hi in spans:
            at = find(FREE, lo, hi)
            if at >= 0:
                raise RuntimeError(f"allocator: block {at} freed twice")
            if find(LEASED, lo, hi) >= 0:
                leased += st.count(LEASED, lo, hi)
        view = self._view
        for lo, hi in spans:
            view[lo:hi] = FREE
        return leased

    def release_runs(self, runs: list[BlockRun]) -> None:
        """``release`` of each BlockRun of ``runs`` in turn (an eviction's leaves), in one call: the
        same checks, stack and states, with no call per run."""
        st, view, find, get = self._state, self._view, self._state.find, _get
        free = self._free
        firsts, lengths, push = free.firsts, free.lengths, free.push_run
        leased = total = appended = 0  # appended: ids put on the stack's arrays, not yet in free.held
        try:
            for run in runs:
                n = len(run)
                if run.runs is not None:  # several runs: checked together, then freed
                    leased += self._release_pieces(run.runs)
                    total += n
                    continue
                first, last = get(run, 0), get(run, -1)
                lo, hi = (first, last + 1) if first <= last else (last, first + 1)
                if n >= _COUNTED_BELOW or st.count(TREE, lo, hi) != n:  # not all TREE (an evicted leaf's are)
                    at = find(FREE, lo, hi)
                    if at >= 0:
                        raise RuntimeError(f"allocator: block {at} freed twice")
                    if find(LEASED, lo, hi) >= 0:
                        leased += st.count(LEASED, lo, hi)
                if n < _NUMPY_FROM:
                    st[lo:hi] = bytes(n)
                else:
                    view[lo:hi] = FREE  # a memset
                if n == 1 or not lengths:
                    push(first, n if first <= last else -n)
                else:
                    firsts.append(first)
                    lengths.append(n if first <= last else -n)
                    appended += n
                total += n
        finally:  # on a refusal the runs before it stay released, and counted
            free.held += appended
            self._counted(total, leased)

    def _counted(self, n: int, leased: int) -> None:
        """``n`` blocks, ``leased`` of them LEASED and the rest TREE, were freed."""
        counts = self._counts
        counts[TREE] -= n - leased
        counts[LEASED] -= leased
        counts[FREE] += n

    def move(self, ids, src: int, dst: int) -> None:
        """Change the state of held blocks (LEASED -> TREE when a write is committed).

        ``ids``: a list, an ``array('q')`` (which numpy reads in place) or a BlockRun (one slice).
        """
        n = len(ids)
        if not n:
            return
        if type(ids) is BlockRun:
            pieces = ids.pieces()
            for start, count, step in pieces:  # all checked before any changes
                lo = start if step > 0 else start - count + 1
                for other in (FREE, TREE, LEASED):
                    at = self._state.find(other, lo, lo + count) if other != src else -1
                    if at >= 0:
                        raise RuntimeError(f"allocator: block {at} is {STATE_NAMES[other]}, "
                                           f"expected {STATE_NAMES[src]}")
            for start, count, step in pieces:
                self._fill(start, count, step, dst)
        elif n < _NUMPY_FROM:
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
            states = self._view[idx]
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
        window = self._view[lo : hi + 1]
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
            self._view[idx] = state

    def stack(self) -> np.ndarray:
        """The ids on the free stack, bottom first (the last is reused first)."""
        return self._free.ids()

    def check(self) -> list[str]:
        """Violations of the allocator's own invariants (empty when consistent)."""
        problems = self._free.check()
        stacked = self.stack()
        ordered = np.sort(stacked)
        for b in np.unique(ordered[1:][ordered[1:] == ordered[:-1]]).tolist()[:10]:
            problems.append(f"block {b} twice on the free stack")
        for b in stacked[(stacked < self.first) | (stacked >= self._fresh)].tolist()[:10]:
            problems.append(f"block {b} on the free stack but never handed out")
        inside = stacked[(stacked >= self.first) & (stacked < self._fresh)]
        for b in inside[self._view[inside] != FREE].tolist()[:10]:
            problems.append(f"block {b} on the free stack but {STATE_NAMES[self._state[b]]}")
        if self._state.count(FREE, self._fresh, self.end) != self.end - self._fresh:
            problems.append(f"a block at or above {self._fresh} (never handed out) is not free")
        actual = [self._state.count(s, self.first, self.end) for s in (FREE, TREE, LEASED)]
        if actual != self._counts:
            problems.append(f"state counts {self._counts} != actual {actual}")
        if actual[FREE] != self.free_count:
            problems.append(f"{actual[FREE]} blocks marked free but {self.free_count} on the free lists")
        return problems
