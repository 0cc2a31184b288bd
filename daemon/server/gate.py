"""Holding commands back: CLIENT PAUSE, and an EXEC that must run alone.

Commands run on one event loop, so a synchronous handler never interleaves
with another client's. An ``async`` handler (PFXGET, PFXSET: they await shard
locks and copies in worker threads) does: other clients run while it waits.
Two things need to stop that for a while, and both go through this gate:

* ``CLIENT PAUSE <ms> [WRITE|ALL]``: as in Redis, the commands of paused
  clients wait (they are not refused) until the pause ends or ``CLIENT
  UNPAUSE``. WRITE holds back the commands flagged ``write`` or
  ``may_replicate`` (and an EXEC that queued one); ALL holds back every
  command, the pausing client's own included, as redis-server does.
* An ``EXEC`` whose queue holds an async command runs *exclusively*: it closes
  the gate to every other client, waits until the async commands already
  under way (counted in :attr:`CommandGate.running`) have finished, runs its
  queue, then opens the gate. Commands that arrive meanwhile wait at the gate,
  so nothing interleaves with the transaction, before it or inside it.

While the gate is closed for an EXEC the daemon's periodic store work (lease
expiry, namespace expiry, eviction to the low watermark) waits too, as Redis
runs no cron during a command; during a pause namespaces do not expire and
the low-watermark eviction waits, as Redis pauses expiry and eviction.

The hot path pays one attribute test: :attr:`CommandGate.closed`.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

import trio

from pfxcache.daemon.commands.context import PAUSE_ALL, PAUSE_WRITE  # CLIENT PAUSE's kinds

__all__ = ["CommandGate", "PAUSE_ALL", "PAUSE_WRITE"]


class CommandGate:
    """The server's gate; one per server."""

    __slots__ = ("closed", "running", "_holder", "_pause", "_pause_until", "_changed")

    def __init__(self) -> None:
        #: True while a pause or an exclusive EXEC holds (some) commands back.
        self.closed = False
        #: Async commands under way (an exclusive EXEC waits for the others to finish).
        self.running = 0
        self._holder: int | None = None  # the client id running an exclusive EXEC
        self._pause: str | None = None
        self._pause_until = 0.0  # time.monotonic()
        self._changed = trio.Event()

    # -- what dispatch asks ----------------------------------------------------------

    def holds(self, client_id: int, writes: bool) -> bool:
        """Whether a command of ``client_id`` must wait now (``writes``: it is a write)."""
        if self._holder is not None and self._holder != client_id:
            return True
        pause = self.pause_kind()
        return pause == PAUSE_ALL or (pause == PAUSE_WRITE and writes)

    async def wait(self, client_id: int, writes: bool) -> None:
        """Return once a command of ``client_id`` may run."""
        while self.holds(client_id, writes):
            changed = self._changed
            if self._pause is not None and self._holder is None:
                with trio.move_on_at(trio.current_time() + max(0.0, self._pause_until - time.monotonic())):
                    await changed.wait()
            else:
                await changed.wait()

    # -- CLIENT PAUSE / UNPAUSE ----------------------------------------------------------

    def pause(self, kind: str, milliseconds: int) -> None:
        """CLIENT PAUSE: a longer or stronger pause replaces a weaker one, as in Redis."""
        until = time.monotonic() + milliseconds / 1000
        current = self.pause_kind()
        if current == PAUSE_ALL and kind == PAUSE_WRITE:
            kind = PAUSE_ALL  # Redis keeps the more restrictive pause
        if current is not None:
            until = max(until, self._pause_until)
        self._pause, self._pause_until = kind, until
        self._refresh()

    def unpause(self) -> None:
        """CLIENT UNPAUSE (or the pause's end): every held command goes on."""
        self._pause = None
        self._refresh()

    def pause_kind(self) -> str | None:
        """The pause in force (``write``, ``all``) or None; a pause past its end is over."""
        if self._pause is not None and time.monotonic() >= self._pause_until:
            self.unpause()
        return self._pause

    @property
    def paused(self) -> bool:
        return self.pause_kind() is not None

    @property
    def exclusive(self) -> bool:
        """An EXEC runs alone right now."""
        return self._holder is not None

    # -- an exclusive EXEC ----------------------------------------------------------------

    @asynccontextmanager
    async def alone(self, client_id: int, *, counted: bool = True) -> AsyncIterator[None]:
        """Run the body with every other client's commands held back and none under way.

        ``counted``: the caller is itself an async command counted in :attr:`running`.
        """
        own = 1 if counted else 0
        while self._holder is not None:  # another EXEC runs alone: wait, not counted meanwhile
            self.running -= own
            try:
                await self._changed.wait()
            finally:
                self.running += own
        self._holder = client_id
        self._refresh()
        try:
            while self.running > own:
                await self._changed.wait()
            yield
        finally:
            self._holder = None
            self._refresh()

    def finished(self) -> None:
        """An async command has finished (dispatch calls it after decrementing ``running``)."""
        if self._holder is not None:
            self._wake()

    # -- internals ------------------------------------------------------------------------------

    def _refresh(self) -> None:
        self.closed = self._holder is not None or self._pause is not None
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
