"""Replay a prefix-cache workload trace: token hit rate per eviction policy and capacity, with Belady's bound.

Every request of the trace, in order, is handled as an inference worker does:

  1. look its prompt up (PFXGET / store.match with a lease): the hit is the
     tokens of the longest cached whole-page prefix;
  2. store its whole pages from the matched offset on (PFXSET ... OFFSET /
     store.insert): the worker computed them. A prompt longer than the
     capacity stores only its first <capacity> pages;
  3. release the lease.

Hit rate = hit tokens / input tokens over the whole trace (partial last pages
count as input, never as hits).

Modes:
  --mode store   in process on the store core (PrefixStore over a MemoryArena
                 of 1-byte blocks, no KV data): fast, for sweeps. The store's
                 clock is a logical one (one tick per call), so time-based
                 policies (hybrid) see ages in operations, not seconds.
  --mode daemon  through pfxcached over RESP with the client library
                 (pfxcache.client.PrefixCache, attach=False: no shared-memory
                 mapping, lookups WITHOUT data, stores carry zero bytes of
                 --daemon-block-bytes per new page). Without --url it starts its own
                 daemon per (policy, capacity): --arena memory,
                 --evict-low-watermark 0 (evict only on demand, as the store
                 mode does), maxmemory = capacity x block bytes. With --url it
                 uses that daemon as it is (its capacity; the policy is set
                 with CONFIG SET maxmemory-policy and the trace's namespaces
                 are emptied before each run). It is checked first (its page
                 size must be the replay's; a refusal changes nothing on it),
                 and its policy is set back when the replay ends, however it
                 ends.
  Both modes give the same hit rates for lru, lfu, tempo and guard (their
  order depends only on the order of accesses; tempo and guard count time in
  the store's ticks); hybrid scores ages in seconds in the daemon, so its figures
  may differ a little there. A daemon offers the shipped policies only: the
  research policies (scripts/research/run replay) replay in store mode.

Belady (offline reference): at page granularity, evict the cached page whose
next use is farthest in the future, among pages not in the current request;
ties (and never-used-again pages) go deepest first. A page's next use is never
later than its child's, so the page picked is always a leaf: the bound obeys
the store's leaf-first constraint and the cache stays prefix-closed. Like the
policies it stores every page of every request (no bypass).

Trace formats (--format):
  mooncake  {"input_length": n, "hash_ids": [...], "timestamp": ms} per line;
            hash id h becomes the 512 (--block-tokens) token ids
            (h * 512 + j) & 0xffffffff, the partial last block its first
            input_length - 512 * (len(hash_ids) - 1) tokens; an input_length
            past the last block (a partial block without a hash id, as the
            kv-cache-tester traces have) adds tokens unique to the request
            (it replays, never refused). All files share
            one namespace unless --namespace-per-file (hash ids are per file,
            e.g. per conversation: each file becomes its own namespace).
  tokens    {"tokens": [ids...], "namespace": "optional"} per line.
  kvtester  kv-cache-tester's native traces as they come (its traces/*.json:
            one JSON object per conversation, {"block_size", "requests":
            [{"t", "type", "in", "hash_ids", "think_time"?}, ...]}); give the
            files or their directory. block_size is the files' (all must
            agree, and with --block-tokens if given); hash id h becomes tokens
            as in mooncake, an "in" past the hash ids is tokens unique to the
            request. Each file's ids (and a sub-agent's, unless hash_id_scope
            is "global") are their own: moved past every other file's, in one
            namespace unless --namespace-per-file. The conversations are
            merged as the tester plays them with an instant server
            (pfxcache/tools/trace_formats.py says how and why):
            --kvtester-users (50) at a time, the next file starting when one
            ends; within one, each request after the previous one's
            think_time (--kvtester-timing original: its t gap), capped at
            --kvtester-max-delay (60 s); "s" and "n" requests both sent;
            sub-agents run concurrently, their parent waiting for them.
            --kvtester-warm-prefix 0.5 shares a prefix across conversations
            as the tester's --warm-prefix-pct does (off by default).
  --format auto (the default) tells kvtester files (one JSON object with
  "requests" and "block_size") from JSONL lines; a directory stands for its
  .json and .jsonl files. Bad input is refused naming the file and the line
  or request. Several JSONL files are merged by "timestamp" when every line
  has one, else concatenated in the order given.
  --generate sessions   a generated workload instead of a file: many shared
            system prompts (Zipf popularity) and long multi-turn sessions
            interleaved (see generate_sessions); --save writes it as a
            Mooncake-format JSONL.

Capacities (--capacities): comma-separated; a plain number is pages (blocks),
a size with a unit (64gb, 512mib) is bytes divided by --block-bytes (the KV
bytes of one page; default 64 MiB = Llama-3-8B fp16 at 512 tokens), and
"unlimited" never evicts.

    scripts/replay                                    # the shared Mooncake trace, all policies
    scripts/replay --capacities 1000,3000 --policies lru,tempo,guard
    scripts/replay --generate sessions                # the generated workload
    scripts/replay --mode daemon --capacities 1000 trace.jsonl
    scripts/replay --capacities 2000,20000 kv-cache-tester/traces/   # kv-cache-tester's traces, native
    scripts/replay --json                             # machine-readable

The plot (hit rate against capacity, one line per policy plus Belady) goes to
scripts/out/replay-<trace name>.png.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

from pfxcache.testing import start_daemon
from pfxcache.tools.common import OUT, command_line, new_plot, progress_bar, save_plot, shown, tool_parser
from pfxcache.tools.trace_formats import (  # noqa: F401 - Request .. unique_tokens: replay's API as before
    DEFAULT_NS, FORMATS, KVTESTER_MAX_DELAY, KVTESTER_TIMINGS, KVTESTER_USERS, MOONCAKE_BLOCK, TOKEN_MASK, Request,
    Trace, TraceFormatError, mooncake_tokens, read_trace, unique_tokens)

DEFAULT_TRACE = Path("/work/shared/traces/conversation_trace.jsonl")
UNLIMITED = 0  # capacity value meaning "never evict"
DEFAULT_BLOCK_BYTES = 32 * 2 * 8 * 128 * 2 * 512  # Llama-3-8B fp16 KV of 512 tokens: 64 MiB
UNITS = {"b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
         "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


# -- traces (reading: trace_formats) ---------------------------------------------------------------


def generate_sessions(seed: int = 1, sessions: int = 2000, system_prompts: int = 40, concurrent: int = 400,
                      block_tokens: int = MOONCAKE_BLOCK) -> Trace:
    """A workload of a different shape from the Mooncake one (Mooncake-format hash ids).

    ``system_prompts`` shared system prompts of 2..24 blocks, chosen with Zipf(1.1)
    popularity; ``sessions`` chat sessions, each one system prompt plus a
    geometric number of turns (mean 8, at most 40), every turn adding 1..6 blocks
    of user message and answer to the history; ``concurrent`` sessions are open
    at a time and the next request comes from a random open one (so a session's
    turns are interleaved with ~``concurrent`` others), a finished session is
    replaced by a new one. One session in four is a one-shot request. Each
    request ends with a partial block (fresh id) that the next turn does not
    reuse (the text after it changes it).
    """
    rng = np.random.default_rng(seed)
    next_id = itertools.count()
    prompts = [[next(next_id) for _ in range(int(rng.integers(2, 25)))] for _ in range(system_prompts)]
    weights = 1.0 / np.arange(1, system_prompts + 1) ** 1.1
    weights /= weights.sum()

    def new_session() -> dict:
        turns = 1 if rng.random() < 0.25 else int(min(40, rng.geometric(1 / 8)))
        return {"history": list(prompts[int(rng.choice(system_prompts, p=weights))]), "turns": turns}

    started = 0
    open_: list[dict] = []
    requests: list[Request] = []
    while started < sessions or open_:
        while len(open_) < concurrent and started < sessions:
            open_.append(new_session())
            started += 1
        k = int(rng.integers(len(open_)))
        s = open_[k]
        s["history"] += [next(next_id) for _ in range(int(rng.integers(1, 7)))]
        ids = s["history"] + [next(next_id)]
        tail = int(rng.integers(1, block_tokens + 1))
        requests.append(Request(DEFAULT_NS, block_tokens * (len(ids) - 1) + tail, hash_ids=ids,
                                timestamp=float(len(requests))))
        s["turns"] -= 1
        if s["turns"] <= 0:
            open_[k] = open_[-1]
            open_.pop()
    name = f"sessions-seed{seed}"
    if (sessions, system_prompts, concurrent) != (2000, 40, 400):
        name += f"-n{sessions}-p{system_prompts}-c{concurrent}"
    return Trace(name, requests, block_tokens)


def save_trace(trace: Trace, path: Path) -> None:
    with open(path, "w") as f:
        for r in trace.requests:
            if r.hash_ids is not None:
                obj = {"timestamp": r.timestamp, "input_length": r.input_tokens, "output_length": 0,
                       "hash_ids": r.hash_ids}
            else:
                obj = {"tokens": r.tokens.tolist(), "namespace": r.namespace}
            f.write(json.dumps(obj) + "\n")


def whole_pages(trace: Trace, req: Request, page_size: int, max_pages: int) -> tuple[np.ndarray, int]:
    """(the token ids of the request's whole pages, at most max_pages of them; the page count)."""
    if req.tokens is not None:
        toks = req.tokens
    else:
        toks = mooncake_tokens(req.hash_ids, req.input_tokens, trace.block_tokens, req.serial)
    npages = len(toks) // page_size
    if max_pages:
        npages = min(npages, max_pages)
    return toks[: npages * page_size], npages


def page_chains(trace: Trace, page_size: int) -> list[list[int]]:
    """Per request, the ids of its whole pages: equal ids <=> equal namespace and token prefix."""
    intern: dict[tuple, int] = {}
    chains = []
    for req in trace.requests:
        toks, npages = whole_pages(trace, req, page_size, 0)
        parent = ("ns", req.namespace)
        chain = []
        if req.hash_ids is not None and page_size == trace.block_tokens and npages <= len(req.hash_ids):
            keys = req.hash_ids[:npages]  # a block is a page: its hash id names its content
        else:
            data = toks.tobytes()
            pb = page_size * 4
            keys = [hash(data[i * pb : (i + 1) * pb]) for i in range(npages)]
        for key in keys:
            pid = intern.setdefault((parent, key), len(intern))
            chain.append(pid)
            parent = pid
        chains.append(chain)
    return chains


# -- capacities --------------------------------------------------------------------------------------


def parse_capacity(text: str, block_bytes: int) -> int:
    """Pages for one --capacities item (UNLIMITED for 'unlimited')."""
    t = text.strip().lower().replace("_", "").replace(",", "")
    if t in ("unlimited", "inf", "0"):
        return UNLIMITED
    m = re.fullmatch(r"([0-9.]+(?:e[0-9]+)?)([a-z]*)", t)
    if not m:
        raise ValueError(f"bad capacity {text!r}")
    value, unit = float(m.group(1)), m.group(2)
    if not unit:
        return int(value)
    if unit not in UNITS:
        raise ValueError(f"unknown unit in capacity {text!r}")
    pages = int(value * UNITS[unit]) // block_bytes
    if pages < 1:
        raise ValueError(f"capacity {text!r} holds no page of {block_bytes} bytes")
    return pages


def cap_label(cap: int) -> str:
    """The key of a capacity in results and --json ("1000", "unlimited")."""
    return "unlimited" if cap == UNLIMITED else str(cap)


def cap_title(cap: int) -> str:
    return "unlimited" if cap == UNLIMITED else f"{cap:,}"


# -- replays -----------------------------------------------------------------------------------------


def _progress(total: int, desc: str, quiet: bool):
    return progress_bar(total, desc, "req", quiet=quiet, unit_scale=True, leave=False)


def in_flight_count(capacity: int, in_flight: int) -> int:
    """Requests in flight an arena of ``capacity`` pages takes: at most capacity - 1 beside the one looking up."""
    return in_flight if capacity == UNLIMITED else max(0, min(in_flight, capacity - 1))


def in_flight_pages(capacity: int, in_flight: int) -> int:
    """The pages a request is cut to with in_flight_count() others pinned beside it: (in flight + 1) x
    these pages fit the arena, so pins never fill it and every insert finds room."""
    return capacity // (in_flight_count(capacity, in_flight) + 1)  # (UNLIMITED is 0: it stays so)


def replay_requests(store, trace: Trace, page_size: int, capacity: int, bar=None, in_flight: int = 0) -> int:
    """Every request of ``trace`` through ``store`` as a worker does (look up, store the rest, release); hit tokens.

    ``in_flight``: requests computing at once. A request stores its pages and releases its lease only
    after the next ``in_flight`` requests have looked up, so it cannot hit what one still in flight has
    not stored, and the leases of all in flight pin their pages meanwhile; each request is cut to
    in_flight_pages() pages, and an arena smaller than in_flight + 1 pages takes in_flight_count().
    """
    hit = 0
    pending: collections.deque = collections.deque()
    max_pages = in_flight_pages(capacity, in_flight)
    in_flight = in_flight_count(capacity, in_flight)
    for i, req in enumerate(trace.requests):
        toks, npages = whole_pages(trace, req, page_size, max_pages)
        ns = req.namespace.encode()
        packed = toks.tobytes()
        m = store.match(ns, packed, lease=True, owner=1)
        hit += m.matched_tokens
        pending.append((ns, packed, npages, m))
        if len(pending) > in_flight:
            _finish(store, page_size, *pending.popleft())
        if bar is not None and i % 256 == 255:
            bar.update(256)
    while pending:
        _finish(store, page_size, *pending.popleft())
    return hit


def _finish(store, page_size: int, ns: bytes, packed: bytes, npages: int, m) -> None:
    """A request computed: store the pages it missed, release its lease."""
    if npages * page_size > m.matched_tokens:
        store.insert(ns, packed, offset=m.matched_tokens, owner=1)
    if m.lease_id:
        store.release(m.lease_id, 1)


def replay_store(trace: Trace, policy: str, capacity: int, page_size: int, shards: int = 16,
                 quiet: bool = False, in_flight: int = 0) -> dict:
    """In process on PrefixStore; returns {"hit_tokens", "input_tokens", "hit_rate", "evictions"}.

    ``in_flight``: requests computing at once (replay_requests); hit_rate is still of all input tokens.
    """
    from pfxcache.daemon.store import MemoryArena, PrefixStore

    if capacity == UNLIMITED:
        nblocks = sum(whole_pages(trace, r, page_size, 0)[1] for r in trace.requests) + 1
    else:
        nblocks = capacity
    arena = MemoryArena(1, nblocks)
    tick = itertools.count(1)
    store = PrefixStore(arena, page_size=page_size, shards=shards, policy=policy,
                        clock=lambda: float(next(tick)), lease_ttl_ms=0)
    bar = _progress(len(trace.requests), f"store {policy} {cap_title(capacity)}", quiet)
    try:
        hit = replay_requests(store, trace, page_size, capacity, bar, in_flight)
        evictions = store.evictions
        problems = store.check() if len(trace.requests) <= 2000 else []
        if problems:
            raise RuntimeError(f"store inconsistent after the replay: {problems[:3]}")
    finally:
        bar.close()
        arena.close()
    total = trace.input_tokens
    return {"hit_tokens": hit, "input_tokens": total, "hit_rate": hit / total if total else 0.0,
            "evictions": evictions}


class DaemonRefused(Exception):
    """The daemon at --url cannot take this replay (unreachable, another page size, a policy it refuses)."""


class DaemonRunner:
    """Replays through pfxcached with the client library (one daemon per run unless --url is given).

    A daemon at --url is checked before anything on it changes (``check``): a replay it cannot take is
    refused with the daemon as it was. Each run then sets the policy and empties the trace's
    namespaces; ``restore`` (called on every exit path) sets the policy the daemon had back.
    """

    def __init__(self, url: str | None, block_bytes: int) -> None:
        self.url = url
        self.block_bytes = block_bytes
        self.policy_before: str | None = None  # the --url daemon's maxmemory-policy, set back by restore()
        self.policy_changed = False

    def _connect(self):
        from pfxcache.client import PrefixCache

        return PrefixCache.from_url(self.url, attach=False)

    def check(self, page_size: int) -> int:
        """The --url daemon's capacity in pages, once it is known to take pages of ``page_size`` tokens.

        Reads only (PFXINFO, CONFIG GET): raises DaemonRefused, the daemon untouched, when it cannot be
        asked or its page size is not the replay's.
        """
        import redis

        try:
            with self._connect() as cache:
                info = cache.info()
                self.policy_before = cache.client.config_get("maxmemory-policy")["maxmemory-policy"]
        except (redis.RedisError, OSError) as exc:
            raise DaemonRefused(f"cannot ask the daemon at {self.url} for its geometry: {exc}") from None
        if info.page_size != page_size:
            raise DaemonRefused(
                f"the daemon at {self.url} has pages of {info.page_size} tokens, this replay needs {page_size} "
                f"(give --page-size {info.page_size}, or replay against a daemon started with --page-size "
                f"{page_size}); nothing on the daemon was changed")
        return int(info.arena.get("nblocks") or info.arena["blocks-total"])

    def restore(self) -> None:
        """Set the --url daemon's maxmemory-policy back to what check() read, if a run changed it."""
        import redis

        if not self.policy_changed:
            return
        try:
            with self._connect() as cache:
                cache.client.config_set("maxmemory-policy", self.policy_before)
        except (redis.RedisError, OSError) as exc:
            print(f"scripts/replay: could not set the daemon's maxmemory-policy back to {self.policy_before}: {exc}",
                  file=sys.stderr)
            return
        self.policy_changed = False

    def _start(self, policy: str, capacity: int, page_size: int, shards: int):
        bb = max(self.block_bytes, -(-1024 // capacity))  # maxmemory must be >= 1024 bytes
        daemon = start_daemon(
            "--port", "0", "--arena", "memory", "--maxmemory", str(capacity * bb), "--block-bytes", str(bb),
            "--page-size", str(page_size), "--shards", str(shards), "--maxmemory-policy", policy,
            "--evict-low-watermark", "0", "--lease-ttl", str(7 * 24 * 3600 * 1000),
            "--prompt-max-tokens", str(1 << 24), "--save", "", "--loglevel", "warning", ready_timeout=30)
        return daemon, f"redis://{daemon.host}:{daemon.port}/0", bb

    def _prepare(self, cache, trace: Trace, policy: str) -> None:
        """The --url daemon set for a run: ``policy`` afresh, the trace's namespaces empty."""
        import redis

        if self.policy_before is None:
            raise RuntimeError("DaemonRunner.check() must run before a run against --url")
        # Switching policy rebuilds the eviction index, so a learning policy starts afresh, as it
        # does in store mode: switch away and back. The policy is tried first, so one the daemon
        # refuses leaves the namespaces as they were; the namespaces are emptied under the other
        # policy and the fresh one set last, so it never sees the old pages leave.
        self.policy_changed = True
        other = "lru" if policy != "lru" else "lfu"
        try:
            cache.client.config_set("maxmemory-policy", policy)
        except redis.ResponseError as exc:
            raise DaemonRefused(f"the daemon at {self.url} refuses maxmemory-policy {policy}: {exc}") from None
        cache.client.config_set("maxmemory-policy", other)
        for ns in {r.namespace for r in trace.requests}:
            cache.evict(ns, all=True)
        cache.client.config_set("maxmemory-policy", policy)

    def run(self, trace: Trace, policy: str, capacity: int, page_size: int, shards: int, quiet: bool) -> dict:
        from pfxcache.client import PrefixCache

        daemon = None
        if self.url is None:
            if capacity == UNLIMITED:
                capacity = sum(whole_pages(trace, r, page_size, 0)[1] for r in trace.requests) + 1
            daemon, url, bb = self._start(policy, capacity, page_size, shards)
        else:
            url = self.url
        cache = PrefixCache.from_url(url, attach=False)
        try:
            info = cache.info()
            if info.page_size != page_size:  # check() refused this already for --url
                raise RuntimeError(f"the daemon's page size is {info.page_size}, the replay needs {page_size}")
            if self.url is not None:
                self._prepare(cache, trace, policy)
            bb = info.block_bytes
            max_pages = capacity if self.url is None else int(info.arena.get("nblocks") or info.arena["blocks-total"])
            hit = 0
            bar = _progress(len(trace.requests), f"daemon {policy} {cap_title(capacity)}", quiet)
            zeros = bytes(bb * max(1, min(4096, max_pages)))
            for i, req in enumerate(trace.requests):
                toks, npages = whole_pages(trace, req, page_size, max_pages)
                match = cache.lookup(req.namespace, toks, lease=True, with_data=False)
                try:
                    got = match.matched_tokens
                    hit += got
                    new = npages - got // page_size
                    if new > 0:
                        data = zeros[: new * bb] if new * bb <= len(zeros) else bytes(new * bb)
                        cache.store(req.namespace, toks, data, offset=got)
                finally:
                    cache.release(match)
                if i % 64 == 63:
                    bar.update(64)
            bar.close()
        finally:
            cache.close()
            if daemon is not None:
                daemon.stop()
        total = trace.input_tokens
        return {"hit_tokens": hit, "input_tokens": total, "hit_rate": hit / total if total else 0.0}


def _lost_daemon(exc: BaseException) -> bool:
    """Whether ``exc`` says the daemon stopped answering (redis-py's connection errors, or a socket's)."""
    import redis

    return isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError))


def belady(trace: Trace, chains: list[list[int]], capacity: int, page_size: int, quiet: bool = False) -> dict:
    """Offline bound at page granularity (see the module docstring)."""
    never = len(chains)
    # next use of each occurrence: nxt[i][k] = the next request after i holding chains[i][k]
    seen: dict[int, int] = {}
    nxt: list[list[int]] = [None] * len(chains)  # type: ignore[list-item]
    for i in range(len(chains) - 1, -1, -1):
        c = chains[i]
        nxt[i] = [seen.get(p, never) for p in c]
        for p in c:
            seen[p] = i
    cap = capacity if capacity != UNLIMITED else 1 << 62
    cached: dict[int, int] = {}  # page -> its next use (the key of its valid heap entry)
    depth_of: dict[int, int] = {}
    heap: list[tuple[int, int, int]] = []  # (-next use, -depth, page)
    hit = 0
    bar = _progress(len(chains), f"belady {cap_title(capacity)}", quiet)
    for i, chain in enumerate(chains):
        if cap < len(chain):
            chain = chain[:cap]
        k = 0
        while k < len(chain) and chain[k] in cached:
            k += 1
        hit += k * page_size
        pinned = set(chain[:k])
        for d in range(k):  # the hit pages: their next use moves on
            p = chain[d]
            cached[p] = nxt[i][d]
            heapq.heappush(heap, (-nxt[i][d], -d, p))
        need = len(cached) + (len(chain) - k) - cap
        aside = []
        while need > 0:
            negnu, negd, p = heapq.heappop(heap)
            if cached.get(p) != -negnu:
                continue  # stale, or not cached (a page of this request not inserted yet)
            if p in pinned:
                aside.append((negnu, negd, p))
                continue
            del cached[p]
            need -= 1
        for e in aside:
            heapq.heappush(heap, e)
        for d in range(k, len(chain)):  # the new pages
            p = chain[d]
            cached[p] = nxt[i][d]
            depth_of[p] = d
            heapq.heappush(heap, (-nxt[i][d], -d, p))
        if len(heap) > 4 * len(cached) + 1024:
            heap = [(-nu, -depth_of[p], p) for p, nu in cached.items()]
            heapq.heapify(heap)
        if i % 256 == 255:
            bar.update(256)
    bar.close()
    total = trace.input_tokens
    return {"hit_tokens": hit, "input_tokens": total, "hit_rate": hit / total if total else 0.0}


# -- output -------------------------------------------------------------------------------------------


def plot(results: dict, capacities: list[int], policies: list[str], path: Path, title: str,
         unlimited_x: int) -> Path | None:
    figure = new_plot()
    if figure is None:
        return None
    fig, ax = figure
    xs = [c if c != UNLIMITED else unlimited_x for c in capacities]
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    markers = itertools.cycle("osD^v<>p")
    for name in [*policies, "belady"]:
        ys = [results[name][cap_label(capacities[i])]["hit_rate"] for i in order]
        style = {"color": "black", "linestyle": "--", "marker": "*"} if name == "belady" else {"marker": next(markers)}
        ax.plot([xs[i] for i in order], ys, label="Belady (offline)" if name == "belady" else name, **style)
    ax.set_xscale("log")
    ax.set_xlabel("capacity (pages)" + (f"; unlimited plotted at {unlimited_x:,}" if UNLIMITED in capacities else ""))
    ax.set_ylabel("token hit rate")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return save_plot(fig, path)


def main(argv: list[str] | None = None) -> int:
    from pfxcache.daemon.store.registry import POLICIES, SHIPPED

    parser = tool_parser("replay", __doc__)
    parser.add_argument("traces", nargs="*", type=Path,
                        help=f"trace files or directories of them (default {DEFAULT_TRACE} when it exists)")
    parser.add_argument("--format", choices=FORMATS, default="auto",
                        help="trace format (default auto: kvtester for one JSON object with requests and "
                             "block_size, tokens for lines with tokens, else mooncake)")
    parser.add_argument("--kvtester-users", type=int, default=KVTESTER_USERS,
                        help=f"kvtester: conversations active at a time, the next starting when one ends "
                             f"(default {KVTESTER_USERS}, the tester's --max-users; 0 = all at once)")
    parser.add_argument("--kvtester-max-delay", type=float, default=KVTESTER_MAX_DELAY,
                        help=f"kvtester: cap on the delay between a conversation's requests, seconds "
                             f"(default {KVTESTER_MAX_DELAY:g}, the tester's --max-delay)")
    parser.add_argument("--kvtester-timing", choices=KVTESTER_TIMINGS, default="think-only",
                        help="kvtester: delays from think_time (default, as the tester) or from t (original)")
    parser.add_argument("--kvtester-max-context", type=int, default=0,
                        help="kvtester: stop a conversation at its first request past this many input tokens "
                             "(default 0 = never; the tester's --max-context is 128000)")
    parser.add_argument("--kvtester-warm-prefix", type=float, default=0.0,
                        help="kvtester: share this fraction of the largest tool+system prompt across all "
                             "conversations, as the tester's --warm-prefix-pct (default 0: as they come; its is 0.5)")
    parser.add_argument("--namespace-per-file", action="store_true",
                        help="each file is its own namespace (its hash ids do not meet other files')")
    parser.add_argument("--generate", choices=("sessions",), help="replay a generated workload instead of a file")
    parser.add_argument("--sessions", type=int, default=2000, help="--generate sessions: sessions (default 2000)")
    parser.add_argument("--save", type=Path, help="write the (generated) trace as JSONL and go on")
    parser.add_argument("--system-prompts", type=int, default=40,
                        help="--generate sessions: shared system prompts (default 40)")
    parser.add_argument("--concurrent", type=int, default=400,
                        help="--generate sessions: sessions open at a time (default 400)")
    parser.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    parser.add_argument("--limit", type=int, help="replay only the first N requests")
    parser.add_argument("--capacities", default="1000,3000,10000,30000,unlimited",
                        help="comma-separated pages, or bytes with a unit (64gb), or 'unlimited' "
                             "(default 1000,3000,10000,30000,unlimited)")
    parser.add_argument("--block-bytes", type=int, default=DEFAULT_BLOCK_BYTES,
                        help="KV bytes of one page, to turn byte capacities into pages (default 64 MiB)")
    parser.add_argument("--policies",
                        help=f"comma-separated eviction policies (default {','.join(POLICIES)}; "
                             f"with --mode daemon, those a daemon offers: {','.join(SHIPPED)})")
    parser.add_argument("--no-belady", action="store_true", help="skip the offline Belady reference")
    parser.add_argument("--page-size", type=int, help="tokens per page (default: the trace's block, 512 for Mooncake)")
    parser.add_argument("--block-tokens", type=int,
                        help="tokens per hash id (default 512; kvtester: the files' block_size, which must agree)")
    parser.add_argument("--shards", type=int, default=16, help="shards of the store/daemon (default 16)")
    parser.add_argument("--mode", choices=("store", "daemon"), default="store", help="where to replay")
    parser.add_argument("--url", help="--mode daemon: a running pfxcached (redis://host:port/0)")
    parser.add_argument("--daemon-block-bytes", type=int, default=16,
                        help="--mode daemon: block bytes of the daemons it starts (default 16; data is zeros)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    if args.policies is None:
        args.policies = ",".join(SHIPPED if args.mode == "daemon" else POLICIES)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in POLICIES:
            parser.error(f"unknown policy {p!r} (known: {', '.join(POLICIES)})")
        if args.mode == "daemon" and p not in SHIPPED:
            parser.error(f"policy {p!r} is not one a daemon offers (it runs in --mode store only; "
                         f"a daemon's: {', '.join(SHIPPED)})")
    try:
        capacities = [parse_capacity(c, args.block_bytes) for c in args.capacities.split(",") if c.strip()]
    except ValueError as exc:
        parser.error(str(exc))
    if args.generate:
        trace = generate_sessions(args.seed, args.sessions, args.system_prompts, args.concurrent,
                                  block_tokens=args.block_tokens or MOONCAKE_BLOCK)
        if args.limit:
            trace.requests = trace.requests[: args.limit]
    else:
        paths = args.traces or [DEFAULT_TRACE]
        for p in paths:
            if not p.exists():
                parser.error(f"no trace at {p} (give a path, or --generate sessions)")
        try:
            trace = read_trace(paths, args.format, args.namespace_per_file, args.block_tokens, args.limit,
                               users=args.kvtester_users, max_delay=args.kvtester_max_delay,
                               timing=args.kvtester_timing, max_context=args.kvtester_max_context,
                               warm_prefix=args.kvtester_warm_prefix)
        except TraceFormatError as exc:
            parser.error(str(exc))
    if args.save:
        save_trace(trace, args.save)
    if not trace.requests:
        parser.error("the trace is empty")
    page_size = args.page_size or trace.block_tokens

    chains = page_chains(trace, page_size)
    distinct = len({p for c in chains for p in c})
    accesses = sum(len(c) for c in chains)
    runner = DaemonRunner(args.url, args.daemon_block_bytes) if args.mode == "daemon" else None
    if runner is not None and args.url:
        try:
            capacities = [runner.check(page_size)]  # a running daemon's arena is fixed: its capacity is the only one
        except DaemonRefused as exc:
            print(f"scripts/replay: {exc}", file=sys.stderr)
            return 2
        print(f"--url: the daemon holds {capacities[0]:,} pages; replaying at that capacity only", file=sys.stderr)

    results: dict[str, dict[str, dict]] = {}
    jobs = [(p, c) for p in policies for c in capacities]
    outer = progress_bar(len(jobs) + (0 if args.no_belady else len(capacities)), "replays", "run", quiet=args.quiet)
    started = time.perf_counter()
    try:
        for policy, cap in jobs:
            t0 = time.perf_counter()
            if runner is None:
                row = replay_store(trace, policy, cap, page_size, args.shards, quiet=args.quiet)
            else:
                row = runner.run(trace, policy, cap, page_size, args.shards, args.quiet)
            row["seconds"] = round(time.perf_counter() - t0, 2)
            results.setdefault(policy, {})[cap_label(cap)] = row
            outer.update(1)
    except DaemonRefused as exc:
        outer.close()
        print(f"scripts/replay: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if runner is None or not _lost_daemon(exc):
            raise
        outer.close()
        print(f"scripts/replay: the daemon stopped answering: {exc}", file=sys.stderr)
        return 1
    finally:
        if runner is not None:
            runner.restore()
    if not args.no_belady:
        for cap in capacities:
            results.setdefault("belady", {})[cap_label(cap)] = belady(trace, chains, cap, page_size, args.quiet)
            outer.update(1)
    outer.close()
    elapsed = time.perf_counter() - started

    command = command_line("replay", argv)
    summary = {"requests": len(trace.requests), "input_tokens": trace.input_tokens, "page_size": page_size,
               "page_accesses": accesses, "distinct_pages": distinct}
    plot_path = None
    if not args.no_plot and not args.no_belady:
        plot_path = plot(results, capacities, policies, OUT / f"replay-{trace.name}.png",
                         f"{command}\n{trace.name}: {len(trace.requests):,} requests, page {page_size} tokens, "
                         f"mode {args.mode}", max(distinct, max(capacities) * 2))
    if args.json:
        print(json.dumps({"command": command, "trace": trace.name, "mode": args.mode, **summary,
                          "capacities": [cap_label(c) for c in capacities], "policies": policies,
                          "results": results, "seconds": round(elapsed, 1),
                          "plot": str(plot_path) if plot_path else None}, indent=2))
        return 0
    print(f"$ {command}")
    print(f"{trace.name}: {len(trace.requests):,} requests, {trace.input_tokens:,} input tokens, page {page_size} "
          f"tokens, {accesses:,} page accesses, {distinct:,} distinct pages; mode {args.mode}; {elapsed:.0f} s")
    names = [*policies, *([] if args.no_belady else ["belady"])]
    labels = [cap_label(c) for c in capacities]
    header = f"{'policy':<10}" + "".join(f"{cap_title(c):>11}" for c in capacities)
    print("token hit rate by capacity (pages)")
    print(header)
    print("-" * len(header))
    for name in names:
        print(f"{name:<10}" + "".join(f"{results[name][lab]['hit_rate']:>11.3f}" for lab in labels))
    def ratios(title: str, rows: list[str], reference: str) -> None:
        print(f"\n{title}")
        print(header)
        print("-" * len(header))
        for name in rows:
            cells = []
            for lab in labels:
                base = results[reference][lab]["hit_rate"]
                cells.append(f"{results[name][lab]['hit_rate'] / base:>11.2f}" if base else f"{'-':>11}")
            print(f"{name:<10}" + "".join(cells))

    if "lru" in results and len(names) > 1:
        ratios("ratio to lru (>1 is better)", names, "lru")
    if not args.no_belady:
        ratios("share of Belady's hits (1.00 = the bound)", policies, "belady")
    if plot_path:
        print(f"\nplot: {shown(plot_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
