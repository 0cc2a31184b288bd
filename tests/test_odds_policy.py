"""The odds eviction policy: LRU shifted by the learned odds of return per class; pins, leaf first, replays agree."""

from __future__ import annotations

import pytest
from pfxcache.daemon.store.registry import POLICIES

from test_replay import B, replay
from policy_support import (NS, PAGE, chatty_trace, hits_on_clock, replay_under_leases, switched_to, ticking_store,
                            tokens, turn, uneven_clock)
from research.policies.odds import OddsPolicy, classify


@pytest.fixture(scope="module")
def chatty():
    return chatty_trace()


def test_registered_and_selectable():
    assert POLICIES["odds"] is OddsPolicy
    store = switched_to("odds")
    assert store.policy == "odds" and store.check() == []
    assert set(store.policy_state()) == {"odds_return_share", "odds_turnover_ticks", "odds_ghost_entries"}


def test_untrained_it_is_lru():
    """Nothing came back yet: every boost is 0 and the order is LRU's."""
    for policy in ("lru", "odds"):
        store = ticking_store(6, policy)
        for k in range(1, 7):
            store.insert(NS, tokens(100 + k))
        store.insert(NS, tokens(200))  # one page too many: the oldest goes
        assert store.cached_tokens(NS, tokens(101)) == 0 and store.cached_tokens(NS, tokens(102)) == PAGE


def test_a_conversation_back_after_eviction_continues_its_turns():
    """The ghost knows an evicted leaf by its end: the conversation that brings it back is at its next turn,
    and what it adds is only the pages past that end."""
    store = ticking_store(64, "odds")
    policy = store._index.all
    talk = [1, 2, 10]
    for k in range(3):  # three turns
        talk.append(20 + k)
        turn(store, tokens(*talk))
    store.evict_pages(NS, store.stats(NS)["pages"])
    assert store.stats(NS)["pages"] == 0 and len(policy._ghost) > 0
    talk += [30, 31]
    assert turn(store, tokens(*talk)) == 0  # a miss, but a return through the ghost
    leaf = store._ns[NS].trees[0].root
    while leaf.children:
        (leaf,) = leaf.children.values()
    cls, _, turns, _ = leaf.policy_data
    assert turns >= 3 and cls == classify(2, turns)  # a later turn, two pages added
    assert store.check() == []


def test_keeps_conversations_that_come_back_where_lru_loses_them(chatty):
    lru = replay.replay_store(chatty, "lru", 64, B, quiet=True)["hit_tokens"]
    got = replay.replay_store(chatty, "odds", 64, B, quiet=True)["hit_tokens"]
    assert got > 1.3 * lru


def test_its_order_counts_ticks_not_seconds(chatty):
    """A research policy runs in process only; what makes a daemon agree with a replay in process is an order
    in ticks, never in the clock's time: on a clock of uneven steps it hits exactly what it hits on ticks."""
    trace = replay.Trace("chatty", chatty.requests[:1200], B)
    ticking = replay.replay_store(trace, "odds", 64, B, quiet=True)["hit_tokens"]
    assert hits_on_clock(trace, "odds", 64, uneven_clock()) == ticking


@pytest.mark.parametrize("seed", range(3))
def test_never_evicts_pinned_pages_and_stays_consistent(seed):
    store = replay_under_leases("odds", seed, two_namespaces=True)
    assert any(store._index.all.model.boost)  # boosts were in play


def test_evicts_leaves_first():
    """A shared prefix outlives its continuations, however likely they are to come back."""
    store = ticking_store(12, "odds")
    base = [1, 2, 3, 4]
    for k in range(40):
        turn(store, tokens(*base, 100 + 2 * k, 101 + 2 * k))
        if k % 3 == 0:
            turn(store, tokens(*base, 100 + 2 * k, 101 + 2 * k, 500 + k))
        assert store.cached_tokens(NS, tokens(*base)) == 4 * PAGE
        assert store.check() == []
