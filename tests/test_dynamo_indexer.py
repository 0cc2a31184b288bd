"""Proof with a consumer nobody here wrote: NVIDIA Dynamo's standalone KV indexer, fed by pfxcached.

The indexer (``ai-dynamo-runtime`` 1.6.1, in the test extras) subscribes to the daemon's KV events
and must answer ``/query`` with the same longest prefix as ``PFXGET``, for random prompts with shared
prefixes and partial pages in several namespaces holding the same tokens: after stores, after
evictions under memory pressure, after PFXEVICT (a prefix, a whole namespace), after DEL of a namespace
whose pages a lease pins, after FLUSHALL with a lease kept, and after it was away for a while and caught up through the replay socket.

Each comparison first waits for a barrier: a fresh prompt stored in its own namespace, until the
indexer reports it. Events are applied in sequence order, so every earlier event is applied by then.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import struct
import time

import pytest
import redis

from pfxcache.testing import free_port, start_daemon
from pfxcache.tools.kv_indexer import indexer_installed, start_indexer
from support import wait_for

if not indexer_installed():
    if os.environ.get("CI"):
        raise RuntimeError("CI must install ai-dynamo-runtime (the test extra): scripts/setup test")
    pytest.skip("Dynamo's KV indexer (ai-dynamo-runtime) is not installed", allow_module_level=True)

PAGE = 4
BLOCK_BYTES = 32
BLOCKS = 120
NAMESPACES = ["tenant-a", "tenant-b", "tenant-c"]
_barrier = itertools.count(1)


class Fleet:
    def __init__(self, tmp_path, page=PAGE, blocks=BLOCKS, *extra):
        self.page = page
        self.pub = f"tcp://127.0.0.1:{free_port()}"
        self.replay = f"tcp://127.0.0.1:{free_port()}"
        self.daemon = start_daemon(
            "--arena", "memory", "--maxmemory", str(blocks * BLOCK_BYTES), "--block-bytes", str(BLOCK_BYTES),
            "--page-size", str(page), "--evict-low-watermark", "0", "--kv-events-endpoint", self.pub,
            "--kv-events-replay-endpoint", self.replay, "--kv-events-replay-buffer", "1000000", *extra)
        self.r = redis.Redis(*self.daemon.address, protocol=2)
        self.tmp_path = tmp_path
        self.indexer = None
        self.indexers = 0

    def start_indexer(self):
        self.indexers += 1
        self.indexer = start_indexer(str(self.tmp_path / f"indexer-{self.indexers}.log"))
        self.indexer.register(1, self.pub, replay_endpoint=self.replay, block_size=self.page)

    def store(self, ns, ids):
        data = b"\0" * (len(ids) // self.page * BLOCK_BYTES)
        return self.r.execute_command("PFXSET", ns, "PACKED", struct.pack(f"<{len(ids)}I", *ids), "DATA", data)

    def matched(self, ns, ids) -> int:
        return self.r.execute_command("PFXGET", ns, "TOKENS", *ids, "NOLEASE")[1]

    def barrier(self):
        """Store fresh barrier prompts until the indexer shows one (a SUB socket that is still
        connecting misses what is sent meanwhile, so one barrier alone could go unseen forever)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ids = [10**6 + next(_barrier)] * self.page
            self.store("barrier", ids)
            try:
                wait_for(lambda: self.indexer.query(ids, "barrier").get(1, 0) == self.page, 1, "a barrier")
                return
            except AssertionError:
                continue
        raise AssertionError(f"the indexer never applied the events\n{self.indexer.log()}")

    def compare(self, prompts):
        self.barrier()
        mismatches = []
        for ns, ids in prompts:
            ours, theirs = self.matched(ns, ids), self.indexer.query(ids, ns).get(1, 0)
            if ours != theirs:
                mismatches.append((ns, len(ids), ours, theirs))
        assert not mismatches, f"(namespace, prompt length, PFXGET, indexer): {mismatches[:10]}"
        return sum(1 for ns, ids in prompts if self.matched(ns, ids))

    def stop(self):
        if self.indexer is not None:
            self.indexer.stop()
        self.daemon.stop()


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    try:
        f.start_indexer()
        yield f
    finally:
        f.stop()


def prompts_from(rng, stems, n):
    """Prompts that share prefixes (a stem cut at a page or mid-page) and end in partial pages."""
    out = []
    for _ in range(n):
        ns = rng.choice(NAMESPACES)
        stem = rng.choice(stems)
        cut = rng.randint(0, len(stem))
        out.append((ns, stem[:cut] + [rng.randrange(50) for _ in range(rng.randint(0, 2 * PAGE + 3))]))
    return out


