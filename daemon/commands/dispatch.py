"""From a parsed request to a reply: lookup, access checks, then the call.

Everything here derives from the command table: the row found for ``argv``
decides the arity error, whether the command may run before AUTH, and which
handler runs. The call itself and its accounting are in :mod:`.calls`, below
both dispatch and the handlers (EXEC runs its queue through them): handlers
never import dispatch, dispatch reaches them only through the table's rows.

Two things can stand between the checks and the call, in Redis's order: the
gate (``gate.py``: CLIENT PAUSE, an EXEC running alone), where a command waits,
and an open MULTI (``transactions.py``), where it is queued instead of run. A
command refused by the checks inside MULTI flags the transaction (EXECABORT).
"""

from __future__ import annotations

from typing import Any

from pfxcache.protocol.replies import Error, SimpleString

from pfxcache.daemon.commands.calls import account, call_async, internal_error, log_denial, now, record_error
from pfxcache.daemon.commands.context import LATER, Context
from pfxcache.daemon.commands.spec import CommandSpec
from pfxcache.daemon.service.pubsub import SUBSCRIBED_COMMANDS, subscribed_error
from pfxcache.daemon.commands.transactions import NOT_QUEUED, QUEUED_TEXT

NOAUTH = Error("NOAUTH Authentication required.")
NOT_IN_MULTI = Error("ERR Command not allowed inside a transaction")
REPLICA_KEYSPACE = Error("ERR Replica can't interact with the keyspace")
QUEUED = SimpleString(QUEUED_TEXT)


class Pending:
    """A resolved call to an ``async`` handler, for the connection to await.

    ``gated`` (None: not held): the command waits at the gate first, as a write
    (True) or not, then goes through :func:`execute` again (its checks then see
    the state after the wait).
    """

    __slots__ = ("spec", "argv", "gated")

    def __init__(self, spec: CommandSpec, argv: list[bytes], gated: bool | None = None) -> None:
        self.spec = spec
        self.argv = argv
        self.gated = gated


def writes(spec: CommandSpec) -> bool:
    """Whether CLIENT PAUSE WRITE holds the command back (Redis: write or may_replicate)."""
    return "write" in spec.flags or "may_replicate" in spec.flags


def _reject(ctx: Context, argv: list[bytes], reply: Error) -> Error:
    """A command refused before it ran: inside MULTI it flags the transaction, and a refused
    EXEC discards it (Redis's rejectCommand)."""
    client = ctx.client
    if client.multi is not None:
        client.multi.failed = True
    if argv[0].lower() == b"exec":  # in MULTI or not, as redis-server answers it
        client.multi = None
        ctx.server.watches.unwatch(client.id)
        message = reply.message[4:] if reply.message.startswith("ERR ") else reply.message
        reply = Error(f"EXECABORT Transaction discarded because of: {message}")
    return reply


def execute(ctx: Context, argv: list[bytes]) -> Any:
    """Run ``argv`` and return its reply, or a :class:`Pending` for an async handler."""
    server = ctx.server
    stats = server.stats
    spec = server.commands.resolve(argv)
    if spec.__class__ is Error:
        # Redis counts a rejected call only for a command it found (an arity error).
        known = server.commands.lookup(argv)
        if known is not None and not known.arity_ok(len(argv)):
            stats.command(known.fullname).rejected_calls += 1
        spec = _reject(ctx, argv, spec)
        record_error(stats, spec)
        return spec
    client = ctx.client
    if not client.authenticated and server.auth_required and "no_auth" not in spec.flags:
        stats.command(spec.fullname).rejected_calls += 1
        record_error(stats, NOAUTH)
        return _reject(ctx, argv, NOAUTH)
    if server.acl.restricted:
        denied = server.acl.check(client.user, spec, argv)
        if denied is not None:
            client.last_command = spec.fullname
            log_denial(ctx, *server.acl.denial(client.user, spec, argv))
            stats.command(spec.fullname).rejected_calls += 1
            reply = _reject(ctx, argv, Error(denied))
            record_error(stats, reply)
            return reply
    if client.pubsub is not None and client.resp == 2 and client.subscribed \
            and spec.fullname not in SUBSCRIBED_COMMANDS:
        reply = _reject(ctx, argv, Error(subscribed_error(spec.fullname)))
        record_error(stats, reply)
        return reply
    client.last_command = spec.fullname
    if client.multi is not None or server.gate.closed or client.monitoring:
        special = _gate_or_queue(ctx, spec, argv)
        if special is not None:
            return special
    start = now()
    if spec.is_async:
        # Its synchronous attempt first (handles_now): usually there is nothing to wait for.
        attempt = spec.now
        if attempt is None:
            return Pending(spec, argv)
        try:
            reply = attempt(ctx, argv)
        except Exception as exc:
            reply = internal_error(spec, exc)
        if reply is LATER:
            return Pending(spec, argv)
    else:
        try:
            reply = spec.handler(ctx, argv)
        except Exception as exc:  # a bug must cost one reply, not the daemon
            reply = internal_error(spec, exc)
    account(ctx, spec, argv, reply, start)
    return reply


def _gate_or_queue(ctx: Context, spec: CommandSpec, argv: list[bytes]) -> Any:
    """The slow path: a command that waits at the gate, or is queued in MULTI (None: run it now)."""
    client = ctx.client
    multi = client.multi
    if multi is not None and "no_multi" in spec.flags:
        stats = ctx.server.stats
        stats.command(spec.fullname).rejected_calls += 1
        reply = _reject(ctx, argv, NOT_IN_MULTI)
        record_error(stats, reply)
        return reply
    if client.monitoring and ("readonly" in spec.flags or writes(spec)):
        stats = ctx.server.stats
        stats.command(spec.fullname).rejected_calls += 1
        reply = _reject(ctx, argv, REPLICA_KEYSPACE)
        record_error(stats, reply)
        return reply
    gate = ctx.server.gate
    # A monitor is a replica to Redis: CLIENT PAUSE does not hold it (an EXEC running alone does).
    if gate.closed and not (client.monitoring and not gate.exclusive):
        held = writes(spec) or (spec.fullname == "exec" and multi is not None and multi.writes)
        if gate.holds(client.id, held):
            return Pending(spec, argv, gated=held)
    if multi is not None and spec.fullname not in NOT_QUEUED:
        multi.queue(spec, argv, writes(spec))
        return QUEUED
    return None


async def execute_pending(ctx: Context, pending: Pending) -> Any:
    """Await an async handler resolved by :func:`execute` (or the gate first)."""
    if pending.gated is not None:
        await ctx.server.gate.wait(ctx.client.id, pending.gated)
        reply = execute(ctx, pending.argv)
        if reply.__class__ is Pending:
            return await execute_pending(ctx, reply)
        return reply
    return await call_async(ctx, pending.spec, pending.argv)
