"""The worker client (pfxcache.client) against real pfxcached processes.

Every call goes to a daemon process over loopback, in RESP3 and RESP2, through
the blocking PrefixCache and the asyncio AsyncPrefixCache (asyncio is driven
with its own event loop inside sync tests: pytest-trio owns ``async def``
tests). What the daemon did is checked independently with a plain redis-py
client (PFXINFO, PFXGET WITHDATA), never through the library under test.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import time
from array import array

import numpy as np
import pytest
import redis
from pfxcache.client import (
    Allocation,
    AsyncPrefixCache,
    AttachError,
    CacheFullError,
    EvictResult,
    Info,
    Match,
    NoPrefixError,
    PrefixCache,
    PrefixCacheError,
    ShmArenaView,
    StoreResult,
    pack_tokens,
)
from pfxcache.client.core import is_local_host as _is_local_host
from pfxcache.client.errors import translate
from pfxcache.testing import start_daemon

PS = 4  # tokens per page
BB = 1024  # bytes per block
NBLOCKS = 64
SMALL = ("--page-size", str(PS), "--block-bytes", str(BB), "--evict-low-watermark", "0")
_names = itertools.count()


# -- helpers ---------------------------------------------------------------------------------------


def ns(tag: str = "ns") -> str:
    """A namespace no other test uses (the module shares one daemon)."""
    return f"{tag}-{next(_names)}"


def tokens(seed: int, pages: int, tail: int = 0) -> list[int]:
    return list(range(seed, seed + pages * PS + tail))


def pattern(nbytes: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()


def _key(k):
    return k.decode() if isinstance(k, bytes) else k


def as_map(reply) -> dict:
    if isinstance(reply, dict):
        return {_key(k): v for k, v in reply.items()}
    return {_key(reply[i]): reply[i + 1] for i in range(0, len(reply), 2)}


class Probe:
    """An independent plain redis-py view of the daemon (not the library under test)."""

    def __init__(self, daemon) -> None:
        self.r = redis.Redis(host=daemon.host, port=daemon.port, protocol=3, socket_timeout=30)

    def stats(self, namespace=None) -> dict:
        reply = as_map(self.r.execute_command("PFXINFO", *([namespace] if namespace is not None else [])))
        return as_map(reply["stats"])

    def data(self, namespace, toks) -> bytes | None:
        packed = np.asarray(toks, dtype="<u4").tobytes()
        reply = as_map(self.r.execute_command("PFXGET", namespace, "PACKED", packed, "NOLEASE", "WITHDATA"))
        return reply["data"]

    def commands_processed(self) -> int:
        return int(self.r.info("stats")["total_commands_processed"])

    def close(self) -> None:
        self.r.close()


class Blocking:
    """The async cache behind the sync cache's call shape: each coroutine runs on a private asyncio loop."""

    def __init__(self, cache: AsyncPrefixCache, loop: asyncio.AbstractEventLoop) -> None:
        self._cache, self._loop = cache, loop

    def __getattr__(self, name):
        value = getattr(self._cache, name)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            result = value(*args, **kwargs)
            return self._loop.run_until_complete(result) if inspect.isawaitable(result) else result

        return call

    def run(self, awaitable):
        return self._loop.run_until_complete(awaitable)

    def close(self) -> None:
        self.run(self._cache.aclose())


def url(daemon, protocol: int) -> str:
    return f"redis://{daemon.host}:{daemon.port}/0?protocol={protocol}"


@pytest.fixture(scope="module")
def daemon():
    instance = start_daemon("--maxmemory", str(NBLOCKS * BB), *SMALL)
    yield instance
    assert instance.stop() == 0, instance.log_text()


@pytest.fixture
def probe(daemon):
    p = Probe(daemon)
    yield p
    p.close()


