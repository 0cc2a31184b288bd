"""Pub/sub commands: SUBSCRIBE, UNSUBSCRIBE, PSUBSCRIBE, PUNSUBSCRIBE, PUBLISH, PUBSUB, and the
sharded SSUBSCRIBE, SUNSUBSCRIBE, SPUBLISH (in a standalone server: channels of their own).

Replies are redis-server 7.0's, byte for byte: one ``subscribe``/``unsubscribe``
(``psubscribe``...) reply per channel, each with the client's subscription
count after it, as a RESP2 array or a RESP3 push; ``UNSUBSCRIBE`` with no
argument and no subscription answers with a null channel. The state lives in
``daemon/service/pubsub.py``; messages reach a subscriber through its push queue.
"""

from __future__ import annotations

from typing import Any

from pfxcache.protocol.replies import Error, Push, Replies, SimpleString, quoted

from pfxcache.daemon.service.pubsub import ClientSubscriptions
from . import handles

PUBSUB_HELP = [
    "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CHANNELS [<pattern>]",
    "    Return the currently active channels matching a <pattern> (default: '*').",
    "NUMPAT",
    "    Return number of subscriptions to patterns.",
    "NUMSUB [<channel> ...]",
    "    Return the number of subscribers for the specified channels, excluding",
    "    pattern subscriptions(default: no channels).",
    "SHARDCHANNELS [<pattern>]",
    "    Return the currently active shard level channels matching a <pattern> (default: '*').",
    "SHARDNUMSUB [<shardchannel> ...]",
    "    Return the number of subscribers for the specified shard level channel(s)",
    "HELP",
    "    Prints this help.",
]


def _subscriptions(ctx: Any) -> ClientSubscriptions:
    client = ctx.client
    if client.pubsub is None:
        client.pubsub = ClientSubscriptions(client.open_push())
    return client.pubsub


#: SUBSCRIBE's three forms: the hub's method, and the count each reply carries.
_SUBSCRIBE_FORMS = {
    b"subscribe": ("subscribe", lambda subs: subs.count),
    b"psubscribe": ("psubscribe", lambda subs: subs.count),
    b"ssubscribe": ("ssubscribe", lambda subs: len(subs.shard_channels)),
}


@handles("subscribe", "psubscribe", "ssubscribe")
def subscribe(ctx: Any, argv: list[bytes]) -> Any:
    kind = argv[0].lower()
    method, count = _SUBSCRIBE_FORMS[kind]
    subs = _subscriptions(ctx)
    join = getattr(ctx.server.pubsub, method)
    replies = []
    for channel in argv[1:]:
        join(ctx.client, channel)
        replies.append(Push([kind, channel, count(subs)]))
    return Replies(replies)


def _unsubscribe(ctx: Any, argv: list[bytes], kind: bytes) -> Any:
    client = ctx.client
    hub = ctx.server.pubsub
    subs = client.pubsub
    drop, held, count = {
        b"unsubscribe": (hub.unsubscribe, "channels", lambda s: s.count),
        b"punsubscribe": (hub.punsubscribe, "patterns", lambda s: s.count),
        b"sunsubscribe": (hub.sunsubscribe, "shard_channels", lambda s: len(s.shard_channels)),
    }[kind]
    names = argv[1:]
    if not names:
        names = list(getattr(subs, held)) if subs is not None else []
        if not names:
            return Push([kind, None, count(subs) if subs is not None else 0])
    replies = []
    for name in names:
        drop(client, name)
        replies.append(Push([kind, name, count(subs) if subs is not None else 0]))
    return Replies(replies)


@handles("unsubscribe")
def unsubscribe(ctx: Any, argv: list[bytes]) -> Any:
    return _unsubscribe(ctx, argv, b"unsubscribe")


@handles("punsubscribe")
def punsubscribe(ctx: Any, argv: list[bytes]) -> Any:
    return _unsubscribe(ctx, argv, b"punsubscribe")


@handles("sunsubscribe")
def sunsubscribe(ctx: Any, argv: list[bytes]) -> Any:
    return _unsubscribe(ctx, argv, b"sunsubscribe")


@handles("spublish")
def spublish(ctx: Any, argv: list[bytes]) -> Any:
    return ctx.server.pubsub.spublish(argv[1], argv[2])


@handles("publish")
def publish(ctx: Any, argv: list[bytes]) -> Any:
    return ctx.server.pubsub.publish(argv[1], argv[2])


@handles("pubsub|channels")
def pubsub_channels(ctx: Any, argv: list[bytes]) -> Any:
    if len(argv) > 3:
        return _unknown_subcommand(argv)
    return ctx.server.pubsub.channel_names(argv[2] if len(argv) == 3 else None)


@handles("pubsub|numsub")
def pubsub_numsub(ctx: Any, argv: list[bytes]) -> Any:
    hub = ctx.server.pubsub
    out: list[Any] = []
    for channel in argv[2:]:
        out += [channel, hub.numsub(channel)]
    return out


@handles("pubsub|shardchannels")
def pubsub_shardchannels(ctx: Any, argv: list[bytes]) -> Any:
    if len(argv) > 3:
        return _unknown_subcommand(argv)
    return ctx.server.pubsub.shard_channel_names(argv[2] if len(argv) == 3 else None)


@handles("pubsub|shardnumsub")
def pubsub_shardnumsub(ctx: Any, argv: list[bytes]) -> Any:
    hub = ctx.server.pubsub
    out: list[Any] = []
    for channel in argv[2:]:
        out += [channel, hub.shard_numsub(channel)]
    return out


@handles("pubsub|numpat")
def pubsub_numpat(ctx: Any, argv: list[bytes]) -> Any:
    return ctx.server.pubsub.numpat


@handles("pubsub|help")
def pubsub_help(ctx: Any, argv: list[bytes]) -> Any:
    return [SimpleString(line) for line in PUBSUB_HELP]


def _unknown_subcommand(argv: list[bytes]) -> Any:
    sub = quoted(argv[1])
    return Error(f"ERR unknown subcommand or wrong number of arguments for '{sub}'. Try PUBSUB HELP.")
