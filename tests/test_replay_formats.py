"""scripts/replay reads kv-cache-tester's native traces (pfxcache.tools.trace_formats): ids, partial blocks, the
timeline the tester would play, directories, auto-detection and the errors bad files get.

Every trace here is made up in tmp_path, in the tester's format (one JSON object per conversation file).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pfxcache.tools import replay
from pfxcache.tools.trace_formats import TraceFormatError, read_trace

B = 16  # tokens per block in these traces
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def req(t, n, ids, kind="s", **extra):
    return {"t": t, "type": kind, "model": "m", "in": n, "out": 10, "hash_ids": list(ids),
            "input_types": ["text"], "output_types": ["text"], "stop": "", **extra}


def write(path: Path, requests, block=B, **top) -> Path:
    doc = {"id": path.stem, "models": ["m"], "block_size": block, "tool_tokens": 20, "system_tokens": 10,
           "requests": requests, **top}
    path.write_text(json.dumps(doc))
    return path


def two_conversations(tmp_path):
    """Both files use hash ids 1, 2, 3: the tester's ids are per file."""
    a = write(tmp_path / "trace_0001.json", [req(0.0, 2 * B + 5, [1, 2]),           # 2 blocks + 5 tokens
                                             req(4.0, 2 * B + 5, [1, 2], "n"),      # its non-streaming twin
                                             req(10.0, 3 * B + 1, [1, 2, 3])])
    b = write(tmp_path / "trace_0002.json", [req(0.0, 2 * B + 5, [1, 2]),
                                             req(3.0, 3 * B, [1, 2, 3])])
    return a, b


def kv(paths, **kw):
    return read_trace(paths, "auto", kw.pop("namespace_per_file", False), **kw)


def test_tokens_partial_block_and_one_id_space_per_file(tmp_path):
    a, b = two_conversations(tmp_path)
    trace = kv([a, b], users=0)
    assert trace.block_tokens == B and len(trace.requests) == 5
    # times 0 (a), 0 (b), 3 (b), 4 (a's twin), 10 (a)
    assert [r.input_tokens for r in trace.requests] == [2 * B + 5, 2 * B + 5, 3 * B, 2 * B + 5, 3 * B + 1]
    assert {r.namespace for r in trace.requests} == {"replay"}
    first_a, first_b = trace.requests[0], trace.requests[1]
    assert first_a.hash_ids == [1, 2] and first_b.hash_ids == [5, 6]  # b's ids moved past a's (0..3)
    assert [r.hash_ids for r in trace.requests[2:]] == [[5, 6, 7], [1, 2], [1, 2, 3]]
    toks_a, pages = replay.whole_pages(trace, first_a, B, 0)
    assert pages == 2 and np.array_equal(toks_a, replay.mooncake_tokens([1, 2], 2 * B, B))
    full_a = replay.mooncake_tokens(first_a.hash_ids, first_a.input_tokens, B, first_a.serial)
    twin = trace.requests[3]
    full_twin = replay.mooncake_tokens(twin.hash_ids, twin.input_tokens, B, twin.serial)
    assert np.array_equal(full_a[: 2 * B], full_twin[: 2 * B])
    assert not np.array_equal(full_a[2 * B:], full_twin[2 * B:])  # the partial block is each request's own
    got = replay.replay_store(trace, "lru", 100, B, quiet=True)
    # a's twin hits 2 blocks, a's third 2, b's second 2: never the other file's blocks, never a partial block
    assert got["hit_tokens"] == 3 * 2 * B and got["input_tokens"] == trace.input_tokens
    assert replay.belady(trace, replay.page_chains(trace, B), 100, B, quiet=True)["hit_tokens"] == 6 * B
    split = kv([a, b], users=0, namespace_per_file=True)
    assert [r.namespace for r in split.requests] == ["trace_0001", "trace_0002", "trace_0002", "trace_0001",
                                                     "trace_0001"]
    assert replay.replay_store(split, "lru", 100, B, quiet=True)["hit_tokens"] == 6 * B


def test_timeline_users_delays_and_determinism(tmp_path):
    a, b = two_conversations(tmp_path)
    together = kv([a, b], users=0)
    assert [r.timestamp for r in together.requests] == [0, 0, 3000, 4000, 10000]  # ms; ties in file order
    assert [r.serial for r in together.requests] == list(range(5))
    one_user = kv([a, b], users=1)  # b starts when a ends (its last request, at 10 s)
    assert [r.timestamp for r in one_user.requests] == [0, 4000, 10000, 10000, 13000]
    assert [r.hash_ids[0] for r in one_user.requests] == [1, 1, 1, 5, 5]
    capped = kv([a, b], users=1, max_delay=2.0)  # gaps 4, 6 -> 2, 2; then b at 4 s: 0, 3 -> 2
    assert [r.timestamp for r in capped.requests] == [0, 2000, 4000, 4000, 6000]
    again = kv([a, b], users=1)
    assert [(r.timestamp, r.hash_ids, r.input_tokens) for r in again.requests] == \
        [(r.timestamp, r.hash_ids, r.input_tokens) for r in one_user.requests]


