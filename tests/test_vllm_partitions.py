"""The connector in real vLLM engines on a daemon with per-tenant arena partitions, over its unix socket.

A tenant's two engines (vLLM's own prefix caching off, so every cached token
came through pfxcache) share a system prompt through the tenant's partition:
the workers map it through PFXATTACH (the arena has no file to open), the
pages are allocated in it (PFXALLOC) and written and read zero-copy, and the
second engine's greedy tokens equal a reference engine's without the cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest
import redis
from support import wait_for
from vllm_support import PAGE, check, daemon_for, info, start_engines, tiny_model

pytestmark = pytest.mark.timeout(1800)

SYSTEM = np.random.default_rng(17).integers(3, 500, 3 * PAGE).tolist()    # 3 pages


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model = tiny_model(tmp_path_factory)
    sock_dir = tempfile.mkdtemp(prefix="pfx-vllm-part-")
    path = os.path.join(sock_dir, "pfx.sock")
    daemon = daemon_for(model, "--arena-partition", "tenant:* 8mb", "--unixsocket", path)
    admin = redis.Redis(host=daemon.host, port=daemon.port)
    admin.execute_command("ACL", "SETUSER", "tenant", "on", ">s3cret", "~tenant:*", "+@pfx", "+hello", "+ping")
    url = f"unix://tenant:s3cret@{path}"
    extra = {"pfxcache_namespace": "tenant:tiny"}
    try:
        ref, a, b = start_engines(dict(model=model), dict(model=model, url=url, extra=extra),
                                  dict(model=model, url=url, extra=extra))
    except Exception:
        daemon.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)
        raise
    yield {"daemon": daemon, "admin": admin, "ref": ref, "a": a, "b": b}
    for engine in (ref, a, b):
        engine.stop()
    daemon.stop()
    shutil.rmtree(sock_dir, ignore_errors=True)


def test_a_tenant_shares_pages_zero_copy_through_its_partition(setup):
    daemon, admin, ref, a, b = setup["daemon"], setup["admin"], setup["ref"], setup["a"], setup["b"]
    prompt = SYSTEM + np.random.default_rng(18).integers(3, 500, 20).tolist()
    expected = ref.generate([prompt])["outputs"][0]["tokens"]
    assert a.generate([prompt])["outputs"][0]["tokens"] == expected     # A computes and stores 3 pages
    wait_for(lambda: info(daemon)["pfxcache_active_leases"] == 0, 30, "A's leases to end")
    allocs = admin.info("commandstats").get("cmdstat_pfxalloc", {}).get("calls", 0)
    assert allocs >= 1, "the pages did not go through the partition (PFXALLOC): over RESP?"
    assert admin.execute_command("PFXINFO", "tenant:tiny")     # stored in the tenant's namespace

    got = b.generate([prompt])["outputs"][0]
    assert got["cached"] == 3 * PAGE and got["tokens"] == expected
    assert got["pfxcache"]["loaded_tokens"] == 3 * PAGE
    wait_for(lambda: info(daemon)["pfxcache_active_leases"] == 0, 30, "B's leases to end")
    assert check(daemon) == b"OK"
