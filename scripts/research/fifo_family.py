"""S3-FIFO and SIEVE in hindsight's page-granular prefix cache: two of issue 15's directions, measured.

Both come from the object-cache literature and neither knows about prefixes,
so here each runs as ``hindsight.simulate`` runs its rules: a request looks up
its longest cached prefix, its pages are pinned while it is handled, only a
page with no cached page below it can go (a page with a cached continuation is
passed over, as a pinned one is), and a request's new pages are stored after
the evictions that make room for them.

* **S3-FIFO** (Yang et al., "FIFO queues are all you need for cache
  eviction", SOSP 2023): new pages enter a small FIFO (SMALL_SHARE of the
  capacity); a page hit there at least once moves to the main FIFO when it
  reaches the small FIFO's end (MOVE_HITS: libCacheSim's first S3-FIFO; its
  later default asks 2), others go to a ghost FIFO of ids (as many as the main
  FIFO holds); a page whose id is in the ghost enters the main FIFO directly.
  The main FIFO reinserts a page with hits, one fewer each time (at most
  MAX_FREQ).
* **SIEVE** (Zhang et al., "SIEVE is simpler than LRU", NSDI 2024): one FIFO
  in insertion order and a hand moving from its oldest end to its newest;
  a hit only sets a page's visited bit; the hand clears visited bits as it
  passes and evicts the first page it finds unvisited. Kept as a heap of
  (sweep, insertion number): a page the hand passes is due in the next sweep,
  a new page in the current one (it lies ahead of the hand), so each step is
  O(log n). Once the hand has passed the newest page it wraps, and pages
  stored after that wait for the next sweep. A page with a cached page below
  it is passed as a visited one is: this is the paper's hand, only leaves
  going. ``sieve-prefix`` differs in one step: a page passed unvisited, only
  because a cached page lay below it, returns to its place once that page is
  evicted (unless it was visited since), so a one-off request's pages go
  together.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict

SMALL_SHARE = 0.1  # the small FIFO's share of S3-FIFO's capacity (the paper's)
MAX_FREQ = 3  # hits a page of S3-FIFO's main FIFO keeps count of (the paper's)
MOVE_HITS = 1  # hits in S3-FIFO's small FIFO that move a page to the main one


class _PrefixPages:
    """What both share: which pages are cached and how many cached pages lie one deeper than each."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}  # cached page -> the page before it (-1 at the root)
        self.below: dict[int, int] = {}  # cached page -> its cached pages one deeper

    def __contains__(self, page: int) -> bool:
        return page in self.parent

    def __len__(self) -> int:
        return len(self.parent)

    def add(self, page: int, up: int) -> None:
        self.parent[page] = up
        if up >= 0:
            self.below[up] = self.below.get(up, 0) + 1

    def evictable(self, page: int, pinned: set[int]) -> bool:
        return page not in pinned and not self.below.get(page)

    def remove(self, page: int) -> None:
        self.below.pop(page, None)
        up = self.parent.pop(page)
        if up >= 0:
            self.below[up] -= 1


class S3FIFO(_PrefixPages):
    """A small FIFO that filters, a main FIFO that reinserts what was hit, a ghost of the filtered."""

    name = "s3-fifo"

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.small_limit = max(1, int(capacity * SMALL_SHARE))
        self.ghost_limit = max(1, capacity - self.small_limit)
        self.small: OrderedDict[int, None] = OrderedDict()
        self.main: OrderedDict[int, None] = OrderedDict()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}

    def hit(self, page: int) -> None:
        self.freq[page] = min(MAX_FREQ, self.freq[page] + 1)

    def insert(self, page: int, up: int) -> None:
        self.add(page, up)
        self.freq[page] = 0
        if page in self.ghost:  # evicted from the small FIFO unhit, and back: main
            del self.ghost[page]
            self.main[page] = None
        else:
            self.small[page] = None

    def evict(self, pinned: set[int]) -> None:
        """Evict one page (one must be evictable)."""
        small, main = self.small, self.main
        blocked_small = blocked_main = 0  # pages that could not go, popped since the last change: past a whole FIFO, try the other
        while True:
            main_all_blocked = blocked_main > len(main)
            if small and blocked_small <= len(small) and (len(small) >= self.small_limit or not main or main_all_blocked):
                page, _ = small.popitem(last=False)
                if not self.evictable(page, pinned):
                    small[page] = None
                    blocked_small += 1
                elif self.freq[page] >= MOVE_HITS:
                    self.freq[page] = 0
                    main[page] = None
                    blocked_small = blocked_main = 0  # main has a page this call has not tried
                else:
                    self._drop(page)
                    self.ghost[page] = None
                    if len(self.ghost) > self.ghost_limit:
                        self.ghost.popitem(last=False)
                    return
            elif main and not main_all_blocked:
                page, _ = main.popitem(last=False)
                if not self.evictable(page, pinned):
                    main[page] = None
                    blocked_main += 1
                elif self.freq[page] > 0:
                    self.freq[page] -= 1
                    main[page] = None
                    blocked_main = 0  # a hit spent: the next pass may find it unhit
                else:
                    self._drop(page)
                    return
            else:
                raise AssertionError("no evictable page")  # a page not pinned has an unpinned leaf below it

    def _drop(self, page: int) -> None:
        self.remove(page)
        del self.freq[page]


