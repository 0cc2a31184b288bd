"""The reuse eviction policy: what ReuseLearner learns, how ReusePolicy orders, and that replays agree.

The workload that shows the policy's point ("chatty"): a few conversations
come back every ~40 requests, one page longer each time, between one-shot
prompts that never come back and add three times more pages than the arena
holds over that gap. LRU flushes every conversation just before its next
turn; reuse learns that returning conversations come back soon and keeps them.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import redis
import pytest
from pfxcache.daemon.store import MemoryArena, PrefixStore
from pfxcache.daemon.store.registry import POLICIES
from pfxcache.daemon.store.reuse import BOOST_MAX, BOOST_SCALE, LEARN_EVERY, ReuseLearner, ReusePolicy

from test_replay import B, replay
from policy_support import chatty_trace, replay_under_leases

NS = b"t"


@pytest.fixture(scope="module")
def chatty():
    return chatty_trace()


# -- the learner on its own ---------------------------------------------------------------------


def feed(learner: ReuseLearner, periods: list[tuple[int, int | None]]) -> None:
    """Each (class, gap or None) starts a period of that class and, with a gap, ends it by a return."""
    for cls, gap in periods:
        learner.start(cls)
        if gap is not None:
            learner.returned(cls, gap)


def test_a_class_that_comes_back_sooner_earns_a_boost_one_that_does_not_a_penalty():
    learner = ReuseLearner()
    quick, slow, never = (learner.classify(g, 1) for g in (20, 2000, None))
    rng = random.Random(0)
    periods = []
    for _ in range(40):
        periods += [(quick, rng.randrange(10, 30))] * 2 + [(slow, rng.randrange(1500, 2500))] + [(never, None)] * 5
    feed(learner, periods)
    assert learner.boost[quick] > 0
    assert learner.boost[never] < 0  # never comes back: goes before plain LRU order would send it
    assert learner.boost[slow] <= 0
    k = learner.median_gap
    assert 0 < learner.boost[quick] <= BOOST_SCALE * k * BOOST_MAX


def test_no_boosts_when_the_past_predicts_nothing():
    learner = ReuseLearner()
    classes = [learner.classify(g, p) for g in (None, 50, 400, 3000) for p in (1, 20)]
    rng = random.Random(1)
    periods = []
    for _ in range(3000):  # every class draws its return from the same distribution
        gap = int(rng.expovariate(1 / 300)) + 1 if rng.random() < 0.5 else None
        periods.append((rng.choice(classes), gap))
    feed(learner, periods)
    assert learner.median_gap > 0
    assert all(b == 0 for b in learner.boost)


def test_nothing_is_learned_from_too_few_returns():
    learner = ReuseLearner()
    # 40 quick returns among 3 x LEARN_EVERY accesses: below the 50 returns needed to learn anything
    feed(learner, [(learner.classify(5, 1), 5)] * 40 + [(learner.classify(None, 1), None)] * (3 * LEARN_EVERY))
    assert all(b == 0 for b in learner.boost) and learner.median_gap == 0


# -- the policy in the store ----------------------------------------------------------------------


def run_store(trace, policy: str, capacity: int) -> tuple[int, PrefixStore]:
    tick = itertools.count(1)
    store = PrefixStore(MemoryArena(1, capacity), page_size=B, shards=4, policy=policy,
                        clock=lambda: float(next(tick)), lease_ttl_ms=0)
    return replay.replay_requests(store, trace, B, capacity), store


def test_registered_and_selectable():
    assert POLICIES["reuse"] is ReusePolicy
    store = PrefixStore(MemoryArena(1, 8), page_size=4, shards=1, policy="lru", lease_ttl_ms=0)
    store.insert(NS, np.arange(8, dtype="<u4").tobytes())
    store.set_policy("reuse")
    assert store.policy == "reuse" and store.check() == []


def test_keeps_conversations_that_come_back_where_lru_loses_them(chatty):
    shared = B * (len(chatty.requests) - 1)  # every request but the first hits the shared first page
    reusable = run_store(chatty, "lru", 100_000)[0] - shared  # conversation tokens an unlimited cache hits
    lru, _ = run_store(chatty, "lru", 64)
    reuse, store = run_store(chatty, "reuse", 64)
    assert lru - shared < 0.05 * reusable  # LRU evicts every conversation before it comes back
    assert reuse - shared > 0.4 * reusable, (reuse - shared, reusable)
    learner = store._index.all.learner
    assert any(learner.boost) and store.check() == []


def test_untrained_it_is_lru():
    # Too few returns to learn from: keys are access ticks, the order is LRU's.
    short = chatty_trace(requests=120)
    for capacity in (16, 40):
        assert run_store(short, "reuse", capacity)[0] == run_store(short, "lru", capacity)[0]


def test_namespace_eviction_follows_the_learned_keys(chatty):
    _, store = run_store(chatty, "reuse", 64)
    last_talk = replay.whole_pages(chatty, chatty.requests[chatty.talks[-1]], B, 64)[0].tobytes()
    kept = store.cached_tokens(NS, last_talk)
    assert kept > B  # the latest conversation turn is cached beyond the shared first page
    before = store.stats(NS)["pages"]
    result = store.evict_pages(NS, 6)  # PFXEVICT key PAGES 6: the namespace's own index
    assert result.evicted == 6 and store.stats(NS)["pages"] == before - 6 and store.check() == []
    assert store.cached_tokens(NS, last_talk) == kept  # one-shot pages went first


@pytest.mark.parametrize("seed", range(3))
def test_never_evicts_pinned_pages_and_stays_consistent(seed):
    store = replay_under_leases("reuse", seed)
    assert any(store._index.all.learner.boost)  # checked while the learned keys were in play


def test_store_and_daemon_modes_agree(chatty):
    """Through the daemon reuse runs as the guard's expert (not a maxmemory-policy of its own)."""
    trace = replay.Trace("chatty", chatty.requests[:1200], B)
    runner = replay.DaemonRunner(None, 16)
    store = replay.replay_store(trace, "guard", 64, B, quiet=True)
    daemon = runner.run(trace, "guard", 64, B, 16, quiet=True)
    assert store["hit_tokens"] == daemon["hit_tokens"]
    assert store["hit_tokens"] > replay.replay_store(trace, "lru", 64, B, quiet=True)["hit_tokens"]


