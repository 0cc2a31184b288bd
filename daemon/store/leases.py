"""Leases: what pins cached pages or fresh blocks on behalf of a connection.

A lease is the store's reference count (the article's ``Arc``): while it
lives, the blocks it names are never evicted, freed or reused. Two kinds:

* READ: taken by a match; pins the deepest matched tree node, which pins the
  whole path up to the root (lock_ref walks to the root).
* ALLOC: taken by alloc; holds fresh blocks (state LEASED) that a writer fills
  and then hands to an insert, or that go back to the free list on release.

This module only keeps the table (ids, owners, deadlines); the store performs
the unpinning and freeing when a lease ends.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator

READ = "read"
ALLOC = "alloc"


class Lease:
    """One lease. ``blocks``: a list for READ (the matched path), a dict used as an ordered set for ALLOC."""

    __slots__ = ("blocks", "deadline", "id", "kind", "node", "owner", "scope")

    def __init__(self, lease_id: int, owner: int, kind: str, scope: bytes, deadline: float, node, blocks) -> None:
        self.id = lease_id
        self.owner = owner
        self.kind = kind
        self.scope = scope  # the namespace, for per-namespace lease counts
        self.deadline = deadline  # math.inf: no TTL, lives until released or its owner goes
        self.node = node
        self.blocks = blocks

    def __repr__(self) -> str:
        return f"Lease(id={self.id}, owner={self.owner}, kind={self.kind}, blocks={len(self.blocks)})"


class LeaseTable:
    """Active leases by id and by owner, with their deadlines in a heap.

    Ids come from a counter starting at 1 and are never reused, so a stale id
    (released, expired) can never name somebody else's lease.
    """

    def __init__(self) -> None:
        self._next_id = 1
        self._leases: dict[int, Lease] = {}
        self._by_owner: dict[int, dict[int, None]] = {}
        # (deadline, id); entries of leases that ended early are skipped lazily.
        self._deadlines: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._leases)

    def __iter__(self) -> Iterator[Lease]:
        return iter(self._leases.values())

    def get(self, lease_id: int) -> Lease | None:
        """The active lease with this id, or None."""
        return self._leases.get(lease_id)

    def new(self, owner: int, kind: str, scope: bytes, deadline: float, node=None, blocks=None) -> Lease:
        """Register a new lease and return it."""
        lease = Lease(self._next_id, owner, kind, scope, deadline, node, blocks)
        self._next_id += 1
        self._leases[lease.id] = lease
        self._by_owner.setdefault(owner, {})[lease.id] = None
        if deadline != math.inf:
            heapq.heappush(self._deadlines, (deadline, lease.id))
        return lease

    def remove(self, lease: Lease) -> None:
        """Forget an ended lease (its heap entry goes stale and is dropped later)."""
        del self._leases[lease.id]
        owned = self._by_owner[lease.owner]
        del owned[lease.id]
        if not owned:
            del self._by_owner[lease.owner]
        # Early releases leave stale heap entries; rebuild once they dominate.
        if len(self._deadlines) > 2 * len(self._leases) + 1024:
            self._deadlines = [e for e in self._deadlines if e[1] in self._leases]
            heapq.heapify(self._deadlines)

    def set_deadline(self, lease: Lease, deadline: float) -> None:
        """Move a lease's deadline (earlier entries for it in the heap become stale)."""
        lease.deadline = deadline
        if deadline != math.inf:
            heapq.heappush(self._deadlines, (deadline, lease.id))

    def of_owner(self, owner: int) -> list[Lease]:
        """The owner's active leases, oldest first."""
        return [self._leases[i] for i in self._by_owner.get(owner, ())]

    def due(self, now: float) -> list[Lease]:
        """Active leases whose deadline is <= now, popped from the heap (O(log n) each)."""
        out = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, lease_id = heapq.heappop(heap)
            lease = self._leases.get(lease_id)
            if lease is not None and lease.deadline == deadline:  # else: ended, or renewed since
                out.append(lease)
        return out

    def next_deadline(self) -> float:
        """The earliest deadline in the heap (maybe of an ended lease), or inf."""
        return self._deadlines[0][0] if self._deadlines else math.inf

    def check(self) -> list[str]:
        """Violations of the table's own invariants."""
        problems = []
        for owner, ids in self._by_owner.items():
            for i in ids:
                lease = self._leases.get(i)
                if lease is None or lease.owner != owner:
                    problems.append(f"owner index lists lease {i} for owner {owner} wrongly")
        indexed = sum(len(ids) for ids in self._by_owner.values())
        if indexed != len(self._leases):
            problems.append(f"owner index holds {indexed} leases, table {len(self._leases)}")
        in_heap = {i for _, i in self._deadlines}
        for lease in self._leases.values():
            if lease.id <= 0 or lease.id >= self._next_id:
                problems.append(f"lease id {lease.id} out of the issued range")
            if lease.deadline != math.inf and lease.id not in in_heap:
                problems.append(f"lease {lease.id} has a deadline but no heap entry")
        return problems
