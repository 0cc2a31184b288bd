"""LATENCY: events that took at least ``latency-monitor-threshold`` milliseconds.

As Redis's latency monitor: each event class keeps its last 160 samples (one
per second at most: a second sample in the same second keeps the larger
latency) and its all-time maximum. The classes recorded here are Redis's
``command`` and ``fast-command`` (a command's run, by its ``fast`` flag),
``expire-cycle`` and ``eviction-cycle`` (the cron's namespace expiry and
low-watermark eviction), ``fork`` (the fork of a PFXCHECK that checks a copy
of the store), and pfxcache's own ``arena-copy`` (a DATA or WITHDATA copy
between a request and the arena). ``LATENCY DOCTOR`` is Redis's report, with
its texts.
"""

from __future__ import annotations

import time

__all__ = ["LatencyMonitor", "TS_LEN"]

TS_LEN = 160


class Series:
    __slots__ = ("samples", "max")

    def __init__(self) -> None:
        self.samples: list[list[int]] = []  # [unix seconds, ms], oldest first
        self.max = 0

    def add(self, now: int, ms: int) -> None:
        if self.samples and self.samples[-1][0] == now:
            self.samples[-1][1] = max(self.samples[-1][1], ms)
        else:
            self.samples.append([now, ms])
            if len(self.samples) > TS_LEN:
                del self.samples[0]
        self.max = max(self.max, ms)


class LatencyMonitor:
    """The latency events of one server, in the order they first happened."""

    __slots__ = ("events", "threshold_ms")

    def __init__(self, threshold_ms: int = 0) -> None:
        self.events: dict[str, Series] = {}
        self.threshold_ms = threshold_ms

    def add_if_needed(self, event: str, ms: float) -> None:
        """Record ``ms`` for ``event`` if the monitor is on and it reaches the threshold."""
        if self.threshold_ms and ms >= self.threshold_ms:
            self.events.setdefault(event, Series()).add(int(time.time()), int(ms))

    def latest(self) -> list[list]:
        return [[name, s.samples[-1][0], s.samples[-1][1], s.max] for name, s in self.events.items()]

    def history(self, event: str) -> list[list[int]]:
        series = self.events.get(event)
        return [list(sample) for sample in series.samples] if series is not None else []

    def reset(self, names: list[str] | None = None) -> int:
        if not names:
            count = len(self.events)
            self.events.clear()
            return count
        count = 0
        for name in names:
            if self.events.pop(name, None) is not None:
                count += 1
        return count

    # -- LATENCY DOCTOR --------------------------------------------------------------------

    def doctor(self, slowlog_slower_than_us: int, hz: int) -> str:
        """Redis's ``createLatencyReport`` for the classes recorded here."""
        if not self.events and not self.threshold_ms:
            return ("I'm sorry, Dave, I can't do that. Latency monitoring is disabled in this Redis instance. "
                    "You may use \"CONFIG SET latency-monitor-threshold <milliseconds>.\" in order to enable it. "
                    "If we weren't in a deep space mission I'd suggest to take a look at "
                    "https://redis.io/topics/latency-monitor.\n")
        report = []
        advise = set()
        now = int(time.time())
        for number, (name, series) in enumerate(self.events.items(), 1):
            if number == 1:
                report.append("Dave, I have observed latency spikes in this Redis instance. "
                              "You don't mind talking about it, do you Dave?\n\n")
            values = [ms for _, ms in series.samples]
            samples = len(values)
            avg = sum(values) // samples
            period = max(1, now - min(t for t, _ in series.samples))
            mad = sum(abs(avg - v) for v in values) // samples
            report.append(f"{number}. {name}: {samples} latency spikes (average {avg}ms, mean deviation "
                          f"{mad}ms, period {period / samples:.2f} sec). Worst all time event {series.max}ms.\n")
            if name == "command":
                if slowlog_slower_than_us < 0:
                    advise.add("slowlog-enable")
                elif slowlog_slower_than_us // 1000 > self.threshold_ms:
                    advise.add("slowlog-tune")
                advise.update(("slowlog-inspect", "large-objects"))
            elif name == "fast-command":
                advise.add("scheduler")
            elif name == "expire-cycle":
                advise.update(("hz", "large-objects"))
            elif name in ("eviction-cycle", "arena-copy"):
                advise.add("large-objects")
        if not self.events:
            report.append("Dave, no latency spike was observed during the lifetime of this Redis instance, not "
                          "in the slightest bit. I honestly think you ought to sit down calmly, take a stress pill, and "
                          "think things over.\n")
            return "".join(report)
        report.append("\nI have a few advices for you:\n\n")
        threshold_us = self.threshold_ms * 1000
        if "slowlog-enable" in advise:
            report.append("- There are latency issues with potentially slow commands you are using. Try to enable "
                          "the Slow Log Redis feature using the command 'CONFIG SET slowlog-log-slower-than "
                          f"{threshold_us}'. If the Slow log is disabled Redis is not able to log slow commands "
                          "execution for you.\n")
        if "slowlog-tune" in advise:
            report.append("- Your current Slow Log configuration only logs events that are slower than your "
                          "configured latency monitor threshold. Please use 'CONFIG SET slowlog-log-slower-than "
                          f"{threshold_us}'.\n")
        if "slowlog-inspect" in advise:
            report.append("- Check your Slow Log to understand what are the commands you are running which are "
                          "too slow to execute. Please check https://redis.io/commands/slowlog for more "
                          "information.\n")
        if "scheduler" in advise:
            report.append("- The system is slow to execute Redis code paths not containing system calls. This "
                          "usually means the system does not provide Redis CPU time to run for long periods. You "
                          "should try to:\n  1) Lower the system load.\n  2) Use a computer / VM just for Redis if "
                          "you are running other software in the same system.\n  3) Check if you have a \"noisy "
                          "neighbour\" problem.\n  4) Check with 'redis-cli --intrinsic-latency 100' what is the "
                          "intrinsic latency in your system.\n  5) Check if the problem is allocator-related by "
                          "recompiling Redis with MALLOC=libc, if you are using Jemalloc. However this may create "
                          "fragmentation problems.\n")
        if "hz" in advise and hz < 100:
            report.append("- In order to make the Redis keys expiring process more incremental, try to set the "
                          "'hz' configuration parameter to 100 using 'CONFIG SET hz 100'.\n")
        if "large-objects" in advise:
            report.append("- Deleting, expiring or evicting (because of maxmemory policy) large objects is a "
                          "blocking operation. If you have very large objects that are often deleted, expired, or "
                          "evicted, try to fragment those objects into multiple smaller objects.\n")
        return "".join(report)
