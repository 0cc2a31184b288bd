"""The compact ghost (daemon/store/ghosts.py): the same entries, in the same order, as an OrderedDict of records."""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict

from pfxcache.daemon.store import MemoryArena, PrefixStore
from pfxcache.daemon.store.ghosts import GHOST_MAX, GHOST_MIN, GHOST_PER_LEAF, Ghost
from pfxcache.daemon.store.guard import GuardPolicy
from pfxcache.tools.replay import replay_requests

from test_guard_policy import fooling_trace
from test_replay import B


def test_records_come_back_bit_for_bit():
    ghost = Ghost("qdq?")
    ghost.put(7, 2**62, 0.1 + 0.2, 0, True)
    ghost.put(8, 0, 1e-300, 5, False)
    assert ghost.pop(7) == (2**62, 0.1 + 0.2, 0, True)
    assert ghost.pop(7) is None and 7 not in ghost and len(ghost) == 1
    assert ghost.pop(8) == (0, 1e-300, 5, False)


def test_forgets_exactly_what_an_ordered_dict_forgets():
    """Random puts (new keys and keys put again), pops and trims: same keys, same order, same records."""
    rng = random.Random(15)
    ghost = Ghost("qq")
    model: OrderedDict[int, tuple] = OrderedDict()
    for step in range(20_000):
        key = rng.randrange(600)
        op = rng.random()
        if op < 0.6:
            ghost.put(key, step, -key)
            model[key] = (step, -key)
            model.move_to_end(key)
        elif op < 0.9:
            assert ghost.pop(key) == model.pop(key, None)
        else:
            limit = rng.randrange(400)
            ghost.trim(limit)
            while len(model) > limit:
                model.popitem(last=False)
        assert len(ghost) == len(model)
        # stale slots of the age order never outnumber the live entries by much
        assert len(ghost._order) <= 2 * len(ghost) + 65
    assert ghost.keys() == list(model)
    assert [ghost.pop(k) for k in list(model)] == list(model.values())


def test_guard_ghosts_stay_within_their_bound():
    """reuse's and tempo's ghosts inside the guard: at most max(GHOST_MIN, min(GHOST_PER_LEAF x leaves, GHOST_MAX))."""
    trace = fooling_trace()  # a workload that evicts a lot
    tick = itertools.count(1)
    store = PrefixStore(MemoryArena(1, 64), page_size=B, shards=4, policy="guard",
                        clock=lambda: float(next(tick)), lease_ttl_ms=0)
    replay_requests(store, trace, B, 64)
    guard = store._index.all
    bound = max(GHOST_MIN, min(GHOST_PER_LEAF * guard.live + GHOST_PER_LEAF, GHOST_MAX))
    assert isinstance(guard, GuardPolicy)
    for order in (guard.reuse, guard.tempo):
        assert 0 < len(order._ghost) <= bound
