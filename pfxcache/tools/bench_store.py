"""In-process benchmark of the prefix store core (no sockets, no daemon).

For trees of 10^3, 10^4, 10^5 and 10^6 cached pages (--sizes), builds a
PrefixStore over a MemoryArena of tiny blocks (--block-bytes, default 16, so a
million blocks take 16 MB) from a branching trace, then measures:

  match        store.match(ns, prompt, lease=False) of a cached prompt (a full
               hit of --prompt-pages pages): the PFXGET ... NOLEASE path.
               2,000 calls over up to --queries distinct prompts, cycled.
  match+lease  store.match(..., lease=True) then store.release(): the default
               PFXGET path and the worker's release.
  insert       store.insert(ns, prompt) of a prompt that shares a random prefix
               with a cached one and adds --new-pages new pages (no data copy:
               the tree and allocator cost only). The inserted pages are
               dropped again, untimed, so the tree keeps its size.
  evict        store.evict_pages(ns, 1): one page chosen by the policy
               (--policy, default hybrid). Evicted pages are replaced, untimed,
               by fresh prompts so the tree keeps its size. Each call is timed
               on its own: mean, p99 and max are reported.

The trace: each prompt of --prompt-pages pages either starts afresh (1 in 10)
or picks an earlier prompt at random, keeps a random number of its first pages
(1 .. all but one) and continues with new random tokens. That gives a tree of
shared system prompts, conversations that branch, and long unique tails.

The "path" column is the mean number of tree nodes on a queried prompt's
path: what match walks, touches and pins.

Each figure is the best of --repeat runs (default 3) of at least --min-time
seconds each, in CPU time of this process (``time.process_time``): on a shared
machine, wall time also counts the other jobs' time slices (a single eviction
showed maxima of 30 ms under a load average of 16 on 2 cores). The reference is the smallest tree of the same invocation: the
table shows every size's speed as a ratio of it, and the verdict line compares
the cost of evicting one page at the largest size with the smallest (target:
within 2x).

Then the store core against SGLang 0.5.23's RadixCache on one workload, at
page 16 and page 1 (--sglang-pages): both must give the same match and insert
lengths, then match / insert / evict 10 % are timed in both (median of
--repeat); see pfxcache.tools.store_vs_sglang. SGLang's radix cache comes from
its PyPI wheel, which scripts/setup sglang fetches into scripts/out/peers/ (never a dependency of
pfxcache; it needs torch). --no-sglang skips it.

Then long prompts against the same RadixCache (--long-pages, default 16 and
1): the first --long-requests requests of the conversation trace
(../shared/traces/conversation_trace.jsonl, ~13,000 tokens each, the turns of
a conversation sharing their history) and synthetic agent sessions that are
not derived from it (long system prompts, log-normal turns); each pass inserts
every prompt, matches every prompt and evicts 10 % of the tokens, in two empty
caches checked to agree on every insert and match length; seconds per pass,
median of --repeat passes. Then the resident bytes each cache adds per cached
page at --long-memory-pages pages. --no-long skips them.

    scripts/bench-store                       # 10^3 .. 10^6 pages, then vs SGLang
    scripts/bench-store --sizes 1000,100000   # fewer sizes
    scripts/bench-store --json                # machine-readable

The plot (ops/s against tree size, log x) goes to scripts/out/bench-store.png
(bench-store-nogc.png with --no-gc, which turns Python's cyclic garbage
collector off while timing, to show its share).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from pfxcache.daemon.store import MemoryArena, PrefixStore
from pfxcache.tools import sglang_peer, store_vs_sglang
from pfxcache.tools.common import (OUT, command_line, machine, new_plot, progress_bar, save_plot, shown, timed_loop,
                                   tool_parser)

NS = b"bench"
TOKEN_BYTES = 4
POOL_MAX = 50_000  # prompts remembered as parents and match queries


class Trace:
    """The branching prompt generator (seeded: the same trees every run)."""

    def __init__(self, seed: int, page_size: int, prompt_pages: int) -> None:
        self.rng = random.Random(seed)
        self.np_rng = np.random.default_rng(seed)
        self.page_bytes = page_size * TOKEN_BYTES
        self.prompt_pages = prompt_pages
        self.pool: list[bytes] = []

    def fresh(self, pages: int) -> bytes:
        return self.np_rng.integers(0, 2**32, size=pages * self.page_bytes // TOKEN_BYTES, dtype=np.uint32).tobytes()

    def remember(self, prompt: bytes) -> None:
        if len(self.pool) < POOL_MAX:
            self.pool.append(prompt)
        else:
            self.pool[self.rng.randrange(POOL_MAX)] = prompt

    def next_prompt(self) -> tuple[bytes, int]:
        """(prompt, pages shared with an earlier prompt)."""
        L = self.prompt_pages
        if not self.pool or self.rng.random() < 0.1:
            return self.fresh(L), 0
        parent = self.rng.choice(self.pool)
        keep = self.rng.randint(1, L - 1)
        return parent[: keep * self.page_bytes] + self.fresh(L - keep), keep

    def branch(self, new_pages: int) -> tuple[bytes, int]:
        """A prompt of prompt_pages pages, the last new_pages of them new, the rest from a cached prompt."""
        keep = self.prompt_pages - new_pages
        parent = self.rng.choice(self.pool)
        return parent[: keep * self.page_bytes] + self.fresh(new_pages), keep


def build(size: int, args: argparse.Namespace, headroom: int) -> tuple[PrefixStore, Trace, float]:
    trace = Trace(args.seed + size, args.page_size, args.prompt_pages)
    arena = MemoryArena(args.block_bytes, size + args.prompt_pages + headroom)
    store = PrefixStore(arena, page_size=args.page_size, shards=args.shards, policy=args.policy)
    bar = progress_bar(size, f"building {size:,} pages", "page", unit_scale=True, leave=False)
    if bar.disable:
        print(f"  building a tree of {size:,} pages ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    pages = 0
    while pages < size:
        prompt, _ = trace.next_prompt()
        stored = store.insert(NS, prompt).stored
        trace.remember(prompt)
        pages += stored
        if stored:
            bar.update(stored)
    elapsed = time.perf_counter() - start
    bar.close()
    return store, trace, elapsed


def path_nodes(store: PrefixStore, prompt: bytes) -> float:
    """Nodes on the path of a cached prompt (what match walks, touches and pins)."""
    tree = store._ns[NS].trees[store.shard_of(NS, prompt)]  # a benchmark may look inside
    node, _, child, _ = tree.walk(prompt, len(prompt) // store.page_bytes)
    count = 1 if child is not None else 0
    while node.parent is not None:
        count += 1
        node = node.parent
    return count


def best(values: list[float]) -> float:
    return max(values)


def measure(size: int, args: argparse.Namespace) -> dict:
    batch = max(10, min(500, size // 100))  # inserts timed between untimed clean-ups: ~1% of the tree, 10 at least
    store, trace, build_s = build(size, args, headroom=batch * args.new_pages + 1000)
    gc.collect()
    if args.no_gc:
        gc.disable()
    row: dict = {"size": size, "pages": store.stats()["pages"], "nodes": store.stats(NS)["nodes"],
                 "build_s": build_s}
    rng = random.Random(args.seed)
    distinct = rng.sample(trace.pool, min(args.queries, len(trace.pool)))
    queries = [rng.choice(distinct) for _ in range(2000)]
    full = len(queries[0]) // TOKEN_BYTES
    for q in queries[:20]:
        assert store.match(NS, q, lease=False).matched_tokens == full, "a remembered prompt is not cached"
    row["path_nodes"] = sum(path_nodes(store, q) for q in queries) / len(queries)

    def match(prompt):
        store.match(NS, prompt, lease=False)

    def match_lease(prompt):
        store.release(store.match(NS, prompt, lease=True, owner=1).lease_id, 1)

    row["match_ops"] = best([timed_loop(match, queries, args.min_time) for _ in range(args.repeat)])
    row["match_lease_ops"] = best([timed_loop(match_lease, queries, args.min_time) for _ in range(args.repeat)])

    # insert: batches of timed inserts, each followed by an untimed evict_prefix of what it added.
    def insert_run() -> float:
        elapsed = 0.0
        done = 0
        while elapsed < args.min_time:
            prompts = [trace.branch(args.new_pages) for _ in range(batch)]
            start = time.process_time()
            for prompt, _ in prompts:
                store.insert(NS, prompt)
            elapsed += time.process_time() - start
            done += batch
            P = trace.page_bytes
            for prompt, keep in prompts:
                store.evict_prefix(NS, prompt[: (keep + 1) * P])
        return done / elapsed

    row["insert_ops"] = best([insert_run() for _ in range(args.repeat)])
    row["insert_pages_per_s"] = row["insert_ops"] * args.new_pages
    if abs(store.stats()["pages"] - row["pages"]) > args.prompt_pages:
        raise RuntimeError(f"insert clean-up left {store.stats()['pages']} pages, expected {row['pages']}")

    # evict: rounds of single-page evictions, each timed, then an untimed refill with fresh prompts.
    chunk = max(10, min(200, size // 20))
    clock = time.process_time_ns

    def evict_run() -> list[int]:
        costs: list[int] = []
        total = 0.0
        while total < args.min_time:
            for _ in range(chunk):
                start = clock()
                store.evict_pages(NS, 1)
                costs.append(clock() - start)
            total = sum(costs) / 1e9
            refill = 0
            while refill < chunk:
                prompt, _ = trace.next_prompt()
                refill += store.insert(NS, prompt).stored
                trace.remember(prompt)
        return costs

    runs = [evict_run() for _ in range(args.repeat)]
    costs = min(runs, key=lambda c: sum(c) / len(c))  # the least disturbed run
    arr = np.array(costs, dtype=np.float64) / 1000.0  # microseconds
    row["evict_ops"] = len(arr) / (arr.sum() / 1e6)
    row["evict_us_mean"] = float(arr.mean())
    row["evict_us_p50"] = float(np.percentile(arr, 50))
    row["evict_us_p99"] = float(np.percentile(arr, 99))
    row["evict_us_max"] = float(arr.max())
    row["evictions_timed"] = len(arr)
    row["pages_after"] = store.stats()["pages"]
    gc.enable()
    store.arena.close()
    return row


def plot(results: list[dict], path: Path, title: str) -> Path | None:
    figure = new_plot()
    if figure is None:
        return None
    fig, ax = figure
    sizes = [r["pages"] for r in results]
    for key, label, marker in (("match_ops", "match (NOLEASE)", "o"), ("match_lease_ops", "match + lease + release", "s"),
                               ("insert_ops", "insert", "^"), ("evict_ops", "evict 1 page", "D")):
        ax.plot(sizes, [r[key] for r in results], marker=marker, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cached pages in the tree")
    ax.set_ylabel("operations/s (one core, in process)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return save_plot(fig, path)


def main() -> int:
    parser = tool_parser("bench-store", __doc__)
    parser.add_argument("--sizes", default="1000,10000,100000,1000000",
                        help="comma-separated tree sizes in pages (default 1000,10000,100000,1000000)")
    parser.add_argument("--page-size", type=int, default=16, help="tokens per page (default 16)")
    parser.add_argument("--block-bytes", type=int, default=16, help="bytes per block (default 16)")
    parser.add_argument("--prompt-pages", type=int, default=32, help="pages per prompt (default 32 = 512 tokens)")
    parser.add_argument("--new-pages", type=int, default=8, help="new pages per timed insert (default 8)")
    parser.add_argument("--shards", type=int, default=16, help="shards (default 16, as the daemon)")
    parser.add_argument("--policy", default="hybrid", help="eviction policy: hybrid, lru or lfu (default hybrid)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure, the best is kept (default 3)")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds per run at least (default 0.3)")
    parser.add_argument("--queries", type=int, default=2000,
                        help="distinct cached prompts the match loops draw from (default 2000; a small tree has "
                             "fewer, and a small number keeps them in the CPU caches)")
    parser.add_argument("--seed", type=int, default=1, help="trace seed (default 1)")
    parser.add_argument("--no-gc", action="store_true",
                        help="disable Python's cyclic garbage collector while timing (shows what it costs)")
    parser.add_argument("--no-sglang", action="store_true", help="skip the comparison with SGLang's RadixCache")
    parser.add_argument("--sglang-pages", default="16,1", help="page sizes of the SGLang comparison (default 16,1)")
    parser.add_argument("--sglang-tokens", type=int, default=2**16,
                        help="tokens in the trees of the SGLang comparison (default 65536)")
    parser.add_argument("--sglang-prompt-tokens", type=int, default=512,
                        help="tokens per prompt in the SGLang comparison (default 512)")
    parser.add_argument("--long-trace", default=str(LONG_TRACE),
                        help="the long-prompt workload's trace (default ../shared/traces/conversation_trace.jsonl)")
    parser.add_argument("--long-requests", type=int, default=3000,
                        help="requests of --long-trace to replay (default 3000)")
    parser.add_argument("--long-pages", default="16,1", help="page sizes of the long-prompt workloads (default 16,1)")
    parser.add_argument("--long-memory-pages", type=int, default=10**6,
                        help="cached pages at which bytes per page are measured (default 10^6; 0: skip)")
    parser.add_argument("--no-long", action="store_true", help="skip the long-prompt workloads")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-plot", action="store_true", help="do not write scripts/out/bench-store.png")
    args = parser.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",") if s.strip()]
    if args.new_pages >= args.prompt_pages:
        parser.error("--new-pages must be smaller than --prompt-pages")

    results = []
    steps = progress_bar(len(sizes), "tree sizes", "size")
    for size in sizes:
        steps.set_postfix_str(f"{size:,} pages")
        results.append(measure(size, args))
        steps.update(1)
        if steps.disable:
            print(f"  {size:,} pages done", file=sys.stderr, flush=True)
    steps.close()
    versus, versus_source = ([], None) if args.no_sglang else versus_sglang(args)
    long_rows, long_memory = ([], []) if args.no_sglang or args.no_long or not versus else long_prompts(args)

    ref = results[0]
    for row in results:
        row["ratios"] = {k: row[k] / ref[k] for k in ("match_ops", "match_lease_ops", "insert_ops", "evict_ops")}
        row["evict_cost_ratio"] = row["evict_us_mean"] / ref["evict_us_mean"]
    last = results[-1]
    verdict = {"small": ref["pages"], "large": last["pages"], "ratio": last["evict_cost_ratio"], "goal": 2.0,
               "met": last["evict_cost_ratio"] <= 2.0}
    command = command_line("bench-store")
    figures_from = machine()
    plot_path = None if args.no_plot else plot(
        results, OUT / ("bench-store-nogc.png" if args.no_gc else "bench-store.png"),
        f"{command}\npage {args.page_size} tokens, prompts {args.prompt_pages} pages, {args.shards} shards, "
        f"{args.policy}")
    if args.json:
        print(json.dumps({"command": command, "machine": figures_from, "settings": vars(args), "results": results,
                          "evict_target": verdict, "vs_sglang": versus, "vs_sglang_note": versus_source,
                          "long_prompts": long_rows, "long_prompts_memory": long_memory,
                          "plot": str(plot_path) if plot_path else None}, indent=2))
        return 0
    print(f"$ {command}")
    print(f"PrefixStore in process, {figures_from['cpus']} CPUs, Python {figures_from['python']}; page {args.page_size} tokens, "
          f"prompts of {args.prompt_pages} pages, inserts add {args.new_pages} pages, {args.shards} shards, "
          f"policy {args.policy}; best of {args.repeat}; cyclic GC {'off' if args.no_gc else 'on'} while timing")
    header = (f"{'pages':>10}{'nodes':>9}{'path':>6}{'build s':>9}{'match/s':>10}{'+lease/s':>10}{'insert/s':>10}"
              f"{'evict/s':>10}{'evict us':>10}{'p99 us':>8}{'max us':>8}")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['pages']:>10,}{r['nodes']:>9,}{r['path_nodes']:>6.1f}{r['build_s']:>9.1f}{r['match_ops']:>10,.0f}"
              f"{r['match_lease_ops']:>10,.0f}{r['insert_ops']:>10,.0f}{r['evict_ops']:>10,.0f}"
              f"{r['evict_us_mean']:>10.2f}{r['evict_us_p99']:>8.1f}{r['evict_us_max']:>8.0f}")
    print(f"\nratio to the {ref['pages']:,}-page tree (speed; >1 is faster):")
    print(f"{'pages':>10}{'match':>10}{'+lease':>10}{'insert':>10}{'evict':>10}")
    for r in results:
        q = r["ratios"]
        print(f"{r['pages']:>10,}{q['match_ops']:>10.2f}{q['match_lease_ops']:>10.2f}{q['insert_ops']:>10.2f}"
              f"{q['evict_ops']:>10.2f}")
    state = "met" if verdict["met"] else "MISSED"
    print(f"\ntarget: evicting one page at {last['pages']:,} pages costs within 2x of {ref['pages']:,} pages: "
          f"{last['evict_us_mean']:.2f} us vs {ref['evict_us_mean']:.2f} us = {verdict['ratio']:.2f}x ({state})")
    if versus:
        print()
        print("\n".join(store_vs_sglang.report(versus, versus_source)))
        for r in versus:
            goals = SGLANG_GOALS.get(r["page_size"])
            if goals:
                shown_goals = ", ".join(
                    f"{op} {r[op + '_ratio']:.2f}x (goal >= {goal}x: {'met' if r[op + '_ratio'] >= goal else 'MISSED'})"
                    for op, goal in zip(("match", "insert", "evict"), goals))
                print(f"target, page {r['page_size']}: {shown_goals}")
    if long_rows:
        print()
        print("\n".join(store_vs_sglang.report_long(long_rows, long_memory)))
        for r in long_rows:
            goals = LONG_GOALS.get(r["page_size"])
            if goals:
                shown_goals = ", ".join(
                    f"{op} {r[op + '_ratio']:.2f}x (goal >= {goal}x: {'met' if r[op + '_ratio'] >= goal else 'MISSED'})"
                    for op, goal in zip(("match", "insert", "evict"), goals))
                print(f"target, {r['workload']} page {r['page_size']}: {shown_goals}")
    if not versus and versus_source:
        print(f"\nSGLang comparison skipped: {versus_source}")
    if plot_path:
        print(f"plot: {shown(plot_path)}")
    return 0


#: Issue 14's goals for the store core vs SGLang's RadixCache (speed ratios: match, insert, evict 10 %).
SGLANG_GOALS = {16: (5, 2, 2), 1: (1, 1, 1)}


#: Issue 45's goals on long prompts (speed ratios vs SGLang: match, insert, evict 10 %).
LONG_GOALS = {16: (2, 2, 2), 1: (1, 1, 1)}
LONG_TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "conversation_trace.jsonl"


def long_prompts(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """The long-prompt workloads against SGLang (store_vs_sglang.compare_long) and bytes per cached page:
    the conversation trace (when present) and the synthetic agent sessions, at each of --long-pages."""
    sglang = sglang_peer.load()
    workloads = []
    trace = Path(args.long_trace)
    if trace.exists():
        workloads.append(("conversation", store_vs_sglang.trace_prompts(trace, args.long_requests)))
    else:
        print(f"  {trace} not found: the conversation workload is skipped", file=sys.stderr)
    workloads.append(("agents", store_vs_sglang.agent_prompts(args.seed)))
    pages = [int(p) for p in args.long_pages.split(",") if p.strip()]
    rows, memory = [], []
    bar = progress_bar(len(pages) * len(workloads), "long prompts vs SGLang", "run")
    for page in pages:
        for name, prompts in workloads:
            rows.append(store_vs_sglang.compare_long(sglang, prompts, page_size=page, repeat=args.repeat, name=name))
            bar.update(1)
    bar.close()
    if args.long_memory_pages and trace.exists():
        for page in pages:
            memory.append(store_vs_sglang.bytes_per_page(trace, args.long_requests, page_size=page,
                                                         pages=args.long_memory_pages))
    return rows, memory


def versus_sglang(args: argparse.Namespace) -> tuple[list[dict], str | None]:
    """The SGLang comparison rows and where SGLang was loaded from; or no rows and why it could not run."""
    try:
        sglang = sglang_peer.load()
    except sglang_peer.PeerUnavailable as exc:
        return [], str(exc)
    rows = []
    pages = [int(p) for p in args.sglang_pages.split(",") if p.strip()]
    bar = progress_bar(len(pages), "vs SGLang RadixCache", "page size")
    for page in pages:
        rows.append(store_vs_sglang.compare(
            sglang, page_size=page, tokens=args.sglang_tokens, prompt_tokens=args.sglang_prompt_tokens,
            new_pages=max(1, 128 // page), repeat=args.repeat, min_time=min(args.min_time, 0.2), seed=args.seed))
        bar.update(1)
    bar.close()
    return rows, shown(sglang.source).as_posix()


if __name__ == "__main__":
    sys.exit(main())
