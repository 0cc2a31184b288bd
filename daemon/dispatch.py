"""From a parsed request to a reply: lookup, access checks, the call, its stats.

Everything here derives from the command table: the row found for ``argv``
decides the arity error, whether the command may run before AUTH, and which
handler runs. Handlers that raise never take the daemon down: the client gets
an ``-ERR`` and the traceback goes to the log.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pfxcache.protocol.replies import Error

from .commands.context import Context
from .commands.spec import CommandSpec
from .stats import Stats
from .pubsub import SUBSCRIBED_COMMANDS, subscribed_error

log = logging.getLogger("pfxcached")

NOAUTH = Error("NOAUTH Authentication required.")
_now = time.perf_counter_ns


class Pending:
    """A resolved call to an ``async`` handler, for the connection to await."""

    __slots__ = ("spec", "argv")

    def __init__(self, spec: CommandSpec, argv: list[bytes]) -> None:
        self.spec = spec
        self.argv = argv


def _record_error(stats: Stats, reply: Error) -> None:
    stats.error(reply.message.split(" ", 1)[0])


def execute(ctx: Context, argv: list[bytes]) -> Any:
    """Run ``argv`` and return its reply, or a :class:`Pending` for an async handler."""
    server = ctx.server
    stats = server.stats
    spec = server.commands.resolve(argv)
    if spec.__class__ is Error:
        _record_error(stats, spec)
        # Redis counts a rejected call only for a command it found (an arity error).
        known = server.commands.lookup(argv)
        if known is not None and not known.arity_ok(len(argv)):
            stats.command(known.fullname).rejected_calls += 1
        return spec
    client = ctx.client
    if not client.authenticated and server.auth_required and "no_auth" not in spec.flags:
        stats.command(spec.fullname).rejected_calls += 1
        _record_error(stats, NOAUTH)
        return NOAUTH
    if server.acl.restricted:
        denied = server.acl.check(client.user, spec, argv)
        if denied is not None:
            stats.command(spec.fullname).rejected_calls += 1
            reply = Error(denied)
            _record_error(stats, reply)
            return reply
    if client.pubsub is not None and client.resp == 2 and client.subscribed \
            and spec.fullname not in SUBSCRIBED_COMMANDS:
        reply = Error(subscribed_error(spec.fullname))
        _record_error(stats, reply)
        return reply
    client.last_command = spec.fullname
    if spec.is_async:
        return Pending(spec, argv)
    start = _now()
    try:
        reply = spec.handler(ctx, argv)
    except Exception as exc:  # a bug must cost one reply, not the daemon
        reply = _internal_error(spec, exc)
    _account(stats, spec, reply, start)
    return reply


async def execute_pending(ctx: Context, pending: Pending) -> Any:
    """Await an async handler resolved by :func:`execute`."""
    start = _now()
    try:
        reply = await pending.spec.handler(ctx, pending.argv)
    except Exception as exc:
        reply = _internal_error(pending.spec, exc)
    _account(ctx.server.stats, pending.spec, reply, start)
    return reply


def _internal_error(spec: CommandSpec, exc: Exception) -> Error:
    log.exception("internal error in command '%s'", spec.fullname)
    return Error(f"ERR internal error in '{spec.fullname}': {type(exc).__name__}")


def _account(stats: Stats, spec: CommandSpec, reply: Any, start: int) -> None:
    stat = stats.commands.get(spec.fullname) or stats.command(spec.fullname)
    stat.observe((_now() - start) // 1000)
    stats.total_commands_processed += 1
    if reply.__class__ is Error:
        stat.failed_calls += 1
        _record_error(stats, reply)
