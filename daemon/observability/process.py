"""The daemon process's own figures: resident memory and its peak.

Read by INFO memory and sampled by the server cron; plain code with no
knowledge of the server, so INFO reads these from their owner.
"""

from __future__ import annotations

import os

__all__ = ["ProcessMemory", "process_rss"]

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def process_rss() -> int:
    """Resident set size of this process in bytes (Linux /proc)."""
    try:
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * _PAGE_SIZE
    except OSError:
        return 0


class ProcessMemory:
    """The process's RSS and the highest RSS seen (``used_memory_peak``)."""

    __slots__ = ("peak",)

    def __init__(self) -> None:
        self.peak = 0

    def sample(self) -> int:
        """The RSS now, raising the peak when it is higher."""
        rss = process_rss()
        self.peak = max(self.peak, rss)
        return rss
