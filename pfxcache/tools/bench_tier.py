"""What the disk tier costs and buys: promotion bandwidth, RAM-hit CPU, hit rate, disk-hit latency.

Four parts (--parts), each against a reference measured in the same invocation; every daemon is
started in its own temporary directory (its ``dir`` and tier), with ``maxmemory-policy lru`` and
``evict-low-watermark 0`` (evict only on demand), and stopped however the part ends.

  bandwidth  A daemon with a small arena (--arena-mib) over a tier twice the size of --fill-mib
             (write-through, so promotions evict only pages the disk holds already and nothing is
             written while reading), filled with prompts of --prompt-pages pages of --block-bytes
             until the tier has written everything queued. The prompts RAM no longer holds are
             then looked up in order (PFXGET NOLEASE, no data): each is promoted whole, and
             promoted bytes (INFO tier_disk_read_bytes) / wall time is the bandwidth; "in reads"
             divides the same bytes by the seconds the tier's files spent reading and verifying
             (INFO), which leaves the daemon's work around each read out. Cold: the segment files'
             pages are dropped from the page cache first (fsync, then posix_fadvise DONTNEED; no
             root needed); warm: the same pass again, the files now cached (a scan in LRU order
             evicts every prompt before it comes back). References, with the same cache
             treatment: an os.preadv loop over the same slots (read off the segments' record
             headers, in slot order, one prompt's pages a call) and ``dd iflag=direct`` over the
             same byte ranges (skipped, saying why, when dd refuses it). --bw-rounds rounds, the
             daemon's passes and the references' alternating which goes first; figures are
             medians, the ratio promotion / preadv the median of each round's.
  cpu        Two daemons with the same arena, tier off and on. Each stores cold prompts that
             overflow the arena (on the tier half of them go to disk), then --hot prompts of
             --cpu-prompt-pages pages, which stay in RAM. Runs of --cpu-requests pipelined
             PFXGETs (redis-py, 64 deep) over the hot prompts alternate off, on, on, off, ...;
             the figure is daemon CPU (utime + stime of all its threads, /proc/<pid>/stat) per
             100k PFXGET, median over --cpu-rounds runs of each. Two kinds of prompt: "full"
             (exactly the stored pages) and "tail" (the stored pages then two pages nobody
             stored: the tier computes and looks up one ident more).
  hitrate    --workloads (the suite's generators, pfxcache.tools.workloads, and "trace", the shared
             Mooncake trace when it is there), the first --requests requests of each, replayed as
             a worker does (PFXGET with a lease; PFXSET of the pages it missed; PFXRELEASE) against
             (a) an arena of X pages over a tier of 10X, once per --modes write mode, (b) an arena
             of 11X and no tier, (c) an arena of X and no tier (what the tier adds). X is the
             workload's distinct pages / --divisor (at least its longest request, to which every
             request is cut in every run). Hit rate in tokens from PFXGET's matched counts;
             ratio a / b. Write amplification per mode: pages the tier wrote (tier_disk_write_bytes
             / block bytes) and bytes the daemon sent to storage (/proc/<pid>/io write_bytes:
             headers, padding and the meta file included) per page the clients stored.
  latency    A --prompt-tokens prompt, once per --page-sizes page size, blocks of
             --kv-bytes-per-token x page size, on a tier (write-through). Each sample round times
             PFXGET NOLEASE with and without WITHDATA: from disk with the page cache dropped
             (cold), from disk with it warm, and from RAM; before each disk sample the prompt
             leaves RAM by PFXEVICT PAGES (RAM only: the disk copy stays). p50 and p99 in ms.

--quick shrinks every part (the tests' setting). The targets printed are the design's
(docs/design-disk-tier.md, section 8); a figure that misses one is printed as MISSED, never tuned.

    scripts/bench-tier
    scripts/bench-tier --parts bandwidth,latency --block-bytes 262144
    scripts/bench-tier --quick --json
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import redis

from pfxcache.daemon.tier import format as tier_format
from pfxcache.testing import Daemon, encode_command, start_daemon
from pfxcache.tools import workloads
from pfxcache.tools.bench_kv_events import cpu_seconds
from pfxcache.tools.common import RespConnection, command_line, machine, pairs, progress_bar, tool_parser
from pfxcache.tools.replay import DEFAULT_TRACE, Trace, page_chains, whole_pages

NS = b"bench"
PARTS = ("bandwidth", "cpu", "hitrate", "latency")
MIB = 1 << 20
PIPELINE = 64
TARGETS = {"bandwidth": 0.8, "cpu": 1.05, "hitrate": 0.99}
# The options' values when not given (--quick: QUICK's).
DEFAULTS = {"block_bytes": MIB, "prompt_pages": 16, "fill_mib": 512, "arena_mib": 64, "bw_rounds": 5,
            "cpu_requests": 15000, "cpu_rounds": 5, "cpu_prompt_pages": 64, "hot": 32,
            "workloads": "chat,sessions,trace", "requests": 2000, "divisor": 20, "modes": "back,through",
            "page_sizes": "16,64", "prompt_tokens": 4096, "kv_bytes_per_token": 4096, "samples": 30}
QUICK = {**DEFAULTS, "block_bytes": 256 << 10, "prompt_pages": 8, "fill_mib": 32, "arena_mib": 4, "bw_rounds": 1,
         "cpu_requests": 1000, "cpu_rounds": 1, "cpu_prompt_pages": 16, "hot": 4,
         "workloads": "chat,trace", "requests": 120, "kv_bytes_per_token": 256, "samples": 2}


# -- daemons ------------------------------------------------------------------------------------

@dataclass
class Served:
    """A daemon started for one measurement, its client and its directory."""

    daemon: Daemon
    client: redis.Redis
    folder: str

    def tiers(self) -> dict:
        return self.client.info("tiers")

    def settle(self, timeout: float = 300.0) -> dict:
        """Wait until the tier has loaded and written all it queued (pages and bytes both 0)."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.tiers()
            if not info.get("tier_disk_enabled"):
                return info
            if info["tier_disk_loading"] == 0 and info["tier_disk_queue_pages"] == 0 \
                    and info["tier_disk_queue_bytes"] == 0:
                return info
            if time.monotonic() > deadline:
                raise RuntimeError(f"the disk tier did not settle in {timeout:.0f} s: {info}")
            time.sleep(0.01)

    def segments(self) -> list[str]:
        return sorted(glob.glob(os.path.join(self.folder, "pfxtier", "seg-*.pfx")))

    def storage_writes(self) -> int:
        """Bytes this daemon caused to be sent to storage, all threads (/proc/<pid>/io)."""
        with open(f"/proc/{self.daemon.proc.pid}/io") as file:
            fields = dict(line.split(": ") for line in file.read().splitlines())
        return int(fields["write_bytes"])


