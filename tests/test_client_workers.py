"""Several real worker processes sharing one pfxcached through the client library.

Each worker is a separate Python process running a small script with
``pfxcache.client`` (as an inference worker would); the test process only
starts them, reads what they print, and checks the daemon with a plain
redis-py connection. Every scenario runs twice: through the shared-memory
arena (``attach`` by default, on loopback) and over RESP only (``attach=False``).
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys

import numpy as np
import pytest
import redis
from support import python_env, wait_for

PS = 4
BB = 4096
SMALL = ("--page-size", str(PS), "--block-bytes", str(BB), "--evict-low-watermark", "0")

WORKER = r'''
import hashlib, json, sys
import numpy as np
from pfxcache.client import PrefixCache

url, role, attach, namespace, seed, pages = sys.argv[1:7]
attach = None if attach == "auto" else False
seed, pages = int(seed), int(pages)
BB = int(sys.argv[7])
tokens = list(range(seed, seed + pages * 4))
cache = PrefixCache.from_url(url, attach=attach)
out = {"attached": cache.attached, "via": cache.via}

if role == "write":
    data = np.random.default_rng(seed).integers(0, 256, pages * BB, dtype=np.uint8)
    if cache.attached:
        # The worker's own path through the arena: alloc, one vectorised write, commit.
        with cache.alloc(namespace, pages) as allocation:
            cache.arena.write_from(allocation.blocks, data)
            result = cache.commit(namespace, tokens, allocation.blocks)
    else:
        result = cache.save(namespace, tokens, data)
    out.update(stored=result.stored, blocks=result.blocks, result_via=result.via)

elif role == "read":
    kv = np.zeros(pages * BB, np.uint8)
    with cache.lookup(namespace, tokens) as match:  # with_data=None: bytes over RESP only if not attached
        out.update(matched=match.matched_tokens, data_is_none=match.data is None, match_via=match.via)
        if cache.attached:
            cache.arena.read_into(match.blocks, kv)
        else:
            kv[: len(match.data)] = np.frombuffer(match.data, np.uint8)
    out["sha"] = hashlib.sha256(kv.tobytes()).hexdigest()

elif role == "hold":
    # Take a read lease and an alloc lease, report them, then wait to be killed.
    match = cache.lookup(namespace, tokens)
    allocation = cache.alloc(namespace, int(sys.argv[8]))
    if cache.attached:
        cache.arena.write_from(allocation.blocks, np.ones(len(allocation.blocks) * BB, np.uint8))
    out.update(read_lease=match.lease, alloc_lease=allocation.lease, matched=match.matched_tokens,
               alloc_blocks=allocation.blocks)
    print(json.dumps(out), flush=True)
    sys.stdin.read()  # blocks until the test kills us
    raise SystemExit(3)

print(json.dumps(out), flush=True)
cache.close()
'''


def _key(k):
    return k.decode() if isinstance(k, bytes) else k


def as_map(reply) -> dict:
    if isinstance(reply, dict):
        return {_key(k): v for k, v in reply.items()}
    return {_key(reply[i]): reply[i + 1] for i in range(0, len(reply), 2)}


def stats(r: redis.Redis, namespace=None) -> dict:
    reply = as_map(r.execute_command("PFXINFO", *([namespace] if namespace is not None else [])))
    return as_map(reply["stats"])


def net_out(r: redis.Redis) -> int:
    return int(r.info("stats")["total_net_output_bytes"])


def pattern_sha(seed: int, pages: int) -> str:
    data = np.random.default_rng(seed).integers(0, 256, pages * BB, dtype=np.uint8)
    return hashlib.sha256(data.tobytes()).hexdigest()


def worker_args(daemon, role: str, attach: str, namespace: str, seed: int, pages: int, *extra) -> list[str]:
    url = f"redis://{daemon.host}:{daemon.port}/0"
    return [sys.executable, "-c", WORKER, url, role, attach, namespace, str(seed), str(pages), str(BB), *extra]


def run_worker(daemon, *args) -> dict:
    proc = subprocess.run(worker_args(daemon, *args), capture_output=True, text=True, timeout=60,
                          env=python_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def daemon(fresh_daemon):
    """A fresh daemon per test: 64 blocks of 4 KiB, pages of 4 tokens."""
    return fresh_daemon("--maxmemory", str(64 * BB), *SMALL)


@pytest.fixture
def probe(daemon):
    r = redis.Redis(host=daemon.host, port=daemon.port, protocol=3, socket_timeout=30)
    yield r
    r.close()


@pytest.mark.parametrize("attach", ["auto", "off"])
def test_writer_and_reader_workers(daemon, probe, attach):
    pages, seed = 32, 1234  # 128 KiB of KV bytes
    size = pages * BB
    wrote = run_worker(daemon, "write", attach, "shared", seed, pages)
    assert wrote["stored"] == pages and len(wrote["blocks"]) == pages
    if attach == "auto":
        assert (wrote["attached"], wrote["via"], wrote["result_via"]) == (True, "shm", "shm")
    else:
        assert (wrote["attached"], wrote["via"], wrote["result_via"]) == (False, "resp", "resp")

    before = net_out(probe)
    read = run_worker(daemon, "read", attach, "shared", seed, pages)
    sent = net_out(probe) - before
    assert read["matched"] == pages * PS
    assert read["sha"] == pattern_sha(seed, pages)  # the reader saw exactly the writer's bytes
    if attach == "auto":
        # Zero-copy: the reply carried block ids only; the daemon sent a few hundred bytes, not 128 KiB.
        assert read["attached"] and read["data_is_none"] and read["match_via"] is None
        assert sent < size // 16, sent
    else:
        assert not read["attached"] and not read["data_is_none"] and read["match_via"] == "resp"
        assert sent >= size, sent
    assert stats(probe)["leases"] == 0 and stats(probe)["blocks_leased"] == 0


@pytest.mark.parametrize("attach", ["auto", "off"])
def test_killed_worker_frees_its_leases(daemon, probe, attach):
    pages, seed, extra = 8, 77, 40
    run_worker(daemon, "write", attach, "kill", seed, pages)
    base = stats(probe)
    assert (base["leases"], base["blocks_leased"], base["pinned_pages"]) == (0, 0, 0)
    free = base["blocks_free"]

    proc = subprocess.Popen(worker_args(daemon, "hold", attach, "kill", seed, pages, str(extra)),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=python_env())
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        held = json.loads(line)
        assert held["read_lease"] > 0 and held["alloc_lease"] > 0 and held["matched"] == pages * PS
        assert held["attached"] == (attach == "auto")
        during = stats(probe)
        assert during["leases"] == 2 and during["blocks_leased"] == extra
        assert during["pinned_pages"] == pages and during["blocks_free"] == free - extra
        # Pinned pages survive an eviction request.
        evicted = as_map(probe.execute_command("PFXEVICT", "kill", "ALL"))
        assert (evicted["evicted"], evicted["pinned"]) == (0, pages)

        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()

    # The daemon sees the connection close and ends both leases.
    wait_for(lambda: stats(probe)["leases"] == 0, 10, "the dead worker's leases to end")
    after = stats(probe)
    assert (after["blocks_leased"], after["pinned_pages"], after["blocks_free"]) == (0, 0, free)
    # The freed blocks really are free: all of them can be allocated again, and the pages evicted.
    grab = as_map(probe.execute_command("PFXALLOC", "other", free))
    assert len(grab["blocks"]) == free and set(held["alloc_blocks"]) <= set(grab["blocks"])
    probe.execute_command("PFXRELEASE", grab["lease"])
    assert as_map(probe.execute_command("PFXEVICT", "kill", "ALL"))["evicted"] == pages
