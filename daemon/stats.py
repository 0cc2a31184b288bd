"""Server counters shown by INFO stats, commandstats and errorstats.

One instance per server (no module-level counters), reset by
``CONFIG RESETSTAT``.
"""

from __future__ import annotations

import time
from collections import deque


class CommandStat:
    """Calls, time and failures of one command (``cmdstat_<name>``)."""

    __slots__ = ("calls", "usec", "rejected_calls", "failed_calls")

    def __init__(self) -> None:
        self.calls = 0
        self.usec = 0
        self.rejected_calls = 0
        self.failed_calls = 0

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
