"""What watches the commands run: MONITOR, SLOWLOG, LATENCY, and the ACL LOG of refusals.

One :class:`CommandObservers` per server, fed by dispatch after every call
(:meth:`CommandObservers.ran`). The hot path pays one comparison: a command
is looked at further only when it ran for at least :attr:`watch_us`, the
lowest of ``slowlog-log-slower-than`` and ``latency-monitor-threshold``, or 0
while a client is in MONITOR mode.
"""

from __future__ import annotations

from typing import Any

from pfxcache.daemon.security.acl_log import AclLog
from pfxcache.daemon.observability.latency import LatencyMonitor
from pfxcache.daemon.observability.monitor import Monitors
from pfxcache.daemon.observability.slowlog import SlowLog

__all__ = ["CommandObservers"]

NEVER = float("inf")


class CommandObservers:
    def __init__(self, config: Any) -> None:
        self.config = config
        self.slowlog = SlowLog(config["slowlog-max-len"])
        self.latency = LatencyMonitor(config["latency-monitor-threshold"])
        self._slower_than = config["slowlog-log-slower-than"]
        self.monitors = Monitors(self._refresh)
        self.acl_log = AclLog(config["acllog-max-len"])
        #: Microseconds from which a command is looked at (slow log or latency event).
        self.watch_us: float = NEVER
        config.on_change("slowlog-log-slower-than", lambda _old, new: self._set_slower_than(new))
        config.on_change("slowlog-max-len", lambda _old, new: self.slowlog.set_max_len(new))
        config.on_change("latency-monitor-threshold", lambda _old, new: self._set_latency_threshold(new))
        config.on_change("acllog-max-len", lambda _old, new: self._set_acllog_max_len(new))
        self._refresh()

    def _set_slower_than(self, value: int) -> None:
        self._slower_than = value
        self._refresh()

    def _set_latency_threshold(self, value: int) -> None:
        self.latency.threshold_ms = value
        self._refresh()

    def _set_acllog_max_len(self, value: int) -> None:
        self.acl_log.max_len = value  # trimmed at the next entry, as Redis trims it

    def _refresh(self) -> None:
        slow = self._slower_than if self._slower_than >= 0 else NEVER
        latency = self.latency.threshold_ms * 1000 if self.latency.threshold_ms > 0 else NEVER
        self.watch_us = 0 if self.monitors else min(slow, latency)

    @property
    def slower_than(self) -> int:
        return self._slower_than

    def ran(self, client: Any, spec: Any, argv: list[bytes], micros: int) -> None:
        """A command ran for ``micros`` microseconds (dispatch calls this only when it may matter)."""
        if self.monitors:
            self.monitors.feed(client, spec, argv)
        if micros < self.watch_us:
            return
        if 0 <= self._slower_than <= micros and "skip_slowlog" not in spec.flags:
            self.slowlog.add(argv, micros, client.addr, client.name)
        self.latency.add_if_needed("fast-command" if "fast" in spec.flags else "command", micros / 1000)

    def event(self, name: str, milliseconds: float) -> None:
        """A non-command latency event (an expiry or eviction cycle, an arena copy, a PFXCHECK slice)."""
        self.latency.add_if_needed(name, milliseconds)
