"""Mooncake Store on CPU as a peer of scripts/bench: a worker's lookup + KV fetch, side by side with pfxcache.

The job, on both: a worker has a 4,096-token prompt whose KV (256 pages of 16
tokens, 64 KiB each: 16 MiB) is cached, finds how much of it is cached and
fetches those bytes into its own page-aligned buffer.

* **Mooncake** (``mooncake-transfer-engine-non-cuda`` from PyPI, in its own venv
  under ``scripts/out/peers/mooncake-venv`` that ``scripts/setup mooncake`` makes,
  never a dependency of pfxcache):
  ``mooncake_master`` with its built-in HTTP metadata server, a holder client
  that mounts a segment and puts the 256 chunks under their hash-chain keys,
  and a reader client (TCP transport, the CPU build's) that runs
  ``batch_is_exist`` over the chunk keys and ``batch_get_into`` a registered
  buffer. Each is its own process, as deployed.
* **pfxcache**: the daemon (``--block-bytes 64kb``) holds the pages; the reader
  runs ``PrefixCache.lookup`` (PFXGET with a lease), ``arena.read_into`` from
  the mapped arena into a :func:`kv_buffer`, and releases the lease.

Latency is per lookup + fetch (median, p99), throughput the bytes fetched per
second by one reader doing that back to back. Both readers verify the bytes.
The Mooncake CPU build links libibverbs (Debian's ``libibverbs1``, which
``scripts/setup mooncake`` installs too). This module installs nothing: it finds
the peer's venv and says which setup command is missing when it is not there.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np

from pfxcache.testing import free_port
from pfxcache.tools.common import OUT

PACKAGE = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
SETUP = "scripts/setup mooncake"  # what makes venv_dir() with PACKAGE and numpy, and installs libibverbs1
CHUNKS = 256
CHUNK_BYTES = 64 * 1024
PAGE_TOKENS = 16


class PeerUnavailable(Exception):
    """Mooncake cannot run here; the message says why."""


def venv_dir() -> Path:
    """The peer's own venv (``scripts/setup mooncake``)."""
    return OUT / "peers" / "mooncake-venv"


def _python() -> Path:
    return venv_dir() / "bin" / "python"


def locate() -> Path:
    """The mooncake_master binary of the peer's venv (PeerUnavailable naming the setup when it cannot run)."""
    python = _python()
    if not python.exists():
        raise PeerUnavailable(f"the Mooncake peer's venv is not at {venv_dir()}: run {SETUP}")
    probe = subprocess.run([str(python), "-c", "import mooncake, numpy, os; print(os.path.dirname(mooncake.__file__))"],
                           capture_output=True, text=True)
    if probe.returncode:
        raise PeerUnavailable(f"{venv_dir()} cannot import mooncake and numpy: run {SETUP} "
                              f"({(probe.stderr or probe.stdout).strip()[-200:]})")
    master = Path(probe.stdout.strip()) / "mooncake_master"
    if not master.exists():
        raise PeerUnavailable(f"{PACKAGE} has no mooncake_master binary at {master}")
    missing = _missing_libraries(master)
    if missing:
        raise PeerUnavailable(f"mooncake_master needs {', '.join(missing)} (Debian: libibverbs1): run {SETUP}")
    return master


def _missing_libraries(binary: Path) -> list[str]:
    done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    return [line.split()[0] for line in done.stdout.splitlines() if "not found" in line]


def _summary(times: list[float], nbytes: int) -> dict:
    arr = np.array(times)
    return {"calls": len(times), "p50_ms": float(np.percentile(arr, 50) * 1e3),
            "p99_ms": float(np.percentile(arr, 99) * 1e3), "mean_ms": float(arr.mean() * 1e3),
            "gb_per_s": nbytes / float(arr.mean()) / 1e9, "bytes": nbytes}


