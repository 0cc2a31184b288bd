"""PFXCHECK without stalling: the store's invariants checked in a forked copy of the daemon.

A check reads every page, lease and tree node in Python, and every block's
state in C-speed passes over the state array; the invariants hold only between
two operations, so the check cannot be cut into slices with the loop serving in
between. :func:`checks_inline` decides: a store small in *both* (pages and
leases, and blocks: a large arena with few pages cached is still a long pass)
is checked on the loop, at once. Any other runs the way Redis's BGSAVE writes a
snapshot: ``fork()`` on the loop, between two operations, gives a child an
exact copy-on-write image of the store at that instant; the child checks it,
writes the violations to a pipe and exits; the loop keeps serving meanwhile and
only awaits the pipe. The parent's stall is the fork itself (page tables),
reported as Redis's ``fork`` latency event. The child touches nothing but the
store's Python objects (not the arena, not a socket) and leaves with
``os._exit``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, Callable

import trio

__all__ = ["INLINE_BLOCKS", "INLINE_PAGES", "CheckFailed", "check_in_child", "checks_inline"]

#: A store with at most this many pages and leases (the Python part of a check) ...
INLINE_PAGES = 20_000
#: ... and at most this many blocks (the C-speed passes over their states) is checked on the loop.
INLINE_BLOCKS = 1 << 20


class CheckFailed(Exception):
    """The child did not deliver a result (it crashed, or ran past the deadline)."""


def checks_inline(stats: dict) -> bool:
    """Whether a store with these ``stats()`` is checked on the loop rather than in a child."""
    return stats["pages"] + stats["leases"] <= INLINE_PAGES and stats["blocks_total"] <= INLINE_BLOCKS


async def check_in_child(store: Any, *, timeout: float, on_fork: Callable[[float], None]) -> list[str]:
    """``store.check()`` run in a forked child; ``on_fork`` is told how many ms the fork took."""
    read_fd, write_fd = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: check, report, leave without running any of the parent's cleanup
        code = 1
        try:
            os.close(read_fd)
            view = memoryview(json.dumps(store.check()).encode())
            while view:
                view = view[os.write(write_fd, view):]
            code = 0
        finally:
            os._exit(code)
    on_fork((time.perf_counter() - start) * 1000)
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    chunks: list[bytes] = []
    finished = False
    try:
        with trio.move_on_after(timeout):
            while True:
                await trio.lowlevel.wait_readable(read_fd)
                try:
                    data = os.read(read_fd, 1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    break
                chunks.append(data)
            finished = True
    finally:
        trio.lowlevel.notify_closing(read_fd)
        os.close(read_fd)
        status = await _reap(pid, kill=not finished)  # a cancelled PFXCHECK kills its child too
    if not finished:
        raise CheckFailed(f"the check did not finish within {timeout:g} s")
    if status != 0 or not chunks:
        raise CheckFailed("the check process failed")
    return json.loads(b"".join(chunks))


async def _reap(pid: int, *, kill: bool) -> int:
    """Wait for the child (killing it first if asked); its exit status."""
    if kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    with trio.CancelScope(shield=True):
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            await trio.sleep(0.001)
