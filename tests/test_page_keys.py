"""Page-key mode (HASHES): engine page keys instead of token ids, on a real daemon and in process.

A key stands for its page's whole prefix, so every page's bytes here are a function of its key
alone (``payload``) and any answer can be checked: a run served is the keys asked for, in order,
linked one below the other, never a run with a hole, never a wrong byte.
"""

from __future__ import annotations

import hashlib
import random
import signal
import time

import pytest
import redis

from pfxcache.client import PrefixCache
from pfxcache.daemon.store import PrefixStore
from pfxcache.daemon.store.arena import MemoryArena
from pfxcache.daemon.store.errors import BadRequest
from pfxcache.daemon.store.page_keys import key_pages
from pfxcache.testing import start_daemon

PAGE = 4
BLOCK = 64


def payload(keys: list[bytes]) -> bytes:
    return b"".join(hashlib.shake_256(b"page:" + key).digest(BLOCK) for key in keys)


def chain(path: str, n: int) -> list[bytes]:
    """Keys of a prefix chain: key i names the whole path up to page i (as engines chain them)."""
    return [f"{path}/{i}".encode() for i in range(n)]


@pytest.fixture
def daemon():
    d = start_daemon("--page-size", str(PAGE), "--block-bytes", str(BLOCK), "--maxmemory", str(BLOCK * 32))
    r = redis.Redis(host=d.host, port=d.port)
    yield d, r
    r.close()
    d.stop(signal.SIGKILL)


def put(r, ns, keys, offset=0):
    return r.execute_command("PFXSET", ns, "HASHES", len(keys), *keys, *(("OFFSET", offset) if offset else ()),
                             "DATA", payload(keys[offset:]))


def get(r, ns, keys) -> int:
    reply = r.execute_command("PFXGET", ns, "HASHES", len(keys), *keys, "NOLEASE", "WITHDATA")
    matched = reply[b"matched"]
    assert reply.get(b"data", b"") == payload(keys[:matched]), "wrong bytes"
    assert len(reply[b"blocks"]) == matched
    return matched


def test_a_chain_round_trips_with_binary_keys(daemon):
    _, r = daemon
    keys = [b"\x00\xffbin", b"NOLEASE", b"WITHDATA", b"x" * 1024]
    assert put(r, "ns", keys)[b"stored"] == 4
    assert get(r, "ns", keys) == 4
    assert get(r, "ns", keys[:2] + [b"other"]) == 2
    assert r.execute_command("PFXCHECK") == b"OK"


def test_a_lookup_may_start_anywhere_the_namespace_holds_its_first_key(daemon):
    _, r = daemon
    keys = chain("p", 6)
    put(r, "ns", keys)
    assert get(r, "ns", keys[3:]) == 3  # LMCache's exists(key) of one chunk, or a tail
    assert get(r, "ns", [keys[2]]) == 1
    assert get(r, "ns", [keys[2], keys[4]]) == 1  # not linked: the run stops, no hole
    reply = r.execute_command("PFXGET", "ns", "HASHES", 2, keys[4], keys[5])
    assert reply[b"matched"] == 2 and reply[b"lease"] > 0
    r.execute_command("PFXRELEASE", reply[b"lease"])
    assert r.execute_command("PFXCHECK") == b"OK"


def test_a_lone_key_is_stored_and_found(daemon):
    _, r = daemon
    put(r, "ns", [b"lone"])
    assert get(r, "ns", [b"lone"]) == 1
    assert get(r, "ns", [b"lone", b"next"]) == 1
    # only what is missing: the chain grows below the held key
    put(r, "ns", [b"lone", b"next"], offset=1)
    assert get(r, "ns", [b"lone", b"next"]) == 2


def test_the_missing_tail_hangs_below_a_key_held_deep_in_a_chain(daemon):
    _, r = daemon
    keys = chain("q", 4)
    put(r, "ns", keys)
    tail = [keys[3], b"q/4", b"q/5"]
    assert get(r, "ns", tail) == 1
    put(r, "ns", tail, offset=1)
    assert get(r, "ns", keys + tail[1:]) == 6
    assert get(r, "ns", tail) == 3