class SIEVE(_PrefixPages):
    """One FIFO and a hand that spares what was visited since it last passed."""

    name = "sieve"
    return_prefixes = False  # a page passed for what lay below it waits for the next sweep, as a visited one

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.heap: list[tuple[int, int, int]] = []  # (sweep the hand reaches it in, insertion number, page)
        self.due: dict[int, tuple[int, int, int]] = {}  # cached page -> its valid heap entry
        self.sweep = 0  # the hand's current sweep
        self.visited: dict[int, bool] = {}
        self.held: set[int] = set()  # pages passed unvisited, only because a cached page lay below them
        self._seq = itertools.count()

    def hit(self, page: int) -> None:
        self.visited[page] = True

    def insert(self, page: int, up: int) -> None:
        self.add(page, up)
        self.visited[page] = False
        self._file((self.sweep, next(self._seq), page))

    def _file(self, entry: tuple[int, int, int]) -> None:
        self.due[entry[2]] = entry
        heapq.heappush(self.heap, entry)

    def evict(self, pinned: set[int]) -> None:
        heap = self.heap
        while True:
            entry = heapq.heappop(heap)
            sweep, seq, page = entry
            if self.due.get(page) != entry:
                continue  # superseded: the page was filed again since
            self.sweep = sweep
            if self.visited[page] or not self.evictable(page, pinned):
                if self.return_prefixes and not self.visited[page]:
                    self.held.add(page)  # spared for what lies below it, not for a visit
                self.visited[page] = False
                self._file((sweep + 1, seq, page))  # passed: behind the hand until it wraps
                continue
            up = self.parent[page]
            self.remove(page)
            del self.visited[page], self.due[page]
            self.held.discard(page)
            if self.return_prefixes and up in self.held and not self.below.get(up) and not self.visited[up]:
                # Its prefix, passed only because this page lay below it, is a leaf now and back where
                # its insertion put it: a one-off request's pages go together, deepest first.
                self.held.discard(up)
                self._file((sweep, self.due[up][1], up))
            while heap and self.due.get(heap[0][2]) != heap[0]:
                heapq.heappop(heap)
            if not heap or heap[0][0] > sweep:
                self.sweep = sweep + 1  # the hand reached the newest page: it wraps, and new pages queue behind
            return


class PrefixSIEVE(SIEVE):
    """SIEVE, except that a prefix passed unvisited returns to its place when the last page below it goes."""

    name = "sieve-prefix"
    return_prefixes = True


RULES = {cls.name: cls for cls in (S3FIFO, SIEVE, PrefixSIEVE)}


def simulate(chains: list[list[int]], capacity: int, rule: str) -> list[int]:
    """Pages hit per request under ``rule`` (a name in RULES), handled as ``hindsight.simulate`` does."""
    cache = RULES[rule](capacity)
    hits = []
    for chain in chains:
        chain = chain[:capacity]
        k = 0
        while k < len(chain) and chain[k] in cache:
            k += 1
        hits.append(k)
        for page in chain[:k]:
            cache.hit(page)
        pinned = set(chain)
        for _ in range(len(cache) + len(chain) - k - capacity):
            cache.evict(pinned)
        for d in range(k, len(chain)):
            cache.insert(chain[d], chain[d - 1] if d else -1)
    return hits
