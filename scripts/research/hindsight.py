"""What Belady keeps that LRU loses, and what knowing it would be worth: a hindsight study of one workload.

Page-granular caches of ``--fraction`` x the workload's distinct pages, each
request handled as replay does (look up the longest cached prefix, store the
rest, never evict a page of the request being stored), under these rules:

* ``lru``: the least recently used page first (deepest first within a
  request: a prefix outlives its continuations, as in the store);
* ``belady``: the page used again farthest in the future (replay's bound);
* ``counted``: the page accessed most often so far stays (ties: LRU): an
  LFU that forgets no count, evicted pages' included, an online rule;
* ``frequent``: the same with each page's count over the whole workload, a
  count told in hindsight;
* ``a0`` (only for workloads whose requests are independent draws from
  fixed odds, ``adversarial.ODDS``): not a run but a bound. The next request
  is then independent of what any online policy holds, so the pages it can
  be expected to hit are at most the sum of the ``capacity`` largest odds
  of a page being in a request ("A0", Aho, Denning and Ullman, "Principles
  of Optimal Page Replacement", JACM 1971): what Belady gains past it there
  is luck seen in hindsight, no policy's to learn;
* ``told H``: LRU, except that a page not used again within H requests of
  its access goes before every page that is: an LRU told, in hindsight,
  only *whether* each page comes back soon, not when;
* ``shares W``: LRU with each page's key (the request that last accessed
  it) moved W requests later per unit of the share of requests of that
  request's class (pages added, turn) whose last page comes back within the
  largest H, counted over the whole workload: what a policy that learned
  those shares perfectly could get from them;
* ``pages W``: the same per page, with finer classes learned as perfectly:
  the share of accesses of the page's class (its accesses so far, its depth,
  the requests since its previous access, the pages its request added) whose
  page comes back within the *smallest* H;
* ``online W``: the same shares as a policy could learn them, as it goes:
  an access counts once its page came back or H requests passed;
* ``s3-fifo``, ``sieve``, ``sieve-prefix``: two FIFO-based policies of
  the literature and a prefix-aware variant of one (``fifo_family``), run
  the same way.

Then the pages Belady hits and LRU misses, by the requests since the page's
previous access (its reuse gap) and by what that access was: the same path
on (``through``: a conversation's earlier turn, or a prompt's repeat), a
request that ended on the page (``ended``), a request that went on
differently (``diverged``: a shared prefix). And how well what the cache can
see predicts a return: per request, the share whose last page comes back
within H requests, by the pages it added and by its turn (how many earlier
requests it continues).

    scripts/research/run hindsight                    # the shared trace at 4 %
    scripts/research/run hindsight --workload chat --fraction 0.005 --horizons 256,1024
    scripts/research/run hindsight --trace their.jsonl --fraction 0.02   # a real trace of yours
    scripts/research/run hindsight --workload sizeskew --fraction 0.06 --share-weights ""   # with a0
"""

from __future__ import annotations

import heapq
import sys
from collections import Counter
from pathlib import Path

from pfxcache.tools import replay
from pfxcache.tools.common import progress_bar, tool_parser
from research import adversarial, fifo_family, workloads

NEVER = 1 << 62


def next_uses(chains: list[list[int]]) -> list[list[int]]:
    """nxt[i][d]: the next request after i holding chains[i][d] (NEVER if none)."""
    seen: dict[int, int] = {}
    nxt: list[list[int]] = [[] for _ in chains]
    for i in range(len(chains) - 1, -1, -1):
        chain = chains[i]
        nxt[i] = [seen.get(p, NEVER) for p in chain]
        for p in chain:
            seen[p] = i
    return nxt


