"""The disk tier's catalog: which pages the disk holds, in which slot, and which go next.

Rules:

- Plain data for the event-loop thread: no I/O, no threads, no trio. Every operation costs
  O(pages touched · log n); only ``flush``, ``load`` and ``check`` walk everything.
- A page is a record keyed by its 16-byte ``ident`` and chained to its ``parent`` ident (the
  namespace's seed ident for a first page). A record is *present* from ``reserve`` until it is
  evicted or removed; only present records are found by ``get``/``run`` and counted.
- A slot belongs to at most one record at a time. It comes free when the catalog hands its
  record back in a list of removed records, and the caller then zeroes it on disk -- except for
  the records ``reserve`` evicts, whose slots that same call may hand out again at once.
- Eviction goes leaf first: a record with a present child is never a victim, so the disk keeps
  whole prefixes. Among leaves the least recently used goes first (``last_use``, then ``seq``).
- I/O in flight is safe: a record being written (``"writing"``) or read (pinned) is never
  evicted and its slot never handed out. Removing one only marks it ``dead``: it is gone for
  lookups and counts at once, and its slot comes free at ``commit`` or at its last ``unpin``.
- The caller keeps the prefix property: a lookup computes the idents of its prompt and asks
  ``run`` for the leading run of ready records. A record whose parent is absent is merely
  unreachable, never wrong, so removing one record never has to remove its descendants.
- A group (a tenant or partition, ``group_of(namespace)``) may be bounded with ``set_limit``.
  A page of a group at its bound makes room by evicting that group's own leaves; any other
  page takes a free slot or, failing that, evicts the globally least recently used leaf.

Theory of operation: ``_records`` maps each present record's ident to it; ``_dead`` maps the
slots of dead records still under I/O to them. ``_children`` indexes present records by
parent ident -- the value is the only child's ident, or a set when there are several, since
most pages have one child and a set per page would cost ~200 bytes -- so a leaf test is one
dict probe and ``drop_subtree`` walks down without scanning. Free slots are a stack of
returned slots (reused last-in first-out) above a counter of slots never handed out, so a
new catalog costs nothing per slot.

Eviction candidates are the ready, unpinned leaves. They live in lazy heaps of
``(last_use, seq, ident)``: one for the whole catalog and one per group. An entry is pushed
whenever a record becomes a candidate (committed, last unpin, touched, its last child gone,
loaded) and is checked when it reaches the top: it is valid only while its record is present
with that seq and last_use and is still a candidate. Every other entry is stale and dropped
on the way; a heap is filtered when stale entries outnumber its group's records.
"""

from __future__ import annotations

import heapq
import time
from array import array
from collections.abc import Callable, Hashable, Iterable, Sequence

WRITING = "writing"
READY = "ready"

#: Stale heap entries tolerated beyond twice the records before a heap is filtered.
_COMPACT_SLACK = 64


class DiskRecord:
    """One page on disk: its identity, its slot, its LRU keys and what I/O holds it."""

    __slots__ = ("ident", "parent", "namespace", "group", "slot", "seq", "last_use", "freq", "state",
                 "pins", "dead")

    def __init__(self, ident: bytes, parent: bytes, namespace: bytes, group: Hashable, slot: int,
                 seq: int, last_use: float, state: str) -> None:
        self.ident = ident
        self.parent = parent
        self.namespace = namespace
        self.group = group
        self.slot = slot
        self.seq = seq
        self.last_use = last_use
        self.freq = 0
        self.state = state
        self.pins = 0  # reads in flight
        self.dead = False  # removed while under I/O: gone for lookups, slot still held

    def __repr__(self) -> str:
        flags = f"{' pins=%d' % self.pins if self.pins else ''}{' dead' if self.dead else ''}"
        return f"<DiskRecord {self.ident.hex()} slot={self.slot} seq={self.seq} {self.state}{flags}>"


