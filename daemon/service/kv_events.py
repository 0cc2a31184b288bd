"""KV events in vLLM's ZMQ wire format: what the store caches, for KV-aware routers (Dynamo, llm-d ...).

Wire format (``vllm/distributed/kv_events.py``): a PUB socket the daemon binds
sends multipart ``[topic, seq, payload]``; ``seq`` is an 8-byte big-endian
counter, one per batch, from 0; ``payload`` is msgpack of ``[timestamp,
events, data_parallel_rank]`` with events as tagged maps::

    {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h | nil,
     "token_ids": [...], "block_size": page-size, "lora_id": nil, "medium": "CPU" | "GPU",
     "lora_name": <namespace>}
    {"type": "BlockRemoved", "block_hashes": [...], "medium": ...}
    {"type": "AllBlocksCleared"}

An optional ROUTER replay socket answers a request ``[identity, "", start_seq]``
with ``[identity, "", seq, payload]`` for every buffered batch from
``start_seq`` on, then ``[identity, "", -1 (8 bytes, signed), ""]``: a consumer
that sees a gap in ``seq`` (or joins late) catches up from there.

Namespaces: every event carries its namespace as ``lora_name`` (UTF-8 text;
a name that is not valid UTF-8, or that starts with ``pfx-hex:``, is sent as
``pfx-hex:`` + its hex). Dynamo's indexer folds ``lora_name`` into its block
hashes, so a consumer that queries with ``lora_name`` = the namespace never
merges two namespaces holding the same tokens. The block hashes themselves
are pfxcache's stable ones (``store/block_hashes.py``).

Never blocking the event loop: the store's sink (``blocks_stored`` ...) only
appends a tuple to a bounded deque, and wakes the publisher thread only when it
was idle; the thread waits ``BATCH_WINDOW`` for more, then turns everything
pending into one batch, encodes it with msgspec and sends it. So a busy daemon
sends a few large batches rather than one per store (waking a thread per event
costs more CPU than the event itself), and a quiet one sends within about a
millisecond. A full queue drops the event and counts it; a slow or absent
subscriber costs nothing (ZMQ PUB drops at its high-water mark).
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from array import array
from typing import Any

import msgspec
import zmq

from pfxcache.daemon.store.block_hashes import to_ints

log = logging.getLogger("pfxcached")

#: The replay reply's end marker: -1 as 8 signed big-endian bytes, as vLLM sends it.
END_SEQ = (-1).to_bytes(8, "big", signed=True)
HEX_PREFIX = "pfx-hex:"
#: Events per batch at most (a burst is cut into several batches).
MAX_BATCH_EVENTS = 4096
#: Seconds the thread, woken by a first event, waits for more before it sends them as one batch.
BATCH_WINDOW = 0.001


class BlockStored(msgspec.Struct, tag=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(msgspec.Struct, tag=True):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(msgspec.Struct, tag=True):
    pass


class EventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None


@functools.lru_cache(maxsize=4096)
def namespace_label(namespace: bytes) -> str:
    """The ``lora_name`` a namespace is published under (one-to-one; see the module docstring)."""
    try:
        text = namespace.decode("utf-8")
    except UnicodeDecodeError:
        return HEX_PREFIX + namespace.hex()
    return HEX_PREFIX + namespace.hex() if text.startswith(HEX_PREFIX) else text


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one payload (for consumers written in Python, and tests)."""
    return msgspec.msgpack.decode(payload, type=EventBatch)


