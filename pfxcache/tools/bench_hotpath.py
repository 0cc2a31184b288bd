"""Every ratio of issue 14's table in one invocation, each against its reference in the same run.

    scripts/bench-hotpath                 # short runs, median of 3
    scripts/bench-hotpath --no-peers      # without SGLang and Mooncake (nothing installed)
    scripts/bench-hotpath --json
    scripts/bench-hotpath --no-peers --policy lru   # the request path under the cheapest policy

Rounds (--repeat, default 3) alternate the servers so that a load change on a shared machine
hits both sides of a ratio alike; each figure is the median of the rounds' ratios.

  pfxget     PFXGET NOLEASE full hit of a 4,096-token PACKED prompt (256 pages) vs GET of a
             16 KiB key returning as many bytes (redis-benchmark -c 50, -P 1 and -P 16);
  pair       PFXGET with a lease + PFXRELEASE of it (a worker's round trip) vs GET + INCR,
             both through pfxcache.tools.pair_load (50 connections, 2 client processes);
  pfxset     PFXSET of one new page (16 KiB of DATA, random prompt, evicting once full) vs SET
             of 16 KiB to random keys (-P 1);
  ping       PING_MBULK -P 1 vs redis-server, and the bare trio server (the floor: one task per
             connection, no parsing) in the same round;
  store      the store core vs SGLang 0.5.23's RadixCache, page 16 and page 1 (match / insert /
             evict 10 %; pfxcache.tools.store_vs_sglang, CPU time);
  read_into  a worker's read_into of 256 scattered 64 KiB blocks of the daemon's mapped arena into
             an np.zeros buffer and into a kv_buffer (page-aligned), vs np.copyto of 16 MiB into the
             same aligned buffer (memcpy: the floor), best of 5 per round;
  mooncake   (extra) lookup + KV fetch of the same prompt from Mooncake Store on CPU vs PFXGET +
             read_into (pfxcache.tools.mooncake_peer).

A peer that is not installed (scripts/setup sglang mooncake; the launcher runs it) or cannot run
here is reported with the reason, and the rest runs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pfxcache.testing import start_daemon, start_redis_server
from pfxcache.tools import bench as resp_bench
from pfxcache.tools import mooncake_peer, pair_load, sglang_peer, store_vs_sglang
from pfxcache.tools.common import command_line, machine, progress_bar, tool_parser

#: issue 14's goals: (row key, what, goal)
GOALS = [
    ("pfxget_p1", "PFXGET NOLEASE 4,096 tok vs GET 16 KiB, -P 1", 0.5),
    ("pfxget_p16", "PFXGET NOLEASE 4,096 tok vs GET 16 KiB, -P 16", 0.4),
    ("pair", "PFXGET lease + PFXRELEASE vs GET + INCR", 0.5),
    ("pfxset_new", "PFXSET one new page vs SET, -P 1", 0.4),
    ("ping_p1", "PING_MBULK -P 1 vs redis-server", 0.7),
    ("store16_match", "store vs SGLang RadixCache, page 16: match", 5.0),
    ("store16_insert", "store vs SGLang RadixCache, page 16: insert", 2.0),
    ("store16_evict", "store vs SGLang RadixCache, page 16: evict 10 %", 2.0),
    ("store1_match", "store vs SGLang RadixCache, page 1: match", 1.0),
    ("store1_insert", "store vs SGLang RadixCache, page 1: insert", 1.0),
    ("store1_evict", "store vs SGLang RadixCache, page 1: evict 10 %", 1.0),
    ("read_into_zeros", "read_into 256 x 64 KiB scattered vs np.copyto, into np.zeros", 0.9),
    ("read_into_aligned", "read_into 256 x 64 KiB scattered vs np.copyto, into kv_buffer", 0.9),
]


def cpu_ns(pid: int) -> int:
    """Nanoseconds the process has run on a CPU, all threads (/proc/PID/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


class Served:
    """What one run cost the server: requests/s, and CPU microseconds per request (load-independent)."""

    def __init__(self) -> None:
        self.rps: dict[str, list[float]] = {}
        self.cpu_us: dict[str, list[float]] = {}

    def run(self, key: str, side: str, pid: int, fn, requests: int) -> float:
        before = cpu_ns(pid)
        rate = fn()
        self.rps.setdefault(f"{key}/{side}", []).append(rate)
        self.cpu_us.setdefault(f"{key}/{side}", []).append((cpu_ns(pid) - before) / 1000 / requests)
        return rate

    def cpu_ratio(self, key: str, ours: str = "pfxcached", theirs: str = "redis") -> float | None:
        a, b = self.cpu_us.get(f"{key}/{ours}"), self.cpu_us.get(f"{key}/{theirs}")
        return statistics.median(b) / statistics.median(a) if a and b else None


def _rps(address, load_args, clients, pipeline, requests) -> float:
    return resp_bench.run_benchmark(address, load_args, clients, pipeline, requests)["rps"]


def resp_rounds(args, bar, served: Served) -> tuple[dict[str, list[float]], dict]:
    """The RESP rows: per round, each pair of servers back to back; returns ratios per round and floor figures."""
    loads = {load.key: load for load in resp_bench.build_loads(args)}
    policy = ("--maxmemory-policy", args.policy) if args.policy else ()
    ours = start_daemon("--loglevel", "warning", "--maxmemory", args.maxmemory,
                        "--block-bytes", str(resp_bench.BLOCK_BYTES), "--page-size", str(resp_bench.PAGE_TOKENS),
                        *policy)
    redis = start_redis_server("--maxmemory", args.maxmemory, "--maxmemory-policy", "allkeys-lru")
    floor = resp_bench.start_floor()
    ratios: dict[str, list[float]] = {k: [] for k in ("pfxget_p1", "pfxget_p16", "pair", "pfxset_new", "ping_p1",
                                                        "ping_floor")}
    extra: dict[str, list[float]] = {"ping_floor_rps": [], "ping_redis_rps": [], "ping_pfx_rps": [],
                                     "pair_pfx_per_s": [], "pair_redis_per_s": []}
    n, c = args.requests, args.clients
    get, new = loads["pfxget"], loads["pfxset-new"]
    prompt = get.pfx[3]
    lease = pair_load.lease_pair(resp_bench.NAMESPACE, prompt, resp_bench.GET_TOKENS)
    reference_pair = pair_load.get_pair(get.redis[1], [b"INCR", b"leases"])
    try:
        for _ in range(args.repeat):
            get.prepare(ours.address, redis.address)
            for p, key in ((1, "pfxget_p1"), (16, "pfxget_p16")):
                before = resp_bench.pfx_stats(ours.address)
                theirs = served.run(key, "redis", redis.proc.pid, lambda: _rps(redis.address, get.redis, c, p, n), n)
                mine = served.run(key, "pfxcached", ours.proc.pid, lambda: _rps(ours.address, get.pfx, c, p, n), n)
                get.check(before, resp_bench.pfx_stats(ours.address), n)
                ratios[key].append(mine / theirs)
                bar.update(1)
            theirs = served.run("pair", "redis", redis.proc.pid, lambda: pair_load.run(
                redis.address, reference_pair, pairs=args.pairs, clients=c)["pairs_per_s"], args.pairs)
            before = resp_bench.pfx_stats(ours.address)
            mine = served.run("pair", "pfxcached", ours.proc.pid, lambda: pair_load.run(
                ours.address, lease, pairs=args.pairs, clients=c)["pairs_per_s"], args.pairs)
            after = resp_bench.pfx_stats(ours.address)
            if after["leases"] != before["leases"]:
                raise RuntimeError("the lease pairs left leases behind")
            ratios["pair"].append(mine / theirs)
            extra["pair_pfx_per_s"].append(mine)
            extra["pair_redis_per_s"].append(theirs)
            bar.update(1)
            before = resp_bench.pfx_stats(ours.address)
            theirs = served.run("pfxset_new", "redis", redis.proc.pid, lambda: _rps(redis.address, new.redis, c, 1, n), n)
            mine = served.run("pfxset_new", "pfxcached", ours.proc.pid, lambda: _rps(ours.address, new.pfx, c, 1, n), n)
            new.check(before, resp_bench.pfx_stats(ours.address), n)
            ratios["pfxset_new"].append(mine / theirs)
            bar.update(1)
            ping = ["-t", "ping_mbulk"]
            theirs = served.run("ping_p1", "redis", redis.proc.pid, lambda: _rps(redis.address, ping, c, 1, n), n)
            mine = served.run("ping_p1", "pfxcached", ours.proc.pid, lambda: _rps(ours.address, ping, c, 1, n), n)
            bare = served.run("ping_p1", "floor", floor.pid, lambda: _rps(("127.0.0.1", floor.port), ping, c, 1, n), n)
            ratios["ping_p1"].append(mine / theirs)
            ratios["ping_floor"].append(mine / bare)
            extra["ping_floor_rps"].append(bare)
            extra["ping_redis_rps"].append(theirs)
            extra["ping_pfx_rps"].append(mine)
            bar.update(1)
    finally:
        ours.stop()
        redis.stop()
        floor.terminate()
        floor.wait()
    return ratios, {k: statistics.median(v) for k, v in extra.items() if v}


def read_into_rounds(repeat: int) -> tuple[dict[str, list[float]], dict]:
    """read_into of 256 scattered 64 KiB blocks of a real daemon's mapped arena vs np.copyto of 16 MiB."""
    from pfxcache.client import PrefixCache, kv_buffer

    blocks, block_bytes = 256, 64 * 1024
    daemon = start_daemon("--block-bytes", "64kb", "--maxmemory", "128mb")
    ratios: dict[str, list[float]] = {"read_into_zeros": [], "read_into_aligned": []}
    speeds: dict[str, list[float]] = {"copyto_gb_s": [], "zeros_gb_s": [], "aligned_gb_s": []}
    try:
        cache = PrefixCache(f"redis://{daemon.host}:{daemon.port}/0")
        try:
            arena = cache.attach()
            arena.array[:] = 7  # touch every page of the mapping once
            ids = np.random.default_rng(14).permutation(arena.nblocks)[:blocks]
            zeros = np.zeros((blocks, block_bytes), np.uint8)
            aligned = kv_buffer((blocks, block_bytes))
            source = arena.array[:blocks]
            nbytes = blocks * block_bytes

            def best(fn) -> float:
                times = []
                for _ in range(5):
                    start = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - start)
                return min(times)

            for _ in range(repeat):
                ref = best(lambda: np.copyto(aligned, source))
                into_zeros = best(lambda: arena.read_into(ids, zeros))
                into_aligned = best(lambda: arena.read_into(ids, aligned))
                ratios["read_into_zeros"].append(ref / into_zeros)
                ratios["read_into_aligned"].append(ref / into_aligned)
                speeds["copyto_gb_s"].append(nbytes / ref / 1e9)
                speeds["zeros_gb_s"].append(nbytes / into_zeros / 1e9)
                speeds["aligned_gb_s"].append(nbytes / into_aligned / 1e9)
            if not np.array_equal(aligned, arena.array[ids]):
                raise RuntimeError("read_into gave other bytes than the arena's")
            zeros_offset = zeros.ctypes.data % 64
        finally:
            cache.close()
    finally:
        daemon.stop()
    return ratios, {**{k: statistics.median(v) for k, v in speeds.items()}, "zeros_offset_mod_64": zeros_offset}