@pytest.fixture
def make_cache(daemon):
    """Factory: a PrefixCache, or an AsyncPrefixCache wrapped to be called like one ("sync"/"async")."""
    made = []
    loop = asyncio.new_event_loop()

    def factory(protocol: int = 3, mode: str = "sync", **kwargs):
        if mode == "sync":
            cache = PrefixCache.from_url(url(daemon, protocol), **kwargs)
        else:
            cache = Blocking(AsyncPrefixCache.from_url(url(daemon, protocol), **kwargs), loop)
        made.append(cache)
        return cache

    yield factory
    for cache in made:
        cache.close()
    loop.close()


# -- every API call, RESP3 and RESP2, sync and asyncio ------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("protocol", [3, 2])
def test_every_call(make_cache, probe, protocol, mode):
    cache = make_cache(protocol, mode)
    space = ns(f"every{protocol}{mode}")
    prompt = tokens(1000, 2, tail=3)
    data = pattern(2 * BB, 1)

    info = cache.info()
    assert isinstance(info, Info)
    assert (info.page_size, info.block_bytes, info.policy, info.lease_ttl_ms) == (PS, BB, "guard", 30000)
    # A sealed memfd (issue 12), opened through the daemon's /proc entry: the inode says it is the arena.
    assert info.arena["backend"] == "shm" and os.stat(info.arena["path"]).st_ino == info.arena["inode"]
    assert info.arena["blocks-total"] == NBLOCKS and info.arena["size"] == NBLOCKS * BB
    assert isinstance(info.stats["hit_rate"], float) and isinstance(info.stats["policy"], str)
    cache.attach()
    assert cache.attached and cache.via == "shm"

    # Miss: nothing cached, no lease, no blocks; attached, so no data was asked for.
    miss = cache.lookup(space, prompt)
    assert isinstance(miss, Match) and not miss
    assert (miss.matched_tokens, miss.lease, miss.blocks, miss.data) == (0, 0, [], None)

    stored = cache.store(space, prompt, data)
    assert isinstance(stored, StoreResult)
    assert (stored.stored, stored.existing, stored.via, len(stored.blocks)) == (2, 0, "resp", 2)
    assert probe.data(space, prompt) == data

    hit = cache.lookup(space, prompt)
    assert (hit.matched_tokens, hit.blocks, hit.pages, hit.data, hit.via) == (8, stored.blocks, 2, None, None)
    assert hit.lease > 0 and probe.stats(space)["leases"] == 1
    assert cache.release(hit) == 1 and hit.released
    assert probe.stats(space)["leases"] == 0
    assert cache.release(hit) == 0  # already ended: nothing sent for it

    withdata = cache.lookup(space, prompt, lease=False, with_data=True)
    assert (withdata.lease, withdata.data, withdata.via) == (0, data, "resp")
    timed = cache.lookup(space, prompt, ttl_ms=60_000)
    assert cache.release(timed.lease) == 1 and cache.release(timed.lease) == 0
    assert cache.release() == 0

    # OFFSET: two more pages after the cached 8 tokens, with only their bytes.
    longer = prompt[:8] + tokens(5000, 2)
    more = pattern(2 * BB, 2)
    ext = cache.store(space, longer, more, offset=8)
    assert (ext.stored, ext.existing, ext.blocks[:2]) == (2, 0, stored.blocks)
    assert probe.data(space, longer) == data + more

    # alloc + write in the arena + commit (PFXSET BLOCKS).
    third = longer + tokens(9000, 1)
    allocation = cache.alloc(space, 1, ttl_ms=60_000)
    assert isinstance(allocation, Allocation) and allocation.lease > 0 and len(allocation.blocks) == 1
    assert probe.stats()["blocks_leased"] >= 1
    last = pattern(BB, 3)
    cache.arena.write_from(allocation.blocks, last)
    committed = cache.commit(space, third, allocation, offset=16)
    assert (committed.stored, committed.existing, committed.via) == (1, 0, "shm")
    assert committed.blocks == ext.blocks + allocation.blocks
    assert cache.release(allocation) == 1  # the emptied allocation lease
    assert probe.data(space, third) == data + more + last

    # load / save pick the mapped arena.
    out = np.zeros(8 * BB, np.uint8)
    loaded = cache.load(space, third, out)
    assert (loaded.matched_tokens, loaded.via, loaded.data, loaded.released) == (20, "shm", None, True)
    assert out[: 5 * BB].tobytes() == data + more + last and not out[5 * BB :].any()
    saved = cache.save(space, tokens(20000, 2), pattern(2 * BB, 4))
    assert (saved.stored, saved.via) == (2, "shm")
    assert probe.data(space, tokens(20000, 2)) == pattern(2 * BB, 4)
    assert probe.stats(space)["leases"] == 0

    # Eviction, each mode.
    e = cache.evict(space, tokens=third)
    assert isinstance(e, EvictResult) and (e.evicted, e.freed_bytes, e.pinned) == (1, BB, 0)
    assert cache.evict(space, pages=1).evicted == 1
    assert cache.evict(space, bytes=BB).evicted == 1
    rest = cache.evict(space, all=True)
    assert (rest.evicted, rest.freed_bytes) == (4, 4 * BB) and probe.stats(space)["pages"] == 0
    with pytest.raises(ValueError, match="exactly one"):
        cache.evict(space, pages=1, all=True)

    assert cache.info(space).stats["namespace"] == space