def test_info_and_pfxinfo_show_what_it_learned(fresh_daemon, chatty):
    d = fresh_daemon("--arena", "memory", "--maxmemory", str(64 * 16), "--block-bytes", "16", "--page-size", str(B),
                     "--maxmemory-policy", "guard", "--evict-low-watermark", "0")
    r = redis.Redis(*d.address, protocol=3, decode_responses=True)
    before = r.info("pfxcache")
    assert before["pfxcache_reuse_boosted_classes"] == 0 and before["pfxcache_reuse_median_gap_ticks"] == 0
    runner = replay.DaemonRunner(f"redis://{d.host}:{d.port}", 16)
    runner.check(B)  # (a run against a daemon of the replay's page size only)
    runner.run(replay.Trace("chatty", chatty.requests[:1200], B), "guard", 64, B, 16, quiet=True)
    after = r.info("pfxcache")
    assert after["pfxcache_reuse_boosted_classes"] > 0 and after["pfxcache_reuse_max_boost_ticks"] > 0
    assert after["pfxcache_reuse_median_gap_ticks"] > 0 and after["pfxcache_reuse_ghost_entries"] > 0
    state = r.execute_command("PFXINFO")["policy-state"]
    assert state["reuse-boosted-classes"] == after["pfxcache_reuse_boosted_classes"]
    r.config_set("maxmemory-policy", "lru")  # other policies learn nothing and show nothing
    assert not any(name.startswith("pfxcache_reuse") for name in r.info("pfxcache"))
    assert r.execute_command("PFXINFO")["policy-state"] == {}
    r.close()


def small_store(nblocks: int = 64) -> PrefixStore:
    tick = itertools.count(1)
    return PrefixStore(MemoryArena(1, nblocks), page_size=4, shards=1, policy="reuse",
                       clock=lambda: float(next(tick)), lease_ttl_ms=0)


def tokens(*pages: int) -> bytes:
    return np.asarray([p * 4 + j for p in pages for j in range(4)], dtype="<u4").tobytes()


def learned(store: PrefixStore) -> tuple[float, float]:
    learner = store._index.all.learner
    return float(learner.starts.sum()), float(learner.returns.sum())


def test_a_parent_uncovered_by_a_command_is_not_an_access():
    store = small_store()
    store.insert(NS, tokens(1, 2, 3))
    store.insert(NS, tokens(1, 2, 9))
    for _ in range(3):
        m = store.match(NS, tokens(1, 2, 3))
        store.release(m.lease_id, 0)
    before = learned(store)
    assert store.evict_pages(NS, 2).evicted == 2  # both tails: the shared prefix becomes a leaf
    assert learned(store) == before
    store.evict_all(NS)
    assert learned(store) == before and store.check() == []


def test_the_ghost_belongs_to_a_namespace():
    store = small_store()
    store.insert(b"a", tokens(1, 2))
    store.evict_all(b"a")
    _, returns = learned(store)
    store.insert(b"b", tokens(1, 2))  # the same tokens in another tenant: nothing of a's came back
    assert learned(store)[1] == returns
    store.insert(b"a", tokens(1, 2))  # a's prefix came back after it was evicted
    assert learned(store)[1] == returns + 1


def test_flushall_forgets_what_was_learned(chatty):
    _, store = run_store(chatty, "reuse", 64)
    assert store.policy_state()["reuse_boosted_classes"] > 0
    store.flush()
    state = store.policy_state()
    assert state["reuse_boosted_classes"] == 0 and state["reuse_ghost_entries"] == 0 and store.check() == []


def test_replaying_twice_on_one_daemon_gives_the_same_figures(fresh_daemon, chatty):
    d = fresh_daemon("--arena", "memory", "--maxmemory", str(64 * 16), "--block-bytes", "16", "--page-size", str(B),
                     "--maxmemory-policy", "guard", "--evict-low-watermark", "0")
    trace = replay.Trace("chatty", chatty.requests[:800], B)
    runner = replay.DaemonRunner(f"redis://{d.host}:{d.port}", 16)
    runner.check(B)  # (a run against a daemon of the replay's page size only)
    first = runner.run(trace, "guard", 64, B, 16, quiet=True)["hit_tokens"]
    second = runner.run(trace, "guard", 64, B, 16, quiet=True)["hit_tokens"]
    assert first == second == replay.replay_store(trace, "guard", 64, B, quiet=True)["hit_tokens"]


def test_switching_to_it_with_history_it_never_saw():
    store = small_store()
    store.set_policy("lru")
    store.insert(NS, tokens(1, 2, 3))
    store.insert(NS, tokens(1, 2, 9))
    store.match(NS, tokens(1, 2, 3), lease=False)  # the shared prefix was hit, as an inner node
    store.set_policy("reuse")
    assert store.evict_pages(NS, 3).evicted == 3  # both tails, then the prefix's own page
    assert store.check() == [] and store.cached_tokens(NS, tokens(1, 2, 3)) == 4