class KvEventPublisher:
    """The store's events sink that publishes them over ZMQ (see the module docstring).

    ``start`` binds the sockets (raising ValueError when it cannot) and starts
    the thread; ``stop`` ends it. Counters are read by INFO.
    """

    def __init__(self, *, endpoint: str, replay_endpoint: str = "", topic: str = "", page_size: int,
                 medium: str = "CPU", queue_size: int = 100_000, replay_buffer: int = 10_000,
                 hwm: int = 100_000) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.page_size = page_size
        self.medium = medium
        self.queue_size = queue_size
        self.hwm = hwm
        self._pending: collections.deque = collections.deque()  # events for the thread (append/popleft are atomic)
        self._wakeup = threading.Event()
        self._idle = True  # the thread sleeps on _wakeup: the next event must set it
        self._stopping = False
        self._replay_buffer: collections.deque = collections.deque(maxlen=max(1, replay_buffer))
        self._buffer_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._context: zmq.Context | None = None
        self._pub = None
        self._router = None
        #: The next batch's sequence number; kept across restarts so consumers never see it go back.
        self.next_seq = 0
        self.queued_events = 0
        self.published_events = 0
        self.published_batches = 0
        self.dropped_events = 0
        self.replay_requests = 0
        self.unsent_events = 0  # lost to a failed send (the thread's own counter)

    # -- the store's sink (called on the event loop: only queue) ---------------------------------

    def _put(self, item: tuple) -> None:
        pending = self._pending
        if len(pending) >= self.queue_size:
            self.dropped_events += 1
            return
        self.queued_events += 1
        pending.append(item)
        if self._idle:
            self._idle = False
            self._wakeup.set()

    def blocks_stored(self, namespace: bytes, parent_hash: bytes | None, block_hashes: bytes,
                      tokens: bytes, medium: str | None = None) -> None:
        self._put((0, namespace, parent_hash, block_hashes, tokens, medium))

    def blocks_removed(self, namespace: bytes, block_hashes: bytes, medium: str | None = None) -> None:
        self._put((1, namespace, None, block_hashes, None, medium))

    def all_cleared(self, namespaces: list[bytes]) -> None:
        self._put((2, None, None, None, None, None))

    # -- settings that apply at once ---------------------------------------------------------------

    def set_replay_buffer(self, size: int) -> None:
        """Keep the last ``size`` batches for replay (the newest ones survive a shrink)."""
        with self._buffer_lock:
            self._replay_buffer = collections.deque(self._replay_buffer, maxlen=max(1, size))

    @property
    def queue_length(self) -> int:
        return len(self._pending)

    @property
    def last_seq(self) -> int:
        """Sequence number of the last batch sent (-1: none yet)."""
        return self.next_seq - 1

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the PUB (and ROUTER) sockets and start the publisher thread; ValueError if a bind fails."""
        context = zmq.Context()
        pub = router = None
        try:
            pub = context.socket(zmq.PUB)
            pub.setsockopt(zmq.LINGER, 0)
            pub.setsockopt(zmq.SNDHWM, self.hwm)
            pub.bind(self.endpoint)
            if self.replay_endpoint:
                router = context.socket(zmq.ROUTER)
                router.setsockopt(zmq.LINGER, 0)
                # A replay answers with up to kv-events-replay-buffer batches at once: a ROUTER drops
                # what is past its high-water mark, which would leave the consumer's catch-up short.
                router.setsockopt(zmq.SNDHWM, 0)
                router.bind(self.replay_endpoint)
        except zmq.ZMQError as exc:
            for sock in (pub, router):
                if sock is not None:
                    sock.close(0)
            context.term()
            raise ValueError(f"cannot bind the KV events socket: {exc}") from None
        self._context, self._pub, self._router = context, pub, router
        # The sockets are handed to the thread, which alone uses them from here on.
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        log.info("Publishing KV events on %s%s", self.endpoint,
                 f" (replay on {self.replay_endpoint})" if self.replay_endpoint else "")

    def continue_from(self, old: KvEventPublisher) -> None:
        """Take over a stopped publisher's sequence, replay buffer and counters (a rebind at runtime)."""
        self.next_seq = old.next_seq
        with old._buffer_lock:
            self._replay_buffer.extend(old._replay_buffer)
        for name in ("queued_events", "published_events", "published_batches", "dropped_events",
                     "replay_requests", "unsent_events"):
            setattr(self, name, getattr(old, name))

    def restart(self) -> None:
        """Bind again after stop() (the previous endpoints, when a rebind to new ones failed)."""
        self.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Send what is queued, stop the thread and close the sockets."""
        if self._thread is None:
            return
        self._stopping = True
        self._wakeup.set()
        self._thread.join(timeout)
        self._stopping = False
        self._thread = None
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(0)
        if self._context is not None:
            self._context.term()
        self._context = self._pub = self._router = None

    # -- the publisher thread ---------------------------------------------------------------------

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        poll_s = 0.02 if self._router is not None else 0.5
        pending = self._pending
        while True:
            if not pending and not self._stopping:
                self._wakeup.wait(poll_s)
                self._wakeup.clear()
            if self._router is not None:
                self._serve_replays()
            if pending and not self._stopping:
                time.sleep(BATCH_WINDOW)  # let the loop add what this burst still brings
            while pending:
                items = []
                while pending and len(items) < MAX_BATCH_EVENTS:
                    items.append(pending.popleft())
                self._send(encoder, [self._event(item) for item in items])
            # Idle again: the next event wakes us. Checked once more after saying so, so an
            # event appended just before cannot be left waiting for the poll timeout.
            self._idle = True
            if pending:
                self._idle = False
                continue
            if self._stopping:
                return

    def _event(self, item: tuple):
        kind, namespace, parent, hashes, tokens, medium = item
        if kind == 0:
            ids = array("I")
            ids.frombytes(tokens)
            return BlockStored(to_ints(hashes), None if parent is None else int.from_bytes(parent, "big"),
                               ids.tolist(), self.page_size, None, medium or self.medium, namespace_label(namespace))
        if kind == 1:
            return BlockRemoved(to_ints(hashes), medium or self.medium)
        return AllBlocksCleared()

    def _send(self, encoder, events: list) -> None:
        payload = encoder.encode(EventBatch(time.time(), events, None))
        seq = self.next_seq
        seq_bytes = seq.to_bytes(8, "big")
        try:
            self._pub.send_multipart((self.topic.encode(), seq_bytes, payload), copy=False)
        except zmq.ZMQError:
            self.unsent_events += len(events)
            return
        with self._buffer_lock:
            self._replay_buffer.append((seq, seq_bytes, payload))
        self.next_seq = seq + 1
        self.published_batches += 1
        self.published_events += len(events)

    def _serve_replays(self) -> None:
        router = self._router
        while router.poll(0):
            frames = router.recv_multipart()
            if len(frames) not in (2, 3) or len(frames[-1]) != 8:
                log.warning("KV events: malformed replay request of %d frames", len(frames))
                continue
            identity, start = frames[0], int.from_bytes(frames[-1], "big")
            self.replay_requests += 1
            with self._buffer_lock:
                batches = [(seq_bytes, payload) for seq, seq_bytes, payload in self._replay_buffer if seq >= start]
            for seq_bytes, payload in batches:
                router.send_multipart((identity, b"", seq_bytes, payload))
            router.send_multipart((identity, b"", END_SEQ, b""))

    def describe(self) -> list[tuple[str, Any]]:
        """INFO fields."""
        return [
            ("kv_events_endpoint", self.endpoint),
            ("kv_events_replay_endpoint", self.replay_endpoint),
            ("kv_events_topic", self.topic),
            ("kv_events_queued", self.queued_events),
            ("kv_events_published", self.published_events),
            ("kv_events_published_batches", self.published_batches),
            ("kv_events_dropped", self.dropped_events + self.unsent_events),
            ("kv_events_queue_length", self.queue_length),
            ("kv_events_last_seq", self.last_seq),
            ("kv_events_replay_requests", self.replay_requests),
        ]