def test_pfxevict_hashes_drops_the_key_and_what_hangs_below(daemon):
    _, r = daemon
    keys = chain("e", 5)
    put(r, "ns", keys)
    reply = r.execute_command("PFXEVICT", "ns", "HASHES", 3, *keys[:3])
    assert reply[b"evicted"] == 3
    assert get(r, "ns", keys) == 2
    r.execute_command("PFXEVICT", "ns", "HASHES", 1, keys[1])  # from the middle, found by its key
    assert get(r, "ns", keys) == 1


def test_a_namespace_holds_one_kind_of_pages(daemon):
    _, r = daemon
    put(r, "keys", [b"a"])
    r.execute_command("PFXSET", "toks", "TOKENS", 1, 2, 3, 4, "DATA", b"\0" * BLOCK)
    with pytest.raises(redis.ResponseError, match="holds key pages"):
        r.execute_command("PFXGET", "keys", "TOKENS", 1, 2, 3, 4)
    with pytest.raises(redis.ResponseError, match="holds key pages"):
        r.execute_command("PFXSET", "keys", "TOKENS", 1, 2, 3, 4, "DATA", b"\0" * BLOCK)
    with pytest.raises(redis.ResponseError, match="holds token pages"):
        r.execute_command("PFXGET", "toks", "HASHES", 1, b"a")
    with pytest.raises(redis.ResponseError, match="holds token pages"):
        put(r, "toks", [b"a"])
    r.execute_command("DEL", "keys")  # empty again: either kind may move in
    r.execute_command("PFXSET", "keys", "TOKENS", 1, 2, 3, 4, "DATA", b"\0" * BLOCK)
    assert r.execute_command("PFXCHECK") == b"OK"


@pytest.mark.parametrize("args, message", [
    ((), "wrong number of arguments|needs a key count|HASHES key count"),
    ((0, b"a"), "HASHES key count"),
    ((3, b"a", b"b"), "says 3 keys but 2"),
    ((1, b""), "1 to 1024 bytes"),
    ((1, b"x" * 1025), "1 to 1024 bytes"),
    (("two", b"a"), "HASHES key count"),
])
def test_bad_hashes_are_refused_and_change_nothing(daemon, args, message):
    _, r = daemon
    before = r.execute_command("PFXINFO")[b"stats"]
    with pytest.raises(redis.ResponseError, match=message):
        r.execute_command("PFXGET", "ns", "HASHES", *args)
    with pytest.raises(redis.ResponseError):  # the count may take DATA for a key: some other -ERR
        r.execute_command("PFXSET", "ns", "HASHES", *args, "DATA", b"\0" * BLOCK)
    assert r.execute_command("PFXINFO")[b"stats"] == before
    assert r.dbsize() == 0


def test_hashes_needs_a_page_of_at_least_sixteen_bytes():
    d = start_daemon("--page-size", "2", "--block-bytes", str(BLOCK))
    try:
        r = redis.Redis(host=d.host, port=d.port)
        with pytest.raises(redis.ResponseError, match="page-size >= 4"):
            r.execute_command("PFXGET", "ns", "HASHES", 1, b"a")
        r.close()
    finally:
        d.stop()


def test_pressure_evicts_leaf_first_and_runs_never_have_holes(daemon):
    _, r = daemon
    rng = random.Random(3)
    chains = [chain(f"c{i}", rng.randrange(2, 7)) for i in range(40)]  # ~160 pages through 32 blocks
    for keys in chains:
        put(r, "ns", keys)
    for keys in chains:
        got = get(r, "ns", keys)
        start = rng.randrange(len(keys))
        get(r, "ns", keys[start:])  # a run found from any key is still linked, whole, right bytes
        assert got in range(len(keys) + 1)
    assert get(r, "ns", chains[-1]) == len(chains[-1])  # the newest chain is whole
    assert r.execute_command("PFXCHECK") == b"OK"


def test_the_client_library_speaks_hashes(daemon):
    d, _ = daemon
    cache = PrefixCache.from_url(f"redis://{d.host}:{d.port}")
    try:
        keys = chain("lib", 3)
        assert cache.store_keys("ns", keys[:2], payload(keys[:2])).stored == 2
        arena = cache.attach()  # same host: the shared-memory arena, mapped
        allocation = cache.alloc("ns", 1)
        arena.write_from(allocation.blocks, payload(keys[2:]))
        assert cache.commit_keys("ns", keys, allocation, offset=2).stored == 1
        with cache.lookup_keys("ns", keys[1:]) as match:
            assert match.pages == 2 and match.lease
            out = bytearray(2 * BLOCK)
            arena.read_into(match.blocks, out)
            assert bytes(out) == payload(keys[1:])
        assert cache.evict_keys("ns", keys[:1]).evicted == 3
        assert cache.lookup_keys("ns", keys, lease=False).pages == 0
    finally:
        cache.close()


