"""pfxcache.tools.replay (scripts/replay): trace formats, the Mooncake token mapping, Belady's bound, store vs daemon mode, --json."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from pfxcache.tools import replay

from research_support import research_policies

B = 16  # tokens per block/page in these tests: small and fast


@pytest.fixture(scope="module")
def small_trace():
    return replay.generate_sessions(seed=3, sessions=40, system_prompts=4, concurrent=10, block_tokens=B)


def test_mooncake_tokens_mapping():
    a = replay.mooncake_tokens([7, 8, 9], 2 * 512 + 100)
    b = replay.mooncake_tokens([7, 8, 10, 11], 4 * 512)
    assert a.dtype == np.uint32 and len(a) == 1124 and len(b) == 2048
    assert np.array_equal(a[:1024], b[:1024])  # shared hash ids share the token prefix
    assert not np.array_equal(a[1024:1124], b[1024:1124])  # then they differ
    assert np.array_equal(a[:512], (7 * 512 + np.arange(512)).astype(np.uint32))
    assert np.array_equal(a[1024:], (9 * 512 + np.arange(100)).astype(np.uint32))  # partial last block: its start
    big = replay.mooncake_tokens([2**40], 512)
    assert int(big[0]) == (2**40 * 512) & 0xFFFFFFFF
    with pytest.raises(ValueError):
        replay.mooncake_tokens([1, 2], 512)  # 2 blocks need more than 512 tokens
    # Past the last block (a partial block without a hash id): tokens unique to the request, not refused.
    past = replay.mooncake_tokens([1], 513 + 600, serial=5)
    assert len(past) == 1113 and np.array_equal(past[:512], replay.mooncake_tokens([1], 512))
    other = replay.mooncake_tokens([1], 513 + 600, serial=6)
    assert not np.array_equal(past[512:], other[512:])


def test_read_mooncake_and_per_file_namespaces(tmp_path):
    f1, f2 = tmp_path / "c1.jsonl", tmp_path / "c2.jsonl"
    f1.write_text('{"timestamp": 0, "input_length": 20, "hash_ids": [0, 1]}\n'
                  '{"timestamp": 5, "input_length": 40, "hash_ids": [0, 1, 2]}\n')
    f2.write_text('{"timestamp": 3, "input_length": 20, "hash_ids": [0, 1]}\n')
    shared = replay.read_trace([f1, f2], "mooncake", False, block_tokens=B)
    assert [r.timestamp for r in shared.requests] == [0, 3, 5]  # merged by timestamp
    assert {r.namespace for r in shared.requests} == {"replay"}
    split = replay.read_trace([f1, f2], "mooncake", True, block_tokens=B)
    assert [r.namespace for r in split.requests] == ["c1", "c2", "c1"]
    one = replay.replay_store(shared, "lru", 100, B, quiet=True)
    two = replay.replay_store(split, "lru", 100, B, quiet=True)
    # one namespace: c2's request and c1's second hit page 0 (block 1 was always partial, never cached)
    assert one["hit_tokens"] == 2 * B
    assert two["hit_tokens"] == B  # per file: only c1's second request hits (its own first one's page 0)
    assert one["input_tokens"] == two["input_tokens"] == 80
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_length": 10, "hash_ids": [0, 1]}\n')  # two blocks need more than one block of tokens
    with pytest.raises(ValueError):
        replay.read_trace([bad], "mooncake", False, block_tokens=B)


def test_input_past_the_hash_ids_replays_as_tokens_unique_to_the_request(tmp_path):
    """kv-cache-tester traces: input_length runs past the hash ids (a partial last block without one)."""
    f = tmp_path / "tester.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 70, "hash_ids": [0, 1]}\n'  # 2 blocks + 38 tokens
                 '{"timestamp": 1, "input_length": 70, "hash_ids": [0, 1]}\n')
    trace = replay.read_trace([f], "mooncake", False, block_tokens=B)
    assert [r.input_tokens for r in trace.requests] == [70, 70]
    got = replay.replay_store(trace, "lru", 100, B, quiet=True)
    assert got["hit_tokens"] == 2 * B  # the second hits the two hashed blocks, never the other's own pages
    bound = replay.belady(trace, replay.page_chains(trace, B), 100, B, quiet=True)
    assert bound["hit_tokens"] == 2 * B


def test_tokens_format(tmp_path):
    f = tmp_path / "t.jsonl"
    base = list(range(100, 100 + 2 * B))
    f.write_text("\n".join(json.dumps(o) for o in (
        {"tokens": base + [1, 2, 3]},
        {"tokens": base + [4] * B},
        {"tokens": base, "namespace": "other"},
    )) + "\n")
    trace = replay.read_trace([f], "tokens", False)
    assert [r.input_tokens for r in trace.requests] == [2 * B + 3, 3 * B, 2 * B]
    assert [r.namespace for r in trace.requests] == ["replay", "replay", "other"]
    result = replay.replay_store(trace, "lru", 50, B, quiet=True)
    assert result["hit_tokens"] == 2 * B  # the 2nd hits 2 pages; the other namespace shares nothing
    chains = replay.page_chains(trace, B)
    assert chains[0] == chains[1][:2] and chains[2][0] not in chains[0]


def test_belady_bounds_every_policy(small_trace):
    chains = replay.page_chains(small_trace, B)
    with research_policies() as every:  # the shipped ones and the research's
        for cap in (20, 60, 200):
            bound = replay.belady(small_trace, chains, cap, B, quiet=True)["hit_rate"]
            for policy in every:
                assert replay.replay_store(small_trace, policy, cap, B, quiet=True)["hit_rate"] <= bound + 1e-12
    unlimited = replay.belady(small_trace, chains, replay.UNLIMITED, B, quiet=True)["hit_rate"]
    assert unlimited == replay.replay_store(small_trace, "lru", replay.UNLIMITED, B, quiet=True)["hit_rate"]


def test_store_and_daemon_modes_agree(small_trace):
    runner = replay.DaemonRunner(None, 16)
    for policy in ("lru", "lfu", "guard"):
        store = replay.replay_store(small_trace, policy, 64, B, quiet=True)
        daemon = runner.run(small_trace, policy, 64, B, 16, quiet=True)
        assert store["hit_tokens"] == daemon["hit_tokens"], policy
        assert 0 < store["hit_rate"] < 1


def test_capacities_parse():
    assert replay.parse_capacity("1000", 64) == 1000
    assert replay.parse_capacity("1kib", 64) == 16
    assert replay.parse_capacity("64gb", 64 * 2**20) == 953
    assert replay.parse_capacity("unlimited", 1) == replay.UNLIMITED
    with pytest.raises(ValueError):
        replay.parse_capacity("12parsecs", 1)


def test_json_output(tmp_path):
    out = io.StringIO()
    save = tmp_path / "gen.jsonl"
    with contextlib.redirect_stdout(out):
        code = replay.main(["--generate", "sessions", "--sessions", "15", "--block-tokens", str(B), "--json",
                            "--no-plot", "--quiet", "--capacities", "30,unlimited", "--policies", "lru,lfu",
                            "--save", str(save)])
    assert code == 0
    doc = json.loads(out.getvalue())
    assert doc["policies"] == ["lru", "lfu"] and doc["capacities"] == ["30", "unlimited"]
    for name in ("lru", "lfu", "belady"):
        for cap in ("30", "unlimited"):
            row = doc["results"][name][cap]
            assert 0 <= row["hit_rate"] <= 1 and row["input_tokens"] == doc["input_tokens"]
    # the saved trace replays to the same figures
    again = replay.read_trace([save], "mooncake", False, block_tokens=B)
    assert replay.replay_store(again, "lru", 30, B, quiet=True)["hit_tokens"] == doc["results"]["lru"]["30"]["hit_tokens"]


def test_requests_in_flight_cannot_hit_what_is_not_stored_yet_and_leave_no_lease_behind():
    from pfxcache.daemon.store import MemoryArena, PrefixStore

    one = replay.Request("default", 4 * B, hash_ids=[7, 8, 9, 10])
    trace = replay.Trace("same-prompt", [replay.Request(one.namespace, one.input_tokens, hash_ids=one.hash_ids)
                                         for _ in range(4)], B)
    hits = {k: replay.replay_store(trace, "lru", 64, B, quiet=True, in_flight=k)["hit_tokens"] for k in (0, 1, 3)}
    # none in flight: the 2nd-4th hit; one: the 2nd looks up before the 1st stored; three: none hits
    assert hits == {0: 3 * 4 * B, 1: 2 * 4 * B, 3: 0}

    arena = MemoryArena(1, 40)
    store = PrefixStore(arena, page_size=B, shards=2, policy="guard", lease_ttl_ms=0)
    try:
        sessions = replay.generate_sessions(seed=5, sessions=30, system_prompts=3, concurrent=8, block_tokens=B)
        assert replay.replay_requests(store, sessions, B, 40, in_flight=4) > 0
        stats = store.stats()
        assert stats["leases"] == 0 and stats["pinned_pages"] == 0 and store.check() == []
    finally:
        arena.close()
    assert replay.in_flight_pages(40, 4) == 8 and replay.in_flight_pages(40, 0) == 40
    assert replay.in_flight_pages(replay.UNLIMITED, 4) == replay.UNLIMITED


def test_more_requests_in_flight_than_the_arena_has_pages_still_replay():
    """An arena of 10 pages with 16 requests in flight takes 9 beside the one looking up, one page each: their
    pins stay below the arena's size (17 one-page pins would not)."""
    ids = iter(range(1, 10_000))
    trace = replay.Trace("hot", [replay.Request("default", 2 * B, hash_ids=[1 + i % 10, next(ids) + 100])
                                 for i in range(200)], B)
    assert replay.in_flight_count(10, 16) == 9 and replay.in_flight_pages(10, 16) == 1
    got = replay.replay_store(trace, "lru", 10, B, quiet=True, in_flight=16)
    assert got["hit_tokens"] > 0