def test_think_time_is_the_delay_unless_timing_original(tmp_path):
    f = write(tmp_path / "c.json", [req(0.0, B + 1, [1], think_time=0.0),
                                    req(30.0, B + 1, [1], think_time=5.0),  # 25 s of it was the API's
                                    req(31.0, B + 1, [1])])                  # no think_time: t's gap
    assert [r.timestamp for r in kv([f]).requests] == [0, 5000, 6000]
    assert [r.timestamp for r in kv([f], timing="original").requests] == [0, 30000, 31000]


def test_subagents_run_concurrently_and_the_parent_waits(tmp_path):
    sub1 = {"type": "subagent", "t": 2.0, "agent_id": "x",
            "requests": [req(0.0, B + 1, [1]), req(10.0, 2 * B + 1, [1, 2])]}
    sub2 = {"type": "subagent", "t": 2.0, "agent_id": "y", "requests": [req(0.0, B + 1, [1])]}
    f = write(tmp_path / "p.json", [req(0.0, 2 * B, [1, 2]), sub1, sub2, req(3.0, 3 * B, [1, 2, 3])])
    trace = kv([f])
    # parent at 0; both sub-agents start with it idle (0); the parent's next is due 1 s after its last
    # (3 - 2), but it waits for sub1's end (10); each sub-agent has its own ids (1 -> 5, 1 -> 8)
    assert [(r.timestamp, r.hash_ids) for r in trace.requests] == [
        (0, [1, 2]), (0, [5]), (0, [8]), (10000, [5, 6]), (10000, [1, 2, 3])]
    shared = write(tmp_path / "g.json", [req(0.0, 2 * B, [1, 2]), sub1, sub2, req(3.0, 3 * B, [1, 2, 3])],
                   hash_id_scope="global")
    assert [r.hash_ids for r in kv([shared]).requests] == [[1, 2], [1], [1], [1, 2], [1, 2, 3]]
    hits = replay.replay_store(kv([shared]), "lru", 100, B, quiet=True)["hit_tokens"]
    assert hits == 6 * B  # global scope: the sub-agents hit the parent's blocks (1 + 1 + 2), the parent 2


def test_max_context_stops_a_conversation(tmp_path):
    f = write(tmp_path / "c.json", [req(0.0, 2 * B, [1, 2]), req(1.0, 9 * B, range(1, 10)),
                                    req(2.0, 2 * B, [1, 2])])
    assert len(kv([f], max_context=4 * B).requests) == 1


def test_directory_argument_and_auto_detection(tmp_path):
    d = tmp_path / "traces"
    d.mkdir()
    two_conversations(d)
    (d / "README.txt").write_text("not a trace")  # ignored: only .json / .jsonl
    trace = kv([d], users=0)
    assert trace.name == "traces" and len(trace.requests) == 5 and trace.block_tokens == B
    pretty = write(tmp_path / "pretty.json", [req(0.0, B + 1, [1])])
    pretty.write_text(json.dumps(json.loads(pretty.read_text()), indent=2))  # several lines: still detected
    assert kv([pretty]).requests[0].hash_ids == [1]
    (d / "mooncake.jsonl").write_text('{"timestamp": 0, "input_length": 20, "hash_ids": [0, 1]}\n')
    with pytest.raises(TraceFormatError, match=r"trace_0001.json: a kvtester trace, unlike .*mooncake.jsonl"):
        kv([d])  # by name, mooncake.jsonl comes first
    with pytest.raises(TraceFormatError, match=r"mooncake.jsonl: not a kv-cache-tester trace .*unlike .*trace_0001"):
        kv([d / "trace_0001.json", d / "mooncake.jsonl"])
    jsonl = read_trace([d / "mooncake.jsonl"], "auto", False, block_tokens=B)
    assert [r.hash_ids for r in jsonl.requests] == [[0, 1]]


@pytest.mark.parametrize("requests, expected", [
    ([req(0.0, 20, [1]), {"t": 1.0, "type": "s", "hash_ids": [1]}], r"requests\[1\]: \"in\" must be"),
    ([req(0.0, B, [1, 2])], r"requests\[0\]: 2 hash ids of 16-token blocks do not fit \"in\" 16"),
    ([{"in": 20, "hash_ids": [1]}], r"requests\[0\]: 't' must be a number"),
    ([req(0.0, 20, [1, "x"])], r"requests\[0\]: \"hash_ids\" must be a list of integers"),
    ([req(0.0, 20, [1]), {"t": 1.0, "type": "subagent", "requests": [req(0.0, 20, [-1])]}],
     r"requests\[1\]\.requests\[0\]: \"hash_ids\""),
    ("nope", r"\"requests\" must be a list"),
])
def test_bad_requests_are_refused_naming_file_and_request(tmp_path, requests, expected):
    f = write(tmp_path / "bad.json", requests)
    with pytest.raises(TraceFormatError, match=expected) as err:
        kv([f])
    assert str(f) in str(err.value)


