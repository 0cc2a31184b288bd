"""The benchmark drivers that are ours (not redis-benchmark): they do the work they claim, against real servers."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from pfxcache.testing import redis_server_installed, start_daemon, start_redis_server
from pfxcache.tools import pair_load

PAGE = 16


@pytest.fixture(scope="module")
def daemon():
    d = start_daemon("--block-bytes", "1kb", "--maxmemory", "4mb", "--page-size", str(PAGE))
    yield d
    d.stop()


def test_lease_pairs_take_and_release_a_lease_each(daemon):
    tokens = np.arange(1, 1 + 8 * PAGE, dtype="<u4").tobytes()
    r = redis.Redis(daemon.host, daemon.port)
    r.execute_command("PFXSET", "pairs", "PACKED", tokens, "DATA", b"x" * 8 * 1024)
    result = pair_load.run(daemon.address, pair_load.lease_pair(b"pairs", tokens, 8 * PAGE), pairs=300, clients=6,
                           processes=2)
    assert result["pairs"] == 300 and result["pairs_per_s"] > 0
    stats = r.execute_command("PFXINFO", "pairs")[b"stats"]
    assert stats[b"leases"] == 0  # every lease taken was released
    assert stats[b"hits_tokens"] == 300 * 8 * PAGE  # 300 full hits, nothing else
    r.close()


def test_lease_pairs_stop_on_a_miss(daemon):
    tokens = np.arange(5000, 5000 + 4 * PAGE, dtype="<u4").tobytes()  # never stored: not a full hit
    # The first reply is checked before the second request is built: a miss stops the run with its reason.
    with pytest.raises(RuntimeError, match=r"^a client process failed: RuntimeError: PFXGET was not a leased full hit: "
                                           r"0 tokens$"):
        pair_load.run(daemon.address, pair_load.lease_pair(b"pairs-miss", tokens, 4 * PAGE), pairs=10, clients=2,
                      processes=1)


@pytest.mark.skipif(not redis_server_installed(), reason="redis-server is not installed")
def test_get_pairs_against_redis_server():
    server = start_redis_server()
    try:
        r = redis.Redis("127.0.0.1", server.port)
        r.set("k", b"v" * 100)
        result = pair_load.run(("127.0.0.1", server.port), pair_load.get_pair(b"k", [b"INCR", b"n"]), pairs=200,
                               clients=4, processes=2)
        assert result["pairs"] == 200 and int(r.get("n")) == 200
        r.close()
    finally:
        server.stop()
