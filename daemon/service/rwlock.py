"""A fair, cancellation-safe reader-writer lock for trio tasks.

Many readers may hold the lock together; a writer holds it alone. Waiters are
served strictly in arrival order: once a writer queues, readers that arrive
after it wait behind it, so a stream of readers can never starve a writer
(and a queue of writers cannot starve readers either). When the lock is
released, ownership is handed to the head of the queue before the waiter
wakes, so no newcomer can barge in between.

Cancellation: a task cancelled while queued is removed from the queue and
never holds the lock; if its leaving unblocks the tasks behind it (a cancelled
writer with readers queued after it), they are granted at once. A task that
was already granted the lock when the cancellation arrives keeps it and must
release it, exactly as with ``trio.Lock``; the context managers do that.

The hot path: ``async with lock.read()`` takes an uncontended lock (no writer
holding it, nobody queued) without a scheduler checkpoint, as
:meth:`try_acquire_read` does: on the daemon a read hold is taken once per
lookup, and the connection's wait for its socket is its checkpoint already.
The condition is the one that lets a reader in at all, so fairness is the
same: once a writer queues, every later reader queues behind it.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from trio.lowlevel import (
    Abort,
    cancel_shielded_checkpoint,
    checkpoint_if_cancelled,
    current_task,
    reschedule,
    wait_task_rescheduled,
)

_READ = 0
_WRITE = 1


class _Waiter:
    __slots__ = ("task", "kind")

    def __init__(self, task: Any, kind: int) -> None:
        self.task = task
        self.kind = kind


class RWLock:
    """Readers share, writers exclude, everyone waits in arrival order."""

    __slots__ = ("_readers", "_writer", "_queue", "__weakref__")

    def __init__(self) -> None:
        self._readers = 0
        self._writer = False
        self._queue: deque[_Waiter] = deque()

    # -- acquiring -----------------------------------------------------------------

    async def acquire_read(self) -> None:
        """Wait for a shared hold of the lock."""
        await checkpoint_if_cancelled()
        if not self._writer and not self._queue:
            self._readers += 1
            await cancel_shielded_checkpoint()
            return
        await self._wait(_READ)

    def try_acquire_read(self) -> bool:
        """Take a shared hold now if no wait is needed (no writer holds or waits); False otherwise.

        No checkpoint either way. False leaves the lock untouched: the caller
        may then queue with :meth:`acquire_read`.
        """
        if self._writer or self._queue:
            return False
        self._readers += 1
        return True

    def try_acquire_write(self) -> bool:
        """Take the exclusive hold now if it is free (no holder, nobody queued); False otherwise.

        No checkpoint either way, as :meth:`try_acquire_read`: a caller that
        gets False may queue with :meth:`acquire_write`.
        """
        if self._writer or self._readers or self._queue:
            return False
        self._writer = True
        return True

    async def acquire_write(self) -> None:
        """Wait for an exclusive hold of the lock."""
        await checkpoint_if_cancelled()
        if not self._writer and not self._readers and not self._queue:
            self._writer = True
            await cancel_shielded_checkpoint()
            return
        await self._wait(_WRITE)

    async def _wait(self, kind: int) -> None:
        waiter = _Waiter(current_task(), kind)
        self._queue.append(waiter)

        def abort(_raise_cancel: Any) -> Abort:
            # Still queued means not granted: leave the queue, and let the
            # waiters behind us through if we were what held them up.
            self._queue.remove(waiter)
            self._grant()
            return Abort.SUCCEEDED

        await wait_task_rescheduled(abort)

    # -- releasing -----------------------------------------------------------------

    def release_read(self) -> None:
        if self._readers <= 0:
            raise RuntimeError("release_read() without a read hold")
        self._readers -= 1
        self._grant()

    def release_write(self) -> None:
        if not self._writer:
            raise RuntimeError("release_write() without the write hold")
        self._writer = False
        self._grant()

    def _grant(self) -> None:
        """Hand the lock to the head of the queue: one writer, or every leading reader."""
        queue = self._queue
        if self._writer or not queue:
            return
        if queue[0].kind == _WRITE:
            if self._readers == 0:
                self._writer = True
                reschedule(queue.popleft().task)
            return
        while queue and queue[0].kind == _READ:
            self._readers += 1
            reschedule(queue.popleft().task)

    # -- conveniences -----------------------------------------------------------------

    def read(self) -> "_Hold":
        """``async with lock.read():`` — a shared hold for the block."""
        return _Hold(self, _READ)

    def write(self) -> "_Hold":
        """``async with lock.write():`` — an exclusive hold for the block."""
        return _Hold(self, _WRITE)

    def statistics(self) -> dict[str, int]:
        """Current holders and waiters (for INFO and tests)."""
        return {
            "readers": self._readers,
            "writer": int(self._writer),
            "waiting_readers": sum(1 for w in self._queue if w.kind == _READ),
            "waiting_writers": sum(1 for w in self._queue if w.kind == _WRITE),
        }


class _Hold:
    __slots__ = ("_lock", "_kind")

    def __init__(self, lock: RWLock, kind: int) -> None:
        self._lock = lock
        self._kind = kind

    async def __aenter__(self) -> None:
        if self._kind == _READ:
            if not self._lock.try_acquire_read():  # uncontended: no checkpoint (see the module docstring)
                await self._lock.acquire_read()
        else:
            await self._lock.acquire_write()

    async def __aexit__(self, *exc: object) -> None:
        if self._kind == _READ:
            self._lock.release_read()
        else:
            self._lock.release_write()


__all__ = ["RWLock"]