# -- --mode daemon --url: a daemon someone runs is checked first and left as it was -------------------------


@pytest.fixture
def running_daemon():
    """A pfxcached of 32-token pages under lfu, holding one prompt in replay's namespace."""
    import redis

    from pfxcache.client import PrefixCache
    from pfxcache.testing import start_daemon

    daemon = start_daemon("--arena", "memory", "--maxmemory", "64kb", "--block-bytes", "16", "--page-size", "32",
                          "--maxmemory-policy", "lfu", "--save", "", "--loglevel", "warning")
    url = f"redis://{daemon.host}:{daemon.port}/0"
    with PrefixCache.from_url(url, attach=False) as cache:
        cache.store(replay.DEFAULT_NS, np.arange(64, dtype=np.uint32), bytes(2 * 16))
    client = redis.Redis(host=daemon.host, port=daemon.port)
    try:
        yield url, client
    finally:
        client.close()
        daemon.stop()


def _held_and_policy(url, client):
    from pfxcache.client import PrefixCache

    with PrefixCache.from_url(url, attach=False) as cache:
        held = cache.lookup(replay.DEFAULT_NS, np.arange(64, dtype=np.uint32), lease=False).matched_tokens
    return held, client.config_get("maxmemory-policy")["maxmemory-policy"]


