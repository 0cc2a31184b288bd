"""Redis pub/sub state: channels, patterns, who subscribes to what, and fan-out of PUBLISH.

Plain synchronous code, as redis-server's pubsub.c: a channel (or pattern)
maps to its subscribers in subscription order; a client keeps its own
channels and patterns in subscription order too (UNSUBSCRIBE without
arguments answers in that order). A message is encoded once per protocol
version and handed to each receiver's ``push`` (see ``push.py``): channel
subscribers first, then pattern subscribers, each pattern once, as Redis.

Message frames are Redis's: ``message <channel> <payload>`` and ``pmessage
<pattern> <channel> <payload>``, a RESP2 array or a RESP3 push.
"""

from __future__ import annotations

from typing import Any

from pfxcache.protocol.redis_strings import stringmatchlen

#: Commands a RESP2 client may send while subscribed (Redis 7.0's list).
SUBSCRIBED_COMMANDS = frozenset(
    ("subscribe", "ssubscribe", "unsubscribe", "sunsubscribe", "psubscribe", "punsubscribe", "ping", "quit",
     "reset")
)


def subscribed_error(fullname: str) -> str:
    return (f"ERR Can't execute '{fullname}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET "
            "are allowed in this context")


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def message_frame(resp: int, channel: bytes, payload: bytes, pattern: bytes | None = None,
                  kind: bytes = b"message") -> bytes:
    """The encoded ``message`` (``pmessage``, ``smessage``) a subscriber receives."""
    head = b">" if resp == 3 else b"*"
    if pattern is None:
        return head + b"3\r\n" + _bulk(kind) + _bulk(channel) + _bulk(payload)
    return head + b"4\r\n$8\r\npmessage\r\n" + _bulk(pattern) + _bulk(channel) + _bulk(payload)


class ClientSubscriptions:
    """One client's channels, patterns and shard channels (in subscription order) and its push queue."""

    __slots__ = ("channels", "patterns", "shard_channels", "push")

    def __init__(self, push: Any) -> None:
        self.channels: dict[bytes, None] = {}
        self.patterns: dict[bytes, None] = {}
        self.shard_channels: dict[bytes, None] = {}
        self.push = push  # push.PushQueue: out-of-band frames for the connection

    @property
    def count(self) -> int:
        """What (P)SUBSCRIBE replies count: channels + patterns (shard channels count apart)."""
        return len(self.channels) + len(self.patterns)

    @property
    def total(self) -> int:
        """Every subscription: the client is in the subscribed state while this is not 0."""
        return len(self.channels) + len(self.patterns) + len(self.shard_channels)


