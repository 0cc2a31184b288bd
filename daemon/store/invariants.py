"""The store's invariants, checked as a whole: what every test and the fuzzers ask ``PrefixStore.check`` for.

Reads the store's parts (allocator, leases, trees, plans, counters) and lists every way they disagree; it
changes nothing. Python work is O(n) in pages, leases and plans; the arena's blocks are read only in
C-speed passes over their state array (one finds the blocks in use), never one Python step per block,
so a large arena with few pages cached costs little more than a small one.
"""

from __future__ import annotations

import numpy as np

from .allocator import FREE, LEASED, STATE_NAMES, TREE
from .leases import ALLOC, READ
from .namespaces import COUNTERS
from .radix import RadixTree


def check_store(store) -> list[str]:
    """Verify every invariant; returns the violations (empty: consistent)."""
    problems = store._alloc.check() + store._leases.check()
    where: dict[int, object] = {}

    def claim(b, owner, state):
        if not isinstance(b, int) or not 0 <= b < store.nblocks:
            problems.append(f"{owner!r} references invalid block {b!r}")
            return
        if b in where:
            problems.append(f"block {b} referenced by {owner!r} and {where[b]!r}")
        where[b] = owner
        if store._alloc.state(b) != state:
            problems.append(f"block {b} of {owner!r} is {STATE_NAMES[store._alloc.state(b)]}, "
                            f"expected {STATE_NAMES[state]}")

    direct: dict[int, int] = {}
    lease_counts: dict[bytes, int] = {}
    for lease in store._leases:
        lease_counts[lease.scope] = lease_counts.get(lease.scope, 0) + 1
        if lease.kind == READ:
            direct[id(lease.node)] = direct.get(id(lease.node), 0) + 1
            if lease.node.parent is None:
                problems.append(f"{lease!r} pins a removed node or a root")
            elif RadixTree.path_blocks(lease.node) != lease.blocks:
                problems.append(f"{lease!r}: its blocks are no longer the path of its node")
        else:
            for b in lease.blocks:
                claim(b, lease, LEASED)
                if store._leased_by.get(b) != lease.id:
                    problems.append(f"block {b} of {lease!r} missing from the lease index")
    for b, lease_id in store._leased_by.items():
        lease = store._leases.find(lease_id)
        if lease is None or lease.kind != ALLOC or b not in lease.blocks:
            problems.append(f"lease index maps block {b} to lease {lease_id} which does not hold it")
    for node in store.snapshot_pins:
        direct[id(node)] = direct.get(id(node), 0) + 1
    for plan in store._plans.values():
        if plan.node.parent is not None:
            direct[id(plan.node)] = direct.get(id(plan.node), 0) + 1
        for b in plan.new_blocks + plan.dup_blocks:
            claim(b, f"insert plan {plan.id}", LEASED)
        if RadixTree.depth_pages(plan.node) != plan.start:
            problems.append(f"insert plan {plan.id}: pinned prefix no longer ends at page {plan.start}")

    indexes = [part.index for part in store.parts] or [store._index]  # one per arena partition
    candidates: dict[int, list] = {id(index): [] for index in indexes}
    live_nodes = set()
    pages = unpinned = 0
    for rec in store._ns.values():
        if rec.leases != lease_counts.get(rec.name, 0):
            problems.append(f"namespace {rec.name!r} counts {rec.leases} leases, has "
                            f"{lease_counts.get(rec.name, 0)}")
        for shard, tree in rec.trees.items():
            if tree.shard != shard or tree.scope != rec.name or tree.index is not store._index_of(rec):
                problems.append(f"tree {rec.name!r}/{shard} misfiled")
            tree_problems, nodes = tree.check(direct)
            problems += tree_problems
            pages += tree.pages
            unpinned += tree.unpinned
            for node in nodes:
                live_nodes.add(id(node))
                for b in node.blocks:
                    claim(b, node, TREE)
                if node.lock_ref == 0 and not node.children:
                    candidates.setdefault(id(tree.index), []).append(node)
                if node.parent is tree.root and store._shard(rec.name, node.key) != shard:
                    problems.append(f"node {node!r} of {rec.name!r} is in shard {shard}, hashes elsewhere")
    for lease in store._leases:
        if lease.kind == READ and id(lease.node) not in live_nodes:
            problems.append(f"{lease!r} pins a node that is not in any tree")
    for plan in store._plans.values():
        if plan.node.parent is not None and id(plan.node) not in live_nodes:
            problems.append(f"insert plan {plan.id} pins a node that is not in any tree")
    for b in _blocks_in_use(store._alloc):
        if b not in where:
            problems.append(f"block {b} is {STATE_NAMES[store._alloc.state(b)]} but nothing references it")
    if (pages, unpinned) != (store._totals.pages, store._totals.unpinned):
        problems.append(f"global page counters {store._totals.pages}/{store._totals.unpinned} "
                        f"!= {pages}/{unpinned}")
    if store._totals.pages != store._alloc.count(TREE):
        problems.append(f"{store._totals.pages} cached pages but {store._alloc.count(TREE)} blocks in the trees")
    for field in COUNTERS:
        total = sum(getattr(rec, field) for rec in (*store._ns.values(), store._retired))
        if total != getattr(store, field):
            problems.append(f"namespace {field} add up to {total}, global counter says {getattr(store, field)}")
    for quota in store.quotas.quotas:
        group = [rec for rec in store._ns.values() if rec.quota is quota]
        names = {rec.name for rec in group}
        pages = sum(rec.pages for rec in group) + sum(len(plan.new_blocks) for plan in store._plans.values()
                                                       if plan.ns in names)
        leases = [lease for lease in store._leases if lease.scope in names]
        counted = (pages, len(leases), sum(len(lease.blocks) for lease in leases))
        if counted != (quota.pages, quota.leases, quota.leased):
            problems.append(f"quota {quota.pattern!r} counts pages/leases/leased "
                            f"{(quota.pages, quota.leases, quota.leased)}, holds {counted}")
    if sum(store.evictions_by_cause.values()) != store.evictions:
        problems.append(f"evictions by cause {store.evictions_by_cause} do not add up to {store.evictions}")
    for index in indexes:
        problems += index.check(candidates[id(index)])
    return problems + store.check_partitions()


def _blocks_in_use(alloc) -> list[int]:
    """The ids of the blocks that are not free, ascending: one C-speed pass over the state array."""
    return np.flatnonzero(np.frombuffer(alloc._state, np.uint8) != FREE).tolist()