def test_a_daemon_of_another_page_size_is_refused_and_left_unchanged(running_daemon, tmp_path, capsys):
    url, client = running_daemon
    assert _held_and_policy(url, client) == (64, "lfu")
    code = replay.main(["--generate", "sessions", "--sessions", "10", "--block-tokens", str(B), "--mode", "daemon",
                        "--url", url, "--policies", "lru,guard", "--no-plot", "--quiet", "--no-belady"])
    err = capsys.readouterr().err
    assert code == 2
    assert "pages of 32 tokens, this replay needs 16" in err and "--page-size 32" in err
    assert "Traceback" not in err
    assert _held_and_policy(url, client) == (64, "lfu")  # the namespace still holds its prompt, lfu still rules


def test_a_research_policy_is_refused_for_a_daemon_before_anything_runs(running_daemon, capsys):
    """A daemon offers the shipped policies only: a research one is refused up front, the daemon untouched."""
    url, client = running_daemon
    with research_policies():
        with pytest.raises(SystemExit) as exit_info:
            replay.main(["--generate", "sessions", "--sessions", "10", "--block-tokens", "32", "--mode", "daemon",
                         "--url", url, "--policies", "lru,reuse", "--no-plot", "--quiet", "--no-belady"])
    assert exit_info.value.code == 2
    assert "policy 'reuse' is not one a daemon offers (it runs in --mode store only" in capsys.readouterr().err
    assert _held_and_policy(url, client) == (64, "lfu")


def test_a_replay_against_a_daemon_sets_its_policy_back_however_it_ends(running_daemon, monkeypatch, capsys):
    url, client = running_daemon
    argv = ["--generate", "sessions", "--sessions", "10", "--block-tokens", "32", "--mode", "daemon", "--url", url,
            "--policies", "lru,guard", "--no-plot", "--quiet", "--no-belady", "--json"]
    assert replay.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["results"]["guard"][next(iter(doc["results"]["guard"]))]["hit_rate"] > 0
    assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "lfu"

    real = replay.whole_pages
    calls = []

    def fails_midway(*args):
        calls.append(1)
        if len(calls) > 5:
            raise RuntimeError("interrupted mid-replay")
        return real(*args)

    monkeypatch.setattr(replay, "whole_pages", fails_midway)
    with pytest.raises(RuntimeError, match="interrupted mid-replay"):
        replay.main(argv)
    assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "lfu"
    assert client.execute_command("PFXINFO")  # and the daemon answers as before


def test_an_unreachable_daemon_is_a_clear_error(capsys):
    from pfxcache.testing import free_port

    code = replay.main(["--generate", "sessions", "--sessions", "5", "--block-tokens", str(B), "--mode", "daemon",
                        "--url", f"redis://127.0.0.1:{free_port()}/0", "--no-plot", "--quiet", "--no-belady"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot ask the daemon" in err and "Traceback" not in err
