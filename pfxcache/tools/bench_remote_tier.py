"""What the shared tier costs: fetch bandwidth against redis-py's GET, and a prompt's latency from
the shared tier against RAM and the disk tier.

The tool starts its own Redis Cluster on loopback (--masters masters, no replicas; redis-server and
redis-cli from ``scripts/setup redis``) and daemons in temporary directories, and stops them all
however it ends. Two parts (--parts), each against a reference measured in the same invocation:

  bandwidth  For each --page-mib size: a writer daemon (``remote-tier-write through``) stores
             --fill-mib of prompts of --prompt-pages pages and waits until the shared tier has
             written every page. A reader daemon of the same geometry, with an arena that holds
             them all and ``remote-tier-timeout`` --timeout-ms (so that no fetch is late), then
             looks each prompt up (PFXGET NOLEASE, no data): its pages are fetched from the
             cluster, verified and copied into fresh arena blocks. Fetched bytes (INFO
             tier_remote_fetch_bytes) / wall time is the bandwidth; a pass ends with FLUSHALL (the
             reader's RAM only). References, same cluster, same keys, same values: redis-py's
             RedisCluster reading each prompt's pages with one pipeline of GETs a prompt (as the
             daemon batches them), and with one GET a page. --rounds rounds, the three passes
             alternating which goes first; figures are medians, the ratio judged the median of
             each round's daemon / the faster of the two GET passes (the target: >= 0.8). Also
             shown: CPU ms per MiB read by the reading process (the daemon, all its threads;
             this process for redis-py) and the daemon's average fetch (its thread's pipeline and
             checks, then the insert into the arena), which say where a shortfall comes from.
  latency    One --prompt-tokens prompt (pages of --page-size tokens, --kv-bytes-per-token x page
             size bytes each), timed with PFXGET NOLEASE with and without WITHDATA: from the shared
             tier (a reader daemon, the prompt written by another; before each sample the reader's
             copy leaves RAM by PFXEVICT PAGES, which never touches the cluster), from RAM (the same
             reader, prompt resident), and from a disk tier (a third daemon with ``disk-tier-size``
             and no shared tier; the page cache warm, and cold: dropped). p50 and p99 in ms of
             --samples samples; the shared tier's p50 over RAM's and over warm disk's, side by side.

Every sample checks what it was served (the whole prompt, the bytes when asked, and the tier's hit
counter), so a figure is never that of a miss. --quick shrinks both parts (the tests' setting).

    scripts/bench-remote-tier
    scripts/bench-remote-tier --parts bandwidth --page-mib 1,4 --rounds 5
    scripts/bench-remote-tier --quick --json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager

import numpy as np

from pfxcache.daemon.store.idents import IDENT_BYTES, chain, namespace_ident
from pfxcache.daemon.tier import format as tier_format
from pfxcache.daemon.tier import remote_format
from pfxcache.testing import RedisServerMissing
from pfxcache.testing_cluster import redis_cluster, wait_for
from pfxcache.tools.bench_kv_events import cpu_seconds
from pfxcache.tools.bench_tier import Served, drop_page_cache, geometry, percentiles, prompt, serve
from pfxcache.tools.common import command_line, machine, progress_bar, tool_parser

NS = b"bench"
PARTS = ("bandwidth", "latency")
MIB = 1 << 20
TARGET = 0.8  # daemon fetch / redis-py pipelined GET
DEFAULTS = {"page_mib": "1,4", "prompt_pages": 8, "fill_mib": 256, "rounds": 5, "timeout_ms": 10000,
            "prompt_tokens": 4096, "page_size": 16, "kv_bytes_per_token": 4096, "samples": 30, "masters": 3}
QUICK = {**DEFAULTS, "page_mib": "1", "prompt_pages": 4, "fill_mib": 16, "rounds": 1,
         "prompt_tokens": 512, "kv_bytes_per_token": 256, "samples": 3}


def page_keys(tokens: bytes, page_size: int) -> list[bytes]:
    """The shared tier's keys of the prompt's whole pages (every daemon computes the same)."""
    idents = chain(namespace_ident(NS), tokens, page_size * 4)
    return [remote_format.key_of(NS, bytes(idents[i : i + IDENT_BYTES])) for i in range(0, len(idents), IDENT_BYTES)]


@contextmanager
def serve_remote(cluster, *args: str, timeout_ms: int, mode: str = "through") -> Iterator[Served]:
    """A daemon (bench_tier.serve) over the cluster, once its shared tier is connected."""
    with serve(*args, "--remote-tier", cluster.url(), "--remote-tier-timeout", str(timeout_ms),
               "--remote-tier-write", mode, "--remote-tier-queue", str(1 << 30)) as s:
        wait_for(lambda: s.tiers()["tier_remote_state"] == "ok", "the shared tier connected")
        yield s


def settle_writes(s: Served, pages: int, timeout: float = 600.0) -> dict:
    """Wait until the daemon's shared tier has written ``pages`` pages and holds nothing queued."""
    wait_for(lambda: s.tiers()["tier_remote_writes"] >= pages and s.tiers()["tier_remote_queue_pages"] == 0,
             f"{pages} pages written to the shared tier", timeout)
    info = s.tiers()
    if info["tier_remote_drops"]:
        raise RuntimeError(f"the writer dropped {info['tier_remote_drops']} pages: {info}")
    return info


