"""scripts/fleet: the fleet replay runs end to end on real daemons (and, with --shared-tier, a real
Redis Cluster and Dynamo's indexer) in a tiny configuration, and reports in the shape --json promises.
No figure is judged beyond what must hold whatever the machine."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from pfxcache.tools import fleet
from pfxcache.tools.kv_indexer import indexer_installed

REQUESTS = 60
TINY = ["--requests", str(REQUESTS), "--capacity", "400", "--json", "--quiet", "--no-plot"]

needs_trace = pytest.mark.skipif(not fleet.TRACE.exists(), reason=f"no trace at {fleet.TRACE}")
needs_indexer = pytest.mark.skipif(not indexer_installed(), reason="Dynamo's indexer: scripts/setup test")


def run(*argv: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert fleet.main([*argv, *TINY]) == 0
    return json.loads(out.getvalue())


@needs_trace
@needs_indexer
def test_the_routers_replay_the_same_requests():
    doc = run("--routers", "kv-aware,round-robin")
    rows = {row["router"]: row for row in doc["results"]}
    assert set(rows) == {"kv-aware", "round-robin"}
    assert rows["round-robin"]["requests_per_host"] == [20, 20, 20]
    assert len({row["input_tokens"] for row in rows.values()}) == 1
    assert all(0 <= row["hit_tokens"] <= row["input_tokens"] for row in rows.values())


@needs_trace
@needs_indexer
def test_shared_tier_compares_one_daemon_the_fleet_and_the_fleet_over_a_cluster():
    setups = ["one", "round-robin", "round-robin+shared", "round-robin+back", "kv-aware+shared"]
    # A generous timeout: on a busy machine a late fetch would be a miss, and this test judges no timing.
    doc = run("--shared-tier", "--setups", ",".join(setups), "--remote-timeout-ms", "5000")
    rows = {row["setup"]: row for row in doc["results"]}
    assert list(rows) == setups and doc["skipped"] == []
    assert len({row["input_tokens"] for row in rows.values()}) == 1
    assert rows["one"]["requests_per_host"] == [REQUESTS] and rows["one"]["capacity_pages"] == 1200
    assert rows["round-robin"]["capacity_pages"] == 1200 and "shared_tier" not in rows["round-robin"]
    for name in ("round-robin+shared", "round-robin+back", "kv-aware+shared"):
        tier = rows[name]["shared_tier"]
        assert tier["write"] == ("back" if name.endswith("back") else "through")
        assert tier["pages_writes"] > 0 and tier["cluster_keys"] > 0
        assert tier["drops"] == tier["verify_failures"] == tier["fetches_late"] == 0
    # Write-through: what one host stored is in the cluster before the next request, so round-robin
    # hosts find each other's pages: hits served from the cluster, at least the RAM-only fleet's rate.
    shared = rows["round-robin+shared"]
    assert shared["shared_tier"]["pages_hits"] > 0
    assert shared["shared_tier"]["cluster_keys"] == shared["shared_tier"]["pages_writes"]
    assert shared["hit_rate"] >= rows["round-robin"]["hit_rate"]


@needs_trace
def test_shared_tier_without_redis_server_says_how_to_install_it():
    env = dict(os.environ, PFXCACHE_REDIS_SERVER="/nonexistent/redis-server")
    result = subprocess.run([sys.executable, "-m", "pfxcache.tools.fleet", "--shared-tier", *TINY],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and "scripts/setup redis" in result.stderr, result.stderr
