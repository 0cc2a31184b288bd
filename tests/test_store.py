"""The store core: arena, allocator, radix tree, leases, policies and the PrefixStore facade."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from pfxcache.daemon.store import (
    LEASED,
    POLICIES,
    TREE,
    BadRequest,
    BlockAllocator,
    MemoryArena,
    NoPrefix,
    OutOfMemory,
    PrefixStore,
    ShmArena,
    StoreError,
    pack_tokens,
    unpack_tokens,
)
from pfxcache.daemon.store.quotas import QuotaBook

import research_support  # noqa: F401 - scripts/ on sys.path: the research package
from research import policies as research_policies

# The state machines below draw their policy from the registry: every policy, research ones included,
# whichever other test modules this run collected (registering is idempotent).
research_policies.register()

PS = 4  # tokens per page in these tests
BB = 16  # bytes per block


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def seq(*pages: int, tail: int = 0) -> bytes:
    """Tokens of whole pages; page v is [v, v, v, v]; ``tail`` extra tokens make a partial page."""
    ids = [v for v in pages for _ in range(PS)] + [7777] * tail
    return pack_tokens(ids)


def page_data(tokens: bytes, page: int, block_bytes: int = BB) -> bytes:
    """Data of a page derived from its whole prefix (as KV data is), so every read is checkable."""
    return hashlib.blake2b(tokens[: (page + 1) * PS * 4], digest_size=block_bytes).digest()


def data_for(tokens: bytes, offset_pages: int = 0, block_bytes: int = BB) -> bytes:
    npages = len(tokens) // (PS * 4)
    return b"".join(page_data(tokens, i, block_bytes) for i in range(offset_pages, npages))


def make(nblocks: int = 64, *, policy: str = "hybrid", shards: int = 4, ttl: int = 30000, **kw):
    clock = FakeClock()
    store = PrefixStore(MemoryArena(BB, nblocks), page_size=PS, shards=shards, policy=policy,
                        lease_ttl_ms=ttl, clock=clock, **kw)
    return store, clock


def put(store, ns: bytes, tokens: bytes, offset_pages: int = 0, owner: int = 0):
    return store.insert(ns, tokens, offset=offset_pages * PS, data=data_for(tokens, offset_pages), owner=owner)


def assert_data(store, tokens: bytes, blocks: list[int]) -> None:
    assert store.arena.read(blocks) == b"".join(page_data(tokens, i) for i in range(len(blocks)))


def snapshot(store):
    return store.stats(), store.namespaces()


# -- arena and allocator -------------------------------------------------------------------------


def test_arena_read_write_vectorised():
    with MemoryArena(4, 8) as arena:
        arena.write([5, 1, 3], b"aaaabbbbcccc")
        assert arena.read([1, 3, 5]) == b"bbbbccccaaaa"
        assert arena.read([]) == b""
        out = bytearray(8)
        arena.read_into([3, 1], out)
        assert bytes(out) == b"ccccbbbb"
        assert bytes(arena.view(5)) == b"aaaa"
        for bad in ([8], [-1]):
            with pytest.raises(BadRequest):
                arena.read(bad)
        with pytest.raises(BadRequest):
            arena.write([0], b"abc")
        assert arena.describe()["size"] == 32


def test_allocator_states():
    alloc = BlockAllocator(4)
    ids = alloc.take(3, LEASED)
    assert ids == [0, 1, 2]
    alloc.move(ids[:2], LEASED, TREE)
    assert (alloc.count(TREE), alloc.count(LEASED), alloc.free_count) == (2, 1, 1)
    alloc.release([ids[2]])
    with pytest.raises(RuntimeError):
        alloc.release([ids[2]])
    assert alloc.check() == []


def test_shm_arena_shared_with_another_process():
    name = f"pfxcachetest-{os.getpid()}-1"
    arena = ShmArena(8, 4, name=name)
    try:
        arena.write([2], b"parent!!")
        code = (
            "from pfxcache.daemon.store import ShmArena\n"
            f"a = ShmArena.attach({name!r}, 8)\n"
            "assert a.nblocks == 4\n"
            "print(a.read([2]).decode())\n"
            "a.write([0, 3], b'child...CHILD...')\n"
            "a.close()\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "parent!!"
        assert arena.read([0, 3]) == b"child...CHILD..."
        assert os.path.exists(f"/dev/shm/{name}")  # attach+close in the child did not unlink it
        assert arena.describe()["backend"] == "shm"
    finally:
        arena.close()
    assert not os.path.exists(f"/dev/shm/{name}")


def test_shm_stale_cleanup():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"/dev/shm/pfxcachetest-{dead.pid}-7000"
    # Our own pid in the name of a file nobody holds: a leftover of an earlier life with the same
    # pid (PID 1 in a restarted container). The lock decides (issue 12), not the pid.
    leftover = f"/dev/shm/pfxcachetest-{os.getpid()}-7001"
    for path in (stale, leftover):
        with open(path, "wb") as f:
            f.write(b"x")
    live = ShmArena(8, 4, name=f"pfxcachetest-{os.getpid()}-7002")  # held locked while it lives
    try:
        removed = ShmArena.cleanup_stale(prefix="pfxcachetest-")
        assert sorted(removed) == sorted(os.path.basename(p) for p in (stale, leftover))
        assert not os.path.exists(stale) and not os.path.exists(leftover)
        assert os.path.exists(live.path)
    finally:
        live.close()
        for path in (stale, leftover):
            if os.path.exists(path):
                os.unlink(path)


# -- match / insert ----------------------------------------------------------------------------------


def test_insert_match_split_and_data():
    store, _ = make()
    r = put(store, b"ns", seq(1, 2, 3, 4))
    assert (r.stored, r.existing, len(r.blocks)) == (4, 0, 4)
    m = store.match(b"ns", seq(1, 2, 9), lease=False)
    assert m.matched_tokens == 2 * PS and m.blocks == r.blocks[:2] and m.lease_id == 0
    assert_data(store, seq(1, 2, 3, 4), m.blocks)
    r2 = put(store, b"ns", seq(1, 2, 5))
    assert (r2.stored, r2.existing) == (1, 2)
    assert r2.blocks[:2] == r.blocks[:2]
    assert store.stats(b"ns")["nodes"] == 3  # [1 2] split from [3 4], plus [5]
    full = store.match(b"ns", seq(1, 2, 3, 4, tail=3), lease=False)
    assert full.matched_tokens == 4 * PS
    s = store.stats(b"ns")
    assert s["hits_tokens"] == 6 * PS and s["misses_tokens"] == PS + 3  # page 9 of the first, tail of the last
    assert store.check() == []


def test_page_alignment_and_bad_input_change_nothing():
    store, _ = make()
    put(store, b"ns", seq(1, 2))
    before = snapshot(store)
    with pytest.raises(BadRequest):
        store.match(b"ns", b"abc")  # not whole uint32s
    with pytest.raises(BadRequest):
        store.insert(b"ns", seq(1, 2, 3), offset=2, data=b"")
    with pytest.raises(BadRequest):
        store.insert(b"ns", seq(1, 2, 3), offset=4 * PS, data=b"")  # beyond the whole pages
    with pytest.raises(BadRequest):
        store.insert(b"ns", seq(1, 2, 3), data=b"x" * (3 * BB - 1))
    with pytest.raises(BadRequest):
        store.insert("ns", seq(1), data=b"x" * BB)
    with pytest.raises(BadRequest):
        store.alloc(b"ns", 0)
    with pytest.raises(BadRequest):
        store.set_policy("fifo")
    assert snapshot(store) == before
    assert store.data_size(seq(1, 2, 3, tail=2), PS) == 2 * BB
    r = store.insert(b"ns", seq(1, 2, 3, tail=2), data=data_for(seq(1, 2, 3)))  # the partial page is not cached
    assert r.stored == 1 and store.cached_tokens(b"ns", seq(1, 2, 3, 4)) == 3 * PS
    assert store.check() == []


def test_namespaces_are_isolated():
    store, _ = make()
    put(store, b"a", seq(1, 2))
    assert store.match(b"b", seq(1, 2)).matched_tokens == 0
    rb = put(store, b"b", seq(1, 2))
    assert rb.stored == 2  # b has its own pages
    ra = store.match(b"a", seq(1, 2), lease=False)
    assert set(ra.blocks).isdisjoint(rb.blocks)
    store.evict_all(b"a")
    assert store.match(b"b", seq(1, 2), lease=False).matched_tokens == 2 * PS
    assert store.stats(b"a")["pages"] == 0 and store.stats(b"b")["pages"] == 2
    assert store.namespaces() == [b"b"]  # emptied by evict_all: gone, like a deleted key
    assert store.stats()["misses_tokens"] == 2 * PS  # the miss on b before it existed still counts
    assert store.check() == []


def test_no_prefix():
    store, _ = make()
    put(store, b"ns", seq(1))
    before = snapshot(store)
    with pytest.raises(NoPrefix) as err:
        store.insert(b"ns", seq(1, 2, 3), offset=2 * PS, data=data_for(seq(1, 2, 3), 2))
    assert err.value.code == "NOPREFIX" and isinstance(err.value, StoreError)
    assert snapshot(store) == before
    r = put(store, b"ns", seq(1, 2), offset_pages=1)
    assert (r.stored, r.existing) == (1, 0)
    assert_data(store, seq(1, 2), r.blocks)
    assert store.check() == []


# -- pins, leases, eviction ------------------------------------------------------------------------


def test_pins_prevent_eviction_and_oom_changes_nothing():
    store, _ = make(8)
    put(store, b"ns", seq(1, 2, 3, 4))
    put(store, b"ns", seq(5, 6, 7, 8))
    m1 = store.match(b"ns", seq(1, 2, 3, 4))
    m2 = store.match(b"ns", seq(5, 6, 7, 8))
    assert m1.lease_id and m2.lease_id and m1.lease_id != m2.lease_id
    before = snapshot(store)
    with pytest.raises(OutOfMemory) as err:
        store.alloc(b"ns", 1)
    assert err.value.code == "OOM"
    with pytest.raises(OutOfMemory):
        store.insert(b"ns", seq(9), data=data_for(seq(9)))
    assert snapshot(store) == before
    assert store.evict_all(b"ns") == (0, 0, 8)
    assert store.release([m1.lease_id], owner=0) == 1
    a = store.alloc(b"ns", 3)  # evicts 3 pages of the unpinned sequence, leaf first
    assert len(a.blocks) == 3
    assert store.cached_tokens(b"ns", seq(1, 2, 3, 4)) == 1 * PS
    assert store.cached_tokens(b"ns", seq(5, 6, 7, 8)) == 4 * PS
    assert_data(store, seq(5, 6, 7, 8), m2.blocks)
    assert store.check() == []


def test_pinning_the_cached_prefix_counts_against_room():
    store, _ = make(4)
    put(store, b"ns", seq(1, 2, 3, 4))  # the arena is full, every page evictable
    before = snapshot(store)
    with pytest.raises(OutOfMemory):  # the new page could only come from the prefix it extends
        put(store, b"ns", seq(1, 2, 3, 4, 5))
    assert snapshot(store) == before and store.check() == []
    r = put(store, b"ns", seq(1, 2, 6))  # evicts just page 4; pages 1 2 are pinned meanwhile
    assert (r.stored, r.existing) == (1, 2)
    assert store.cached_tokens(b"ns", seq(1, 2, 3, 4)) == 3 * PS
    assert_data(store, seq(1, 2, 6), r.blocks)
    assert store.check() == []


def test_leaf_first_eviction_one_page_at_a_time():
    store, _ = make(policy="lru")
    put(store, b"ns", seq(1, 2, 3, 4))
    put(store, b"ns", seq(1, 2, 5, 6))
    for left in range(5, -1, -1):
        assert store.evict_pages(b"ns", 1).evicted == 1
        assert store.stats(b"ns")["pages"] == left
        # a page never goes while a longer cached page depends on it
        a = store.cached_tokens(b"ns", seq(1, 2, 3, 4)) // PS
        b = store.cached_tokens(b"ns", seq(1, 2, 5, 6)) // PS
        if max(a, b) > 2:  # the shared pages [1 2] stay while anything below them is cached
            assert min(a, b) >= 2
        assert left == (0 if max(a, b) == 0 else max(a, b) + max(0, min(a, b) - 2) if min(a, b) >= 2 else max(a, b))
        assert store.check() == []
    assert store.evict_pages(b"ns", 1).evicted == 0


def test_lease_ttl_expiry_and_release_owner():
    store, clock = make(16, ttl=1000)
    put(store, b"ns", seq(1, 2))
    short = store.match(b"ns", seq(1, 2), ttl_ms=100, owner=7)
    default = store.match(b"ns", seq(1), owner=7)
    forever = store.match(b"ns", seq(1, 2), ttl_ms=0, owner=8)
    store.alloc(b"ns", 2, ttl_ms=500, owner=8)
    assert store.stats()["leases"] == 4 and store.stats()["blocks_leased"] == 2
    clock.now += 0.2
    assert store.expire() == 1
    assert store.release([short.lease_id], 7) == 0  # gone already
    clock.now += 0.4
    assert store.expire() == 1  # the alloc lease: its blocks are free again
    assert store.stats()["blocks_leased"] == 0
    assert store.release([default.lease_id, forever.lease_id, 12345], 7) == 1  # not 8's lease
    clock.now += 1000
    assert store.expire() == 0
    assert store.release_owner(8) == 1
    assert store.stats()["leases"] == 0 and store.stats()["pinned_pages"] == 0
    assert store.check() == []
    ids = [store.match(b"ns", seq(1)).lease_id for _ in range(3)]
    # Random, so that an id tells nothing about others' leases; never one still in use.
    assert len({*ids, short.lease_id, default.lease_id, forever.lease_id}) == 6


def test_evict_prefix_semantics():
    store, _ = make()
    for s in (seq(1, 2, 3), seq(1, 2, 4), seq(1, 5), seq(6)):
        put(store, b"ns", s)
    r = store.evict_prefix(b"ns", seq(1, 2, tail=1))  # forgets page 2 and all below it
    assert r == (3, 3 * BB, 0)
    assert store.cached_tokens(b"ns", seq(1, 2)) == PS
    assert store.cached_tokens(b"ns", seq(1, 5)) == 2 * PS
    assert store.evict_prefix(b"ns", seq(9)) == (0, 0, 0)
    put(store, b"ns", seq(7, 8, 9, 10))  # one edge: the prefix ends inside it
    assert store.evict_prefix(b"ns", seq(7, 8, 9)).evicted == 2
    assert store.cached_tokens(b"ns", seq(7, 8, 9, 10)) == 2 * PS
    assert store.evict_prefix(b"ns", seq(7, 8, 9)) == (0, 0, 0)
    assert store.evict_prefix(b"ns", seq(7)).evicted == 2
    put(store, b"ns", seq(1, 2, 3, 4))
    m = store.match(b"ns", seq(1, 2, 3))
    r = store.evict_prefix(b"ns", seq(1, 2))
    assert r.evicted == 1 and r.pinned == 2  # page 4 goes, pages 2 and 3 are leased
    assert store.cached_tokens(b"ns", seq(1, 2, 3, 4)) == 3 * PS
    with pytest.raises(BadRequest):
        store.evict_prefix(b"ns", seq(tail=3))
    store.release([m.lease_id], 0)
    assert store.evict_prefix(b"ns", seq(1)).evicted == 4
    assert store.cached_tokens(b"ns", seq(6)) == PS
    assert store.check() == []


def test_blocks_ownership_transfer_and_duplicates():
    store, _ = make(16)
    put(store, b"ns", seq(1, 2))
    tokens = seq(1, 2, 3, 4)
    a = store.alloc(b"ns", 4, owner=5)
    store.arena.write(a.blocks, data_for(tokens))
    with pytest.raises(BadRequest):
        store.insert(b"ns", tokens, blocks=a.blocks, owner=6)  # another connection's blocks
    with pytest.raises(BadRequest):
        store.insert(b"ns", tokens, blocks=a.blocks[:3], owner=5)  # one per page
    with pytest.raises(BadRequest):
        store.insert(b"ns", tokens, blocks=[a.blocks[0]] * 4, owner=5)
    free_before = store.stats()["blocks_free"]
    r = store.insert(b"ns", tokens, blocks=a.blocks, owner=5)
    assert (r.stored, r.existing) == (2, 2)
    assert r.blocks[2:] == a.blocks[2:]  # new pages took the writer's blocks
    assert store.stats()["blocks_free"] == free_before + 2  # the duplicates' blocks went back
    assert_data(store, tokens, r.blocks)
    assert store.stats()["blocks_leased"] == 0
    assert store.release([a.lease_id], 5) == 1  # the (now empty) lease still ends cleanly
    assert store.check() == []
    # offset + blocks: one id per page from the offset
    b = store.alloc(b"ns", 1, owner=5)
    store.arena.write(b.blocks, page_data(seq(1, 2, 3, 4, 5), 4))
    r = store.insert(b"ns", seq(1, 2, 3, 4, 5), offset=4 * PS, blocks=b.blocks, owner=5)
    assert r.stored == 1
    assert_data(store, seq(1, 2, 3, 4, 5), r.blocks)
    assert store.check() == []


def test_two_phase_inserts_racing():
    store, _ = make(16)
    long, short = seq(1, 2, 3, 4), seq(1, 2, 3)
    p1 = store.begin_insert(b"ns", long)
    p2 = store.begin_insert(b"ns", short)
    assert p1.new_pages == range(4) and p1.copy_needed
    assert store.stats()["blocks_leased"] == 7 and store.check() == []
    store.arena.write(p2.new_blocks, p2.new_data(data_for(short)))
    store.arena.write(p1.new_blocks, p1.new_data(data_for(long)))
    r2 = store.commit_insert(p2)
    r1 = store.commit_insert(p1)
    assert (r2.stored, r1.stored, r1.existing) == (3, 1, 3)
    assert r1.blocks[:3] == r2.blocks
    assert store.stats()["blocks_used"] == 4 and store.stats()["blocks_leased"] == 0
    assert_data(store, long, r1.blocks)
    with pytest.raises(BadRequest):
        store.commit_insert(p1)
    p3 = store.begin_insert(b"ns", seq(1, 2, 9, 9), offset=2 * PS)
    assert p3.existing == 0 and p3.new_pages == range(2)
    assert store.stats(b"ns")["pinned_pages"] == 2  # the prefix is pinned while the data is copied
    store.abort_insert(p3)
    store.abort_insert(p3)  # idempotent
    assert store.stats()["blocks_used"] == 4 and store.stats()["pinned_pages"] == 0
    assert store.check() == []


def test_policy_switching_keeps_the_index_consistent():
    store, _ = make()
    for v in range(6):
        put(store, b"ns", seq(v, v + 1))
    store.match(b"ns", seq(2, 3))
    for name in ("lru", "lfu", "hybrid", "lru"):
        store.set_policy(name)
        assert store.policy == name and store.stats()["policy"] == name
        assert store.check() == []
    assert store.evict_pages(b"ns", 3).evicted == 3
    assert store.check() == []


def test_lfu_really_counts_hits():
    def run(policy):
        store, clock = make(policy=policy)
        put(store, b"ns", seq(1))
        put(store, b"ns", seq(2))
        for _ in range(5):
            clock.now += 1
            store.match(b"ns", seq(1), lease=False)
        clock.now += 10
        store.match(b"ns", seq(2), lease=False)
        clock.now += 1
        store.evict_pages(b"ns", 1)
        return store.cached_tokens(b"ns", seq(1)), store.cached_tokens(b"ns", seq(2))

    assert run("lru") == (0, PS)  # the hot but older prefix goes
    assert run("lfu") == (PS, 0)  # five hits beat one
    assert run("hybrid") == (0, PS)  # scores 11/(5+1) vs 1/(1+1): the long-idle one still goes


def test_hybrid_order_is_age_over_frequency():
    store, clock = make(policy="hybrid", shards=2)
    clock.now = 0.0
    for v in (1, 2, 3):
        put(store, b"ns", seq(v))
    for _ in range(3):
        store.match(b"ns", seq(3), lease=False)  # freq 3 at t=0: score 100/4 = 25 at t=100
    clock.now = 50.0
    put(store, b"ns", seq(2))  # re-insert: touched at t=50, no hit: score 50
    clock.now = 90.0
    put(store, b"ns", seq(4))  # score 10
    clock.now = 100.0  # page 1: age 100, freq 0: score 100
    order = []
    for _ in range(4):
        before = {v: store.cached_tokens(b"ns", seq(v)) for v in (1, 2, 3, 4)}
        assert store.evict_to_watermark(store.stats()["blocks_free"] + 1).evicted == 1
        order += [v for v in (1, 2, 3, 4) if before[v] and not store.cached_tokens(b"ns", seq(v))]
    assert order == [1, 2, 3, 4]  # LRU would give 1, 3, 2, 4
    assert store.check() == []


def test_evict_bytes_watermark_flush_and_stats():
    store, _ = make(32)
    for v in range(8):
        put(store, b"a" if v % 2 else b"b", seq(v, v))
    assert store.evict_bytes(b"a", BB + 1).evicted == 2
    assert store.evict_to_watermark(32 - 10).evicted == 4
    assert store.stats()["blocks_free"] == 22
    m = store.match(b"b", seq(0, 0))
    r = store.flush()
    assert r.pinned == 2 * (m.matched_tokens > 0)
    assert store.stats()["pages"] == r.pinned
    info = store.info()
    assert info["arena"]["backend"] == "memory" and info["blocks_total"] == 32
    assert store.shard_of(b"a", seq(1)) == store.shard_of(b"a", seq(1, 2)) < 4
    assert unpack_tokens(seq(3)) == [3] * PS
    assert store.check() == []


# -- stateful test against a reference model -----------------------------------------------------

NSS = (b"x", b"y")
OWNERS = (1, 2, 3)
PAGE_VALUES = st.integers(0, 2)
SEQS = st.lists(PAGE_VALUES, min_size=0, max_size=5)
OFFSETS = st.one_of(st.none(), st.just(0), st.integers(0, 5))  # None: the cached length (a valid offset)


def test_the_store_is_parts_that_do_not_reach_back():
    # PrefixStore is composed of parts (leases, inserts, namespaces, evictor, quotas, ...), each
    # given what it needs when it is made: none holds the store, so none reaches into its state.
    store, _ = make(partitions=[(b"t:*", 8)])
    assert PrefixStore.__bases__ == (object,)  # no mixins
    parts = {type(value).__name__: value for value in vars(store).values()
             if type(value).__module__.startswith("pfxcache.daemon.store.")
             and type(value).__module__ != "pfxcache.daemon.store.store"}
    assert {"ArenaPartitions", "Namespaces", "Evictor", "Leases", "NamespaceKeys", "TenantQuotas", "Lookups",
            "Inserts", "StoreFigures", "PlansInFlight", "Listeners"} <= set(parts)
    for kind, part in parts.items():
        fields = vars(part) if hasattr(part, "__dict__") else {slot: getattr(part, slot) for slot in part.__slots__}
        for field, value in fields.items():
            assert value is not store and getattr(value, "__self__", None) is not store, (kind, field)


def test_settings_changed_on_the_store_reach_its_parts():
    # The daemon sets these on the store at run time (CONFIG SET, WATCH); each lives in one part.
    store, clock = make(nblocks=8)
    tokens = seq(1, 2)
    put(store, b"a", tokens)
    store.lease_ttl_ms = 0  # lease-ttl 0: leases without a deadline
    lease = store.match(b"a", tokens).lease_id
    assert store.next_expiry() == float("inf")
    store.max_leases_per_owner = 1  # client-lease-limit
    with pytest.raises(BadRequest, match="client-lease-limit"):
        store.match(b"a", tokens)
    assert store.release(lease, 0) == 1
    touched = []
    store.touched = touched.append  # WATCH
    put(store, b"b", seq(3))
    assert touched == [b"b"]
    store.touched = None
    store.evicting = False  # maxmemory-policy noeviction: a full arena refuses instead of evicting
    put(store, b"c", seq(4, 5, 6, 7, 8))
    with pytest.raises(OutOfMemory, match="noeviction"):
        put(store, b"d", seq(9))
    store.evicting = True
    put(store, b"d", seq(9))
    assert store.stats()["evictions_pressure"] == 1 and store.check() == []


class StoreMachine(RuleBasedStateMachine):
    """Random operations against a plain model.

    The model knows every cached page sequence that was inserted and not
    explicitly removed (a superset of the store's content when the arena is
    small enough to evict, the exact content when it is not), and every lease.
    """

    NBLOCKS = 16
    EXACT = False
    FENCE = False  # the daemon's mode: expired leases are fenced, their blocks kept until released
    QUOTAS = ()  # tenant rules: (pattern, max pages, max leased, max leases)

    @initialize(policy=st.sampled_from(sorted(POLICIES)), shards=st.sampled_from([1, 2, 3]),
                shrink=st.sampled_from([0, 6, 10]))
    def setup(self, policy, shards, shrink):
        self.clock = FakeClock()
        self.store = PrefixStore(MemoryArena(BB, self.NBLOCKS - (0 if self.EXACT else shrink)), page_size=PS, shards=shards, policy=policy,
                                 lease_ttl_ms=1000, clock=self.clock, fence_expired=self.FENCE,
                                 quotas=QuotaBook(self.QUOTAS))
        self.cached = {ns: set() for ns in NSS}  # tuples of page values, prefix closed
        # lease id -> dict(owner, kind, ns, pages, deadline, blocks, data)
        self.leases: dict[int, dict] = {}
        self.issued: set[int] = set()  # lease ids are random, and none comes twice

    # helpers

    def new_lease(self, lease_id, **fields):
        assert 0 < lease_id < 2**63 and lease_id not in self.issued
        self.issued.add(lease_id)
        self.leases[lease_id] = fields

    def pinned(self, ns):
        out = set()
        for lease in self.leases.values():
            if lease["kind"] == "read" and lease["ns"] == ns:
                pages = lease["pages"]
                out.update(pages[:i] for i in range(1, len(pages) + 1))
        return out

    def longest(self, ns, pages):
        n = 0
        while n < len(pages) and tuple(pages[: n + 1]) in self.cached[ns]:
            n += 1
        return n

    def unchanged(self, before):
        assert self.store.stats() == before
        assert self.store.check() == []

    # rules

    @rule(ns=st.sampled_from(NSS), pages=SEQS, tail=st.integers(0, PS - 1), off=OFFSETS,
          owner=st.sampled_from(OWNERS))
    def insert_data(self, ns, pages, tail, off, owner):
        tokens = seq(*pages, tail=tail)
        before = self.store.stats()
        cached = self.store.cached_tokens(ns, tokens) // PS
        off = min(cached if off is None else off, len(pages))
        try:
            r = self.store.insert(ns, tokens, offset=off * PS, data=data_for(tokens, off), owner=owner)
        except NoPrefix:
            event("insert: NOPREFIX")
            assert cached < off
            self.unchanged(before)
            return
        except OutOfMemory:
            event("insert: OOM")
            assert not self.EXACT and before["blocks_free"] < len(pages) - max(cached, off)
            self.unchanged(before)
            return
        assert cached >= off
        event(f"insert: evicted {self.store.stats()['evictions'] > before['evictions']}")
        assert r.stored + r.existing == len(pages) - off and len(r.blocks) == len(pages)
        assert_data(self.store, tokens, r.blocks)
        self.cached[ns].update(tuple(pages[:i]) for i in range(1, len(pages) + 1))

    @rule(ns=st.sampled_from(NSS), pages=SEQS, off=OFFSETS, owner=st.sampled_from(OWNERS))
    def insert_blocks(self, ns, pages, off, owner):
        tokens = seq(*pages)
        off = min(self.store.cached_tokens(ns, tokens) // PS if off is None else off, len(pages))
        n = len(pages) - off
        if n == 0:
            return
        before = self.store.stats()
        try:
            a = self.store.alloc(ns, n, owner=owner, ttl_ms=0)
        except OutOfMemory:
            assert not self.EXACT
            self.unchanged(before)
            return
        self.store.arena.write(a.blocks, data_for(tokens, off))
        self.new_lease(a.lease_id, owner=owner, kind="alloc", ns=ns, deadline=float("inf"), blocks=list(a.blocks),
                       data=data_for(tokens, off))
        cached = self.store.cached_tokens(ns, tokens) // PS
        try:
            r = self.store.insert(ns, tokens, offset=off * PS, blocks=a.blocks, owner=owner)
        except NoPrefix:
            assert cached < off
            return  # the blocks stay in the lease
        assert r.stored + r.existing == n and len(r.blocks) == len(pages)
        assert set(r.blocks[len(pages) - r.stored :]) <= set(a.blocks)
        assert_data(self.store, tokens, r.blocks)
        self.leases[a.lease_id].update(blocks=[], data=b"")
        self.cached[ns].update(tuple(pages[:i]) for i in range(1, len(pages) + 1))

    @rule(ns=st.sampled_from(NSS), pages=SEQS, tail=st.integers(0, PS - 1), lease=st.booleans(),
          owner=st.sampled_from(OWNERS), ttl=st.sampled_from([None, 0, 100, 2000]))
    def match(self, ns, pages, tail, lease, owner, ttl):
        tokens = seq(*pages, tail=tail)
        m = self.store.match(ns, tokens, lease=lease, ttl_ms=ttl, owner=owner)
        n = m.matched_tokens // PS
        assert m.matched_tokens % PS == 0 and len(m.blocks) == n
        if n:
            assert tuple(pages[:n]) in self.cached[ns]  # never a sequence the model does not have
        expected = self.longest(ns, pages)
        assert n <= expected
        if self.EXACT:
            assert n == expected
        assert_data(self.store, tokens, m.blocks)
        event(f"match: {min(n, 3)} pages, leased {lease and n > 0}")
        if lease and n:
            ttl = 1000 if ttl is None else ttl
            deadline = float("inf") if ttl == 0 else self.clock.now + ttl / 1000
            self.new_lease(m.lease_id, owner=owner, kind="read", ns=ns, pages=tuple(pages[:n]), deadline=deadline,
                           blocks=list(m.blocks), data=self.store.arena.read(m.blocks))
        else:
            assert m.lease_id == 0

    @rule(ns=st.sampled_from(NSS), n=st.integers(1, 6), owner=st.sampled_from(OWNERS),
          ttl=st.sampled_from([None, 0, 500]))
    def alloc(self, ns, n, owner, ttl):
        before = self.store.stats()
        try:
            a = self.store.alloc(ns, n, owner=owner, ttl_ms=ttl)
        except OutOfMemory:
            event("alloc: OOM")
            assert not self.EXACT and before["blocks_free"] + before["evictable_pages"] < n
            self.unchanged(before)
            return
        data = b"".join(hashlib.blake2b(b"alloc%d-%d" % (a.lease_id, i), digest_size=BB).digest() for i in range(n))
        self.store.arena.write(a.blocks, data)
        ttl = 1000 if ttl is None else ttl
        deadline = float("inf") if ttl == 0 else self.clock.now + ttl / 1000
        self.new_lease(a.lease_id, owner=owner, kind="alloc", ns=ns, deadline=deadline, blocks=list(a.blocks),
                       data=data)

    @rule(data=st.data(), owner=st.sampled_from(OWNERS))
    def release(self, data, owner):
        ids = data.draw(st.lists(st.sampled_from(list(self.leases) + [0, 99999]), max_size=3, unique=True))
        expected = sum(1 for i in ids if i in self.leases and self.leases[i]["owner"] == owner
                       and not self.leases[i].get("fenced"))
        assert self.store.release(ids, owner) == expected
        for i in ids:
            if i in self.leases and self.leases[i]["owner"] == owner:
                del self.leases[i]

    @rule(owner=st.sampled_from(OWNERS))
    def release_owner(self, owner):
        mine = [i for i, lease in self.leases.items() if lease["owner"] == owner]
        assert self.store.release_owner(owner) == len(mine)
        for i in mine:
            del self.leases[i]

    @rule(ms=st.sampled_from([1, 50, 200, 600, 1500]))
    def tick_and_expire(self, ms):
        self.clock.now += ms / 1000
        due = [i for i, lease in self.leases.items() if lease["deadline"] <= self.clock.now]
        assert self.store.expire() == len(due)
        event(f"expired {min(len(due), 2)}")
        for i in due:
            if self.FENCE:  # still pinned, still holding its blocks; its id counts 0 on release
                self.leases[i].update(fenced=True, deadline=float("inf"))
            else:
                del self.leases[i]

    def forget(self, ns, doomed):
        kept = doomed & self.pinned(ns)
        self.cached[ns] -= doomed - kept
        return len(doomed - kept), len(kept)

    @rule(ns=st.sampled_from(NSS), pages=st.lists(PAGE_VALUES, min_size=1, max_size=3))
    def evict_prefix(self, ns, pages):
        prefix = tuple(pages)
        doomed = {s for s in self.cached[ns] if s[: len(prefix)] == prefix}
        gone, kept = self.forget(ns, doomed)
        r = self.store.evict_prefix(ns, seq(*pages))
        assert r.freed_bytes == r.evicted * BB
        if self.EXACT:
            assert (r.evicted, r.pinned) == (gone, kept)
        else:
            assert r.evicted <= gone and r.pinned == kept  # leased pages are always cached

    @rule(ns=st.sampled_from(NSS))
    def evict_all(self, ns):
        gone, kept = self.forget(ns, set(self.cached[ns]))
        r = self.store.evict_all(ns)
        assert r.pinned == kept and r.evicted <= gone
        if self.EXACT:
            assert r.evicted == gone

    @rule()
    def flush(self):
        r = self.store.flush()
        kept = 0
        for ns in NSS:
            kept += self.forget(ns, set(self.cached[ns]))[1]
        assert r.pinned == kept

    @precondition(lambda self: not self.EXACT)
    @rule(ns=st.sampled_from(NSS), n=st.integers(0, 4))
    def evict_pages(self, ns, n):
        before = self.store.stats(ns)
        r = self.store.evict_pages(ns, n)
        assert r.evicted == min(n, before["evictable_pages"])

    @precondition(lambda self: not self.EXACT)
    @rule(low=st.integers(0, 30))
    def watermark(self, low):
        before = self.store.stats()
        r = self.store.evict_to_watermark(low)
        assert r.evicted == min(max(0, low - before["blocks_free"]), before["evictable_pages"])

    @rule(name=st.sampled_from(sorted(POLICIES)))
    def set_policy(self, name):
        self.store.set_policy(name)

    @rule(ns=st.sampled_from(NSS), a=SEQS, b=SEQS, first=st.booleans())
    def racing_inserts(self, ns, a, b, first):
        ta, tb = seq(*a), seq(*b)
        before = self.store.stats()
        try:
            pa = self.store.begin_insert(ns, ta)
        except OutOfMemory:
            assert not self.EXACT
            self.unchanged(before)
            return
        try:
            pb = self.store.begin_insert(ns, tb)
        except OutOfMemory:
            assert not self.EXACT
            self.store.abort_insert(pa)
            return
        assert self.store.check() == []
        self.store.arena.write(pa.new_blocks, pa.new_data(data_for(ta)))
        self.store.arena.write(pb.new_blocks, pb.new_data(data_for(tb)))
        for plan, tokens, pages in sorted([(pa, ta, a), (pb, tb, b)], key=lambda x: x[0].id, reverse=first):
            r = self.store.commit_insert(plan)
            assert_data(self.store, tokens, r.blocks)
            self.cached[ns].update(tuple(pages[:i]) for i in range(1, len(pages) + 1))

    # invariants

    @invariant()
    def consistent(self):
        if not hasattr(self, "store"):
            return
        assert self.store.check() == []
        for lease_id, lease in self.leases.items():
            # a pinned block is never freed, reused or overwritten
            assert self.store.arena.read(lease["blocks"]) == lease["data"], lease_id
            if lease["kind"] == "read":
                tokens = seq(*lease["pages"])
                assert self.store.cached_tokens(lease["ns"], tokens) == len(lease["pages"]) * PS
                assert lease["pages"] in self.cached[lease["ns"]]
        stats = self.store.stats()
        assert stats["leases"] == sum(not lease.get("fenced") for lease in self.leases.values())
        assert stats["pages"] <= sum(len(c) for c in self.cached.values())
        if self.EXACT:
            assert stats["pages"] == sum(len(c) for c in self.cached.values())


class TestTinyArena(StoreMachine.TestCase):
    settings = settings(max_examples=150, stateful_step_count=60, deadline=None,
                        suppress_health_check=[HealthCheck.too_slow])


class ExactMachine(StoreMachine):
    NBLOCKS = 600
    EXACT = True


class TestBigArena(ExactMachine.TestCase):
    settings = settings(max_examples=80, stateful_step_count=50, deadline=None,
                        suppress_health_check=[HealthCheck.too_slow])


class FencedMachine(StoreMachine):
    FENCE = True


class TestFencedTinyArena(FencedMachine.TestCase):
    settings = settings(max_examples=100, stateful_step_count=60, deadline=None,
                        suppress_health_check=[HealthCheck.too_slow])


class QuotaMachine(FencedMachine):
    # Namespace x may cache 5 pages (its inserts evict its own pages, y's never go for it); the
    # invariants check the quota's counters after every step.
    QUOTAS = ((b"x", 5, 0, 0),)


class TestQuotaTinyArena(QuotaMachine.TestCase):
    settings = settings(max_examples=80, stateful_step_count=60, deadline=None,
                        suppress_health_check=[HealthCheck.too_slow])

