"""What the store reports: its counters and gauges, global, per namespace, or summed over a tenant's.

:class:`StoreFigures` reads the store's parts (the arena partitions' allocator and page
counters, the namespace records, the leases, the inserts in flight, the evictor's and the
lookups' counters) and changes nothing. INFO, PFXINFO, DBSIZE, the metrics endpoint and
MEMORY figures all read these. A namespace's counters and the global ones agree: the global
ones are the sum over the namespaces, those that no longer exist included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .allocator import LEASED, TREE
from .arguments import namespace_name
from .namespaces import Namespace

if TYPE_CHECKING:
    from .evictions import Evictor
    from .inserts import Inserts, PlansInFlight
    from .leases import LeaseTable
    from .lookups import Lookups
    from .namespaces import Namespaces
    from .partitions import ArenaPartitions


def hit_rate(hits: int, misses: int) -> float:
    """Hits over lookups (0.0 before any)."""
    return hits / (hits + misses) if hits + misses else 0.0


class StoreFigures:
    """The store's figures (see the module docstring)."""

    def __init__(self, *, namespaces: Namespaces, partitions: ArenaPartitions, leases: LeaseTable,
                 plans: PlansInFlight, evictor: Evictor, inserts: Inserts, lookups: Lookups,
                 page_size: int, shards: int, block_bytes: int, nblocks: int) -> None:
        self._records = namespaces.records
        self._partitions = partitions
        self._leases = leases
        self._plans = plans
        self._evictor = evictor
        self._inserts = inserts
        self._lookups = lookups
        self._page_size = page_size
        self._shards = shards
        self._block_bytes = block_bytes
        self._nblocks = nblocks

    def stats(self, ns=None) -> dict:
        """Counters for one namespace, or global ones (ns=None). Hits/misses are in tokens."""
        policy = self._partitions.policy
        if ns is not None:
            name = namespace_name(ns)
            rec = self._records.get(name) or Namespace(name)
            pages = rec.pages
            pinned = rec.pinned
            return {
                "namespace": name, "policy": policy, "pages": pages, "pinned_pages": pinned,
                "evictable_pages": pages - pinned, "nodes": sum(t.nodes for t in rec.trees.values()),
                "bytes": pages * self._block_bytes, "hits_tokens": rec.hits, "misses_tokens": rec.misses,
                "hit_rate": hit_rate(rec.hits, rec.misses), "evictions": rec.evictions,
                "inserts": rec.inserts, "stored_pages": rec.stored, "leases": rec.leases,
            }
        alloc, t = self._partitions.alloc, self._partitions.totals
        lookups, evictor, inserts = self._lookups, self._evictor, self._inserts
        return {
            "policy": policy, "page_size": self._page_size, "shards": self._shards,
            "block_bytes": self._block_bytes, "blocks_total": self._nblocks,
            "blocks_used": self._nblocks - alloc.free_count, "blocks_free": alloc.free_count,
            "blocks_cached": alloc.count(TREE), "blocks_leased": alloc.count(LEASED),
            "pages": t.pages, "pinned_pages": t.pages - t.unpinned, "evictable_pages": t.unpinned,
            "hits_tokens": lookups.hits, "misses_tokens": lookups.misses,
            "hit_rate": hit_rate(lookups.hits, lookups.misses),
            "evictions": evictor.evictions,
            **{f"evictions_{cause}": pages for cause, pages in evictor.evictions_by_cause.items()},
            "inserts": inserts.inserts, "stored_pages": inserts.stored,
            "leases": len(self._leases), "fenced_leases": self._leases.fenced, "inserts_in_progress": len(self._plans),
            "namespaces": sum(1 for rec in self._records.values() if not rec.deleted),
        }

    def stats_of(self, visible) -> dict:
        """The counters of the namespaces whose name ``visible(name)`` accepts, summed: what a
        tenant confined to some namespaces is shown instead of the global figures. O(namespaces)."""
        names = [name for name, rec in self._records.items() if not rec.deleted and visible(name)]
        total = {"policy": self._partitions.policy, "page_size": self._page_size, "block_bytes": self._block_bytes,
                 "namespaces": 0, "pages": 0, "pinned_pages": 0, "evictable_pages": 0, "bytes": 0,
                 "hits_tokens": 0, "misses_tokens": 0, "evictions": 0, "inserts": 0, "stored_pages": 0,
                 "leases": 0}
        for name in names:
            one = self.stats(name)
            total["namespaces"] += bool(one["pages"] or one["leases"])
            for field in ("pages", "pinned_pages", "evictable_pages", "bytes", "hits_tokens", "misses_tokens",
                          "evictions", "inserts", "stored_pages", "leases"):
                total[field] += one[field]
        total["hit_rate"] = hit_rate(total["hits_tokens"], total["misses_tokens"])
        return total

    def policy_memory(self) -> int:
        """About the bytes the eviction policy holds (orders, ghosts, miniatures, node data): INFO's
        used_memory_policy, a share of the metadata the heap's growth already counts."""
        partitions = self._partitions
        indexes = {id(partitions.index): [partitions.index, 0, 0],
                   **{id(p.index): [p.index, 0, 0] for p in partitions.parts}}
        for rec in self._records.values():
            for tree in rec.trees.values():
                counts = indexes[id(tree.index)]
                counts[1] += tree.nodes
                counts[2] += tree.pages
        return sum(index.memory_bytes(nodes, pages) for index, nodes, pages in indexes.values())

    @property
    def allocator_bytes(self) -> int:
        """Bytes the block allocator holds (1 per block of state, plus the ids of returned blocks)."""
        return self._partitions.alloc.metadata_bytes
