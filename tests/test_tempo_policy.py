"""The tempo eviction policy: conversations kept by their own pace; pins, leaf first, and replays agree."""

from __future__ import annotations

import itertools

import pytest
from pfxcache.daemon.store import MemoryArena, PrefixStore
from pfxcache.daemon.store.registry import POLICIES
from pfxcache.daemon.store.tempo import TempoPolicy

from test_replay import B, replay
from policy_support import NS, PAGE, chatty_trace, replay_under_leases, switched_to, ticking_store, tokens, turn


def test_registered_and_selectable():
    assert POLICIES["tempo"] is TempoPolicy
    store = switched_to("tempo")
    assert store.policy == "tempo" and store.check() == []
    assert set(store.policy_state()) == {"tempo_new_content_pace_ticks", "tempo_ghost_entries"}


def test_untrained_it_is_lru():
    """Nothing came back yet: every leaf has the same pace and the order is LRU's."""
    for policy in ("lru", "tempo"):
        store = ticking_store(6, policy)
        for k in range(1, 7):
            store.insert(NS, tokens(100 + k))
        store.insert(NS, tokens(200))  # one page too many: the oldest goes
        assert store.cached_tokens(NS, tokens(101)) == 0 and store.cached_tokens(NS, tokens(102)) == 4


def conversations(policy: str) -> tuple[PrefixStore, list[int], list[int]]:
    """A conversation back every 4 requests and one back every 40 (lookups that miss in between),
    ending with a turn of the fast one, then one of the slow one: the fast one is the less recent."""
    store = ticking_store(64, policy)
    fast, slow = [1], [2]
    page = itertools.count(1000)
    for i in range(1, 121):
        if i % 4 == 0:
            fast.append(next(page))
            turn(store, tokens(*fast))
        if i % 40 == 0:
            slow.append(next(page))
            turn(store, tokens(*slow))
        if i % 4:
            store.match(NS, tokens(next(page)), lease=False)  # a one-off lookup: time passes
    return store, fast, slow


@pytest.mark.parametrize("policy", ["lru", "tempo"])
def test_the_fast_conversation_outlives_the_slow_one(policy):
    store, fast, slow = conversations(policy)
    assert store.evict_pages(NS, 1).evicted == 1 and store.check() == []
    kept_fast = store.cached_tokens(NS, tokens(*fast)) == len(fast) * PAGE
    kept_slow = store.cached_tokens(NS, tokens(*slow)) == len(slow) * PAGE
    # LRU takes the fast one's latest page (it was used less recently); tempo the slow one's
    assert (kept_fast, kept_slow) == ((True, False) if policy == "tempo" else (False, True))


def test_keeps_conversations_that_come_back_where_lru_loses_them(chatty):
    lru = replay.replay_store(chatty, "lru", 64, B, quiet=True)["hit_tokens"]
    tempo = replay.replay_store(chatty, "tempo", 64, B, quiet=True)["hit_tokens"]
    assert tempo > 1.3 * lru


@pytest.fixture(scope="module")
def chatty():
    return chatty_trace()


@pytest.mark.parametrize("seed", range(3))
def test_never_evicts_pinned_pages_and_stays_consistent(seed):
    store = replay_under_leases("tempo", seed)
    assert store._index.all.model.returns > 0  # paces were in play


def test_evicts_leaves_first():
    """A shared prefix outlives its continuations, however paced."""
    store = ticking_store(12)
    base = [1, 2, 3, 4]
    for k in range(20):
        turn(store, tokens(*base, 100 + 2 * k, 101 + 2 * k))
        if k % 3 == 0:
            turn(store, tokens(*base, 100 + 2 * k, 101 + 2 * k, 500 + k))  # a quick next turn now and then
        assert store.cached_tokens(NS, tokens(*base)) == 4 * PAGE
        assert store.check() == []


def test_namespace_eviction_orders_by_the_global_paces(chatty):
    tick = itertools.count(1)
    store = PrefixStore(MemoryArena(1, 64), page_size=B, shards=1, policy="tempo",
                        clock=lambda: float(next(tick)), lease_ttl_ms=0)
    other = b"other"
    for i, req in enumerate(chatty.requests[:800]):
        packed = replay.whole_pages(chatty, req, B, 64)[0].tobytes()
        ns = NS if i % 5 else other  # a second namespace: each gets its own index
        m = store.match(ns, packed, lease=False)
        store.insert(ns, packed, offset=m.matched_tokens)
    before = store.stats(NS)["pages"]
    assert store.evict_pages(NS, 6).evicted == 6 and store.stats(NS)["pages"] == before - 6
    assert store.check() == []


def test_store_and_daemon_modes_agree(chatty):
    trace = replay.Trace("chatty", chatty.requests[:1200], B)
    store = replay.replay_store(trace, "tempo", 64, B, quiet=True)
    daemon = replay.DaemonRunner(None, 16).run(trace, "tempo", 64, B, 16, quiet=True)
    assert store["hit_tokens"] == daemon["hit_tokens"]


def test_a_conversation_back_after_eviction_keeps_its_pace_and_its_prompt_is_not_its_own():
    """The ghost knows a conversation by the end of its evicted leaf, not by its first page: one that
    comes back is not new content; another one starting on the same system prompt is."""
    store = ticking_store(64)
    model = store._index.all.model
    system = [1, 2]
    talk = [*system, 10]
    for k in range(4):  # a conversation of four turns on the system prompt
        talk.append(20 + k)
        turn(store, tokens(*talk))
    store.evict_pages(NS, store.stats(NS)["pages"])  # everything goes, system prompt included
    assert store.stats(NS)["pages"] == 0
    news = model.news
    talk.append(30)
    assert turn(store, tokens(*talk)) == 0  # back: a miss, but through the ghost
    assert model.news == news and store.check() == []
    store.evict_pages(NS, store.stats(NS)["pages"])
    turn(store, tokens(*system, 40, 41))  # someone else on the same system prompt: new content
    assert model.news == news + 1