def test_async_syntax(daemon, probe):
    """The asyncio front end with its own idioms: async with, await release, async with on the cache."""
    space = ns("async")
    prompt = tokens(300, 3)
    data = pattern(3 * BB, 5)

    async def main():
        async with AsyncPrefixCache.from_url(url(daemon, 3)) as cache:
            assert cache.attached and cache.via == "shm"  # __aenter__ attached it
            saved = await cache.save(space, prompt, data)
            assert saved.via == "shm" and saved.stored == 3
            async with await cache.lookup(space, prompt) as match:
                assert match.matched_tokens == 12 and probe.stats(space)["leases"] == 1
                with pytest.raises(TypeError, match="async with"), match:
                    pass
            assert match.released and probe.stats(space)["leases"] == 0
            async with await cache.alloc(space, 2) as allocation:
                assert probe.stats(space)["leases"] == 1 and len(allocation.blocks) == 2
            assert allocation.released and probe.stats(space)["leases"] == 0
            match = await cache.lookup(space, prompt)
            assert await match.release() == 1 and await match.release() == 0
            out = bytearray(3 * BB)
            assert (await cache.load(space, prompt, out)).via == "shm" and bytes(out) == data
        async with AsyncPrefixCache.from_url(url(daemon, 2), attach=False) as cache:
            assert not cache.attached and cache.via == "resp"
            out = bytearray(3 * BB)
            assert (await cache.load(space, prompt, out)).via == "resp" and bytes(out) == data
            with pytest.raises(NoPrefixError):
                await cache.store(space, tokens(99_000, 2), pattern(BB, 1), offset=4)
            return True

    assert asyncio.run(main())


# -- token inputs ----------------------------------------------------------------------------------------


def test_token_inputs_pack_the_same(make_cache, probe):
    cache = make_cache()
    space = ns("tok")
    ids = [0, 1, 2**31, 2**32 - 1, 7, 8, 9, 10]
    cache.store(space, ids, pattern(2 * BB, 6))
    expected = np.asarray(ids, dtype="<u4").tobytes()
    inputs = [ids, tuple(ids), array("I", ids), array("Q", ids), array("q", ids),
              np.asarray(ids, np.uint32), np.asarray(ids, np.int64), np.asarray(ids, np.uint64),
              np.asarray(ids, ">u4"), np.asarray(ids + [5], np.int64)[:-1]]
    for value in inputs:
        assert pack_tokens(value) == expected, value
        match = cache.lookup(space, value, lease=False)
        assert match.matched_tokens == 8, value
    assert pack_tokens(range(3)) == np.arange(3, dtype="<u4").tobytes()
    assert pack_tokens([]) == b"" and pack_tokens(np.empty(0, np.int64)) == b""
    assert pack_tokens(iter([1, 2])) == np.asarray([1, 2], "<u4").tobytes()


