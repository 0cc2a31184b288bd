"""A fleet of pfxcached hosts behind one KV-aware router (Dynamo's KV indexer), or over a shared Redis Cluster.

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

With --shared-tier the tool also starts a Redis Cluster of --masters masters on loopback
(pfxcache.testing_cluster; redis-server and redis-cli from ``scripts/setup redis``) and compares
fleets rather than routers, each setup from empty caches and an emptied cluster:

  one                  one daemon holding the whole fleet's capacity (--hosts x --capacity pages)
  round-robin          the fleet, round-robin, no shared tier
  round-robin+shared   the fleet, round-robin, over the cluster (remote-tier-write through)
  round-robin+back     the same with remote-tier-write back (pages reach the cluster when evicted)
  kv-aware             the fleet routed by the indexer as above, no shared tier
  kv-aware+shared      both: routed and over the cluster (write through)

A request's hit counts what the chosen host served, pages fetched from the cluster included (a
fetch later than remote-tier-timeout is a miss, as for a real request). Unless --no-settle, each
PFXSET is followed by a wait until that host's write queue is empty: a request's prefill takes
longer than its pages' write, so the next request finds them (a daemon remembers a page it found
absent for a second, which the replay would otherwise turn into misses no fleet would see). The
cluster holds what it is sent, up to --cluster-maxmemory per node (allkeys-lru; default: no
bound); the keys it holds at the end are reported with the pages each setup wrote to it. The
kv-aware setups need Dynamo's indexer and are left out, saying so, without it.

    scripts/fleet                                  # 3 hosts, 3000 requests
    scripts/fleet --requests 1000 --capacity 2000
    scripts/fleet --skip 6000 --json
    scripts/fleet --shared-tier                    # one daemon vs the fleet, routed, shared or both

The plot (hit rate per router or setup, requests per host) goes to scripts/out/fleet.png
(fleet-shared.png with --shared-tier).
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from pfxcache.testing import RedisServerMissing, free_port, start_daemon
from pfxcache.testing_cluster import redis_cluster
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
    """One daemon of the fleet: ``capacity`` pages, KV events when ``events``, ``extra`` directives."""

    def __init__(self, index: int, args, capacity: int | None = None, extra: tuple[str, ...] = (),
                 events: bool = True) -> None:
        self.index = index
        capacity = args.capacity if capacity is None else capacity
        for attempt in range(3):  # a free port may be taken (an outgoing connection's) before the daemon binds it
            self.pub = f"tcp://127.0.0.1:{free_port()}"
            self.replay = f"tcp://127.0.0.1:{free_port()}"
            published = ("--kv-events-endpoint", self.pub, "--kv-events-replay-endpoint", self.replay,
                         "--kv-events-replay-buffer", "1000000") if events else ()
            try:
                self.daemon = start_daemon(
                    "--arena", "memory", "--page-size", str(args.page_size), "--block-bytes", str(args.block_bytes),
                    "--maxmemory", str(max(1024, capacity * args.block_bytes)), "--evict-low-watermark", "0",
                    *published, *extra)
                break
            except RuntimeError as failed:
                if "Address already in use" not in str(failed) or attempt == 2:
                    raise
        try:
            self.conn = RespConnection(self.daemon.address)
        except OSError:
            self.daemon.stop()
            raise
        self.block_bytes = args.block_bytes
        self.requests = 0

    def lookup(self, packed: bytes) -> int:
        return self.checked(self.conn.call("PFXGET", NAMESPACE, "PACKED", packed, "NOLEASE"))[1]

    def checked(self, reply):
        if isinstance(reply, Exception):
            raise RuntimeError(f"host {self.index} answered an error: {reply}")
        return reply

    def store(self, packed: bytes, whole: int) -> None:
        self.checked(self.conn.call("PFXSET", NAMESPACE, "PACKED", packed, "DATA", b"\0" * (whole * self.block_bytes)))

    def tiers(self) -> dict[str, str]:
        text = self.checked(self.conn.call("INFO", "tiers")).decode()
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))

    def settle(self) -> None:
        """Wait until the shared tier's write queue is empty (pages written or dropped)."""
        deadline = time.monotonic() + 60
        while self.tiers().get("tier_remote_queue_pages", "0") != "0":
            if time.monotonic() > deadline:
                raise RuntimeError(f"host {self.index}'s shared-tier queue did not drain: {self.tiers()}")
            time.sleep(0.0005)

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


def replay(router: str, hosts: list[Host], indexer, requests, args, bar, settle: bool = False) -> dict:
    for host in hosts:
        host.conn.call("FLUSHALL")
        host.requests = 0
    if router in ("longest-prefix", "kv-aware"):
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
            if settle:
                host.settle()
        bar.update(1)
    return {"router": router, "hit_rate": hit_tokens / input_tokens, "hit_tokens": hit_tokens,
            "input_tokens": input_tokens, "requests_per_host": [h.requests for h in hosts]}


