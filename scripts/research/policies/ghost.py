"""The ``ghost`` eviction policy (research, not shipped): LRU with ghost-guided bimodal insertion.

One lazy heap like LRU, but a leaf that nothing marks as valuable may be
placed at the LRU end (key = the key of the last victim) instead of the
MRU end, so it is the next to go unless it is hit first. That is the
bimodal insertion of Qureshi et al. (ISCA 2007) adapted to a prefix tree:

* a leaf is a *continuation* when its parent is private to it (the
  parent's only child, not the root) and was hit (a multi-turn
  conversation going on), or when the hash of its first page is in the
  *ghost*: the first pages of recently evicted leaves (a prefix that was
  cached, evicted too early, and is back). Continuations always go to the
  MRU end;
* the other new leaves go to the LRU end only while the cache *thrashes*:
  an EWMA over continuations of "it came back through the ghost" (1) vs
  "it came back as a hit" (0) is above 1/2. A cache that holds its
  working set sees continuations as hits and behaves exactly like LRU;
* even then 1 leaf in 32 (by its first page's crc32) goes in at the MRU
  end, so new content keeps a way in.

Priorities depend only on the order of events (never on clock values), so
replays through the daemon and in process agree. The ghost is bounded:
ghosts.limit(indexed leaves) crc32 values, oldest dropped first.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict

from pfxcache.daemon.store.ghosts import limit
from pfxcache.daemon.store.policies import HeapPolicy

THRASH_ALPHA = 0.01  # weight of one observation in the thrashing estimate (an EWMA)
THRASH_ON = 0.5  # insert cold leaves at the LRU end while the estimate is above this
BIMODAL_SHARE = 1 << 27  # crc32 below this (1 in 32 leaves) still goes in at the MRU end
GHOST_POLICY_ENTRY_BYTES = 100  # an OrderedDict entry of an int key and None


class GhostPolicy(HeapPolicy):
    """LRU with ghost-guided bimodal insertion: scan- and thrash-resistant, O(log n); see the module docstring."""

    name = "ghost"
    summary = ("LRU that, while the cache thrashes, puts new pages nobody continues at the LRU end; "
               "continuations of hit or recently evicted prefixes stay protected")
    # A namespace's instance has a floor and a ghost of its own, set by its evictions (until the
    # first, it holds what the global one would give it: the keys of lru, thrash 0).
    scope_shares_order = False

    def __init__(self) -> None:
        super().__init__()
        self._floor = None  # key of the last victim: "the LRU end"
        self._ghost: OrderedDict[int, None] = OrderedDict()
        self.thrash = 0.0

    @staticmethod
    def _first_page(node) -> int:
        return zlib.crc32(node.key[: node.tree.page_bytes])

    @staticmethod
    def _continues(node) -> bool:
        parent = node.parent
        return (parent is not None and parent.parent is not None and parent.freq > 0
                and len(parent.children) == 1)

    def push(self, node, uncovered: bool = False) -> None:
        key = node.last_access
        if node.freq == 0 and not node.children:  # a leaf never hit: just stored (or a cold parent)
            h = self._first_page(node)
            ghost = h in self._ghost
            continues = self._continues(node)
            if ghost or continues:
                self.thrash += THRASH_ALPHA * ((0.0 if continues else 1.0) - self.thrash)
            elif self.thrash > THRASH_ON and self._floor is not None and h >= BIMODAL_SHARE:
                key = self._floor
        self._enqueue((key, next(self._seq), node.version, node))
        self.live += 1

    def memory_bytes(self, nodes: int, pages: int) -> int:
        return super().memory_bytes(nodes, pages) + len(self._ghost) * GHOST_POLICY_ENTRY_BYTES

    def peek(self, now: float):
        entry = self._top()
        node = entry[-1] if entry is not None else None
        if node is not None:
            key = entry[0]
            if self._floor is None or key > self._floor:
                self._floor = key
            h = self._first_page(node)
            if h not in self._ghost:
                ghost = self._ghost
                ghost[h] = None
                bound = limit(self.live)
                while len(ghost) > bound:
                    ghost.popitem(last=False)
        return node
