"""A ghost: what a policy remembers of recently evicted leaves, oldest forgotten first, in few bytes.

``reuse`` and ``tempo`` keep a few fields per evicted leaf (its last access tick, what it had
learned), keyed by a crc32 of one of its pages, and forget the oldest beyond a bound that follows
the candidates (``limit``). An OrderedDict of tuples would do that with the ordered dict's links,
the tuple and a Python object per field; here the fields are packed into one int with the
entry's insertion number (``struct`` bytes, so floats come back bit for bit), and the age order
is a deque of keys: the same entries forgotten in the same order, in fewer bytes.

A key put again, or popped, leaves its old deque slot behind; a slot is the live one only
when the entry's number matches its position, so the oldest live entry is still found
first, and the deque is rebuilt (O(n), once per n stale slots) when stale slots outnumber
the live ones.
"""

from __future__ import annotations

import struct
from collections import deque

# An entry's number only tells its live deque slot from stale ones of its key, which lie fewer
# slots before it than the deque holds (< 2 x 2**18 + 65): 32 bits of it tell them apart.
_SEQ_BITS = 32
_SEQ_MASK = (1 << _SEQ_BITS) - 1
_COMPACT_SLACK = 64
GHOST_MIN = 4096  # entries a policy's ghost keeps at least ...
GHOST_PER_LEAF = 4  # ... and up to this many per indexed candidate ...
GHOST_MAX = 1 << 18  # ... but never more
ENTRY_BYTES = 165  # a dict entry, its int key and its record int (research.policy_memory, CPython 3.11)


def limit(live: int) -> int:
    """The entries a ghost keeps for a policy indexing ``live`` candidates."""
    return max(GHOST_MIN, min(GHOST_PER_LEAF * live, GHOST_MAX))


class Ghost:
    """A bounded map of int keys to fixed-format records, forgetting the least recently put first."""

    __slots__ = ("_entries", "_format", "_head", "_order", "_seq")

    def __init__(self, fields: str) -> None:
        """``fields``: the records' struct format (``q`` for ints, ``d`` for floats, ``?`` for bools)."""
        self._format = struct.Struct("<" + fields)
        self._entries: dict[int, int] = {}  # key -> fields packed above an insertion number (its low bits)
        self._order: deque[int] = deque()  # keys in insertion order; stale slots among them
        self._head = 0  # the insertion number of _order[0]
        self._seq = 0  # the next insertion number

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def put(self, key: int, *fields) -> None:
        """Remember ``fields`` under ``key``, as the newest entry (an older one under ``key`` goes)."""
        entries = self._entries
        if entries.pop(key, None) is not None:  # dict order stays insertion order (compaction reads it)
            self._maybe_compact()
        seq = self._seq
        self._seq = seq + 1
        entries[key] = int.from_bytes(self._format.pack(*fields), "little") << _SEQ_BITS | (seq & _SEQ_MASK)
        self._order.append(key)

    def pop(self, key: int) -> tuple | None:
        """The record under ``key``, forgotten; None when there is none."""
        value = self._entries.pop(key, None)
        if value is None:
            return None
        self._maybe_compact()
        return self._format.unpack((value >> _SEQ_BITS).to_bytes(self._format.size, "little"))

    def trim(self, limit: int) -> None:
        """Forget the oldest entries until at most ``limit`` are left."""
        entries = self._entries
        order = self._order
        while len(entries) > limit:
            key = order.popleft()
            seq = self._head
            self._head = seq + 1
            value = entries.get(key)
            if value is not None and value & _SEQ_MASK == seq & _SEQ_MASK:  # (else a stale slot)
                del entries[key]

    def _maybe_compact(self) -> None:
        entries = self._entries
        if len(self._order) > 2 * len(entries) + _COMPACT_SLACK:
            # Renumber the live entries in their (insertion) order: slot i holds number head + i.
            head = self._head
            for i, key in enumerate(entries):
                entries[key] = (entries[key] >> _SEQ_BITS << _SEQ_BITS) | ((head + i) & _SEQ_MASK)
            self._order = deque(entries)
            self._seq = head + len(entries)

    def memory_bytes(self) -> int:
        """About what the ghost holds: per entry its dict entry, key and record ints, per slot 8 bytes."""
        return len(self._entries) * ENTRY_BYTES + len(self._order) * 8

    def keys(self) -> list[int]:
        """The keys, oldest first (for tests and checks)."""
        return list(self._entries)