class DiskCatalog:
    """The records of a disk tier of ``nslots`` fixed slots, and the order they are evicted in."""

    def __init__(self, nslots: int, *, clock: Callable[[], float] = time.monotonic,
                 group_of: Callable[[bytes], Hashable] = lambda namespace: None) -> None:
        if nslots < 0:
            raise ValueError(f"nslots must be >= 0, not {nslots}")
        self.nslots = nslots
        self.evictions = 0
        self._clock = clock
        self._group_of = group_of
        self._next_seq = 1
        self._records: dict[bytes, DiskRecord] = {}
        self._dead: dict[int, DiskRecord] = {}  # slot -> dead record still pinned or being written
        self._children: dict[bytes, bytes | set[bytes]] = {}
        self._ns_idents: dict[bytes, set[bytes]] = {}
        self._group_pages: dict[Hashable, int] = {}
        self._limits: dict[Hashable, int] = {}
        self._writing = 0  # present records in state "writing"
        self._pinned = 0  # records, present or dead, with pins
        self._fresh = 0  # slots _fresh..nslots-1 were never handed out
        self._returned = array("I" if nslots <= 2**32 else "Q")  # freed slots, reused last first
        self._heap: list[tuple] = []
        self._group_heaps: dict[Hashable, list[tuple]] = {}

    # -- figures ----------------------------------------------------------------------------------

    @property
    def pages(self) -> int:
        """Records present (writing or ready; dead ones excluded)."""
        return len(self._records)

    @property
    def free_slots(self) -> int:
        return len(self._returned) + self.nslots - self._fresh

    @property
    def next_seq(self) -> int:
        """The seq the next reserved record gets: above every seq handed out or loaded."""
        return self._next_seq

    def by_namespace(self, namespace: bytes) -> int:
        idents = self._ns_idents.get(namespace)
        return len(idents) if idents else 0

    def by_group(self, group: Hashable) -> int:
        return self._group_pages.get(group, 0)

    def stats(self) -> dict:
        return {"pages": len(self._records), "free_slots": self.free_slots, "evictions": self.evictions,
                "writing": self._writing, "pinned": self._pinned, "dead": len(self._dead)}

    def set_limit(self, group: Hashable, pages: int | None) -> None:
        """Bound ``group`` to ``pages`` present records (None: no bound; 0: it takes no page).

        Nothing is evicted now: the group's next reservation evicts its own leaves until it is
        under the bound, and gets None if they run out first.
        """
        if pages is None:
            self._limits.pop(group, None)
        elif pages < 0:
            raise ValueError(f"a group's page limit must be >= 0, not {pages}")
        else:
            self._limits[group] = pages

    # -- lookups ----------------------------------------------------------------------------------

    def run(self, idents: Sequence[bytes]) -> int:
        """How many leading ``idents`` are present and ready (the first absent or writing one ends it)."""
        records = self._records
        n = 0
        for ident in idents:
            record = records.get(ident)
            if record is None or record.state != READY:
                break
            n += 1
        return n

    def get(self, ident: bytes) -> DiskRecord | None:
        return self._records.get(ident)

    # -- writes -----------------------------------------------------------------------------------

    def reserve(self, pages: Sequence[tuple[bytes, bytes, bytes]]
                ) -> tuple[list[DiskRecord | None], list[DiskRecord]]:
        """A "writing" record and a slot per new page of ``pages`` ((ident, parent, namespace), in prefix order).

        A page already present gets None. So does a page there is no room for, and every later page
        whose parent got None that way (it could never be reached). The parents of the call's pages
        are never evicted by it, nor are the records it reserves (they are writing), so what it
        reserves stays chained. Returns the records (or None) per page, and the records evicted
        to make room: those are gone and their slots may already belong to this call's records.
        """
        now = self._clock()
        keep = {parent for _, parent, _ in pages}
        failed: set[bytes] = set()
        reserved: list[DiskRecord | None] = []
        evicted: list[DiskRecord] = []
        for ident, parent, namespace in pages:
            if ident in self._records:
                reserved.append(None)
                continue
            group = self._group_of(namespace)
            if parent in failed or not self._make_room(group, keep, evicted):
                failed.add(ident)
                reserved.append(None)
                continue
            record = DiskRecord(ident, parent, namespace, group, self._take_slot(), self._next_seq, now, WRITING)
            self._next_seq += 1
            self._attach(record)
            reserved.append(record)
        return reserved, evicted

    def commit(self, records: Sequence[DiskRecord], ok: Sequence[bool]) -> list[DiskRecord]:
        """End writes: a record whose ``ok`` is true becomes ready, the others are removed.

        A record removed while it was being written is removed now whatever ``ok`` says.
        Returns the records removed (their slots are free: the caller zeroes them).
        """
        if len(records) != len(ok):
            raise ValueError(f"commit: {len(records)} records but {len(ok)} results")
        for record in records:
            if record.state != WRITING or not self._holds(record):
                raise ValueError(f"commit: {record!r} is not being written in this catalog")
        if len({id(record) for record in records}) != len(records):
            raise ValueError("commit: a record appears twice")
        removed = []
        for record, good in zip(records, ok):
            if record.dead:
                self._release_dead(record)
                removed.append(record)
            elif good:
                record.state = READY
                self._writing -= 1
                if self._evictable(record):
                    self._push(record)
            else:
                self._detach(record)
                self._free_slot(record.slot)
                removed.append(record)
        return removed

    # -- reads ------------------------------------------------------------------------------------

    def pin(self, idents: Sequence[bytes]) -> list[DiskRecord]:
        """Pin the leading run of ready records of ``idents`` for a read; returns them (maybe fewer)."""
        records = self._records
        pinned = []
        for ident in idents:
            record = records.get(ident)
            if record is None or record.state != READY:
                break
            if not record.pins:
                self._pinned += 1
            record.pins += 1
            pinned.append(record)
        return pinned

    def unpin(self, records: Sequence[DiskRecord]) -> list[DiskRecord]:
        """Release pins ``pin`` took; returns the dead records whose last pin this was (slots now free)."""
        counts: dict[int, int] = {}
        for record in records:
            counts[id(record)] = counts.get(id(record), 0) + 1
            if counts[id(record)] > record.pins or not self._holds(record):
                raise ValueError(f"unpin: {record!r} is not pinned that often in this catalog")
        released = []
        for record in records:
            record.pins -= 1
            if record.pins:
                continue
            self._pinned -= 1
            if record.dead:
                self._release_dead(record)
                released.append(record)
            elif self._evictable(record):
                self._push(record)
        return released

    def touch(self, records: Sequence[DiskRecord]) -> None:
        """A hit on ``records``: they become the most recently used (dead or foreign ones are skipped)."""
        now = self._clock()
        for record in records:
            if record.dead or self._records.get(record.ident) is not record:
                continue
            record.last_use = now
            record.freq += 1
            if self._evictable(record):
                self._push(record)  # the entry with the old last_use is stale now

    # -- removals ---------------------------------------------------------------------------------

    def remove(self, idents: Sequence[bytes]) -> list[DiskRecord]:
        """Remove those records only (e.g. failed verification); returns those removed now."""
        removed: list[DiskRecord] = []
        for ident in idents:
            record = self._records.get(ident)
            if record is not None:
                self._drop(record, removed)
        return removed

    def drop_subtree(self, ident: bytes) -> list[DiskRecord]:
        """Remove the record ``ident`` (if present) and every present record chained below it.

        ``ident`` need not be present itself: when a page leaves RAM without a disk copy, its disk
        descendants go this way. Returns the records removed now.
        """
        records = self._records
        order = [records[ident]] if ident in records else []
        seen = {ident}
        stack = [ident]
        while stack:
            for child in self._children_of(stack.pop()):
                if child not in seen:  # idents are hashes, but a bad chain must not loop
                    seen.add(child)
                    stack.append(child)
                    order.append(records[child])
        removed: list[DiskRecord] = []
        for record in order:  # parents before children: no parent is pushed as a candidate on the way
            self._drop(record, removed)
        return removed

    def drop_namespace(self, namespace: bytes) -> list[DiskRecord]:
        """Remove every record of ``namespace``; returns those removed now."""
        removed: list[DiskRecord] = []
        for ident in list(self._ns_idents.get(namespace, ())):
            self._drop(self._records[ident], removed)
        return removed

    def flush(self) -> list[DiskRecord]:
        """Remove every record; returns those removed now (the others are dead until their I/O ends)."""
        removed = []
        for record in self._records.values():
            if record.pins or record.state == WRITING:
                record.dead = True
                self._dead[record.slot] = record
            else:
                self._free_slot(record.slot)
                removed.append(record)
        self._records.clear()
        self._children.clear()
        self._ns_idents.clear()
        self._group_pages.clear()
        self._heap = []
        self._group_heaps.clear()
        self._writing = 0
        return removed

    # -- start-up ---------------------------------------------------------------------------------

    def load(self, headers: Iterable) -> list[int]:
        """Fill an empty catalog from a scan's record headers (``.ident .parent .namespace .seq .slot``).

        The highest seq wins, per ident and per slot; the winners are ready records. Returns the
        slots held only by losers, in ascending order, for the caller to clear.
        """
        if self._records or self._dead or self.free_slots != self.nslots:
            raise RuntimeError("load: the catalog is not empty")
        headers = list(headers)
        for header in headers:
            if not 0 <= header.slot < self.nslots:
                raise ValueError(f"load: slot {header.slot} out of range 0..{self.nslots - 1}")
        headers.sort(key=lambda header: header.seq, reverse=True)  # stable: ties keep scan order
        now = self._clock()
        owned: set[int] = set()
        lost: set[int] = set()
        claimed_slots: set[int] = set()
        claimed_idents: set[bytes] = set()
        for header in headers:
            # Only the newest header of its ident *and* of its slot wins: an ident whose newest copy
            # lost its slot was removed since, and an older copy of it must not come back.
            wins = header.slot not in claimed_slots and header.ident not in claimed_idents
            claimed_slots.add(header.slot)
            claimed_idents.add(header.ident)
            if not wins:
                lost.add(header.slot)
                continue
            owned.add(header.slot)
            record = DiskRecord(header.ident, header.parent, header.namespace,
                                self._group_of(header.namespace), header.slot, header.seq, now, READY)
            self._attach(record)
            self._next_seq = max(self._next_seq, header.seq + 1)
        self._fresh = max(owned) + 1 if owned else 0
        self._returned = array(self._returned.typecode, (s for s in range(self._fresh - 1, -1, -1) if s not in owned))
        entries: dict[Hashable, list[tuple]] = {}
        for record in self._records.values():
            if self._evictable(record):
                entries.setdefault(record.group, []).append((record.last_use, record.seq, record.ident))
        self._heap = [entry for group in entries.values() for entry in group]
        heapq.heapify(self._heap)
        for group, heap in entries.items():
            heapq.heapify(heap)
            self._group_heaps[group] = heap
        return sorted(lost - owned)

    # -- consistency ------------------------------------------------------------------------------

    def check(self) -> list[str]:
        """Violations of the catalog's invariants (empty when consistent)."""
        problems = []
        owner: dict[int, DiskRecord] = {}
        every = list(self._records.values()) + list(self._dead.values())
        for record in every:
            if not 0 <= record.slot < self.nslots:
                problems.append(f"{record!r}: slot out of range")
            elif record.slot in owner:
                problems.append(f"slot {record.slot} owned by {owner[record.slot]!r} and {record!r}")
            owner[record.slot] = record
            if record.pins < 0:
                problems.append(f"{record!r}: negative pins")
            if record.state not in (WRITING, READY):
                problems.append(f"{record!r}: unknown state")
            if record.seq >= self._next_seq:
                problems.append(f"{record!r}: seq not below next_seq {self._next_seq}")
        for ident, record in self._records.items():
            if record.ident != ident or record.dead:
                problems.append(f"{record!r} indexed as present under {ident.hex()}")
        for slot, record in self._dead.items():
            if record.slot != slot or not record.dead or not (record.pins or record.state == WRITING):
                problems.append(f"{record!r} kept dead under slot {slot} with no I/O holding it")
        free = set(self._returned)
        if len(free) != len(self._returned):
            problems.append("a slot is twice on the free stack")
        if any(not 0 <= slot < self._fresh for slot in free):
            problems.append("a slot on the free stack was never handed out")
        for slot, record in owner.items():
            if slot in free or slot >= self._fresh:
                problems.append(f"slot {slot} is free but owned by {record!r}")
        if len(owner) + self.free_slots != self.nslots:
            problems.append(f"{len(owner)} owned + {self.free_slots} free slots != {self.nslots}")
        children: dict[bytes, set[bytes]] = {}
        ns_idents: dict[bytes, set[bytes]] = {}
        group_pages: dict[Hashable, int] = {}
        for record in self._records.values():
            children.setdefault(record.parent, set()).add(record.ident)
            ns_idents.setdefault(record.namespace, set()).add(record.ident)
            group_pages[record.group] = group_pages.get(record.group, 0) + 1
        indexed = {parent: set(self._children_of(parent)) for parent in self._children}
        if indexed != children:
            problems.append("the children index differs from the parents of present records")
        if self._ns_idents != ns_idents:
            problems.append("per-namespace records differ from the present records")
        if self._group_pages != group_pages:
            problems.append(f"per-group counts {self._group_pages} != actual {group_pages}")
        writing = sum(record.state == WRITING for record in self._records.values())
        if writing != self._writing:
            problems.append(f"writing count {self._writing} != actual {writing}")
        pinned = sum(record.pins > 0 for record in every)
        if pinned != self._pinned:
            problems.append(f"pinned count {self._pinned} != actual {pinned}")
        in_heap = {entry[1] for entry in self._heap if self._valid(entry)}
        in_group = {g: {entry[1] for entry in heap if self._valid(entry)} for g, heap in self._group_heaps.items()}
        for record in self._records.values():
            if self._evictable(record):
                if record.seq not in in_heap:
                    problems.append(f"{record!r}: a candidate missing from the LRU order")
                if record.seq not in in_group.get(record.group, ()):
                    problems.append(f"{record!r}: a candidate missing from its group's LRU order")
        return problems

    # -- internals --------------------------------------------------------------------------------

    def _holds(self, record: DiskRecord) -> bool:
        """Whether ``record`` is one of this catalog's (present, or dead and still holding its slot)."""
        if record.dead:
            return self._dead.get(record.slot) is record
        return self._records.get(record.ident) is record

    def _children_of(self, ident: bytes) -> Iterable[bytes]:
        kids = self._children.get(ident)
        if kids is None:
            return ()
        return (kids,) if type(kids) is bytes else kids

    def _evictable(self, record: DiskRecord) -> bool:
        return (record.state == READY and not record.pins and not record.dead
                and record.ident not in self._children)

    def _valid(self, entry: tuple) -> bool:
        """Whether a heap entry still stands for a candidate with these keys."""
        last_use, seq, ident = entry
        record = self._records.get(ident)
        return (record is not None and record.seq == seq and record.last_use == last_use
                and self._evictable(record))

    def _attach(self, record: DiskRecord) -> None:
        """Make ``record`` present: indexed, counted, chained to its parent."""
        ident = record.ident
        self._records[ident] = record
        if record.state == WRITING:
            self._writing += 1
        self._ns_idents.setdefault(record.namespace, set()).add(ident)
        self._group_pages[record.group] = self._group_pages.get(record.group, 0) + 1
        kids = self._children.get(record.parent)
        if kids is None:
            self._children[record.parent] = ident
        elif type(kids) is bytes:
            self._children[record.parent] = {kids, ident}
        else:
            kids.add(ident)

    def _detach(self, record: DiskRecord) -> None:
        """Make ``record`` absent: unindexed, uncounted; a parent left with no child becomes a candidate."""
        ident = record.ident
        del self._records[ident]
        if record.state == WRITING:
            self._writing -= 1
        idents = self._ns_idents[record.namespace]
        idents.discard(ident)
        if not idents:
            del self._ns_idents[record.namespace]
        left = self._group_pages[record.group] - 1
        if left:
            self._group_pages[record.group] = left
        else:
            del self._group_pages[record.group]
            self._group_heaps.pop(record.group, None)  # every entry in it is stale now
        kids = self._children[record.parent]
        if type(kids) is bytes:
            del self._children[record.parent]
            parent = self._records.get(record.parent)
            if parent is not None and self._evictable(parent):
                self._push(parent)
        else:
            kids.discard(ident)
            if len(kids) == 1:
                self._children[record.parent] = next(iter(kids))

    def _drop(self, record: DiskRecord, removed: list[DiskRecord]) -> None:
        """Remove a present record: now if no I/O holds it (appended to ``removed``), else once it ends."""
        self._detach(record)
        if record.pins or record.state == WRITING:
            record.dead = True
            self._dead[record.slot] = record
        else:
            self._free_slot(record.slot)
            removed.append(record)

    def _release_dead(self, record: DiskRecord) -> None:
        del self._dead[record.slot]
        self._free_slot(record.slot)

    def _take_slot(self) -> int:
        if self._returned:
            return self._returned.pop()
        slot = self._fresh
        self._fresh += 1
        return slot

    def _free_slot(self, slot: int) -> None:
        self._returned.append(slot)

    def _push(self, record: DiskRecord) -> None:
        """File a new candidate entry in the global heap and its group's."""
        entry = (record.last_use, record.seq, record.ident)
        heapq.heappush(self._heap, entry)
        if len(self._heap) > 2 * len(self._records) + _COMPACT_SLACK:
            self._heap = self._compacted(self._heap)
        heap = self._group_heaps.get(record.group)
        if heap is None:
            heap = self._group_heaps[record.group] = []
        heapq.heappush(heap, entry)
        if len(heap) > 2 * self._group_pages.get(record.group, 0) + _COMPACT_SLACK:
            self._group_heaps[record.group] = self._compacted(heap)

    def _compacted(self, heap: list[tuple]) -> list[tuple]:
        """``heap`` without stale or repeated entries: O(len), paid for by the stale pushes before it."""
        live = list({entry for entry in heap if self._valid(entry)})
        heapq.heapify(live)
        return live

    def _pop_victim(self, heap: list[tuple] | None, keep: set[bytes]) -> DiskRecord | None:
        """Take the least recently used candidate of ``heap`` whose ident is not in ``keep``, or None."""
        if not heap:
            return None
        aside = []
        victim = None
        while heap:
            entry = heapq.heappop(heap)
            if not self._valid(entry):
                continue
            if entry[2] in keep:
                aside.append(entry)
                continue
            victim = self._records[entry[2]]
            break
        for entry in aside:
            heapq.heappush(heap, entry)
        return victim

    def _make_room(self, group: Hashable, keep: set[bytes], evicted: list[DiskRecord]) -> bool:
        """Evict until a page of ``group`` fits (a free slot, the group under its bound); False if it cannot."""
        limit = self._limits.get(group)
        if limit is not None:
            if limit == 0:
                return False
            while self._group_pages.get(group, 0) >= limit:
                victim = self._pop_victim(self._group_heaps.get(group), keep)
                if victim is None:
                    return False
                self._evict(victim, evicted)
        if self.free_slots:
            return True
        victim = self._pop_victim(self._heap, keep)
        if victim is None:
            return False
        self._evict(victim, evicted)
        return True

    def _evict(self, record: DiskRecord, evicted: list[DiskRecord]) -> None:
        self._detach(record)
        self._free_slot(record.slot)
        self.evictions += 1
        evicted.append(record)
