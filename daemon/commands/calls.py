"""One resolved command run: the handler call and what every call records.

A handler runs through :func:`call` (synchronous) or :func:`call_async`, here
rather than in dispatch, so that both dispatch and EXEC (which runs its queue
command by command) reach them from below: dispatch decides *whether* and
*when* a command runs, this module runs it. Every call is accounted the same
way: its command's calls, microseconds and latency bucket, SLOWLOG and MONITOR
through the observers, and its error code when the reply is an error. A
handler that raises costs one ``-ERR`` reply, never the daemon; the traceback
goes to the log.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from typing import Any

from pfxcache.protocol.replies import Error

from pfxcache.daemon.commands.context import Context
from pfxcache.daemon.commands.spec import CommandSpec
from pfxcache.daemon.observability.stats import LATENCY_BOUNDS_USEC, Stats

__all__ = ["account", "call", "call_async", "internal_error", "log_denial", "now", "record_error"]

log = logging.getLogger("pfxcached")
now = time.perf_counter_ns


def call(ctx: Context, spec: CommandSpec, argv: list[bytes]) -> Any:
    """Run a synchronous handler with its accounting (EXEC runs its queue through here)."""
    start = now()
    try:
        reply = spec.handler(ctx, argv)
    except Exception as exc:  # a bug must cost one reply, not the daemon
        reply = internal_error(spec, exc)
    account(ctx, spec, argv, reply, start)
    return reply


async def call_async(ctx: Context, spec: CommandSpec, argv: list[bytes]) -> Any:
    """Await an async handler with its accounting; it counts as running for the gate meanwhile."""
    gate = ctx.server.gate
    gate.running += 1
    start = now()
    try:
        reply = await spec.handler(ctx, argv)
    except Exception as exc:
        reply = internal_error(spec, exc)
    finally:
        gate.running -= 1
        gate.finished()
    account(ctx, spec, argv, reply, start)
    return reply


def internal_error(spec: CommandSpec, exc: Exception) -> Error:
    """The reply to a handler that raised (the traceback goes to the log)."""
    log.exception("internal error in command '%s'", spec.fullname)
    return Error(f"ERR internal error in '{spec.fullname}': {type(exc).__name__}")


def record_error(stats: Stats, reply: Error) -> None:
    """Count an error reply under its code (``errorstat_ERR`` ...)."""
    stats.error(reply.message.split(" ", 1)[0])


def account(ctx: Context, spec: CommandSpec, argv: list[bytes], reply: Any, start: int) -> None:
    """Record a finished call that started at ``start`` (:func:`now`)."""
    server = ctx.server
    stats = server.stats
    micros = (now() - start) // 1000
    stat = stats.commands.get(spec.fullname) or stats.command(spec.fullname)
    # CommandStat.observe, inlined (once per command)
    stat.calls += 1
    stat.usec += micros
    stat.latency[bisect_left(LATENCY_BOUNDS_USEC, micros)] += 1
    observers = server.observers
    if micros >= observers.watch_us:  # 0 while someone MONITORs
        observers.ran(ctx.client, spec, argv, micros)
    stats.total_commands_processed += 1
    if reply.__class__ is Error:
        stat.failed_calls += 1
        record_error(stats, reply)


def log_denial(ctx: Context, reason: str, obj: str, username: str | None = None) -> None:
    """An ACL LOG entry for a refusal (``reason``: command, key or auth) of this client."""
    client = ctx.client
    ctx.server.observers.acl_log.add(reason, "multi" if client.multi is not None else "toplevel", obj,
                                     client.user if username is None else username, client.describe().rstrip())
