"""The write path: allocations for writers, and inserts in two phases (begin, then commit or abort).

``begin`` validates everything, pins the cached prefix and takes blocks for the new pages
(evicting just enough, or from the writer's ALLOC leases in BLOCKS mode); from then on the
new pages' blocks belong to the :class:`InsertPlan` alone, so the daemon may fill them in a
worker thread while other commands run. ``commit`` links them into the tree (pages some
other insert cached meanwhile count as existing and their blocks go back); ``abort`` undoes
``begin``. An insert refused by ``begin`` changes nothing. A tenant over its page quota makes
room with its own pages, never another tenant's.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .allocator import LEASED, TREE
from .arguments import integer, namespace_name, packed_tokens, page_span
from .block_owners import BlockOwners
from .errors import BadRequest, NoPrefix
from .events import announce_stored
from .results import AllocResult, InsertResult

if TYPE_CHECKING:
    from .evictions import Evictor
    from .keyspace import NamespaceKeys
    from .leases import Leases
    from .listeners import Listeners
    from .namespaces import Namespaces
    from .partitions import ArenaPartitions
    from .quotas import TenantQuotas


class InsertPlan:
    """An insert between begin_insert and commit_insert/abort_insert.

    The daemon copies the data of the new pages into ``new_blocks`` (in DATA
    mode: ``arena.write(plan.new_blocks, plan.new_data(data))``), possibly in a
    worker thread: those blocks belong to the plan alone until it ends. The
    cached prefix is pinned meanwhile.
    """

    __slots__ = (
        "_block_bytes",
        "base",
        "done",
        "dup_blocks",
        "id",
        "new_blocks",
        "node",
        "npages",
        "ns",
        "offset_pages",
        "owner",
        "promotion",
        "shard",
        "sources",
        "start",
        "tokens",
        "tree",
    )

    def __init__(self, plan_id, ns, shard, owner, tree, node, tokens, npages, offset_pages, start, block_bytes):
        self.id = plan_id
        self.ns = ns
        self.shard = shard
        self.owner = owner
        self.tree = tree
        self.node = node  # pinned: the cached prefix ends exactly at this node
        self.tokens = tokens
        self.npages = npages
        self.offset_pages = offset_pages
        self.start = start  # first page not cached at begin time
        # Blocks for pages start..npages-1 (state LEASED): an array('q') in DATA mode, a list in BLOCKS mode.
        self.new_blocks: list[int] | array = []
        self.dup_blocks: list[int] = []  # BLOCKS mode: given blocks of pages already cached
        self.sources: list[int] | None = None  # BLOCKS mode: lease id of each given block, for abort
        self.done = False
        # A promotion (the disk tier's pages read back into RAM): counted as promoted, not as an
        # insert, and not shown to the eviction policy as a store (it was one when first stored).
        self.promotion = False
        self.base = 0  # key pages: pages on the path before the chain's first (page_keys.py)
        self._block_bytes = block_bytes

    @property
    def copy_needed(self) -> bool:
        """False in BLOCKS mode: the writer already filled its blocks."""
        return self.sources is None and bool(self.new_blocks)

    @property
    def new_pages(self) -> range:
        """Indices, counted from the offset, of the pages whose data goes into new_blocks."""
        return range(self.start - self.offset_pages, self.npages - self.offset_pages)

    @property
    def existing(self) -> int:
        """Pages from the offset that were cached already at begin time."""
        return self.start - self.offset_pages

    def new_data(self, data) -> memoryview:
        """The slice of DATA (all pages from the offset) that belongs to the new pages."""
        bb = self._block_bytes
        return memoryview(data)[(self.start - self.offset_pages) * bb : (self.npages - self.offset_pages) * bb]


class PlansInFlight:
    """The insert plans between begin and commit/abort, by id: what keeps an empty namespace alive
    while an insert into it is in flight."""

    def __init__(self) -> None:
        self._plans: dict[int, InsertPlan] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._plans)

    def __iter__(self) -> Iterator[InsertPlan]:
        return iter(self._plans.values())

    def values(self):
        return self._plans.values()

    def next_id(self) -> int:
        return next(self._ids)

    def add(self, plan: InsertPlan) -> None:
        self._plans[plan.id] = plan

    def remove(self, plan: InsertPlan) -> bool:
        """Forget ``plan``; False when it was not in flight (committed or aborted already)."""
        if self._plans.get(plan.id) is not plan:
            return False
        del self._plans[plan.id]
        return True

    def holds(self, name: bytes) -> bool:
        """Whether an insert into namespace ``name`` is in flight. O(plans)."""
        return any(plan.ns == name for plan in self._plans.values())

    def rename(self, old: bytes, new: bytes) -> None:
        """File the plans into namespace ``old`` under ``new`` (a deleted namespace's tombstone)."""
        for plan in self._plans.values():
            if plan.ns == old:
                plan.ns = new


class Inserts:
    """The store's write path (see the module docstring); counts committed inserts and stored pages."""

    def __init__(self, *, plans: PlansInFlight, namespaces: Namespaces, keys: NamespaceKeys,
                 partitions: ArenaPartitions, evictor: Evictor, leases: Leases, quotas: TenantQuotas,
                 listeners: Listeners, arena, clock: Callable[[], float], shard_of: Callable[[bytes, bytes], int],
                 page_size: int, page_bytes: int, block_bytes: int, max_alloc: int) -> None:
        self._plans = plans
        self._names = namespaces
        self._records = namespaces.records
        self._keys = keys
        self._partitions = partitions
        self._alloc = partitions.alloc
        self._totals = partitions.totals
        self._evictor = evictor
        self._leases = leases
        self._quotas = quotas
        self._listeners = listeners
        self._arena = arena
        self._owners = BlockOwners(partitions.nblocks)
        self._clock = clock
        self._shard_of = shard_of
        self._page_size = page_size
        self._page_bytes = page_bytes
        self._block_bytes = block_bytes
        self.max_alloc = max_alloc  # the most blocks one allocation may take
        self.inserts = 0
        self.stored = 0
        self.promoted = 0  # pages promotions brought back into RAM

    def begin(self, ns, tokens, *, offset: int = 0, owner: int = 0, blocks=None,
              promotion: bool = False) -> InsertPlan:
        """Phase one of an insert of the whole pages of ``tokens`` (pages before ``offset`` must be cached).

        Pins the cached prefix and, in DATA mode (blocks=None), allocates blocks
        for the new pages, evicting just enough. In BLOCKS mode ``blocks`` gives
        one id per page from the offset, each held by an ALLOC lease of
        ``owner``; they move from the lease into the plan. Raises NoPrefix,
        OutOfMemory or BadRequest with nothing changed.
        """
        name = namespace_name(ns)
        tokens = packed_tokens(tokens)
        npages, off = page_span(tokens, offset, self._page_size)
        owner = integer(owner, "the owner", 0)
        given = self._leases.given_blocks(blocks, npages - off, owner) if blocks is not None else None
        shard = self._shard_of(name, tokens)
        rec = self._records.get(name)
        if rec is not None and rec.expires_at is not None:
            rec = self._keys.live(name)
        tree = rec.trees.get(shard) if rec is not None else None
        base = 0
        if tree is None:
            node, pages, child, extra = None, 0, None, 0
        elif tree.keys is None:
            node, pages, child, extra = tree.walk(tokens, npages)
        else:  # key pages: a chain whose first key is held below the root grows there (page_keys.py)
            node, pages, child, extra, base = tree.walk_keys(tokens, npages)
        cached = pages + extra
        if cached < off:
            raise NoPrefix(f"the first {off * self._page_size} tokens (the offset) are not cached: "
                           f"only {cached * self._page_size} are")
        new = npages - cached
        quota = rec.quota if rec is not None else self._names.quota_of(name)
        part = rec.part if rec is not None else self._partitions.part_of(name)
        if given is not None and part is not None:
            self._partitions.refuse_foreign(part, (b for b, _ in given))
        over = quota.pages_over(new) if quota is not None else 0
        pin_cost = self._evictor.pin_cost
        if over:
            # The tenant's own pages make room, never the prefix this insert extends (pinned below
            # before anything is evicted); refused here, with nothing changed, if they cannot.
            cost = pin_cost(node, child, extra) if node is not None and rec.quota is quota else 0
            if self._quotas.evictable(quota) - cost < over:
                raise quota.refuse_pages(new)
        if given is None and new:
            fits = self._evictor.fits
            cost = pin_cost(node, child, extra) if node is not None else 0
            if not fits(new, cost, part) and self._leases.expire():
                cost = pin_cost(node, child, extra) if node is not None else 0
            if not fits(new, cost, part):
                raise self._evictor.refuse(new, part)
        # Validated: from here on nothing can fail.
        tree = self._names.tree(self._keys.open(name), shard)
        if node is None:
            node = tree.root
        elif child is not None:
            node = tree.split(child, extra)
        tree.pin(node)
        plan = InsertPlan(self._plans.next_id(), name, shard, owner, tree, node, tokens, npages, off, cached,
                          self._block_bytes)
        plan.promotion = promotion
        plan.base = base
        # Registered before allocating: the evictions reserve may cause must see the plan,
        # or they could retire this (still empty) namespace under it.
        self._plans.add(plan)
        if over:
            self._quotas.make_room(quota, name, over)
        if given is None:
            # Packed ids: they become the new node's blocks as they are, with no int per page.
            plan.new_blocks = self._evictor.reserve(new, part, packed=True)
            self._owners.forget(plan.new_blocks)
            plan.dup_blocks = array("q")  # of the same type, so the two can be added
        else:
            plan.sources = self._leases.hand_over(given)
            ids = [b for b, _ in given]
            plan.dup_blocks = ids[: cached - off]
            plan.new_blocks = ids[cached - off :]
        if quota is not None:
            quota.pages += len(plan.new_blocks)  # reserved now, settled at commit or abort
        return plan

    def commit(self, plan: InsertPlan) -> InsertResult:
        """Phase two: link the new pages into the tree and unpin the prefix.

        Pages some other insert cached since begin_insert count as existing and
        the plan's blocks for them go back to the free list.
        """
        if not self._plans.remove(plan):
            raise BadRequest("this insert has already been committed or aborted")
        plan.done = True
        tree = plan.tree
        P = self._page_bytes
        now = self._clock()
        self._totals.ticks += 1
        end = plan.node
        stored = 0
        if plan.new_blocks:
            node, reached, child, extra = tree.walk(plan.tokens, plan.npages, plan.node, plan.start)
            if child is not None:
                node = tree.split(child, extra)
                reached += extra
            dups = reached - plan.start
            if dups:
                self._alloc.release(plan.new_blocks[:dups])
            end = node
            if reached < plan.npages:
                fresh = plan.new_blocks[dups:]  # a copy: the node's own array (BLOCKS mode: a list)
                self._alloc.move(fresh, LEASED, TREE)
                if not isinstance(fresh, array):
                    fresh = array("q", fresh)
                end = tree.add_leaf(node, plan.tokens[reached * P : plan.npages * P], fresh, now)
                stored = len(fresh)
                events = self._listeners.events
                if events is not None:
                    announce_stored(events, end)
                copier = self._listeners.stored
                if copier is not None and not plan.promotion:
                    copier(plan.ns, end, stored)
        if plan.dup_blocks:
            self._alloc.release(plan.dup_blocks)
        tree.unpin(plan.node)
        tree.touch(end, now, hit=False)
        rec = self._records[plan.ns]
        if plan.promotion:
            self.promoted += stored
        else:
            tree.index.stored(plan.ns, plan.tokens, plan.npages)
            rec.inserts += 1
            rec.stored += stored
        if rec.quota is not None:
            rec.quota.pages -= len(plan.new_blocks) - stored  # the reservation, less what was stored
        touched = self._listeners.touched
        if stored and touched is not None:
            touched(plan.ns)
        if not plan.promotion:
            self.inserts += 1
            self.stored += stored
        result = InsertResult(stored, plan.npages - plan.offset_pages - stored, path=tree.path_nodes(end),
                              skip=plan.base)
        if rec.deleted:  # DEL'd during the insert: nobody may see these pages
            self._evictor.sweep_deleted(rec)
        else:
            self._keys.record_access(rec)
        self._names.retire_if_empty(rec)  # an insert of no whole page leaves no key behind
        return result

    def shorten(self, plan: InsertPlan, npages: int) -> None:
        """Keep only the plan's pages before ``npages`` (a promotion whose later pages failed to
        read or verify): their blocks go back now; a plan left with no new page is aborted."""
        if npages <= plan.start:
            self.abort(plan)
            return
        if npages >= plan.npages or plan.sources is not None:
            return
        cut = npages - plan.start
        extra = plan.new_blocks[cut:]
        plan.new_blocks = plan.new_blocks[:cut]
        plan.npages = npages
        self._alloc.release(extra)
        rec = self._records.get(plan.ns)
        if rec is not None and rec.quota is not None:
            rec.quota.pages -= len(extra)

    def abort(self, plan: InsertPlan) -> None:
        """Undo begin: unpin, free DATA-mode blocks, give BLOCKS-mode blocks back to their leases
        (or free them when the lease has ended). Idempotent."""
        if not self._plans.remove(plan):
            return
        plan.done = True
        rec = self._records.get(plan.ns)
        if rec is not None and rec.quota is not None:
            rec.quota.pages -= len(plan.new_blocks)
        if plan.sources is None:
            self._alloc.release(plan.new_blocks)
        else:
            self._leases.take_back(plan.dup_blocks + plan.new_blocks, plan.sources)
        plan.tree.unpin(plan.node)
        rec = self._records.get(plan.ns)
        if rec is not None:
            if rec.deleted:
                self._evictor.sweep_deleted(rec)
            self._names.retire_if_empty(rec)

    def alloc(self, ns, n: int, *, ttl_ms: int | None = None, owner: int = 0) -> AllocResult:
        """Fresh blocks for a writer under an ALLOC lease (evicting if needed; OutOfMemory if impossible)."""
        name = namespace_name(ns)
        n = integer(n, "the block count", 1, self.max_alloc)
        owner = integer(owner, "the owner", 0)
        leases = self._leases
        deadline = leases.deadline(ttl_ms)
        rec = self._records.get(name)
        quota = rec.quota if rec is not None else self._names.quota_of(name)
        leases.check_room(owner, quota, n)
        part = rec.part if rec is not None else self._partitions.part_of(name)
        if not self._evictor.fits(n, 0, part):
            leases.expire()
            if not self._evictor.fits(n, 0, part):
                raise self._evictor.refuse(n, part)
        blocks = self._evictor.reserve(n, part)  # first: its evictions may retire this namespace if it is empty
        # The writer may commit blocks it never wrote: they must not show another namespace's bytes.
        self._arena.zero(self._owners.hand_to(blocks, name))
        lease = leases.take_alloc(owner, self._keys.open(name), deadline, blocks)
        return AllocResult(lease.id, blocks)
