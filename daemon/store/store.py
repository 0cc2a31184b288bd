"""PrefixStore: the facade the daemon maps RESP commands onto.

Plain synchronous data structures: the store is NOT thread safe and every
method must be called from one thread (the daemon's event loop). Only the
arena's bytes may be touched from other threads or processes, and only those
of blocks pinned for the toucher (an insert plan's new blocks, a lease's
blocks).

Shards: a namespace has one radix tree per shard; the shard of a sequence is
a stable hash of (namespace, first page), so a sequence and all its prefixes
live in one tree. ``shard_of`` tells the daemon which reader-writer lock to
take; the store itself has no locks.

Every method validates its arguments before changing anything: when it raises
a StoreError, the store is as it was (splitting an edge in two is the only
change a refused call may leave behind, and it changes no content).

Composition: the store is its parts, each a class with its own state, given what
it needs when it is made, in this order: the arena partitions (allocator,
eviction index and page counters, the whole arena's and each partition's:
partitions.py), the inserts in flight and the namespace records
(inserts.py, namespaces.py), the evictor (evictions.py), the leases
(leases.py), the keyspace (keyspace.py), the tenant quotas (quotas.py), the
lookups (lookups.py), the write path (inserts.py) and the figures
(figures.py). This class validates the configuration, builds them and
delegates to them; the invariant checker (invariants.py) reads them all.
"""

from __future__ import annotations

import time

from .arguments import TOKEN_BYTES, namespace_name, packed_tokens, page_span
from .errors import BadRequest
from .events import StoreEvents, check_hashes
from .evictions import EVICTION_CAUSES, Evictor
from .figures import StoreFigures
from .inserts import InsertPlan, Inserts, PlansInFlight
from .invariants import check_store
from .keyspace import NamespaceKeys
from .leases import Leases
from .listeners import Listeners
from .lookups import Lookups
from .namespaces import Namespaces
from .page_keys import key_pages
from .partitions import ArenaPartitions
from .quotas import QuotaBook, TenantQuotas
from .registry import POLICIES
from .results import AllocResult, EvictResult, InsertResult, MatchResult

__all__ = ["EVICTION_CAUSES", "PrefixStore"]