def test_key_pages_reach_the_disk_tier_and_come_back(tmp_path):
    d = start_daemon("--dir", str(tmp_path), "--page-size", str(PAGE), "--block-bytes", "4096",
                     "--maxmemory", str(4096 * 16), "--disk-tier-size", str(4 << 20))
    try:
        r = redis.Redis(host=d.host, port=d.port)
        chains = [chain(f"d{i}", 4) for i in range(12)]  # 48 pages through 16 blocks
        for keys in chains:
            r.execute_command("PFXSET", "ns", "HASHES", 4, *keys, "DATA", b"".join(
                hashlib.shake_256(b"page:" + k).digest(4096) for k in keys))
        deadline = time.monotonic() + 30
        while r.info("tiers")["tier_disk_queue_pages"]:  # the demotions land
            assert time.monotonic() < deadline
            time.sleep(0.02)
        for keys in chains:
            reply = r.execute_command("PFXGET", "ns", "HASHES", 4, *keys, "NOLEASE", "WITHDATA")
            assert reply[b"matched"] == 4
            assert reply[b"data"] == b"".join(hashlib.shake_256(b"page:" + k).digest(4096) for k in keys)
        assert r.info("tiers")["tier_disk_hits"] > 0
        r.close()
    finally:
        d.stop(signal.SIGKILL)


def test_random_chains_in_process_keep_the_store_consistent():
    """A seeded walk over inserts, lookups from any key, evictions and drops: after every step the
    store's invariants hold and every run found is the keys asked for, linked, with their bytes."""
    rng = random.Random(7)
    arena = MemoryArena(BLOCK, 24)
    store = PrefixStore(arena, page_size=PAGE, shards=4, policy="lru")
    page_bytes = PAGE * 4
    chains = [chain(f"r{i}", 6) for i in range(12)]
    for step in range(600):
        keys = rng.choice(chains)
        lo = rng.randrange(len(keys))
        hi = rng.randrange(lo + 1, len(keys) + 1)
        op = rng.random()
        try:
            if op < 0.45:
                store.use_keys(b"ns", True, writing=True)
                packed = key_pages(keys[lo:hi], page_bytes)
                found = store.match(b"ns", packed, lease=False).matched_tokens // PAGE
                if found < hi - lo:
                    store.insert(b"ns", packed, offset=found * PAGE, data=payload(keys[lo + found:hi]))
            elif op < 0.9:
                store.use_keys(b"ns", True)
                result = store.match(b"ns", key_pages(keys[lo:hi], page_bytes), lease=False)
                n = result.matched_tokens // PAGE
                assert arena.read(result.blocks) == payload(keys[lo:lo + n])
            elif op < 0.97:
                store.evict_prefix(b"ns", key_pages(keys[lo:hi], page_bytes))
            else:
                store.evict_pages(b"ns", rng.randrange(1, 8))
        except BadRequest:
            raise
        except Exception as exc:  # noqa: BLE001 - only a full arena may refuse a write
            assert type(exc).__name__ in ("OutOfMemory", "NoPrefix"), exc
        assert store.check() == [], f"step {step}"


def test_blocks_allocated_first_can_become_key_pages(daemon):
    """PFXALLOC into a namespace that holds nothing yet, then PFXSET HASHES BLOCKS (a zero-copy writer's
    first store): the lease alone does not make it a namespace of token pages."""
    _, r = daemon
    allocation = r.execute_command("PFXALLOC", "fresh", 2)
    blocks = allocation[b"blocks"]
    reply = r.execute_command("PFXSET", "fresh", "HASHES", 2, b"a", b"b", "BLOCKS", *blocks)
    assert reply[b"stored"] == 2
    r.execute_command("PFXRELEASE", allocation[b"lease"])
    assert r.execute_command("PFXGET", "fresh", "HASHES", 2, b"a", b"b", "NOLEASE")[b"matched"] == 2