# -- --shared-tier: one daemon vs the fleet, routed, shared or both ---------------------------------

# setup: (router, shared-tier write mode or None, one daemon with the whole capacity)
SETUPS = {"one": ("round-robin", None, True),
          "round-robin": ("round-robin", None, False),
          "round-robin+shared": ("round-robin", "through", False),
          "round-robin+back": ("round-robin", "back", False),
          "kv-aware": ("kv-aware", None, False),
          "kv-aware+shared": ("kv-aware", "through", False)}
TARGET = 0.95  # round-robin+shared / one


def run_setup(name: str, cluster, requests, args, bar) -> dict:
    router, mode, alone = SETUPS[name]
    routed = router in ("longest-prefix", "kv-aware")
    cluster.on_all("FLUSHALL")
    extra = ("--remote-tier", cluster.url(), "--remote-tier-write", mode,
             "--remote-tier-timeout", str(args.remote_timeout_ms)) if mode else ()
    hosts: list[Host] = []
    indexer = None
    try:
        for i in range(1 if alone else args.hosts):  # one by one: those started are stopped if one fails
            hosts.append(Host(0, args, capacity=args.hosts * args.capacity, events=False) if alone
                         else Host(i, args, extra=extra, events=routed))
        for host in hosts:
            deadline = time.monotonic() + 30
            while mode and host.tiers()["tier_remote_state"] != "ok":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"host {host.index}: the shared tier did not connect: {host.tiers()}")
                time.sleep(0.05)
        if routed:
            indexer = start_indexer(str(OUT / "fleet-indexer.log"))
            for host in hosts:
                indexer.register(host.index + 1, host.pub, replay_endpoint=host.replay, block_size=args.page_size)
        row = replay(router, hosts, indexer, requests, args, bar, settle=bool(mode) and not args.no_settle)
        row["setup"] = name
        row["capacity_pages"] = sum(args.hosts * args.capacity if alone else args.capacity for _ in hosts)
        if mode:
            for host in hosts:
                host.settle()
            infos = [host.tiers() for host in hosts]
            total = {key: sum(int(info[f"tier_remote_{key}"]) for info in infos)
                     for key in ("writes", "hits", "misses", "fetches", "fetches_late", "fetches_busy", "drops",
                                 "verify_failures", "errors")}
            keys = sum(int(cluster.cli("DBSIZE", node=i)) for i in range(cluster.masters))
            row["shared_tier"] = {"write": mode, "cluster_keys": keys,
                                  **{f"pages_{k}" if k in ("writes", "hits") else k: v for k, v in total.items()}}
        return row
    except Exception:  # what the daemons logged says more than the reply did
        for host in hosts:
            print(f"host {host.index}'s pfxcached log, the end:\n" + "\n".join(host.daemon.log[-30:]), file=sys.stderr)
        raise
    finally:
        if indexer is not None:
            indexer.stop()
        for host in hosts:
            host.stop()


def shared_tier(args, requests, setups: list[str], bar) -> list[dict]:
    options = ("--maxmemory", args.cluster_maxmemory, "--maxmemory-policy", "allkeys-lru") \
        if args.cluster_maxmemory else ()
    with redis_cluster(masters=args.masters, options=options) as cluster:
        return [run_setup(name, cluster, requests, args, bar) for name in setups]


def report_shared(rows: list[dict], args, requests) -> None:
    print(f"{args.hosts} hosts x {args.capacity} pages (one: {args.hosts * args.capacity}), a {args.masters}-master "
          f"cluster ({'maxmemory ' + args.cluster_maxmemory + ' a node' if args.cluster_maxmemory else 'no bound'}), "
          f"requests {args.skip}..{args.skip + len(requests)} of {args.trace.name}; "
          f"remote-tier-timeout {args.remote_timeout_ms} ms{'' if args.no_settle else ', writes settled'}")
    one = next((row["hit_rate"] for row in rows if row["setup"] == "one"), None)
    print(f"{'setup':<20}{'hit rate':>9}{'vs one':>8}  {'pages written':>13}{'from cluster':>13}{'late':>6}"
          f"{'drops':>7}{'cluster keys':>13}  requests per host")
    for row in rows:
        t = row.get("shared_tier")
        ratio = f"{row['hit_rate'] / one:.3f}" if one else "-"
        cells = (f"{t['pages_writes']:>13}{t['pages_hits']:>13}{t['fetches_late']:>6}{t['drops']:>7}"
                 f"{t['cluster_keys']:>13}") if t else f"{'-':>13}{'-':>13}{'-':>6}{'-':>7}{'-':>13}"
        print(f"{row['setup']:<20}{100 * row['hit_rate']:>8.1f}%{ratio:>8}  {cells}  {row['requests_per_host']}")
    shared = next((row for row in rows if row["setup"] == "round-robin+shared"), None)
    if one and shared:
        ratio = shared["hit_rate"] / one
        print(f"target round-robin+shared / one >= {TARGET}: {ratio:.3f} ({'met' if ratio >= TARGET else 'MISSED'})")


