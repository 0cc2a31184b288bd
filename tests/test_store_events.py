"""KV events, store side: the documented block hashes, and a consumer fed only the events sees the store.

The consumer here is the plainest possible one (a dict of block hash -> parent hash, as vLLM's
routers keep): after any mix of inserts, evictions under memory pressure, PFXEVICT-style drops,
namespace deletion and FLUSHALL with leases kept, its longest prefix of any prompt is the store's.
"""

from __future__ import annotations

import hashlib
import random

import pytest
from pfxcache.daemon.store import MemoryArena, PrefixStore, pack_tokens
from pfxcache.daemon.store.block_hashes import chain, namespace_seed, prompt_hashes, to_ints
from pfxcache.daemon.store.events import EventLog

PS = 4
PB = PS * 4


def documented_hashes(namespace: bytes, ids: list[int]) -> list[int]:
    """The README's definition, written out with hashlib alone."""
    parent = hashlib.blake2b(b"pfxcache-namespace\0" + namespace, digest_size=8).digest()
    out = []
    for i in range(0, len(ids) - len(ids) % PS, PS):
        page = b"".join(t.to_bytes(4, "little") for t in ids[i : i + PS])
        parent = hashlib.blake2b(parent + page, digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


class Consumer:
    """What a router keeps from the events: block hash -> (namespace, parent hash)."""

    def __init__(self) -> None:
        self.blocks: dict[int, tuple[bytes, int | None]] = {}

    def apply(self, events) -> None:
        for event in events:
            if event[0] == "stored":
                _, ns, parent, hashes, tokens = event
                assert len(tokens) == len(hashes) * PB
                assert parent is None or parent in self.blocks, "a run must hang below a known block"
                # The hashes are the documented ones: recomputable from the parent and the tokens.
                start = namespace_seed(ns) if parent is None else parent.to_bytes(8, "big")
                assert hashes == to_ints(chain(start, tokens, PB))
                for h in hashes:
                    assert h not in self.blocks, "stored twice without a removal"
                    self.blocks[h] = (ns, parent)
                    parent = h
            elif event[0] == "removed":
                for h in event[2]:
                    assert h in self.blocks, "removed a block never stored"
                    del self.blocks[h]
            else:
                self.blocks.clear()

    def longest(self, ns: bytes, ids: list[int]) -> int:
        pages = 0
        for h in prompt_hashes(ns, pack_tokens(ids), PB):
            if h not in self.blocks:
                break
            pages += 1
        return pages * PS


def make_store(nblocks: int = 64) -> tuple[PrefixStore, EventLog]:
    store = PrefixStore(MemoryArena(8, nblocks), page_size=PS, shards=4)
    log = EventLog()
    store.set_events(log)
    return store, log


def test_hashes_follow_the_documented_definition():
    ids = list(range(1000, 1000 + 4 * PS + 3))
    assert prompt_hashes(b"tenant-a", pack_tokens(ids), PB) == documented_hashes(b"tenant-a", ids)
    # Same tokens, other namespace: no hash in common.
    assert not set(prompt_hashes(b"tenant-a", pack_tokens(ids), PB)) & set(
        prompt_hashes(b"tenant-b", pack_tokens(ids), PB))
    # A fixed value, so the definition cannot drift unnoticed between releases.
    assert prompt_hashes(b"ns", pack_tokens([1, 2, 3, 4]), PB) == [0x39F951CEF9FA9893]


def test_events_of_one_insert_eviction_and_flush():
    store, log = make_store(nblocks=4)
    ids = list(range(12))  # three pages
    store.insert(b"ns", pack_tokens(ids))
    assert log.events == [("stored", b"ns", None, documented_hashes(b"ns", ids), pack_tokens(ids))]
    log.events.clear()
    store.insert(b"ns", pack_tokens(ids + [50, 51, 52, 53]))  # one more page below the three
    assert log.events == [("stored", b"ns", documented_hashes(b"ns", ids)[-1],
                           documented_hashes(b"ns", ids + [50, 51, 52, 53])[-1:], pack_tokens([50, 51, 52, 53]))]
    log.events.clear()
    store.insert(b"other", pack_tokens([9] * PS))  # the arena is full: evicts one page first
    assert log.events[0] == ("removed", b"ns", documented_hashes(b"ns", ids + [50, 51, 52, 53])[-1:])
    assert log.events[1][0] == "stored"
    log.events.clear()
    lease = store.match(b"ns", pack_tokens(ids[:PS]))  # pins the first page of ns through the flush
    store.flush()
    assert log.events == [("cleared", [b"ns", b"other"]),
                          ("stored", b"ns", None, documented_hashes(b"ns", ids[:PS]), pack_tokens(ids[:PS]))]
    store.release(lease.lease_id, 0)


@pytest.mark.parametrize("seed", range(6))
def test_a_consumer_of_the_events_sees_what_the_store_holds(seed):
    rng = random.Random(seed)
    store, log = make_store(nblocks=48)
    consumer = Consumer()
    namespaces = [b"a", b"b", b"c"]
    stems = [[rng.randrange(100) for _ in range(PS * rng.randint(1, 4))] for _ in range(5)]
    leases = []

    def prompt():
        stem = rng.choice(stems)
        return stem[: PS * rng.randint(0, len(stem) // PS)] + [rng.randrange(100) for _ in range(rng.randint(0, 13))]

    for step in range(300):
        ns = rng.choice(namespaces)
        roll = rng.random()
        if roll < 0.6:
            ids = prompt()
            cached = store.cached_tokens(ns, pack_tokens(ids))
            store.insert(ns, pack_tokens(ids), offset=cached - cached % PS)
        elif roll < 0.7:
            ids = prompt()
            if len(ids) >= PS:
                store.evict_prefix(ns, pack_tokens(ids[: PS * rng.randint(1, len(ids) // PS)]))
        elif roll < 0.72:
            store.evict_all(ns)
        elif roll < 0.75:
            store.keys.delete(ns)  # DEL: pages leases still pin are gone for lookups at once
        elif roll < 0.8:
            store.evict_pages(ns, rng.randint(1, 5))
        elif roll < 0.9:
            result = store.match(ns, pack_tokens(prompt()))
            if result.lease_id:
                leases.append(result.lease_id)
        elif roll < 0.97 and leases:
            store.release(leases.pop(rng.randrange(len(leases))), 0)
        else:
            store.flush()
        consumer.apply(log.events)
        log.events.clear()
        assert store.check() == []
        for _ in range(3):
            ns, ids = rng.choice(namespaces), prompt()
            assert consumer.longest(ns, ids) == store.cached_tokens(ns, pack_tokens(ids)), step
    live = sum(tree.pages for name, rec in store._ns.items() if type(name) is bytes for tree in rec.trees.values())
    assert len(consumer.blocks) == live
    assert store.stats()["evictions"] > 0


def test_no_listener_no_hashes():
    store = PrefixStore(MemoryArena(8, 8), page_size=PS)
    store.insert(b"ns", pack_tokens(list(range(8))))
    assert all(node.page_hashes is None for rec in store._ns.values() for tree in rec.trees.values()
               for node in tree.subtree(tree.root))
