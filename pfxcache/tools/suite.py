"""The eviction suite: every workload at four capacities, each policy against LRU and Belady's bound.

Workloads: pfxcache.tools.workloads.SUITE (the shared trace, replay's
``sessions`` and six generated shapes). Capacities: fixed shares of each
workload's footprint (its distinct pages), by default 0.5 %, 2 %, 6 % and 20 %, so
every workload is judged where its cache is small, tight and roomy. Replays
run in process on the store (replay's store mode: the same code the daemon
runs, and the same figures to the token for every policy but hybrid).

The suite is cut in two halves: ``tuning`` (designs and constants were
chosen on it) and ``held-out`` (reported on, never tuned on). For each half
it prints per workload and capacity Belady/LRU and every policy/LRU, and a
summary per policy: the geometric mean of its ratios to LRU, the worst ratio
and where, and the worst ratio at the points where Belady is at least 2x
LRU (where there is room to win).

    scripts/suite                                    # both halves, lru,lfu,hybrid,tempo,guard
    scripts/suite --half held-out --policies lru,guard
    scripts/suite --workloads chat,scans --fractions 0.01,0.05 --json
    scripts/suite --trace their.jsonl --trace kv-cache-tester/traces   # traces of yours, in any replay format
    scripts/suite --in-flight 16 --policies lru,tempo,guard  # 16 requests computing at once, their leases held

A trace given with ``--trace`` (any format scripts/replay reads, its block
size as its own) is judged the same way, in a third group, "external": traces
no design here saw. The eviction research extends the suite with its own sets
(``main(sets=...)``: ``--half`` names of ``WorkloadSet`` lists), run from scripts/research.

The plot (ratio to LRU against capacity, one panel per workload) goes to
scripts/out/suite.png. ``scripts/suite`` runs this module under .venv.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import replay, workloads
from .common import (OUT, add_guard_sample_pages, command_line, guard_sample_pages,
                     progress_bar, save_plot, shown, tool_parser)

FRACTIONS = (0.005, 0.02, 0.06, 0.2)
DEFAULT_POLICIES = "lru,lfu,hybrid,tempo,guard"
ROOM = 2.0  # Belady / LRU at or above this: a point where a policy has room to win


@dataclass(frozen=True)
class WorkloadSet:
    """Workloads judged together: one table and one summary under ``title``, ``label`` in the plot.

    ``names`` are looked up in ``generators`` (a seed -> a replay.Trace) when the suite runs.
    """

    title: str
    names: tuple[str, ...]
    generators: Mapping[str, Callable[..., replay.Trace]]
    label: str


def halves() -> dict[str, list[WorkloadSet]]:
    """``--half`` -> the sets it runs: the suite's tuning and held-out halves, or both."""
    tuning = WorkloadSet("tuning", workloads.TUNING, workloads.SUITE, "tuning")
    held_out = WorkloadSet("held-out", workloads.HELD_OUT, workloads.SUITE, "held out")
    return {"tuning": [tuning], "held-out": [held_out], "all": [tuning, held_out]}


def capacities(chains: list[list[int]], fractions) -> list[int]:
    """Pages for each share of the workload's distinct pages (at least 16)."""
    distinct = len({p for chain in chains for p in chain})
    return [max(16, round(distinct * f)) for f in fractions]


def run_workload(name: str, policies: list[str], fractions, seed: int = 1, quiet: bool = True,
                 trace: replay.Trace | None = None, in_flight: int = 0,
                 make: Callable[..., replay.Trace] | None = None) -> dict:
    """{"capacities": [...], "requests", "distinct_pages", "results": {policy or "belady": {cap: hit_rate}}}.

    ``trace``: replay this one (a file given with --trace) instead of workload ``name``, which ``make``
    generates (default: the suite's generator of that name).
    ``in_flight``: requests computing at once (replay.replay_requests); Belady then bounds the same
    requests, cut as they are, with none in flight.
    """
    if trace is None:
        trace = (make or workloads.generator(name))(seed)
    page_size = trace.page_tokens or trace.block_tokens
    chains = replay.page_chains(trace, page_size)
    caps = capacities(chains, fractions)
    results: dict[str, dict[int, float]] = {}
    for cap in caps:
        for policy in policies:
            row = replay.replay_store(trace, policy, cap, page_size, quiet=quiet, in_flight=in_flight)
            results.setdefault(policy, {})[cap] = row["hit_rate"]
        cut = replay.in_flight_pages(cap, in_flight)
        bound = chains if cut == cap else [chain[:cut] for chain in chains]
        results.setdefault("belady", {})[cap] = replay.belady(trace, bound, cap, page_size, quiet)["hit_rate"]
    return {"workload": name, "trace": trace.name, "requests": len(trace.requests), "page_size": page_size,
            "distinct_pages": len({p for c in chains for p in c}), "capacities": caps, "results": results}


