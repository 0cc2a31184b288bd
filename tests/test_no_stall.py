"""No command stalls the others: PFXCHECK on a million pages and large WITHDATA copies let other
clients in, and PFXCHECK is an @admin @dangerous command a tenant cannot run.

Non-stalling is tested by order, not by time: another client's command,
sent after the long one, is answered while the long one has not answered yet.
"""

from __future__ import annotations

import select

import numpy as np
import pytest
import redis
import trio

from pfxcache.daemon.service.forked_check import check_in_child
from pfxcache.daemon.store import PrefixStore
from pfxcache.daemon.store.arena import MemoryArena
from test_transactions import Raw

MILLION = 1 << 20
RUN = 1 << 16  # tokens per PFXSET: 16 of them make the million pages


def _answered(conn: Raw, wait: float = 0.0) -> bool:
    return bool(conn.buffer) or bool(select.select([conn.sock], [], [], wait)[0])


@pytest.fixture(scope="module")
def million(tmp_path_factory):
    """A daemon holding a million one-token pages (16 runs of 65536 pages)."""
    from pfxcache.testing import start_daemon

    daemon = start_daemon("--page-size", "1", "--block-bytes", "4", "--maxmemory", str(4 * (MILLION + 1024)),
                          "--evict-low-watermark", "0")
    r = redis.Redis(port=daemon.port, protocol=3)
    for run in range(MILLION // RUN):
        tokens = np.arange(run * RUN, (run + 1) * RUN, dtype="<u4") + 1
        reply = r.execute_command("PFXSET", "big", "PACKED", tokens.tobytes(), "DATA", b"\0" * (4 * RUN))
        assert reply[b"stored"] == RUN
    r.close()
    yield daemon
    daemon.stop()


def test_pfxcheck_of_a_million_pages_lets_other_clients_in(million) -> None:
    checker, other = Raw(million.port), Raw(million.port)
    try:
        info = redis.Redis(port=million.port, protocol=3).execute_command("PFXINFO", "big")
        assert info[b"stats"][b"pages"] >= MILLION
        checker.send("PFXCHECK")
        # Sent after PFXCHECK, answered before it: the check does not hold the loop.
        assert other.call("PING") == b"+PONG\r\n"
        assert other.call("PFXSET", "small", "TOKENS", "7", "DATA", "abcd").startswith(b"*6\r\n")
        assert other.call("PFXGET", "small", "TOKENS", "7", "NOLEASE").startswith(b"*6\r\n$7\r\nmatched\r\n:1")
        assert not _answered(checker)
        assert checker.read() == b"+OK\r\n"
        assert checker.call("PFXCHECK") == b"+OK\r\n"  # the store the writes changed is consistent too
    finally:
        checker.close()
        other.close()


def test_the_forked_check_reports_violations() -> None:
    store = PrefixStore(MemoryArena(4, 8), page_size=1, shards=1)
    store.insert(b"a", np.arange(1, 4, dtype="<u4").tobytes(), data=b"x" * 12)
    forks: list[float] = []

    async def check() -> list[str]:
        return await check_in_child(store, timeout=60, on_fork=forks.append)

    assert trio.run(check) == [] and len(forks) == 1
    store._leased_by[0] = 12345
    problems = trio.run(check)
    assert problems and problems[0].startswith("lease index maps block 0")


def test_pfxcheck_is_admin_and_dangerous_so_a_pfx_tenant_cannot_run_it(fresh_daemon) -> None:
    daemon = fresh_daemon("--page-size", "4", "--block-bytes", "8", "--maxmemory", "4096")
    admin = redis.Redis(port=daemon.port)
    admin.execute_command("ACL", "SETUSER", "tenant-a", "on", ">s3cret", "~tenant-a:*", "+@pfx", "+ping", "+hello")
    info = admin.execute_command("COMMAND", "INFO", "PFXCHECK")["pfxcheck"]  # parsed by redis-py
    assert set(info["acl_categories"]) == {"@admin", "@slow", "@dangerous"}
    assert b"pfxcheck" in admin.execute_command("ACL", "CAT", "dangerous")
    assert b"pfxcheck" not in admin.execute_command("ACL", "CAT", "pfx")
    tenant = redis.Redis(port=daemon.port, username="tenant-a", password="s3cret")
    with pytest.raises(redis.exceptions.NoPermissionError, match="pfxcheck"):
        tenant.execute_command("PFXCHECK")
    assert admin.execute_command("PFXCHECK") == b"OK"
    tenant.close()
    admin.close()


def test_a_large_withdata_copy_lets_other_clients_in(fresh_daemon) -> None:
    """64 MiB copied out of the arena in a worker thread: a PING sent after it is answered first."""
    daemon = fresh_daemon("--page-size", "4", "--block-bytes", str(1 << 20), "--maxmemory", str(80 << 20))
    tokens = [str(t) for t in range(1, 257)]  # 64 pages of 1 MiB
    loader = redis.Redis(port=daemon.port)
    loader.execute_command("PFXSET", "kv", "TOKENS", *tokens, "DATA", b"d" * (64 << 20))
    loader.close()
    reader, other = Raw(daemon.port), Raw(daemon.port)
    try:
        for _ in range(3):
            reader.send("PFXGET", "kv", "TOKENS", *tokens, "NOLEASE", "WITHDATA")
            assert other.call("PING") == b"+PONG\r\n"
            reply = reader.read()
            assert reply.startswith(b"*8\r\n$7\r\nmatched\r\n:256\r\n") and reply.count(b"d") >= 64 << 20
    finally:
        reader.close()
        other.close()


def test_pfxcheck_of_a_large_arena_with_few_pages_lets_other_clients_in(fresh_daemon) -> None:
    """The README tour's geometry: 8-byte blocks in the default 256 MB (33.5 million blocks), 10
    pages cached. A check is as long as the arena, not as the pages: PINGs sent after PFXCHECK, each
    after the last one's reply, are answered while PFXCHECK has not answered."""
    daemon = fresh_daemon("--page-size", "4", "--block-bytes", "8")
    loader = redis.Redis(port=daemon.port, protocol=3)
    for page in range(10):
        loader.execute_command("PFXSET", "tour", "TOKENS", *range(4 * page + 1, 4 * page + 5), "DATA", b"k" * 8)
    info = loader.execute_command("PFXINFO")
    assert (info[b"stats"][b"pages"], info[b"stats"][b"blocks_total"]) == (10, 256 * 1024**2 // 8)
    loader.close()
    checker, other = Raw(daemon.port), Raw(daemon.port)
    try:
        checker.send("PFXCHECK")
        for _ in range(3):  # the first PING may be read before PFXCHECK; the later ones are not
            assert other.call("PING") == b"+PONG\r\n"
            assert not _answered(checker)
        assert checker.read() == b"+OK\r\n"
    finally:
        checker.close()
        other.close()


def test_the_check_finds_a_block_in_use_that_nothing_references() -> None:
    """The pass over the block states (no Python step per block) still sees every block."""
    store = PrefixStore(MemoryArena(8, 1 << 20), page_size=1, shards=1)
    store.insert(b"a", np.arange(1, 4, dtype="<u4").tobytes(), data=b"x" * 24)
    assert store.check() == []
    store._alloc._state[(1 << 20) - 1] = 1  # TREE, owned by no page
    assert f"block {(1 << 20) - 1} is tree but nothing references it" in store.check()
