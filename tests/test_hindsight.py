"""pfxcache.tools.hindsight: its page-granular LRU is the store's LRU, Belady bounds every rule."""

from __future__ import annotations

from pfxcache.tools import hindsight, replay

from test_replay import B
from policy_support import chatty_trace


def test_page_lru_is_the_store_lru_and_belady_bounds_the_told_rules():
    trace = chatty_trace(requests=1500)
    chains = replay.page_chains(trace, B)
    nxt = hindsight.next_uses(chains)
    for capacity in (32, 64):
        lru = hindsight.simulate(chains, nxt, capacity, lambda i, d, nu: (i, -d))
        belady = hindsight.simulate(chains, nxt, capacity, lambda i, d, nu: (-nu, -d))
        told = hindsight.simulate(chains, nxt, capacity, lambda i, d, nu: (nu - i <= 200, i, -d))
        store = replay.replay_store(trace, "lru", capacity, B, quiet=True)["hit_tokens"]
        assert sum(lru) * B == store  # request by request the same rule as the store's lru
        assert sum(belady) * B == replay.belady(trace, chains, capacity, B, quiet=True)["hit_tokens"]
        assert sum(lru) < sum(told) <= sum(belady)


def test_study_reports_what_belady_keeps():
    r = hindsight.study("chat", 0.005, [256], weights=(500,))
    assert r["hit_pages"]["belady"] >= r["hit_pages"]["told 256"] >= r["hit_pages"]["lru"]
    assert r["hit_pages"]["belady"] >= r["hit_pages"]["shares 500"]
    assert sum(r["gaps"].values()) == sum(r["kinds"].values()) > 0
