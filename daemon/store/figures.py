"""What the store reports: its counters and gauges, global, per namespace, or summed over a tenant's.

A mixin of :class:`~.store.PrefixStore`: it reads the store's parts (allocator,
totals, namespace records, leases, plans) and changes nothing. INFO, PFXINFO,
DBSIZE, the metrics endpoint and MEMORY figures all read these.
"""

from __future__ import annotations

from .allocator import LEASED, TREE
from .arguments import namespace_name
from .namespaces import Namespace


class StoreFigures:
    """The store's figures (see the module docstring); the attributes it reads are PrefixStore's."""

    def namespaces(self) -> list[bytes]:
        """Names of the namespaces that hold pages or leases (Redis's keys), sorted."""
        return sorted(name for name, rec in self._ns.items()
                      if rec.holds_anything and not rec.deleted)

    @staticmethod
    def _rate(hits: int, misses: int) -> float:
        return hits / (hits + misses) if hits + misses else 0.0

    def stats(self, ns=None) -> dict:
        """Counters for one namespace, or global ones (ns=None). Hits/misses are in tokens."""
        if ns is not None:
            name = namespace_name(ns)
            rec = self._ns.get(name) or Namespace(name)
            pages = rec.pages
            pinned = rec.pinned
            return {
                "namespace": name, "policy": self.policy, "pages": pages, "pinned_pages": pinned,
                "evictable_pages": pages - pinned, "nodes": sum(t.nodes for t in rec.trees.values()),
                "bytes": pages * self.block_bytes, "hits_tokens": rec.hits, "misses_tokens": rec.misses,
                "hit_rate": self._rate(rec.hits, rec.misses), "evictions": rec.evictions,
                "inserts": rec.inserts, "stored_pages": rec.stored, "leases": rec.leases,
            }
        t = self._totals
        return {
            "policy": self.policy, "page_size": self.page_size, "shards": self.shards,
            "block_bytes": self.block_bytes, "blocks_total": self.nblocks,
            "blocks_used": self.nblocks - self._alloc.free_count, "blocks_free": self._alloc.free_count,
            "blocks_cached": self._alloc.count(TREE), "blocks_leased": self._alloc.count(LEASED),
            "pages": t.pages, "pinned_pages": t.pages - t.unpinned, "evictable_pages": t.unpinned,
            "hits_tokens": self.hits, "misses_tokens": self.misses, "hit_rate": self._rate(self.hits, self.misses),
            "evictions": self.evictions,
            **{f"evictions_{cause}": pages for cause, pages in self.evictions_by_cause.items()},
            "inserts": self.inserts, "stored_pages": self.stored,
            "leases": len(self._leases), "fenced_leases": self._leases.fenced, "inserts_in_progress": len(self._plans),
            "namespaces": sum(1 for rec in self._ns.values() if not rec.deleted),
        }

    def policy_memory(self) -> int:
        """About the bytes the eviction policy holds (orders, ghosts, miniatures, node data): INFO's
        used_memory_policy, a share of the metadata the heap's growth already counts."""
        indexes = {id(self._index): [self._index, 0, 0], **{id(p.index): [p.index, 0, 0] for p in self.parts}}
        for rec in self._ns.values():
            for tree in rec.trees.values():
                counts = indexes[id(tree.index)]
                counts[1] += tree.nodes
                counts[2] += tree.pages
        return sum(index.memory_bytes(nodes, pages) for index, nodes, pages in indexes.values())

    @property
    def allocator_bytes(self) -> int:
        """Bytes the block allocator holds (1 per block of state, plus the ids of returned blocks)."""
        return self._alloc.metadata_bytes

    def stats_of(self, visible) -> dict:
        """The counters of the namespaces whose name ``visible(name)`` accepts, summed: what a
        tenant confined to some namespaces is shown instead of the global figures. O(namespaces)."""
        names = [name for name, rec in self._ns.items() if not rec.deleted and visible(name)]
        total = {"policy": self.policy, "page_size": self.page_size, "block_bytes": self.block_bytes,
                 "namespaces": 0, "pages": 0, "pinned_pages": 0, "evictable_pages": 0, "bytes": 0,
                 "hits_tokens": 0, "misses_tokens": 0, "evictions": 0, "inserts": 0, "stored_pages": 0,
                 "leases": 0}
        for name in names:
            one = self.stats(name)
            total["namespaces"] += bool(one["pages"] or one["leases"])
            for field in ("pages", "pinned_pages", "evictable_pages", "bytes", "hits_tokens", "misses_tokens",
                          "evictions", "inserts", "stored_pages", "leases"):
                total[field] += one[field]
        total["hit_rate"] = self._rate(total["hits_tokens"], total["misses_tokens"])
        return total

    def info(self) -> dict:
        """Everything PFXINFO shows: configuration, arena and global counters."""
        return {"arena": self.arena.describe(), "lease_ttl_ms": self.lease_ttl_ms, "max_alloc": self.max_alloc,
                **self.stats()}
