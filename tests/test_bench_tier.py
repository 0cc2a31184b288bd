"""scripts/bench-tier: the disk tier's benchmark runs end to end at its --quick size on real daemons
and reports every part in the shape the docs and --json promise. No figure is timed or judged here:
only what must hold whatever the machine (counts, ranges, the parts and keys)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pfxcache.tools import bench_tier

ROOT = Path(__file__).resolve().parent.parent
LATENCY_KEYS = {"ram_nodata", "ram_data", "disk_warm_nodata", "disk_warm_data", "disk_cold_nodata", "disk_cold_data"}


@pytest.fixture(scope="module")
def quick() -> dict:
    """One --quick --json run (every part), its document."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench_tier.main(["--quick", "--json", "--quiet"]) == 0
    return json.loads(out.getvalue())


def positive(value) -> bool:
    return isinstance(value, float) and value > 0


def test_the_document_names_its_command_and_parts(quick):
    assert quick["command"] == "scripts/bench-tier --quick --json --quiet"
    assert quick["parts"] == list(bench_tier.PARTS)
    assert set(bench_tier.PARTS) <= set(quick) and quick["machine"]["cpus"] >= 1


def test_bandwidth_promotes_every_disk_only_prompt_whole_and_reads_the_same_pages_raw(quick):
    b = quick["bandwidth"]
    assert b["prompts_on_disk"] > 0 and b["demotions_skipped"] == 0
    assert b["pages_promoted_per_pass"] == b["prompts_on_disk"] * b["prompt_pages"] == b["reference_pages"]
    assert b["disk_pages"] * b["block_bytes"] == b["fill_bytes"]  # write-through: every stored page is on disk
    for where in ("cold", "warm"):
        row = b[where]
        assert all(positive(row[key]) for key in ("promotion_mb_s", "files_read_mb_s", "preadv_mb_s",
                                                  "promotion_over_preadv"))
    assert b["warm"]["dd_direct_mb_s"] is None
    assert positive(b["cold"]["dd_direct_mb_s"]) != isinstance(b["dd_skipped"], str)  # measured, or said why not
    assert all(len(runs) == b["rounds"] for key, runs in b["runs"].items() if not key.startswith("dd"))


def test_cpu_compares_the_same_ram_hits_with_the_tier_off_and_on(quick):
    c = quick["cpu"]
    assert c["disk_pages"] > 0 and c["pages_promoted"] == 0  # a tier with pages, none needed by the hot set
    assert [k["kind"] for k in c["kinds"]] == ["full", "tail"]
    for kind in c["kinds"]:
        assert len(kind["runs"]["off"]) == len(kind["runs"]["on"]) == c["runs_each"]
        assert kind["on_over_off"] is None or kind["on_over_off"] == kind["on_cpu_s_per_100k"] / kind["off_cpu_s_per_100k"]


def test_hit_rate_replays_each_workload_on_every_daemon(quick):
    h = quick["hitrate"]
    names = [w["workload"] for w in h["workloads"]]
    assert names[0].startswith("chat") and len(names) + len(h["skipped"]) == 2  # chat, and the trace or why not
    for w in h["workloads"]:
        runs = w["runs"]
        assert set(runs) == {"tier-back", "tier-through", "ram-11x", "ram-x"}
        assert len({r["input_tokens"] for r in runs.values()}) == 1
        for label, r in runs.items():
            assert 0 <= r["hit_tokens"] <= r["input_tokens"] and r["pages_stored"] > 0
            assert (label.startswith("tier-")) == ("disk_pages_written" in r)
        for mode in ("back", "through"):
            r = runs[f"tier-{mode}"]
            assert r["state"] == "ok" and r["faults"] == 0 and r["read_misses"] == 0 and r["demotions_skipped"] == 0
            assert r["disk_pages_per_page_stored"] == r["disk_pages_written"] / r["pages_stored"]
        assert set(w["tier_over_ram_11x"]) == {"back", "through"}
        assert w["x_pages"] >= 1 and w["distinct_pages"] >= w["x_pages"]


def test_latency_gives_each_figure_for_each_page_size(quick):
    lat = quick["latency"]
    assert [row["page_size"] for row in lat["rows"]] == [16, 64]
    for row in lat["rows"]:
        assert row["pages"] * row["page_size"] == lat["prompt_tokens"]
        assert LATENCY_KEYS <= set(row)
        for key in LATENCY_KEYS:
            assert row[key]["samples"] == 2 and 0 < row[key]["p50_ms"] <= row[key]["p99_ms"]


def test_the_text_report_prints_every_part_and_its_target(quick, capsys):
    bench_tier.report(quick)
    text = capsys.readouterr().out
    for heading in ("promotion bandwidth", "RAM-hit CPU", "token hit rate", "PFXGET NOLEASE of a 4096-token"):
        assert heading in text
    assert text.count("target ") == 3


def test_bad_arguments_are_refused_before_any_daemon_starts(capsys):
    for argv in (["--parts", "bandwidth,nope"], ["--modes", "sideways"], ["--page-sizes", "48"]):
        with pytest.raises(SystemExit) as exc:
            bench_tier.main(argv)
        assert exc.value.code == 2
    assert "unknown part 'nope'" in capsys.readouterr().err


def test_the_launcher_runs_the_module():
    launcher = (ROOT / "scripts" / "bench-tier").read_text().splitlines()
    assert launcher[-1] == 'exec "$(dirname "$0")/tool" bench_tier "$@"'
    result = subprocess.run([sys.executable, "-m", "pfxcache.tools.bench_tier", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("usage: scripts/bench-tier "), result.stderr
