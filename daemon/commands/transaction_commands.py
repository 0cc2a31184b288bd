"""Transactions: MULTI, EXEC, DISCARD, WATCH, UNWATCH, with redis-server 7.0.15's replies.

The queue and the watches are in :mod:`pfxcache.daemon.commands.transactions`; queueing
itself happens in dispatch. EXEC runs the queue through :func:`~pfxcache.daemon.commands.calls.call`
(stats, SLOWLOG, MONITOR as for any command). When the queue holds an async
command (PFXGET, PFXSET ...) the EXEC runs *alone* (:mod:`pfxcache.daemon.server.gate`):
other clients' commands wait and none is under way, so no other client's
command lands between, or inside, the transaction's commands.
"""

from __future__ import annotations

from typing import Any

from pfxcache.protocol.replies import NULL_ARRAY, OK, ArrayHeader, Error, Replies

from pfxcache.daemon.security.acl import NOPERM_KEY
from pfxcache.daemon.commands.calls import call, call_async
from pfxcache.daemon.commands.transactions import EXECABORT, MultiState
from . import handles
from .context import MUTE_OFF, NO_REPLY, Context, Muted

NESTED = Error("ERR MULTI calls can not be nested")
EXEC_WITHOUT_MULTI = Error("ERR EXEC without MULTI")
DISCARD_WITHOUT_MULTI = Error("ERR DISCARD without MULTI")
WATCH_INSIDE_MULTI = Error("ERR WATCH inside MULTI is not allowed")
MONITOR_IN_EXEC = Error("ERR MONITOR isn't allowed for DENY BLOCKING client")
ACL_CHANGED = (
    "NOPERM ACLs rules changed between the moment the transaction was accumulated and the EXEC call. "
    "This command is no longer allowed for the following reason: {}"
)


@handles("multi")
def multi(ctx: Context, argv: list[bytes]) -> Any:
    if ctx.client.multi is not None:
        return NESTED
    ctx.client.multi = MultiState()
    return OK


@handles("discard")
def discard(ctx: Context, argv: list[bytes]) -> Any:
    client = ctx.client
    if client.multi is None:
        return DISCARD_WITHOUT_MULTI
    client.multi = None
    ctx.server.watches.unwatch(client.id)
    return OK


@handles("watch")
def watch(ctx: Context, argv: list[bytes]) -> Any:
    client = ctx.client
    if client.multi is not None:
        return WATCH_INSIDE_MULTI
    keys = ctx.server.prefix.store.keys
    for name in argv[1:]:
        keys.live(name)  # one already past its expiry goes now, not as a touch after the WATCH
        ctx.server.watches.watch(client.id, name)
    return OK


@handles("unwatch")
def unwatch(ctx: Context, argv: list[bytes]) -> Any:
    ctx.server.watches.unwatch(ctx.client.id)
    return OK


@handles("exec")
async def exec_(ctx: Context, argv: list[bytes]) -> Any:
    client, server = ctx.client, ctx.server
    queued = client.multi
    if queued is None:
        return EXEC_WITHOUT_MULTI
    client.multi = None
    watches = server.watches
    if queued.failed:
        watches.unwatch(client.id)
        return Error(EXECABORT)
    muting = _Muting.of(client, queued.commands)
    if not queued.any_async:
        # Synchronous handlers never yield: the queue runs with no other client in between.
        if _touched(ctx):
            return NULL_ARRAY
        if muting is None:
            return [_run_sync(ctx, spec, args) for spec, args in queued.commands]
        for spec, args in queued.commands:
            muting.ran(spec, args, _run_sync(ctx, spec, args))
        return muting.reply(client)
    async with server.gate.alone(client.id):
        # Checked once alone: a command under way when EXEC came may have touched a watched namespace.
        if _touched(ctx):
            return NULL_ARRAY
        replies = []
        for spec, args in queued.commands:
            if spec.is_async and _allowed(ctx, spec, args) is None:
                reply = await call_async(ctx, spec, args)
            else:
                reply = _run_sync(ctx, spec, args)
            if muting is None:
                replies.append(reply)
            else:
                muting.ran(spec, args, reply)
        return replies if muting is None else muting.reply(client)


class _Muting:
    """EXEC under CLIENT REPLY OFF / SKIP, byte for byte as redis-server 7.0.15 answers it.

    Redis writes EXEC's array header, then each command's reply as it runs,
    each dropped while the client is muted at that moment: a CLIENT REPLY OFF
    in the queue silences the rest (the count stays: the stream does not add
    up, as in Redis), a CLIENT REPLY ON in it speaks again, and a CLIENT REPLY
    SKIP in it mutes the command after EXEC, not the next one inside.
    """

    __slots__ = ("off", "skip", "skip_next", "parts")

    def __init__(self, client: Any, count: int) -> None:
        self.off = client.mute == MUTE_OFF
        self.skip = client.mute > 0  # a CLIENT REPLY SKIP just before EXEC
        self.skip_next = False
        self.parts: list = [] if self.off or self.skip else [ArrayHeader(count)]

    @classmethod
    def of(cls, client: Any, commands: list) -> _Muting | None:
        """The muting of this EXEC, or None where no reply of it is muted (a plain array)."""
        if client.mute or any(spec.fullname == "client|reply" for spec, _ in commands):
            return cls(client, len(commands))
        return None

    def ran(self, spec: Any, argv: list[bytes], reply: Any) -> None:
        if spec.fullname == "client|reply" and reply.__class__ is not Error:
            mode = argv[2].lower()
            if mode == b"on":
                self.off = self.skip = False
            elif mode == b"off":
                self.off = True
            elif not self.off:
                self.skip_next = True
        if reply is not NO_REPLY and not (self.off or self.skip):
            self.parts.append(reply)

    def reply(self, client: Any) -> Muted:
        """The reply as filtered; the client's mute as after EXEC (a SKIP in the queue mutes the next command)."""
        client.mute = MUTE_OFF if self.off else 1 if self.skip_next else 0
        return Muted(Replies(self.parts))


def _touched(ctx: Context) -> bool:
    """Whether a namespace the client watches was touched since WATCH (the watches end here)."""
    watches, keys = ctx.server.watches, ctx.server.prefix.store.keys
    client_id = ctx.client.id
    for name in list(watches.watched(client_id)):
        keys.live(name)  # a watched namespace whose expiry came meanwhile is deleted: a touch
    touched = watches.is_dirty(client_id)
    watches.unwatch(client_id)
    return touched


def _allowed(ctx: Context, spec: Any, argv: list[bytes]) -> Error | None:
    """The ACL is checked again at EXEC: rules may have changed since the command was queued."""
    acl = ctx.server.acl
    if not acl.restricted:
        return None
    denied = acl.check(ctx.client.user, spec, argv)
    if denied is None:
        return None
    reason = ("no permission to touch the specified keys" if denied == NOPERM_KEY
              else f"no permission to execute the '{spec.fullname}' command")
    return Error(ACL_CHANGED.format(reason))


def _run_sync(ctx: Context, spec: Any, argv: list[bytes]) -> Any:
    denied = _allowed(ctx, spec, argv)
    if denied is not None:
        ctx.server.stats.error("NOPERM")
        return denied
    if spec.fullname == "monitor":  # Redis refuses to turn a transaction's client into a monitor
        ctx.server.stats.error("ERR")
        return MONITOR_IN_EXEC
    return call(ctx, spec, argv)
