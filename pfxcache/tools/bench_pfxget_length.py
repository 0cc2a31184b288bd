"""PFXGET's cost per token as prompts grow: a 16,384-token prompt beside a 4,096-token one, page 1 and 16.

For each --pages value (default 16, then 1) a fresh pfxcached is started (--arena memory, --block-bytes
64, --maxmemory 64mb, --maxmemory-policy lru, 16 shards) and --prompts prompts (default 8) of each
--lengths value (default 4096 and 16384 tokens) are stored with PFXSET ... PACKED ... DATA: every prompt
its own (its first token is unique), so each lookup walks its own path of 4,096 or 16,384 pages at
page 1 (256 or 1,024 at page 16). Then --repeat rounds (default 5) alternate the lengths so a load
change on a shared machine hits both alike: in each, one connection loops ``PFXGET key PACKED <prompt>
NOLEASE`` over the prompts of one length for --duration seconds (default 1), one request at a time,
every reply checked to be a full hit.

Reported per page size and length, medians of the rounds: requests, the daemon's CPU time per request
(from /proc/PID/task/*/schedstat: what the daemon spent, whoever else shares the machine), the
client's p50 round trip (it includes decoding the reply's block ids), and both per 1,000 tokens.
``growth`` is the 16,384-token prompt's CPU per token over the 4,096-token one's: 1.0 means the cost
per token is flat; above 1 it grows with the prompt, below 1 fixed costs are being amortised.

    scripts/tool bench_pfxget_length                  # page 16 and 1, 5 rounds of 1 s per length
    scripts/tool bench_pfxget_length --pages 1 --repeat 3 --duration 0.5
    scripts/tool bench_pfxget_length --json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

from pfxcache.client.commands import pack_tokens
from pfxcache.testing import encode_command, start_daemon
from pfxcache.tools.bench_hotpath import cpu_ns
from pfxcache.tools.common import RespConnection, command_line, machine, pairs, tool_parser

NS = b"len"
BLOCK_BYTES = 64


def prompt(length: int, serial: int) -> bytes:
    """Packed tokens of one prompt: its first token (length, serial) is unique, so it shares no page."""
    body = np.arange(1, length, dtype=np.uint32) + np.uint32(serial << 16)
    return pack_tokens(np.concatenate((np.array([length * 1000 + serial], np.uint32), body)))


def store(conn: RespConnection, tokens: bytes, pages: int) -> None:
    reply = conn.call(b"PFXSET", NS, b"PACKED", tokens, b"DATA", bytes(pages * BLOCK_BYTES))
    if pairs(reply)["stored"] != pages:
        raise RuntimeError(f"PFXSET stored {pairs(reply)['stored']} of {pages} pages")


def read_round(conn: RespConnection, pid: int, requests: list[bytes], tokens: int, duration: float) -> dict:
    """PFXGET one request at a time for ``duration`` seconds: requests, daemon CPU and client p50 per request."""
    sock, reader = conn.sock, conn.reader
    latencies: list[int] = []
    clock = time.perf_counter_ns
    cpu0 = cpu_ns(pid)
    end = time.perf_counter() + duration
    i = 0
    while time.perf_counter() < end:
        t0 = clock()
        sock.sendall(requests[i % len(requests)])
        while True:
            got = reader.gets()
            if got is not False:
                break
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("pfxcached closed the connection")
            reader.feed(chunk)
        latencies.append(clock() - t0)
        if isinstance(got, Exception) or got[1] != tokens:
            raise RuntimeError(f"PFXGET of a stored {tokens}-token prompt did not hit in full: {got!r:.200}")
        i += 1
    cpu = cpu_ns(pid) - cpu0
    return {"requests": i, "cpu_us": cpu / 1000 / i, "p50_us": float(np.percentile(latencies, 50)) / 1000}


def measure(page: int, lengths: list[int], prompts: int, repeat: int, duration: float) -> list[dict]:
    """One daemon at page size ``page``: the rows of each length."""
    daemon = start_daemon("--page-size", str(page), "--block-bytes", str(BLOCK_BYTES), "--maxmemory", "64mb",
                          "--arena", "memory", "--maxmemory-policy", "lru")
    try:
        with RespConnection(daemon.address) as conn:
            requests = {}
            for length in lengths:
                packed = [prompt(length, s) for s in range(prompts)]
                for tokens in packed:
                    store(conn, tokens, length // page)
                requests[length] = [encode_command(b"PFXGET", NS, b"PACKED", t, b"NOLEASE") for t in packed]
            for length in lengths:  # a warm-up round: the daemon's first replies encode each node once
                read_round(conn, daemon.proc.pid, requests[length], length // page * page, min(duration, 0.2))
            rounds: dict[int, list[dict]] = {length: [] for length in lengths}
            for r in range(repeat):
                for length in (lengths if r % 2 == 0 else lengths[::-1]):
                    rounds[length].append(read_round(conn, daemon.proc.pid, requests[length],
                                                     length // page * page, duration))
    finally:
        daemon.stop()
    rows = []
    for length in lengths:
        runs = rounds[length]
        row = {"page_size": page, "tokens": length, "pages": length // page,
               "requests": sum(x["requests"] for x in runs)}
        for key in ("cpu_us", "p50_us"):
            row[key] = statistics.median(x[key] for x in runs)
            row[key + "_runs"] = [x[key] for x in runs]
            row[key + "_per_1k_tokens"] = row[key] / length * 1000
        rows.append(row)
    base = rows[0]
    for row in rows:
        row["cpu_growth"] = row["cpu_us_per_1k_tokens"] / base["cpu_us_per_1k_tokens"]
        row["p50_growth"] = row["p50_us_per_1k_tokens"] / base["p50_us_per_1k_tokens"]
    return rows


def report(rows: list[dict]) -> list[str]:
    lines = ["PFXGET NOLEASE full hits, one connection, one request at a time (median of rounds); growth = cost per "
             "token over the shortest prompt's (1.0: flat)",
             f"{'page':>5}{'tokens':>8}{'pages':>7}{'requests':>10}{'cpu us':>9}{'/1k tok':>9}{'growth':>8}"
             f"{'p50 us':>9}{'/1k tok':>9}{'growth':>8}"]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        lines.append(f"{r['page_size']:>5}{r['tokens']:>8,}{r['pages']:>7,}{r['requests']:>10,}{r['cpu_us']:>9.1f}"
                     f"{r['cpu_us_per_1k_tokens']:>9.2f}{r['cpu_growth']:>8.2f}{r['p50_us']:>9.1f}"
                     f"{r['p50_us_per_1k_tokens']:>9.2f}{r['p50_growth']:>8.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("tool bench_pfxget_length", __doc__)
    parser.add_argument("--pages", default="16,1", help="page sizes, one daemon each (default 16,1)")
    parser.add_argument("--lengths", default="4096,16384", help="prompt lengths in tokens (default 4096,16384)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts of each length (default 8)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds per length (default 5)")
    parser.add_argument("--duration", type=float, default=1.0, help="seconds of each round (default 1)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    lengths = sorted(int(x) for x in args.lengths.split(",") if x.strip())
    rows = []
    for page in (int(p) for p in args.pages.split(",") if p.strip()):
        if any(length % page for length in lengths):
            parser.error(f"every length must be whole pages of {page} tokens")
        rows += measure(page, lengths, args.prompts, args.repeat, args.duration)
    if args.json:
        print(json.dumps({"command": command_line("tool bench_pfxget_length", argv), "machine": machine(),
                          "rows": rows}, indent=2))
    else:
        print(command_line("tool bench_pfxget_length", argv))
        print("\n".join(report(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
