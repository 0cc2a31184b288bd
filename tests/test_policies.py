"""The eviction policy interface (daemon/store/policy.py), what is shipped and what is research; then the research
ghost policy (research.policies.ghost): ordering on hand-made cases, and safety via the store."""

from __future__ import annotations

import random
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import importlib.util

from pfxcache.daemon.config.directives import DIRECTIVES
from pfxcache.daemon.store import MemoryArena, Node, OutOfMemory, PrefixStore
from pfxcache.daemon.store.guard import GuardState
from pfxcache.daemon.store.policy import EvictionOrder, Policy, RequestObserver
from pfxcache.daemon.store.registry import POLICIES, SHIPPED

from policy_support import chatty_trace, research_policies
from research.policies.ghost import BIMODAL_SHARE, GhostPolicy
from test_replay import B, replay

NS = b"t"
PAGE = 4  # tokens per page in these tests


def packed(*ids: int) -> bytes:
    return np.asarray(ids, dtype="<u4").tobytes()


def page(first: int) -> tuple[int, ...]:
    """One page of tokens starting with ``first``."""
    return tuple(first * 16 + j for j in range(PAGE))


def cold_page() -> tuple[int, ...]:
    """A page whose crc32 sends a cold leaf to the LRU end (not among the 1 in 32 kept at MRU)."""
    for first in range(1000, 2000):
        if zlib.crc32(packed(*page(first))) >= BIMODAL_SHARE:
            return page(first)
    raise AssertionError("no cold page found")


def make_store(nblocks: int, policy: str = "ghost") -> PrefixStore:
    tick = iter(range(1, 1 << 30))
    return PrefixStore(MemoryArena(1, nblocks), page_size=PAGE, shards=1, policy=policy,
                       clock=lambda: float(next(tick)), lease_ttl_ms=0)


def cached(store: PrefixStore, *ids: int) -> int:
    return store.cached_tokens(NS, packed(*ids)) // PAGE


def force_thrash(store: PrefixStore, value: float) -> None:
    store._index.all.thrash = value
    for index in store._index.scopes.values():
        index.thrash = value


# -- the interface ----------------------------------------------------------------------------------


def _members(protocol) -> set[str]:
    return {name for name in (*vars(protocol), *protocol.__annotations__) if not name.startswith("_")}


def test_the_shipped_choices_and_the_config_are_the_registry():
    assert SHIPPED == ("lru", "lfu", "hybrid", "tempo", "guard")
    row = next(d for d in DIRECTIVES if d.name == "maxmemory-policy")
    assert row.kind.choices == (*SHIPPED, "noeviction") and row.default == "guard"
    assert all(POLICIES[name].summary in row.doc for name in SHIPPED)
    for name in research_policies.RESEARCH:  # selectable in a research run's process, never by the daemon
        assert name in POLICIES and name not in row.kind.choices
    for module in ("odds", "ghosts_policy", "ghost"):  # the research policies are not in the package
        assert importlib.util.find_spec(f"pfxcache.daemon.store.{module}") is None


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_has_every_member_of_the_interface(name):
    policy = POLICIES[name]
    assert policy.name == name and policy.summary
    assert issubclass(policy, Policy)
    instance = policy.for_store(64, 4 * PAGE)
    for member in _members(EvictionOrder) | _members(RequestObserver):
        assert hasattr(instance, member), (name, member)
    assert instance.for_scope().live == 0 and instance.peek(0.0) is None and instance.describe() is not None
    assert isinstance(instance.memory_bytes(0, 0), int)


def test_a_node_has_one_slot_for_every_policy():
    assert "policy_data" in Node.__slots__
    assert not {"tempo", "odds", "lhd", "sample_hashes", "reuse"} & set(Node.__slots__)


def _states(store: PrefixStore) -> list:
    return [node.policy_data for rec in store._ns.values() for tree in rec.trees.values()
            for node in tree.subtree(tree.root)]


def test_a_switch_gives_the_new_policy_nodes_without_the_old_ones_state():
    """Every node, inner ones and roots included, starts afresh: the guard's composite on all, tempo's tuples
    only on what it has pushed since, nothing under lru."""
    trace = replay.Trace("chatty", chatty_trace(requests=300).requests, B)
    tick = iter(range(1, 1 << 30))
    store = PrefixStore(MemoryArena(1, 64), page_size=B, shards=2, policy="guard",
                        clock=lambda: float(next(tick)), lease_ttl_ms=0)
    replay.replay_requests(store, trace, B, 64)
    states = _states(store)
    assert len(states) > 20 and all(isinstance(s, GuardState) for s in states)
    assert any(s.tempo is not None for s in states) and any(s.reuse is not None for s in states)
    store.set_policy("tempo")
    assert not any(isinstance(s, GuardState) for s in _states(store))
    assert any(isinstance(s, tuple) for s in _states(store)) and store.check() == []
    store.set_policy("lru")
    assert all(s is None for s in _states(store))
    store.set_policy("guard")
    assert all(isinstance(s, GuardState) for s in _states(store))
    inner = [node for rec in store._ns.values() for tree in rec.trees.values() for node in tree.subtree(tree.root)
             if not node.evictable]  # not pushed since the switch: nothing of the experts' yet
    assert inner and all(node.policy_data.tempo is None and node.policy_data.lhd is None for node in inner)
    replay.replay_requests(store, trace, B, 64)
    assert store.check() == []


