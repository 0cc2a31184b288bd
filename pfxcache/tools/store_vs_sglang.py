"""The store core against SGLang 0.5.23's RadixCache on the same workload (part of scripts/bench-store).

Both caches get the same requests, in the same order, at the same page size:

* a tree is built from a branching trace of prompts (``--sglang-prompt-tokens``
  each, shared system prompts and branching conversations, as bench-store's
  trace) until it holds ``--sglang-tokens`` tokens; every insert's prefix length
  (tokens already cached) must be the same in both, and so must the matched
  length of every query below (full hits and partial hits): the run stops with
  an error otherwise;
* **match**: ``store.match(lease=False)`` vs ``RadixCache.match_prefix``, over
  cached prompts and prompts sharing a prefix with one (both touch the path);
* **insert**: ``store.insert`` (which also allocates the new pages' blocks) vs
  ``RadixCache.insert`` (given precomputed KV indices), of prompts that share a
  cached prefix and add ``--new-pages`` new pages;
* **evict 10 %**: one call evicting a tenth of the cached tokens,
  ``store.evict_pages`` (policy lru, as SGLang's default) vs
  ``RadixCache.evict``; the evicted prompts are stored again, untimed, before
  the next call. SGLang evicts whole leaves, so it may take a few more tokens.

The long-prompt workloads (``compare_long``) are passes over whole prompt lists instead:
insert-all, match-all, evict 10 %, each from two empty caches, every length checked;
``bytes_per_page`` measures the resident memory each cache adds per cached page.

The store runs as the daemon does (16 shards). Each figure is the median of
``--repeat`` runs; the ratios are SGLang's time over the store's (>1: the store
is faster). Timed sections run with the cyclic garbage collector off (collected
first), as ``timeit`` does, for both, and are timed in CPU time of this process
(``time.process_time``): on a shared machine, another job's time slices would
otherwise land in whichever call they interrupt. See pfxcache.tools.sglang_peer for how
SGLang is loaded.
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
import time
from array import array
from typing import Any

import numpy as np

from pfxcache.daemon.store import MemoryArena, PrefixStore
from pfxcache.tools.common import timed_loop  # the store benchmark's loop: ops/s in CPU time

NS = b"vs-sglang"


class Workload:
    """Token-id prompts of the branching trace, each kept as packed bytes (store) and array('q') (SGLang)."""

    def __init__(self, seed: int, page_size: int, prompt_tokens: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.page = page_size
        self.length = prompt_tokens // page_size * page_size
        self.pool: list[np.ndarray] = []

    def fresh(self, n: int) -> np.ndarray:
        return self.rng.integers(1, 2**31, size=n, dtype=np.int64)

    def branch(self, new_tokens: int | None = None) -> np.ndarray:
        """A new prompt: fresh (1 in 10, or when nothing is cached), else a cached prompt's prefix + new tokens."""
        if not self.pool or (new_tokens is None and self.rng.random() < 0.1):
            return self.fresh(self.length)
        parent = self.pool[int(self.rng.integers(len(self.pool)))]
        if new_tokens is None:
            keep = int(self.rng.integers(1, self.length // self.page)) * self.page
        else:
            keep = self.length - new_tokens
        return np.concatenate([parent[:keep], self.fresh(self.length - keep)])


def _packed(tokens: np.ndarray) -> bytes:
    return tokens.astype("<u4").tobytes()


class Pair:
    """The two caches, fed the same operations."""

    def __init__(self, sglang: Any, page_size: int, capacity_pages: int) -> None:
        self.sglang = sglang
        self.page = page_size
        self.store = PrefixStore(MemoryArena(1, capacity_pages), page_size=page_size, shards=16, policy="lru")
        self.radix, self.freed = sglang.new_cache(page_size)
        self.next_index = 0

    def key(self, tokens: np.ndarray) -> Any:
        return self.sglang.RadixKey(array("q", tokens.tolist()))

    def insert_args(self, tokens: np.ndarray) -> tuple[bytes, Any]:
        """Both caches' arguments for inserting ``tokens`` (SGLang's: its key and KV indices)."""
        values = self.sglang.torch.arange(self.next_index, self.next_index + len(tokens), dtype=self.sglang.torch.int64)
        self.next_index += len(tokens)
        return _packed(tokens), self.sglang.InsertParams(key=self.key(tokens), value=values)

    def insert_both(self, tokens: np.ndarray) -> int:
        """Insert into both and check they agree on the cached prefix; returns its length in tokens."""
        packed, params = self.insert_args(tokens)
        ours = self.store.insert(NS, packed).existing * self.page
        theirs = self.radix.insert(params).prefix_len
        if ours != theirs:
            raise RuntimeError(f"insert prefix lengths differ: store {ours}, SGLang {theirs} tokens")
        return ours

    def match_both(self, tokens: np.ndarray) -> int:
        ours = self.store.match(NS, _packed(tokens), lease=False).matched_tokens
        theirs = self.radix.match_prefix(self.sglang.MatchPrefixParams(key=self.key(tokens))).device_prefix_len
        if ours != theirs:
            raise RuntimeError(f"match lengths differ: store {ours}, SGLang {theirs} tokens")
        return ours

    def cached_tokens(self) -> tuple[int, int]:
        return self.store.stats()["pages"] * self.page, self.radix.total_size()


class _NoGC:
    """Timed sections run with the cyclic garbage collector collected and off, as timeit does, for both caches:
    a collection of the whole heap landing in one of them would measure the heap, not the cache."""

    def __enter__(self) -> None:
        gc.collect()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        gc.enable()


def _per_call(fn, items: list, min_time: float) -> float:
    """Seconds per fn(item), cycling over items for at least min_time (CPU time, GC off)."""
    with _NoGC():
        return 1.0 / timed_loop(fn, items, min_time)


def compare(sglang: Any, *, page_size: int, tokens: int, prompt_tokens: int, new_pages: int, repeat: int,
            min_time: float, seed: int) -> dict:
    """Build the same tree in both, check they agree, time match / insert / evict 10 %; seconds per call."""
    work = Workload(seed, page_size, prompt_tokens)
    inserts_timed = 200
    pair = Pair(sglang, page_size, tokens // page_size * 2 + (inserts_timed * repeat + 64) * new_pages)
    prompts: list[np.ndarray] = []
    while pair.cached_tokens()[0] < tokens:
        prompt = work.branch()
        pair.insert_both(prompt)
        prompts.append(prompt)
        work.pool.append(prompt)
    size = pair.cached_tokens()
    if size[0] != size[1]:
        raise RuntimeError(f"the trees differ in size: store {size[0]}, SGLang {size[1]} tokens")

    # Queries: cached prompts (full hits) and prompts sharing a cached prefix (partial hits), checked in both.
    queries = [prompts[int(work.rng.integers(len(prompts)))] for _ in range(300)]
    queries += [work.branch(new_tokens=page_size * int(work.rng.integers(1, work.length // page_size)))
                for _ in range(300)]
    matched = sum(pair.match_both(q) for q in queries)
    packed_queries = [_packed(q) for q in queries]
    keys = [pair.key(q) for q in queries]
    store, radix = pair.store, pair.radix
    MatchPrefixParams = sglang.MatchPrefixParams
    match_params = [MatchPrefixParams(key=k) for k in keys]

    row: dict = {"page_size": page_size, "tokens": size[0], "prompts": len(prompts), "queries": len(queries),
                 "matched_tokens": matched}
    row["match_s"] = statistics.median(
        _per_call(lambda q: store.match(NS, q, lease=False), packed_queries, min_time) for _ in range(repeat))
    row["sglang_match_s"] = statistics.median(
        _per_call(radix.match_prefix, match_params, min_time) for _ in range(repeat))

    # Inserts: the same new prompts into both (timed each side on its own), lengths checked after.
    new_tokens = new_pages * page_size
    ours_t, theirs_t = [], []
    for _ in range(repeat):
        batch = [work.branch(new_tokens=new_tokens) for _ in range(inserts_timed)]
        args = [pair.insert_args(p) for p in batch]
        with _NoGC():
            start = time.process_time()
            results = [store.insert(NS, packed) for packed, _ in args]
            ours_t.append((time.process_time() - start) / len(batch))
        with _NoGC():
            start = time.process_time()
            theirs = [radix.insert(params) for _, params in args]
            theirs_t.append((time.process_time() - start) / len(batch))
        for r, t in zip(results, theirs):
            if r.existing * page_size != t.prefix_len:
                raise RuntimeError(f"insert prefix lengths differ: store {r.existing * page_size}, "
                                   f"SGLang {t.prefix_len} tokens")
        prompts += batch
    row["insert_s"] = statistics.median(ours_t)
    row["sglang_insert_s"] = statistics.median(theirs_t)
    row["inserted_new_tokens"] = new_tokens

    # Evict a tenth of the cached tokens in one call; then store every prompt again (untimed).
    ours_t, theirs_t, evicted = [], [], []
    for _ in range(repeat):
        cached = pair.cached_tokens()[0]
        goal = cached // 10
        with _NoGC():
            start = time.process_time()
            pages = store.evict_pages(NS, goal // page_size).evicted
            ours_t.append(time.process_time() - start)
        with _NoGC():
            start = time.process_time()
            tokens_out = radix.evict(sglang.EvictParams(num_tokens=goal)).num_tokens_evicted
            theirs_t.append(time.process_time() - start)
        evicted.append((pages * page_size, tokens_out))
        # The two evicted different tokens (whole leaves vs trimmed pages): storing every prompt again
        # makes the trees equal again, which the sizes confirm.
        for prompt in prompts:
            packed, params = pair.insert_args(prompt)
            store.insert(NS, packed)
            radix.insert(params)
        size = pair.cached_tokens()
        if size[0] != size[1]:
            raise RuntimeError(f"after the refill the trees differ: store {size[0]}, SGLang {size[1]} tokens")
    row["evict_s"] = statistics.median(ours_t)
    row["sglang_evict_s"] = statistics.median(theirs_t)
    row["evicted_tokens"] = evicted[len(evicted) // 2]
    for op in ("match", "insert", "evict"):
        row[f"{op}_ratio"] = row[f"sglang_{op}_s"] / row[f"{op}_s"]
    store.arena.close()
    return row


def report(rows: list[dict], source: str) -> list[str]:
    """The table's lines."""
    lines = [f"store core vs SGLang 0.5.23 RadixCache ({source}), same workload, median of runs; "
             "ratio = SGLang time / store time (>1: the store is faster)",
             f"{'page':>5}{'tokens':>10}{'match us':>10}{'sglang':>9}{'ratio':>7}{'insert us':>11}{'sglang':>9}"
             f"{'ratio':>7}{'evict10% ms':>13}{'sglang':>9}{'ratio':>7}"]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        lines.append(
            f"{r['page_size']:>5}{r['tokens']:>10,}{r['match_s'] * 1e6:>10.1f}{r['sglang_match_s'] * 1e6:>9.1f}"
            f"{r['match_ratio']:>7.2f}{r['insert_s'] * 1e6:>11.1f}{r['sglang_insert_s'] * 1e6:>9.1f}"
            f"{r['insert_ratio']:>7.2f}{r['evict_s'] * 1e3:>13.2f}{r['sglang_evict_s'] * 1e3:>9.2f}"
            f"{r['evict_ratio']:>7.2f}")
    for r in rows:
        ours, theirs = r["evicted_tokens"]
        lines.append(f"  page {r['page_size']}: {r['prompts']:,} prompts built the trees; {r['queries']} queries "
                     f"matched {r['matched_tokens']:,} tokens in both; inserts add {r['inserted_new_tokens']} tokens; "
                     f"evict 10 %: store {ours:,} / SGLang {theirs:,} tokens")
    return lines


# -- long prompts ---------------------------------------------------------------------------------
#
# Multi-turn prompts of thousands of tokens, the turns of one conversation sharing their history:
# every prompt is inserted (insert-all), then every prompt is matched (match-all, full hits), then one
# call evicts a tenth of the cached tokens. Each pass starts from two empty caches; both caches must
# agree on every insert's prefix length and every match length. Figures are seconds per pass.

TRACE_BLOCK_TOKENS = 512  # the conversation trace's hash_ids name blocks of 512 tokens


def trace_prompts(path, limit: int | None = None) -> list[np.ndarray]:
    """Token-id prompts of a Mooncake-style trace (``input_length``, ``hash_ids``): block ``h`` is the
    tokens ``h * 512 + 1 ..``, so requests naming the same blocks share those tokens."""
    import json

    prompts = []
    offsets = np.arange(1, TRACE_BLOCK_TOKENS + 1, dtype=np.int64)
    with open(path) as f:
        for line in f:
            if limit is not None and len(prompts) >= limit:
                break
            row = json.loads(line)
            ids = np.asarray(row["hash_ids"], dtype=np.int64)
            tokens = (ids[:, None] * TRACE_BLOCK_TOKENS + offsets[None, :]).reshape(-1)
            prompts.append(tokens[: row["input_length"]])
    return prompts


def agent_prompts(seed: int, sessions: int = 160, turns: int = 12, system_prompts: int = 6) -> list[np.ndarray]:
    """A synthetic long-prompt workload, independent of the trace: agent sessions that start from one of a
    few long system prompts (2,000-8,000 tokens), each turn appending a tool result or a reply of a
    log-normal length (median ~700 tokens, a long tail), sessions interleaved at random; a session's
    turn ``t`` sends its whole history. Ids are random, so no two sessions share tokens past their system prompt."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(1, 2**31, size=int(rng.integers(2000, 8001)), dtype=np.int64)
               for _ in range(system_prompts)]
    histories = [systems[int(rng.integers(system_prompts))] for _ in range(sessions)]
    left = [int(rng.integers(turns // 2, turns + 1)) for _ in range(sessions)]
    prompts = []
    live = list(range(sessions))
    while live:
        k = int(rng.integers(len(live)))
        s = live[k]
        step = max(1, int(rng.lognormal(np.log(700), 0.9)))
        histories[s] = np.concatenate([histories[s], rng.integers(1, 2**31, size=step, dtype=np.int64)])
        prompts.append(histories[s])
        left[s] -= 1
        if not left[s]:
            live[k] = live[-1]
            live.pop()
    return prompts


def _pass(sglang: Any, prompts: list[np.ndarray], page_size: int) -> dict:
    """One pass: two empty caches, insert-all, match-all, evict 10 %; seconds of each, lengths checked."""
    aligned = [p[: len(p) // page_size * page_size] for p in prompts]
    aligned = [p for p in aligned if len(p)]
    total_pages = sum(len(p) for p in aligned) // page_size
    pair = Pair(sglang, page_size, total_pages + 64)
    store, radix = pair.store, pair.radix
    packed = [_packed(p) for p in aligned]
    params = [pair.insert_args(p)[1] for p in aligned]
    match_params = [sglang.MatchPrefixParams(key=pair.key(p)) for p in aligned]
    out: dict = {}
    with _NoGC():
        start = time.process_time()
        ours = [store.insert(NS, q) for q in packed]
        out["insert_s"] = time.process_time() - start
    with _NoGC():
        start = time.process_time()
        theirs = [radix.insert(p) for p in params]
        out["sglang_insert_s"] = time.process_time() - start
    for i, (r, t) in enumerate(zip(ours, theirs)):
        if r.existing * page_size != t.prefix_len:
            raise RuntimeError(f"insert {i}: prefix lengths differ: store {r.existing * page_size}, "
                               f"SGLang {t.prefix_len} tokens")
    size = pair.cached_tokens()
    if size[0] != size[1]:
        raise RuntimeError(f"the trees differ in size: store {size[0]}, SGLang {size[1]} tokens")
    del ours, theirs
    with _NoGC():
        start = time.process_time()
        ours = [store.match(NS, q, lease=False).matched_tokens for q in packed]
        out["match_s"] = time.process_time() - start
    with _NoGC():
        start = time.process_time()
        theirs = [radix.match_prefix(p).device_prefix_len for p in match_params]
        out["sglang_match_s"] = time.process_time() - start
    if ours != theirs:
        i = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        raise RuntimeError(f"match {i}: lengths differ: store {ours[i]}, SGLang {theirs[i]} tokens")
    goal = size[0] // 10
    with _NoGC():
        start = time.process_time()
        evicted = store.evict_pages(NS, goal // page_size).evicted
        out["evict_s"] = time.process_time() - start
    with _NoGC():
        start = time.process_time()
        theirs_out = radix.evict(sglang.EvictParams(num_tokens=goal)).num_tokens_evicted
        out["sglang_evict_s"] = time.process_time() - start
    out.update(prompts=len(aligned), tokens=size[0], matched_tokens=sum(ours),
               evicted_tokens=(evicted * page_size, theirs_out))
    store.arena.close()
    return out


def compare_long(sglang: Any, prompts: list[np.ndarray], *, page_size: int, repeat: int, name: str) -> dict:
    """Median of ``repeat`` passes of the long-prompt workload ``prompts`` (seconds per pass)."""
    runs = [_pass(sglang, prompts, page_size) for _ in range(repeat)]
    row: dict = {"workload": name, "page_size": page_size, "repeat": repeat}
    for k in ("prompts", "tokens", "matched_tokens", "evicted_tokens"):
        row[k] = runs[0][k]
    for op in ("match", "insert", "evict"):
        for side in (f"{op}_s", f"sglang_{op}_s"):
            row[side] = statistics.median(r[side] for r in runs)
            row[side + "_runs"] = [r[side] for r in runs]
        row[f"{op}_ratio"] = row[f"sglang_{op}_s"] / row[f"{op}_s"]
    return row


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def bytes_per_page(trace, limit: int, *, page_size: int, pages: int = 10**6) -> dict:
    """Resident bytes each cache adds per cached page, filled with the first ``limit`` prompts of ``trace``
    (cycled, with fresh ids after the first round) until it holds ``pages`` pages. Each cache is built in a
    fresh interpreter of its own (a fork of a process that ran torch may deadlock), so neither reuses memory
    the other freed: its resident set growth over its page count."""
    row: dict = {"page_size": page_size}
    for side in ("store", "sglang"):
        done = subprocess.run([sys.executable, "-c", "from pfxcache.tools.store_vs_sglang import _child; _child()",
                               side, str(page_size), str(pages), str(trace), str(limit)],
                              capture_output=True, text=True, check=False)
        answer = done.stdout.split()
        if done.returncode or len(answer) != 2:
            raise RuntimeError(f"measuring {side}'s memory failed: {done.stderr.strip()[-500:]}")
        cached, grown = int(answer[0]), int(answer[1])
        row[f"{side}_pages"] = cached
        row[f"{side}_bytes_per_page"] = grown / cached
    return row


def _child() -> None:
    """bytes_per_page's child: ``side page_size pages trace limit`` -> prints ``cached grown``."""
    from pfxcache.tools import sglang_peer

    side, page_size, pages, trace, limit = sys.argv[1:6]
    page_size, pages = int(page_size), int(pages)
    prompts = trace_prompts(trace, int(limit))
    aligned = [p[: len(p) // page_size * page_size] for p in prompts]
    aligned = [p for p in aligned if len(p)]
    del prompts
    sglang = sglang_peer.load() if side == "sglang" else None
    gc.collect()
    cached, grown = _fill(sglang, side, aligned, page_size, pages)
    print(cached, grown)


def _fill(sglang: Any, side: str, aligned: list[np.ndarray], page_size: int, pages: int) -> tuple[int, int]:
    """(pages cached, resident bytes grown) of one cache filled to ``pages`` pages."""
    arena = MemoryArena(1, pages + 200_000) if side == "store" else None
    before = _rss()
    if side == "store":
        cache = PrefixStore(arena, page_size=page_size, shards=16, policy="lru")
    else:
        cache, _ = sglang.new_cache(page_size)
    held, i, shift, next_index = 0, 0, 0, 0
    while held < pages * page_size:
        p = aligned[i % len(aligned)] + shift
        i += 1
        if i % len(aligned) == 0:
            shift += 1 << 26  # a new round: fresh tokens (the trace's ids stay below 2^26)
        if side == "store":
            held += store_insert(cache, p) * page_size
        else:
            values = sglang.torch.arange(next_index, next_index + len(p), dtype=sglang.torch.int64)
            next_index += len(p)
            r = cache.insert(sglang.InsertParams(key=sglang.RadixKey(array("q", p.tolist())), value=values))
            held += len(p) - r.prefix_len
    del p
    gc.collect()
    cached = cache.stats()["pages"] if side == "store" else cache.total_size() // page_size
    return cached, _rss() - before


def store_insert(store: PrefixStore, tokens: np.ndarray) -> int:
    return store.insert(NS, (tokens & 0xFFFFFFFF).astype("<u4").tobytes()).stored


def report_long(rows: list[dict], memory: list[dict]) -> list[str]:
    lines = ["long prompts: insert-all / match-all / evict 10 %, seconds per pass (median of runs), store policy lru "
             "16 shards vs SGLang 0.5.23 RadixCache; ratio = SGLang / store (>1: the store is faster)",
             f"{'workload':>14}{'page':>5}{'prompts':>8}{'tokens':>12}{'match s':>9}{'sglang':>8}{'ratio':>7}"
             f"{'insert s':>9}{'sglang':>8}{'ratio':>7}{'evict ms':>10}{'sglang':>8}{'ratio':>7}"]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        lines.append(f"{r['workload']:>14}{r['page_size']:>5}{r['prompts']:>8,}{r['tokens']:>12,}"
                     f"{r['match_s']:>9.3f}{r['sglang_match_s']:>8.3f}{r['match_ratio']:>7.2f}"
                     f"{r['insert_s']:>9.3f}{r['sglang_insert_s']:>8.3f}{r['insert_ratio']:>7.2f}"
                     f"{r['evict_s'] * 1e3:>10.1f}{r['sglang_evict_s'] * 1e3:>8.1f}{r['evict_ratio']:>7.2f}")
    for m in memory:
        lines.append(f"  bytes per cached page at page {m['page_size']} ({m['store_pages']:,} pages): store "
                     f"{m['store_bytes_per_page']:.1f}, SGLang {m['sglang_bytes_per_page']:.1f} "
                     f"(resident set growth, each in its own process)")
    return lines
