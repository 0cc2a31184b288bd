"""The block allocator moves runs and scattered sets of blocks without per-block Python loops:
a seeded random walk against a plain per-block model, plus the refusals that guard the free stack."""

from __future__ import annotations

import random

import pytest

from pfxcache.daemon.store.allocator import FREE, LEASED, TREE, BlockAllocator


def test_random_walk_matches_a_per_block_model():
    rng = random.Random(11)
    alloc = BlockAllocator(3000)
    model = {b: FREE for b in range(3000)}
    held: list[int] = []
    for step in range(600):
        free = sum(1 for s in model.values() if s == FREE)
        action = rng.random()
        if action < 0.45 and free:
            n = min(free, rng.choice([1, 2, 7, 63, 64, 65, 300]))
            ids = alloc.take(n, LEASED)
            assert len(set(ids)) == n and all(model[b] == FREE for b in ids)
            for b in ids:
                model[b] = LEASED
            held += ids
        elif action < 0.7 and held:
            # Some leased blocks become tree blocks: a run (a slice of what take gave) or a scattered sample.
            k = rng.choice([1, 3, 64, 200])
            chosen = held[: min(k, len(held))] if rng.random() < 0.5 else rng.sample(held, min(k, len(held)))
            chosen = [b for b in chosen if model[b] == LEASED]
            alloc.move(chosen, LEASED, TREE)
            for b in chosen:
                model[b] = TREE
        elif held:
            k = rng.choice([1, 2, 10, 64, 100, 500])
            chosen = rng.sample(held, min(k, len(held))) if rng.random() < 0.5 else held[-min(k, len(held)) :]
            alloc.release(chosen)
            gone = set(chosen)
            held = [b for b in held if b not in gone]
            for b in chosen:
                model[b] = FREE
        assert (alloc.free_count, alloc.count(TREE), alloc.count(LEASED)) == (
            sum(1 for s in model.values() if s == FREE),
            sum(1 for s in model.values() if s == TREE),
            sum(1 for s in model.values() if s == LEASED),
        ), step
        if step % 50 == 0:
            assert all(alloc.state(b) == s for b, s in model.items())
            assert alloc.check() == []
    assert all(alloc.state(b) == s for b, s in model.items())
    assert alloc.check() == []


@pytest.mark.parametrize("n", [1, 5, 64, 200])
def test_refusals_leave_the_allocator_unchanged(n):
    alloc = BlockAllocator(1000)
    ids = alloc.take(n, LEASED)
    before = (alloc.free_count, alloc.count(LEASED), [alloc.state(b) for b in range(1000)])
    with pytest.raises(RuntimeError, match="freed twice"):
        alloc.release([*ids, alloc.nblocks - 1])  # a free block among held ones
    if n > 1:
        with pytest.raises(RuntimeError, match="duplicate"):
            alloc.release([*ids[:-1], ids[0]])  # n ids spanning a run's size, one repeated
        with pytest.raises(RuntimeError, match="duplicate"):
            alloc.move([*ids[:-1], ids[0]], LEASED, TREE)
    with pytest.raises(RuntimeError, match="expected tree"):
        alloc.move(ids, TREE, LEASED)
    assert (alloc.free_count, alloc.count(LEASED), [alloc.state(b) for b in range(1000)]) == before
    alloc.release(ids)
    assert alloc.free_count == 1000 and alloc.check() == []
