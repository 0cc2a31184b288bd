"""The eviction suite's workloads (pfxcache.tools.workloads) have the shapes they claim, and the suite runs;
the research's sets (scripts/research: stress, adversarial) extend it there, never in the package."""

from __future__ import annotations

import collections
import itertools
import json

import pytest
from pfxcache.tools import replay, suite, workloads

import research_support  # noqa: F401 - scripts/ on sys.path: the research package
from research import adversarial, stress
from research import suite as research_suite


def pages_per_request(trace):
    return [len(c) for c in replay.page_chains(trace, trace.block_tokens)]


@pytest.mark.parametrize("name", ["chat", "agentic", "rag", "sysprompts", "scans", "tenants"])
def test_deterministic_and_replayable(name):
    a = workloads.SUITE[name](3, requests=400)
    b = workloads.SUITE[name](3, requests=400)
    assert [(r.namespace, r.hash_ids, r.input_tokens) for r in a.requests] == \
           [(r.namespace, r.hash_ids, r.input_tokens) for r in b.requests]
    assert len(a.requests) == 400 and a.requests[0].hash_ids != workloads.SUITE[name](4, requests=400).requests[0].hash_ids
    got = replay.replay_store(a, "guard", 200, a.block_tokens, quiet=True)
    assert 0.0 < got["hit_rate"] < 1.0


