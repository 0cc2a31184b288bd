"""A namespace's record in the store: its radix trees (one per shard) and its counters."""

from __future__ import annotations

from .radix import RadixTree

# The counters every namespace keeps and the store also keeps globally; their sums must agree.
COUNTERS = ("hits", "misses", "evictions", "inserts", "stored")


class Namespace:
    """Per-namespace trees and counters."""

    __slots__ = ("access", "deleted", "evictions", "expires_at", "hits", "inserts", "leases", "misses", "name",
                 "part", "quota", "stored", "trees")

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.trees: dict[int, RadixTree] = {}  # shard -> tree, created on first insert
        self.hits = 0  # tokens
        self.misses = 0  # tokens
        self.evictions = 0  # pages
        self.inserts = 0  # committed inserts
        self.stored = 0  # pages stored by inserts
        self.leases = 0  # active leases
        self.access = None  # keyspace.Access: last use and LFU counter, from the first access on
        self.expires_at: int | None = None  # Unix ms when the whole namespace expires (EXPIRE)
        self.deleted = False  # DEL'd while pinned: a tombstone waiting for its leases (keyspace.py)
        self.quota = None  # quotas.Quota of the tenant rule it falls under, or None
        self.part = None  # partitions.Partition its blocks come from (None: the arena is not partitioned)

    @property
    def pages(self) -> int:
        """Cached pages over all shards."""
        return sum(tree.pages for tree in self.trees.values())

    @property
    def pinned(self) -> int:
        """Cached pages a lease or an insert in flight pins."""
        return sum(tree.pages - tree.unpinned for tree in self.trees.values())

    @property
    def holds_anything(self) -> bool:
        """Whether the namespace holds a page or a lease (what makes it a key)."""
        if self.leases:
            return True
        for tree in self.trees.values():  # a loop, not any(<generator>): it runs on every insert
            if tree.pages:
                return True
        return False

    def absorb(self, other: Namespace) -> None:
        """Add ``other``'s counters to these (a retired namespace's totals live on here)."""
        for field in COUNTERS:
            setattr(self, field, getattr(self, field) + getattr(other, field))
