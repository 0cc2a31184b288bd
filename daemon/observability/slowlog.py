"""SLOWLOG: the commands that ran for at least ``slowlog-log-slower-than`` microseconds.

Entries have Redis 7's shape: id, Unix time, microseconds, the arguments
(at most 32, the last one then saying how many more there were; each at most
128 bytes, with how many more bytes it had), the client's address and name.
Arguments that carry secrets (AUTH's, HELLO's AUTH pair) are shown as
``(redacted)``, as Redis 7 shows them. Newest first; ``slowlog-max-len`` entries.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

__all__ = ["SlowLog", "redacted", "MAX_ARGS", "MAX_ARG_BYTES"]

MAX_ARGS = 32
MAX_ARG_BYTES = 128
REDACTED = b"(redacted)"


def redacted(argv: list[bytes]) -> list[bytes]:
    """``argv`` with what must not be logged replaced, as Redis 7 redacts it (AUTH, HELLO AUTH)."""
    name = argv[0].lower()
    if name == b"auth":
        return [argv[0], *(REDACTED for _ in argv[1:])]
    if name == b"hello":
        out = list(argv)
        for i in range(2, len(out) - 2):
            if out[i].lower() == b"auth":
                out[i + 1] = out[i + 2] = REDACTED
                break
        return out
    return argv


class SlowLog:
    """The slow log of one server."""

    __slots__ = ("entries", "next_id", "max_len")

    def __init__(self, max_len: int = 128) -> None:
        self.entries: deque[list] = deque()
        self.next_id = 0
        self.max_len = max_len

    def set_max_len(self, max_len: int) -> None:
        """As in Redis, a lower limit trims the log at its next entry, not now."""
        self.max_len = max_len

    def add(self, argv: list[bytes], micros: int, addr: str, name: str) -> None:
        args = redacted(argv)
        shown: list[Any] = []
        for i, arg in enumerate(args):
            if i == MAX_ARGS - 1 and len(args) > MAX_ARGS:
                shown.append(f"... ({len(args) - MAX_ARGS + 1} more arguments)".encode())
                break
            if len(arg) > MAX_ARG_BYTES:
                arg = arg[:MAX_ARG_BYTES] + f"... ({len(arg) - MAX_ARG_BYTES} more bytes)".encode()
            shown.append(bytes(arg))
        self.entries.appendleft([self.next_id, int(time.time()), micros, shown, addr, name])
        self.next_id += 1
        while len(self.entries) > self.max_len:
            self.entries.pop()

    def get(self, count: int) -> list[list]:
        """The ``count`` newest entries (-1: all)."""
        if count < 0 or count >= len(self.entries):
            return list(self.entries)
        return [self.entries[i] for i in range(count)]

    def reset(self) -> None:
        self.entries.clear()