def test_registered_and_selectable():
    assert POLICIES["ghost"] is GhostPolicy
    store = make_store(8, "lru")
    store.insert(NS, packed(*page(1)))
    store.set_policy("ghost")
    assert store.policy == "ghost" and store.check() == []


def test_without_thrashing_it_is_lru():
    store = make_store(3)
    a, b, c, d = page(1), page(2), page(3), page(4)
    for p in (a, b, c):
        store.insert(NS, packed(*p))
    store.match(NS, packed(*a), lease=False)  # a is now the most recent
    store.insert(NS, packed(*d))  # evicts one page: b, the least recent
    assert [cached(store, *p) for p in (a, b, c, d)] == [1, 0, 1, 1]
    assert store.check() == []


def test_thrashing_puts_cold_new_leaves_at_the_lru_end():
    store = make_store(3)
    a, b, c, d = page(1), page(2), page(3), cold_page()
    for p in (a, b, c):
        store.insert(NS, packed(*p))
    store.evict_pages(NS, 1)  # a goes (LRU) and sets the LRU end
    force_thrash(store, 1.0)
    store.insert(NS, packed(*d))  # cold and new: inserted at the LRU end
    store.evict_pages(NS, 1)
    assert cached(store, *d) == 0 and cached(store, *b) == 1 and cached(store, *c) == 1
    assert store.check() == []


def test_ghost_hit_protects_a_returning_prefix():
    store = make_store(3)
    a, b, c = page(1), page(2), page(3)
    for p in (a, b, c):
        store.insert(NS, packed(*p))
    store.evict_pages(NS, 1)  # a evicted: its first page is in the ghost
    assert zlib.crc32(packed(*a)) in store._index.scopes[NS]._ghost  # EVICT uses the namespace's index
    force_thrash(store, 1.0)
    store.insert(NS, packed(*a, *page(9)))  # a is back (a continuation): MRU end, and thrash moves up
    assert store._index.all.thrash > 0.99
    assert cached(store, *b) == 0  # the insert needed room: b, the least recent, went
    store.evict_pages(NS, 1)  # c goes, not the returning a (newer, but it would go first if cold)
    assert cached(store, *a, *page(9)) == 2 and cached(store, *c) == 0
    assert store.check() == []


def test_continuation_of_a_hit_private_parent_is_protected_and_lowers_thrash():
    store = make_store(4)
    x, y, z, w = page(1), cold_page(), page(3), page(4)
    store.insert(NS, packed(*z))
    store.insert(NS, packed(*x))
    store.evict_pages(NS, 1)  # z goes: sets the LRU end
    force_thrash(store, 0.9)
    store.match(NS, packed(*x), lease=False)  # x was hit: a conversation going on
    store.insert(NS, packed(*x, *y))  # y continues x (x's only child): MRU end despite its cold first page
    assert store._index.all.thrash < 0.9
    store.insert(NS, packed(*w))
    store.evict_pages(NS, 1)
    # without the continuation rule y (cold, new) would have been the victim; now w, the LRU leaf, is
    assert cached(store, *x, *y) == 2 and cached(store, *w) == 0


def test_ghost_is_bounded():
    policy = GhostPolicy()
    store = make_store(2)
    store._index.all = policy  # only the global index matters for the bound
    for i in range(5000):
        store.insert(NS, packed(*page(10_000 + i)))
    assert len(policy._ghost) <= 4096


@pytest.mark.parametrize("seed", range(3))
def test_never_evicts_pinned_pages(seed):
    rng = random.Random(seed)
    store = make_store(24)
    leases = {}
    for step in range(300):
        first = rng.randrange(6)
        prompt = [*page(first)] + [t for k in range(rng.randrange(0, 5)) for t in page(100 + rng.randrange(12))]
        if rng.random() < 0.3 and len(leases) < 4:
            m = store.match(NS, packed(*prompt), lease=True, owner=1)
            if m.lease_id:
                leases[m.lease_id] = (prompt[: m.matched_tokens], m.blocks)
        else:
            try:
                store.insert(NS, packed(*prompt), owner=1)
            except OutOfMemory:  # the arena may be full of pinned pages
                pass
        if rng.random() < 0.2:
            force_thrash(store, rng.random())
        if leases and rng.random() < 0.2:
            lease_id = rng.choice(list(leases))
            del leases[lease_id]
            store.release(lease_id, 1)
        for toks, blocks in leases.values():  # leased pages stay cached, in the same blocks
            assert store.cached_tokens(NS, packed(*toks)) >= len(toks)
        if step % 50 == 0:
            assert store.check() == []
    assert store.check() == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 5), max_size=4), st.integers(0, 4),
                          st.booleans()), max_size=40))
def test_store_stays_consistent(ops):
    store = make_store(10)
    lease_ids = []
    for first, tail, action, thrash in ops:
        prompt = [*page(first)] + [t for k in tail for t in page(50 + k)]
        if thrash:
            force_thrash(store, 1.0)
        if action == 0:
            m = store.match(NS, packed(*prompt), lease=True, owner=1)
            if m.lease_id:
                lease_ids.append(m.lease_id)
        elif action == 1 and lease_ids:
            store.release(lease_ids.pop(0), 1)
        elif action == 2:
            store.evict_pages(NS, 2)
        else:
            try:
                store.insert(NS, packed(*prompt), owner=1)
            except OutOfMemory:
                pass
        assert store.check() == []
