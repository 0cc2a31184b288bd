"""What an eviction policy costs in memory, against ``lru`` on the same workload and capacity.

A workload of the suite (``pfxcache.tools.workloads``) is replayed in process on a PrefixStore
(``replay.replay_requests``, as ``scripts/replay --mode store`` does) under each policy, with
tracemalloc on; afterwards, with the store still alive, every Python allocation it holds is
counted (``total``), and what it holds is sized by component, each object counted once, in
this order:

* **tree**: the radix trees' nodes, their keys (the pages' token bytes), block ids and child
  dicts: what every policy needs, more or fewer nodes as the policy keeps other pages;
* **node policy data**: what the policy hangs on the live nodes (``node.policy_data``: reuse's
  ``Access``, tempo's tuple, the guard's GuardState; its sampling hashes listed apart as
  **sample hashes**);
* **orders**: the heap and bucket entries of the policy's orders (five for ``guard``), stale
  ones included;
* **evicted nodes**: nodes no longer in any tree that stale entries still hold, with their keys;
* **ghosts**: reuse's and tempo's memory of evicted leaves;
* **miniatures**: the guard's five miniature caches (trees, orders, ghosts, all of it);
* **rest**: what the store holds besides (allocator, leases, the arena's block table).

``extra`` is a policy's total minus lru's, per cached page and as a share of lru's total (the
store's metadata under lru). The components are sized by walking the objects
(``sys.getsizeof`` and ``gc.get_referents``), so they add up to the total within the
allocator's rounding; ``unsized`` is the difference (what no walk from the store reaches).

    scripts/research/run policy_memory [--workloads trace,agentic] [--capacities 1000,30000]
        [--policies lru,guard] [--json]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import sys
import tracemalloc
import types

from pfxcache.tools.common import add_guard_sample_pages, guard_sample_pages, progress_bar

COMPONENTS = ("tree", "node policy data", "sample hashes", "orders", "evicted nodes", "ghosts", "miniatures",
              "rest")
POLICY_COMPONENTS = ("node policy data", "sample hashes", "orders", "evicted nodes", "ghosts", "miniatures")
_NODE_OWN = ("key", "blocks", "blocks_encoded", "blocks_list", "children", "page_hashes", "last_access", "freq",
             "gap", "tick", "version", "lock_ref", "evictable")  # what any policy's node holds


_PROGRAM = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType)


class _Sizer:
    """Deep sizes of object graphs, every object counted at most once over all calls."""

    def __init__(self, stop: tuple[type, ...] = ()) -> None:
        self.seen: set[int] = set()
        # types whose instances are sized by their owner, never through a reference; code and
        # modules are the program's, not the store's
        self.stop = stop + _PROGRAM

    def size(self, *roots) -> int:
        total = 0
        stack = list(roots)
        seen = self.seen
        stop = self.stop
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            total += sys.getsizeof(obj)
            stack.extend(r for r in gc.get_referents(obj) if not isinstance(r, stop))
        return total

    def shallow(self, obj) -> int:
        """One object alone (and marked counted)."""
        if obj is None or id(obj) in self.seen:
            return 0
        self.seen.add(id(obj))
        return sys.getsizeof(obj)


def _base(obj) -> object:
    """A numpy view's owner (its memory), or the array itself."""
    while getattr(obj, "base", None) is not None:
        obj = obj.base
    return obj


def breakdown(store) -> dict[str, int]:
    """Bytes by component (see the module docstring) of a PrefixStore and its eviction policy."""
    from pfxcache.daemon.store.radix import Node, RadixTree

    index = store._index
    policy = index.all
    sizer = _Sizer(stop=(Node, RadixTree))
    trees = _trees(store)
    nodes = [node for tree in trees for node in tree.subtree(tree.root)]
    live = {id(node) for node in nodes}
    out = dict.fromkeys(COMPONENTS, 0)
    for node in nodes:
        out["tree"] += sizer.shallow(node) + sizer.size(*(getattr(node, name) for name in _NODE_OWN))
    for tree in trees:  # (its index is the policy's: sized below)
        out["tree"] += sizer.shallow(tree) + sizer.shallow(tree.__dict__)
    for node in nodes:
        state = node.policy_data
        hashes = getattr(state, "samples", None)  # the guard's sampling identities, apart (sized first)
        if hashes is not None:
            out["sample hashes"] += sizer.shallow(hashes) + sizer.size(_base(hashes))
        out["node policy data"] += sizer.size(state)
    minis = getattr(policy, "minis", None)
    if minis is not None:
        mini_sizer = _Sizer()  # everything a miniature holds is its own, its nodes included
        mini_sizer.seen = sizer.seen
        out["miniatures"] = mini_sizer.size(minis)
    orders = list(getattr(policy, "orders", {policy.name: policy}).values())
    orders += [scoped for scoped in index.scopes.values()]
    for order in orders:
        for name in ("_ghost",):
            ghost = getattr(order, name, None)
            if ghost is not None:
                out["ghosts"] += sizer.size(ghost)
    evicted = []
    for order in orders:
        entries = []
        for part in _entry_lists(order):
            out["orders"] += sizer.shallow(part)
            entries.extend(part)
        for entry in entries:
            out["orders"] += sizer.size(entry)
            node = entry[-1]
            if id(node) not in live and id(node) not in sizer.seen:
                evicted.append(node)
    node_sizer = _Sizer()
    node_sizer.seen = sizer.seen
    out["evicted nodes"] = node_sizer.size(*evicted)
    out["rest"] = node_sizer.size(store)  # everything not sized yet
    return out


