"""A fleet of pfxcached hosts behind one KV-aware router: Dynamo's KV indexer routes the shared trace.

Starts --hosts daemons (default 3, each with --capacity pages) publishing KV events, and one
Dynamo standalone KV indexer (``python -m dynamo.indexer``, from the ``test`` extra) subscribed
to all of them. Then the conversation trace (/work/shared/traces or --trace) is replayed three
times, each time from empty caches, with a different router:

  longest-prefix  ask the indexer (POST /query) which host holds the longest prefix of the
               request and send it there (ties: the host with the fewest requests so far).
               On this trace every request shares its first block, so this sends nearly
               everything to one host: the hit rate of one host's capacity.
  kv-aware     the same among the hosts under a load bound (at most --load-slack over an
               even share of the requests so far), as KV routers weigh overlap against load
  round-robin  host i mod --hosts
  random       a seeded random host

Each request is a PFXGET on the chosen host (its hit: the cached prefix) and a PFXSET of the
whole request there, as an inference worker on that host would do after prefill. The indexer
learns of the stores only through the events, so its view lags behind by the event delay.

The trace's 512-token blocks become pages of --page-size tokens (block h -> tokens h*P .. h*P+P-1)
and a partial last block a partial page, so the sharing structure is exactly the trace's; hit
rates are counted in the trace's tokens (hit pages x 512, over input tokens). Requests
--skip .. --skip+--requests of the trace are used (choose settings on one slice, report another).

    scripts/fleet                                  # 3 hosts, 3000 requests
    scripts/fleet --requests 1000 --capacity 2000
    scripts/fleet --skip 6000 --json

The plot (hit rate per router, requests per host) goes to scripts/out/fleet.png.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from pfxcache.testing import free_port, start_daemon
from pfxcache.tools.common import (OUT, RespConnection, command_line, machine, new_plot, progress_bar,
                                   save_plot, shown, tool_parser)
from pfxcache.tools.kv_indexer import indexer_installed, start_indexer

from pfxcache.tools.replay import DEFAULT_TRACE as TRACE
TRACE_BLOCK = 512
NAMESPACE = "fleet"
ROUTERS = ("longest-prefix", "kv-aware", "round-robin", "random")


def load_requests(path: Path, skip: int, count: int) -> list[tuple[int, list[int]]]:
    """(input tokens, hash ids) of the requests skip .. skip+count."""
    out = []
    with open(path) as file:
        for lineno, line in enumerate(file):
            if lineno < skip:
                continue
            if len(out) >= count:
                break
            obj = json.loads(line)
            out.append((int(obj["input_length"]), [int(h) for h in obj["hash_ids"]]))
    return out


def request_tokens(input_length: int, hash_ids: list[int], page: int) -> tuple[np.ndarray, int]:
    """The request's tokens in pages of ``page`` (a partial last block: a partial page) and its whole pages."""
    whole = len(hash_ids) if input_length == TRACE_BLOCK * len(hash_ids) else len(hash_ids) - 1
    ids = np.asarray(hash_ids, dtype=np.uint64)
    tokens = (ids[:, None] * np.uint64(page) + np.arange(page, dtype=np.uint64)[None, :]) & np.uint64(0xFFFFFFFF)
    tokens = tokens.astype(np.uint32)
    if whole < len(hash_ids):
        tokens = np.concatenate([tokens[:whole].reshape(-1), tokens[whole, : max(1, page // 2)]])
    return tokens.reshape(-1), whole


class Host:
    def __init__(self, index: int, args) -> None:
        self.index = index
        self.pub = f"tcp://127.0.0.1:{free_port()}"
        self.replay = f"tcp://127.0.0.1:{free_port()}"
        self.daemon = start_daemon(
            "--arena", "memory", "--page-size", str(args.page_size), "--block-bytes", str(args.block_bytes),
            "--maxmemory", str(max(1024, args.capacity * args.block_bytes)), "--evict-low-watermark", "0",
            "--kv-events-endpoint", self.pub, "--kv-events-replay-endpoint", self.replay,
            "--kv-events-replay-buffer", "1000000")
        self.conn = RespConnection(self.daemon.address)
        self.block_bytes = args.block_bytes
        self.requests = 0

    def lookup(self, packed: bytes) -> int:
        return self.conn.call("PFXGET", NAMESPACE, "PACKED", packed, "NOLEASE")[1]

    def store(self, packed: bytes, whole: int) -> None:
        reply = self.conn.call("PFXSET", NAMESPACE, "PACKED", packed, "DATA", b"\0" * (whole * self.block_bytes))
        if isinstance(reply, Exception):
            raise RuntimeError(f"PFXSET failed on host {self.index}: {reply}")

    def stop(self) -> None:
        self.conn.close()
        self.daemon.stop()


def wait_until_indexed(indexer, hosts: list[Host], page: int, serial: int) -> None:
    """Store one fresh barrier page on every host and wait until the indexer shows each on its host."""
    deadline = time.monotonic() + 60
    for host in hosts:
        while True:
            serial += 1
            tokens = np.full(page, 0xF0000000 + serial, dtype=np.uint32)
            host.conn.call("PFXSET", "barrier", "PACKED", tokens.tobytes(), "DATA", b"\0" * host.block_bytes)
            seen = time.monotonic() + 1
            while time.monotonic() < seen:
                if indexer.query(tokens.tolist(), "barrier").get(host.index + 1, 0) == page:
                    break
                time.sleep(0.01)
            else:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the indexer does not see host {host.index}:\n{indexer.log()}")
                continue
            break


def replay(router: str, hosts: list[Host], indexer, requests, args, bar) -> dict:
    for host in hosts:
        host.conn.call("FLUSHALL")
        host.requests = 0
    wait_until_indexed(indexer, hosts, args.page_size, serial=ROUTERS.index(router) * 10**6)
    rng = random.Random(args.seed)
    hit_tokens = input_tokens = 0
    for i, (input_length, hash_ids) in enumerate(requests):
        tokens, whole = request_tokens(input_length, hash_ids, args.page_size)
        packed = tokens.tobytes()
        if router in ("longest-prefix", "kv-aware"):
            longest = indexer.query(tokens.tolist(), NAMESPACE)
            allowed = hosts
            if router == "kv-aware":
                bound = (1 + args.load_slack) * (i + 1) / len(hosts)
                allowed = [h for h in hosts if h.requests + 1 <= bound] or hosts
            best = max(longest.get(h.index + 1, 0) for h in allowed)
            candidates = [h for h in allowed if longest.get(h.index + 1, 0) == best]
            host = min(candidates, key=lambda h: (h.requests, h.index))
        elif router == "round-robin":
            host = hosts[i % len(hosts)]
        else:
            host = rng.choice(hosts)
        host.requests += 1
        hit_pages = host.lookup(packed) // args.page_size
        hit_tokens += min(input_length, hit_pages * TRACE_BLOCK)
        input_tokens += input_length
        if whole:
            host.store(packed, whole)
        bar.update(1)
    return {"router": router, "hit_rate": hit_tokens / input_tokens, "hit_tokens": hit_tokens,
            "input_tokens": input_tokens, "requests_per_host": [h.requests for h in hosts]}


def plot(rows: list[dict], command: str, path: Path) -> Path | None:
    made = new_plot((9, 4.5))
    if made is None:
        return None
    fig, ax = made
    names = [row["router"] for row in rows]
    rates = [100 * row["hit_rate"] for row in rows]
    colors = {"longest-prefix": "#7a5", "kv-aware": "#2a7", "round-robin": "#888", "random": "#bbb"}
    bars = ax.bar(names, rates, color=[colors[name] for name in names])
    for bar, row in zip(bars, rows):
        ax.annotate(f"{100 * row['hit_rate']:.1f} %\nper host {row['requests_per_host']}",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("fleet token hit rate (%)")
    ax.set_ylim(0, max(rates + [1]) * 1.3)
    ax.set_title(command, fontsize=9)
    return save_plot(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("fleet", __doc__)
    parser.add_argument("--hosts", type=int, default=3, help="daemons in the fleet (default 3)")
    parser.add_argument("--capacity", type=int, default=4000, help="pages each daemon holds (default 4000)")
    parser.add_argument("--page-size", type=int, default=16, help="tokens per page = one trace block (default 16)")
    parser.add_argument("--block-bytes", type=int, default=16, help="block-bytes of the daemons (default 16)")
    parser.add_argument("--requests", type=int, default=3000, help="trace requests replayed (default 3000)")
    parser.add_argument("--skip", type=int, default=0, help="start at this request of the trace (default 0)")
    parser.add_argument("--trace", type=Path, default=TRACE, help="Mooncake-format trace (default: the shared one)")
    parser.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated routers to compare")
    parser.add_argument("--load-slack", type=float, default=0.25,
                        help="kv-aware: a host may take this much over an even share (default 0.25)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random router (default 1)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-plot", action="store_true", help="do not write scripts/out/fleet.png")
    args = parser.parse_args(argv)
    command = command_line("fleet", argv)
    if not indexer_installed():
        print("fleet needs Dynamo's KV indexer: scripts/setup test (ai-dynamo-runtime)", file=sys.stderr)
        return 2
    if not args.trace.exists():
        print(f"no trace at {args.trace}", file=sys.stderr)
        return 2
    requests = load_requests(args.trace, args.skip, args.requests)
    routers = [name for name in args.routers.split(",") if name]
    unknown = set(routers) - set(ROUTERS)
    if unknown:
        parser.error(f"unknown routers {sorted(unknown)} (known: {', '.join(ROUTERS)})")
    OUT.mkdir(parents=True, exist_ok=True)
    hosts: list[Host] = []
    indexer = None
    rows = []
    try:
        hosts = [Host(i, args) for i in range(args.hosts)]
        indexer = start_indexer(str(OUT / "fleet-indexer.log"))
        for host in hosts:
            indexer.register(host.index + 1, host.pub, replay_endpoint=host.replay, block_size=args.page_size)
        bar = progress_bar(len(requests) * len(routers), "fleet", "req")
        for router in routers:
            rows.append(replay(router, hosts, indexer, requests, args, bar))
        bar.close()
    finally:
        if indexer is not None:
            indexer.stop()
        for host in hosts:
            host.stop()
    picture = None if args.no_plot else plot(rows, command, OUT / "fleet.png")
    if args.json:
        print(json.dumps({"command": command, "machine": machine(), "settings": {k: str(v) for k, v in vars(args).items()},
                          "results": rows}))
        return 0
    print(f"# {command}")
    print(f"{args.hosts} hosts x {args.capacity} pages, requests {args.skip}..{args.skip + len(requests)} of {args.trace.name}")
    reference = {row["router"]: row["hit_rate"] for row in rows}
    for row in rows:
        ratios = "  ".join(f"{row['hit_rate'] / reference[name]:.2f}x {name}" for name in reference
                           if name != row["router"] and reference[name])
        print(f"{row['router']:12s} hit rate {100 * row['hit_rate']:5.1f} %   requests per host "
              f"{row['requests_per_host']}   {ratios}")
    if picture is not None:
        print(f"plot: {shown(picture)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