@contextmanager
def serve(*args: str, tier_bytes: int = 0, mode: str = "back") -> Iterator[Served]:
    """A daemon with ``args`` (and a tier of ``tier_bytes`` when not 0) in a temporary directory."""
    folder = tempfile.mkdtemp(prefix="bench-tier-")
    daemon = None
    try:
        argv = ["--dir", folder, "--arena", "memory", "--save", "", "--loglevel", "warning",
                "--maxmemory-policy", "lru", "--evict-low-watermark", "0", *args]
        if tier_bytes:
            argv += ["--disk-tier-size", str(tier_bytes), "--disk-tier-write", mode]
        daemon = start_daemon(*argv, ready_timeout=60)
        client = redis.Redis(host=daemon.host, port=daemon.port, socket_timeout=300)
        try:
            served = Served(daemon, client, folder)
            served.settle()
            yield served
        except Exception:  # what the daemon logged says more than the reply did
            print("pfxcached's log, the end:\n" + "\n".join(daemon.log[-40:]), file=sys.stderr)
            raise
        finally:
            client.close()
    finally:
        if daemon is not None:
            daemon.stop(timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def geometry(page_size: int, block_bytes: int, arena_bytes: int) -> tuple[str, ...]:
    return ("--page-size", str(page_size), "--block-bytes", str(block_bytes), "--maxmemory", str(arena_bytes))


def prompt(serial: int, tokens: int) -> bytes:
    """Packed tokens of prompt ``serial``: its first token is ``serial``, so it shares no page with
    another serial's prompt."""
    ids = np.arange(tokens, dtype=np.uint32)
    ids[0] = serial
    return ids.tobytes()


def matched(reply: dict) -> int:
    return reply[b"matched"]


def drop_page_cache(paths: list[str]) -> None:
    """Write back, then drop, every cached page of ``paths`` (posix_fadvise DONTNEED: no root)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def percentiles(seconds: list[float]) -> dict:
    ms = np.array(seconds) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "samples": len(ms)}


# -- 1. promotion bandwidth ------------------------------------------------------------------------

def payload_chunks(paths: list[str], pages: int, per_read: int) -> list[tuple[str, int, int, int]]:
    """(path, offset, pages, slot stride) of reads of at most ``per_read`` consecutive occupied slots
    (a record header that decodes), in slot order, the first ``pages`` of them."""
    chunks = []
    for path in paths:
        with open(path, "rb") as file:
            header = tier_format.decode_segment_header(file.read(tier_format.SEGMENT_HEADER_BYTES))
            if header is None:
                continue
            table = file.read(header.slots * tier_format.HEADER_BYTES)
        payloads = tier_format.SEGMENT_HEADER_BYTES + tier_format.round_up(
            header.slots * tier_format.HEADER_BYTES, tier_format.PAGE_ALIGN)
        start = None
        for index in range(header.slots + 1):
            used = index < header.slots and tier_format.decode_record(table, index * tier_format.HEADER_BYTES)
            if used and start is None:
                start = index
            if start is not None and (not used or index - start == per_read):
                chunks.append((path, payloads + start * header.slot_stride, index - start, header.slot_stride))
                start = index if used else None
    taken, left = [], pages
    for path, offset, count, stride in chunks:
        if left <= 0:
            break
        taken.append((path, offset, min(count, left), stride))
        left -= count
    return taken


def preadv_pass(chunks: list, block_bytes: int) -> tuple[float, int]:
    """(seconds, payload bytes) of reading ``chunks`` with one os.preadv a chunk."""
    fds = {path: os.open(path, os.O_RDONLY) for path in {c[0] for c in chunks}}
    try:
        stride = chunks[0][3]
        buffers = [bytearray(stride) for _ in range(max(c[2] for c in chunks))]
        started = time.perf_counter()
        for path, offset, pages, _ in chunks:
            if os.preadv(fds[path], buffers[:pages], offset) != pages * stride:  # short only past the end
                raise RuntimeError(f"{path}: short read at {offset}")
        return time.perf_counter() - started, sum(c[2] for c in chunks) * block_bytes
    finally:
        for fd in fds.values():
            os.close(fd)


def dd_pass(chunks: list, block_bytes: int) -> tuple[float, int] | str:
    """(seconds, payload bytes) of ``dd iflag=direct`` over the same ranges, or why dd cannot."""
    dd = shutil.which("dd")
    if dd is None:
        return "no dd on PATH"
    runs: list[list] = []  # chunks merged back into contiguous ranges: one dd each
    for path, offset, pages, stride in chunks:
        if runs and runs[-1][0] == path and runs[-1][1] + runs[-1][2] == offset:
            runs[-1][2] += pages * stride
        else:
            runs.append([path, offset, pages * stride])
    flags = ["of=/dev/null", "iflag=direct,skip_bytes,count_bytes", "status=none"]
    probe = subprocess.run([dd, *flags, f"if={runs[0][0]}", f"bs={tier_format.PAGE_ALIGN}", "count=4096"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"dd refuses iflag=direct,skip_bytes,count_bytes here: {probe.stderr.strip()}"
    started = time.perf_counter()
    for path, offset, nbytes in runs:
        subprocess.run([dd, *flags, f"if={path}", f"bs={chunks[0][3]}", f"skip={offset}", f"count={nbytes}"],
                       check=True)
    return time.perf_counter() - started, sum(c[2] for c in chunks) * block_bytes


def read_seconds(info: dict) -> float:
    """Seconds the tier's files spent reading and verifying, so far (INFO gives bytes and bytes/s)."""
    rate = info["tier_disk_read_bytes_per_sec"]
    return info["tier_disk_read_bytes"] / rate if rate else 0.0


def promotion_pass(s: Served, prompts: list[bytes]) -> tuple[float, int, int, float]:
    """(seconds, bytes promoted, pages promoted, seconds inside the files' reads) of looking
    ``prompts`` up in order."""
    before = s.tiers()
    started = time.perf_counter()
    for tokens in prompts:
        reply = s.client.execute_command("PFXGET", NS, "PACKED", tokens, "NOLEASE")
        if matched(reply) != len(tokens) // 4:
            raise RuntimeError(f"a prompt on disk matched {matched(reply)} of {len(tokens) // 4} tokens")
    seconds = time.perf_counter() - started
    after = s.tiers()
    return (seconds, after["tier_disk_read_bytes"] - before["tier_disk_read_bytes"],
            after["tier_disk_hits"] - before["tier_disk_hits"], read_seconds(after) - read_seconds(before))


def bandwidth(opts, bar) -> dict:
    bb, pp, page = opts.block_bytes, opts.prompt_pages, 16
    arena = opts.arena_mib * MIB
    ram_prompts = arena // bb // pp
    count = max(opts.fill_mib * MIB // (bb * pp), 2 * ram_prompts + 3)
    tier = 2 * count * pp * tier_format.round_up(bb, tier_format.PAGE_ALIGN)
    data = np.random.default_rng(1).integers(0, 256, pp * bb, dtype=np.uint8).tobytes()
    prompts = [prompt(i + 1, pp * page) for i in range(count)]
    with serve(*geometry(page, bb, arena), "--disk-tier-read-timeout", "600000",
               tier_bytes=tier, mode="through") as s:
        queue_limit = int(s.client.config_get("disk-tier-queue")["disk-tier-queue"])
        for tokens in prompts:
            s.client.execute_command("PFXSET", NS, "PACKED", tokens, "DATA", data)
            while s.tiers()["tier_disk_queue_bytes"] > queue_limit // 2:  # never a page skipped
                time.sleep(0.002)
        filled = s.settle()
        bar.update(1)
        on_disk = prompts[: count - ram_prompts - 1]  # the last ram_prompts (and a spare) may be in RAM
        chunks = payload_chunks(s.segments(), len(on_disk) * pp, pp)
        rates: dict[str, list[float]] = {}
        pages: list[int] = []

        def note(key: str, seconds: float, nbytes: int) -> None:
            rates.setdefault(key, []).append(nbytes / seconds / 1e6 if seconds else 0.0)

        def promotions() -> None:
            for where in ("cold", "warm"):  # the cold pass leaves the files cached for the warm one
                if where == "cold":
                    drop_page_cache(s.segments())
                seconds, nbytes, promoted, inside = promotion_pass(s, on_disk)
                note(f"promotion_{where}", seconds, nbytes)
                note(f"files_read_{where}", inside, nbytes)
                pages.append(promoted)

        def preadvs() -> None:
            drop_page_cache(s.segments())
            note("preadv_cold", *preadv_pass(chunks, bb))
            note("preadv_warm", *preadv_pass(chunks, bb))

        dd_skipped = None
        for round_no in range(opts.bw_rounds):  # the order alternates, so neither always runs first
            for step in ((promotions, preadvs) if round_no % 2 == 0 else (preadvs, promotions)):
                step()
            drop_page_cache(s.segments())
            dd = dd_pass(chunks, bb)
            if isinstance(dd, str):
                dd_skipped = dd
            else:
                note("dd_direct_cold", *dd)
            bar.update(1)
        skipped = s.tiers()["tier_disk_demotions_skipped"]

    def median(key: str) -> float | None:
        return statistics.median(rates[key]) if key in rates else None

    out = {"block_bytes": bb, "prompt_pages": pp, "prompts_on_disk": len(on_disk), "arena_bytes": arena,
           "fill_bytes": count * pp * bb, "disk_pages": filled["tier_disk_pages"], "demotions_skipped": skipped,
           "pages_promoted_per_pass": min(pages), "reference_pages": sum(c[2] for c in chunks),
           "rounds": opts.bw_rounds, "dd_skipped": dd_skipped, "runs": rates}
    for where in ("cold", "warm"):
        ratios = [a / b for a, b in zip(rates[f"promotion_{where}"], rates[f"preadv_{where}"])]
        out[where] = {f"{key}_mb_s": median(f"{key}_{where}") for key in ("promotion", "files_read", "preadv",
                                                                          "dd_direct")}
        out[where]["promotion_over_preadv"] = statistics.median(ratios)
    return out


# -- 2. RAM-hit CPU ------------------------------------------------------------------------------------

def ram_cpu(opts, bar) -> dict:
    page, bb, pp = 16, 4096, opts.cpu_prompt_pages
    arena = 2 * opts.hot * pp * bb  # the hot prompts fill half of it, stored last: nothing pushes them out
    hot = [prompt(i + 1, pp * page) for i in range(opts.hot)]
    tails = [tokens + prompt(10_000 + i, 2 * page + 5) for i, tokens in enumerate(hot)]
    cold = [prompt(100_000 + i, pp * page) for i in range(3 * opts.hot)]  # 1.5 arenas: half goes to disk
    runs: dict[str, dict[str, list[float]]] = {"full": {"off": [], "on": []}, "tail": {"off": [], "on": []}}
    with serve(*geometry(page, bb, arena)) as off, \
            serve(*geometry(page, bb, arena), tier_bytes=2 * len(cold) * pp * bb) as on:
        for s in (off, on):
            for tokens in cold + hot:
                s.client.execute_command("PFXSET", NS, "PACKED", tokens, "DATA", bytes(pp * bb))
                s.settle()
        disk_pages = on.tiers()["tier_disk_pages"]
        daemons = {"off": off, "on": on}
        for kind, lookups in (("full", hot), ("tail", tails)):
            for round_no in range(2 * opts.cpu_rounds):
                name = ("off", "on")[(round_no + round_no // 2) % 2]  # off on on off off on ...
                s = daemons[name]
                pipe = s.client.pipeline(transaction=False)
                before, done = cpu_seconds(s.daemon.proc.pid), 0
                while done < opts.cpu_requests:
                    n = min(PIPELINE, opts.cpu_requests - done)
                    for i in range(done, done + n):
                        pipe.execute_command("PFXGET", NS, "PACKED", lookups[i % len(lookups)], "NOLEASE")
                    if sum(map(matched, pipe.execute())) != n * pp * page:
                        raise RuntimeError(f"a hot prompt was not a full RAM hit on the tier-{name} daemon")
                    done += n
                runs[kind][name].append(1e5 * (cpu_seconds(s.daemon.proc.pid) - before) / opts.cpu_requests)
                bar.update(1)
        promoted = on.tiers()["tier_disk_hits"]
    kinds = []
    for kind, by in runs.items():
        off_s, on_s = statistics.median(by["off"]), statistics.median(by["on"])
        kinds.append({"kind": kind, "off_cpu_s_per_100k": off_s, "on_cpu_s_per_100k": on_s,
                      "on_over_off": on_s / off_s if off_s else None, "runs": by})
    return {"requests_per_run": opts.cpu_requests, "runs_each": opts.cpu_rounds, "prompt_tokens": pp * page,
            "hot_prompts": opts.hot, "disk_pages": disk_pages, "pages_promoted": promoted, "kinds": kinds}


# -- 3. hit rate ---------------------------------------------------------------------------------------

def load_workload(name: str, requests: int) -> Trace | None:
    """The first ``requests`` requests of a suite workload (None: the shared trace is not here)."""
    if name == "trace" and not DEFAULT_TRACE.exists():
        return None
    generator = workloads.generator(name)
    trace = generator(1) if name in ("trace", "sessions") else generator(1, requests=requests)
    trace.requests = trace.requests[:requests]
    return trace


def replay(s: Served, trace: Trace, page_size: int, max_pages: int, block_bytes: int) -> dict:
    """The trace through ``s`` as a worker does: look up (leased), store what missed, release."""
    conn = RespConnection(s.daemon.address, timeout=300)
    zeros = bytes(max_pages * block_bytes)
    hit = stored = 0
    writes_before = s.storage_writes()
    try:
        for req in trace.requests:
            tokens, npages = whole_pages(trace, req, page_size, max_pages)
            packed = tokens.tobytes()
            found = pairs(conn.call("PFXGET", req.namespace, "PACKED", packed))
            got = found["matched"]
            hit += got
            commands = []
            if npages * page_size > got:
                commands.append(("PFXSET", req.namespace, "PACKED", packed, "OFFSET", got,
                                 "DATA", zeros[: (npages - got // page_size) * block_bytes]))
            if found["lease"]:
                commands.append(("PFXRELEASE", found["lease"]))
            if commands:
                conn.sock.sendall(b"".join(encode_command(*c) for c in commands))
                replies = [conn.reply() for _ in commands]
                for command, reply in zip(commands, replies):
                    if isinstance(reply, Exception):
                        raise RuntimeError(f"{command[0]} failed: {reply}")
                if commands[0][0] == "PFXSET":
                    stored += pairs(replies[0])["stored"]
    finally:
        conn.close()
    info = s.settle()
    total = trace.input_tokens
    out = {"hit_tokens": hit, "input_tokens": total, "hit_rate": hit / total if total else 0.0,
           "pages_stored": stored}
    if info.get("tier_disk_enabled"):
        written = info["tier_disk_write_bytes"] // block_bytes
        out.update(disk_pages_written=written, disk_pages_per_page_stored=written / max(1, stored),
                   storage_bytes_per_page_stored=(s.storage_writes() - writes_before) / max(1, stored),
                   disk_hit_pages=info["tier_disk_hits"], promotions_late=info["tier_disk_promotions_late"],
                   demotions_skipped=info["tier_disk_demotions_skipped"], disk_evictions=info["tier_disk_evictions"],
                   read_misses=info["tier_disk_read_misses"], state=info["tier_disk_state"],
                   faults=info["tier_disk_verify_failures"] + info["tier_disk_io_errors"])
    return out


def hit_rate(opts, bar) -> dict:
    bb = 4096  # one 4 KiB slot a page on disk; the bytes are zeros, only the counts matter
    rows, absent = [], []
    for name in opts.workloads:
        trace = load_workload(name, opts.requests)
        if trace is None:
            absent.append(f"{name}: {DEFAULT_TRACE} is not here")
            bar.update(len(opts.modes) + 2)
            continue
        page = trace.block_tokens
        chains = page_chains(trace, page)
        distinct = len({p for chain in chains for p in chain})
        x = max(max(len(chain) for chain in chains) + 1, distinct // opts.divisor)
        runs = {}
        plans = [(f"tier-{mode}", x, 10 * x, mode) for mode in opts.modes] + [("ram-11x", 11 * x, 0, "back"),
                                                                               ("ram-x", x, 0, "back")]
        for label, arena_pages, tier_pages, mode in plans:
            with serve(*geometry(page, bb, arena_pages * bb), tier_bytes=tier_pages * bb, mode=mode) as s:
                runs[label] = replay(s, trace, page, x, bb)
            bar.update(1)
        ratios = {mode: runs[f"tier-{mode}"]["hit_rate"] / runs["ram-11x"]["hit_rate"]
                  if runs["ram-11x"]["hit_rate"] else None for mode in opts.modes}
        rows.append({"workload": trace.name, "requests": len(trace.requests), "page_size": page,
                     "distinct_pages": distinct, "x_pages": x, "runs": runs, "tier_over_ram_11x": ratios})
    return {"block_bytes": bb, "modes": opts.modes, "workloads": rows, "skipped": absent}


# -- 4. disk-hit latency --------------------------------------------------------------------------------

def latency(opts, bar) -> dict:
    rows = []
    for page in opts.page_sizes:
        bb = page * opts.kv_bytes_per_token
        npages = opts.prompt_tokens // page
        tokens = prompt(1, npages * page)
        data = np.random.default_rng(2).integers(0, 256, npages * bb, dtype=np.uint8).tobytes()
        times: dict[str, list[float]] = {}
        with serve(*geometry(page, bb, 2 * npages * bb), "--disk-tier-read-timeout", "600000",
                   tier_bytes=2 * npages * tier_format.round_up(bb, tier_format.PAGE_ALIGN), mode="through") as s:
            s.client.execute_command("PFXSET", NS, "PACKED", tokens, "DATA", data)
            s.settle()

            def timed(key: str, *extra: str) -> None:
                started = time.perf_counter()
                reply = s.client.execute_command("PFXGET", NS, "PACKED", tokens, "NOLEASE", *extra)
                times.setdefault(key, []).append(time.perf_counter() - started)
                if matched(reply) != npages * page or (extra and reply[b"data"] != data):
                    raise RuntimeError(f"{key}: the prompt came back short or wrong")

            for _ in range(opts.samples):
                for where in ("disk_cold", "disk_warm"):
                    for extra in ((), ("WITHDATA",)):
                        if s.client.execute_command("PFXEVICT", NS, "PAGES", npages)[b"evicted"] != npages:
                            raise RuntimeError("PFXEVICT left pages of the prompt in RAM")
                        if where == "disk_cold":
                            drop_page_cache(s.segments())
                        hits = s.tiers()["tier_disk_hits"]
                        timed(f"{where}_{'data' if extra else 'nodata'}", *extra)
                        if s.tiers()["tier_disk_hits"] - hits != npages:
                            raise RuntimeError("a disk sample was not served from disk")
                timed("ram_nodata")
                timed("ram_data", "WITHDATA")
                bar.update(1)
        rows.append({"page_size": page, "block_bytes": bb, "pages": npages, "prompt_bytes": npages * bb,
                     **{key: percentiles(values) for key, values in times.items()}})
    return {"prompt_tokens": opts.prompt_tokens, "samples": opts.samples, "rows": rows}


# -- the report -------------------------------------------------------------------------------------

def verdict(value: float | None, target: float, at_least: bool) -> str:
    if value is None:
        return "- (nothing to compare: the reference measured 0)"
    met = value >= target if at_least else value <= target
    return f"{value:.3f} ({'met' if met else 'MISSED'})"


def cell(value: float | None, spec: str, width: int) -> str:
    return f"{'-' if value is None else format(value, spec):>{width}}"


def report_bandwidth(b: dict) -> None:
    print(f"\npromotion bandwidth, MB/s of payload: block-bytes {b['block_bytes']}, {b['prompt_pages']} pages a "
          f"prompt, {b['prompts_on_disk']} prompts ({b['pages_promoted_per_pass']} pages) promoted a pass; arena "
          f"{b['arena_bytes'] // MIB} MiB, {b['fill_bytes'] // MIB} MiB stored, {b['disk_pages']} pages on disk, "
          f"{b['demotions_skipped']} skipped; medians of {b['rounds']} rounds")
    print(f"{'':<16}{'promotion':>10}{'in reads':>10}{'preadv':>10}{'dd direct':>11}{'promotion/preadv':>18}")
    for where in ("cold", "warm"):
        row = b[where]
        title = f"{where} ({'dropped' if where == 'cold' else 'cached'})"
        print(f"{title:<16}" + cell(row["promotion_mb_s"], ".0f", 10) + cell(row["files_read_mb_s"], ".0f", 10)
              + cell(row["preadv_mb_s"], ".0f", 10) + cell(row["dd_direct_mb_s"], ".0f", 11)
              + cell(row["promotion_over_preadv"], ".3f", 18))
    if b["dd_skipped"]:
        print(f"dd skipped: {b['dd_skipped']}")
    print(f"target promotion/preadv >= {TARGETS['bandwidth']} (cold): "
          f"{verdict(b['cold']['promotion_over_preadv'], TARGETS['bandwidth'], True)}")


def report_cpu(c: dict) -> None:
    print(f"\nRAM-hit CPU: daemon CPU seconds per 100k PFXGET NOLEASE of {c['prompt_tokens']} tokens (tail: and 37 "
          f"more), medians of {c['runs_each']} runs of {c['requests_per_run']}; {c['disk_pages']} pages on the "
          f"tier's disk, {c['pages_promoted']} promoted")
    print(f"{'kind':<8}{'tier off':>10}{'tier on':>10}{'on/off':>9}")
    for k in c["kinds"]:
        print(f"{k['kind']:<8}{k['off_cpu_s_per_100k']:>10.2f}{k['on_cpu_s_per_100k']:>10.2f}"
              + cell(k["on_over_off"], ".3f", 9))
    print(f"target on/off <= {TARGETS['cpu']}: " + ", ".join(
        f"{k['kind']} {verdict(k['on_over_off'], TARGETS['cpu'], False)}" for k in c["kinds"]))


def report_hitrate(h: dict) -> None:
    modes = h["modes"]
    print("\ntoken hit rate, maxmemory-policy lru: a = arena X + tier 10X, b = arena 11X, c = arena X "
          "(X = distinct pages / divisor)")
    print(f"{'workload':<20}{'req':>6}{'page':>6}{'X':>7}" + "".join(f"{'a ' + m:>10}" for m in modes)
          + f"{'b':>8}{'c':>8}" + "".join(f"{m + ' a/b':>14}" for m in modes))
    for w in h["workloads"]:
        r = w["runs"]
        print(f"{w['workload']:<20}{w['requests']:>6}{w['page_size']:>6}{w['x_pages']:>7}"
              + "".join(f"{r['tier-' + m]['hit_rate']:>10.3f}" for m in modes)
              + f"{r['ram-11x']['hit_rate']:>8.3f}{r['ram-x']['hit_rate']:>8.3f}"
              + "".join(cell(w["tier_over_ram_11x"][m], ".3f", 14) for m in modes))
    print("per page stored by the clients: pages the tier wrote, bytes the daemon sent to storage (/proc/<pid>/io); "
          "pages served from disk, late reads, pages skipped")
    for w in h["workloads"]:
        for m in modes:
            r = w["runs"]["tier-" + m]
            print(f"{w['workload']:<20}{m:<8}{r['disk_pages_per_page_stored']:>6.2f}"
                  f"{r['storage_bytes_per_page_stored']:>9.0f} B{r['disk_hit_pages']:>9} from disk"
                  f"{r['promotions_late']:>5} late{r['demotions_skipped']:>5} skipped")
    for reason in h["skipped"]:
        print(f"skipped {reason}")
    print(f"target a/b >= {TARGETS['hitrate']}: " + ", ".join(
        f"{w['workload']} {m} {verdict(w['tier_over_ram_11x'][m], TARGETS['hitrate'], True)}"
        for w in h["workloads"] for m in modes))


def report_latency(lat: dict) -> None:
    keys = ("ram_nodata", "ram_data", "disk_warm_nodata", "disk_warm_data", "disk_cold_nodata", "disk_cold_data")
    print(f"\nPFXGET NOLEASE of a {lat['prompt_tokens']}-token prompt, ms p50 / p99 of {lat['samples']} samples; "
          f"data: WITHDATA; disk warm: the files in the page cache, cold: dropped")
    print(f"{'page':>5}{'block':>9}" + "".join(f"{k.replace('_nodata', '').replace('_', ' '):>16}" for k in keys))
    for row in lat["rows"]:
        print(f"{row['page_size']:>5}{row['block_bytes']:>9}"
              + "".join(f"{row[k]['p50_ms']:>8.2f} /{row[k]['p99_ms']:>6.1f}" for k in keys))


def report(doc: dict) -> None:
    m = doc["machine"]
    print(f"# {doc['command']}")
    print(f"{m['cpus']} CPUs, Python {m['python']}, {m['date']}; load average {doc['load_average_before']:.1f} "
          f"before, {doc['load_average_after']:.1f} after")
    for part, printer in (("bandwidth", report_bandwidth), ("cpu", report_cpu), ("hitrate", report_hitrate),
                          ("latency", report_latency)):
        if part in doc:
            printer(doc[part])


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("bench-tier", __doc__)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated (default {','.join(PARTS)})")
    parser.add_argument("--quick", action="store_true", help="every part shrunk (seconds; the tests' setting)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    group = parser.add_argument_group("bandwidth")
    group.add_argument("--block-bytes", type=int, help=f"bytes a page (default {DEFAULTS['block_bytes']})")
    group.add_argument("--prompt-pages", type=int, help=f"pages a prompt (default {DEFAULTS['prompt_pages']})")
    group.add_argument("--fill-mib", type=int, help=f"MiB stored (default {DEFAULTS['fill_mib']})")
    group.add_argument("--arena-mib", type=int, help=f"MiB of arena (default {DEFAULTS['arena_mib']})")
    group.add_argument("--bw-rounds", type=int, help=f"rounds of every pass (default {DEFAULTS['bw_rounds']})")
    group = parser.add_argument_group("cpu")
    group.add_argument("--cpu-requests", type=int, help=f"PFXGETs a run (default {DEFAULTS['cpu_requests']})")
    group.add_argument("--cpu-rounds", type=int, help=f"runs of each daemon (default {DEFAULTS['cpu_rounds']})")
    group.add_argument("--cpu-prompt-pages", type=int,
                       help=f"pages of 16 tokens a hot prompt (default {DEFAULTS['cpu_prompt_pages']})")
    group.add_argument("--hot", type=int, help=f"hot prompts (default {DEFAULTS['hot']})")
    group = parser.add_argument_group("hitrate")
    group.add_argument("--workloads", help=f"comma-separated, of {','.join(workloads.SUITE)} "
                                           f"(default {DEFAULTS['workloads']})")
    group.add_argument("--requests", type=int, help=f"requests of each workload (default {DEFAULTS['requests']})")
    group.add_argument("--divisor", type=int, help=f"X = distinct pages / this (default {DEFAULTS['divisor']})")
    group.add_argument("--modes", help=f"disk-tier-write modes, of back,through (default {DEFAULTS['modes']})")
    group = parser.add_argument_group("latency")
    group.add_argument("--page-sizes", help=f"comma-separated (default {DEFAULTS['page_sizes']})")
    group.add_argument("--prompt-tokens", type=int,
                       help=f"tokens of the prompt (default {DEFAULTS['prompt_tokens']})")
    group.add_argument("--kv-bytes-per-token", type=int,
                       help=f"block bytes = this x page size (default {DEFAULTS['kv_bytes_per_token']})")
    group.add_argument("--samples", type=int, help=f"samples of each figure (default {DEFAULTS['samples']})")
    opts = parser.parse_args(argv)
    for key, value in (QUICK if opts.quick else DEFAULTS).items():
        if getattr(opts, key) is None:
            setattr(opts, key, value)
    for key in ("workloads", "modes"):
        setattr(opts, key, [x.strip() for x in getattr(opts, key).split(",") if x.strip()])
    opts.page_sizes = [int(x) for x in str(opts.page_sizes).split(",") if x.strip()]
    parts = [p.strip() for p in opts.parts.split(",") if p.strip()]
    for part in parts:
        if part not in PARTS:
            parser.error(f"unknown part {part!r} (known: {', '.join(PARTS)})")
    for name in opts.workloads:
        if workloads.generator(name) is None:
            parser.error(f"unknown workload {name!r} (known: {', '.join(workloads.SUITE)})")
    for mode in opts.modes:
        if mode not in ("back", "through"):
            parser.error(f"unknown mode {mode!r} (known: back, through)")
    for page in opts.page_sizes:
        if page < 1 or opts.prompt_tokens % page:
            parser.error(f"--prompt-tokens {opts.prompt_tokens} is not a whole number of pages of {page}")
    steps = {"bandwidth": 1 + opts.bw_rounds, "cpu": 4 * opts.cpu_rounds,
             "hitrate": len(opts.workloads) * (len(opts.modes) + 2), "latency": len(opts.page_sizes) * opts.samples}
    bar = progress_bar(sum(steps[p] for p in parts), "bench-tier", "step", quiet=opts.quiet)
    doc = {"command": command_line("bench-tier", argv), "machine": machine(), "parts": parts,
           "load_average_before": os.getloadavg()[0]}
    runners = {"bandwidth": bandwidth, "cpu": ram_cpu, "hitrate": hit_rate, "latency": latency}
    try:
        for part in parts:
            doc[part] = runners[part](opts, bar)
    finally:
        bar.close()
    doc["load_average_after"] = os.getloadavg()[0]
    if opts.json:
        print(json.dumps(doc))
    else:
        report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
