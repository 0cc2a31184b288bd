"""Namespaces as keys: existence, listing with a stable cursor, deletion, expiry, access statistics.

What Redis's generic keyspace commands need from the store, kept apart from the
prefix operations. ``NamespaceKeys`` belongs to one :class:`PrefixStore` and
works on its namespace records (namespaces.py).

Deletion makes a namespace vanish at once, as DEL does in Redis, although a
lease may still pin some of its pages: the unpinned pages are freed now, and
the record moves under a :class:`Tombstone` name that no client can spell, so
no lookup or insert ever reaches those pages again. They are freed as their
leases end (the store sweeps a deleted record whenever it unpins something).
A new namespace of the same name starts empty.

Expiry is per namespace, in Unix milliseconds, checked lazily whenever a
command reaches the namespace and actively from the daemon's cron
(:meth:`NamespaceKeys.expire_due`), like Redis's volatile keys.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import itertools
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .events import announce_deleted

if TYPE_CHECKING:
    from .evictions import Evictor
    from .inserts import PlansInFlight
    from .leases import Leases
    from .listeners import Listeners
    from .namespaces import Namespace, Namespaces

#: Redis's LFU counter: new keys start at 5, the counter saturates at 255.
LFU_INIT = 5
LFU_MAX = 255

#: Per-page and per-node metadata bytes, for MEMORY USAGE: a Node object with its slots,
#: dict entry, key bytes header and block-id list (measured with sys.getsizeof on CPython
#: 3.11), and one list slot plus the page's token bytes per page.
NODE_OVERHEAD = 360
PAGE_OVERHEAD = 8
RECORD_OVERHEAD = 400


class Tombstone(bytes):
    """The name of a deleted namespace whose pinned pages wait for their leases.

    Equal only to itself, so no namespace a client names, not even one with the
    same bytes, ever finds the record; the bytes are the old name, for logs.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = object.__hash__


class Access:
    """A namespace's access statistics: when it was last used and Redis's logarithmic LFU counter.

    The counter grows as Redis's does on average (an access adds one with
    probability 1 / ((counter - 5) x lfu-log-factor + 1)), but deterministically:
    accesses accumulate as credit that is spent in steps of that size.
    It decays by one per lfu-decay-time minutes without access.
    """

    __slots__ = ("counter", "credit", "last", "last_decay")

    def __init__(self, now: float) -> None:
        self.counter = LFU_INIT
        self.credit = 0
        self.last = now
        self.last_decay = now

    def record(self, now: float, log_factor: int, decay_minutes: int) -> None:
        self._decay(now, decay_minutes)
        self.last = now
        if self.counter >= LFU_MAX:
            return
        self.credit += 1
        step = max(self.counter - LFU_INIT, 0) * log_factor + 1
        if self.credit >= step:
            self.credit -= step
            self.counter += 1

    def _decay(self, now: float, decay_minutes: int) -> None:
        if decay_minutes <= 0:
            return
        periods = int((now - self.last_decay) // (60 * decay_minutes))
        if periods:
            self.counter = max(0, self.counter - periods)
            self.last_decay += periods * 60 * decay_minutes
            self.credit = 0

    def frequency(self, now: float, decay_minutes: int) -> int:
        """OBJECT FREQ: the counter, decayed to ``now``."""
        self._decay(now, decay_minutes)
        return self.counter

    def idle_seconds(self, now: float) -> int:
        """OBJECT IDLETIME: whole seconds since the last access."""
        return int(max(0.0, now - self.last))


def cursor_hash(name: bytes) -> int:
    """A name's place in SCAN order: a stable 64-bit hash, never 0 (0 ends a scan)."""
    return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "little") or 1


