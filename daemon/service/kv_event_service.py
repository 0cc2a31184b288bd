"""The daemon's KV events: the store's events to the ZMQ publisher and to pub/sub, as the directives say.

``kv-events-endpoint`` (and ``-replay-endpoint``) start, rebind or stop the
ZMQ publisher (``kv_events.py``) at once when CONFIG SET changes them; a bind
that fails vetoes the change and the previous sockets stay. The topic, the
replay buffer and the queue size apply to the running publisher. With
``kv-events-pubsub yes`` the same events go to the Redis channels
``__kvevents@0__:<namespace>`` (``KvEventChannels``). The store hears of
neither: it calls one sink, set here.
"""

from __future__ import annotations

import logging
from typing import Any

from pfxcache.daemon.service.kv_events import KvEventPublisher
from pfxcache.daemon.store.events import EventFanout

log = logging.getLogger("pfxcached")

CHANNEL_PREFIX = b"__kvevents@0__:"


def _hex_words(packed: bytes) -> list[bytes]:
    """Packed 8-byte hashes as 16-hex-digit words."""
    text = packed.hex().encode()
    return [text[i : i + 16] for i in range(0, len(text), 16)]


class KvEventChannels:
    """A store sink that publishes compact messages on one pub/sub channel per namespace.

    Messages: ``stored <parent|-> <hash> ...``, ``removed <hash> ...``,
    ``cleared`` (hashes as 16 hex digits). Nothing is encoded for a channel
    nobody listens to.
    """

    def __init__(self, pubsub: Any) -> None:
        self.pubsub = pubsub

    def blocks_stored(self, namespace: bytes, parent_hash: bytes | None, block_hashes: bytes,
                      tokens: bytes, medium: str | None = None) -> None:
        if medium is not None:  # the channels follow the arena; a lower tier's pages are ZMQ events only
            return
        channel = CHANNEL_PREFIX + namespace
        if self.pubsub.has_listeners(channel):
            parent = b"-" if parent_hash is None else parent_hash.hex().encode()
            self.pubsub.publish(channel, b" ".join([b"stored", parent, *_hex_words(block_hashes)]))

    def blocks_removed(self, namespace: bytes, block_hashes: bytes, medium: str | None = None) -> None:
        if medium is not None:
            return
        channel = CHANNEL_PREFIX + namespace
        if self.pubsub.has_listeners(channel):
            self.pubsub.publish(channel, b" ".join([b"removed", *_hex_words(block_hashes)]))

    def all_cleared(self, namespaces: list[bytes]) -> None:
        for namespace in namespaces:
            channel = CHANNEL_PREFIX + namespace
            if self.pubsub.has_listeners(channel):
                self.pubsub.publish(channel, b"cleared")


class KvEventService:
    """Owns the publisher and the channels sink; keeps the store's sink in step with the directives.

    Built once the store exists, with what it serves: the store whose events it carries and the
    pub/sub its channels publish on. :meth:`start` opens what the configuration asks for,
    :meth:`close` stops it and detaches the store's sink.
    """

    def __init__(self, config: Any, store: Any, pubsub: Any) -> None:
        self.config = config
        self.store = store
        self.pubsub = pubsub
        self.publisher: KvEventPublisher | None = None
        #: The last publisher stopped: a new one continues its sequence, so seq never goes back.
        self._previous: KvEventPublisher | None = None
        self.channels: KvEventChannels | None = None
        config.on_change("kv-events-endpoint", self._rebind)
        config.on_change("kv-events-replay-endpoint", self._rebind)
        config.on_change("kv-events-hwm", self._rebind)
        config.on_change("kv-events-topic", lambda _old, new: self._set("topic", new))
        config.on_change("kv-events-queue-size", lambda _old, new: self._set("queue_size", new))
        config.on_change("kv-events-replay-buffer", self._resize_replay)
        config.on_change("kv-events-pubsub", lambda _old, new: self._set_channels(new))

    # -- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Open what the configuration asks for; ValueError when the publisher cannot bind."""
        if self.config["kv-events-endpoint"]:
            publisher = self._new_publisher()
            publisher.start()
            self.publisher = publisher
        if self.config["kv-events-pubsub"]:
            self.channels = KvEventChannels(self.pubsub)
        self._attach()

    def close(self) -> None:
        """Detach the store's sink and stop the publisher (idempotent)."""
        self.store.set_events(None)
        if self.publisher is not None:
            self.publisher.stop()
            self.publisher = None

    # -- wiring ------------------------------------------------------------------------------------------

    def _new_publisher(self) -> KvEventPublisher:
        config = self.config
        medium = "GPU" if config["arena"] == "cuda" else "CPU"
        return KvEventPublisher(
            endpoint=config["kv-events-endpoint"], replay_endpoint=config["kv-events-replay-endpoint"],
            topic=config["kv-events-topic"], page_size=self.store.page_size, medium=medium,
            queue_size=config["kv-events-queue-size"], replay_buffer=config["kv-events-replay-buffer"],
            hwm=config["kv-events-hwm"],
        )

    def _attach(self) -> None:
        sinks = [sink for sink in (self.publisher, self.channels) if sink is not None]
        self.store.set_events(None if not sinks else sinks[0] if len(sinks) == 1 else EventFanout(sinks))

    def _rebind(self, _old: Any, _new: Any) -> None:
        """CONFIG SET of an endpoint: the new sockets replace the old ones, or the change is refused."""
        old = self.publisher
        if old is not None:
            old.stop()
            self._previous = old
        self.publisher = None
        if self.config["kv-events-endpoint"]:
            fresh = self._new_publisher()
            if self._previous is not None:
                fresh.continue_from(self._previous)
            try:
                fresh.start()
            except ValueError:
                if old is not None:  # put the previous sockets back, then veto
                    old.restart()
                    self.publisher = old
                self._attach()
                raise
            self.publisher = fresh
        self._attach()

    def _set(self, attribute: str, value: Any) -> None:
        if self.publisher is not None:
            setattr(self.publisher, attribute, value)

    def _resize_replay(self, _old: Any, new: int) -> None:
        if self.publisher is not None:
            self.publisher.set_replay_buffer(new)

    def _set_channels(self, enabled: bool) -> None:
        self.channels = KvEventChannels(self.pubsub) if enabled else None
        self._attach()

    # -- INFO kvevents -------------------------------------------------------------------------------------

    def info_fields(self) -> list[tuple[str, Any]]:
        fields: list[tuple[str, Any]] = [
            ("kv_events_enabled", int(self.publisher is not None)),
            ("kv_events_pubsub", int(self.channels is not None)),
        ]
        if self.publisher is not None:
            fields += self.publisher.describe()
        return fields
