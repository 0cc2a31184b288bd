"""PrefixCache and AsyncPrefixCache run the same description of each operation (client/core.py): for
every call, both send the same commands, as the daemon's commandstats count them, and get equal results.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import redis
from pfxcache.client import AsyncPrefixCache, PrefixCache
from pfxcache.testing import start_daemon

PS, BB = 4, 256


@pytest.fixture(scope="module")
def daemon():
    instance = start_daemon("--maxmemory", str(256 * BB), "--page-size", str(PS), "--block-bytes", str(BB),
                            "--evict-low-watermark", "0")
    yield instance
    assert instance.stop() == 0, instance.log_text()


def calls(probe: redis.Redis) -> dict[str, int]:
    """The PFX* commands' call counts (the handshake, HELLO, comes whenever redis-py connects)."""
    return {name: stat["calls"] for name, stat in probe.info("commandstats").items()
            if name.startswith("cmdstat_pfx")}


def tokens(seed: int, pages: int) -> list[int]:
    return list(range(seed, seed + pages * PS))


def data(pages: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, pages * BB, dtype=np.uint8).tobytes()


def scenario(ns: str):
    """(name, call) pairs; a call takes the cache and returns a comparable result (maybe awaitable)."""
    out = np.zeros(4 * BB, np.uint8)
    return [
        ("info", lambda c: c.info()),
        ("miss", lambda c: c.lookup(ns, tokens(1, 2))),
        ("store", lambda c: c.store(ns, tokens(1, 2), data(2, 1))),
        ("store again", lambda c: c.store(ns, tokens(1, 2), data(2, 1))),
        ("lookup with data", lambda c: c.lookup(ns, tokens(1, 2), lease=False, with_data=True)),
        ("save", lambda c: c.save(ns, tokens(1, 2) + tokens(50, 1), data(1, 2), offset=2 * PS)),
        ("load", lambda c: c.load(ns, tokens(1, 2) + tokens(50, 1), out)),
        ("evict pages", lambda c: c.evict(ns, pages=1)),
        ("evict all", lambda c: c.evict(ns, all=True)),
        ("release nothing", lambda c: c.release()),
    ]


def comparable(result):
    # Lease ids and block ids differ between runs; what was found, stored and moved does not.
    for field in ("lease", "blocks"):
        if hasattr(result, field):
            result = {k: v for k, v in vars(result).items() if k not in ("lease", "blocks") and not k.startswith("_")}
            break
    return result if not hasattr(result, "stats") else (result.page_size, result.block_bytes, result.policy)


@pytest.mark.parametrize("attach", [None, False])
def test_both_front_ends_send_the_same_commands(daemon, attach):
    probe = redis.Redis(host=daemon.host, port=daemon.port)
    url = f"redis://{daemon.host}:{daemon.port}/0"
    try:
        sync_cache = PrefixCache.from_url(url, attach=attach)
        sync_steps = []
        for name, call in scenario(f"steps-sync-{attach}"):
            before = calls(probe)
            result = comparable(call(sync_cache))
            after = calls(probe)
            sync_steps.append((name, result, {k: v - before.get(k, 0) for k, v in after.items()
                                              if v != before.get(k, 0)}))
        sync_cache.close()

        async def run_async():
            steps = []
            cache = AsyncPrefixCache.from_url(url, attach=attach)
            for name, call in scenario(f"steps-async-{attach}"):
                before = calls(probe)
                result = comparable(await call(cache))
                after = calls(probe)
                steps.append((name, result, {k: v - before.get(k, 0) for k, v in after.items()
                                             if v != before.get(k, 0)}))
            await cache.aclose()
            return steps

        async_steps = asyncio.run(run_async())
    finally:
        probe.close()
    assert [name for name, _, _ in async_steps] == [name for name, _, _ in sync_steps]
    for (name, sync_result, sync_sent), (_, async_result, async_sent) in zip(sync_steps, async_steps):
        assert async_sent == sync_sent, name
        assert async_result == sync_result, name
    sent = dict((name, commands) for name, _, commands in sync_steps)
    # The first call that needs the geometry fetches it (one PFXINFO), and no call after it.
    assert sent["info"] == {"cmdstat_pfxinfo": 1}
    assert sum(commands.get("cmdstat_pfxinfo", 0) for name, _, commands in sync_steps[1:]) == 1
    if attach is None:  # through the mapped arena: allocate, write in place, commit, release
        assert sent["save"] == {"cmdstat_pfxalloc": 1, "cmdstat_pfxset": 1, "cmdstat_pfxrelease": 1}
        assert sent["load"] == {"cmdstat_pfxget": 1, "cmdstat_pfxrelease": 1}
    else:  # over RESP: one command each (save also fetched the geometry it needs, the first to)
        assert {k: v for k, v in sent["save"].items() if k != "cmdstat_pfxinfo"} == {"cmdstat_pfxset": 1}
        assert sent["load"] == {"cmdstat_pfxget": 1}
    assert sent["release nothing"] == {}
