"""Lookups: the longest cached whole-page prefix of a prompt, and the lease that pins it.

A lookup walks one radix tree (the namespace's shard of the prompt), splitting the last
matched edge so that a pin covers exactly the match, touches the path (what the eviction
policy orders by) and tells the policy what was asked and found. It never creates a
namespace: unknown keys cost no memory, and their counters go to the retired record so the
global counters still add up. Hits and misses are counted in tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from .arguments import TOKEN_BYTES, namespace_name, packed_tokens
from .idents import IDENT_BYTES, namespace_ident, node_idents, page_ident
from .results import MatchResult

if TYPE_CHECKING:
    from .keyspace import NamespaceKeys
    from .leases import Leases
    from .namespaces import Namespaces
    from .partitions import ArenaPartitions


class Lookups:
    """The store's read path (see the module docstring), with its hit and miss counters."""

    def __init__(self, *, namespaces: Namespaces, keys: NamespaceKeys, partitions: ArenaPartitions,
                 leases: Leases, clock: Callable[[], float], shard_of: Callable[[bytes, bytes], int],
                 page_size: int, page_bytes: int) -> None:
        self._records = namespaces.records
        self._retired = namespaces.retired
        self._keys = keys
        self._partitions = partitions
        self._totals = partitions.totals
        self._leases = leases
        self._clock = clock
        self._shard_of = shard_of
        self._page_size = page_size
        self._page_bytes = page_bytes
        self.hits = 0  # tokens
        self.misses = 0  # tokens

    def tier_probe(self, ns, tokens, present: Callable[[bytes], bool]) -> tuple[int, list[bytes]]:
        """Where the RAM match of ``tokens`` ends, and the idents of the whole pages after it that
        ``present`` says a lower tier holds, in order, up to the first it does not: (RAM pages,
        idents). Counts, touches and pins nothing; computes one ident per page it asks about (and
        caches those of the RAM path on its nodes).
        """
        name = namespace_name(ns)
        tokens = packed_tokens(tokens)
        P = self._page_bytes
        npages = len(tokens) // P
        rec = self._records.get(name)
        if rec is not None and (rec.deleted or (rec.expires_at is not None and self._keys.live(name) is None)):
            rec = None
        tree = rec.trees.get(self._shard_of(name, tokens)) if rec is not None and npages else None
        ram = 0
        ident = namespace_ident(name)
        if tree is not None:
            node, pages, child, extra = tree.walk(tokens, npages)
            if not pages + extra and tree.keys and tokens[:P] in tree.keys:
                return 0, []  # a run of key pages that starts below the root: RAM answers it alone
            ram = pages + extra
            if extra:
                ident = node_idents(child)[(extra - 1) * IDENT_BYTES : extra * IDENT_BYTES]
            elif pages:
                ident = node_idents(node)[-IDENT_BYTES:]
        found: list[bytes] = []
        for page in range(ram, npages):
            ident = page_ident(ident, tokens[page * P : (page + 1) * P])
            if not present(ident):
                break
            found.append(ident)
        return ram, found

    def match(self, ns, tokens, lease: bool = True, ttl_ms: int | None = None, owner: int = 0,
              transient: bool = False, below: Callable[[bytes], bool] | None = None) -> MatchResult | None:
        """Longest cached whole-page prefix of ``tokens`` in ``ns``.

        ``below(ident)``: whether a lower tier holds a page (tiering.py). When it holds the page
        right after the RAM match, nothing is counted, touched or leased and None is returned: the
        caller brings those pages up first. It costs one ident and one call, and only when the
        RAM match is shorter than the prompt.

        Counts hits/misses in tokens, touches the matched path (time and
        frequency), and with ``lease`` pins it under a READ lease of ``owner``.
        Cost: O(len(tokens)) bytes compared at C speed, O(path nodes) Python steps.
        ``transient``: the lease only pins the pages while the daemon copies them out (a
        WITHDATA NOLEASE lookup): it is not held to client-lease-limit or the quotas.
        """
        name = namespace_name(ns)
        tokens = packed_tokens(tokens)
        leases = self._leases
        deadline = leases.deadline(ttl_ms) if lease else math.inf
        npages = len(tokens) // self._page_bytes
        retired = self._retired
        rec = self._records.get(name, retired)
        if rec.expires_at is not None and self._keys.live(name) is None:
            rec = retired
        if rec is not retired:
            self._keys.record_access(rec)
        pages = 0
        blocks: list[int] = []
        lease_id = 0
        base = 0
        tree = rec.trees.get(self._shard_of(name, tokens)) if npages else None
        node = None
        if tree is not None:
            if tree.keys is None:
                node, pages = tree.locate(tokens, npages)  # split so a pin covers exactly the match
            else:  # key pages: the run may start below the root (page_keys.py)
                node, pages, child, extra, base = tree.walk_keys(tokens, npages)
                if child is not None:
                    node = tree.split(child, extra)
                    pages += extra
            if below is not None and pages < npages and not base:
                last = node_idents(node)[-IDENT_BYTES:] if pages else namespace_ident(name)
                P = self._page_bytes
                if below(page_ident(last, tokens[pages * P : (pages + 1) * P])):
                    return None
            if pages and lease and not transient:
                leases.check_room(owner, rec.quota, pages)  # refused: nothing but the split changed
            if pages:
                self._totals.ticks += 1
                if lease:
                    # Pin before touching: the leased path leaves the eviction index once
                    # and re-enters it (with its new priority) when the lease ends.
                    tree.pin(node)
                tree.touch(node, self._clock(), hit=True)
                blocks = tree.path_blocks(node)
                if lease:  # the lease holds what it pins: the whole path, from the root
                    lease_id = leases.take_read(owner, rec, deadline, node, blocks[:])  # a copy: the caller may change its own
                if base:
                    blocks = blocks[base:].tolist()  # a run below the root: no whole nodes to reuse
        elif below is not None and npages and below(page_ident(namespace_ident(name), tokens[: self._page_bytes])):
            return None
        if npages:
            partitions = self._partitions
            index = partitions.index if not partitions.parts else (rec.part or partitions.part_of(name)).index
            index.looked_up(name, tokens, npages, pages, node, lease_id)
        matched = pages * self._page_size
        missed = len(tokens) // TOKEN_BYTES - matched
        rec.hits += matched
        rec.misses += missed
        self.hits += matched
        self.misses += missed
        return MatchResult(matched, lease_id, blocks)

    def cached_tokens(self, ns, tokens) -> int:
        """Tokens of the longest cached whole-page prefix, without touching, counting or leasing anything."""
        name = namespace_name(ns)
        tokens = packed_tokens(tokens)
        npages = len(tokens) // self._page_bytes
        rec = self._records.get(name)
        tree = rec.trees.get(self._shard_of(name, tokens)) if rec is not None and npages else None
        if tree is None:
            return 0
        _, pages, _, extra, _ = tree.walk_keys(tokens, npages) if tree.keys is not None else (
            *tree.walk(tokens, npages), 0)
        return (pages + extra) * self._page_size