def simulate(chains: list[list[int]], nxt: list[list[int]], capacity: int, rank) -> list[int]:
    """Pages hit per request under the rule ``rank(i, d, next use)``: the smallest key is evicted first.

    Keys are fixed at each access (every rule here ranks by what was known then). Only leaves go, as
    in the store: a page with a cached page below it waits until that one is evicted (rules whose keys
    are not ordered along paths, as ``shares``, would otherwise strand pages nothing can reach).
    """
    cached: dict[int, tuple] = {}  # page -> the key of its valid heap entry
    parent: dict[int, int] = {}  # page -> the page before it (-1 at the root)
    below: dict[int, int] = {}  # cached page -> its cached pages one deeper
    blocked: dict[int, tuple] = {}  # popped while it had pages below: back in the heap when they are gone
    heap: list[tuple] = []
    hits = []

    def cache(page: int, key: tuple, up: int) -> None:
        if page not in cached:
            parent[page] = up
            if up >= 0:
                below[up] = below.get(up, 0) + 1
        cached[page] = key
        blocked.pop(page, None)
        heapq.heappush(heap, key)

    for i, chain in enumerate(chains):
        chain = chain[:capacity]
        k = 0
        while k < len(chain) and chain[k] in cached:
            k += 1
        hits.append(k)
        pinned = set(chain)
        for d in range(k):
            cache(chain[d], (*rank(i, d, nxt[i][d]), chain[d]), chain[d - 1] if d else -1)
        new = sum(1 for p in chain[k:] if p not in cached)
        need = len(cached) + new - capacity
        aside = []
        while need > 0 and heap:
            key = heapq.heappop(heap)
            page = key[-1]
            if cached.get(page) != key:
                continue  # stale
            if page in pinned:
                aside.append(key)
                continue
            if below.get(page):
                blocked[page] = key
                continue
            del cached[page]
            below.pop(page, None)
            up = parent.pop(page)
            if up >= 0:
                below[up] -= 1
                if not below[up] and up in blocked:
                    heapq.heappush(heap, blocked.pop(up))
            need -= 1
        for key in aside:
            heapq.heappush(heap, key)
        for d in range(k, len(chain)):
            cache(chain[d], (*rank(i, d, nxt[i][d]), chain[d]), chain[d - 1] if d else -1)
        if len(heap) > 4 * len(cached) + 1024:
            heap = [key for page, key in cached.items() if page not in blocked]
            heapq.heapify(heap)
    return hits


def _octave(n: int) -> str:
    return "never" if n < 0 else f"{1 << (n.bit_length() - 1)}-" if n else "0"


def previous_accesses(chains: list[list[int]]) -> list[list[tuple[int, str]]]:
    """Per request and page: (requests since the page's previous access or -1, what that access was)."""
    last: dict[int, int] = {}
    out = []
    for i, chain in enumerate(chains):
        row = []
        for d, p in enumerate(chain):
            j = last.get(p)
            if j is None:
                row.append((-1, "first"))
            else:
                before = chains[j]
                if d + 1 >= len(before):
                    kind = "ended"
                elif d + 1 < len(chain) and before[d + 1] == chain[d + 1]:
                    kind = "through"
                else:
                    kind = "diverged"
                row.append((i - j, kind))
            last[p] = i
        out.append(row)
    return out


def classes(chains: list[list[int]]) -> list[tuple[str, str]]:
    """Per request: (octave of the pages it added, its turn: how many earlier requests it continues, capped)."""
    seen: set[int] = set()
    ends: dict[int, int] = {}  # a request's last page -> its turn
    out = []
    for chain in chains:
        added = sum(1 for p in chain if p not in seen)
        seen.update(chain)
        turn = next((ends[p] + 1 for p in reversed(chain[:-1]) if p in ends), 0) if chain else 0
        if chain:
            ends[chain[-1]] = turn
        out.append((_octave(added), str(min(turn, 6)) + ("+" if turn >= 6 else "")))
    return out


def page_classes(chains: list[list[int]]) -> list[list[tuple[int, int, int, int]]]:
    """Per request and page, what the cache can see of that page when it is accessed: the octaves of its
    accesses so far (up to 6), of its depth (halved), of the requests since its previous access (up to
    12; 0 for a first access) and of the pages the request added (up to 8)."""
    count: Counter = Counter()
    last: dict[int, int] = {}
    seen: set[int] = set()
    out = []
    for i, chain in enumerate(chains):
        added = sum(1 for p in chain if p not in seen)
        seen.update(chain)
        row = []
        for d, p in enumerate(chain):
            gap = i - last[p] if p in last else 0
            row.append((min(count[p].bit_length(), 6), d.bit_length() // 2, min(gap.bit_length(), 12),
                        min(added.bit_length(), 8)))
            count[p] += 1
            last[p] = i
        out.append(row)
    return out


