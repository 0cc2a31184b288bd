"""MONITOR: every command the server runs, as one line per command, to the clients that asked.

The line is redis-server 7.0's: ``+<unix seconds>.<microseconds> [0 <addr>]``
and each argument quoted as Redis's ``sdscatrepr`` quotes it (``\\"``, ``\\n``,
``\\xHH`` for bytes that are not printable ASCII). As in Redis, a command is
shown after it ran, commands flagged ``admin`` (CONFIG, ACL, MONITOR itself)
or ``skip_monitor`` are never shown, secrets are redacted (AUTH's arguments),
and a transaction's commands are shown as EXEC runs them, before EXEC itself.
A monitor's lines go through the connection's out-of-band writer (the one
pub/sub messages use), so they never interleave with its replies.
"""

from __future__ import annotations

import time
from typing import Any

from pfxcache.daemon.observability.slowlog import redacted

__all__ = ["Monitors", "monitor_line", "quote"]

_ESCAPES = {0x5C: b"\\\\", 0x22: b'\\"', 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t", 0x07: b"\\a", 0x08: b"\\b"}
_QUOTED = [(_ESCAPES.get(byte) or (bytes([byte]) if 0x20 <= byte <= 0x7E else b"\\x%02x" % byte))
           for byte in range(256)]


def quote(arg: bytes) -> bytes:
    """``arg`` in double quotes, escaped as Redis's sdscatrepr escapes it."""
    if arg.isascii() and arg.isalnum():
        return b'"' + arg + b'"'
    return b'"' + b"".join(_QUOTED[byte] for byte in arg) + b'"'


def monitor_line(now: float, client: Any, argv: list[bytes]) -> bytes:
    seconds = int(now)
    micros = int((now - seconds) * 1_000_000)
    addr = f"unix:{client.laddr}" if client.is_unix else client.addr
    args = b" ".join(quote(arg) for arg in redacted(argv))
    return b"+%d.%06d [0 %s] %s\r\n" % (seconds, micros, addr.encode(), args)


class Monitors:
    """The clients in MONITOR mode, each with its push queue."""

    __slots__ = ("_queues", "_changed")

    def __init__(self, changed: Any = lambda: None) -> None:
        self._queues: dict[int, Any] = {}
        self._changed = changed  # told when the first monitor comes or the last one goes

    def __bool__(self) -> bool:
        return bool(self._queues)

    def __len__(self) -> int:
        return len(self._queues)

    def add(self, client_id: int, queue: Any) -> None:
        self._queues[client_id] = queue
        self._changed()

    def remove(self, client_id: int) -> None:
        if self._queues.pop(client_id, None) is not None:
            self._changed()

    def __contains__(self, client_id: int) -> bool:
        return client_id in self._queues

    def feed(self, client: Any, spec: Any, argv: list[bytes]) -> None:
        """Show a command that ran (unless Redis would not show it)."""
        flags = spec.flags
        if "admin" in flags or "skip_monitor" in flags:
            return
        line = monitor_line(time.time(), client, argv)
        for queue in list(self._queues.values()):
            queue.push(line)
