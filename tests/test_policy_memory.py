"""What the guard keeps stays within its structural bounds, and the memory tool measures every component.

No byte counts here (they move with the interpreter): only what the structures may hold.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import redis
from pfxcache.daemon.store import MemoryArena, PrefixStore
from pfxcache.daemon.store.miniatures import _mix, _unmix
from pfxcache.testing import start_daemon
from pfxcache.tools.replay import replay_requests

import research_support  # noqa: F401 - scripts/ on sys.path: the research package
from research import policy_memory
from test_replay import B
from policy_support import chatty_trace


def guard_store(capacity: int = 64) -> PrefixStore:
    tick = itertools.count(1)
    store = PrefixStore(MemoryArena(1, capacity), page_size=B, shards=4, policy="guard",
                        clock=lambda: float(next(tick)), lease_ttl_ms=0)
    replay_requests(store, chatty_trace(requests=600), B, capacity)
    return store


def test_unmix_undoes_mix():
    x = np.random.default_rng(15).integers(0, 2**64, 10_000, dtype=np.uint64, endpoint=False)
    x[:3] = (0, 1, 2**64 - 1)
    assert [_unmix(int(v)) for v in _mix(x.copy())] == [int(v) for v in x]


def test_cached_identities_are_the_path_hashes():
    """Each node keeps only its pages' identities (one uint64 a page; splits and trims cut them with the
    pages): the path's identities from them equal a fresh hash of the whole path."""
    store = guard_store()
    sampler = store._index.all._sampler
    checked = 0
    for rec in store._ns.values():
        for tree in rec.trees.values():
            for node in tree.subtree(tree.root):
                samples = getattr(node.policy_data, "samples", None)  # the guard's GuardState
                if samples is None or node.parent is None:
                    continue
                assert samples.ndim == 1 and len(samples) == len(node.blocks)
                path = []
                up = node
                while up.parent is not None:
                    path.append(up.key)
                    up = up.parent
                key = b"".join(reversed(path))
                fresh = sampler.hash_pages(key, 0, sampler.seed(tree.scope))
                assert np.array_equal(sampler.path_hashes(tree.scope, node), fresh)
                checked += 1
    assert checked > 10


def test_evicted_nodes_keep_no_pages():
    """Stale order entries may still hold an evicted node: it holds none of its pages' bytes or hashes."""
    store = guard_store()
    assert store.evictions > 100
    guard = store._index.all
    evicted = [e[-1] for order in guard.orders.values() for part in policy_memory._entry_lists(order)
               for e in part if e[-1].parent is None]
    assert evicted
    for node in evicted:
        assert node.key == b"" and not node.blocks
        assert node.policy_data is None and node.page_hashes is None  # its state, sampling hashes included


def test_guard_orders_share_one_number_per_push():
    """The five orders number each push alike: one int object for all five entries of a push."""
    store = guard_store()
    guard = store._index.all
    assert all(order._seq is guard._seq for order in guard.orders.values())
    seq_at = {"lru": -3, "reuse": -3, "hybrid": -3, "tempo": 1, "lhd": 0}  # where each order's entries keep it
    live = {name: {id(e[-1]): e[seq_at[name]] for e in order._entries()} if name in ("lru", "reuse")
            else {id(e[-1]): e[0] for e in order._candidates if e[1] == e[2].version} if name == "lhd"
            else {id(e[-1]): e[seq_at[name]] for heap in order._buckets for e in heap if e[-2] == e[-1].version}
            for name, order in guard.orders.items()}
    assert len(live["lru"]) == guard.live > 10
    for name, entries in live.items():
        assert entries.keys() == live["lru"].keys()
        assert all(entries[node] is live["lru"][node] for node in entries)


def test_measure_sizes_every_component():
    row = policy_memory.measure(chatty_trace(requests=300), "guard", 64, B)
    assert set(policy_memory.COMPONENTS) <= set(row)
    assert 0 < row["pages"] <= 64 and row["ghost_entries"] > 0 and row["miniature_pages"] <= 5 * 64
    assert all(row[c] >= 0 for c in policy_memory.COMPONENTS)


def test_info_shows_the_policys_share_of_the_metadata():
    """INFO memory's used_memory_policy: the guard's five orders, ghosts and miniatures count more than lru's
    one order on the same requests, and a policy switch gives the new policy's figure."""
    bb = 1024
    figures = {}
    for policy in ("lru", "guard"):
        daemon = start_daemon("--maxmemory", str(128 * bb), "--page-size", "4", "--block-bytes", str(bb),
                              "--maxmemory-policy", policy, "--evict-low-watermark", "0")
        client = redis.Redis(host=daemon.host, port=daemon.port)
        try:
            for i in range(300):  # more one-page sequences than blocks: evictions, ghosts
                client.execute_command("PFXSET", "mem", "PACKED", np.array([i, 1, 2, 3], "<u4").tobytes(),
                                       "DATA", bytes(bb))
            info = client.info("memory")
            figures[policy] = info["used_memory_policy"]
            assert info["used_memory_policy_human"]
            if policy == "guard":
                client.config_set("maxmemory-policy", "lru")
                assert client.info("memory")["used_memory_policy"] < figures["guard"]
        finally:
            client.close()
            assert daemon.stop() == 0, daemon.log_text()
    assert 0 < figures["lru"] < figures["guard"]


def test_a_smaller_sample_holds_fewer_miniature_pages(monkeypatch, capsys):
    """--guard-sample-pages N: the miniatures hold at most N pages each (five of them), for that run only."""
    import json

    from pfxcache.daemon.store import guard
    from pfxcache.tools import workloads

    monkeypatch.setitem(workloads.SUITE, "chat", lambda seed: workloads.chat(seed, requests=300))
    pages = {}
    for n in (None, 16):
        argv = ["--workloads", "chat", "--capacities", "200", "--json", "--quiet"]
        assert policy_memory.main(argv + (["--guard-sample-pages", str(n)] if n else [])) == 0
        pages[n] = json.loads(capsys.readouterr().out)[1]["miniature_pages"]
    assert 5 * 16 < pages[None] <= 5 * 200 and 0 < pages[16] <= 5 * 16
    assert guard.SAMPLE_PAGES == 4096


def test_policy_cost_measures_a_daemon_policy_and_refuses_a_research_one_there(capsys):
    """research.policy_cost: the hot PFXGET loop runs against a daemon (a full hit each time); a research policy,
    which no daemon offers, is refused for it unless only the in-process trace is asked for (--rounds 0)."""
    from research import policy_cost

    rate, cpu_us = policy_cost.hot_pfxget("lru", 0.2)
    assert rate > 0 and cpu_us > 0
    with pytest.raises(SystemExit):
        policy_cost.main(["--policies", "lru,ghost", "--rounds", "1", "--capacities", ""])
    assert "a daemon does not offer ghost" in capsys.readouterr().err
    assert policy_cost.main(["--policies", "lru,ghost", "--rounds", "0", "--capacities", ""]) == 0
