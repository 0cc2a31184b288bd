"""Server counters shown by INFO stats, commandstats and errorstats.

One instance per server (no module-level counters), reset by
``CONFIG RESETSTAT``.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque

#: Upper bounds (microseconds) of the command latency histogram the metrics endpoint exports;
#: one more bucket counts everything slower (+Inf).
LATENCY_BOUNDS_USEC = (10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000,
                       250_000, 1_000_000)


class CommandStat:
    """Calls, time, failures and latency histogram of one command (``cmdstat_<name>``)."""

    __slots__ = ("calls", "usec", "rejected_calls", "failed_calls", "latency")

    def __init__(self) -> None:
        self.calls = 0
        self.usec = 0
        self.rejected_calls = 0
        self.failed_calls = 0
        self.latency = [0] * (len(LATENCY_BOUNDS_USEC) + 1)  # calls per bucket (not cumulative)

    def observe(self, usec: int) -> None:
        """Count one call that took ``usec`` microseconds."""
        self.calls += 1
        self.usec += usec
        self.latency[bisect_left(LATENCY_BOUNDS_USEC, usec)] += 1

    def info_line(self, name: str) -> str:
        per_call = self.usec / self.calls if self.calls else 0.0
        return (
            f"cmdstat_{name}:calls={self.calls},usec={self.usec},usec_per_call={per_call:.2f},"
            f"rejected_calls={self.rejected_calls},failed_calls={self.failed_calls}"
        )


class Stats:
    """Counters of one server; everything INFO reports that is not derived from state."""

    #: Samples kept for instantaneous_ops_per_sec (one per cron tick), as Redis does.
    SAMPLES = 16

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Zero every counter (``CONFIG RESETSTAT``)."""
        self.total_connections_received = 0
        self.total_commands_processed = 0
        self.rejected_connections = 0
        self.total_net_input_bytes = 0
        self.total_net_output_bytes = 0
        self.total_error_replies = 0
        self.unexpected_error_replies = 0
        self.total_reads_processed = 0
        self.total_writes_processed = 0
        self.client_query_buffer_limit_disconnections = 0
        self.client_output_buffer_limit_disconnections = 0
        self.commands: dict[str, CommandStat] = {}
        self.errors: dict[str, int] = {}
        self._ops_samples: deque[float] = deque(maxlen=self.SAMPLES)
        self._last_sample = (time.monotonic(), 0)

    def command(self, fullname: str) -> CommandStat:
        stat = self.commands.get(fullname)
        if stat is None:
            stat = self.commands[fullname] = CommandStat()
        return stat

    def error(self, code: str) -> None:
        """Count one error reply by its code (``ERR``, ``NOAUTH`` ...)."""
        self.total_error_replies += 1
        self.errors[code] = self.errors.get(code, 0) + 1

    def sample(self) -> None:
        """Take one ops/sec sample; called by the server cron."""
        now = time.monotonic()
        then, ops = self._last_sample
        elapsed = now - then
        if elapsed > 0:
            self._ops_samples.append((self.total_commands_processed - ops) / elapsed)
        self._last_sample = (now, self.total_commands_processed)

    @property
    def instantaneous_ops_per_sec(self) -> int:
        if not self._ops_samples:
            return 0
        return int(sum(self._ops_samples) / len(self._ops_samples))