def _ratio(results: dict, policy: str, cap: int) -> float:
    base = results["lru"][cap]
    return results[policy][cap] / base if base else 1.0


def summary(runs: list[dict], policies: list[str]) -> dict:
    """Per policy: geometric mean, worst ratio to LRU (and where), the worst where Belady >= ROOM x LRU."""
    out = {}
    for policy in policies:
        ratios, roomy = [], []
        for run in runs:
            for cap in run["capacities"]:
                r = _ratio(run["results"], policy, cap)
                where = f"{run['workload']}@{cap}"
                ratios.append((r, where))
                if _ratio(run["results"], "belady", cap) >= ROOM:
                    roomy.append((r, where))
        worst = min(ratios)
        out[policy] = {
            "geomean": math.exp(sum(math.log(max(r, 1e-9)) for r, _ in ratios) / len(ratios)),
            "worst": worst[0], "worst_at": worst[1], "below_0.99": sum(r < 0.99 for r, _ in ratios),
            "points": len(ratios), "roomy_points": len(roomy),
            "roomy_worst": min(roomy)[0] if roomy else None, "roomy_worst_at": min(roomy)[1] if roomy else None,
            "roomy_geomean": math.exp(sum(math.log(max(r, 1e-9)) for r, _ in roomy) / len(roomy)) if roomy else None,
        }
    return out


def print_half(title: str, runs: list[dict], policies: list[str]) -> None:
    others = [p for p in policies if p != "lru"]
    w = max(11, *(len(run["workload"]) + 1 for run in runs))
    head = f"{'workload':<{w}}{'pages':>8}{'share':>7}{'lru':>7}{'belady':>8}" + "".join(f"{p:>8}" for p in others)
    print(f"\n== {title}: hit rate of lru, then ratio to lru (>1 is better); belady = the offline bound")
    print(head)
    print("-" * len(head))
    for run in runs:
        res = run["results"]
        for cap, frac in zip(run["capacities"], run["fractions"]):
            print(f"{run['workload']:<{w}}{cap:>8,}{frac:>7.1%}{res['lru'][cap]:>7.3f}"
                  f"{_ratio(res, 'belady', cap):>8.2f}" + "".join(f"{_ratio(res, p, cap):>8.2f}" for p in others))
    print(f"\n{title}: summary of ratios to lru over {sum(len(r['capacities']) for r in runs)} points")
    print(f"{'policy':<8}{'geomean':>9}{'worst':>7}  {'worst at':<20}{'<0.99':>6}"
          f"{'  where belady >= 2x lru: geomean, worst':>44}")
    for policy, s in summary(runs, policies).items():
        roomy = (f"{s['roomy_geomean']:>8.2f}{s['roomy_worst']:>7.2f} at {s['roomy_worst_at']} "
                 f"({s['roomy_points']} points)") if s["roomy_points"] else "  (no such point)"
        print(f"{policy:<8}{s['geomean']:>9.3f}{s['worst']:>7.2f}  {s['worst_at']:<20}{s['below_0.99']:>6}  {roomy}")


