"""What KV events cost: PFXSET throughput with events on vs off, and the delay until a router sees a store.

Two pfxcached daemons with the same settings, one with ``kv-events-endpoint`` (and a replay
socket) and Dynamo's KV indexer subscribed to it, one without. Throughput: --rounds rounds,
alternating off/on so both see the same machine load, each a burst of --commands PFXSETs
(pipelined --pipeline deep on one connection) of fresh prompts of --pages pages; the arena is
small enough that stores evict, so the events are stored and removed blocks both. Per
--block-bytes value (default 262144, a page of a small model's KV, and 64: tiny blocks, where
the events' share of the work is largest). Reported: median commands/s of each and on / off, and the CPU time each daemon
process spent per PFXSET (user + system, its publisher thread included, from /proc): on a
shared machine the CPU figure moves far less than commands/s, which other processes' load
swings. Rounds alternate the order (off-on, on-off, ...).

Delay: --samples single PFXSETs of a fresh one-page prompt on the daemon with events; after
each reply the indexer is asked (POST /query, as fast as it answers) until it reports the page.
The delay is from the PFXSET reply to the first query that sees it, so it includes one query's
round trip (~1 ms here): p50, p90, max.

    scripts/bench-kv-events
    scripts/bench-kv-events --rounds 3 --commands 2000 --samples 100
    scripts/bench-kv-events --json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

from pfxcache.testing import encode_command, free_port, start_daemon
from pfxcache.tools.common import RespConnection, command_line, machine, progress_bar, tool_parser
from pfxcache.tools.kv_indexer import indexer_installed, start_indexer

PAGE = 16
NS = b"bench"


def daemon_args(block_bytes: int, maxmemory: int, events: bool) -> list[str]:
    args = ["--arena", "memory", "--page-size", str(PAGE), "--block-bytes", str(block_bytes),
            "--maxmemory", str(maxmemory), "--evict-low-watermark", "0"]
    if events:
        args += ["--kv-events-endpoint", f"tcp://127.0.0.1:{free_port()}",
                 "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{free_port()}"]
    return args


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux /proc)."""
    import os

    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def endpoint_of(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


class Writer:
    """Pipelined PFXSETs of fresh prompts on one connection."""

    def __init__(self, address, block_bytes: int, pages: int) -> None:
        self.conn = RespConnection(address)
        self.data = b"\0" * (pages * block_bytes)
        self.pages = pages
        self.serial = 0

    def command(self) -> bytes:
        self.serial += 1
        tokens = np.arange(self.pages * PAGE, dtype=np.uint32)
        tokens[0] = self.serial  # a new first page: a new sequence every time
        return encode_command(b"PFXSET", NS, b"PACKED", tokens.tobytes(), b"DATA", self.data)

    def burst(self, commands: int, pipeline: int) -> float:
        """commands/s of one burst."""
        started = time.perf_counter()
        done = 0
        while done < commands:
            n = min(pipeline, commands - done)
            self.conn.sock.sendall(b"".join(self.command() for _ in range(n)))
            for _ in range(n):
                reply = self.conn.reply()
                if isinstance(reply, Exception):
                    raise RuntimeError(f"PFXSET failed: {reply}")
            done += n
        return commands / (time.perf_counter() - started)


def throughput(block_bytes: int, args, bar) -> dict:
    maxmemory = max(1024, args.capacity * block_bytes)
    off_args = daemon_args(block_bytes, maxmemory, events=False)
    on_args = daemon_args(block_bytes, maxmemory, events=True)
    daemons, indexer = [], None
    try:
        daemons = [start_daemon(*off_args), start_daemon(*on_args)]
        if indexer_installed():
            indexer = start_indexer()
            indexer.register(1, endpoint_of(on_args, "--kv-events-endpoint"),
                             replay_endpoint=endpoint_of(on_args, "--kv-events-replay-endpoint"), block_size=PAGE)
        writers = [Writer(d.address, block_bytes, args.pages) for d in daemons]
        for writer in writers:  # warm up: fill the arena so every later store evicts
            writer.burst(max(1, args.capacity // args.pages), args.pipeline)
        rates: dict[str, list[float]] = {"off": [], "on": []}
        cpu = {"off": 0.0, "on": 0.0}
        order = [("off", writers[0], daemons[0]), ("on", writers[1], daemons[1])]
        for round_no in range(args.rounds):
            for name, writer, daemon in (order if round_no % 2 == 0 else order[::-1]):
                before = cpu_seconds(daemon.proc.pid)
                rates[name].append(writer.burst(args.commands, args.pipeline))
                cpu[name] += cpu_seconds(daemon.proc.pid) - before
                bar.update(1)
        info = RespConnection(daemons[1].address).call("INFO", "kvevents").decode()
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
        total = args.rounds * args.commands
        return {"block_bytes": block_bytes, "off_per_s": off, "on_per_s": on, "on_over_off": on / off,
                "cpu_us_off": 1e6 * cpu["off"] / total, "cpu_us_on": 1e6 * cpu["on"] / total,
                "rounds": rates, "subscriber": "dynamo indexer" if indexer else "none",
                "events_published": int(fields["kv_events_published"]),
                "events_dropped": int(fields["kv_events_dropped"])}
    finally:
        if indexer is not None:
            indexer.stop()
        for daemon in daemons:
            daemon.stop()


def delay(args, bar) -> dict:
    on_args = daemon_args(16384, 64 * 1024 * 1024, events=True)
    daemon = start_daemon(*on_args)
    indexer = None
    try:
        indexer = start_indexer()
        indexer.register(1, endpoint_of(on_args, "--kv-events-endpoint"),
                         replay_endpoint=endpoint_of(on_args, "--kv-events-replay-endpoint"), block_size=PAGE)
        conn = RespConnection(daemon.address)
        data = b"\0" * 16384
        delays = []
        serial = 0
        while len(delays) < args.samples:
            serial += 1
            tokens = np.full(PAGE, 10**6 + serial, dtype=np.uint32)
            conn.call("PFXSET", NS, "PACKED", tokens.tobytes(), "DATA", data)
            sent = time.perf_counter()
            ids = tokens.tolist()
            while time.perf_counter() - sent < 5:
                if indexer.query(ids, NS.decode()).get(1, 0) == PAGE:
                    break
            else:
                continue  # the indexer was still connecting (a SUB misses what came before): not a sample
            delays.append(time.perf_counter() - sent)
            bar.update(1)
        ms = sorted(1000 * d for d in delays)
        return {"samples": len(ms), "p50_ms": ms[len(ms) // 2], "p90_ms": ms[int(len(ms) * 0.9)], "max_ms": ms[-1]}
    finally:
        if indexer is not None:
            indexer.stop()
        daemon.stop()


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("bench-kv-events", __doc__)
    parser.add_argument("--block-bytes", default="262144,64", help="comma-separated block-bytes (default 262144,64)")
    parser.add_argument("--pages", type=int, default=8, help="pages per PFXSET (default 8)")
    parser.add_argument("--capacity", type=int, default=512, help="pages the arena holds (default 512)")
    parser.add_argument("--commands", type=int, default=1000, help="PFXSETs per round (default 1000)")
    parser.add_argument("--pipeline", type=int, default=32, help="pipeline depth (default 32)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of off then on (default 5)")
    parser.add_argument("--samples", type=int, default=200, help="delay samples (default 200)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    command = command_line("bench-kv-events", argv)
    sizes = [int(x) for x in args.block_bytes.split(",") if x]
    bar = progress_bar(len(sizes) * args.rounds * 2 + (args.samples if indexer_installed() else 0),
                       "bench-kv-events", "step")
    rows = [throughput(size, args, bar) for size in sizes]
    lag = delay(args, bar) if indexer_installed() else None
    bar.close()
    if args.json:
        print(json.dumps({"command": command, "machine": machine(), "throughput": rows, "delay": lag}))
        return 0
    print(f"# {command}")
    print(f"PFXSET of {args.pages} pages x {PAGE} tokens, pipeline {args.pipeline}, {args.rounds} rounds of "
          f"{args.commands}; arena {args.capacity} pages (stores evict)")
    for row in rows:
        print(f"block-bytes {row['block_bytes']:>6}: events off {row['off_per_s']:8.0f}/s   on {row['on_per_s']:8.0f}/s"
              f"   on/off {row['on_over_off']:.3f}   daemon CPU per PFXSET off {row['cpu_us_off']:.0f} us, on "
              f"{row['cpu_us_on']:.0f} us (on/off {row['cpu_us_on'] / row['cpu_us_off']:.3f})   "
              f"(subscriber: {row['subscriber']}, {row['events_published']} events, {row['events_dropped']} dropped)")
    if lag is None:
        print("event delay: skipped (Dynamo's indexer is not installed: scripts/setup test)", file=sys.stderr)
    else:
        print(f"event delay PFXSET reply -> indexer view: p50 {lag['p50_ms']:.1f} ms  p90 {lag['p90_ms']:.1f} ms  "
              f"max {lag['max_ms']:.1f} ms  ({lag['samples']} samples)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
