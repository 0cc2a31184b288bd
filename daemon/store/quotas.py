"""Per-tenant quotas: what the namespaces matching one pattern may hold together.

A rule is ``(pattern, max_pages, max_leased, max_leases)`` (0: no limit on that one):

* ``max_pages``: cached pages. An insert past it evicts the group's own pages (by policy,
  the inserting namespace first), never another tenant's; when the group has nothing
  evictable left the insert is refused with ``-OOM``.
* ``max_leased``: blocks under lease: fresh blocks of PFXALLOC plus the pages each
  lookup lease pins (a page pinned by two leases counts twice: a tenant pays for its leases).
* ``max_leases``: leases held at once.

Like LMCache's per-salt quotas and Mooncake's tenant quotas, the unit is the keyspace a
tenant's ACL user is confined to (``~tenant-a:*``): give the rule the same pattern. A
namespace belongs to the first rule whose pattern matches it, or to none. The store keeps
one :class:`Quota` (limits and counters) per rule; the counters move with the store's
own bookkeeping, O(1) per operation, and nothing here is looked at when there are no rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from .errors import OutOfMemory

if TYPE_CHECKING:
    from .evictions import Evictor
    from .inserts import PlansInFlight
    from .leases import LeaseTable
    from .namespaces import Namespaces


class Quota:
    """One rule's limits and what its namespaces hold now."""

    __slots__ = ("leased", "leases", "max_leased", "max_leases", "max_pages", "pages", "pattern")

    def __init__(self, pattern: bytes, max_pages: int, max_leased: int, max_leases: int) -> None:
        self.pattern = pattern
        self.max_pages = max_pages
        self.max_leased = max_leased
        self.max_leases = max_leases
        self.pages = 0  # cached pages, plus the new pages of inserts in flight
        self.leased = 0  # blocks of allocation leases plus pages pinned by lookup leases
        self.leases = 0

    def _refuse(self, what: str, have: int, limit: int, more: int) -> OutOfMemory:
        name = self.pattern.decode("utf-8", "replace")
        return OutOfMemory(f"tenant quota of '{name}': {have} {what} held, {more} more would pass its {limit}")

    def check_lease(self, blocks: int) -> None:
        """Refuse (OutOfMemory) one more lease of ``blocks`` blocks past the limits."""
        if self.max_leases and self.leases + 1 > self.max_leases:
            raise self._refuse("leases", self.leases, self.max_leases, 1)
        if self.max_leased and self.leased + blocks > self.max_leased:
            raise self._refuse("leased blocks", self.leased, self.max_leased, blocks)

    def pages_over(self, more: int) -> int:
        """How many of the group's pages must go before ``more`` new ones fit (0: they fit)."""
        if not self.max_pages:
            return 0
        return max(0, self.pages + more - self.max_pages)

    def refuse_pages(self, more: int) -> OutOfMemory:
        return self._refuse("cached pages", self.pages, self.max_pages, more)

    def describe(self) -> dict:
        return {"pattern": self.pattern, "max-pages": self.max_pages, "pages": self.pages,
                "max-leased": self.max_leased, "leased": self.leased, "max-leases": self.max_leases,
                "leases": self.leases}


class QuotaBook:
    """The rules in force, and which rule a namespace falls under."""

    def __init__(self, rules: Iterable[tuple[bytes, int, int, int]] = (),
                 match: Callable[[bytes, bytes], bool] | None = None) -> None:
        self.quotas = [Quota(*rule) for rule in rules]
        # The daemon passes Redis's glob (stringmatchlen) so that a rule reads like the ACL key
        # pattern it mirrors; the store alone (no protocol import here) uses fnmatch.
        self._match = match or (lambda pattern, name: fnmatchcase(name, pattern))

    def __bool__(self) -> bool:
        return bool(self.quotas)

    def of(self, name: bytes) -> Quota | None:
        """The quota of namespace ``name``: the first rule whose pattern matches it, or None."""
        for quota in self.quotas:
            if self._match(quota.pattern, name):
                return quota
        return None


class TenantQuotas:
    """The store's side of the quotas: putting new rules in force and making room within a tenant's
    own pages. Which rule a namespace falls under is filed on its record when the record is made
    (namespaces.py); the counters move with the store's own bookkeeping."""

    def __init__(self, *, namespaces: Namespaces, plans: PlansInFlight, leases: LeaseTable, evictor: Evictor) -> None:
        self._names = namespaces
        self._records = namespaces.records
        self._plans = plans
        self._leases = leases
        self._evictor = evictor

    def set(self, quotas: QuotaBook) -> None:
        """Put new tenant rules in force (CONFIG SET tenant-quota): every namespace is matched again
        and the counters recounted from what is held now. O(namespaces + leases). What a tenant
        already holds past a lowered limit stays; its next insert or lease is held to the limit."""
        self._names.quotas = quotas
        for rec in self._records.values():
            rec.quota = quotas.of(rec.name) if quotas else None
            if rec.quota is not None:
                rec.quota.pages += rec.pages
        for plan in self._plans.values():
            rec = self._records.get(plan.ns)
            if rec is not None and rec.quota is not None:
                rec.quota.pages += len(plan.new_blocks)
        for lease in self._leases:
            quota = self._records[lease.scope].quota
            if quota is not None:
                quota.leases += 1
                quota.leased += len(lease.blocks)

    def evictable(self, quota: Quota) -> int:
        """Unpinned pages of the namespaces under ``quota``. O(namespaces)."""
        return sum(rec.pages - rec.pinned for rec in self._records.values() if rec.quota is quota)

    def make_room(self, quota: Quota, name: bytes, over: int) -> None:
        """Evict ``over`` of the group's own pages by policy, ``name``'s first (the caller checked
        that they are evictable)."""
        group = [rec for rec in self._records.values() if rec.quota is quota]
        for rec in sorted(group, key=lambda r: r.name != name):
            if over <= 0:
                break
            over -= self._evictor.evict(over, rec.name, "quota")
