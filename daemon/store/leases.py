"""Leases: what pins cached pages or fresh blocks on behalf of a connection.

A lease is the store's reference count (the article's ``Arc``): while it
lives, the blocks it names are never evicted, freed or reused. Two kinds:

* READ: taken by a match; pins the deepest matched tree node, which pins the
  whole path up to the root (lock_ref walks to the root).
* ALLOC: taken by alloc; holds fresh blocks (state LEASED) that a writer fills
  and then hands to an insert, or that go back to the free list on release.

A lease past its deadline is *fenced* rather than ended when the store is
made with ``fence_expired`` (the daemon's): its id stops working (release
counts 0, renew and BLOCKS refuse it, so the worker learns it was too slow),
but its pins and blocks stay where they are until the owner releases the id or
its connection closes. A worker that stalled past its TTL (GC pause, slow
prefill, SIGSTOP) may still read or write those blocks through its mapping:
handing them to somebody else meanwhile would corrupt the other's pages.

Lease ids are random 63-bit numbers, unique among the table's leases: an id
says nothing about how many leases others took, and a stale one names another
lease only by a 1 in 2**63 draw, and then only one of the same owner (every use
of an id checks the owner).

``LeaseTable`` keeps the table (ids, owners, deadlines); ``Leases``, the store's
part, takes and ends leases on it: it counts them in their namespace and tenant
quota, holds the index of which ALLOC lease holds each fresh block, enforces
client-lease-limit, and unpins or frees what a lease held when it ends.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from .arguments import integer
from .errors import BadRequest

if TYPE_CHECKING:
    from .evictions import Evictor
    from .namespaces import Namespace, Namespaces

#: Random ids drawn per refill of the id pool (one os.urandom call per this many leases).
ID_BATCH = 4096

READ = "read"
ALLOC = "alloc"


class Lease:
    """One lease. ``blocks``: a list for READ (the matched path), a dict used as an ordered set for ALLOC."""

    __slots__ = ("blocks", "deadline", "fenced", "id", "kind", "node", "owner", "scope")

    def __init__(self, lease_id: int, owner: int, kind: str, scope: bytes, deadline: float, node, blocks) -> None:
        self.id = lease_id
        self.owner = owner
        self.kind = kind
        self.scope = scope  # the namespace, for per-namespace lease counts
        self.deadline = deadline  # math.inf: no TTL, lives until released or its owner goes
        self.node = node
        self.blocks = blocks
        self.fenced = False  # past its deadline: the id is dead, the blocks wait for the owner

    def __repr__(self) -> str:
        fenced = ", fenced" if self.fenced else ""
        return f"Lease(id={self.id}, owner={self.owner}, kind={self.kind}, blocks={len(self.blocks)}{fenced})"


class LeaseTable:
    """Leases by id and by owner, with their deadlines in a heap.

    Iterating or ``find`` sees every lease that still holds something, fenced
    ones included; ``get`` and ``len`` only the live ones (see the module
    docstring). Ids are random (``_new_id``).
    """

    def __init__(self) -> None:
        self._id_pool = array("Q")
        self.fenced = 0  # how many leases are fenced
        self._leases: dict[int, Lease] = {}
        self._by_owner: dict[int, dict[int, None]] = {}
        # (deadline, id); entries of leases that ended early are skipped lazily.
        self._deadlines: list[tuple[float, int]] = []

    def __len__(self) -> int:
        """Live (not fenced) leases."""
        return len(self._leases) - self.fenced

    def __iter__(self) -> Iterator[Lease]:
        return iter(self._leases.values())

    def get(self, lease_id: int) -> Lease | None:
        """The live lease with this id, or None (unknown, ended or fenced)."""
        lease = self._leases.get(lease_id)
        return None if lease is None or lease.fenced else lease

    def find(self, lease_id: int) -> Lease | None:
        """The lease with this id that still holds its blocks, fenced or not, or None."""
        return self._leases.get(lease_id)

    def _new_id(self) -> int:
        # Random, not counted: ids tell nobody how many leases others took. Drawn from
        # os.urandom in batches (one system call per ID_BATCH leases); 0 is "no lease".
        while True:
            if not self._id_pool:
                self._id_pool = array("Q", os.urandom(8 * ID_BATCH))
            lease_id = self._id_pool.pop() >> 1
            if lease_id and lease_id not in self._leases:
                return lease_id

    def new(self, owner: int, kind: str, scope: bytes, deadline: float, node=None, blocks=None) -> Lease:
        """Register a new lease and return it."""
        lease = Lease(self._new_id(), owner, kind, scope, deadline, node, blocks)
        self._leases[lease.id] = lease
        self._by_owner.setdefault(owner, {})[lease.id] = None
        if deadline != math.inf:
            heapq.heappush(self._deadlines, (deadline, lease.id))
        return lease

    def remove(self, lease: Lease) -> None:
        """Forget an ended lease (its heap entry goes stale and is dropped later)."""
        del self._leases[lease.id]
        if lease.fenced:
            self.fenced -= 1
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

    def fence(self, lease: Lease) -> None:
        """Mark a lease past its deadline: its id is dead, what it holds stays until the owner lets go."""
        if not lease.fenced:
            lease.fenced = True
            lease.deadline = math.inf
            self.fenced += 1

    def of_owner(self, owner: int, limit: int | None = None) -> list[Lease]:
        """The owner's leases (fenced ones too), oldest first; at most ``limit`` of them."""
        ids = self._by_owner.get(owner, ())
        if limit is not None and limit < len(ids):
            ids = itertools.islice(ids, limit)
        return [self._leases[i] for i in ids]

    def count_of(self, owner: int) -> int:
        """How many leases ``owner`` holds, fenced ones included. O(1)."""
        owned = self._by_owner.get(owner)
        return len(owned) if owned else 0

    def owns(self, owner: int) -> bool:
        """Whether ``owner`` holds any lease, fenced or not."""
        return owner in self._by_owner

    def due(self, now: float) -> list[Lease]:
        """Active leases whose deadline is <= now, popped from the heap (O(log n) each)."""
        out = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, lease_id = heapq.heappop(heap)
            lease = self._leases.get(lease_id)
            if lease is not None and lease.deadline == deadline:  # else: ended, fenced, or renewed since
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
        if sum(lease.fenced for lease in self._leases.values()) != self.fenced:
            problems.append(f"fenced count {self.fenced} is wrong")
        if indexed != len(self._leases):
            problems.append(f"owner index holds {indexed} leases, table {len(self._leases)}")
        in_heap = {i for _, i in self._deadlines}
        for lease in self._leases.values():
            if not 0 < lease.id < 2**63:
                problems.append(f"lease id {lease.id} out of range")
            if lease.deadline != math.inf and lease.id not in in_heap:
                problems.append(f"lease {lease.id} has a deadline but no heap entry")
        return problems