def test_bad_files_are_refused(tmp_path):
    a = write(tmp_path / "a.json", [req(0.0, 20, [1])])
    other = write(tmp_path / "b.json", [req(0.0, 70, [1])], block=64)
    with pytest.raises(TraceFormatError, match="block_size 64 disagrees with .*a.json's 16"):
        kv([a, other])
    with pytest.raises(TraceFormatError, match="block_size 16 disagrees with --block-tokens 64"):
        read_trace([a], "kvtester", False, block_tokens=64)
    junk = tmp_path / "junk.json"
    junk.write_text('{"block_size": 16, "requests": [')
    with pytest.raises(TraceFormatError, match="junk.json: not a JSON document"):
        kv([junk])
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"timestamp": 0, "input_length": 20, "hash_ids": [0, 1]}\n{"timestamp": 1, "hash_ids": [0]}\n')
    with pytest.raises(TraceFormatError, match=r"t.jsonl:2: missing field 'input_length'"):
        read_trace([jsonl], "mooncake", False, block_tokens=B)
    with pytest.raises(TraceFormatError, match="t.jsonl: not a kv-cache-tester trace"):
        read_trace([jsonl], "kvtester", False)
    with pytest.raises(TraceFormatError, match="no such trace file"):
        kv([tmp_path / "missing.json"])


def test_replay_command_refuses_bad_traces_with_a_message(tmp_path, capsys):
    f = write(tmp_path / "bad.json", [req(0.0, B, [1, 2])])
    with pytest.raises(SystemExit) as exit_:
        replay.main([str(f), "--quiet", "--no-plot"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "bad.json: requests[0]: 2 hash ids" in err and "Traceback" not in err


def test_save_as_mooncake_replays_the_same(tmp_path):
    a, b = two_conversations(tmp_path)
    trace = kv([a, b], users=1)
    saved = tmp_path / "saved.jsonl"
    replay.save_trace(trace, saved)
    again = read_trace([saved], "auto", False, block_tokens=B)
    for cap in (3, 100):
        assert replay.replay_store(again, "lru", cap, B, quiet=True) == replay.replay_store(trace, "lru", cap, B,
                                                                                           quiet=True)


def test_store_and_daemon_modes_agree_on_a_kvtester_trace(tmp_path):
    a, b = two_conversations(tmp_path)
    trace = kv([a, b], users=0)
    store = replay.replay_store(trace, "lru", 4, B, quiet=True)
    daemon = replay.DaemonRunner(None, 16).run(trace, "lru", 4, B, 16, quiet=True)
    assert store["hit_tokens"] == daemon["hit_tokens"] > 0


def test_scripts_replay_store_mode_over_a_directory(tmp_path):
    d = tmp_path / "traces"
    d.mkdir()
    two_conversations(d)
    result = subprocess.run([str(SCRIPTS / "replay"), "traces", "--mode", "store", "--capacities", "3,unlimited",
                             "--policies", "lru", "--json", "--quiet", "--no-plot"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["trace"] == "traces" and doc["requests"] == 5 and doc["page_size"] == B
    assert doc["input_tokens"] == 2 * (2 * B + 5) + (2 * B + 5) + 3 * B + 3 * B + 1
    assert doc["results"]["lru"]["unlimited"]["hit_tokens"] == 6 * B
    assert doc["results"]["belady"]["unlimited"]["hit_tokens"] == 6 * B


def test_warm_prefix_shares_the_first_blocks_across_conversations(tmp_path):
    a, b = two_conversations(tmp_path)
    for f in (a, b):  # tool_tokens + system_tokens: 40 in a (the largest), 10 in b
        doc = json.loads(f.read_text())
        doc["tool_tokens"] = 30 if f == a else 0
        f.write_text(json.dumps(doc))
    cold = kv([a, b], users=0)
    warm = kv([a, b], users=0, warm_prefix=1.0)  # 40 tokens: 2 whole blocks, shared ids 0, 1
    half = kv([a, b], users=0, warm_prefix=0.6)  # 24 tokens: one whole block
    assert [r.hash_ids for r in warm.requests] == [[0, 1], [0, 1], [0, 1, 9], [0, 1], [0, 1, 5]]
    assert [r.hash_ids[:2] for r in half.requests] == [[0, 3], [0, 7], [0, 7], [0, 3], [0, 3]]
    hits = [replay.replay_store(t, "lru", 100, B, quiet=True)["hit_tokens"] for t in (cold, half, warm)]
    assert hits == [6 * B, 7 * B, 8 * B]  # b's first request hits a's shared blocks
    with pytest.raises(TraceFormatError, match="fraction"):
        kv([a], warm_prefix=2.0)
