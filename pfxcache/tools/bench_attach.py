"""A tenant's worker through its arena partition (PFXATTACH) vs through RESP: KV bytes per second.

One pfxcached with an arena partition ``bench:*`` and a unix socket; the worker is the
tenant's (ACL user ``tenant``, key pattern ``~bench:*``) and runs as another user (uid 65534)
when this runs as root, so it can reach its KV only through what PFXATTACH passes it. Each
request is one ``save`` (store --pages pages of --block-bytes) then one ``load`` of them back,
with every byte checked. Three ways, alternating round by round so all see the same machine
load: ``partition`` (unix:// URL: the partition mapped, zero-copy), ``resp-unix`` (the same
socket, attach=False: WITHDATA / DATA) and ``resp-tcp`` (TCP, attach=False: the reference).
Reported: median MB/s of KV moved (saved + loaded) per way, and each against resp-tcp.

    scripts/bench-attach
    scripts/bench-attach --pages 16 --block-bytes 65536 --requests 200 --rounds 3 --json
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

from pfxcache.testing import start_daemon
from pfxcache.tools.common import command_line, machine, progress_bar, tool_parser

WAYS = ("partition", "resp-unix", "resp-tcp")
NOBODY = 65534


def run_worker(url: str, attach: bool | None, args, round_number: int) -> dict:
    """In a forked child (as nobody when root): --requests save + load pairs; MB/s and the way used."""
    from pfxcache.client import PrefixCache

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            cache = PrefixCache.from_url(url, attach=attach, username="tenant", password="tenant")
            rng = np.random.default_rng(round_number)
            src = rng.integers(0, 256, (args.pages, args.block_bytes), dtype=np.uint8)
            got = np.empty_like(src)
            page = cache.info().page_size
            start = time.perf_counter()
            for i in range(args.requests):
                tokens = [round_number * 10**6 + i, *range(1, args.pages * page)]
                cache.save("bench:kv", tokens, src)
                match = cache.load("bench:kv", tokens, got)
                if match.matched_tokens != len(tokens) or not np.array_equal(got, src):
                    raise AssertionError(f"request {i}: wrong bytes")
            seconds = time.perf_counter() - start
            result = {"mb_s": 2 * args.requests * src.nbytes / seconds / 1e6, "via": match.via}
            cache.close()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            result = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 1 << 16):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    result = json.loads(data or b'{"error": "the worker died"}')
    if "error" in result:
        raise RuntimeError(result["error"])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("bench-attach", __doc__)
    parser.add_argument("--pages", type=int, default=16, help="pages per request (default 16)")
    parser.add_argument("--block-bytes", type=int, default=65536, help="bytes per page (default 65536)")
    parser.add_argument("--requests", type=int, default=100, help="save + load pairs per round (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three ways (default 3)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    blocks = 4 * args.pages
    directory = tempfile.mkdtemp(prefix="pfx-bench-attach-")
    os.chmod(directory, 0o755)  # the worker of another user must reach the socket
    path = os.path.join(directory, "pfx.sock")
    daemon = start_daemon("--page-size", "16", "--block-bytes", str(args.block_bytes),
                          "--maxmemory", str(2 * blocks * args.block_bytes), "--arena-partition", f"bench:* {blocks}",
                          "--unixsocket", path, "--unixsocketperm", "777", "--evict-low-watermark", "0",
                          "--requirepass", "admin")
    import redis

    admin = redis.Redis(host=daemon.host, port=daemon.port, password="admin")
    admin.execute_command("ACL", "SETUSER", "tenant", "on", ">tenant", "~bench:*", "+@pfx")
    urls = {"partition": (f"unix://{path}", None), "resp-unix": (f"unix://{path}", False),
            "resp-tcp": (f"redis://{daemon.host}:{daemon.port}/0", False)}
    figures: dict[str, list[float]] = {way: [] for way in WAYS}
    vias: dict[str, str] = {}
    bar = progress_bar(args.rounds * len(WAYS), "bench-attach", "run", quiet=args.quiet)
    try:
        for round_number in range(args.rounds):
            order = WAYS if round_number % 2 == 0 else WAYS[::-1]
            for way in order:
                result = run_worker(*urls[way], args, round_number * len(WAYS) + WAYS.index(way))
                figures[way].append(result["mb_s"])
                vias[way] = result["via"]
                bar.update(1)
    finally:
        bar.close()
        daemon.stop()
        shutil.rmtree(directory, ignore_errors=True)
    reference = statistics.median(figures["resp-tcp"])
    rows = {way: {"median_mb_s": round(statistics.median(figures[way]), 1), "via": vias[way],
                  "vs_resp_tcp": round(statistics.median(figures[way]) / reference, 2)} for way in WAYS}
    doc = {"command": command_line("bench-attach", argv), "machine": machine(), "worker_uid": NOBODY
           if os.geteuid() == 0 else os.geteuid(), "pages": args.pages, "block_bytes": args.block_bytes,
           "requests": args.requests, "rounds": args.rounds, "results": rows}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(doc["command"])
    print(f"worker uid {doc['worker_uid']}; {args.pages} pages x {args.block_bytes} B per request, "
          f"save + load, {args.requests} requests x {args.rounds} rounds")
    print(f"{'way':<10} {'via':<5} {'MB/s':>10} {'vs resp-tcp':>12}")
    for way, row in rows.items():
        print(f"{way:<10} {row['via']:<5} {row['median_mb_s']:>10} {row['vs_resp_tcp']:>11}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
