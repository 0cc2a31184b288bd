"""Honest memory figures: the arena, the metadata and the process reported apart, and a start-up that
does not grow with the block count.

The allocator is checked against the plain free stack it replaced (same ids, in the same order); the
INFO memory figures against what a real daemon holds (its PFXINFO counts, its /proc status).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import redis
from pfxcache.daemon.store.allocator import FREE, LEASED, TREE, BlockAllocator
from pfxcache.testing import start_daemon


class StackAllocator:
    """The reference: every id on a Python list, ``nblocks-1`` at the bottom (the former allocator)."""

    def __init__(self, nblocks: int) -> None:
        self.free = list(range(nblocks - 1, -1, -1))

    def take(self, n: int) -> list[int]:
        ids = self.free[len(self.free) - n:]
        del self.free[len(self.free) - n:]
        return ids[::-1]

    def release(self, ids: list[int]) -> None:
        self.free.extend(ids)


@pytest.mark.parametrize("seed", range(4))
def test_allocator_hands_out_what_a_full_free_stack_would(seed):
    rng = random.Random(seed)
    nblocks = rng.choice([1, 7, 64, 1000])
    ours, reference = BlockAllocator(nblocks), StackAllocator(nblocks)
    held: list[int] = []
    for _ in range(400):
        if held and (rng.random() < 0.45 or ours.free_count == 0):
            rng.shuffle(held)
            k = rng.randint(1, len(held))
            back, held = held[:k], held[k:]
            ours.release(back)
            reference.release(back)
        else:
            n = rng.randint(0, ours.free_count)
            got = ours.take(n, rng.choice([LEASED, TREE]))
            assert got == reference.take(n)
            held += got
        assert ours.free_count == len(reference.free) == nblocks - len(held)
        assert ours.check() == []
    assert sorted(held + reference.free) == list(range(nblocks))


def test_allocator_refuses_double_frees_and_overdraws():
    alloc = BlockAllocator(4)
    ids = alloc.take(3)
    alloc.release(ids[:1])
    with pytest.raises(RuntimeError, match="freed twice"):
        alloc.release(ids[:1])
    with pytest.raises(RuntimeError, match="requested"):
        alloc.take(3)
    with pytest.raises(RuntimeError, match="freed twice"):
        alloc.release([3])  # never handed out: free already
    assert alloc.check() == [] and alloc.count(FREE) == 2


def test_allocator_costs_a_byte_per_block_until_blocks_come_back():
    n = 1 << 22
    alloc = BlockAllocator(n)
    assert alloc.metadata_bytes < n + 4096  # the state array, no per-block Python ints
    alloc.release(alloc.take(1000))
    assert alloc.metadata_bytes < n + 4096 + 8 * 1000


# -- the daemon's INFO memory ------------------------------------------------------------------------


def _map(reply) -> dict:
    if isinstance(reply, dict):
        return {(k.decode() if isinstance(k, bytes) else k): v for k, v in reply.items()}
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


@pytest.fixture
def daemons():
    started = []

    def start(*args):
        instance = start_daemon(*args)
        started.append(instance)
        return instance

    yield start
    for instance in started:
        assert instance.stop() == 0, instance.log_text()


def test_info_memory_reports_arena_metadata_and_process_apart(daemons):
    bb, ps, nblocks = 1024, 4, 512
    daemon = daemons("--maxmemory", str(nblocks * bb), "--page-size", str(ps), "--block-bytes", str(bb),
                     "--evict-low-watermark", "0")
    client = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    try:
        empty = client.info("memory")
        assert empty["used_memory_arena"] == nblocks * bb == empty["maxmemory"]
        assert empty["used_memory_dataset"] == 0
        assert empty["used_memory"] == empty["used_memory_dataset"] + empty["used_memory_overhead"]
        assert 0 < empty["used_memory_startup"] <= empty["used_memory_overhead"] < empty["used_memory_rss"]
        assert empty["used_memory_peak"] >= empty["used_memory"]
        rng = np.random.default_rng(0)
        for i in range(300):  # 300 one-page sequences, each its own node
            tokens = np.array([i, 1, 2, 3], "<u4").tobytes()
            client.execute_command("PFXSET", "mem", "PACKED", tokens, "DATA", rng.bytes(bb))
        full = client.info("memory")
        stats = _map(_map(client.execute_command("PFXINFO"))["stats"])
        assert stats["pages"] == 300
        assert full["used_memory_dataset"] == stats["blocks_used"] * bb == 300 * bb
        assert full["used_memory"] == full["used_memory_dataset"] + full["used_memory_overhead"]
        assert full["used_memory_metadata"] == full["used_memory_overhead"] - full["used_memory_startup"]
        assert full["used_memory_metadata"] > empty["used_memory_metadata"]
        assert float(full["used_memory_metadata_per_page"]) == pytest.approx(
            full["used_memory_metadata"] / 300, abs=0.1)
        # The daemon wrote the DATA into the shared arena itself: those pages are resident in it.
        assert full["used_memory_arena_rss"] >= 300 * bb
        assert full["used_memory_peak"] >= full["used_memory"]
        assert float(full["mem_fragmentation_ratio"]) == pytest.approx(
            full["used_memory_rss"] / full["used_memory"], abs=0.01)
    finally:
        client.close()


def test_start_up_does_not_grow_with_the_block_count(daemons):
    """33.5 M blocks of 8 bytes (the README tour's geometry) cost the start-up heap 1 byte each, not ~40."""
    tiny = daemons("--arena", "memory", "--maxmemory", str(1 << 20), "--page-size", "4", "--block-bytes", "8")
    huge = daemons("--arena", "memory", "--maxmemory", str(256 << 20), "--page-size", "4", "--block-bytes", "8")
    figures = []
    for daemon in (tiny, huge):
        client = redis.Redis(host=daemon.host, port=daemon.port)
        figures.append(client.info("memory"))
        client.close()
    blocks = ((256 << 20) - (1 << 20)) // 8
    grown = figures[1]["used_memory_startup"] - figures[0]["used_memory_startup"]
    assert grown < 2 * blocks, f"start-up heap grew by {grown / blocks:.1f} bytes per block"
    assert figures[1]["used_memory_rss"] < 400 << 20
