"""The shared tier through a Redis Cluster failover: three masters with one replica each, two daemons,
a worker storing behind A and reading behind B.

A master is killed (SIGKILL) once its replica has acknowledged every page it holds (ROLE's
offsets agree), so no page is lost by chance and the test is deterministic: while the master is
down its pages are misses behind B, never a client error, and A serves them from RAM; once the
cluster has promoted the replica (its slots owned by the replica, a bounded wait) B finds them
again, and pages stored after the failover reach the promoted node and are hits too.

Skipped without redis-server and redis-cli (conftest), required where PFXCACHE_REQUIRE_REDIS_SERVER=1.
"""

from __future__ import annotations

import hashlib
import random
import signal
import struct

import pytest
import redis

from pfxcache.daemon.store.idents import chain, namespace_ident
from pfxcache.daemon.tier import remote_format
from pfxcache.testing import start_daemon
from pfxcache.testing_cluster import redis_cluster, wait_for

PAGE = 4  # tokens a page
BLOCK = 4096  # bytes a page
NS = "failover"
FAILOVER_S = 60  # bound on the replica's promotion (node timeout 2 s: seconds in practice)


def payload(tokens: list[int]) -> bytes:
    """The page's bytes: a function of the namespace and its whole prefix, so any answer can be checked."""
    seed = NS.encode() + b"\0" + struct.pack(f"<{len(tokens)}I", *tokens)
    return hashlib.shake_256(seed).digest(BLOCK)


def key(tokens: list[int]) -> bytes:
    ident = chain(namespace_ident(NS.encode()), struct.pack(f"<{len(tokens)}I", *tokens), PAGE * 4)[:16]
    return remote_format.key_of(NS.encode(), ident)


def put(r: redis.Redis, tokens: list[int]) -> None:
    r.execute_command("PFXSET", NS, "TOKENS", *tokens, "DATA", payload(tokens))


def get(r: redis.Redis, tokens: list[int]) -> int:
    """Tokens matched (a client error raises); the bytes served must be the page's own."""
    reply = r.execute_command("PFXGET", NS, "TOKENS", *tokens, "NOLEASE", "WITHDATA")
    matched = reply[b"matched"]
    assert reply.get(b"data", b"") == (payload(tokens) if matched else b""), "wrong bytes"
    return matched


def tiers(r: redis.Redis) -> dict:
    return r.info("tiers")


def one_page_prompts_by_owner(cluster, count: int, seed: int) -> dict[int, list[list[int]]]:
    rng = random.Random(seed)
    by_owner: dict[int, list[list[int]]] = {}
    for _ in range(count):
        tokens = [rng.randrange(1, 50000) for _ in range(PAGE)]
        by_owner.setdefault(cluster.owner_of(key(tokens)).port, []).append(tokens)
    return by_owner


@pytest.fixture
def daemons(tmp_path):
    started = []

    def start(url: str) -> redis.Redis:
        d = start_daemon("--dir", str(tmp_path), "--page-size", str(PAGE), "--block-bytes", str(BLOCK),
                         "--maxmemory", str(256 * BLOCK), "--remote-tier", url, "--remote-tier-write", "through")
        started.append(d)
        r = redis.Redis(host=d.host, port=d.port)
        wait_for(lambda: tiers(r)["tier_remote_state"] == "ok", "the shared tier connected")
        return r

    yield start
    for d in started:
        d.stop(signal.SIGKILL)


def test_a_killed_master_costs_misses_until_its_replica_is_promoted(tmp_path, daemons):
    with redis_cluster(tmp_path / "c", masters=3, replicas=1) as cluster:
        a, b = daemons(cluster.url()), daemons(cluster.url())
        by_owner = one_page_prompts_by_owner(cluster, 30, seed=11)
        assert len(by_owner) == 3
        for group in by_owner.values():
            for tokens in group:
                put(a, tokens)
        wait_for(lambda: tiers(a)["tier_remote_writes"] >= 30 and tiers(a)["tier_remote_queue_pages"] == 0,
                 "30 pages written")
        victim = next(node for node in cluster.master_nodes() if node.port in by_owner)
        replica = cluster.replicas_of(victim)[0]
        wait_for(lambda: cluster.replicated(victim), "the victim's replica caught up")
        lost = by_owner[victim.port]

        victim.kill(signal.SIGKILL)
        for tokens in lost:  # read before the failover can have happened (node timeout 2 s)
            assert get(b, tokens) == 0
            assert get(a, tokens) == PAGE  # A's RAM whatever the cluster does
        assert b.ping()

        wait_for(lambda: cluster.owner_of(key(lost[0])).port == replica.port, "the replica promoted", FAILOVER_S)
        cluster.wait_ok(FAILOVER_S)
        wait_for(lambda: all(get(b, tokens) == PAGE for tokens in lost), "the lost pages hits again", FAILOVER_S)
        for port, group in by_owner.items():
            if port != victim.port:
                assert all(get(b, tokens) == PAGE for tokens in group)
        info = tiers(b)
        assert info["tier_remote_verify_failures"] == 0 and info["tier_remote_hits"] == 30

        # Pages stored after the failover reach the promoted replica and are hits behind B.
        fresh = one_page_prompts_by_owner(cluster, 30, seed=12)[replica.port]
        before = tiers(a)["tier_remote_writes"]
        for tokens in fresh:
            put(a, tokens)
        wait_for(lambda: tiers(a)["tier_remote_writes"] >= before + len(fresh), "fresh pages written")
        assert all(get(b, tokens) == PAGE for tokens in fresh)
