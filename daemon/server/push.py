"""Out-of-band frames for one connection (pub/sub messages), written by their own task.

A connection task only wakes when its socket is readable, so frames that
other tasks produce for it (a PUBLISH on another connection, a store event)
are queued here and written by a small writer task that lives as long as the
connection. The connection's replies and these frames never interleave on
the wire: both writers hold ``lock`` for each write (trio's lock is fair, so
a reply already waiting goes before frames queued after it).

Limits are Redis's ``client-output-buffer-limit pubsub <hard> <soft>
<seconds>``: a subscriber that does not read is disconnected once its queued
frames exceed the hard limit, or stay above the soft limit for the seconds.
``push`` never awaits and never blocks the caller.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import trio

log = logging.getLogger("pfxcached")

PUBSUB_CLASS = 2  # index of the pubsub class in client-output-buffer-limit


class PushQueue:
    """Frames waiting for one connection's writer task."""

    def __init__(self, server: Any, client: Any, send: Callable) -> None:
        self.server = server
        self.client = client
        self._send = send  # async (chunks) -> bytes written, the connection's own writer
        self.lock = trio.Lock()
        self._frames: list[bytes] = []
        self.pending_bytes = 0
        self._soft_since: float | None = None
        self._wakeup = trio.Event()
        self.closed = False

    def push(self, frame: bytes) -> None:
        """Queue one encoded frame (from any task on the loop)."""
        if self.closed:
            return
        self._frames.append(frame)
        self.pending_bytes += len(frame)
        hard, soft, seconds = self.server.config["client-output-buffer-limit"][PUBSUB_CLASS]
        if hard and self.pending_bytes > hard:
            self._over_limit()
            return
        if soft and self.pending_bytes > soft:
            now = time.monotonic()
            if self._soft_since is None:
                self._soft_since = now
            elif now - self._soft_since > seconds:
                self._over_limit()
                return
        else:
            self._soft_since = None
        self._wakeup.set()

    def _over_limit(self) -> None:
        client = self.client
        self.server.stats.client_output_buffer_limit_disconnections += 1
        log.warning("Client id=%d addr=%s closed for overcoming of output buffer limits (pubsub, %d bytes "
                    "of messages unsent).", client.id, client.addr, self.pending_bytes)
        self.close()
        client.kill()

    def close(self) -> None:
        """The connection is ending: drop what is queued and let the writer return."""
        self.closed = True
        self._frames.clear()
        self.pending_bytes = 0
        self._wakeup.set()

    async def run(self) -> None:
        """The writer task: write queued frames until closed (an OSError ends it: the peer is gone)."""
        while not self.closed:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            while self._frames and not self.closed:
                async with self.lock:
                    frames, self._frames = self._frames, []
                    if self.closed:
                        return
                    try:
                        await self._send([b"".join(frames)])
                    except (OSError, trio.ClosedResourceError):
                        self.close()
                        return
                    self.pending_bytes -= sum(len(f) for f in frames)
                    if self.pending_bytes <= 0:
                        self.pending_bytes = 0
                        self._soft_since = None