class PrefixStore:
    """Longest-prefix KV-cache store over an arena of blocks; see the module docstring."""

    def __init__(self, arena, *, page_size: int = 16, shards: int = 16, policy: str = "guard",
                 lease_ttl_ms: int = 30000, clock=time.monotonic, max_alloc: int | None = None,
                 fence_expired: bool = False, quotas: QuotaBook | None = None,
                 max_leases_per_owner: int = 0, partitions=(), partition_match=None,
                 partition_align: int = 1) -> None:
        if not isinstance(page_size, int) or page_size < 1:
            raise BadRequest("page_size must be a positive integer")
        if not isinstance(shards, int) or shards < 1:
            raise BadRequest("shards must be a positive integer")
        if policy not in POLICIES:
            raise BadRequest(f"unknown eviction policy {policy!r} (known: {', '.join(POLICIES)})")
        if not isinstance(lease_ttl_ms, int) or lease_ttl_ms < 0:
            raise BadRequest("lease_ttl_ms must be an integer >= 0")
        self.arena = arena
        self.page_size = page_size
        self.page_bytes = page_bytes = page_size * TOKEN_BYTES
        self.block_bytes = block_bytes = arena.block_bytes
        self.nblocks = nblocks = arena.nblocks
        self.shards = shards
        self.listeners = listeners = Listeners()
        self._partitions = parts = ArenaPartitions(nblocks, policy=policy, page_bytes=page_bytes, sizes=partitions,
                                                   match=partition_match, align=partition_align)
        self._plans = plans = PlansInFlight()
        self._names = names = Namespaces(page_bytes, shards, parts, plans, quotas or QuotaBook())
        geometry = {"shard_of": names.shard_of, "page_size": page_size, "page_bytes": page_bytes}
        self._evictor = evictor = Evictor(namespaces=names, partitions=parts, listeners=listeners, clock=clock,
                                          block_bytes=block_bytes, **geometry)
        # In the daemon fence_expired is True: every owner is a live connection whose worker may
        # still touch its blocks, so expiry fences leases instead of ending them (see leases.py).
        self._leasing = leasing = Leases(namespaces=names, allocator=parts.alloc, evictor=evictor, clock=clock,
                                         nblocks=nblocks, ttl_ms=lease_ttl_ms, max_per_owner=max_leases_per_owner,
                                         fence_expired=fence_expired)
        self.keys = keys = NamespaceKeys(namespaces=names, evictor=evictor, leases=leasing, plans=plans,
                                         listeners=listeners, page_bytes=page_bytes, block_bytes=block_bytes)
        self._tenants = tenants = TenantQuotas(namespaces=names, plans=plans, leases=leasing.table, evictor=evictor)
        self._lookups = lookups = Lookups(namespaces=names, keys=keys, partitions=parts, leases=leasing,
                                          clock=clock, **geometry)
        self._inserts = inserts = Inserts(plans=plans, namespaces=names, keys=keys, partitions=parts,
                                          evictor=evictor, leases=leasing, quotas=tenants, listeners=listeners,
                                          arena=arena, clock=clock, block_bytes=block_bytes,
                                          max_alloc=max_alloc if max_alloc is not None else nblocks, **geometry)
        self._figures = StoreFigures(namespaces=names, partitions=parts, leases=leasing.table, plans=plans,
                                     evictor=evictor, inserts=inserts, lookups=lookups, page_size=page_size,
                                     shards=shards, block_bytes=block_bytes, nblocks=nblocks)
        # The parts' own structures, for the invariant checker (invariants.py), which reads across
        # parts, and for the tests and benchmarks that look inside.
        self._alloc = parts.alloc
        self._index = parts.index
        self._totals = parts.totals
        self._ns = names.records
        self._retired = names.retired
        self._leases = leasing.table
        self._leased_by = leasing.leased_by
        self._index_of = parts.index_of
        self._shard = names.shard_of
        #: Nodes a snapshot being written pins (snapshot.Capture), one entry per pin: what the
        #: invariant checker counts beside the leases' and the insert plans' pins.
        self.snapshot_pins: list = []

    # -- settings the daemon changes at run time -------------------------------------------------

    @property
    def lease_ttl_ms(self) -> int:
        """The TTL of a lease taken without one (lease-ttl); 0: none."""
        return self._leasing.ttl_ms

    @lease_ttl_ms.setter
    def lease_ttl_ms(self, value: int) -> None:
        self._leasing.ttl_ms = value

    @property
    def max_leases_per_owner(self) -> int:
        """client-lease-limit: leases one owner may hold at once (0: no limit)."""
        return self._leasing.max_per_owner

    @max_leases_per_owner.setter
    def max_leases_per_owner(self, value: int) -> None:
        self._leasing.max_per_owner = value

    @property
    def fence_expired(self) -> bool:
        """Whether expiry fences leases instead of ending them (see leases.py)."""
        return self._leasing.fence_expired

    @fence_expired.setter
    def fence_expired(self, value: bool) -> None:
        self._leasing.fence_expired = value

    @property
    def max_alloc(self) -> int:
        """The most blocks one allocation may take."""
        return self._inserts.max_alloc

    @property
    def evicting(self) -> bool:
        """False under maxmemory-policy noeviction: a full arena refuses writes (-OOM) instead of
        evicting; PFXEVICT still evicts by the policy in force."""
        return self._evictor.evicting

    @evicting.setter
    def evicting(self, value: bool) -> None:
        self._evictor.evicting = value

    @property
    def touched(self):
        """Called with a namespace's name when a page enters or leaves it, or its expiry changes
        (what WATCH watches); None: nobody watches."""
        return self.listeners.touched

    @touched.setter
    def touched(self, callback) -> None:
        self.listeners.touched = callback

    @property
    def events(self) -> StoreEvents | None:
        """The listener told of every page stored and removed (None: none)."""
        return self.listeners.events

    def set_events(self, sink: StoreEvents | None) -> None:
        """Set (or with None remove) the KV events listener; it hears only of changes from now on."""
        self.listeners.events = sink  # WATCH's ``touched`` is apart: changing the listener leaves it alone

    @property
    def quotas(self) -> QuotaBook:
        """The tenant rules in force (quotas.py)."""
        return self._names.quotas

    def set_quotas(self, quotas: QuotaBook) -> None:
        """Put new tenant rules in force (CONFIG SET tenant-quota); see quotas.TenantQuotas.set."""
        self._tenants.set(quotas)

    # -- sharding and sizes ---------------------------------------------------------------------

    def shard_of(self, ns, tokens) -> int:
        """The shard holding ``tokens`` in ``ns``: stable hash of (namespace, first page) mod shards."""
        return self._names.shard_of(namespace_name(ns), packed_tokens(tokens))

    def data_size(self, tokens, offset: int = 0) -> int:
        """Bytes of DATA an insert of ``tokens`` from ``offset`` must carry (whole pages x block_bytes)."""
        npages, off = page_span(packed_tokens(tokens), offset, self.page_size)
        return (npages - off) * self.block_bytes

    # -- reads ----------------------------------------------------------------------------------

    def match(self, ns, tokens, *, lease: bool = True, ttl_ms: int | None = None, owner: int = 0,
              transient: bool = False, below=None) -> MatchResult | None:
        """Longest cached whole-page prefix of ``tokens`` in ``ns``; see lookups.Lookups.match (None:
        ``below`` says a lower tier continues the match)."""
        return self._lookups.match(ns, tokens, lease, ttl_ms, owner, transient, below)  # positional: the hot path

    def cached_tokens(self, ns, tokens) -> int:
        """Tokens of the longest cached whole-page prefix, without touching, counting or leasing anything."""
        return self._lookups.cached_tokens(ns, tokens)

    # -- writes ---------------------------------------------------------------------------------

    def holds_keys(self, ns) -> bool:
        """Whether namespace ``ns`` is a namespace of key pages (HASHES, page_keys.py) here."""
        return namespace_name(ns) in self._names.key_names

    def use_keys(self, ns, keys: bool, *, writing: bool = False) -> None:
        """Check that a request's kind of pages (key pages: ``keys``) is the namespace's; BadRequest
        if not. A write of key pages into a namespace that holds nothing makes it a key namespace
        (page_keys.py)."""
        names = self._names
        if not keys and not names.key_names:
            return
        name = namespace_name(ns)
        rec = names.records.get(name)
        if name in names.key_names:
            if keys:
                return
            if rec is not None and rec.holds_pages:
                raise BadRequest(f"namespace '{name.decode(errors='backslashreplace')}' holds key pages "
                                 f"(HASHES): it takes HASHES, not TOKENS or PACKED")
            names.key_names.discard(name)  # marked by a write that stored nothing: free again
            if rec is not None:
                for tree in rec.trees.values():
                    tree.keys = None
            return
        if not keys:
            return
        if rec is not None and rec.holds_pages:
            raise BadRequest(f"namespace '{name.decode(errors='backslashreplace')}' holds token pages: "
                             f"it takes TOKENS or PACKED, not HASHES")
        if writing:
            names.key_names.add(name)
            if rec is not None:
                for tree in rec.trees.values():  # empty: nothing to index yet
                    if tree.keys is None:
                        tree.keys = {}

    def key_pages(self, keys) -> bytes:
        """The packed pages standing for page ``keys`` in prefix order (page_keys.py); BadRequest for bad keys."""
        return key_pages(keys, self.page_bytes)

    def tier_probe(self, ns, tokens, present) -> tuple[int, list[bytes]]:
        """Pages of ``tokens`` cached in RAM, and the idents of the pages after them a lower tier
        holds (``present(ident)``), up to the first it does not; see lookups.Lookups.tier_probe."""
        return self._lookups.tier_probe(ns, tokens, present)

    def begin_insert(self, ns, tokens, *, offset: int = 0, owner: int = 0, blocks=None,
                     promotion: bool = False) -> InsertPlan:
        """Phase one of an insert (pins the cached prefix, takes blocks for the new pages); see
        inserts.Inserts.begin. Raises NoPrefix, OutOfMemory or BadRequest with nothing changed.
        ``promotion``: the pages come back from a lower tier (counted as promoted, not stored)."""
        return self._inserts.begin(ns, tokens, offset=offset, owner=owner, blocks=blocks, promotion=promotion)

    def bound_of(self, ns: bytes) -> tuple[tuple[str, bytes | str], int] | None:
        """What bounds namespace ``ns``'s pages, for a lower tier to bound them alike: its tenant
        quota (when it limits pages) or else its arena partition, as (key, the bound in RAM pages);
        None when neither does."""
        quota = self._names.quota_of(ns)
        if quota is not None and quota.max_pages:
            return ("tenant", quota.pattern), quota.max_pages
        part = self._partitions.part_of(ns)
        if part is not None:
            return ("partition", part.name), part.nblocks
        return None

    def shorten_insert(self, plan: InsertPlan, npages: int) -> None:
        """Keep only the plan's pages before ``npages`` (aborting it when none is new); see
        inserts.Inserts.shorten."""
        self._inserts.shorten(plan, npages)

    def commit_insert(self, plan: InsertPlan) -> InsertResult:
        """Phase two: link the new pages into the tree and unpin the prefix; see inserts.Inserts.commit."""
        return self._inserts.commit(plan)

    def abort_insert(self, plan: InsertPlan) -> None:
        """Undo begin_insert (idempotent); see inserts.Inserts.abort."""
        self._inserts.abort(plan)

    def insert(self, ns, tokens, *, offset: int = 0, data=None, blocks=None, owner: int = 0) -> InsertResult:
        """begin_insert + arena.write + commit_insert in one call.

        DATA (blocks=None) must be exactly data_size(tokens, offset) bytes;
        data=None skips the copy (the pages then hold whatever their blocks held).
        """
        if data is not None:
            if blocks is not None:
                raise BadRequest("give either DATA or BLOCKS, not both")
            want = self.data_size(tokens, offset)
            if len(memoryview(data).cast("B")) != want:
                raise BadRequest(f"DATA is {len(memoryview(data).cast('B'))} bytes, expected {want} "
                                 f"(pages from the offset x {self.block_bytes})")
        inserts = self._inserts
        plan = inserts.begin(ns, tokens, offset=offset, owner=owner, blocks=blocks)
        try:
            if data is not None and plan.copy_needed:
                self.arena.write(plan.new_blocks, plan.new_data(data))
        except BaseException:
            inserts.abort(plan)
            raise
        return inserts.commit(plan)

    def alloc(self, ns, n: int, *, ttl_ms: int | None = None, owner: int = 0) -> AllocResult:
        """Fresh blocks for a writer under an ALLOC lease (evicting if needed; OutOfMemory if impossible)."""
        return self._inserts.alloc(ns, n, ttl_ms=ttl_ms, owner=owner)

    # -- leases ---------------------------------------------------------------------------------

    def renew(self, lease_id: int, owner: int, ttl_ms: int | None = None) -> bool:
        """Give a lease of ``owner`` a new deadline, ``ttl_ms`` from now (None: lease-ttl, 0: none).

        The daemon takes the pin that protects a WITHDATA copy with no deadline,
        so expiry cannot free blocks mid-copy, and sets the lease's real
        deadline once the copy is done. False when the lease is gone.
        """
        return self._leasing.renew(lease_id, owner, ttl_ms)

    def release(self, lease_ids, owner: int) -> int:
        """End the given leases of ``owner``; returns how many were live (others', unknown and fenced
        ids count 0: a fenced lease's blocks go back now, but its holder must learn it was too late)."""
        return self._leasing.release(lease_ids, owner)

    def release_owner(self, owner: int, limit: int | None = None) -> int:
        """End the leases of ``owner`` (its connection closed), fenced ones too; returns how many.

        ``limit``: end at most that many (the daemon releases a huge table in slices so that
        other clients are served in between); call again until it returns less than ``limit``.
        """
        return self._leasing.release_owner(owner, limit)

    def holds_leases(self, owner: int) -> bool:
        """Whether ``owner`` holds any lease, fenced ones included."""
        return self._leasing.holds(owner)

    def expire(self) -> int:
        """End (or, with fence_expired, fence) every lease past its deadline; O(log n) per lease.
        Returns how many."""
        return self._leasing.expire()

    def next_expiry(self) -> float:
        """Clock time of the earliest lease deadline (inf if none): when the daemon should call expire()."""
        return self._leasing.next_expiry()

    # -- eviction -------------------------------------------------------------------------------

    def evict_prefix(self, ns, tokens) -> EvictResult:
        """Forget every cached sequence that starts with the whole pages of ``tokens``
        (the last of those pages and everything below it); pinned pages stay and are counted."""
        return self._evictor.evict_prefix(ns, tokens)

    def evict_pages(self, ns, n: int) -> EvictResult:
        """Evict up to n pages of ``ns`` chosen by the policy."""
        return self._evictor.evict_pages(ns, n)

    def evict_bytes(self, ns, nbytes: int) -> EvictResult:
        """Evict pages of ``ns`` by policy until at least nbytes of blocks are freed (or nothing is left)."""
        return self._evictor.evict_bytes(ns, nbytes)

    def evict_all(self, ns, *, cause: str = "command") -> EvictResult:
        """Drop every unpinned page of ``ns`` (``cause``: how INFO counts them, one of EVICTION_CAUSES)."""
        return self._evictor.evict_all(ns, cause=cause)

    def flush(self) -> EvictResult:
        """Drop every unpinned page of every namespace, and what the eviction policy learned from them."""
        return self._evictor.flush()

    def evict_to_watermark(self, low_free_blocks: int) -> EvictResult:
        """Evict by policy until at least ``low_free_blocks`` blocks are free (with arena
        partitions: until each has its proportional share of them free)."""
        return self._evictor.evict_to_watermark(low_free_blocks)

    # -- policy ---------------------------------------------------------------------------------

    @property
    def policy(self) -> str:
        """The name of the eviction policy in force."""
        return self._partitions.policy

    def set_policy(self, name: str) -> None:
        """Switch the eviction policy at runtime (rebuilds the candidate index: O(n log n) once)."""
        self._partitions.set_policy(name, self._names.records.values())

    def policy_state(self) -> dict:
        """What the eviction policy has learned (empty unless it learns: see reuse.ReusePolicy.describe)."""
        return self._partitions.index.describe()

    # -- figures --------------------------------------------------------------------------------

    @property
    def hits(self) -> int:
        """Tokens found by lookups."""
        return self._lookups.hits

    @property
    def misses(self) -> int:
        """Tokens looked up and not found."""
        return self._lookups.misses

    @property
    def evictions(self) -> int:
        """Pages evicted, for every cause."""
        return self._evictor.evictions

    @property
    def evictions_by_cause(self) -> dict[str, int]:
        """Pages evicted by cause (EVICTION_CAUSES); sums to evictions."""
        return self._evictor.evictions_by_cause

    @property
    def oom_refusals(self) -> int:
        """Inserts and allocations refused with OutOfMemory (requests, not state: stats() omits it)."""
        return self._evictor.oom_refusals

    @property
    def inserts(self) -> int:
        """Committed inserts."""
        return self._inserts.inserts

    @property
    def promoted(self) -> int:
        """Pages promotions brought back into RAM from a lower tier."""
        return self._inserts.promoted

    @property
    def stored(self) -> int:
        """Pages stored by inserts."""
        return self._inserts.stored

    @property
    def parts(self) -> list:
        """The arena partitions, the remainder last (empty: none configured)."""
        return self._partitions.parts

    def partitions(self) -> list[dict]:
        """Each partition's range and what it holds (empty: none configured)."""
        return self._partitions.describe()

    def namespaces(self) -> list[bytes]:
        """Names of the namespaces that hold pages or leases (Redis's keys), sorted."""
        return self._names.names()

    def stats(self, ns=None) -> dict:
        """Counters for one namespace, or global ones (ns=None). Hits/misses are in tokens."""
        return self._figures.stats(ns)

    def stats_of(self, visible) -> dict:
        """The counters of the namespaces whose name ``visible(name)`` accepts, summed."""
        return self._figures.stats_of(visible)

    def policy_memory(self) -> int:
        """About the bytes the eviction policy holds: INFO's used_memory_policy."""
        return self._figures.policy_memory()

    @property
    def allocator_bytes(self) -> int:
        """Bytes the block allocator holds (1 per block of state, plus the ids of returned blocks)."""
        return self._figures.allocator_bytes

    def info(self) -> dict:
        """Everything PFXINFO shows: configuration, arena and global counters."""
        return {"arena": self.arena.describe(), "lease_ttl_ms": self.lease_ttl_ms, "max_alloc": self.max_alloc,
                **self.stats()}

    # -- invariants ------------------------------------------------------------------------------

    def check_partitions(self) -> list[str]:
        """Partition invariants (see partitions.ArenaPartitions.check)."""
        return self._partitions.check(self._names.records, self._leasing.table, self._plans)

    def check(self) -> list[str]:
        """Verify every invariant; returns the violations (empty: consistent). O(n + nblocks)."""
        problems = check_store(self)
        if self.listeners.events is not None:  # cached block hashes are only kept up to date for a listener
            for rec in self._names.records.values():
                for tree in rec.trees.values():
                    problems += check_hashes(tree)
        return problems