def _entry_lists(order) -> list:
    """The containers of an order's entries (heap, sorted run, buckets), of any policy's."""
    own = getattr(order, "orders", None)
    if own is not None:  # a guard's namespace instance: its experts' orders
        return [part for sub in own.values() for part in _entry_lists(sub)]
    parts = [getattr(order, name) for name in ("_heap", "_run", "_candidates") if hasattr(order, name)]
    parts += list(getattr(order, "_buckets", ()))
    return parts


def _trees(store) -> list:
    """Every radix tree of the store (every namespace, every shard)."""
    return [tree for rec in store._ns.values() for tree in rec.trees.values()]


def measure(trace, policy: str, capacity: int, page_size: int | None = None) -> dict:
    """Replay ``trace`` at ``capacity`` pages under ``policy``; the store's memory, whole and by component."""
    from pfxcache.daemon.store import MemoryArena, PrefixStore
    from pfxcache.tools.replay import replay_requests

    page_size = page_size or trace.block_tokens
    gc.collect()
    tracemalloc.start()
    arena = MemoryArena(1, capacity)
    tick = itertools.count(1)
    store = PrefixStore(arena, page_size=page_size, shards=16, policy=policy,
                        clock=lambda: float(next(tick)), lease_ttl_ms=0)
    hit = replay_requests(store, trace, page_size, capacity, None)
    gc.collect()
    total = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    parts = breakdown(store)
    trees = _trees(store)
    result = {
        "policy": policy, "capacity": capacity, "page_tokens": page_size, "hit_tokens": hit,
        "pages": sum(tree.pages for tree in trees), "nodes": sum(tree.nodes for tree in trees),
        "key_bytes": sum(len(node.key) for tree in trees for node in tree.subtree(tree.root)),
        "total": total, **parts,
    }
    sized = sum(parts.values())
    result["unsized"] = total - sized
    result.update(_policy_counts(store))
    # the policy's own (everything but the tree and the rest) against what INFO's used_memory_policy says
    result["policy_bytes"] = sum(parts[c] for c in POLICY_COMPONENTS)
    result["info_policy_bytes"] = store.policy_memory()
    arena.close()
    return result


def _policy_counts(store) -> dict:
    """Structural counts: ghost entries, order entries (stale included), miniature pages."""
    policy = store._index.all
    orders = getattr(policy, "orders", {policy.name: policy})
    counts = {"ghost_entries": sum(len(o._ghost) for o in orders.values() if hasattr(o, "_ghost")),
              "order_entries": sum(len(part) for o in orders.values() for part in _entry_lists(o)),
              "candidates": policy.live}
    minis = getattr(policy, "minis", None)
    if minis is not None:
        counts["miniature_pages"] = sum(m.totals.pages for m in minis.values())
    return counts


def compare(workloads: list[str], capacities: list[int], policies: list[str], quiet: bool = False) -> list[dict]:
    """measure() of every (workload, capacity, policy); each row gets ``extra`` against lru's."""
    from pfxcache.tools import workloads as suite

    rows = []
    bar = progress_bar(len(workloads) * len(capacities) * len(policies), "policy memory", "runs", quiet=quiet)
    for name in workloads:
        trace = suite.SUITE[name](1)
        for capacity in capacities:
            base = None
            for policy in policies:
                row = measure(trace, policy, capacity)
                row["workload"] = name
                if policy == "lru":
                    base = row
                if base is not None:
                    row["extra_bytes"] = row["total"] - base["total"]
                    row["extra_share"] = row["extra_bytes"] / base["total"]
                    row["extra_per_page"] = row["extra_bytes"] / max(row["pages"], 1)
                rows.append(row)
                bar.update(1)
    bar.close()
    return rows


def _table(rows: list[dict]) -> str:
    mb = 1e6
    head = ["workload", "pages/tok", "policy", "cached", "total MB", "extra", "B/page", *COMPONENTS, "unsized",
            "INFO's estimate"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        extra = f"{r['extra_bytes'] / mb:+.1f} MB {100 * r['extra_share']:+.0f}%" if "extra_bytes" in r else ""
        per = f"{r['extra_per_page']:+.0f}" if "extra_per_page" in r else ""
        lines.append(" | ".join([
            r["workload"], f"{r['capacity']}/{r['page_tokens']}", r["policy"], str(r["pages"]),
            f"{r['total'] / mb:.1f}", extra, per, *(f"{r[c] / mb:.2f}" for c in COMPONENTS),
            f"{r['unsized'] / mb:.2f}", f"{r['info_policy_bytes'] / mb:.2f}"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/research/run policy_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="trace,agentic", help="suite workloads (default trace,agentic)")
    parser.add_argument("--capacities", default="1000,30000", help="capacities in pages (default 1000,30000)")
    parser.add_argument("--policies", default="lru,guard", help="policies, lru first (default lru,guard)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_guard_sample_pages(parser)
    args = parser.parse_args(argv)
    policies = args.policies.split(",")
    if policies[0] != "lru":
        parser.error("--policies must start with lru (the reference)")
    with guard_sample_pages(args.guard_sample_pages):
        rows = compare(args.workloads.split(","), [int(c) for c in args.capacities.split(",")], policies, args.quiet)
    print(json.dumps(rows, indent=1) if args.json else _table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
