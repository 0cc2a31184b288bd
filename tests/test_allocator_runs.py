"""The block allocator moves runs and scattered sets of blocks without per-block Python loops:
seeded random walks against plain per-block models (states; the exact reuse order of a stack of
single ids), BlockRun's rules, and the refusals that guard the free stack."""

from __future__ import annotations

import random
from array import array

import pytest

from pfxcache.daemon.store.allocator import FREE, LEASED, TREE, BlockAllocator
from pfxcache.daemon.store.block_ids import BlockRun


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


def test_the_stack_of_runs_reuses_ids_in_exactly_last_in_first_out_order():
    """Whatever mix of runs (BlockRun), plain arrays and lists goes back, the ids come out again in the
    order a stack of single ids would give them: a seeded walk against that model."""
    rng = random.Random(45)
    alloc = BlockAllocator(5000)
    stack: list[int] = []  # the model: returned ids, the last reused first
    fresh = 0
    held: list = []  # what was taken, as taken (BlockRun, array or list)
    for step in range(800):
        action = rng.random()
        if action < 0.5 and alloc.free_count:
            n = min(alloc.free_count, rng.choice([1, 2, 3, 17, 63, 64, 65, 200, 700]))
            packed = rng.random() < 0.7
            ids = alloc.take(n, rng.choice([LEASED, TREE]), packed=packed)
            reuse = min(n, len(stack))
            expected = stack[len(stack) - reuse :][::-1] + list(range(fresh, fresh + n - reuse))
            del stack[len(stack) - reuse :]
            fresh += n - reuse
            assert list(ids) == expected, step
            if packed and reuse == 0:
                assert type(ids) is BlockRun and ids.runs is None, step  # fresh blocks: one run
            if type(ids) is BlockRun:  # its runs are its ids
                assert [b for s, c, d in ids.pieces() for b in range(s, s + c * d, d)] == expected, step
            held.append(ids)
        elif held:
            ids = held.pop(rng.randrange(len(held)))
            cut = rng.random()
            if type(ids) is BlockRun and len(ids) > 2 and cut < 0.4:  # a node trimmed: its tail goes first
                k = rng.randrange(1, len(ids))
                tail = ids[len(ids) - k :]
                del ids[len(ids) - k :]
                assert type(tail) is BlockRun and type(ids) is BlockRun
                for part in (tail, ids):
                    assert [b for s, c, d in part.pieces() for b in range(s, s + c * d, d)] == list(part), step
                alloc.release(tail)
                stack += list(tail)
                held.append(ids)
                continue
            if cut < 0.6 and type(ids) is BlockRun:
                batch = [ids] + [held.pop() for _ in range(min(len(held), rng.randrange(3)))
                                 if held and type(held[-1]) is BlockRun]
                alloc.release_runs(batch)
                for run in batch:
                    stack += list(run)
                continue
            shape = rng.choice([list, lambda x: array("q", x), lambda x: x])
            alloc.release(shape(ids))
            stack += list(ids)
        assert alloc.free_count == len(stack) + 5000 - fresh, step
        if step % 40 == 0:
            assert alloc.stack().tolist() == stack, step
            assert alloc.check() == [], step
    assert alloc.stack().tolist() == stack
    assert alloc.check() == []


def test_a_run_frees_and_moves_as_one_entry_and_refuses_a_double_free():
    alloc = BlockAllocator(100_000)
    run = alloc.take(50_000, LEASED, packed=True)
    assert type(run) is BlockRun and run[0] == 0 and run[-1] == 49_999
    alloc.move(run, LEASED, TREE)
    assert alloc.count(TREE) == 50_000
    with pytest.raises(RuntimeError, match="is tree, expected leased"):
        alloc.move(run, LEASED, TREE)
    alloc.release(run[:20_000])
    alloc.release(run[20_000:])  # one run continues the other: still one stack entry
    assert len(alloc._free) == 1 and alloc.free_count == 100_000
    before = (alloc.free_count, alloc.stack().tolist())
    with pytest.raises(RuntimeError, match="freed twice"):
        alloc.release(run[10:20])
    with pytest.raises(RuntimeError, match="freed twice"):
        alloc.release_runs([run[5:9]])
    assert (alloc.free_count, alloc.stack().tolist()) == before and alloc.check() == []
    again = alloc.take(30_000, TREE, packed=True)  # the top of the stack, the other way round
    assert type(again) is BlockRun and again[0] == 49_999 and again[-1] == 20_000


def test_a_release_of_overlapping_runs_is_refused_with_nothing_changed():
    alloc = BlockAllocator(10_000)
    ids = alloc.take(4000, TREE)
    twice = array("q", ids[:2000] + ids[1000:3000])  # two runs that overlap: 1,000 ids repeated
    before = [alloc.state(b) for b in range(10_000)]
    with pytest.raises(RuntimeError, match="duplicate"):
        alloc.release(twice)
    assert [alloc.state(b) for b in range(10_000)] == before and alloc.check() == []


def test_a_block_run_only_loses_ids_at_its_ends():
    run = BlockRun.of(100, 10, -1)
    assert run == list(range(100, 90, -1)) and run.step == -1
    assert type(run[2:5]) is BlockRun and type(run[::-1]) is BlockRun and type(run[::2]) is not BlockRun
    for change in (lambda r: r.append(5), lambda r: r.extend([1]), lambda r: r.__setitem__(0, 7),
                   lambda r: r.__delitem__(slice(3, 5)), lambda r: r.insert(0, 1), lambda r: r.pop(3),
                   lambda r: r.frombytes(b"\0" * 8)):
        with pytest.raises(TypeError):
            change(run)
    del run[8:]
    del run[:2]
    assert run == [98, 97, 96, 95, 94, 93]
