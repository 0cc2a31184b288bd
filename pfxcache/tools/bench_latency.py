"""Read latency of pfxcached under a heavy write load, with 16 shards and with 1.

For each --shards value (default 16, then 1) a fresh pfxcached is started
(--block-bytes 64kb, --maxmemory 512mb, page 16 tokens) and pre-loaded with
--reader-prompts prompts (default 8) of --reader-pages pages each (default 64).
Then, for --duration seconds each (default 8):

  idle     one reader connection loops PFXGET key PACKED <prompt> NOLEASE over
           the cached prompts, one request at a time, nothing else running:
           the baseline.
  loaded   the same reader while --writers connections (default 4, in a
           separate process) loop PFXSET key PACKED <prompt> DATA <blob>, each
           storing --write-pages pages (default 64 x 64 KiB = 4 MiB per
           command) of a prompt whose first page is new every time, so
           writes spread over the shards like independent requests do. The
           arena (512 MiB) fills after ~128 writes; from then on every write evicts.

Reported per configuration and phase: reader requests, p50 / p99 / p99.9 /
max latency (every request timed on the client with perf_counter_ns), and the
writers' DATA throughput in MiB/s with their own p50 per command. Every reader
reply is checked to be a full hit. Ratios: loaded p99 over the same daemon's
idle p99, and shards 1 over shards 16.

Why shards matter: PFXSET holds its shard's write lock while its DATA is copied
into the arena (in a worker thread for copies of 1 MiB and more); a PFXGET of
the same shard waits for it. With one shard every read waits behind every
write in flight.

    scripts/bench-latency                         # 16 vs 1 shards, 4 writers, 8 s per phase
    scripts/bench-latency --writers 2 --duration 3
    scripts/bench-latency --json

The plot (latency CDF, log x) goes to scripts/out/bench-latency.png.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from pfxcache.client.commands import pack_tokens
from pfxcache.testing import encode_command, start_daemon
from pfxcache.tools.common import (OUT, RespConnection, command_line, machine, new_plot, pairs, progress_bar,
                                   save_plot, shown, tool_parser)

NS = b"lat"
PAGE_TOKENS = 16
MIB = 1 << 20


def prompt(tag: int, serial: int, pages: int) -> bytes:
    """Packed tokens: the first token (tag, serial) makes the first page, hence the shard, unique."""
    body = np.arange(pages * PAGE_TOKENS - 2, dtype=np.uint32) + (tag << 20)
    return pack_tokens(np.concatenate((np.array([tag, serial], np.uint32), body)))


# -- the writer process ----------------------------------------------------------------------------

def writer_process(host: str, port: int, writers: int, pages: int, block_bytes: int) -> int:
    """Run writers until a line arrives on stdin; print one JSON line of results."""
    data = (np.arange(pages * block_bytes, dtype=np.uint8) * 7).tobytes()
    stop = threading.Event()
    results: list[dict] = [{} for _ in range(writers)]
    started = threading.Barrier(writers + 1)

    def run(w: int) -> None:
        conn = RespConnection((host, port))
        latencies: list[int] = []
        sent = stored = errors = 0
        serial = 0
        first = True
        try:
            while not stop.is_set():
                serial += 1
                tokens = prompt(1000 + w, serial, pages)
                head = (b"*6\r\n$6\r\nPFXSET\r\n$%d\r\n%s\r\n$6\r\nPACKED\r\n$%d\r\n%s\r\n$4\r\nDATA\r\n$%d\r\n"
                        % (len(NS), NS, len(tokens), tokens, len(data)))
                t0 = time.perf_counter_ns()
                conn.sock.sendall(head)
                conn.sock.sendall(data)
                conn.sock.sendall(b"\r\n")
                reply = conn.reply()
                latencies.append(time.perf_counter_ns() - t0)
                if isinstance(reply, Exception):
                    errors += 1
                else:
                    sent += len(data)
                    stored += pairs(reply)["stored"]
                if first:
                    first = False
                    started.wait()
        finally:
            conn.close()
        results[w] = {"bytes": sent, "commands": len(latencies), "stored_pages": stored, "errors": errors,
                      "latencies_ns": latencies}

    threads = [threading.Thread(target=run, args=(w,), daemon=True) for w in range(writers)]
    for t in threads:
        t.start()
    started.wait()
    t_start = time.perf_counter()
    print("ready", flush=True)
    sys.stdin.readline()
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t_start
    lat = np.array([x for r in results for x in r["latencies_ns"]], dtype=np.float64) / 1e6
    out = {
        "writers": writers, "seconds": elapsed,
        "bytes": sum(r["bytes"] for r in results), "commands": sum(r["commands"] for r in results),
        "stored_pages": sum(r["stored_pages"] for r in results), "errors": sum(r["errors"] for r in results),
        "command_p50_ms": float(np.percentile(lat, 50)) if lat.size else 0.0,
        "command_p99_ms": float(np.percentile(lat, 99)) if lat.size else 0.0,
    }
    out["mib_per_s"] = out["bytes"] / MIB / elapsed
    print(json.dumps(out), flush=True)
    return 0


# -- the reader ------------------------------------------------------------------------------------

def read_loop(conn: RespConnection, requests: list[bytes], expected: int, duration: float, bar) -> tuple[np.ndarray, int]:
    """PFXGET one request at a time for ``duration`` seconds; returns (latencies in ms, misses)."""
    latencies: list[int] = []
    misses = 0
    clock = time.perf_counter_ns
    end = time.perf_counter() + duration
    next_tick = time.perf_counter() + 0.25
    i = 0
    sock, reader = conn.sock, conn.reader
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        if now >= next_tick:
            if bar is not None:
                bar.update(round(now - (next_tick - 0.25), 2))
            next_tick = now + 0.25
        t0 = clock()
        sock.sendall(requests[i % len(requests)])
        reply = reader.gets()
        while reply is False:
            reader.feed(sock.recv(65536))
            reply = reader.gets()
        latencies.append(clock() - t0)
        if isinstance(reply, Exception) or reply[1] != expected:
            misses += 1
        i += 1
    return np.array(latencies, dtype=np.float64) / 1e6, misses


def summary(lat_ms: np.ndarray) -> dict:
    return {
        "requests": int(lat_ms.size),
        "p50_ms": float(np.percentile(lat_ms, 50)),
        "p99_ms": float(np.percentile(lat_ms, 99)),
        "p999_ms": float(np.percentile(lat_ms, 99.9)),
        "max_ms": float(lat_ms.max()),
        "mean_ms": float(lat_ms.mean()),
    }


def run_config(shards: int, args: argparse.Namespace, bar) -> tuple[dict, dict[str, np.ndarray]]:
    daemon = start_daemon("--loglevel", "warning", "--shards", str(shards), "--block-bytes", str(args.block_bytes),
                          "--maxmemory", args.maxmemory, "--page-size", str(PAGE_TOKENS))
    curves: dict[str, np.ndarray] = {}
    try:
        admin = RespConnection(daemon.address)
        reads = []
        data = b"r" * (args.reader_pages * args.block_bytes)
        for k in range(args.reader_prompts):
            tokens = prompt(1, k, args.reader_pages)
            pairs(admin.call("PFXSET", NS, "PACKED", tokens, "DATA", data))
            reads.append(encode_command("PFXGET", NS, "PACKED", tokens, "NOLEASE"))
        expected = args.reader_pages * PAGE_TOKENS
        reader = RespConnection(daemon.address)
        read_loop(reader, reads, expected, 0.3, None)  # warm up
        # The store's shard function: crc32 of (namespace, first page) mod shards.
        reader_shards = sorted({zlib.crc32(prompt(1, k, 1), zlib.crc32(NS)) % shards
                                for k in range(args.reader_prompts)})
        row: dict = {"shards": shards, "reader_shards": reader_shards}

        if bar is not None:
            bar.set_postfix_str(f"shards {shards}, idle")
        lat, misses = read_loop(reader, reads, expected, args.duration, bar)
        row["idle"] = {**summary(lat), "misses": misses}
        curves["idle"] = lat

        before = pairs(pairs(admin.call("PFXINFO"))["stats"])
        proc = subprocess.Popen([sys.executable, "-m", "pfxcache.tools.bench_latency", "--writer-process", daemon.host, str(daemon.port),
                                 str(args.writers), str(args.write_pages), str(args.block_bytes)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("the writer process did not start")
            if bar is not None:
                bar.set_postfix_str(f"shards {shards}, {args.writers} writers")
            lat, misses = read_loop(reader, reads, expected, args.duration, bar)
            proc.stdin.write("stop\n")
            proc.stdin.flush()
            writers = json.loads(proc.stdout.readline())
        finally:
            if proc.poll() is None:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        after = pairs(pairs(admin.call("PFXINFO"))["stats"])
        row["loaded"] = {**summary(lat), "misses": misses}
        curves["loaded"] = lat
        writers["evicted_pages"] = after["evictions"] - before["evictions"]
        row["writers"] = writers
        row["loaded_vs_idle_p99"] = row["loaded"]["p99_ms"] / row["idle"]["p99_ms"]
        if row["idle"]["misses"] or row["loaded"]["misses"]:
            raise RuntimeError(f"reader misses with shards {shards}: {row['idle']['misses']} idle, "
                               f"{row['loaded']['misses']} loaded (reader prompts were evicted?)")
        if writers["errors"]:
            raise RuntimeError(f"{writers['errors']} PFXSET commands failed with shards {shards}")
        reader.close()
        admin.close()
    finally:
        daemon.stop()
    return row, curves


def plot(curves: dict[str, np.ndarray], path: Path, title: str) -> Path | None:
    figure = new_plot()
    if figure is None:
        return None
    fig, ax = figure
    for label, lat in curves.items():
        xs = np.sort(lat)
        ys = np.arange(1, xs.size + 1) / xs.size
        ax.plot(xs, ys, label=f"{label} (p99 {np.percentile(lat, 99):.2f} ms)",
                linestyle="--" if "idle" in label else "-")
    ax.set_xscale("log")
    ax.set_xlabel("PFXGET latency (ms, client side)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.001)
    ax.axhline(0.99, color="grey", linewidth=0.6)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    return save_plot(fig, path)


def main() -> int:
    if len(sys.argv) == 7 and sys.argv[1] == "--writer-process":
        host, port, writers, pages, block_bytes = sys.argv[2], *map(int, sys.argv[3:])
        return writer_process(host, port, writers, pages, block_bytes)
    parser = tool_parser("bench-latency", __doc__)
    parser.add_argument("--shards", default="16,1", help="comma-separated shard counts to compare (default 16,1)")
    parser.add_argument("--writers", type=int, default=4, help="writer connections (default 4)")
    parser.add_argument("--write-pages", type=int, default=64, help="pages per PFXSET (default 64)")
    parser.add_argument("--block-bytes", type=int, default=64 * 1024, help="block-bytes of the daemon (default 65536)")
    parser.add_argument("--maxmemory", default="512mb", help="maxmemory of the daemon (default 512mb: writes evict after ~1 s)")
    parser.add_argument("--reader-prompts", type=int, default=8, help="cached prompts the reader cycles over (default 8)")
    parser.add_argument("--reader-pages", type=int, default=64, help="pages per reader prompt (default 64 = 1024 tokens)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per phase (default 8)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-plot", action="store_true", help="do not write scripts/out/bench-latency.png")
    args = parser.parse_args()
    shard_list = [int(s) for s in args.shards.split(",") if s.strip()]

    total = round(2 * args.duration * len(shard_list), 2)
    bar = progress_bar(total, "measuring", "s", bar_format="{l_bar}{bar}| {n:.1f}/{total:.0f} s{postfix}")
    rows = []
    curves: dict[str, np.ndarray] = {}
    try:
        for shards in shard_list:
            if bar.disable:
                print(f"  shards {shards}: idle, then {args.writers} writers, {args.duration} s each ...",
                      file=sys.stderr, flush=True)
            row, got = run_config(shards, args, bar)
            rows.append(row)
            for phase, lat in got.items():
                curves[f"shards {shards}, {phase if phase == 'idle' else f'{args.writers} writers'}"] = lat
    finally:
        bar.close()

    ref = rows[0]
    for row in rows:
        row["p99_vs_first"] = row["loaded"]["p99_ms"] / ref["loaded"]["p99_ms"]
    command = command_line("bench-latency")
    figures_from = machine()
    write_mib = args.write_pages * args.block_bytes / MIB
    plot_path = None if args.no_plot else plot(
        curves, OUT / "bench-latency.png",
        f"{command}\nreader: PFXGET NOLEASE of {args.reader_pages} pages; writers: PFXSET of {args.write_pages} x "
        f"{args.block_bytes // 1024} KiB")
    if args.json:
        print(json.dumps({"command": command, "machine": figures_from, "settings": vars(args), "results": rows,
                          "plot": str(plot_path) if plot_path else None}, indent=2))
        return 0
    print(f"$ {command}")
    print(f"pfxcached, {figures_from['cpus']} CPUs; reader: 1 connection, PFXGET NOLEASE of {args.reader_pages}-page "
          f"prompts (hits); writers: {args.writers} connections, PFXSET of {args.write_pages} pages x "
          f"{args.block_bytes // 1024} KiB = {write_mib:g} MiB each; maxmemory {args.maxmemory}; "
          f"{args.duration:g} s per phase")
    header = (f"{'shards':>6}  {'phase':<10}{'reads':>8}{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>10}{'max ms':>9}"
              f"{'write MiB/s':>13}{'write p50 ms':>14}{'evicted':>9}")
    print(header)
    print("-" * len(header))
    for row in rows:
        for phase in ("idle", "loaded"):
            r = row[phase]
            w = row["writers"] if phase == "loaded" else None
            label = "idle" if phase == "idle" else f"{args.writers} writers"
            tail = (f"{w['mib_per_s']:>13,.0f}{w['command_p50_ms']:>14.1f}{w['evicted_pages']:>9,}" if w
                    else f"{'-':>13}{'-':>14}{'-':>9}")
            print(f"{row['shards']:>6}  {label:<10}{r['requests']:>8,}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}"
                  f"{r['p999_ms']:>10.2f}{r['max_ms']:>9.2f}{tail}")
    print("latencies: reader, client side, one request in flight; all reads were full hits")
    for row in rows:
        print(f"shards {row['shards']}: p99 under writes = {row['loaded_vs_idle_p99']:.1f}x its idle p99")
    for row in rows[1:]:
        print(f"shards {row['shards']} vs shards {ref['shards']} under writes: p99 {row['p99_vs_first']:.2f}x, "
              f"p50 {row['loaded']['p50_ms'] / ref['loaded']['p50_ms']:.2f}x, writer throughput "
              f"{row['writers']['mib_per_s'] / ref['writers']['mib_per_s']:.2f}x")
    if plot_path:
        print(f"plot: {shown(plot_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
