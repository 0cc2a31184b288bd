"""The eviction commands of the store: PFXEVICT's forms, FLUSHALL, the low-watermark sweep.

A mixin of :class:`~.store.PrefixStore`, kept apart so the facade stays readable: these
methods validate their arguments, then call the store's own eviction primitives
(``_evict`` by policy, ``_drop`` of a subtree) and namespace bookkeeping.
"""

from __future__ import annotations

from .arguments import integer, namespace_name, packed_tokens
from .errors import BadRequest
from .events import announce_survivors
from .results import EvictResult


class EvictionCommands:
    """PFXEVICT TOKENS|PAGES|BYTES|ALL, FLUSHALL and the watermark sweep; the attributes are PrefixStore's."""

    def evict_prefix(self, ns, tokens) -> EvictResult:
        """Forget every cached sequence that starts with the whole pages of ``tokens``
        (the last of those pages and everything below it); pinned pages stay and are counted."""
        name = namespace_name(ns)
        tokens = packed_tokens(tokens)
        npages = len(tokens) // self.page_bytes
        if not npages:
            raise BadRequest(f"the prefix must hold at least one whole page ({self.page_size} tokens)")
        rec = self._ns.get(name)
        tree = rec.trees.get(self._shard(name, tokens)) if rec is not None else None
        if tree is None:
            return self._result(0, 0)
        node, pages, child, extra = tree.walk(tokens, npages)
        if pages + extra < npages:
            return self._result(0, 0)
        # Make the last page of the prefix start a node: that node's subtree is exactly what goes.
        if child is not None:
            target = child
            if extra > 1:
                tree.split(child, extra - 1)
        else:
            target = node
            if len(node.blocks) > 1:
                tree.split(node, len(node.blocks) - 1)
        return self._result(*self._drop(tree, target))

    def evict_pages(self, ns, n: int) -> EvictResult:
        """Evict up to n pages of ``ns`` chosen by the policy."""
        name = namespace_name(ns)
        n = integer(n, "the page count", 0)
        rec = self._ns.get(name)
        if rec is None:
            return self._result(0, 0)
        evicted = self._evict(n, name, "command")
        return self._result(evicted, rec.pinned)

    def evict_bytes(self, ns, nbytes: int) -> EvictResult:
        """Evict pages of ``ns`` by policy until at least nbytes of blocks are freed (or nothing is left)."""
        nbytes = integer(nbytes, "the byte count", 0)
        return self.evict_pages(ns, -(-nbytes // self.block_bytes))

    def evict_all(self, ns, *, cause: str = "command") -> EvictResult:
        """Drop every unpinned page of ``ns`` (``cause``: how INFO counts them, one of EVICTION_CAUSES)."""
        rec = self._ns.get(namespace_name(ns))
        if rec is None:
            return self._result(0, 0)
        evicted = pinned = 0
        for tree in rec.trees.values():
            e, p = self._drop(tree, tree.root, cause)
            evicted += e
            pinned += p
        result = self._result(evicted, pinned)
        self._retire_if_empty(rec)
        return result

    def flush(self) -> EvictResult:
        """Drop every unpinned page of every namespace, and what the eviction policy learned from them.

        KV events: one "all cleared" for the lot, then the pages leases kept are announced again.
        """
        events, self._events = self._events, None
        names = [name for name in self.namespaces() if type(name) is bytes]  # not DEL's tombstones
        evicted = pinned = 0
        try:
            for name in list(self._ns):
                e, _, p = self.evict_all(name, cause="flush")
                evicted += e
                pinned += p
        finally:
            self._events = events
        self.set_policy(self.policy)  # a fresh index: a learning policy starts over
        if events is not None:
            events.all_cleared(names)
            for rec in self._ns.values():
                for tree in rec.trees.values():
                    announce_survivors(events, tree)
        return self._result(evicted, pinned)

    def evict_to_watermark(self, low_free_blocks: int) -> EvictResult:
        """Evict by policy across namespaces until at least ``low_free_blocks`` blocks are free
        (with arena partitions: until each has its proportional share of them free)."""
        low = integer(low_free_blocks, "the free-block watermark", 0)
        if self.parts:  # each arena partition keeps its share free, with its own pages
            evicted = 0
            for part in self.parts:
                short = low * part.nblocks // self.nblocks - part.alloc.free_count
                evicted += self._evict(short, None, "watermark", part) if short > 0 and self.evicting else 0
            return self._result(evicted, self._totals.pages - self._totals.unpinned)
        short = low - self._alloc.free_count
        evicted = self._evict(short, None, "watermark") if short > 0 and self.evicting else 0
        return self._result(evicted, self._totals.pages - self._totals.unpinned)