def test_indexer_sees_what_pfxget_sees(fleet):
    rng = random.Random(16)
    stems = [[rng.randrange(50) for _ in range(PAGE * rng.randint(2, 6))] for _ in range(8)]
    probes = prompts_from(rng, stems, 150) + [(ns, stem) for ns in NAMESPACES for stem in stems]

    # Stores (the same stems in every namespace: they must not merge), no eviction yet.
    for ns, ids in prompts_from(rng, stems, 12):
        fleet.store(ns, ids)
    assert fleet.r.info("stats")["evicted_keys"] == 0
    assert fleet.compare(probes) > 0
    # Only tenant-a stored this one: the indexer must not find it under the other namespaces.
    only_a = stems[0] + [49] * PAGE
    fleet.store("tenant-a", only_a)
    fleet.compare([(ns, only_a) for ns in NAMESPACES])
    assert fleet.indexer.query(only_a, "tenant-b").get(1, 0) < len(only_a)

    # Evictions under memory pressure: far more pages than the arena holds.
    for ns, ids in prompts_from(rng, stems, 120):
        fleet.store(ns, ids)
    assert fleet.r.info("stats")["evicted_keys"] > 0
    fleet.compare(probes)

    # PFXEVICT: prefixes, then a whole namespace.
    for ns, ids in prompts_from(rng, stems, 15):
        if len(ids) >= PAGE:
            fleet.r.execute_command("PFXEVICT", ns, "TOKENS", *ids[: PAGE * rng.randint(1, len(ids) // PAGE)])
    fleet.compare(probes)
    fleet.r.execute_command("PFXEVICT", "tenant-b", "ALL")
    fleet.compare(probes)
    # DEL while a lease pins pages of the namespace: to lookups (and to the indexer) all of it is gone.
    pinned = stems[2]
    fleet.store("tenant-a", pinned)
    reader = redis.Redis(*fleet.daemon.address, protocol=2)
    assert reader.execute_command("PFXGET", "tenant-a", "TOKENS", *pinned)[1] == len(pinned)
    assert fleet.r.delete("tenant-a") == 1
    assert fleet.matched("tenant-a", pinned) == 0
    fleet.compare(probes + [("tenant-a", pinned)])
    reader.close()

    # FLUSHALL while a lease pins one prompt: the indexer is cleared, then told of what stayed.
    kept = stems[1]
    fleet.store("tenant-c", kept)
    holder = redis.Redis(*fleet.daemon.address, protocol=2)
    assert holder.execute_command("PFXGET", "tenant-c", "TOKENS", *kept)[1] == len(kept)
    fleet.r.execute_command("FLUSHALL")
    assert fleet.matched("tenant-c", kept) == len(kept)
    fleet.compare(probes + [("tenant-c", kept)])
    holder.close()  # the lease ends with its connection
    for ns, ids in prompts_from(rng, stems, 30):
        fleet.store(ns, ids)
    fleet.compare(probes)


def test_indexer_catches_up_through_the_replay_socket(fleet):
    rng = random.Random(61)
    stems = [[rng.randrange(50) for _ in range(PAGE * rng.randint(2, 6))] for _ in range(8)]
    probes = prompts_from(rng, stems, 120)
    for ns, ids in prompts_from(rng, stems, 30):
        fleet.store(ns, ids)
    fleet.compare(probes)
    # The indexer goes away; the daemon keeps storing, evicting and flushing meanwhile.
    fleet.indexer.stop()
    for ns, ids in prompts_from(rng, stems, 60):
        fleet.store(ns, ids)
    fleet.r.execute_command("PFXEVICT", "tenant-a", "ALL")
    for ns, ids in prompts_from(rng, stems, 20):
        fleet.store(ns, ids)
    replays = fleet.r.info("kvevents")["kv_events_replay_requests"]
    # A new indexer joins at the current sequence number: it sees the gap and asks the replay socket.
    fleet.start_indexer()
    fleet.compare(probes)
    assert fleet.r.info("kvevents")["kv_events_replay_requests"] > replays
    assert "Gap detected" in fleet.indexer.log()


def test_indexer_recovers_a_gap_in_the_live_stream(tmp_path):
    """The indexer stops reading (SIGSTOP) while far more is published than ZMQ queues for it
    (kv-events-hwm 10 batches) and the sockets buffer (~44 MiB against a few): its PUB pipe drops,
    so on SIGCONT it sees the sequence jump, asks the replay socket for the batches it lost, and
    ends up where PFXGET is."""
    page = 16
    fleet = Fleet(tmp_path, page, 1024, "--kv-events-hwm", "10")
    try:
        fleet.start_indexer()
        rng = random.Random(7)
        stems = [[rng.randrange(50) for _ in range(page * 4)] for _ in range(4)]
        fleet.store("tenant-a", stems[0])
        fleet.compare([("tenant-a", stems[0])])
        os.kill(fleet.indexer.proc.pid, signal.SIGSTOP)
        try:
            # ~2000 x 20 KiB of BlockStored (4096 token ids each) plus their BlockRemoved.
            recent = []
            for i in range(2000):
                ids = [i + 100] + [rng.randrange(2**31) for _ in range(4095)]
                fleet.store("tenant-a", ids)
                recent = (recent + [ids])[-5:]
            wait_for(lambda: fleet.r.info("kvevents")["kv_events_queue_length"] == 0, 60, "the queue to drain")
        finally:
            os.kill(fleet.indexer.proc.pid, signal.SIGCONT)
        for stem in stems:
            fleet.store("tenant-b", stem)
        probes = [(ns, stem[: rng.randint(1, len(stem))]) for ns in ("tenant-a", "tenant-b") for stem in stems]
        probes += [("tenant-a", ids[: rng.randint(1, len(ids))]) for ids in recent]
        fleet.compare(probes)
        gaps = [int(m) for m in re.findall(r"Gap detected: expected seq (\d+)", fleet.indexer.log())]
        assert any(seq > 0 for seq in gaps), "no gap in the live stream: nothing was dropped for the indexer"
        assert fleet.r.info("kvevents")["kv_events_replay_requests"] >= 1
    finally:
        fleet.stop()