def online_page_shares(chains: list[list[int]], nxt: list[list[int]], cls: list[list[tuple]],
                       horizon: int) -> list[list[float]]:
    """Per request and page, its class's share of returns within ``horizon`` as learned up to that request:
    an access counts once its page came back, or once ``horizon`` requests passed without it (a policy
    sees that much; here with no bound on what it remembers). Each class's share is smoothed towards the
    pooled share of all classes, with the weight of two accesses (a class seen a few times is mostly the
    pool)."""
    came: Counter = Counter()
    total: Counter = Counter()
    pending: list[tuple[int, tuple, bool]] = []  # (request at which the access is settled, class, came back)
    all_came = all_total = 0
    out = []
    for i, chain in enumerate(chains):
        while pending and pending[0][0] <= i:
            _, c, back = heapq.heappop(pending)
            total[c] += 1
            came[c] += back
            all_total += 1
            all_came += back
        pooled = all_came / all_total if all_total else 0.0
        row = []
        for d in range(len(chain)):
            c = cls[i][d]
            row.append((came[c] + 2 * pooled) / (total[c] + 2))
            back = nxt[i][d] - i <= horizon
            heapq.heappush(pending, (nxt[i][d] if back else i + horizon, c, back))
        out.append(row)
    return out


def returns(chains: list[list[int]], nxt: list[list[int]], horizon: int) -> dict[str, Counter]:
    """Per request: does its last page come back within ``horizon`` requests, by pages added and by turn."""
    by: dict[str, Counter] = {"pages added": Counter(), "turn": Counter()}
    for i, (added, turn) in enumerate(classes(chains)):
        if chains[i]:
            back = nxt[i][-1] - i <= horizon
            by["pages added"][(added, back)] += 1
            by["turn"][(turn, back)] += 1
    return by


