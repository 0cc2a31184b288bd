"""Soak: many concurrent clients under memory pressure, abrupt disconnects, killed workers, killed daemons.

Bounded in time and count, loopback only. At the end of the mixed load every
lease is gone, the arena's blocks are all either free or cached, PFXCHECK
passes and the daemon's RSS stayed bounded. Then the daemon itself is killed
with SIGKILL mid-load (it restarts cleanly on the same arena name) and stopped
with SIGTERM under load (in-flight commands finish, exit code 0, within its
deadline).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pfxcache.testing import encode_command, start_daemon

PS = 4
BB = 256
#: 256 blocks of 256 bytes: the load below wants far more, so eviction and OOM run all the time.
ARGS = ("--page-size", str(PS), "--block-bytes", str(BB), "--maxmemory", "64kb", "--maxclients", "1000",
        "--shutdown-timeout", "5")
CLIENTS = 150
LOAD_SECONDS = 8.0
PROMPTS = [[random.Random(seed).randrange(50_000) for _ in range(64)] for seed in range(12)]

WORKER = r"""
import json, socket, sys
import redis
r = redis.Redis(host=sys.argv[1], port=int(sys.argv[2]), protocol=2)
held = []
for i in range(3):
    try:
        reply = r.execute_command("PFXALLOC", "w%s" % sys.argv[3], 2)
        held.append(int(reply[1]))
    except redis.ResponseError:
        pass
