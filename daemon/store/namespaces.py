"""Namespaces in the store: each one's record (radix trees, one per shard, and counters) and the table of them.

A namespace has one radix tree per shard; the shard of a sequence is a stable hash of
(namespace, first page), so a sequence and all its prefixes live in one tree (``shard_of``).
A record exists while its namespace holds a page, a lease or an insert in flight; the table
retires an empty one at once, adding its counters to ``retired`` so that the global counters
still add up without a record per name that ever was. A record is filed, when it is made,
under the arena partition and the tenant quota its name falls under.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from .radix import RadixTree

if TYPE_CHECKING:
    from .inserts import PlansInFlight
    from .partitions import ArenaPartitions
    from .quotas import QuotaBook

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
    def holds_pages(self) -> bool:
        """Whether the namespace holds a page (its leases alone, a PFXALLOC's before the first commit, do not count)."""
        for tree in self.trees.values():
            if tree.pages:
                return True
        return False

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


class Namespaces:
    """The records of the namespaces that exist, by name, and the counters of those that no longer do."""

    def __init__(self, page_bytes: int, shards: int, partitions: ArenaPartitions, plans: PlansInFlight,
                 quotas: QuotaBook) -> None:
        self._page_bytes = page_bytes
        self._shards = shards
        self._partitions = partitions
        self._plans = plans
        self.records: dict[bytes, Namespace] = {}
        #: Counters of namespaces that no longer exist (emptied by EVICT ALL or FLUSHALL) or never
        #: did (a PFXGET of an unknown key).
        self.retired = Namespace(b"")
        #: The tenant rules in force (quotas.py): which one a new record falls under.
        self.quotas = quotas
        self.epoch = 0  # changes whenever a namespace appears or goes (SCAN's order cache)
        #: Namespaces of key pages (page_keys.py): from their first HASHES insert until they are empty.
        self.key_names: set[bytes] = set()

    def shard_of(self, name: bytes, tokens: bytes) -> int:
        """The shard of packed ``tokens`` in namespace ``name``: crc32 of (name, first page) mod shards;
        a namespace of key pages keeps one tree (a lookup may start at any of its pages): crc32 of name."""
        if self._shards == 1:
            return 0
        if self.key_names and name in self.key_names:
            return zlib.crc32(name) % self._shards
        return zlib.crc32(tokens[: self._page_bytes], zlib.crc32(name)) % self._shards

    def create(self, name: bytes) -> Namespace:
        """A new, empty record for ``name`` (replacing any there), filed under its partition and quota."""
        rec = self.records[name] = Namespace(name)
        if self.quotas:
            rec.quota = self.quotas.of(name)
        if self._partitions.parts:
            rec.part = self._partitions.part_of(name)
        self.epoch += 1
        return rec

    def quota_of(self, name: bytes):
        """The tenant quota namespace ``name`` falls under (None: none)."""
        return self.quotas.of(name) if self.quotas else None

    def tree(self, rec: Namespace, shard: int) -> RadixTree:
        """The namespace's tree of ``shard``, made on first use over its partition's index and counters."""
        tree = rec.trees.get(shard)
        if tree is None:
            part = rec.part
            if part is None:
                index, totals = self._partitions.index, self._partitions.totals
            else:
                index, totals = part.index, part.totals
            tree = rec.trees[shard] = RadixTree(self._page_bytes, index, totals, rec.name, shard)
            if rec.name in self.key_names:
                tree.keys = {}
        return tree

    def names(self) -> list[bytes]:
        """Names of the namespaces that hold pages or leases (Redis's keys), sorted."""
        return sorted(name for name, rec in self.records.items() if rec.holds_anything and not rec.deleted)

    def retire_if_empty(self, rec: Namespace) -> None:
        """Forget a namespace that holds no page, lease or insert in flight (its counters stay in the totals)."""
        if rec.holds_anything:
            return
        if self.records.get(rec.name) is not rec or self._plans.holds(rec.name):
            return
        self.retired.absorb(rec)
        del self.records[rec.name]
        self.key_names.discard(rec.name)
        self._partitions.index_of(rec).forget_scope(rec.name)
        self.epoch += 1

    def rename(self, rec: Namespace, new: bytes) -> None:
        """File ``rec`` under ``new`` (a deleted namespace's tombstone): its trees follow, and the
        eviction index forgets what it knew under the old name."""
        old = rec.name
        del self.records[old]
        self.key_names.discard(old)
        self._partitions.index_of(rec).forget_scope(old)
        rec.name = new
        for tree in rec.trees.values():
            tree.scope = new
        self.records[new] = rec
        self.epoch += 1