class PubSub:
    """The server's pub/sub registry."""

    def __init__(self) -> None:
        self.channels: dict[bytes, dict[int, Any]] = {}  # channel -> {client id: client}
        self.patterns: dict[bytes, dict[int, Any]] = {}  # pattern -> {client id: client}
        #: Shard channels (SSUBSCRIBE/SPUBLISH): in a standalone server, channels of their own.
        self.shard_channels: dict[bytes, dict[int, Any]] = {}
        self.messages_published = 0

    # -- subscriptions (the client's ``pubsub`` is a ClientSubscriptions) -----------------------------

    def subscribe(self, client: Any, channel: bytes) -> bool:
        subs = client.pubsub
        if channel in subs.channels:
            return False
        subs.channels[channel] = None
        self.channels.setdefault(channel, {})[client.id] = client
        return True

    def unsubscribe(self, client: Any, channel: bytes) -> bool:
        subs = client.pubsub
        if subs is None or channel not in subs.channels:
            return False
        del subs.channels[channel]
        receivers = self.channels[channel]
        del receivers[client.id]
        if not receivers:
            del self.channels[channel]
        return True

    def psubscribe(self, client: Any, pattern: bytes) -> bool:
        subs = client.pubsub
        if pattern in subs.patterns:
            return False
        subs.patterns[pattern] = None
        self.patterns.setdefault(pattern, {})[client.id] = client
        return True

    def punsubscribe(self, client: Any, pattern: bytes) -> bool:
        subs = client.pubsub
        if subs is None or pattern not in subs.patterns:
            return False
        del subs.patterns[pattern]
        receivers = self.patterns[pattern]
        del receivers[client.id]
        if not receivers:
            del self.patterns[pattern]
        return True

    def ssubscribe(self, client: Any, channel: bytes) -> bool:
        subs = client.pubsub
        if channel in subs.shard_channels:
            return False
        subs.shard_channels[channel] = None
        self.shard_channels.setdefault(channel, {})[client.id] = client
        return True

    def sunsubscribe(self, client: Any, channel: bytes) -> bool:
        subs = client.pubsub
        if subs is None or channel not in subs.shard_channels:
            return False
        del subs.shard_channels[channel]
        receivers = self.shard_channels[channel]
        del receivers[client.id]
        if not receivers:
            del self.shard_channels[channel]
        return True

    def drop_client(self, client: Any) -> None:
        """Forget every subscription of ``client`` (it disconnected or sent RESET)."""
        subs = client.pubsub
        if subs is None:
            return
        for channel in list(subs.channels):
            self.unsubscribe(client, channel)
        for pattern in list(subs.patterns):
            self.punsubscribe(client, pattern)
        for channel in list(subs.shard_channels):
            self.sunsubscribe(client, channel)

    # -- publishing -----------------------------------------------------------------------------------

    def publish(self, channel: bytes, payload: bytes) -> int:
        """Deliver to every subscriber of ``channel`` and of each matching pattern; returns the receivers."""
        frames: dict[tuple[int, bytes | None], bytes] = {}
        receivers = 0
        subscribers = self.channels.get(channel)
        if subscribers:
            for client in list(subscribers.values()):
                key = (client.resp, None)
                frame = frames.get(key)
                if frame is None:
                    frame = frames[key] = message_frame(client.resp, channel, payload)
                client.pubsub.push.push(frame)
                receivers += 1
        if self.patterns:
            for pattern, clients in list(self.patterns.items()):
                if not stringmatchlen(pattern, channel):
                    continue
                for client in list(clients.values()):
                    key = (client.resp, pattern)
                    frame = frames.get(key)
                    if frame is None:
                        frame = frames[key] = message_frame(client.resp, channel, payload, pattern)
                    client.pubsub.push.push(frame)
                    receivers += 1
        self.messages_published += 1
        return receivers

    def spublish(self, channel: bytes, payload: bytes) -> int:
        """SPUBLISH: deliver an ``smessage`` to the shard channel's subscribers (patterns never match)."""
        frames: dict[int, bytes] = {}
        subscribers = self.shard_channels.get(channel, {})
        for client in list(subscribers.values()):
            frame = frames.get(client.resp)
            if frame is None:
                frame = frames[client.resp] = message_frame(client.resp, channel, payload, kind=b"smessage")
            client.pubsub.push.push(frame)
        return len(subscribers)

    def has_listeners(self, channel: bytes) -> bool:
        """Whether a PUBLISH to ``channel`` would reach anyone (lets event sources skip the work)."""
        if channel in self.channels:
            return True
        return any(stringmatchlen(pattern, channel) for pattern in self.patterns)

    # -- PUBSUB introspection ------------------------------------------------------------------------

    def channel_names(self, pattern: bytes | None = None) -> list[bytes]:
        """Channels with at least one subscriber (matching ``pattern``)."""
        return [ch for ch in self.channels if pattern is None or stringmatchlen(pattern, ch)]

    def numsub(self, channel: bytes) -> int:
        return len(self.channels.get(channel, ()))

    def shard_channel_names(self, pattern: bytes | None = None) -> list[bytes]:
        return [ch for ch in self.shard_channels if pattern is None or stringmatchlen(pattern, ch)]

    def shard_numsub(self, channel: bytes) -> int:
        return len(self.shard_channels.get(channel, ()))

    @property
    def numpat(self) -> int:
        """Distinct patterns subscribed to (Redis 7 counts patterns, not subscriptions)."""
        return len(self.patterns)