def run_mooncake(seconds: float, chunks: int = CHUNKS, chunk_bytes: int = CHUNK_BYTES, *,
                 calls: int = 5, times: bool = False) -> dict:
    """Master + holder + reader on loopback; the reader's figures (``chunks`` objects of ``chunk_bytes``,
    fetched back to back for ``seconds`` and at least ``calls`` + 1 times: the first call is not counted);
    ``times``: with every counted call's seconds under ``"times"``."""
    master_bin = locate()
    rpc, meta, metrics, holder_port, reader_port = (free_port() for _ in range(5))
    metadata = f"http://127.0.0.1:{meta}/metadata"
    master_addr = f"127.0.0.1:{rpc}"
    logs = OUT / "peers" / "mooncake-logs"
    logs.mkdir(parents=True, exist_ok=True)
    worker = str(Path(__file__).with_name("mooncake_worker.py"))
    procs: list[subprocess.Popen] = []
    try:
        with open(logs / "master.log", "w") as log:
            procs.append(subprocess.Popen(
                [str(master_bin), f"--rpc_port={rpc}", "--rpc_address=127.0.0.1", "--enable_http_metadata_server=true",
                 f"--http_metadata_server_port={meta}", "--http_metadata_server_host=127.0.0.1",
                 f"--metrics_port={metrics}", "--metrics_host=127.0.0.1"], stdout=log, stderr=subprocess.STDOUT))
        _wait_port(rpc, procs[0], logs / "master.log")
        _wait_port(meta, procs[0], logs / "master.log")
        with open(logs / "holder.log", "w") as log:
            holder = subprocess.Popen(
                [str(_python()), worker, "holder", master_addr, metadata, f"127.0.0.1:{holder_port}", str(chunks),
                 str(chunk_bytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        procs.append(holder)
        line = holder.stdout.readline().strip()
        if line != "ready":
            raise PeerUnavailable(f"the Mooncake holder did not get ready ({line!r}; see {logs / 'holder.log'})")
        with open(logs / "reader.log", "w") as log:
            done = subprocess.run(
                [str(_python()), worker, "reader", master_addr, metadata, f"127.0.0.1:{reader_port}", str(chunks),
                 str(chunk_bytes), str(seconds), str(calls + 1)], stdout=subprocess.PIPE, stderr=log, text=True, timeout=300)
        if done.returncode:
            raise PeerUnavailable(f"the Mooncake reader failed (see {logs / 'reader.log'})")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if result["chunks"] != chunks or not result["intact"]:
            raise RuntimeError(f"Mooncake fetched {result['chunks']} chunks, intact={result['intact']}")
        summary = _summary(result["times"][1:], result["bytes"])  # the first call sets up connections
        if times:
            summary["times"] = result["times"][1:]
        return summary
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                if proc.stdin:
                    proc.stdin.close()
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeerUnavailable(f"mooncake_master exited with {proc.returncode} (see {log})")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise PeerUnavailable(f"mooncake_master did not listen on {port} within {timeout:.0f} s (see {log})")


def run_pfxcache(seconds: float) -> dict:
    """The daemon holds the same 256 pages; one reader: lookup (lease), read_into a kv_buffer, release."""
    from pfxcache.client import PrefixCache, kv_buffer
    from pfxcache.testing import start_daemon

    daemon = start_daemon("--block-bytes", "64kb", "--maxmemory", "64mb", "--page-size", str(PAGE_TOKENS))
    try:
        tokens = np.arange(1000, 1000 + CHUNKS * PAGE_TOKENS, dtype="<u4")
        data = np.random.default_rng(1).integers(0, 256, CHUNKS * CHUNK_BYTES, dtype=np.uint8)
        cache = PrefixCache(f"redis://{daemon.host}:{daemon.port}/0")
        try:
            cache.store("peer", tokens, data)
            cache.attach()
            out = kv_buffer((CHUNKS, CHUNK_BYTES))
            times: list[float] = []
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline or len(times) < 5:
                start = time.perf_counter()
                with cache.lookup("peer", tokens) as match:
                    cache.arena.read_into(match.blocks, out[: len(match.blocks)])
                times.append(time.perf_counter() - start)
                matched = match.matched_tokens
            if matched != CHUNKS * PAGE_TOKENS or not np.array_equal(out.reshape(-1), data):
                raise RuntimeError(f"pfxcache matched {matched} tokens; bytes intact: "
                                   f"{np.array_equal(out.reshape(-1), data)}")
        finally:
            cache.close()
    finally:
        daemon.stop()
    return _summary(times[1:], CHUNKS * CHUNK_BYTES)


def compare(seconds: float = 1.0, repeat: int = 3) -> dict:
    """Median of ``repeat`` alternating runs of each; raises PeerUnavailable when Mooncake cannot run."""
    locate()
    ours, theirs = [], []
    for _ in range(repeat):
        theirs.append(run_mooncake(seconds))
        ours.append(run_pfxcache(seconds))
    row = {"pfxcache": _median_run(ours), "mooncake": _median_run(theirs), "runs": repeat}
    row["latency_ratio"] = row["mooncake"]["p50_ms"] / row["pfxcache"]["p50_ms"]
    row["throughput_ratio"] = row["pfxcache"]["gb_per_s"] / row["mooncake"]["gb_per_s"]
    return row


def _median_run(runs: list[dict]) -> dict:
    """The run with the median p50 latency."""
    return sorted(runs, key=lambda r: r["p50_ms"])[len(runs) // 2]


def report(row: dict) -> list[str]:
    lines = [f"worker lookup + KV fetch of a {CHUNKS * PAGE_TOKENS:,}-token prompt ({CHUNKS} pages x "
             f"{CHUNK_BYTES // 1024} KiB = {CHUNKS * CHUNK_BYTES >> 20} MiB), one reader, median of {row['runs']} runs",
             f"{'system':<50}{'p50 ms':>9}{'p99 ms':>9}{'GB/s':>8}{'calls':>8}"]
    lines.append("-" * len(lines[-1]))
    for name, label in (("pfxcache", "pfxcache: PFXGET + read_into (shm arena)"),
                        ("mooncake", "Mooncake Store: batch_is_exist + get_into (TCP)")):
        r = row[name]
        lines.append(f"{label:<50}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{r['gb_per_s']:>8.2f}{r['calls']:>8}")
    lines.append(f"pfxcache vs Mooncake: latency {row['latency_ratio']:.1f}x lower, throughput "
                 f"{row['throughput_ratio']:.1f}x higher")
    return lines
