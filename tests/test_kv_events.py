"""KV events from a real daemon: vLLM's ZMQ wire format read with plain pyzmq + msgpack, the replay
socket, directives changed at runtime, INFO kvevents, drops, and the pub/sub channels."""

from __future__ import annotations

import time

import msgspec
import pytest
import redis
import zmq

from pfxcache.daemon.service.kv_events import END_SEQ, KvEventPublisher, namespace_label
from pfxcache.daemon.store import pack_tokens
from pfxcache.daemon.store.block_hashes import prompt_hashes
from pfxcache.testing import free_port, start_daemon
from support import wait_for

PAGE = 4
BLOCK_BYTES = 64


def endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def pfxset(r, ns, ids):
    return r.execute_command("PFXSET", ns, "TOKENS", *ids, "DATA", b"\0" * (len(ids) // PAGE * BLOCK_BYTES))


def decode(payload: bytes):
    """The batch as any msgpack reader sees it (not through our own structs)."""
    return msgspec.msgpack.decode(payload)


class Replayer:
    """A DEALER on the replay socket, as Dynamo's indexer connects one."""

    def __init__(self, ctx, address):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def replay(self, start: int) -> list[tuple[int, list]]:
        self.sock.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            assert self.sock.poll(20000), "no replay reply"
            frames = self.sock.recv_multipart()
            assert frames[0] == b""
            if frames[1] == END_SEQ:
                assert frames[2] == b""
                return out
            out.append((int.from_bytes(frames[1], "big"), decode(frames[2])))


@pytest.fixture
def daemon():
    pub, replay = endpoint(), endpoint()
    d = start_daemon("--arena", "memory", "--maxmemory", str(16 * BLOCK_BYTES), "--block-bytes", str(BLOCK_BYTES),
                     "--page-size", str(PAGE), "--kv-events-endpoint", pub, "--kv-events-replay-endpoint", replay,
                     "--kv-events-topic", "kv@host1", "--evict-low-watermark", "0")
    d.pub, d.replay = pub, replay
    yield d
    d.stop()


def events_of(batches):
    return [event for _, batch in batches for event in batch[1]]


def test_wire_format_and_replay(daemon):
    r = redis.Redis(*daemon.address)
    ids = list(range(100, 110))  # two whole pages and a partial one
    pfxset(r, "tenant-a", ids)
    pfxset(r, "tenant-a", ids[:8] + [7, 7, 7, 7])  # one page below the first two
    r.execute_command("PFXEVICT", "tenant-a", "TOKENS", *ids[:8])
    r.execute_command("FLUSHALL")
    ctx = zmq.Context()
    try:
        replayer = Replayer(ctx, daemon.replay)
        wait_for(lambda: int(r.info("kvevents")["kv_events_published"]) >= 4, 10, "the events to be sent")
        batches = replayer.replay(0)
        assert [seq for seq, _ in batches] == list(range(len(batches)))
        for _, batch in batches:
            assert isinstance(batch[0], float) and batch[2] is None  # [timestamp, events, dp rank]
        hashes = prompt_hashes(b"tenant-a", pack_tokens(ids), PAGE * 4)
        below = prompt_hashes(b"tenant-a", pack_tokens(ids[:8] + [7, 7, 7, 7]), PAGE * 4)
        assert events_of(batches) == [
            {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None, "token_ids": ids[:8],
             "block_size": PAGE, "lora_id": None, "medium": "CPU", "lora_name": "tenant-a"},
            {"type": "BlockStored", "block_hashes": below[2:], "parent_block_hash": hashes[1],
             "token_ids": [7, 7, 7, 7], "block_size": PAGE, "lora_id": None, "medium": "CPU",
             "lora_name": "tenant-a"},
            # PFXEVICT of the two-page prefix: the subtree goes, children first.
            {"type": "BlockRemoved", "block_hashes": [below[2], hashes[1]], "medium": "CPU"},
            {"type": "AllBlocksCleared"},
        ]
        assert replayer.replay(len(batches) - 1) == batches[-1:]
        assert replayer.replay(10**6) == []
        info = r.info("kvevents")
        assert info["kv_events_last_seq"] == len(batches) - 1
        assert info["kv_events_replay_requests"] == 3
        assert info["kv_events_dropped"] == 0
    finally:
        ctx.destroy(linger=0)


def test_live_subscriber_gets_batches_in_order(daemon):
    r = redis.Redis(*daemon.address)
    ctx = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")  # a topic prefix
        sub.connect(daemon.pub)
        # A SUB socket misses what is sent before it is connected: store until one batch arrives.
        probe = 0
        while not sub.poll(100):
            probe += 1
            pfxset(r, "probe", [probe] * PAGE)
            assert probe < 200, "the subscriber never received a batch"
        seen = []
        while sub.poll(200):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv@host1"
            seen.append(int.from_bytes(seq, "big"))
        for i in range(20):
            pfxset(r, "tenant-b", [1000 + i] * PAGE)
        stored = []
        while len(stored) < 20:
            assert sub.poll(10000)
            _, seq, payload = sub.recv_multipart()
            seen.append(int.from_bytes(seq, "big"))
            stored += [e for e in decode(payload)[1] if e.get("lora_name") == "tenant-b"]
        assert seen == list(range(seen[0], seen[0] + len(seen)))  # consecutive: no gap
        assert [e["token_ids"][0] for e in stored] == [1000 + i for i in range(20)]
    finally:
        ctx.destroy(linger=0)


def test_directives_at_runtime(daemon):
    r = redis.Redis(*daemon.address)
    pfxset(r, "ns", [1] * PAGE)
    wait_for(lambda: int(r.info("kvevents")["kv_events_published"]) == 1, 10, "the first event")
    # A bad address is refused and the running publisher stays.
    with pytest.raises(redis.ResponseError, match="kv-events-endpoint"):
        r.config_set("kv-events-endpoint", "not-a-zmq-address")
    assert r.config_get("kv-events-endpoint")["kv-events-endpoint"] == daemon.pub
    # Rebind: the sequence goes on, the replay buffer is kept.
    fresh_pub, fresh_replay = endpoint(), endpoint()
    r.config_set("kv-events-endpoint", fresh_pub, "kv-events-replay-endpoint", fresh_replay)
    pfxset(r, "ns", [2] * PAGE)
    ctx = zmq.Context()
    try:
        wait_for(lambda: int(r.info("kvevents")["kv_events_published"]) == 2, 10, "the second event")
        batches = Replayer(ctx, fresh_replay).replay(0)
        assert [seq for seq, _ in batches] == [0, 1]
        r.config_set("kv-events-replay-buffer", 1)
        assert [seq for seq, _ in Replayer(ctx, fresh_replay).replay(0)] == [1]
        r.config_set("kv-events-topic", "renamed")
        # Off: nothing more is published (and nothing queued).
        r.config_set("kv-events-endpoint", "")
        assert r.info("kvevents")["kv_events_enabled"] == 0
        pfxset(r, "ns", [3] * PAGE)
        r.config_set("kv-events-endpoint", fresh_pub)
        info = r.info("kvevents")
        assert info["kv_events_enabled"] == 1 and info["kv_events_topic"] == "renamed"
        assert info["kv_events_last_seq"] == 1
    finally:
        ctx.destroy(linger=0)


def test_startup_refuses_an_endpoint_it_cannot_bind():
    with pytest.raises(RuntimeError, match="Cannot publish KV events"):
        start_daemon("--arena", "memory", "--kv-events-endpoint", "bogus://x")


def test_a_full_queue_drops_and_counts_without_waiting():
    """The sink only queues: with no thread draining it, events past the queue size are dropped."""
    publisher = KvEventPublisher(endpoint="tcp://127.0.0.1:1", page_size=PAGE, queue_size=3)
    for i in range(10):
        publisher.blocks_stored(b"ns", None, i.to_bytes(8, "big"), pack_tokens([i] * PAGE))
    assert (publisher.queued_events, publisher.dropped_events, publisher.queue_length) == (3, 7, 3)


def test_no_subscriber_never_stalls_the_daemon(daemon):
    r = redis.Redis(*daemon.address)
    started = time.monotonic()
    pipe = r.pipeline(transaction=False)
    for i in range(2000):
        pipe.execute_command("PFXSET", f"ns{i % 7}", "TOKENS", *([i] * PAGE), "DATA", b"\0" * BLOCK_BYTES)
    assert len(pipe.execute()) == 2000
    assert r.ping() and time.monotonic() - started < 120  # a generous bound: it must merely finish
    wait_for(lambda: int(r.info("kvevents")["kv_events_queue_length"]) == 0, 30, "the queue to drain")


def test_namespace_labels_are_one_to_one():
    assert namespace_label(b"tenant-a") == "tenant-a"
    assert namespace_label(b"\xff\x00") == "pfx-hex:ff00"
    assert namespace_label(b"pfx-hex:ff00") == "pfx-hex:" + b"pfx-hex:ff00".hex()


def test_store_events_on_pubsub_channels():
    # Both sinks at once: the ZMQ publisher and the channels hear the same events.
    d = start_daemon("--arena", "memory", "--maxmemory", str(16 * BLOCK_BYTES), "--block-bytes",
                     str(BLOCK_BYTES), "--page-size", str(PAGE), "--kv-events-pubsub", "yes",
                     "--kv-events-endpoint", endpoint())
    try:
        r = redis.Redis(*d.address)
        sub = redis.Redis(*d.address).pubsub()
        sub.psubscribe("__kvevents@0__:tenant-*")
        assert sub.get_message(timeout=5)["type"] == "psubscribe"
        ids = list(range(8))
        pfxset(r, "tenant-a", ids)
        pfxset(r, "other", ids)  # nobody listens to this channel
        r.execute_command("PFXEVICT", "tenant-a", "ALL")
        pfxset(r, "tenant-a", ids[:4])
        r.execute_command("FLUSHALL")
        hashes = [b"%016x" % h for h in prompt_hashes(b"tenant-a", pack_tokens(ids), PAGE * 4)]
        got = [sub.get_message(timeout=5) for _ in range(4)]
        assert {m["channel"] for m in got} == {b"__kvevents@0__:tenant-a"}
        assert [m["data"] for m in got] == [
            b"stored - " + b" ".join(hashes), b"removed " + b" ".join(hashes[::-1]),
            b"stored - " + hashes[0], b"cleared"]
        assert sub.get_message(timeout=0.5) is None
        # stored a, stored other, removed a, stored a, cleared: 5 events on the ZMQ side too.
        wait_for(lambda: r.info("kvevents")["kv_events_published"] == 5, 10, "the ZMQ side")
        r.config_set("kv-events-pubsub", "no")
        pfxset(r, "tenant-a", ids)
        assert sub.get_message(timeout=0.5) is None
        sub.close()
    finally:
        d.stop()


def test_changing_the_events_sinks_leaves_watch_working(daemon):
    """The store's KV events listener and WATCH's callback are apart: a CONFIG SET of the
    kv-events directives (which resets the listener) must not make a WATCH miss a change."""
    watcher = redis.Redis(*daemon.address, protocol=2)
    writer = redis.Redis(*daemon.address, protocol=2)
    pipe = watcher.pipeline()
    pipe.watch("ns")
    writer.config_set("kv-events-pubsub", "yes")
    pfxset(writer, "ns", [5] * PAGE)
    pipe.multi()
    pipe.ping()
    with pytest.raises(redis.WatchError):
        pipe.execute()
