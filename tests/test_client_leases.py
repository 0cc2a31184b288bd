"""The client's lifetime rules: a URL is enough to make a cache, and a result dropped unreleased
gives its lease back when it is garbage collected, with a ResourceWarning (as an unclosed file does).

Real daemon, real redis-py; the lease counts are read by an independent redis-py connection.
"""

from __future__ import annotations

import asyncio
import gc
import warnings

import numpy as np
import pytest
import redis
from pfxcache.client import AsyncPrefixCache, PrefixCache
from pfxcache.testing import start_daemon
from support import wait_for

PS, BB = 4, 256


def _map(reply) -> dict:
    if isinstance(reply, dict):
        return {(k.decode() if isinstance(k, bytes) else k): v for k, v in reply.items()}
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


@pytest.fixture(scope="module")
def daemon():
    instance = start_daemon("--maxmemory", str(64 * BB), "--page-size", str(PS), "--block-bytes", str(BB),
                            "--evict-low-watermark", "0")
    yield instance
    assert instance.stop() == 0, instance.log_text()


@pytest.fixture(scope="module")
def probe(daemon):
    client = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    yield client
    client.close()


def url(daemon) -> str:
    return f"redis://{daemon.host}:{daemon.port}/0"


def stats(probe, namespace=None) -> dict:
    return _map(_map(probe.execute_command("PFXINFO", *([namespace] if namespace else [])))["stats"])


def prompt(seed: int, pages: int = 2) -> list[int]:
    return list(range(seed, seed + pages * PS))


def data(pages: int = 2) -> bytes:
    return np.arange(pages * BB, dtype=np.uint8).tobytes()


def dropped_warnings(action) -> list[warnings.WarningMessage]:
    """Run ``action`` (which drops results), collect, and return the ResourceWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        action()
        gc.collect()
    return [w for w in caught if issubclass(w.category, ResourceWarning) and "never released" in str(w.message)]


def test_a_url_makes_a_cache(daemon):
    with PrefixCache(url(daemon)) as cache:
        assert cache.store("url", prompt(1), data()).stored == 2
        assert cache.lookup("url", prompt(1), lease=False).matched_tokens == 2 * PS

    async def main():
        async with AsyncPrefixCache(url(daemon)) as cache:
            return (await cache.lookup("url", prompt(1), lease=False)).matched_tokens

    assert asyncio.run(main()) == 2 * PS


@pytest.mark.parametrize("bad", [42, b"redis://127.0.0.1:1/0", None])
def test_anything_else_is_refused_with_the_way_out(bad):
    with pytest.raises(TypeError, match="from_url"):
        PrefixCache(bad)
    with pytest.raises(TypeError, match="from_url"):
        AsyncPrefixCache(bad)


def test_a_dropped_match_releases_its_lease(daemon, probe):
    cache = PrefixCache(url(daemon))
    cache.store("drop", prompt(100), data())
    match = cache.lookup("drop", prompt(100))
    assert match.lease and stats(probe, "drop")["leases"] == 1

    def drop():
        nonlocal match
        del match

    caught = dropped_warnings(drop)
    assert len(caught) == 1 and "Match with lease" in str(caught[0].message)
    assert stats(probe, "drop")["leases"] == 0  # released on the spot: the connection was free
    cache.close()


def test_a_dropped_allocation_gives_its_blocks_back(daemon, probe):
    cache = PrefixCache(url(daemon))
    before = stats(probe)["blocks_leased"]
    assert len(cache.alloc("drop-alloc", 3).blocks) == 3  # the Allocation is dropped at once
    # (Its finaliser ran inside that statement: the ResourceWarning went to the default filters.)
    assert stats(probe)["blocks_leased"] == before and stats(probe, "drop-alloc")["leases"] == 0
    caught = dropped_warnings(lambda: cache.alloc("drop-alloc", 2))
    assert len(caught) == 1 and "Allocation with lease" in str(caught[0].message)
    assert stats(probe)["blocks_leased"] == before
    cache.close()


def test_released_results_do_not_warn(daemon, probe):
    cache = PrefixCache(url(daemon))
    cache.store("kept", prompt(200), data())

    def use():
        by_id = cache.lookup("kept", prompt(200))
        assert cache.release(by_id.lease) == 1  # by id, not by object: the object knows too
        with cache.lookup("kept", prompt(200)):
            pass
        cache.lookup("kept", prompt(200)).release()
        cache.lookup("kept", prompt(200), lease=False)  # no lease: nothing to warn about
        cache.lookup("nothing-here", prompt(200))  # a miss holds no lease
        held = cache.lookup("kept", prompt(200))
        assert held.lease
        cache.close()  # the connection's end ends the lease: dropping it afterwards is no leak

    assert dropped_warnings(use) == []
    wait_for(lambda: stats(probe, "kept")["leases"] == 0, 10, "the closed connection's lease to end")


def test_a_match_dropped_during_a_command_waits_for_the_connection(daemon, probe):
    """A finaliser that runs while a command is on the wire must not write into that exchange: the
    lease waits for the next command, which sends its release first."""
    cache = PrefixCache(url(daemon))
    cache.store("busy", prompt(300), data())
    match = cache.lookup("busy", prompt(300))
    with cache._io:  # as if a command of this cache were in flight
        lease = match.lease
        del match
        gc.collect()
        assert stats(probe, "busy")["leases"] == 1 and list(cache._dropped) == [lease]
    assert cache.info().page_size == PS  # the next command releases it first
    assert stats(probe, "busy")["leases"] == 0 and not cache._dropped
    cache.close()


def test_async_dropped_results_release_from_the_loop(daemon, probe):
    async def main():
        async with AsyncPrefixCache(url(daemon)) as cache:
            await cache.store("adrop", prompt(400), data())
            match = await cache.lookup("adrop", prompt(400))
            assert stats(probe, "adrop")["leases"] == 1
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ResourceWarning)
                del match
                gc.collect()
            assert any("never released" in str(w.message) for w in caught)
            # No further command: the release runs in a task on this loop.
            for _ in range(200):
                if stats(probe, "adrop")["leases"] == 0:
                    break
                await asyncio.sleep(0.01)
            assert stats(probe, "adrop")["leases"] == 0
            # And with a command right after the drop, that command sends the release first.
            match = await cache.lookup("adrop", prompt(400))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                del match
                gc.collect()
            await cache.info()
            assert stats(probe, "adrop")["leases"] == 0
            return True

    assert asyncio.run(main())