def study(name: str, fraction: float, horizons: list[int], seed: int = 1, weights: tuple[int, ...] = (),
          trace: replay.Trace | None = None, quiet: bool = True) -> dict:
    """``trace``: study this one (a file given with --trace) instead of the suite's workload ``name``;
    ``quiet``: no progress bar (one step a rule)."""
    odds = adversarial.ODDS.get(name) if trace is None else None  # a trace of yours has no known odds
    if trace is None:
        trace = workloads.generator(name)(seed)
    else:
        name = trace.name
    chains = replay.page_chains(trace, trace.page_tokens or trace.block_tokens)
    distinct = len({p for chain in chains for p in chain})
    capacity = max(16, round(distinct * fraction))
    nxt = next_uses(chains)
    so_far: list[list[int]] = []
    count: Counter = Counter()  # a page's accesses so far; once the loop is done, over the whole workload
    for chain in chains:
        count.update(chain)  # a prompt holds a page once
        so_far.append([count[p] for p in chain])
    ranks = {"lru": lambda i, d, nu: (i, -d), "belady": lambda i, d, nu: (-nu, -d),
             "counted": lambda i, d, nu: (so_far[i][d], i, -d),
             "frequent": lambda i, d, nu: (count[chains[i][d]], i, -d)}
    for h in horizons:
        ranks[f"told {h}"] = lambda i, d, nu, h=h: (nu - i <= h, i, -d)
    if weights:
        cls = classes(chains)
        came = Counter()
        total = Counter()
        for i, chain in enumerate(chains):
            if chain:
                total[cls[i]] += 1
                came[cls[i]] += nxt[i][-1] - i <= max(horizons)
        share = [came[c] / total[c] if total[c] else 0.0 for c in cls]
        for w in weights:
            ranks[f"shares {w}"] = lambda i, d, nu, w=w: (i + w * share[i], -d)
    if weights and horizons:
        page_cls = page_classes(chains)
        horizon = min(horizons)
        page_came, page_total = Counter(), Counter()
        for i, chain in enumerate(chains):
            for d in range(len(chain)):
                page_total[page_cls[i][d]] += 1
                page_came[page_cls[i][d]] += nxt[i][d] - i <= horizon
        page_share = {c: page_came[c] / n for c, n in page_total.items()}
        learned = online_page_shares(chains, nxt, page_cls, horizon)
        for w in weights:
            ranks[f"pages {w}"] = lambda i, d, nu, w=w: (i + w * page_share[page_cls[i][d]], -d)
            ranks[f"online {w}"] = lambda i, d, nu, w=w: (i + w * learned[i][d], -d)
    bar = progress_bar(len(ranks) + len(fifo_family.RULES), f"hindsight {name}", "rule", quiet=quiet)
    runs = {}
    for rule, rank in ranks.items():
        runs[rule] = simulate(chains, nxt, capacity, rank)
        bar.update(1)
    for rule in fifo_family.RULES:
        runs[rule] = fifo_family.simulate(chains, capacity, rule)
        bar.update(1)
    bar.close()
    prev = previous_accesses(chains)
    gaps: Counter = Counter()
    kinds: Counter = Counter()
    for i, row in enumerate(prev):
        for d in range(runs["lru"][i], runs["belady"][i]):
            gap, kind = row[d]
            gaps[_octave(gap)] += 1
            kinds[kind] += 1
    hit_pages = {k: sum(v) for k, v in runs.items()}
    if odds is not None:  # an expectation over the odds the trace was drawn from, not a run
        hit_pages["a0"] = round(len(chains) * sum(sorted(odds().values(), reverse=True)[:capacity]))
    return {"workload": name, "requests": len(chains), "distinct": distinct, "capacity": capacity,
            "hit_pages": hit_pages, "gaps": gaps, "kinds": kinds,
            "returns": returns(chains, nxt, max(horizons))}


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("research/run hindsight", __doc__)
    parser.add_argument("--workload", default="trace", choices=sorted(workloads.NAMES),
                        help="a suite, stress or adversarial workload")
    parser.add_argument("--fraction", type=float, default=0.04, help="capacity, share of distinct pages")
    parser.add_argument("--horizons", default="512,1024,2048,4096", help="requests, for the told rules")
    parser.add_argument("--trace", metavar="PATH",
                        help="a trace of yours in any format scripts/replay reads, instead of --workload")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--share-weights", default="1000,2000,4000",
                        help="requests per unit of share, for the shares rules (empty: none)")
    args = parser.parse_args(argv)
    horizons = [int(h) for h in args.horizons.split(",") if h.strip()]
    weights = tuple(int(w) for w in args.share_weights.split(",") if w.strip())
    trace = replay.read_trace([Path(args.trace)], "auto", False) if args.trace else None
    r = study(args.workload, args.fraction, horizons, args.seed, weights, trace, quiet=args.quiet)
    hits = r["hit_pages"]
    print(f"{r['workload']}: {r['requests']:,} requests, {r['distinct']:,} distinct pages, "
          f"capacity {r['capacity']:,} pages ({args.fraction:.1%})")
    print("hit pages, and ratio to lru (page-granular caches)")
    for rule, n in hits.items():
        note = "  (expected at best, by any online policy: a bound, not a run)" if rule == "a0" else ""
        print(f"  {rule:<12} {n:>9,}  {n / max(hits['lru'], 1):5.2f}x{note}")
    extra = sum(r["gaps"].values())
    print(f"pages belady hits and lru misses: {extra:,}; by the requests since their previous access")
    for gap, n in sorted(r["gaps"].items(), key=lambda kv: int(kv[0].rstrip("-")) if kv[0][0].isdigit() else -1):
        print(f"  {gap:>8} {n:>9,}  {n / max(extra, 1):5.1%}")
    print("... and by what that access was")
    for kind, n in r["kinds"].most_common():
        print(f"  {kind:>8} {n:>9,}  {n / max(extra, 1):5.1%}")
    print(f"requests whose last page comes back within {max(horizons)} requests")
    for name, counts in r["returns"].items():
        values = sorted({v for v, _ in counts}, key=lambda v: (len(v), v))
        cells = [f"{v} {counts[(v, True)] / (counts[(v, True)] + counts[(v, False)]):.2f} "
                 f"(n {counts[(v, True)] + counts[(v, False)]:,})" for v in values]
        print(f"  by {name}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