def plot(rows: list[dict], command: str, path: Path) -> Path | None:
    made = new_plot((9, 4.5))
    if made is None:
        return None
    fig, ax = made
    names = [row.get("setup", row["router"]) for row in rows]
    rates = [100 * row["hit_rate"] for row in rows]
    colors = {"longest-prefix": "#7a5", "kv-aware": "#2a7", "round-robin": "#888", "random": "#bbb", "one": "#47c"}
    bars = ax.bar(names, rates, color=[colors.get(name, "#c73" if "shared" in name or "back" in name else "#888")
                                       for name in names])
    ax.tick_params(axis="x", labelsize=8)
    one = next((row["hit_rate"] for row in rows if row.get("setup") == "one"), None)
    for bar, row in zip(bars, rows):
        if "setup" in row:  # --shared-tier: the ratio to one daemon, and what came from the cluster
            under = f"{row['hit_rate'] / one:.2f}x one" if one else ""
            if "shared_tier" in row:
                under += f"\n{row['shared_tier']['pages_hits']} pages\nfrom the cluster"
        else:
            under = f"per host {row['requests_per_host']}"
        ax.annotate(f"{100 * row['hit_rate']:.1f} %\n{under}",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("fleet token hit rate (%)")
    ax.set_ylim(0, max(rates + [1]) * 1.4)
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
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--no-plot", action="store_true", help="do not write the plot under scripts/out")
    group = parser.add_argument_group("--shared-tier")
    group.add_argument("--shared-tier", action="store_true",
                       help="compare one daemon, the fleet, the fleet over a Redis Cluster, routed, both")
    group.add_argument("--setups", default=",".join(SETUPS), help="comma-separated setups to compare")
    group.add_argument("--masters", type=int, default=3, help="masters of the cluster (default 3)")
    group.add_argument("--cluster-maxmemory", default="",
                       help="maxmemory of each cluster node, allkeys-lru (default: no bound)")
    group.add_argument("--remote-timeout-ms", type=int, default=50,
                       help="the daemons' remote-tier-timeout (default 50, the directive's default)")
    group.add_argument("--no-settle", action="store_true",
                       help="do not wait for a host's shared-tier writes after each PFXSET")
    args = parser.parse_args(argv)
    command = command_line("fleet", argv)
    if not args.trace.exists():
        print(f"no trace at {args.trace}", file=sys.stderr)
        return 2
    requests = load_requests(args.trace, args.skip, args.requests)
    if args.shared_tier:
        return main_shared(args, requests, command, parser)
    if not indexer_installed():
        print("fleet needs Dynamo's KV indexer: scripts/setup test (ai-dynamo-runtime)", file=sys.stderr)
        return 2
    routers = [name for name in args.routers.split(",") if name]
    unknown = set(routers) - set(ROUTERS)
    if unknown:
        parser.error(f"unknown routers {sorted(unknown)} (known: {', '.join(ROUTERS)})")
    OUT.mkdir(parents=True, exist_ok=True)
    hosts: list[Host] = []
    indexer = None
    rows = []
    try:
        for i in range(args.hosts):  # one by one: those started are stopped if one fails
            hosts.append(Host(i, args))
        indexer = start_indexer(str(OUT / "fleet-indexer.log"))
        for host in hosts:
            indexer.register(host.index + 1, host.pub, replay_endpoint=host.replay, block_size=args.page_size)
        bar = progress_bar(len(requests) * len(routers), "fleet", "req", quiet=args.quiet)
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


def main_shared(args, requests, command: str, parser) -> int:
    setups = [name for name in args.setups.split(",") if name]
    unknown = set(setups) - set(SETUPS)
    if unknown:
        parser.error(f"unknown setups {sorted(unknown)} (known: {', '.join(SETUPS)})")
    skipped = []
    if not indexer_installed():
        routed = [name for name in setups if SETUPS[name][0] == "kv-aware"]
        setups = [name for name in setups if name not in routed]
        skipped = [f"{name}: Dynamo's KV indexer is not installed (scripts/setup test)" for name in routed]
    OUT.mkdir(parents=True, exist_ok=True)
    bar = progress_bar(len(requests) * len(setups), "fleet", "req", quiet=args.quiet)
    try:
        rows = shared_tier(args, requests, setups, bar)
    except RedisServerMissing as missing:
        print(f"fleet --shared-tier needs a Redis Cluster: {missing}", file=sys.stderr)
        return 2
    finally:
        bar.close()
    picture = None if args.no_plot else plot(rows, command, OUT / "fleet-shared.png")
    if args.json:
        settings = {k: str(v) for k, v in vars(args).items()}
        print(json.dumps({"command": command, "machine": machine(), "settings": settings, "results": rows,
                          "skipped": skipped}))
        return 0
    print(f"# {command}")
    report_shared(rows, args, requests)
    for reason in skipped:
        print(f"skipped {reason}")
    if picture is not None:
        print(f"plot: {shown(picture)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
