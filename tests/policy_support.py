"""What the eviction policies' tests share: small stores on a tick clock, the "chatty" workload, and a replay
under leases that come and go.

Every policy must respect pins (a leased page is never evicted) and leave the
store consistent, whatever its order; these helpers drive a store the same way
for each of them.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
from pfxcache.daemon.store import MemoryArena, OutOfMemory, PrefixStore
from pfxcache.tools import replay

import research_support  # noqa: F401 - scripts/ on sys.path: the research package
from research import policies as research_policies
from test_replay import B

# The guard's experts (reuse, lhd) and the research policies (ghost, odds) by name, in these tests' stores.
research_policies.register()

NS = b"t"
PAGE = 4


def tokens(*pages: int) -> bytes:
    """Whole pages of PAGE tokens, page k holding k*16 .. k*16+3."""
    return np.asarray([p * 16 + j for p in pages for j in range(PAGE)], dtype="<u4").tobytes()


def uneven_clock():
    """A clock whose steps between calls differ a thousandfold: an order in its time is not one in ticks."""
    rng = random.Random(7)
    now = itertools.accumulate(rng.choice((0.001, 1.0)) for _ in itertools.count())
    return lambda: next(now)


def hits_on_clock(trace, policy: str, capacity: int, clock) -> int:
    """replay.replay_store's hit tokens, on a store that reads ``clock``."""
    store = PrefixStore(MemoryArena(1, capacity), page_size=B, shards=16, policy=policy, clock=clock, lease_ttl_ms=0)
    return replay.replay_requests(store, trace, B, capacity)


def ticking_store(nblocks: int, policy: str = "tempo", shards: int = 1) -> PrefixStore:
    tick = itertools.count(1)
    return PrefixStore(MemoryArena(1, nblocks), page_size=PAGE, shards=shards, policy=policy,
                       clock=lambda: float(next(tick)), lease_ttl_ms=0)


def turn(store: PrefixStore, packed: bytes) -> int:
    """A worker's request: look up, store what was missing, release; returns the pages hit."""
    m = store.match(NS, packed, lease=True, owner=1)
    if m.matched_tokens * 4 < len(packed):
        store.insert(NS, packed, offset=m.matched_tokens, owner=1)
    if m.lease_id:
        store.release(m.lease_id, 1)
    return m.matched_tokens // PAGE


def switched_to(policy: str) -> PrefixStore:
    """A store that cached and hit a path under lru, then switched to ``policy`` (CONFIG SET's path)."""
    store = ticking_store(8, "lru")
    store.insert(NS, tokens(1, 2))
    store.match(NS, tokens(1, 2), lease=False)
    store.set_policy(policy)
    return store


def chatty_trace(requests: int = 2500, conversations: int = 8, gap: int = 40, seed: int = 1, growth: int = 1):
    """Mooncake-format trace (blocks of B tokens): a few conversations come back every ~``gap`` requests,
    ``growth`` blocks longer each time, between one-shot prompts that never come back and add three times more
    pages than a 64-page arena holds over that gap (``trace.talks``: the conversations' requests). Every
    request ends in half a block of its own (not a page in B-token pages; in smaller ones, a dead tail)."""
    rng = random.Random(seed)
    ids = itertools.count(1)
    convs = [[next(ids)] for _ in range(conversations)]
    due = [rng.randrange(gap) for _ in range(conversations)]
    out = []
    talks = []  # indices of the conversations' requests
    for i in range(requests):
        ready = [k for k in range(conversations) if due[k] <= i]
        if ready:
            k = ready[0]
            convs[k] += [next(ids) for _ in range(growth)]
            if len(convs[k]) > 6 * growth:  # the conversation ends; a new one takes its place
                convs[k] = [next(ids)]
            hash_ids = [0, *convs[k]]
            due[k] = i + gap + rng.randrange(-5, 6)
            talks.append(i)
        else:
            hash_ids = [0, next(ids), next(ids), next(ids)]
        out.append(replay.Request(NS.decode(), B * len(hash_ids) + B // 2, hash_ids=[*hash_ids, next(ids)],
                                  timestamp=float(i)))
    trace = replay.Trace("chatty", out, B)
    trace.talks = talks
    return trace


def replay_under_leases(policy: str, seed: int, *, two_namespaces: bool = False,
                        unleased_lookups: bool = True) -> PrefixStore:
    """The chatty trace through a 40-page store under ``policy`` while leases come and go at random, with a
    PFXEVICT of the namespace now and then and (``unleased_lookups``) a lookup without a lease, which
    re-indexes the hit leaf at once. ``two_namespaces``: every 7th request goes to a second namespace, with
    an index of its own. After every request the leased pages are still cached; every 100 requests, and at
    the end, the store is consistent. Returns the store, for what the policy learned."""
    rng = random.Random(seed)
    trace = chatty_trace(requests=600, seed=seed)
    tick = itertools.count(1)
    store = PrefixStore(MemoryArena(1, 40), page_size=B, shards=2, policy=policy,
                        clock=lambda: float(next(tick)), lease_ttl_ms=0)
    leases = {}
    for step, req in enumerate(trace.requests):
        packed = replay.whole_pages(trace, req, B, 40)[0].tobytes()
        ns = NS if step % 7 or not two_namespaces else b"other"
        m = store.match(ns, packed, lease=True, owner=1)
        if m.lease_id:
            leases[m.lease_id] = (ns, packed[: m.matched_tokens * 4])
        try:
            store.insert(ns, packed, offset=m.matched_tokens, owner=1)
        except OutOfMemory:  # everything left may be pinned
            pass
        while len(leases) > rng.randrange(1, 5):
            lease_id = rng.choice(list(leases))
            del leases[lease_id]
            store.release(lease_id, 1)
        if rng.random() < 0.05:  # PFXEVICT on the namespace: its own index, the global policy's learning
            store.evict_pages(NS, rng.randrange(1, 6))
        if unleased_lookups and rng.random() < 0.01:
            store.match(ns, packed, lease=False)
        for leased_ns, toks in leases.values():  # leased pages stay cached
            assert store.cached_tokens(leased_ns, toks) * 4 >= len(toks)
        if step % 100 == 0:
            assert store.check() == []
    assert store.check() == []
    return store
