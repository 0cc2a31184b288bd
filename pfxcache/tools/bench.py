"""Benchmark pfxcached against redis-server on this machine, in one invocation.

Starts both servers on free loopback ports, runs redis-benchmark loads against
each, and prints requests/s, p50 and p99 latency and the ratio
pfxcached / redis-server. ``--json`` prints the figures as JSON instead; a bar
chart goes to scripts/out/bench.png (``--no-plot`` skips it).

    scripts/bench                               # every load
    scripts/bench --loads pfxget,pfxset         # some of them
    scripts/bench -n 50000 --json               # fewer requests, machine-readable

Loads (50 clients, pipeline 1 and 16 unless told otherwise):

  ping        PING_MBULK on both servers.
  echo        ECHO of 1 KiB on both servers.
  pfxget      PFXGET hit of a 4,096-token PACKED prompt (16 KiB of token ids,
              256 cached pages; NOLEASE, so no lease is created and none piles
              up) vs redis GET of a 16 KiB key whose value is as long as the
              PFXGET reply (same request and reply sizes).
  pfxset      PFXSET of one page (16 tokens) with 16 KiB of DATA, the same
              prompt every time: after the first, every call finds the page
              cached and stores nothing (the duplicate path) vs redis SET of a
              16 KiB value to one key.
  pfxset-new  PFXSET of one page with 16 KiB of DATA, a new prompt per call:
              the first 12 bytes of the PACKED blob are ``__rand_int__``,
              which redis-benchmark replaces with 12 random digits (-r
              1000000), so most calls store a new page; --maxmemory (64mb,
              4,096 blocks) fills after ~4k calls and every later one evicts a
              page vs redis SET of 16 KiB values to random keys with the same
              maxmemory and allkeys-lru.

redis-benchmark sends its arguments from argv, where NUL bytes cannot go: the
token ids are chosen so that every byte of the PACKED blob is printable ASCII
(0x21..0x7e). Before each PFXGET run the prompt is checked to be a full hit
through redis-py; after each PFX* run PFXINFO tells how many requests were
hits, pages stored and pages evicted, and a run that did not do what it should
is an error.

``--floor`` adds a third server to the PING_MBULK rows: a minimal trio server
(one task per connection, one ``+PONG`` per ``*`` received, no parsing, no
dispatch). It is the ceiling of the daemon's I/O design on this machine: how
close pfxcached gets to it says how much is left to win in Python code.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pfxcache.testing import free_port, start_daemon, start_redis_server
from pfxcache.tools.common import (OUT, RespConnection, command_line, machine, new_plot, pairs, progress_bar,
                                   save_plot, shown, tool_parser)

NAMESPACE = b"bench"
PAGE_TOKENS = 16
BLOCK_BYTES = 16 * 1024
GET_TOKENS = 4096


def printable_token(i: int) -> bytes:
    """Token id number i as 4 little-endian bytes, each in 0x21..0x7e (no NUL, no space: fine in argv)."""
    out = bytearray()
    for _ in range(4):
        out.append(0x21 + i % 94)
        i //= 94
    return bytes(out)


def printable_prompt(count: int, start: int) -> bytes:
    return b"".join(printable_token(start + i) for i in range(count))


def raw_reply(address: tuple[str, int], *args: bytes | str) -> tuple[Any, int]:
    """Send one command over RESP2 on a new connection, return (decoded reply, reply size in bytes)."""
    with RespConnection(address, timeout=10) as conn:
        reply = conn.call(*args)
        return reply, conn.received


def pfx_stats(address: tuple[str, int]) -> dict:
    reply, _ = raw_reply(address, "PFXINFO")
    return pairs(pairs(reply)["stats"])


@dataclass
class Load:
    key: str  # what --loads selects
    label: str  # table row
    pfx: list  # redis-benchmark arguments against pfxcached (after the connection options)
    redis: list  # ... and against redis-server
    note: str
    prepare: Callable[[Any, Any], None] | None = None  # (pfx address, redis address), before every run
    check: Callable[[dict, dict, int], dict] | None = None  # (stats before, after, requests) -> extras
    extras: dict = field(default_factory=dict)


def build_loads(args: argparse.Namespace) -> list[Load]:
    loads = [
        Load("ping", "PING_MBULK", ["-t", "ping_mbulk"], ["-t", "ping_mbulk"], "PING_MBULK on both"),
        Load("echo", f"ECHO {args.echo_bytes} B", ["ECHO", "x" * args.echo_bytes], ["ECHO", "x" * args.echo_bytes],
             f"ECHO of {args.echo_bytes} bytes on both"),
    ]

    # PFXGET hit of 4096 tokens vs GET of a 16 KiB key.
    get_prompt = printable_prompt(GET_TOKENS, 1000)
    get_key = b"k" * len(get_prompt)
    pfxget_args = [b"PFXGET", NAMESPACE, b"PACKED", get_prompt, b"NOLEASE"]
    reply_size = {}

    def prepare_get(pfx_addr, redis_addr):
        reply, _ = raw_reply(pfx_addr, *pfxget_args)
        if pairs(reply)["matched"] != GET_TOKENS:
            data = b"d" * (GET_TOKENS // PAGE_TOKENS * BLOCK_BYTES)
            stored, _ = raw_reply(pfx_addr, "PFXSET", NAMESPACE, "PACKED", get_prompt, "DATA", data)
            if isinstance(stored, Exception):
                raise RuntimeError(f"PFXSET of the PFXGET prompt failed: {stored}")
        import redis

        client = redis.Redis(*pfx_addr, protocol=3)
        try:  # the check the brief asks for: a real client sees a full hit
            got = client.execute_command("PFXGET", NAMESPACE, "PACKED", get_prompt, "NOLEASE")
        finally:
            client.close()
        if got[b"matched"] != GET_TOKENS or len(got[b"blocks"]) != GET_TOKENS // PAGE_TOKENS or got[b"lease"] != 0:
            raise RuntimeError(f"the PFXGET prompt is not a full hit: {got}")
        _, size = raw_reply(pfx_addr, *pfxget_args)
        reply_size["pfx"] = size
        n = max(1, size - len(b"$%d\r\n\r\n" % size))  # "$<n>\r\n" + value + "\r\n" = the PFXGET reply size
        value = b"v" * n
        raw_reply(redis_addr, "SET", get_key, value)
        _, reply_size["redis"] = raw_reply(redis_addr, "GET", get_key)

    def check_get(before, after, requests):
        hits = after["hits_tokens"] - before["hits_tokens"]
        misses = after["misses_tokens"] - before["misses_tokens"]
        # redis-benchmark may send a few more than -n (whole pipelines per client): at least n, all hits.
        if misses or hits < requests * GET_TOKENS or hits % GET_TOKENS:
            raise RuntimeError(f"PFXGET run: {hits} tokens hit, {misses} missed, expected {requests * GET_TOKENS} hits")
        if after["leases"] != before["leases"]:
            raise RuntimeError("PFXGET NOLEASE run left leases behind")
        return {"hit_tokens": hits, "reply_bytes": reply_size}

    loads.append(Load(
        "pfxget", f"PFXGET {GET_TOKENS} tok",
        pfxget_args, [b"GET", get_key],
        f"PFXGET {NAMESPACE.decode()} PACKED <{GET_TOKENS} tokens, {len(get_prompt)} B> NOLEASE (full hit, "
        f"{GET_TOKENS // PAGE_TOKENS} pages) vs GET <{len(get_key)} B key> (value sized to the PFXGET reply)",
        prepare_get, check_get))

    # PFXSET of one existing page vs SET of 16 KiB to one key.
    data = b"v" * BLOCK_BYTES
    set_prompt = printable_prompt(PAGE_TOKENS, 500_000)

    def prepare_set(pfx_addr, redis_addr):
        reply, _ = raw_reply(pfx_addr, "PFXSET", NAMESPACE, "PACKED", set_prompt, "DATA", data)
        if isinstance(reply, Exception):
            raise RuntimeError(f"PFXSET failed: {reply}")

    def check_set(before, after, requests):
        inserts = after["inserts"] - before["inserts"]
        stored = after["stored_pages"] - before["stored_pages"]
        if inserts < requests or stored:
            raise RuntimeError(f"PFXSET duplicate run: {inserts} inserts (expected {requests}), {stored} pages stored")
        return {"inserts": inserts, "stored_pages": stored}

    loads.append(Load(
        "pfxset", "PFXSET dup 1 page",
        [b"PFXSET", NAMESPACE, b"PACKED", set_prompt, b"DATA", data], [b"SET", b"setkey", data],
        f"PFXSET {NAMESPACE.decode()} PACKED <16 tokens> DATA <16 KiB>, the same page every time (stores 0 pages) "
        f"vs SET setkey <16 KiB>",
        prepare_set, check_set))

    # PFXSET of one new page per call (random prompt), with eviction, vs SET to random keys.
    rand_prompt = b"__rand_int__" + printable_prompt(PAGE_TOKENS - 3, 700_000)
    assert len(rand_prompt) == PAGE_TOKENS * 4

    def check_new(before, after, requests):
        inserts = after["inserts"] - before["inserts"]
        stored = after["stored_pages"] - before["stored_pages"]
        evicted = after["evictions"] - before["evictions"]
        if inserts < requests or stored < requests // 2:
            raise RuntimeError(f"PFXSET new-page run: {inserts} inserts (expected {requests}), {stored} stored")
        return {"inserts": inserts, "stored_pages": stored, "evicted_pages": evicted}

    keyspace = ["-r", str(args.keyspace)]
    loads.append(Load(
        "pfxset-new", "PFXSET new 1 page",
        [*keyspace, b"PFXSET", NAMESPACE, b"PACKED", rand_prompt, b"DATA", data],
        [*keyspace, b"SET", b"key:__rand_int__", data],
        f"PFXSET {NAMESPACE.decode()} PACKED <__rand_int__ + 13 tokens> DATA <16 KiB> -r {args.keyspace}: a new "
        f"page per call, evicting once maxmemory {args.maxmemory} is full, vs SET key:__rand_int__ <16 KiB> -r "
        f"{args.keyspace} (redis-server maxmemory {args.maxmemory}, allkeys-lru)",
        None, check_new))
    return loads


def run_benchmark(address: tuple[str, int], load_args: list, clients: int, pipeline: int,
                  requests: int) -> dict[str, float]:
    command = [b"redis-benchmark", b"-h", address[0].encode(), b"-p", str(address[1]).encode(),
               b"-c", str(clients).encode(), b"-P", str(pipeline).encode(), b"-n", str(requests).encode(), b"--csv",
               *(a.encode() if isinstance(a, str) else a for a in load_args)]
    result = subprocess.run(command, capture_output=True, timeout=1200)
    stdout = result.stdout.decode("utf-8", "replace")
    stderr = result.stderr.decode("utf-8", "replace")
    if result.returncode != 0 or "error" in stderr.lower():
        raise RuntimeError(f"redis-benchmark failed: {(stderr or stdout)[-2000:]}")
    # The first CSV column repeats the command unescaped (a PACKED blob may hold quotes and commas):
    # read the figures from the right.
    header, *rows = [line for line in stdout.splitlines() if line.strip()]
    names = next(csv.reader(io.StringIO(header)))
    values = [v.strip('"') for v in rows[-1].rsplit(",", len(names) - 1)[1:]]
    row = dict(zip(names[1:], values))
    return {
        "rps": float(row["rps"]),
        "p50_ms": float(row["p50_latency_ms"]),
        "p99_ms": float(row["p99_latency_ms"]),
    }


def serve_floor(port: int) -> None:
    """The --floor reference: trio, one task per connection, no parsing."""
    import trio
    from trio.lowlevel import wait_readable

    async def connection(sock: socket.socket) -> None:
        with sock:
            while True:
                await wait_readable(sock)
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                if not data:
                    return
                sock.sendall(b"+PONG\r\n" * data.count(b"*"))

    async def serve() -> None:
        listener = socket.create_server(("127.0.0.1", port), backlog=511)
        listener.setblocking(False)
        print(f"Ready to accept connections tcp on 127.0.0.1:{port}", flush=True)
        async with trio.open_nursery() as nursery:
            while True:
                await wait_readable(listener)
                try:
                    sock, _ = listener.accept()
                except BlockingIOError:
                    continue
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                nursery.start_soon(connection, sock)

    trio.run(serve)


def start_floor() -> subprocess.Popen:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pfxcache.tools.bench", "--serve-floor", str(port)], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    proc.port = port  # type: ignore[attr-defined]
    return proc


def plot(results: list[dict], path: Path, title: str) -> Path | None:
    figure = new_plot((max(8, 1.7 * len(results)), 5))
    if figure is None:
        return None
    fig, ax = figure
    labels = [f"{r['load']}\n-P {r['pipeline']}" for r in results]
    x = range(len(results))
    width = 0.4
    ax.bar([i - width / 2 for i in x], [r["redis"]["rps"] for r in results], width, label="redis-server")
    ax.bar([i + width / 2 for i in x], [r["pfxcached"]["rps"] for r in results], width, label="pfxcached")
    for i, r in zip(x, results):
        ax.annotate(f"{r['ratio']:.2f}x", (i + width / 2, r["pfxcached"]["rps"]), ha="center", va="bottom",
                    fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("requests/s")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.legend()
    return save_plot(fig, path)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-floor":
        serve_floor(int(sys.argv[2]))
        return 0
    parser = tool_parser("bench", __doc__)
    parser.add_argument("-n", "--requests", type=int, default=100_000, help="requests per run (default 100000)")
    parser.add_argument("-c", "--clients", type=int, default=50, help="parallel connections (default 50)")
    parser.add_argument("--pipelines", default="1,16", help="comma-separated pipeline depths (default 1,16)")
    parser.add_argument("--echo-bytes", type=int, default=1024, help="ECHO payload size (default 1024)")
    parser.add_argument("--loads", default="ping,echo,pfxget,pfxset,pfxset-new",
                        help="comma-separated loads to run (default: all of ping,echo,pfxget,pfxset,pfxset-new)")
    parser.add_argument("--maxmemory", default="64mb",
                        help="maxmemory of both servers (default 64mb: the pfxset-new load evicts)")
    parser.add_argument("--keyspace", type=int, default=1_000_000, help="-r of the pfxset-new load (default 1000000)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-plot", action="store_true", help="do not write scripts/out/bench.png")
    parser.add_argument("--floor", action="store_true", help="also run PING_MBULK against a minimal trio server")
    parser.add_argument("--mooncake", action="store_true",
                        help="also run the Mooncake Store peer (a worker's lookup + KV fetch of a 4,096-token prompt "
                             "vs PFXGET + read_into; see pfxcache.tools.mooncake_peer; scripts/bench installs it with scripts/setup mooncake)")
    args = parser.parse_args()
    if not shutil.which("redis-benchmark") or not shutil.which("redis-server"):
        print("redis-benchmark and redis-server are needed: scripts/setup redis installs them",
              file=sys.stderr)
        return 2

    wanted = [k.strip() for k in args.loads.split(",") if k.strip()]
    all_loads = {load.key: load for load in build_loads(args)}
    unknown = [k for k in wanted if k not in all_loads]
    if unknown:
        parser.error(f"unknown load(s) {', '.join(unknown)}; known: {', '.join(all_loads)}")
    selected = [all_loads[k] for k in wanted]
    pipelines = [int(p) for p in args.pipelines.split(",")]
    plan = [(load, p) for load in selected for p in pipelines]
    ours = start_daemon("--loglevel", "warning", "--maxmemory", args.maxmemory,
                        "--block-bytes", str(BLOCK_BYTES), "--page-size", str(PAGE_TOKENS))
    reference = start_redis_server("--maxmemory", args.maxmemory, "--maxmemory-policy", "allkeys-lru")
    floor = start_floor() if args.floor and any(load.key == "ping" for load in selected) else None
    results = []
    runs = 2 * len(plan) + (len(pipelines) if floor else 0)
    steps = progress_bar(runs, "benchmarking", "run")
    try:
        for load, pipeline in plan:
            row: dict[str, Any] = {"load": load.label, "key": load.key, "pipeline": pipeline,
                                   "clients": args.clients, "requests": args.requests}
            servers = [("redis", reference.address, load.redis), ("pfxcached", ours.address, load.pfx)]
            if floor is not None and load.key == "ping":
                servers.append(("trio_floor", ("127.0.0.1", floor.port), load.pfx))
            for name, address, load_args in servers:
                if steps.disable:
                    print(f"  {load.label} -P {pipeline} against {name} ...", file=sys.stderr, flush=True)
                steps.set_postfix_str(f"{load.label} -P {pipeline} {name}")
                if load.prepare is not None and name == "redis":
                    load.prepare(ours.address, reference.address)
                before = pfx_stats(ours.address) if name == "pfxcached" and load.check else None
                row[name] = run_benchmark(address, load_args, args.clients, pipeline, args.requests)
                if before is not None:
                    row["pfx_check"] = load.check(before, pfx_stats(ours.address), args.requests)
                steps.update(1)
            row["ratio"] = row["pfxcached"]["rps"] / row["redis"]["rps"]
            if "trio_floor" in row:
                row["floor_ratio"] = row["pfxcached"]["rps"] / row["trio_floor"]["rps"]
            results.append(row)
        final_stats = pfx_stats(ours.address)
    finally:
        steps.close()
        ours.stop()
        reference.stop()
        if floor is not None:
            floor.terminate()
            floor.wait()

    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    figures_from = {**machine(), "redis": redis_version.removeprefix("v=")}
    command = command_line("bench")
    notes = {load.key: load.note for load in selected}
    target = next((r for r in results if r["key"] == "pfxget" and r["pipeline"] == 1), None)
    plot_path = None
    if not args.no_plot:
        plot_path = plot(results, OUT / "bench.png",
                         f"{command}  ({figures_from['cpus']} CPUs, -c {args.clients}, -n {args.requests})")
    if args.json:
        print(json.dumps({"command": command, "machine": figures_from, "maxmemory": args.maxmemory,
                          "block_bytes": BLOCK_BYTES, "page_size": PAGE_TOKENS, "notes": notes, "results": results,
                          "pfxget_target": None if target is None else {"ratio": target["ratio"], "goal": 0.7,
                                                                        "met": target["ratio"] >= 0.7},
                          "pfx_final_stats": final_stats,
                          "plot": str(plot_path) if plot_path else None}, indent=2))
        return 0
    print(f"$ {command}")
    print(f"pfxcached vs redis-server ({figures_from['redis']}), {figures_from['cpus']} CPUs, "
          f"-c {args.clients}, -n {args.requests}; both servers maxmemory {args.maxmemory}")
    header = (f"{'load':<20}{'-P':>4}{'redis rps':>12}{'p50':>7}{'p99':>7}{'pfx rps':>12}{'p50':>7}{'p99':>7}"
              f"{'ratio':>8}")
    print(header)
    print("-" * len(header))
    for row in results:
        redis_, ours_ = row["redis"], row["pfxcached"]
        print(f"{row['load']:<20}{row['pipeline']:>4}{redis_['rps']:>12,.0f}{redis_['p50_ms']:>7.2f}"
              f"{redis_['p99_ms']:>7.2f}{ours_['rps']:>12,.0f}{ours_['p50_ms']:>7.2f}{ours_['p99_ms']:>7.2f}"
              f"{row['ratio']:>8.2f}")
    for row in results:
        if "trio_floor" in row:
            floor_rps = row["trio_floor"]["rps"]
            print(f"trio floor, {row['load']} -P {row['pipeline']}: {floor_rps:,.0f} rps "
                  f"(pfxcached reaches {row['pfxcached']['rps'] / floor_rps:.2f} of it)")
    print("latencies in ms; ratio = pfxcached rps / redis-server rps")
    for key, note in notes.items():
        print(f"  {key}: {note}")
    for row in results:
        check = row.get("pfx_check")
        if check and "reply_bytes" in check and row["pipeline"] == results[0]["pipeline"]:
            sizes = check["reply_bytes"]
            print(f"  {row['key']}: reply {sizes['pfx']:,} B from pfxcached, {sizes['redis']:,} B from redis-server; "
                  f"all {check['hit_tokens'] // GET_TOKENS:,} PFXGETs were full hits")
        if check and "evicted_pages" in check:
            print(f"  {row['key']} -P {row['pipeline']}: pfxcached stored {check['stored_pages']:,} pages and "
                  f"evicted {check['evicted_pages']:,} during the run")
    if target is not None:
        verdict = "met" if target["ratio"] >= 0.7 else "MISSED"
        print(f"target PFXGET >= 0.7x redis GET at -P 1: {target['ratio']:.2f}x ({verdict})")
    if args.mooncake:
        from pfxcache.tools import mooncake_peer

        print()
        try:
            print("\n".join(mooncake_peer.report(mooncake_peer.compare())))
        except mooncake_peer.PeerUnavailable as exc:
            print(f"Mooncake Store peer: not run: {exc}")
    if plot_path:
        print(f"plot: {shown(plot_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