class Leases:
    """The store's leases: taking them, renewing, releasing and expiring them, and what ending one frees.

    ``table`` holds the leases; ``leased_by`` maps each block an ALLOC lease holds to that
    lease's id (what checks a BLOCKS-mode commit). ``ttl_ms`` (lease-ttl), ``max_per_owner``
    (client-lease-limit, 0: none) and ``fence_expired`` (see the module docstring) may be
    changed at any time.
    """

    def __init__(self, *, namespaces: Namespaces, allocator, evictor: Evictor, clock: Callable[[], float],
                 nblocks: int, ttl_ms: int, max_per_owner: int = 0, fence_expired: bool = False) -> None:
        self._names = namespaces
        self._records = namespaces.records
        self._alloc = allocator
        self._evictor = evictor
        self._clock = clock
        self._nblocks = nblocks
        self.table = LeaseTable()
        self.leased_by: dict[int, int] = {}  # block -> id of the ALLOC lease holding it
        self.ttl_ms = ttl_ms
        self.max_per_owner = max_per_owner
        self.fence_expired = fence_expired

    # -- taking ---------------------------------------------------------------------------------

    def deadline(self, ttl_ms) -> float:
        """The clock time ``ttl_ms`` from now (None: lease-ttl; 0: never)."""
        ttl = self.ttl_ms if ttl_ms is None else integer(ttl_ms, "the lease TTL (ms)", 0)
        return math.inf if ttl == 0 else self._clock() + ttl / 1000.0

    def check_room(self, owner: int, quota, blocks: int) -> None:
        """Refuse one more lease of ``blocks`` blocks for ``owner``: past client-lease-limit
        (BadRequest) or the tenant's quota (OutOfMemory). O(1)."""
        limit = self.max_per_owner
        if limit and self.table.count_of(owner) >= limit:
            raise BadRequest(f"this connection holds {limit} leases, its limit (client-lease-limit): "
                             f"release some first")
        if quota is not None:
            quota.check_lease(blocks)

    def take_read(self, owner: int, rec: Namespace, deadline: float, node, blocks: list[int]) -> int:
        """A READ lease of ``owner`` on ``node`` (pinned by the caller), whose path holds ``blocks``; its id."""
        lease_id = self.table.new(owner, READ, rec.name, deadline, node, blocks).id
        rec.leases += 1
        if rec.quota is not None:
            rec.quota.leases += 1
            rec.quota.leased += len(blocks)
        return lease_id

    def take_alloc(self, owner: int, rec: Namespace, deadline: float, blocks: list[int]) -> Lease:
        """An ALLOC lease of ``owner`` holding ``blocks`` (fresh, state LEASED)."""
        lease = self.table.new(owner, ALLOC, rec.name, deadline, None, dict.fromkeys(blocks))
        for b in blocks:
            self.leased_by[b] = lease.id
        rec.leases += 1
        if rec.quota is not None:
            rec.quota.leases += 1
            rec.quota.leased += len(blocks)
        return lease

    # -- blocks handed to an insert ---------------------------------------------------------------

    def given_blocks(self, blocks, count: int, owner: int) -> list[tuple[int, Lease]]:
        """Check the block ids a BLOCKS-mode insert gives, one per page: each held by a live ALLOC
        lease of ``owner``, none twice. Returns (block, its lease) pairs; BadRequest otherwise."""
        try:
            blocks = list(blocks)
        except TypeError:
            raise BadRequest("blocks must be a sequence of block ids") from None
        if len(blocks) != count:
            raise BadRequest(f"{len(blocks)} block ids given for {count} pages")
        seen = set()
        out = []
        for b in blocks:
            integer(b, "a block id", 0, self._nblocks - 1)
            if b in seen:
                raise BadRequest(f"block {b} given twice")
            seen.add(b)
            lease = self.table.find(self.leased_by.get(b, 0))
            if lease is None or lease.owner != owner:
                raise BadRequest(f"block {b} is not held by an allocation lease of this connection")
            if lease.fenced:
                raise BadRequest(f"the allocation lease of block {b} expired: its TTL passed before the commit "
                                 f"(release it, allocate again)")
            out.append((b, lease))
        return out

    def hand_over(self, given: list[tuple[int, Lease]]) -> list[int]:
        """Move the checked ``given`` blocks out of their leases (into an insert plan); returns the
        id of each one's lease, for ``take_back``."""
        for b, lease in given:
            del lease.blocks[b]
            del self.leased_by[b]
            self._leased_changed(lease, -1)
        return [lease.id for _, lease in given]

    def take_back(self, blocks: Iterable[int], sources: Iterable[int]) -> None:
        """Give blocks an aborted insert took back to the leases they came from (``sources``), or
        free them where that lease has ended."""
        orphans = []
        for b, lease_id in zip(blocks, sources):
            lease = self.table.get(lease_id)
            if lease is None:
                orphans.append(b)
            else:
                lease.blocks[b] = None
                self.leased_by[b] = lease_id
                self._leased_changed(lease, 1)
        self._alloc.release(orphans)

    def _leased_changed(self, lease: Lease, blocks: int) -> None:
        quota = self._records[lease.scope].quota
        if quota is not None:
            quota.leased += blocks

    def rename_scope(self, old: bytes, new: bytes) -> None:
        """Count the leases of namespace ``old`` under ``new`` (a deleted namespace's tombstone). O(leases)."""
        for lease in self.table:
            if lease.scope == old:
                lease.scope = new

    # -- ending ---------------------------------------------------------------------------------

    def _end(self, lease: Lease) -> None:
        self.table.remove(lease)
        rec = self._records[lease.scope]
        rec.leases -= 1
        if rec.quota is not None:
            rec.quota.leases -= 1
            rec.quota.leased -= len(lease.blocks)
        if lease.kind == READ:
            lease.node.tree.unpin(lease.node)
            lease.node.tree.index.released(lease.id)  # (guard's miniatures held their hits under it too)
        else:
            freed = list(lease.blocks)
            for b in freed:
                del self.leased_by[b]
            self._alloc.release(freed)
        if rec.deleted:
            self._evictor.sweep_deleted(rec)
        self._names.retire_if_empty(rec)

    def renew(self, lease_id: int, owner: int, ttl_ms: int | None = None) -> bool:
        """Give a lease of ``owner`` a new deadline, ``ttl_ms`` from now (None: lease-ttl, 0: none);
        False when the lease is gone."""
        lease = self.table.get(lease_id)
        if lease is None or lease.owner != owner:
            return False
        self.table.set_deadline(lease, self.deadline(ttl_ms))
        return True

    def release(self, lease_ids, owner: int) -> int:
        """End the given leases of ``owner``; returns how many were live (others', unknown and fenced
        ids count 0: a fenced lease's blocks go back now, but its holder must learn it was too late)."""
        if isinstance(lease_ids, int):
            lease_ids = [lease_ids]
        count = 0
        for lease_id in lease_ids:
            lease = self.table.find(lease_id) if isinstance(lease_id, int) else None
            if lease is not None and lease.owner == owner:
                count += not lease.fenced
                self._end(lease)
        return count

    def release_owner(self, owner: int, limit: int | None = None) -> int:
        """End the leases of ``owner``, fenced ones too, at most ``limit`` of them; returns how many."""
        leases = self.table.of_owner(owner, limit)
        for lease in leases:
            self._end(lease)
        return len(leases)

    def holds(self, owner: int) -> bool:
        """Whether ``owner`` holds any lease, fenced ones included."""
        return self.table.owns(owner)

    def expire(self) -> int:
        """End (or, with fence_expired, fence) every lease past its deadline; O(log n) per lease.
        Returns how many."""
        due = self.table.due(self._clock())
        for lease in due:
            if self.fence_expired:
                self.table.fence(lease)
            else:
                self._end(lease)
        return len(due)

    def next_expiry(self) -> float:
        """Clock time of the earliest lease deadline (inf if none)."""
        return self.table.next_deadline()