def plot(runs: list[dict], policies: list[str], path, title: str, labels: Mapping[str, str]) -> object:
    """``labels``: workload -> the group its panel names (absent: "external")."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("matplotlib is missing (the tools extra: scripts/setup): no plot", file=sys.stderr)
        return None
    cols = 4
    rows = -(-len(runs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows + 0.4), squeeze=False)
    fig.suptitle(title, fontsize=9)
    for ax, run in zip(axes.flat, runs):
        caps = run["capacities"]
        for name in [*policies, "belady"]:
            ys = [_ratio(run["results"], name, c) for c in caps]
            style = {"color": "black", "linestyle": "--"} if name == "belady" else {"marker": "o"}
            ax.plot(caps, ys, label=name, **style)
        ax.axhline(0.99, color="red", linewidth=0.6)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(f"{run['workload']} ({labels.get(run['workload'], 'external')})", fontsize=9)
        ax.set_xlabel("capacity (pages)", fontsize=8)
        ax.set_ylabel("hit rate / lru's", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(runs):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    return save_plot(fig, path)


def main(argv: list[str] | None = None, *, sets: dict[str, list[WorkloadSet]] | None = None,
         default_policies: str = DEFAULT_POLICIES, command_name: str = "suite",
         doc: str | None = __doc__) -> int:
    """scripts/suite. ``sets``: ``--half`` -> its WorkloadSets (default halves(), whose "all" is the default
    half); ``command_name``: the command as printed (scripts/COMMAND_NAME)."""
    from pfxcache.daemon.store.registry import POLICIES

    sets = halves() if sets is None else sets
    every = list({id(s): s for group in sets.values() for s in group}.values())  # in order, once each
    generators = {w: s.generators[w] for s in every for w in s.names}
    parser = tool_parser(command_name, doc)
    parser.add_argument("--half", choices=tuple(sets), default="all",
                        help=f"which workloads (default all: tuning and held-out; known: {', '.join(sets)})")
    parser.add_argument("--workloads", help=f"comma-separated, overrides --half (known: {', '.join(generators)})")
    parser.add_argument("--policies", default=default_policies, help=f"comma-separated (default {default_policies})")
    parser.add_argument("--fractions", default=",".join(map(str, FRACTIONS)),
                        help="capacities as shares of each workload's distinct pages (default 0.005,0.02,0.06,0.2)")
    parser.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--no-plot", action="store_true", help="do not write scripts/out/suite.png")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--in-flight", type=int, default=0, metavar="K",
                        help="K requests computing at once: a request stores and releases its lease only after "
                             "the next K have looked up, and is cut to capacity / (K + 1) pages (default 0)")
    add_guard_sample_pages(parser)
    parser.add_argument("--trace", action="append", default=[], metavar="PATH",
                        help="also a trace file or directory of yours (any scripts/replay format; repeatable): "
                             "only these when no --workloads/--half is given")
    args = parser.parse_args(argv)

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if "lru" not in policies:
        policies.insert(0, "lru")
    for p in policies:
        if p not in POLICIES:
            parser.error(f"unknown policy {p!r} (known: {', '.join(POLICIES)})")
    fractions = [float(f) for f in args.fractions.split(",") if f.strip()]
    if args.in_flight < 0:
        parser.error("--in-flight must be 0 or more")
    if args.workloads:
        names = [w.strip() for w in args.workloads.split(",") if w.strip()]
        for w in names:
            if w not in generators:
                parser.error(f"unknown workload {w!r}")
    elif args.trace and "--half" not in (argv if argv is not None else sys.argv[1:]):
        names = []
    else:
        names = [w for s in sets[args.half] for w in s.names]
    external = {}
    for path in map(Path, args.trace):
        if not path.exists():
            parser.error(f"no trace at {path}")
        try:
            name = path.stem
            if name in external or name in names:  # two traces of one name (two directories "native"): both
                name = f"{path.parent.name}/{path.stem}"
            while name in external:
                name += "'"
            external[name] = replay.read_trace([path], "auto", False)
        except replay.TraceFormatError as exc:
            parser.error(str(exc))
    bar = progress_bar(len(names) + len(external), "workloads", "workload", quiet=args.quiet)
    started = time.perf_counter()
    runs = []
    with guard_sample_pages(args.guard_sample_pages) as sample_pages:
        for workload in [*names, *external]:
            bar.set_postfix_str(workload)
            run = run_workload(workload, policies, fractions, args.seed, trace=external.get(workload),
                               in_flight=args.in_flight, make=generators.get(workload))
            run["fractions"] = fractions
            runs.append(run)
            bar.update(1)
    bar.close()
    command = command_line(command_name, argv)
    groups = [(s.title, [r for r in runs if r["workload"] in s.names]) for s in every]
    groups += [("external" if external else "other", [r for r in runs if r["workload"] not in generators])]
    groups = [(t, rs) for t, rs in groups if rs]
    labels = {w: s.label for s in every for w in s.names}
    plot_path = None if args.no_plot else plot(runs, policies, OUT / "suite.png", command, labels)
    if args.json:
        for run in runs:
            run["results"] = {p: {str(c): v for c, v in r.items()} for p, r in run["results"].items()}
        print(json.dumps({"command": command, "policies": policies, "fractions": fractions,
                          "in_flight": args.in_flight, "guard_sample_pages": sample_pages, "runs": runs,
                          "summary": {t: summary(_intkeys(rs), policies) for t, rs in groups},
                          "seconds": round(time.perf_counter() - started, 1)}, indent=2))
        return 0
    print(f"$ {command}\n{len(runs)} workloads, seed {args.seed}, capacities at "
          f"{', '.join(f'{f:.1%}' for f in fractions)} of each workload's distinct pages; "
          + (f"{args.in_flight} requests in flight; " if args.in_flight else "")
          + (f"guard's miniatures of {sample_pages} pages; " if args.guard_sample_pages is not None else "") +
          f"{time.perf_counter() - started:.0f} s")
    for title, rs in groups:
        print_half(title, rs, policies)
    if plot_path:
        print(f"\nplot: {shown(plot_path)}")
    return 0


def _intkeys(runs: list[dict]) -> list[dict]:
    """Runs whose result keys were turned into strings for JSON, with integer keys again."""
    return [{**r, "results": {p: {int(c): v for c, v in res.items()} for p, res in r["results"].items()}}
            for r in runs]


if __name__ == "__main__":
    sys.exit(main())
