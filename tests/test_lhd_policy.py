"""The lhd eviction policy: least hit density among drawn candidates; pins, leaf first, and replays agree."""

from __future__ import annotations

import numpy as np
import pytest
from pfxcache.daemon.store import lhd
from pfxcache.daemon.store.lhd import LHDPolicy, age_bucket, densities
from pfxcache.daemon.store.registry import POLICIES

from test_replay import B, replay
from policy_support import (NS, PAGE, chatty_trace, hits_on_clock, replay_under_leases, switched_to, ticking_store,
                            tokens, turn, uneven_clock)


@pytest.fixture(scope="module")
def chatty():
    return chatty_trace()


def test_registered_and_selectable():
    assert POLICIES["lhd"] is LHDPolicy
    store = switched_to("lhd")
    assert store.policy == "lhd" and store.check() == []
    assert set(store.policy_state()) == {"lhd_recomputations"}


def test_age_buckets_are_monotone_and_four_per_octave():
    buckets = [age_bucket(a) for a in range(1 << 12)]
    assert buckets == sorted(buckets) and buckets[:8] == list(range(8))
    assert age_bucket(1024) - age_bucket(512) == 4
    assert age_bucket(1 << 40) == lhd.AGE_BUCKETS - 1


def test_density_is_hits_per_tick_from_an_age_on():
    """Every object hit at age 100 and none evicted: about 1/100 a tick when new, nothing past 100."""
    hits = np.zeros((1, lhd.AGE_BUCKETS))
    hits[0, age_bucket(100)] = 10.0
    d = densities(hits, np.zeros_like(hits))[0]
    assert 0.8 / 100 < d[0] < 1.2 / 100
    assert d[age_bucket(100)] > d[0]  # about to be hit: denser than when new
    assert d[age_bucket(200)] == 0.0
    # the same hits, but as many objects evicted young: half the hits per tick of room
    evictions = np.zeros_like(hits)
    evictions[0, age_bucket(10)] = 10.0
    assert densities(hits, evictions)[0][0] < d[0]


def test_adopt_takes_another_models_histograms_scaled():
    """What the guard gives its lhd order at a switch: the miniature's histograms, ages x age_scale (4 buckets an
    octave) and pages x size_scale (a size class an octave), clipped at the edges; the densities made anew."""
    theirs = lhd.HitDensityModel()
    small = lhd.classify(1, 2, 1)  # hit once, 2 pages, first turn
    theirs.hits[small, age_bucket(100)] = 40.0
    theirs.evictions[small, age_bucket(30)] = 20.0
    theirs.hits[lhd.classify(0, 1 << 20, 1), lhd.AGE_BUCKETS - 1] = 5.0  # the largest class, the oldest age
    theirs.eviction_age = 30.0
    theirs.recompute()
    same = lhd.HitDensityModel()
    same.adopt(theirs)
    assert [list(row) for row in same.table] == [list(row) for row in theirs.table]
    scaled = lhd.HitDensityModel()
    scaled.now, scaled.epoch = 12345, 7
    scaled.adopt(theirs, age_scale=2.0, size_scale=4.0)
    big = lhd.classify(1, 8, 1)  # 2 pages x 4
    assert scaled.hits[big, age_bucket(200)] == theirs.hits[small, age_bucket(100)]
    assert scaled.evictions[big, age_bucket(60)] == theirs.evictions[small, age_bucket(30)]
    assert scaled.hits.sum() == theirs.hits.sum() and scaled.evictions.sum() == theirs.evictions.sum()
    oldest = lhd.classify(0, 1 << 20, 1), lhd.AGE_BUCKETS - 1
    assert scaled.hits[oldest] == theirs.hits[oldest] > 0  # clipped, kept
    assert scaled.eviction_age == 60.0 and (scaled.now, scaled.epoch) == (12345, 7)  # its own clock
    assert scaled.table[big][age_bucket(150)] > 0.0 == scaled.table[big][age_bucket(400)]


def test_untrained_it_is_lru():
    """Nothing learned: every density is 0 and the oldest drawn goes; with few candidates all are drawn."""
    for policy in ("lru", "lhd"):
        store = ticking_store(6, policy)
        for k in range(1, 7):
            store.insert(NS, tokens(100 + k))
        store.insert(NS, tokens(200))  # one page too many: the oldest goes
        assert store.cached_tokens(NS, tokens(101)) == 0 and store.cached_tokens(NS, tokens(102)) == PAGE


def test_keeps_conversations_that_come_back_where_lru_loses_them(chatty):
    """One-off prompts flood the cache between a conversation's turns: LRU forgets every conversation before
    its next turn; lhd learns (through its explorers) that conversations come back and one-offs do not."""
    lru = replay.replay_store(chatty, "lru", 64, B, quiet=True)["hit_tokens"]
    got = replay.replay_store(chatty, "lhd", 64, B, quiet=True)["hit_tokens"]
    assert got > 1.25 * lru


def test_deterministic(chatty):
    trace = replay.Trace("chatty", chatty.requests[:1500], B)
    runs = [replay.replay_store(trace, "lhd", 48, B, quiet=True)["hit_tokens"] for _ in range(2)]
    assert runs[0] == runs[1]


def test_its_order_counts_ticks_not_seconds(chatty):
    """A research policy runs in process only; what makes a daemon agree with a replay in process is an order
    in ticks, never in the clock's time: on a clock of uneven steps it hits exactly what it hits on ticks."""
    trace = replay.Trace("chatty", chatty.requests[:1200], B)
    ticking = replay.replay_store(trace, "lhd", 64, B, quiet=True)["hit_tokens"]
    assert hits_on_clock(trace, "lhd", 64, uneven_clock()) == ticking


@pytest.mark.parametrize("seed", range(3))
def test_never_evicts_pinned_pages_and_stays_consistent(seed):
    store = replay_under_leases("lhd", seed, two_namespaces=True)
    model = store._index.all.model
    assert model.epoch > 0 and model.hits.sum() > 0  # densities were in play
    assert 0 <= model.explorers


def test_evicts_leaves_first():
    """A shared prefix outlives its continuations, however dense."""
    store = ticking_store(12, "lhd")
    base = [1, 2, 3, 4]
    for k in range(40):
        turn(store, tokens(*base, 100 + 2 * k, 101 + 2 * k))
        if k % 3 == 0:
            turn(store, tokens(*base, 100 + 2 * k, 101 + 2 * k, 500 + k))  # a quick next turn now and then
        assert store.cached_tokens(NS, tokens(*base)) == 4 * PAGE
        assert store.check() == []
