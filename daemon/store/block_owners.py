"""Whose bytes a block may still hold: a writer's fresh blocks are zeroed only when they could show another's.

The rule (PFXALLOC): a block handed to a writer under an allocation lease never shows bytes that another
namespace put there. A writer may commit blocks it never wrote, and whatever they hold is then served
under its namespace; zeroing every block on the way out guarantees the rule, at a memset per block on
the write path (as much memory traffic as the writer's own copy).

Theory of operation: every block carries a label, the namespace whose bytes it may hold, or 0 when
that is not known. Only the allocation path gives a label: the blocks it hands to namespace N are
zeroed unless their label is already N (they hold N's own bytes, from N's own writers), then labelled
N. Blocks taken for any other write (an insert copying the request's bytes, a promotion from a lower
tier, a snapshot load) are labelled 0 when taken, since such a write can stop part way and leave a
block unwritten: their next allocation zeroes them. Labels survive eviction and release on purpose,
that is what they are for.

A namespace's label is a small number given on its first allocation and never reused, so two names
never share one. Labels are 16-bit (2 bytes a block); past 65,535 labelled namespaces, new ones get 0
and their blocks are always zeroed, as before labels existed. Until the first allocation there is no
label array and forgetting costs nothing: a store that is only written by copy pays nothing for this.
"""

from __future__ import annotations

from array import array

import numpy as np

#: The most namespaces that get a label of their own (label 0 means "unknown: zero it").
MAX_LABELS = 2**16 - 1


def _indices(ids) -> np.ndarray:
    if isinstance(ids, array) and ids.typecode == "q":  # a tree node's ids: read in place
        return np.frombuffer(ids, dtype=np.int64) if len(ids) else np.empty(0, np.int64)
    return np.asarray(ids, dtype=np.int64)


class BlockOwners:
    """Per-block namespace labels over ``nblocks`` block ids (see the module docstring)."""

    __slots__ = ("_nblocks", "_labels", "_numbers")

    def __init__(self, nblocks: int) -> None:
        self._nblocks = nblocks
        self._labels: np.ndarray | None = None  # made on the first allocation
        self._numbers: dict[bytes, int] = {}

    @property
    def metadata_bytes(self) -> int:
        """Bytes of the label array (0 until the first allocation)."""
        return 0 if self._labels is None else self._labels.nbytes

    def _number(self, name: bytes) -> int:
        number = self._numbers.get(name)
        if number is None:
            number = len(self._numbers) + 1 if len(self._numbers) < MAX_LABELS else 0
            if number:
                self._numbers[name] = number
        return number

    def hand_to(self, ids, name: bytes) -> np.ndarray:
        """Label ``ids`` as ``name``'s; returns those that must be zeroed first (labelled otherwise)."""
        idx = _indices(ids)
        labels = self._labels
        if labels is None:
            labels = self._labels = np.zeros(self._nblocks, np.uint16)
        number = self._number(name)
        stale = idx if number == 0 else idx[labels[idx] != number]
        labels[idx] = number
        return stale

    def forget(self, ids) -> None:
        """``ids`` are taken for a write that may stop part way: their next allocation zeroes them."""
        if self._labels is not None and len(ids):
            self._labels[_indices(ids)] = 0