def test_torch_tokens_and_buffers(make_cache):
    torch = pytest.importorskip("torch")
    cache = make_cache()
    space = ns("torch")
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    data = pattern(2 * BB, 7)
    cache.store(space, torch.tensor(ids, dtype=torch.int64), torch.frombuffer(bytearray(data), dtype=torch.uint8))
    for dtype in (torch.int64, torch.int32, torch.uint8 if max(ids) < 256 else torch.int64):
        assert pack_tokens(torch.tensor(ids, dtype=dtype)) == np.asarray(ids, "<u4").tobytes()
        assert cache.lookup(space, torch.tensor(ids, dtype=dtype), lease=False).matched_tokens == 8
    # A bfloat16 KV buffer: load() fills its bytes through the arena.
    out = torch.zeros(BB, dtype=torch.bfloat16)  # 2 blocks worth of 2-byte elements
    assert cache.load(space, torch.tensor(ids), out).via == "shm"
    assert out.view(torch.uint8).numpy().tobytes() == data
    with pytest.raises(ValueError, match="not an unsigned 32-bit"):
        pack_tokens(torch.tensor([1, -1]))
    with pytest.raises(ValueError, match="not an unsigned 32-bit"):
        pack_tokens(torch.tensor([2**32]))
    with pytest.raises(TypeError):
        pack_tokens(torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("bad", [
    [1, -1], [2**32], [1, 2**70], np.asarray([-1], np.int64), np.asarray([2**32], np.int64),
    np.asarray([2**63], np.uint64), array("q", [-5]), array("Q", [2**32]),
])
def test_out_of_range_tokens_raise_before_sending(make_cache, probe, bad):
    cache = make_cache()
    cache.attach()
    before = probe.commands_processed()
    with pytest.raises(ValueError, match="not an unsigned 32-bit integer"):
        cache.lookup("range", bad)
    with pytest.raises(ValueError):
        cache.store("range", bad, b"")
    with pytest.raises(ValueError):
        cache.save("range", bad, b"")
    with pytest.raises(ValueError):
        cache.evict("range", tokens=bad)
    # Only the probe's own INFO ran in between: the cache sent nothing.
    assert probe.commands_processed() - before == 1


@pytest.mark.parametrize("bad", [[1.5], np.asarray([1.0]), [True, False], "1234", b"\x01\x00\x00\x00",
                                 array("d", [1.0]), [[1, 2], [3, 4]], np.zeros((2, 2), np.int64), 42])
def test_non_integer_tokens_are_refused(bad):
    with pytest.raises((TypeError, ValueError)):
        pack_tokens(bad)


# -- context managers release their leases ---------------------------------------------------------------


@pytest.mark.parametrize("protocol", [3, 2])
def test_context_managers_release(make_cache, probe, protocol):
    cache = make_cache(protocol)
    space = ns("ctx")
    prompt = tokens(40, 2)
    cache.store(space, prompt, pattern(2 * BB, 8))
    base_free = probe.stats()["blocks_free"]
    with cache.lookup(space, prompt) as match:
        assert match.lease and probe.stats(space)["leases"] == 1 and probe.stats(space)["pinned_pages"] == 2
    assert match.released and probe.stats(space)["leases"] == 0 and probe.stats(space)["pinned_pages"] == 0
    with cache.alloc(space, 3) as allocation:
        assert probe.stats()["blocks_free"] == base_free - 3 and probe.stats()["blocks_leased"] == 3
    assert probe.stats()["blocks_free"] == base_free and probe.stats()["blocks_leased"] == 0
    assert allocation.released and allocation.release() == 0
    # The lease also ends when the block raises.
    with pytest.raises(RuntimeError), cache.lookup(space, prompt):
        raise RuntimeError("worker failed mid-prefill")
    assert probe.stats(space)["leases"] == 0
    # No lease (NOLEASE, or a miss): release is a no-op.
    with cache.lookup(space, prompt, lease=False) as match:
        assert match.lease == 0
    assert match.release() == 0 and cache.lookup(space, tokens(77_000, 1)).release() == 0


def test_pooled_and_decoding_clients_are_wrapped_not_changed(daemon, probe):
    """A pooled client gets one pinned connection (leases are per connection); decode_responses is harmless."""
    user = redis.Redis(host=daemon.host, port=daemon.port, decode_responses=True)
    callbacks = dict(user.response_callbacks)
    cache = PrefixCache(user)
    space = ns("pooled")
    data = pattern(2 * BB, 9)  # not valid UTF-8: a decoding client would mangle it
    cache.store(space, tokens(1, 2), data)
    assert cache.lookup(space, tokens(1, 2), lease=False, with_data=True).data == data
    leases = [cache.lookup(space, tokens(1, 2)) for _ in range(5)]
    assert cache.release(*leases) == 5  # all on the same connection
    assert user.ping() is True and user.echo("hi") == "hi" and dict(user.response_callbacks) == callbacks
    held = cache.lookup(space, tokens(1, 2))
    assert probe.stats(space)["leases"] == 1
    cache.close()  # its connection is dropped, so the daemon ends its leases
    assert held.lease
    for _ in range(250):
        if probe.stats(space)["leases"] == 0:
            break
        time.sleep(0.02)
    assert probe.stats(space)["leases"] == 0
    assert user.ping() is True
    single = redis.Redis(host=daemon.host, port=daemon.port, protocol=2, single_connection_client=True)
    other = PrefixCache(single, attach=False)
    assert other.client is single and other.lookup(space, tokens(1, 2), lease=False).matched_tokens == 8
    other.close()
    assert single.ping() is True  # the caller's client stays the caller's
    single.close()
    user.close()
    with pytest.raises(TypeError):
        PrefixCache(redis.asyncio.Redis())
    with pytest.raises(TypeError):
        AsyncPrefixCache(single)


# -- exceptions ------------------------------------------------------------------------------------------


def test_error_codes_read_the_same_whichever_way_redis_py_reports_them():
    """redis-py before 8.2 leaves a code it does not know (NOPREFIX) at the front of the message, unrecorded;
    8.2 records it in status_code and leaves it there too; codes it knows (OOM) it strips and records."""
    text = "the first 4 tokens (the offset) are not cached: only 0 are"
    unrecorded = redis.ResponseError(f"NOPREFIX {text}")
    recorded = redis.ResponseError(f"NOPREFIX {text}", status_code="NOPREFIX")
    for raw in (unrecorded, recorded):
        error = translate(raw)
        assert type(error) is NoPrefixError and error.code == "NOPREFIX" and str(error) == text
    full = translate(redis.exceptions.OutOfMemoryError("no free block", status_code="OOM"))
    assert type(full) is CacheFullError and full.code == "OOM" and str(full) == "no free block"
    other = translate(redis.ResponseError("WRONGTYPE not a namespace", status_code="WRONGTYPE"))
    assert type(other) is PrefixCacheError and other.code == "WRONGTYPE" and str(other) == "not a namespace"


@pytest.mark.parametrize("protocol", [3, 2])
def test_errors(make_cache, fresh_daemon, protocol):
    tiny = fresh_daemon("--maxmemory", str(4 * BB), *SMALL)
    cache = PrefixCache.from_url(url(tiny, protocol))
    try:
        space = ns("oom")
        pinned = cache.alloc(space, 4)  # the whole arena, pinned
        with pytest.raises(CacheFullError) as caught:
            cache.store(space, tokens(1, 1), pattern(BB, 1))
        assert isinstance(caught.value, PrefixCacheError) and isinstance(caught.value, redis.ResponseError)
        assert caught.value.code == "OOM" and "block" in str(caught.value) and not str(caught.value).startswith("OOM")
        with pytest.raises(CacheFullError):
            cache.alloc(space, 1)
        with pytest.raises(CacheFullError):
            cache.save(space, tokens(1, 1), pattern(BB, 1))
        pinned.release()
        assert cache.store(space, tokens(1, 1), pattern(BB, 1)).stored == 1

        with pytest.raises(NoPrefixError) as caught:
            cache.store(space, tokens(500, 2), pattern(BB, 1), offset=4)
        assert caught.value.code == "NOPREFIX" and str(caught.value).startswith("the first 4 tokens (the offset)")
        with pytest.raises(NoPrefixError):
            cache.save(space, tokens(500, 2), pattern(BB, 1), offset=4)  # through the arena, same error
        assert cache.info().stats["leases"] == 0 and cache.info().stats["blocks_leased"] == 0

        with pytest.raises(PrefixCacheError) as caught:
            cache.store(space, tokens(1, 2), b"abc")
        assert str(caught.value) == f"DATA is 3 bytes, expected {2 * BB} (pages from OFFSET 0 x block-bytes {BB})"
        assert caught.value.code == "ERR" and type(caught.value) is PrefixCacheError
        with pytest.raises(PrefixCacheError, match="^the namespace \\(key\\) must not be empty$"):
            cache.lookup("", tokens(1, 1))
        with pytest.raises(PrefixCacheError, match="^TTL must be between 1 and"):
            cache.lookup(space, tokens(1, 1), ttl_ms=10**12)
        with pytest.raises(PrefixCacheError, match="offset 3 is not a multiple of the page size 4"):
            cache.store(space, tokens(1, 2), pattern(BB, 1), offset=3)
        with pytest.raises(PrefixCacheError, match="not held by an allocation lease of this connection"):
            cache.commit(space, tokens(1, 2), [0, 1])
        with pytest.raises(ValueError, match="src is 3 bytes"):
            cache.save(space, tokens(1, 2), b"abc")
        with pytest.raises(ValueError):
            cache.alloc(space, 0)  # refused before sending
    finally:
        cache.close()


# -- the attached arena ----------------------------------------------------------------------------------


def test_views_share_memory_with_the_arena(make_cache, probe):
    cache = make_cache()
    arena = cache.attach()
    assert isinstance(arena, ShmArenaView) and arena.array.shape == (NBLOCKS, BB)
    space = ns("views")
    prompt = tokens(60, 3)
    cache.store(space, prompt, pattern(3 * BB, 10))
    with cache.lookup(space, prompt) as match:
        first, _, third = match.blocks
        # One block as a numpy view: write through it, the daemon serves the new bytes.
        view = arena.blocks(first)
        assert view.shape == (BB,) and np.shares_memory(view, arena.array)
        view[:] = 0xAB
        assert probe.data(space, prompt)[:BB] == b"\xab" * BB
        # A run of consecutive ids is a view too; scattered ids are a copy.
        assert np.shares_memory(arena.blocks([5, 6, 7]), arena.array)
        assert arena.blocks([5, 6, 7]).shape == (3, BB)
        scattered = arena.blocks([third, first])
        assert not np.shares_memory(scattered, arena.array)
        assert scattered[1].tobytes() == b"\xab" * BB
        scattered[:] = 0  # a copy: the arena is untouched
        assert probe.data(space, prompt)[:BB] == b"\xab" * BB


def test_torch_views_share_memory(make_cache, probe):
    torch = pytest.importorskip("torch")
    cache = make_cache()
    arena = cache.attach()
    space = ns("tviews")
    prompt = tokens(70, 2)
    cache.store(space, prompt, pattern(2 * BB, 11))
    with cache.lookup(space, prompt) as match:
        tensor = arena.torch_blocks([match.blocks[1]])
        assert tensor.dtype == torch.uint8 and tensor.shape == (1, BB)
        assert tensor.data_ptr() == arena.blocks(match.blocks[1]).ctypes.data  # no copy
        tensor.fill_(7)
        assert probe.data(space, prompt)[BB:] == b"\x07" * BB
        # Typed views over a block (e.g. fp16 KV) are views too.
        halves = tensor.view(torch.float16)
        halves[0, 0] = 1.0
        assert probe.data(space, prompt)[BB : BB + 2] == np.float16(1.0).tobytes()


def test_read_into_write_from_scattered_ids(make_cache, probe):
    cache = make_cache()
    arena = cache.attach()
    space = ns("scatter")
    prompt = tokens(90, 4)
    src = np.frombuffer(pattern(4 * BB, 12), np.uint8)
    with cache.alloc(space, 4) as allocation:
        ids = [allocation.blocks[i] for i in (2, 0, 3, 1)]  # not ascending, not a run
        assert arena.write_from(ids, src.reshape(4, BB)) == 4 * BB
        for i, block in enumerate(ids):
            assert arena.array[block].tobytes() == src[i * BB : (i + 1) * BB].tobytes()
        cache.commit(space, prompt, ids)
    assert probe.data(space, prompt) == src.tobytes()

    # read_into: any C-contiguous dtype, exactly or more than the bytes needed.
    out16 = np.zeros(2 * BB, np.float16)  # 4 blocks of bytes
    assert arena.read_into(ids, out16) == 4 * BB and out16.tobytes() == src.tobytes()
    big = np.full(6 * BB, 0xEE, np.uint8)
    arena.read_into(ids[::-1], big)
    assert big[: 4 * BB].tobytes() == src.reshape(4, BB)[::-1].tobytes() and (big[4 * BB :] == 0xEE).all()
    buf = bytearray(BB * 2)
    arena.read_into(np.asarray([ids[3], ids[1]]), buf)
    assert bytes(buf) == src[3 * BB :].tobytes() + src[BB : 2 * BB].tobytes()
    with pytest.raises(ValueError, match="holds"):
        arena.read_into(ids, np.zeros(BB, np.uint8))
    with pytest.raises(ValueError, match="C-contiguous"):
        arena.read_into(ids, np.zeros((8 * BB, 2), np.uint8)[:, 0])
    with pytest.raises(IndexError):
        arena.read_into([NBLOCKS], np.zeros(BB, np.uint8))
    with pytest.raises(IndexError):
        arena.write_from([-1], np.zeros(BB, np.uint8))
    with pytest.raises(ValueError, match="source is"):
        arena.write_from(ids, src[:BB])


def test_torch_read_into_write_from(make_cache, probe):
    torch = pytest.importorskip("torch")
    cache = make_cache()
    arena = cache.attach()
    space = ns("tscatter")
    prompt = tokens(120, 3)
    src = torch.randn(3 * BB // 4)  # float32: 3 blocks of bytes
    with cache.alloc(space, 3) as allocation:
        ids = allocation.blocks[::-1]
        arena.write_from(ids, src)
        cache.commit(space, prompt, ids)
    assert probe.data(space, prompt) == src.numpy().tobytes()
    out = torch.empty(3 * BB // 2, dtype=torch.bfloat16)
    arena.read_into(ids, out)
    assert out.view(torch.uint8).numpy().tobytes() == src.numpy().tobytes()


def test_close_and_reattach(make_cache):
    cache = make_cache()
    arena = cache.attach()
    keep = arena.blocks(0)  # a view outliving close() keeps the mapping until it is collected
    arena.close()
    arena.close()
    assert arena.closed and keep.shape == (BB,)
    with pytest.raises(ValueError, match="closed"):
        arena.blocks(0)
    with pytest.raises(AttachError):
        ShmArenaView("/dev/shm/pfxcache-no-such-arena", BB, 4)


# -- RESP fallback ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("protocol", [3, 2])
def test_resp_fallback_gives_the_same_bytes(make_cache, probe, protocol, mode):
    shm = make_cache(protocol, mode)
    resp = make_cache(protocol, mode, attach=False)
    assert not resp.attached and resp.via == "resp" and resp.attach_error == "attach=False"
    with pytest.raises(AttachError):
        resp.attach()
    space = ns("fallback")
    prompt = tokens(200, 5, tail=1)
    src = np.frombuffer(pattern(5 * BB, 13), np.uint8)

    saved = resp.save(space, prompt, src)
    assert (saved.via, saved.stored) == ("resp", 5)
    a, b = np.zeros(5 * BB, np.uint8), np.zeros(5 * BB, np.uint8)
    via_shm, via_resp = shm.load(space, prompt, a), resp.load(space, prompt, b)
    assert (via_shm.via, via_resp.via) == ("shm", "resp")
    assert via_shm.matched_tokens == via_resp.matched_tokens == 20 and via_shm.blocks == via_resp.blocks
    assert a.tobytes() == b.tobytes() == src.tobytes()

    # lookup() without with_data brings the bytes only where they cannot be mapped.
    assert shm.lookup(space, prompt, lease=False).data is None
    assert resp.lookup(space, prompt, lease=False).data == src.tobytes()

    # A shorter output buffer: only the pages that fit are looked up and copied.
    small = np.zeros(2 * BB + 10, np.uint8)
    part = resp.load(space, prompt, small)
    assert part.matched_tokens == 8 and small[: 2 * BB].tobytes() == src[: 2 * BB].tobytes()
    assert not small[2 * BB :].any()

    # save through the arena, read back over RESP, with an offset.
    longer = prompt[:20] + tokens(60_000, 2)
    tail = pattern(2 * BB, 14)
    assert shm.save(space, longer, tail, offset=20).via == "shm"
    c = np.zeros(7 * BB, np.uint8)
    assert resp.load(space, longer, c).matched_tokens == 28
    assert c.tobytes() == src.tobytes() + tail
    assert probe.stats(space)["leases"] == 0


def test_remote_hosts_are_not_attached():
    assert _is_local_host("127.0.0.1") and _is_local_host("::1") and _is_local_host("localhost")
    assert _is_local_host(None)  # a unix socket
    assert not _is_local_host("10.1.2.3") and not _is_local_host("203.0.113.9")


def test_cuda_arena_map_is_handed_over_or_falls_back():
    """A cuda arena goes to pfxcache.client.cuda (imported lazily); where it cannot open, AttachError."""
    from pfxcache.client import open_arena, replies

    handle = b"A" * 64  # valid UTF-8, and still kept as bytes
    reply = [b"page-size", 4, b"block-bytes", 8, b"policy", b"lru", b"lease-ttl", 1000,
             b"arena", [b"backend", b"cuda", b"device", 0, b"handle", handle, b"size", 16,
                        b"block_bytes", 8, b"nblocks", 2, b"pid", os.getpid()],
             b"stats", [b"hit_rate", b"0.5000", b"policy", b"lru"]]
    info = replies.info(reply)  # the RESP2 shape of PFXINFO
    assert info.arena["handle"] == handle and info.arena["backend"] == "cuda"
    assert info.stats == {"hit_rate": 0.5, "policy": "lru"} and info.policy == "lru"
    with pytest.raises(AttachError, match="CUDA arena"):
        open_arena(info.arena)  # no CuPy here, or (with CuPy) our own pid: never mappable in-process
    with pytest.raises(AttachError, match="backend 'memory'"):
        open_arena({"backend": "memory"})