def store_rows(args) -> tuple[dict[str, list[float]], list[dict], str | None]:
    try:
        sglang = sglang_peer.load()
    except sglang_peer.PeerUnavailable as exc:
        return {}, [], str(exc)
    ratios: dict[str, list[float]] = {}
    rows = []
    for page in (16, 1):
        row = store_vs_sglang.compare(sglang, page_size=page, tokens=2**16, prompt_tokens=512,
                                      new_pages=max(1, 128 // page), repeat=args.repeat, min_time=0.1, seed=1)
        rows.append(row)
        for op in ("match", "insert", "evict"):
            ratios[f"store{page}_{op}"] = [row[f"{op}_ratio"]]  # already the median of the rounds
    return ratios, rows, None


def main() -> int:
    parser = tool_parser("bench-hotpath", __doc__)
    parser.add_argument("-n", "--requests", type=int, default=20_000, help="redis-benchmark requests per run")
    parser.add_argument("-c", "--clients", type=int, default=50, help="connections (default 50)")
    parser.add_argument("--pairs", type=int, default=10_000, help="request pairs per pair run (default 10000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; figures are medians (default 3)")
    parser.add_argument("--maxmemory", default="64mb", help="maxmemory of both servers (default 64mb)")
    parser.add_argument("--keyspace", type=int, default=1_000_000, help="-r of the PFXSET new-page load")
    parser.add_argument("--policy", help="pfxcached's maxmemory-policy (default: the daemon's); lru shows what "
                        "the request path costs with the cheapest store bookkeeping")
    parser.add_argument("--no-peers", action="store_true", help="skip SGLang and Mooncake (the launcher installs neither)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args()
    args.echo_bytes = 1024  # read by scripts/bench's load table (its ECHO load is not run here)

    bar = progress_bar(5 * args.repeat + 3, "bench-hotpath", "step")
    served = Served()
    ratios, extra = resp_rounds(args, bar, served)
    copies, speeds = read_into_rounds(args.repeat)
    ratios.update(copies)
    bar.update(1)
    store, store_detail, store_note = ({}, [], "skipped (--no-peers)") if args.no_peers else store_rows(args)
    ratios.update(store)
    bar.update(1)
    mooncake, mooncake_note = None, "skipped (--no-peers)"
    if not args.no_peers:
        try:
            mooncake, mooncake_note = mooncake_peer.compare(seconds=0.5, repeat=args.repeat), None
        except mooncake_peer.PeerUnavailable as exc:
            mooncake_note = str(exc)
    bar.update(1)
    bar.close()

    figures = {key: statistics.median(values) for key, values in ratios.items() if values}
    command = command_line("bench-hotpath")
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    rows = [{"key": key, "measure": what, "goal": goal, "ratio": figures.get(key), "cpu_ratio": served.cpu_ratio(key),
             "met": figures.get(key) is not None and figures[key] >= goal} for key, what, goal in GOALS]
    cpu_us = {key: statistics.median(values) for key, values in served.cpu_us.items()}
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    if args.json:
        print(json.dumps({"command": command, "machine": {**machine(), "redis": redis_version}, "rows": rows,
                          "ratios_per_round": ratios, "ping_floor_ratio": figures.get("ping_floor"),
                          "server_cpu_us_per_request": cpu_us, "load_average": load,
                          "figures": {**extra, **speeds}, "store_vs_sglang": store_detail, "sglang_note": store_note,
                          "mooncake": mooncake, "mooncake_note": mooncake_note}, indent=2))
        return 0
    print(f"$ {command}")
    print(f"issue 14's table, {machine()['cpus']} CPUs (load average {load} at the end), redis-server "
          f"{redis_version.removeprefix('v=')}; median of {args.repeat} rounds, each ratio against its reference "
          f"in the same round; pfxcached maxmemory-policy {args.policy or 'default'}")
    print(f"{'measure':<64}{'ratio':>8}{'goal':>8}  {'verdict':<8}{'CPU ratio':>10}")
    print("-" * 100)
    for row in rows:
        shown_ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "-"
        verdict = "met" if row["met"] else ("MISSED" if row["ratio"] is not None else "not run")
        cpu = f"{row['cpu_ratio']:.2f}x" if row["cpu_ratio"] is not None else ""
        print(f"{row['measure']:<64}{shown_ratio:>8}{row['goal']:>7}x  {verdict:<8}{cpu:>10}")
    print("ratio: requests/s of pfxcached over the reference's (the issue's measure); CPU ratio: the server CPU "
          "time per request of the reference over pfxcached's (/proc schedstat; what the load on a shared machine "
          "does not change)")
    print("server CPU us per request (median): " + ", ".join(
        f"{key} {value:.1f}" for key, value in sorted(cpu_us.items())))
    print("floors measured in the same run (what Python on this machine can reach):")
    print(f"  PING_MBULK -P 1: bare trio server {extra['ping_floor_rps']:,.0f} rps, redis-server "
          f"{extra['ping_redis_rps']:,.0f}, pfxcached {extra['ping_pfx_rps']:,.0f} "
          f"(pfxcached = {figures['ping_floor']:.2f}x the bare trio server)")
    print(f"  lease pairs/s: pfxcached {extra['pair_pfx_per_s']:,.0f}, redis-server {extra['pair_redis_per_s']:,.0f} "
          f"(the Python client drives both)")
    print(f"  copies of 16 MiB: np.copyto {speeds['copyto_gb_s']:.1f} GB/s (memcpy), read_into scattered into "
          f"kv_buffer {speeds['aligned_gb_s']:.1f} GB/s, into np.zeros {speeds['zeros_gb_s']:.1f} GB/s "
          f"(np.zeros data at {speeds['zeros_offset_mod_64']} mod 64)")
    if store_detail:
        print()
        print("\n".join(store_vs_sglang.report(store_detail, "from its PyPI wheel")))
    else:
        print(f"store vs SGLang: {store_note}")
    print()
    if mooncake is not None:
        print("\n".join(mooncake_peer.report(mooncake)))
    else:
        print(f"Mooncake Store peer: {mooncake_note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