def lookup(s: Served, tokens: bytes, pages: int, page_size: int, *extra: str, data: bytes | None = None) -> None:
    reply = s.client.execute_command("PFXGET", NS, "PACKED", tokens, "NOLEASE", *extra)
    if reply[b"matched"] != pages * page_size or (data is not None and reply[b"data"] != data):
        raise RuntimeError(f"PFXGET came back short or wrong ({reply[b'matched']} of {pages * page_size} tokens)")


# -- 1. fetch bandwidth --------------------------------------------------------------------------------

def bandwidth_one(cluster, page_mib: int, opts, bar) -> dict:
    bb = page_mib * MIB
    count = max(1, opts.fill_mib // (page_mib * opts.prompt_pages))
    pages = count * opts.prompt_pages
    ps = opts.page_size
    prompts = [prompt(10_000 + i, opts.prompt_pages * ps) for i in range(count)]
    rng = np.random.default_rng(3)
    with serve_remote(cluster, *geometry(ps, bb, (pages + 2) * bb), timeout_ms=opts.timeout_ms) as writer:
        for tokens in prompts:
            data = rng.integers(0, 256, opts.prompt_pages * bb, dtype=np.uint8).tobytes()
            writer.client.execute_command("PFXSET", NS, "PACKED", tokens, "DATA", data)
        settle_writes(writer, pages)
    keys = [page_keys(tokens, ps) for tokens in prompts]
    runs: dict[str, list[float]] = {"daemon": [], "pipeline": [], "get": []}
    cpu: dict[str, float] = {"daemon": 0.0, "pipeline": 0.0, "get": 0.0}  # CPU seconds of the reading process
    ratios = []
    with serve_remote(cluster, *geometry(ps, bb, (pages + 2) * bb), timeout_ms=opts.timeout_ms) as reader, \
            closing(cluster.client(socket_timeout=60)) as client:

        def daemon_pass() -> float:
            before = reader.tiers()
            busy = cpu_seconds(reader.daemon.proc.pid)
            started = time.perf_counter()
            for tokens in prompts:
                lookup(reader, tokens, opts.prompt_pages, ps)
            seconds = time.perf_counter() - started
            cpu["daemon"] += cpu_seconds(reader.daemon.proc.pid) - busy
            after = reader.tiers()
            got = after["tier_remote_fetch_bytes"] - before["tier_remote_fetch_bytes"]
            if after["tier_remote_hits"] - before["tier_remote_hits"] != pages or got < pages * bb:
                raise RuntimeError(f"the reader fetched {got} bytes, not {pages} pages of {bb}")
            reader.client.execute_command("FLUSHALL")
            return got / seconds / 1e6

        def pipeline_pass() -> float:
            got = 0
            busy, started = time.process_time(), time.perf_counter()
            for chunk in keys:
                pipe = client.pipeline(transaction=False)
                for k in chunk:
                    pipe.get(k)
                got += sum(len(v) for v in pipe.execute())
            cpu["pipeline"] += time.process_time() - busy
            return got / (time.perf_counter() - started) / 1e6

        def get_pass() -> float:
            got = 0
            busy, started = time.process_time(), time.perf_counter()
            for chunk in keys:
                for k in chunk:
                    got += len(client.get(k))
            cpu["get"] += time.process_time() - busy
            return got / (time.perf_counter() - started) / 1e6

        passes = {"daemon": daemon_pass, "pipeline": pipeline_pass, "get": get_pass}
        order = list(passes)
        for rnd in range(opts.rounds):
            figures = {}
            for name in order[rnd % 3:] + order[: rnd % 3]:
                figures[name] = passes[name]()
                runs[name].append(figures[name])
            ratios.append(figures["daemon"] / max(figures["pipeline"], figures["get"]))
            bar.update(1)
        info = reader.tiers()
    return {"page_bytes": bb, "prompts": count, "prompt_pages": opts.prompt_pages, "pages": pages,
            "rounds": opts.rounds, "runs": runs, "daemon_mb_s": statistics.median(runs["daemon"]),
            "pipeline_get_mb_s": statistics.median(runs["pipeline"]), "get_mb_s": statistics.median(runs["get"]),
            "daemon_over_best_get": statistics.median(ratios),
            "daemon_over_pipeline_get": statistics.median(runs["daemon"]) / statistics.median(runs["pipeline"]),
            "daemon_over_get": statistics.median(runs["daemon"]) / statistics.median(runs["get"]),
            "cpu_ms_per_mib": {name: 1000 * seconds / (opts.rounds * pages * page_mib)
                               for name, seconds in cpu.items()},
            "reader_pages_written": info["tier_remote_writes"],
            "late": info["tier_remote_fetches_late"], "busy": info["tier_remote_fetches_busy"],
            "fetch_latency_avg_us": info["tier_remote_fetch_latency_avg_us"]}


def bandwidth(cluster, opts, bar) -> dict:
    return {"timeout_ms": opts.timeout_ms, "rows": [bandwidth_one(cluster, mib, opts, bar) for mib in opts.page_mib]}


# -- 2. a prompt's latency -----------------------------------------------------------------------------

def latency(cluster, opts, bar) -> dict:
    ps, bb = opts.page_size, opts.page_size * opts.kv_bytes_per_token
    npages = opts.prompt_tokens // ps
    tokens = prompt(1, npages * ps)
    data = np.random.default_rng(2).integers(0, 256, npages * bb, dtype=np.uint8).tobytes()
    arena = geometry(ps, bb, 2 * npages * bb)
    times: dict[str, list[float]] = {}
    with ExitStack() as stack:
        writer = stack.enter_context(serve_remote(cluster, *arena, timeout_ms=opts.timeout_ms))
        reader = stack.enter_context(serve_remote(cluster, *arena, timeout_ms=opts.timeout_ms))
        disk = stack.enter_context(serve(*arena, "--disk-tier-read-timeout", "600000", mode="through",
                                         tier_bytes=2 * npages * tier_format.round_up(bb, tier_format.PAGE_ALIGN)))
        writer.client.execute_command("PFXSET", NS, "PACKED", tokens, "DATA", data)
        disk.client.execute_command("PFXSET", NS, "PACKED", tokens, "DATA", data)
        settle_writes(writer, npages)
        disk.settle()

        def timed(s: Served, key: str, counter: str | None, *extra: str) -> None:
            if counter is not None:
                evicted = s.client.execute_command("PFXEVICT", NS, "PAGES", npages)[b"evicted"]
                if evicted not in (0, npages):
                    raise RuntimeError(f"PFXEVICT left {npages - evicted} pages of the prompt in RAM")
                if key.startswith("disk_cold"):
                    drop_page_cache(s.segments())
                hits = s.tiers()[counter]
            started = time.perf_counter()
            lookup(s, tokens, npages, ps, *extra, data=data if extra else None)
            times.setdefault(key, []).append(time.perf_counter() - started)
            if counter is not None and s.tiers()[counter] - hits != npages:
                raise RuntimeError(f"a {key} sample was not served from its tier")

        for _ in range(opts.samples):
            for extra in ((), ("WITHDATA",)):
                suffix = "data" if extra else "nodata"
                timed(reader, f"remote_{suffix}", "tier_remote_hits", *extra)
                timed(reader, f"ram_{suffix}", None, *extra)
                for where in ("disk_warm", "disk_cold"):
                    timed(disk, f"{where}_{suffix}", "tier_disk_hits", *extra)
            bar.update(1)
    figures = {key: percentiles(values) for key, values in times.items()}
    ratio = {f"remote_over_{ref}_{suffix}_p50":
             figures[f"remote_{suffix}"]["p50_ms"] / figures[f"{ref}_{suffix}"]["p50_ms"]
             for ref in ("ram", "disk_warm", "disk_cold") for suffix in ("nodata", "data")}
    return {"prompt_tokens": npages * ps, "page_size": ps, "block_bytes": bb, "prompt_bytes": npages * bb,
            "samples": opts.samples, "timeout_ms": opts.timeout_ms, **figures, "ratios": ratio}


# -- the report -----------------------------------------------------------------------------------------

def report(doc: dict) -> None:
    m = doc["machine"]
    print(f"# {doc['command']}")
    print(f"{m['cpus']} CPUs, Python {m['python']}, {m['date']}; a {doc['masters']}-master Redis Cluster on "
          f"loopback ({doc['redis_server']}); load average {doc['load_average_before']:.1f} before, "
          f"{doc['load_average_after']:.1f} after")
    if "bandwidth" in doc:
        b = doc["bandwidth"]
        print(f"\nshared-tier fetch bandwidth, MB/s of values (medians of {b['rows'][0]['rounds']} rounds; "
              f"remote-tier-timeout {b['timeout_ms']} ms): PFXGET promoting pages into the arena vs redis-py "
              f"RedisCluster GET of the same keys, pipelined a prompt and one by one")
        print(f"{'page':>7}{'pages':>7}{'PFXGET':>9}{'pipe GET':>10}{'GET':>8}{'PFXGET/pipe':>13}{'PFXGET/GET':>12}"
              f"{'PFXGET/best':>18}{'late':>6}")
        for row in b["rows"]:
            verdict = "met" if row["daemon_over_best_get"] >= TARGET else "MISSED"
            print(f"{row['page_bytes'] // MIB:>5}Mi{row['pages']:>7}{row['daemon_mb_s']:>9.0f}"
                  f"{row['pipeline_get_mb_s']:>10.0f}{row['get_mb_s']:>8.0f}{row['daemon_over_pipeline_get']:>13.3f}"
                  f"{row['daemon_over_get']:>12.3f}{row['daemon_over_best_get']:>11.3f} {verdict:<6}{row['late']:>6}")
        print(f"target PFXGET / the faster GET of the round >= {TARGET}")
        print("CPU ms per MiB read, of the reading process (the daemon; redis-py's): "
              + "; ".join(f"{row['page_bytes'] // MIB} MiB " + ", ".join(f"{name} {value:.2f}" for name, value in
                                                                        row["cpu_ms_per_mib"].items())
                          for row in b["rows"])
              + "; the daemon's fetch (thread, verify, insert), ms a prompt: "
              + ", ".join(f"{row['fetch_latency_avg_us'] / 1000:.1f}" for row in b["rows"]))
    if "latency" in doc:
        lat = doc["latency"]
        keys = ("ram", "remote", "disk_warm", "disk_cold")
        print(f"\nPFXGET NOLEASE of a {lat['prompt_tokens']}-token prompt ({lat['prompt_bytes'] / MIB:.1f} MiB in "
              f"pages of {lat['page_size']} tokens, {lat['block_bytes']} bytes), ms p50 / p99 of {lat['samples']} "
              f"samples; remote: the shared tier; disk warm: its files cached, cold: dropped")
        print(f"{'':<10}" + "".join(f"{k.replace('_', ' '):>17}" for k in keys) + f"{'remote/ram':>12}"
              f"{'remote/warm':>13}")
        for suffix in ("nodata", "data"):
            print(f"{'WITHDATA' if suffix == 'data' else 'no data':<10}"
                  + "".join(f"{lat[f'{k}_{suffix}']['p50_ms']:>9.2f} /{lat[f'{k}_{suffix}']['p99_ms']:>6.1f}"
                            for k in keys)
                  + f"{lat['ratios'][f'remote_over_ram_{suffix}_p50']:>11.1f}x"
                  + f"{lat['ratios'][f'remote_over_disk_warm_{suffix}_p50']:>12.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("bench-remote-tier", __doc__)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated (default {','.join(PARTS)})")
    parser.add_argument("--quick", action="store_true", help="both parts shrunk (seconds; the tests' setting)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--masters", type=int, help=f"masters of the cluster (default {DEFAULTS['masters']})")
    parser.add_argument("--timeout-ms", type=int,
                        help=f"the daemons' remote-tier-timeout (default {DEFAULTS['timeout_ms']}: none late)")
    group = parser.add_argument_group("bandwidth")
    group.add_argument("--page-mib", help=f"comma-separated page sizes in MiB (default {DEFAULTS['page_mib']})")
    group.add_argument("--prompt-pages", type=int, help=f"pages a prompt (default {DEFAULTS['prompt_pages']})")
    group.add_argument("--fill-mib", type=int, help=f"MiB stored for each page size (default {DEFAULTS['fill_mib']})")
    group.add_argument("--rounds", type=int, help=f"rounds of the three passes (default {DEFAULTS['rounds']})")
    group = parser.add_argument_group("latency")
    group.add_argument("--prompt-tokens", type=int, help=f"tokens of the prompt (default {DEFAULTS['prompt_tokens']})")
    group.add_argument("--page-size", type=int, help=f"tokens a page (default {DEFAULTS['page_size']})")
    group.add_argument("--kv-bytes-per-token", type=int,
                       help=f"block bytes = this x page size (default {DEFAULTS['kv_bytes_per_token']})")
    group.add_argument("--samples", type=int, help=f"samples of each figure (default {DEFAULTS['samples']})")
    opts = parser.parse_args(argv)
    for key, value in (QUICK if opts.quick else DEFAULTS).items():
        if getattr(opts, key) is None:
            setattr(opts, key, value)
    opts.page_mib = [int(x) for x in str(opts.page_mib).split(",") if x.strip()]
    parts = [p.strip() for p in opts.parts.split(",") if p.strip()]
    for part in parts:
        if part not in PARTS:
            parser.error(f"unknown part {part!r} (known: {', '.join(PARTS)})")
    if opts.prompt_tokens % opts.page_size:
        parser.error(f"--prompt-tokens {opts.prompt_tokens} is not a whole number of pages of {opts.page_size}")
    steps = {"bandwidth": len(opts.page_mib) * opts.rounds, "latency": opts.samples}
    doc = {"command": command_line("bench-remote-tier", argv), "machine": machine(), "parts": parts,
           "masters": opts.masters, "load_average_before": os.getloadavg()[0]}
    try:
        with redis_cluster(masters=opts.masters) as cluster:
            doc["redis_server"] = cluster.cli("INFO", "server").split("redis_version:")[1].split()[0]
            bar = progress_bar(sum(steps[p] for p in parts), "bench-remote-tier", "step", quiet=opts.quiet)
            try:
                runners = {"bandwidth": bandwidth, "latency": latency}
                for part in parts:
                    doc[part] = runners[part](cluster, opts, bar)
            finally:
                bar.close()
    except RedisServerMissing as missing:
        print(f"bench-remote-tier needs a Redis Cluster: {missing}", file=sys.stderr)
        return 2
    doc["load_average_after"] = os.getloadavg()[0]
    doc["redis_server"] = f"redis-server {doc['redis_server']}"
    if opts.json:
        print(json.dumps(doc))
    else:
        report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