def test_agentic_contexts_grow_long_in_small_pages_and_sessions_differ():
    trace = workloads.agentic(1, requests=1500)
    assert trace.block_tokens == 64
    assert max(r.input_tokens for r in trace.requests) > 30_000  # tens of thousands of tokens
    # A turn's prompt is the previous turn's prompt plus the new pages: follow that to sessions.
    chains = replay.page_chains(trace, 64)
    ends: dict[int, int] = {}  # last page of a request -> its session
    sessions = collections.Counter()
    for i, chain in enumerate(chains):
        session = next((ends[p] for p in reversed(chain[:-1]) if p in ends), i)
        ends[chain[-1]] = session
        sessions[session] += 1
    turns = sorted(sessions.values())
    # very different session lengths (a compaction starts a new prefix, so the longest show as several)
    assert len(turns) > 10 and turns[-1] > 5 * turns[len(turns) // 2]


def test_rag_shares_documents_sysprompts_are_many_scans_are_one_off():
    rag = workloads.rag(1, requests=2000)
    chunks = collections.Counter(tuple(r.hash_ids[-4:-2]) for r in rag.requests)
    assert chunks.most_common(1)[0][1] > 1
    sp = workloads.sysprompts(1, requests=3000)
    assert len({r.hash_ids[0] for r in sp.requests}) > 500
    scans = workloads.scans(1, requests=3000)
    counts = collections.Counter(r.hash_ids[0] for r in scans.requests)
    one_off = sum(1 for r in scans.requests if counts[r.hash_ids[0]] == 1)
    assert 0.1 * len(scans.requests) < one_off < 0.9 * len(scans.requests)


def test_tenants_are_namespaces_of_different_sizes():
    trace = workloads.tenants(1, requests=2000)
    sizes = collections.Counter(r.namespace for r in trace.requests)
    assert set(sizes) == {"chat", "docs", "support", "agents"}
    assert sizes["chat"] > 2 * sizes["docs"] > 2 * sizes["agents"]
    # interleaved, not one tenant after another
    assert {r.namespace for r in trace.requests[:200]} == set(sizes)


def test_halves_split_the_suite():
    assert set(workloads.TUNING).isdisjoint(workloads.HELD_OUT)
    assert set(workloads.TUNING) | set(workloads.HELD_OUT) == set(workloads.SUITE)


def test_suite_reports_ratios_to_lru_and_belady(monkeypatch, capsys):
    monkeypatch.setitem(workloads.SUITE, "chat", lambda seed: workloads.chat(seed, requests=600))
    assert suite.main(["--workloads", "chat", "--policies", "lru,guard", "--fractions", "0.05,0.2",
                       "--no-plot", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "chat" in out and "belady" in out and "guard" in out and "geomean" in out
    run = suite.run_workload("chat", ["lru", "guard"], [0.05])
    (cap,) = run["capacities"]
    assert run["results"]["belady"][cap] >= run["results"]["lru"][cap] > 0


def test_suite_judges_a_trace_of_yours_apart(tmp_path, capsys):
    """--trace: a user's file (here the chat workload saved as Mooncake JSONL) in its own "external" group."""
    path = tmp_path / "mine.jsonl"
    replay.save_trace(workloads.chat(3, requests=400, block_tokens=512), path)
    assert suite.main(["--trace", str(path), "--policies", "lru,tempo", "--fractions", "0.05,0.2",
                       "--no-plot", "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (run,) = report["runs"]
    assert run["workload"] == "mine" and run["page_size"] == 512 and list(report["summary"]) == ["external"]
    assert report["summary"]["external"]["lru"]["geomean"] == 1.0
    with pytest.raises(SystemExit):
        suite.main(["--trace", str(tmp_path / "absent.jsonl"), "--no-plot", "--quiet"])


def test_stress_phases_share_nothing_and_come_one_after_the_other():
    first, second = workloads.rag(3, requests=300, block_tokens=128), workloads.scans(4, requests=200, block_tokens=128)
    trace = stress.phases("rag-then-scans", first, second)
    assert len(trace.requests) == 500 and trace.block_tokens == 128
    ids_first = {h for r in trace.requests[:300] for h in r.hash_ids}
    ids_second = {h for r in trace.requests[300:] for h in r.hash_ids}
    assert ids_first.isdisjoint(ids_second)
    assert max(r.timestamp for r in trace.requests[:300]) < min(r.timestamp for r in trace.requests[300:])
    # each part keeps its own sharing: the same prefixes, its ids moved past the part before
    assert ids_first == {h + 1 for r in first.requests for h in r.hash_ids}
    assert min(ids_second) == max(ids_first) + 1 + min(h for r in second.requests for h in r.hash_ids)
    assert len({r.serial for r in trace.requests}) == 500
    with pytest.raises(ValueError, match="one block size"):
        stress.phases("mixed", first, workloads.scans(4, requests=50, block_tokens=256))


def test_stress_colocated_parts_interleave_without_sharing():
    parts = [workloads.chat(4, requests=300, block_tokens=128), workloads.scans(5, requests=100, block_tokens=128)]
    trace = stress.colocated("chat-and-scans", *parts)
    assert len(trace.requests) == 400
    chat_ids = {h + 1 for r in parts[0].requests for h in r.hash_ids}  # the first part's ids move up by one
    kinds = ["chat" if r.hash_ids[0] in chat_ids else "scans" for r in trace.requests]
    assert kinds.count("scans") == 100 and {*kinds[:20]} == {"chat", "scans"}  # interleaved in proportion


def test_stress_repaged_trace_is_judged_in_its_pages(monkeypatch, capsys):
    small = workloads.sysprompts(2, requests=300, block_tokens=128)
    monkeypatch.setattr(stress, "STRESS", {"sysprompts-p32": lambda seed: stress.repaged(small, 32)})
    run = suite.run_workload("sysprompts-p32", ["lru"], [0.2], make=stress.STRESS["sysprompts-p32"])
    assert run["page_size"] == 32
    distinct = {size: len({p for c in replay.page_chains(small, size) for p in c}) for size in (32, 128)}
    assert run["distinct_pages"] == distinct[32] > 3 * distinct[128]  # a 128-token block is four pages
    assert research_suite.main(["--half", "stress", "--policies", "lru,guard", "--fractions", "0.1", "--no-plot",
                                "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["summary"]) == ["stress"] and report["runs"][0]["page_size"] == 32


def test_stress_set_is_apart_from_the_suite():
    assert set(stress.STRESS).isdisjoint(workloads.SUITE)
    assert len(stress.STRESS) >= 20


def test_suite_with_requests_in_flight_bounds_them_by_belady_of_the_cut_requests(monkeypatch, capsys):
    monkeypatch.setitem(workloads.SUITE, "chat", lambda seed: workloads.chat(seed, requests=500))
    alone = suite.run_workload("chat", ["lru", "guard"], [0.05])
    busy = suite.run_workload("chat", ["lru", "guard"], [0.05], in_flight=8)
    (cap,) = busy["capacities"]
    assert busy["results"]["lru"][cap] < alone["results"]["lru"][cap]  # fewer hits: some prefixes are in flight
    for policy in ("lru", "guard"):
        assert busy["results"][policy][cap] <= busy["results"]["belady"][cap]
    assert suite.main(["--workloads", "chat", "--in-flight", "8", "--policies", "lru", "--fractions", "0.05",
                       "--no-plot", "--quiet"]) == 0
    assert "8 requests in flight" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        suite.main(["--workloads", "chat", "--in-flight", "-1", "--no-plot", "--quiet"])


def test_suite_keeps_two_traces_of_one_name_apart(tmp_path, capsys):
    """Two directories both called "native" (kv-cache-tester checkouts): both are judged, neither replaces the other."""
    for i, where in enumerate(("a", "b")):
        (tmp_path / where).mkdir()
        replay.save_trace(workloads.chat(3 + i, requests=200, block_tokens=512), tmp_path / where / "mine.jsonl")
    assert suite.main(["--trace", str(tmp_path / "a" / "mine.jsonl"), "--trace", str(tmp_path / "b" / "mine.jsonl"),
                       "--policies", "lru", "--fractions", "0.2", "--no-plot", "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [run["workload"] for run in report["runs"]] == ["mine", "b/mine"]


def test_suite_sizes_guards_sample_for_its_run_only(monkeypatch, capsys):
    """--guard-sample-pages N: the guard of every store the run makes samples N pages (its rate follows),
    and the default is back afterwards; 0 is refused."""
    from pfxcache.daemon.store import guard

    monkeypatch.setitem(workloads.SUITE, "chat", lambda seed: workloads.chat(seed, requests=300))
    rates = []
    make = guard.GuardPolicy.for_store.__func__

    def for_store(cls, capacity, page_bytes):
        made = make(cls, capacity, page_bytes)
        rates.append(made.rate)
        return made

    monkeypatch.setattr(guard.GuardPolicy, "for_store", classmethod(for_store))
    assert suite.main(["--workloads", "chat", "--guard-sample-pages", "16", "--policies", "lru,guard",
                       "--fractions", "0.2", "--no-plot", "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (cap,) = report["runs"][0]["capacities"]
    assert report["guard_sample_pages"] == 16 and rates == [pytest.approx(16 / cap)]
    assert guard.SAMPLE_PAGES == 4096
    with pytest.raises(SystemExit):
        suite.main(["--workloads", "chat", "--guard-sample-pages", "0", "--no-plot", "--quiet"])


def test_adversarial_sets_are_apart_fixed_and_each_judged_apart(capsys):
    sets = (adversarial.FIRST, adversarial.SECOND, adversarial.THIRD)
    assert all(set(a).isdisjoint(b) for a, b in itertools.combinations(sets, 2))
    assert set().union(*sets) == set(adversarial.ADVERSARIAL) and len(adversarial.ADVERSARIAL) == 20
    assert set(adversarial.ADVERSARIAL).isdisjoint({*workloads.SUITE, *stress.STRESS})
    a, b = adversarial.ADVERSARIAL["loop"](), adversarial.ADVERSARIAL["loop"](7)  # its seed is its own
    assert [r.hash_ids for r in a.requests] == [r.hash_ids for r in b.requests]
    first = a.requests[0].hash_ids  # 40 documents behind one prompt, each read again 40 requests later
    assert first == a.requests[40].hash_ids != a.requests[1].hash_ids and first[:4] == a.requests[1].hash_ids[:4]
    assert research_suite.main(["--workloads", "loop,zipf-loop-mix,hot-shift-loop", "--policies", "lru",
                                "--fractions", "0.2", "--no-plot", "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["summary"]) == ["adversarial, first set", "adversarial, second set", "adversarial, third set"]


def test_the_product_suite_knows_none_of_the_research_sets(capsys):
    """scripts/suite runs the suite's halves only; the stress and adversarial sets run from scripts/research."""
    for argv in (["--half", "stress"], ["--half", "adversarial"], ["--workloads", "loop"], ["--workloads", "chat-p32"]):
        with pytest.raises(SystemExit):
            suite.main([*argv, "--no-plot", "--quiet"])
    assert set(suite.halves()) == {"tuning", "held-out", "all"}
    assert workloads.generator("loop") is None and workloads.generator("chat-p32") is None
    research = research_suite.workloads.halves()
    assert set(research) == {"tuning", "held-out", "all", "stress", "adversarial"}
    assert [s.title for s in research["adversarial"]] == [
        "adversarial, first set", "adversarial, second set", "adversarial, third set"]