class NamespaceKeys:
    """The keyspace view of one store's namespaces."""

    def __init__(self, *, namespaces: Namespaces, evictor: Evictor, leases: Leases, plans: PlansInFlight,
                 listeners: Listeners, page_bytes: int, block_bytes: int,
                 wallclock: Callable[[], float] = time.time) -> None:
        self._names = namespaces
        self._records = namespaces.records
        self._evictor = evictor
        self._leases = leases
        self._plans = plans
        self._listeners = listeners
        self._page_bytes = page_bytes
        self._block_bytes = block_bytes
        self._wallclock = wallclock
        self._tombstones = itertools.count(1)
        self._deadlines: list[tuple[int, int, bytes]] = []  # (unix ms, seq, name): a lazy heap
        self._seq = itertools.count()
        self._order: list[tuple[int, bytes]] | None = None  # (cursor hash, name), sorted; None: stale
        self._order_epoch = -1
        self.log_factor = 10
        self.decay_minutes = 1
        self.expired = 0  # namespaces deleted because their expiry came (INFO's expired_keys)

    # -- finding records -------------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self._wallclock() * 1000)

    def live(self, name: bytes):
        """The record of namespace ``name`` if it exists as a key (expiring it lazily), else None."""
        rec = self._records.get(name)
        if rec is None or not rec.holds_anything:
            return None
        if rec.expires_at is not None and self.now_ms() >= rec.expires_at:
            self.expired += 1
            self.delete(name)
            return None
        return rec

    def open(self, name: bytes) -> Namespace:
        """The record of namespace ``name``, made (empty) when it is not a key or expired just now."""
        rec = self._records.get(name)
        if rec is not None and rec.expires_at is not None and self.live(name) is None:
            rec = None  # it expired just now
        if rec is None:
            rec = self._names.create(name)
        return rec

    def exists(self, name: bytes) -> bool:
        return self.live(name) is not None

    def names(self) -> list[bytes]:
        """Every namespace that is a key, sorted (expired ones are deleted on the way)."""
        out = []
        for name in self._names.names():
            if self.live(name) is not None:
                out.append(name)
        return out

    def random_name(self) -> bytes | None:
        names = self.names()
        return random.choice(names) if names else None

    # -- SCAN ------------------------------------------------------------------------------------

    def scan(self, cursor: int, count: int) -> tuple[int, list[bytes]]:
        """Up to ``count`` names from ``cursor`` on, in hash order, and the cursor to continue with.

        A name present for a whole iteration is returned at least once; the cursor
        is the hash of the next name, so it stays valid across inserts and deletions.
        """
        order = self._sorted()
        start = bisect.bisect_left(order, (cursor, b"")) if cursor else 0
        batch = order[start : start + count]
        next_cursor = order[start + count][0] if start + count < len(order) else 0
        return next_cursor, [name for _, name in batch if self.live(name) is not None]

    def _sorted(self) -> list[tuple[int, bytes]]:
        names = self._names
        if self._order is None or self._order_epoch != names.epoch:
            self._order = sorted((cursor_hash(name), name) for name in names.names())
            self._order_epoch = names.epoch
        return self._order

    # -- deletion ----------------------------------------------------------------------------------

    def delete(self, name: bytes) -> bool:
        """DEL: the namespace is gone at once; pinned pages go when their leases end. False if absent."""
        listeners = self._listeners
        if listeners.forget is not None:  # a lower tier's pages of it go too, whatever RAM holds
            listeners.forget(name)
        rec = self._records.get(name)
        if rec is None or not rec.holds_anything:
            return False
        if listeners.touched is not None:
            listeners.touched(name)
        self._evictor.evict_all(name)
        if self._records.get(name) is not rec:  # nothing was pinned: it is retired already
            return True
        if listeners.events is not None:  # KV events: the pages leases keep are gone for lookups
            for tree in rec.trees.values():
                announce_deleted(listeners.events, tree)
        tomb = Tombstone(name)
        rec.deleted = True
        rec.expires_at = None
        self._names.rename(rec, tomb)
        self._leases.rename_scope(name, tomb)
        self._plans.rename(name, tomb)
        return True

    # -- expiry ------------------------------------------------------------------------------------

    def expiry(self, name: bytes) -> int | None:
        rec = self.live(name)
        return None if rec is None else rec.expires_at

    def set_expiry(self, name: bytes, when_ms: int | None) -> bool:
        """Give the namespace an expiry (Unix ms; None: persist). A time already past deletes it now."""
        rec = self.live(name)
        if rec is None:
            return False
        if when_ms is not None and when_ms <= self.now_ms():
            self.expired += 1
            return self.delete(name)
        touched = self._listeners.touched
        if touched is not None and (when_ms is not None or rec.expires_at is not None):
            touched(name)
        rec.expires_at = when_ms
        if when_ms is not None:
            heapq.heappush(self._deadlines, (when_ms, next(self._seq), name))
        return True

    def expire_due(self, limit: int = 1000) -> int:
        """Delete up to ``limit`` namespaces whose expiry has come; O(log n) each. Returns how many."""
        now = self.now_ms()
        done = 0
        heap = self._deadlines
        while heap and heap[0][0] <= now and done < limit:
            when, _, name = heapq.heappop(heap)
            rec = self._records.get(name)
            if rec is not None and rec.expires_at == when:  # not persisted, re-set or recreated since
                self.expired += 1
                self.delete(name)
                done += 1
        return done

    def volatile(self) -> tuple[int, int]:
        """INFO keyspace's ``expires`` and ``avg_ttl``: namespaces with an expiry, their mean TTL in ms."""
        now = self.now_ms()
        left = [rec.expires_at - now for rec in self._records.values()
                if rec.expires_at is not None and not rec.deleted]
        return len(left), (sum(max(0, x) for x in left) // len(left) if left else 0)

    # -- access statistics -----------------------------------------------------------------------

    def touch(self, name: bytes) -> bool:
        rec = self.live(name)
        if rec is None:
            return False
        self.record_access(rec)
        return True

    def record_access(self, rec) -> None:
        """A command used the namespace (a lookup that found it, an insert, TOUCH)."""
        now = self._wallclock()
        if rec.access is None:
            rec.access = Access(now)
        rec.access.record(now, self.log_factor, self.decay_minutes)

    def frequency(self, name: bytes) -> int | None:
        rec = self.live(name)
        if rec is None:
            return None
        if rec.access is None:
            return LFU_INIT
        return rec.access.frequency(self._wallclock(), self.decay_minutes)

    def idle_seconds(self, name: bytes) -> int | None:
        rec = self.live(name)
        if rec is None:
            return None
        return 0 if rec.access is None else rec.access.idle_seconds(self._wallclock())

    def memory(self, name: bytes) -> int | None:
        """MEMORY USAGE: the namespace's blocks plus its metadata, in bytes."""
        rec = self.live(name)
        if rec is None:
            return None
        pages = rec.pages
        nodes = sum(tree.nodes for tree in rec.trees.values())
        return (RECORD_OVERHEAD + len(name) + nodes * NODE_OVERHEAD
                + pages * (self._block_bytes + self._page_bytes + PAGE_OVERHEAD))
