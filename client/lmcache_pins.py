"""The leases of LMCache lookups, and which chunk each pins: what ``batched_contains`` reports, a get reads.

Rules:

* A lookup (``PFXGET ... HASHES`` under a lease) pins the leading run of its chunks; each chunk then
  points to that lease and the block holding it. A newer lookup of a chunk takes its pin over, and a
  lease no pin points to any more ends at the next lookup or get.
* A pin is trusted until its lease's deadline less :data:`LEASE_MARGIN_S`, measured from when the
  lookup was sent; an untrusted pin is read afresh.
* A lease ends when a get read every chunk it pins (or the get says it is the last), when its deadline
  passed, when nothing pins through it, or when more than :data:`MAX_LEASES` newer ones are held; a get
  that reads only part of its chunks renews it.
* The release count says whether a lease held until it ended: copies made under one that had already
  ended are not to be trusted (the daemon may have handed its blocks to someone else).

The table does no locking: its owner (the connector) holds its connection's lock around every call.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

LEASE_MARGIN_S = 1.0  # a pin is read only this long before its lease could end
MAX_LEASES = 1024  # lookups' leases held at once; past it the oldest end


class Lease:
    """One lookup's lease: the Match holding it, the chunks it pins, and what gets have not read yet."""

    __slots__ = ("held", "match", "namespace", "pages", "unread", "valid_until")

    def __init__(self, match: Any, namespace: str, pages: list[bytes], valid_until: float) -> None:
        self.match = match  # kept alive: a collected Match would end its lease behind our back
        self.namespace = namespace
        self.pages = pages
        self.unread = set(pages)
        self.held = len(pages)  # pins still pointing here (a newer lookup of a chunk takes its pin over)
        self.valid_until = valid_until


class LookupPins:
    """The leases held for lookups and the chunk -> (lease, block) pins (see the module docstring).

    ``ttl_s``: how long a lease lasts, in seconds, asked when one is taken or renewed.
    """

    def __init__(self, ttl_s: Callable[[], float]) -> None:
        self._ttl_s = ttl_s
        self._leases: OrderedDict[int, Lease] = OrderedDict()
        self._pins: dict[tuple[str, bytes], tuple[Lease, int]] = {}  # (namespace, key) -> lease, block

    def clear(self) -> None:
        """The connection is closed: its leases, and so the pins, are gone."""
        self._leases.clear()
        self._pins.clear()

    def pinned(self, namespace: str, page: bytes) -> tuple[Lease, int] | None:
        """The live lease and block pinning a chunk, or None."""
        pin = self._pins.get((namespace, page))
        if pin is None or time.monotonic() > pin[0].valid_until or pin[0].match.lease not in self._leases:
            return None
        return pin

    def leases_of(self, namespace: str, pages: Iterable[bytes], *, expired_only: bool) -> list[Lease]:
        """The leases pinning any of ``pages`` (only those past their time with ``expired_only``)."""
        now = time.monotonic()
        found: dict[int, Lease] = {}
        for page in pages:
            pin = self._pins.get((namespace, page))
            if pin is not None and (not expired_only or now > pin[0].valid_until):
                found[id(pin[0])] = pin[0]
        return list(found.values())

    def forget(self, leases: Iterable[Lease]) -> list[Any]:
        """Take leases and their pins off the table; their Matches, for one PFXRELEASE."""
        matches = []
        for lease in leases:
            if self._leases.pop(lease.match.lease, None) is not None:
                matches.append(lease.match)
            for page in lease.pages:
                if self._pins.get((lease.namespace, page), (None,))[0] is lease:
                    del self._pins[(lease.namespace, page)]
        return matches

    def forget_all(self) -> list[Any]:
        """Every lease off the table; their Matches."""
        return self.forget(list(self._leases.values()))

    def stale(self) -> list[Lease]:
        """Leases to end now: past their time, read through, superseded by newer lookups, or past MAX_LEASES."""
        now = time.monotonic()
        old: list[Lease] = []
        keep: list[Lease] = []
        for lease in self._leases.values():
            (keep if now <= lease.valid_until and lease.unread and lease.held else old).append(lease)
        return old + keep[:max(0, len(keep) - MAX_LEASES)]

    def record(self, match: Any, namespace: str, pages: list[bytes], sent: float) -> None:
        """A lookup sent at ``sent`` pinned ``pages`` (its leading run) under ``match``'s lease."""
        lease = Lease(match, namespace, pages, sent + self._ttl_s() - LEASE_MARGIN_S)
        self._leases[match.lease] = lease
        for page, block in zip(lease.pages, match.blocks):
            older = self._pins.get((namespace, page))
            if older is not None:
                older[0].held -= 1  # ended by the next lookup once no pin points to it
            self._pins[(namespace, page)] = (lease, block)

    def settle(self, cache: Any, read_from: list[Lease], others: list[Lease], read: list[bytes], finish: bool,
               ttl_ms: int | None) -> bool:
        """After reading ``read`` under ``read_from``: end those leases (``finish``, or nothing left unread),
        else renew them (for ``ttl_ms``); end ``others`` (apart: an expired one counts 0). False when a lease
        read from had already ended: bytes copied from its blocks are not to be trusted."""
        ending, renewing = [], []
        for lease in read_from:
            lease.unread.difference_update(read)
            (ending if finish or not lease.unread else renewing).append(lease)
        matches = self.forget(ending)
        alive = not matches or cache.release(*matches) == len(matches)
        for lease in renewing:
            sent = time.monotonic()
            if cache.renew(lease.match, ttl_ms):
                lease.valid_until = sent + self._ttl_s() - LEASE_MARGIN_S
            else:
                alive = False
                self.forget([lease])
        rest = self.forget(others)
        if rest:
            cache.release(*rest)
        return alive