print(json.dumps(held), flush=True)
sys.stdin.read()
"""


def _flat(reply) -> dict:
    if isinstance(reply, dict):
        return {k.decode() if isinstance(k, bytes) else k: v for k, v in reply.items()}
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


def pfxstats(r: redis.Redis) -> dict:
    return _flat(_flat(r.execute_command("PFXINFO"))["stats"])


def _tokens(rng: random.Random) -> list[str]:
    prompt = rng.choice(PROMPTS)
    return [str(t) for t in prompt[: rng.randrange(1, len(prompt) + 1)]]


def _well_behaved(address, seed: int, stop: threading.Event, counts: dict, errors: list) -> None:
    rng = random.Random(seed)
    r = redis.Redis(host=address[0], port=address[1], protocol=2, socket_timeout=20,
                    retry=Retry(NoBackoff(), 0))  # a killed daemon ends the client at once
    namespace = f"ns{seed % 7}"
    try:
        while not stop.is_set():
            op = rng.random()
            try:
                if op < 0.35:
                    tokens = _tokens(rng)
                    data = bytes([seed % 256]) * ((len(tokens) // PS) * BB)
                    r.execute_command("PFXSET", namespace, "TOKENS", *tokens, "DATA", data)
                elif op < 0.7:
                    reply = _flat(r.execute_command("PFXGET", namespace, "TOKENS", *_tokens(rng),
                                                    *(["WITHDATA"] if rng.random() < 0.3 else [])))
                    if reply["lease"]:
                        r.execute_command("PFXRELEASE", reply["lease"])
                elif op < 0.85:
                    reply = _flat(r.execute_command("PFXALLOC", namespace, rng.randrange(1, 8), "TTL", 2000))
                    if rng.random() < 0.8:
                        r.execute_command("PFXRELEASE", reply["lease"])
                    else:
                        # Left for the connection's end to release: an expired lease of a live
                        # connection is fenced (its blocks stay out until the owner lets go).
                        r.connection_pool.disconnect()
                else:
                    r.execute_command("PFXEVICT", namespace, "PAGES", rng.randrange(1, 10))
                counts["ok"] += 1
            except redis.exceptions.OutOfMemoryError:  # -OOM under pressure is expected, nothing else
                counts["refused"] += 1
            except redis.ResponseError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # pragma: no cover - reported by the test
        errors.append(f"client {seed}: {exc!r}")
    finally:
        r.close()


def _abrupt(address, seed: int, stop: threading.Event, counts: dict, errors: list) -> None:
    """Connect, hold a lease or two, send half a command (a half-sent bulk string) and vanish."""
    rng = random.Random(seed)
    while not stop.is_set():
        try:
            sock = socket.create_connection(address, timeout=10)
            sock.sendall(encode_command("PFXALLOC", f"ab{seed % 5}", rng.randrange(1, 4)))
            sock.recv(4096)
            tokens = _tokens(rng)
            request = encode_command("PFXSET", f"ab{seed % 5}", "TOKENS", *tokens, "DATA",
                                     b"z" * ((len(tokens) // PS) * BB))
            sock.sendall(request[: rng.randrange(1, len(request))])
            if rng.random() < 0.5:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
            sock.close()
            counts["abrupt"] += 1
        except OSError as exc:
            errors.append(f"abrupt {seed}: {exc!r}")
        time.sleep(rng.random() * 0.05)


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _run_load(address, seconds: float, clients: int, abrupt: int = 0):
    stop = threading.Event()
    counts = {"ok": 0, "refused": 0, "abrupt": 0}
    errors: list[str] = []
    threads = [threading.Thread(target=_well_behaved, args=(address, i, stop, counts, errors), daemon=True)
               for i in range(clients)]
    threads += [threading.Thread(target=_abrupt, args=(address, 1000 + i, stop, counts, errors), daemon=True)
                for i in range(abrupt)]
    for thread in threads:
        thread.start()
    return stop, threads, counts, errors


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.parametrize("policy", ["hybrid", "tempo", "guard"])
def test_soak_mixed_load_with_abrupt_clients_and_killed_workers(policy):
    daemon = start_daemon(*ARGS, "--maxmemory-policy", policy)
    try:
        r = redis.Redis(host=daemon.host, port=daemon.port, protocol=2)
        rss_before = _rss_bytes(daemon.proc.pid)
        stop, threads, counts, errors = _run_load(daemon.address, LOAD_SECONDS, CLIENTS - 20, abrupt=20)
        workers = []
        held_by_workers: list[int] = []
        rss_peak = 0
        started = time.monotonic()

        def enough() -> bool:  # the load's length, and what it must have done (a slow machine takes longer)
            return (time.monotonic() - started >= LOAD_SECONDS and len(workers) >= 5
                    and counts["ok"] > 1000 and counts["abrupt"] > 50)

        while not enough() and time.monotonic() - started < 6 * LOAD_SECONDS:
            # Worker processes that take leases and are killed with SIGKILL while holding them.
            worker = subprocess.Popen([sys.executable, "-c", WORKER, daemon.host, str(daemon.port),
                                       str(len(workers))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            held_by_workers.extend(json.loads(worker.stdout.readline() or "[]"))
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
            workers.append(worker)
            rss_peak = max(rss_peak, _rss_bytes(daemon.proc.pid))
            time.sleep(0.3)
        stop.set()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads)
        assert not errors, errors[:10]
        assert counts["ok"] > 1000 and counts["abrupt"] > 50 and len(workers) >= 5, (counts, len(workers))
        assert held_by_workers, "no worker held a lease when it was killed"
        print(f"soak: {counts}, {len(workers)} workers killed holding {len(held_by_workers)} leases, "
              f"rss {rss_before >> 20} -> peak {rss_peak >> 20} MiB")
        assert daemon.proc.poll() is None

        # Every connection is gone: so is every lease, and every block is free or cached.
        assert _wait(lambda: pfxstats(r)["leases"] == 0, 10), pfxstats(r)
        s = pfxstats(r)
        assert s["blocks_free"] + s["blocks_cached"] == s["blocks_total"], s
        assert s["blocks_leased"] == 0 and s["inserts_in_progress"] == 0 and s["pinned_pages"] == 0, s
        assert r.execute_command("PFXCHECK") == b"OK"
        if policy == "guard":  # the load had its reuse expert learn something, and the store stayed consistent
            assert r.info("pfxcache")["pfxcache_reuse_median_gap_ticks"] > 0
        assert r.info("clients")["connected_clients"] == 1
        # RSS bounded: a 64 KiB arena and a few hundred connections do not grow the daemon by much.
        assert rss_peak - rss_before < 150 * 2**20, (rss_before, rss_peak)
        assert _rss_bytes(daemon.proc.pid) - rss_before < 150 * 2**20
        r.close()
    finally:
        assert daemon.stop() == 0, daemon.log_text()[-3000:]


def test_sigkill_mid_load_then_a_clean_restart():
    name = "pfxsoak" + uuid.uuid4().hex[:8]

    def ours():
        return sorted(f for f in os.listdir("/dev/shm") if f.startswith(name + "-"))

    daemon = start_daemon(*ARGS, "--arena-name", name)
    stop, threads, counts, errors = _run_load(daemon.address, 2.0, 40, abrupt=5)
    time.sleep(1.5)
    t0 = time.monotonic()
    daemon.stop(signal.SIGKILL)
    stop.set()
    for thread in threads:
        thread.join(30)
    print(f"sigkill: {counts}, threads ended {time.monotonic() - t0:.1f}s after the kill")
    assert counts["ok"] > 0
    # The arena is a sealed memfd (issue 12): a SIGKILLed daemon leaves no file behind.
    stale = ours()
    assert stale == []
    restarted = start_daemon(*ARGS, "--arena-name", name)
    try:
        assert ours() == []
        r = redis.Redis(host=restarted.host, port=restarted.port, protocol=2)
        assert r.ping()
        r.execute_command("PFXSET", "again", "TOKENS", 1, 2, 3, 4, "DATA", b"a" * BB)
        assert _flat(r.execute_command("PFXGET", "again", "TOKENS", 1, 2, 3, 4, "NOLEASE"))["matched"] == 4
        assert r.execute_command("PFXCHECK") == b"OK"
        r.close()
    finally:
        assert restarted.stop() == 0
        for leftover in stale:
            if os.path.exists(f"/dev/shm/{leftover}"):
                os.unlink(f"/dev/shm/{leftover}")
    assert ours() == []


def test_sigterm_under_load_finishes_in_flight_commands_and_exits_zero():
    daemon = start_daemon(*ARGS)
    replies = {"complete": 0, "cut": 0}
    bad: list[bytes] = []

    def pipeliner(seed: int) -> None:
        # Raw pipelines of PFXSET + PFXGET WITHDATA: whatever was answered must be whole replies.
        import hiredis

        rng = random.Random(seed)
        try:
            sock = socket.create_connection(daemon.address, timeout=15)
        except OSError:
            return
        reader = hiredis.Reader()
        try:
            while True:
                tokens = _tokens(rng)
                batch = (encode_command("PFXSET", f"t{seed % 3}", "TOKENS", *tokens, "DATA",
                                        b"q" * ((len(tokens) // PS) * BB))
                         + encode_command("PFXGET", f"t{seed % 3}", "TOKENS", *tokens, "NOLEASE", "WITHDATA"))
                sock.sendall(batch)
                got = 0
                while got < 2:
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        raise ConnectionError
                    reader.feed(chunk)
                    while reader.gets() is not False:
                        got += 1
                        replies["complete"] += 1
        except OSError:
            replies["cut"] += 1
        except hiredis.ProtocolError as exc:
            bad.append(repr(exc).encode())
        finally:
            if reader.has_data():
                bad.append(b"partial reply at close")
            sock.close()

    threads = [threading.Thread(target=pipeliner, args=(i,), daemon=True) for i in range(60)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    assert _wait(lambda: replies["complete"] > 100, 30), replies  # the pipelines are flowing (a slow machine: later)
    started = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    code = daemon.proc.wait(5 + 5)  # shutdown-timeout 5 plus a margin
    elapsed = time.monotonic() - started
    for thread in threads:
        thread.join(10)
    assert code == 0, daemon.log_text()[-3000:]
    assert elapsed < 5 + 2, elapsed
    assert not bad, bad[:5]
    assert "ready to exit, bye bye" in daemon.log_text()
