"""PFXGET and PFXSET run at once when nothing makes them wait (``handles_now``), else as before.

The synchronous attempts take a shard lock only if it is free (no holder, nobody queued), and
when they cannot they must change nothing, so the async handler runs the command from the start.
These tests hold the real locks of a real service and check both halves of that promise.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from pfxcache.daemon.config.engine import Config
from pfxcache.daemon.service.prefix import THREAD_COPY_THRESHOLD, PrefixService
from pfxcache.daemon.service.rwlock import RWLock
from pfxcache.daemon.server.assembly import build_command_table
from pfxcache.daemon.store import pack_tokens

PAGE = 16
BLOCK = 4096


def test_try_acquire_write_takes_only_a_free_lock():
    lock = RWLock()
    assert lock.try_acquire_write()
    assert not lock.try_acquire_write()  # a writer holds it
    assert not lock.try_acquire_read()
    lock.release_write()
    assert lock.try_acquire_read()
    assert not lock.try_acquire_write()  # a reader holds it
    lock.release_read()
    assert lock.statistics() == {"readers": 0, "writer": 0, "waiting_readers": 0, "waiting_writers": 0}


async def test_try_acquire_write_never_jumps_a_queued_reader():
    lock = RWLock()
    await lock.acquire_write()
    order = []

    async def reader():
        async with lock.read():
            order.append("r")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        lock.release_write()  # the queued reader is granted the lock before it wakes
        assert not lock.try_acquire_write()
        assert lock.statistics()["readers"] == 1
    assert order == ["r"]
    assert lock.try_acquire_write()
    lock.release_write()


@pytest.fixture
def service():
    config = Config()
    config.apply_args(["--arena", "memory", "--maxmemory", str(1024 * BLOCK), "--block-bytes", str(BLOCK),
                       "--page-size", str(PAGE)])
    service = PrefixService(config, tcp_port=0)
    yield service
    service.close()


def _lock(service, namespace, tokens):
    return service.locks[service.store.shard_of(namespace, tokens)]


def test_lookup_and_insert_run_at_once_when_the_lock_is_free(service):
    tokens = pack_tokens(range(1, 2 * PAGE + 1))
    stored = service.insert_now(b"ns", tokens, owner=1, data=b"x" * (2 * BLOCK))
    assert stored.stored == 2
    found = service.lookup_now(b"ns", tokens, owner=1, lease=True)
    assert found.matched_tokens == 2 * PAGE and found.lease_id and found.blocks == stored.blocks
    assert service.release([found.lease_id], 1) == 1
    assert service.lookup_now(b"ns", tokens, owner=1, lease=False).lease_id == 0
    assert service.store.check() == []


def test_a_held_lock_leaves_everything_to_the_async_path(service):
    tokens = pack_tokens(range(1, 2 * PAGE + 1))
    service.insert_now(b"ns", tokens, owner=1, data=b"x" * (2 * BLOCK))
    before = service.stats()
    lock = _lock(service, b"ns", tokens)
    assert lock.try_acquire_write()  # a PFXSET in flight (its copy awaits in a thread)
    try:
        assert service.lookup_now(b"ns", tokens, owner=2, lease=True) is None
        # a new prompt of the same shard (the first of a few candidates that hashes there)
        other = next(t for t in (pack_tokens(range(s, s + PAGE)) for s in range(100, 10_000, PAGE))
                     if _lock(service, b"ns", t) is lock)
        assert service.insert_now(b"ns", other, owner=2, data=b"y" * BLOCK) is None
    finally:
        lock.release_write()
    assert lock.try_acquire_read()  # a PFXGET in flight
    try:
        assert service.insert_now(b"ns", pack_tokens(range(1, 3 * PAGE + 1)), owner=2, offset=2 * PAGE,
                                  data=b"z" * BLOCK) is None
    finally:
        lock.release_read()
    after = service.stats()
    for name in ("hits_tokens", "misses_tokens", "leases", "pages", "inserts", "blocks_used"):
        assert after[name] == before[name], name
    assert service.store.check() == []


async def test_a_large_copy_goes_to_the_async_path(service):
    pages = THREAD_COPY_THRESHOLD // BLOCK
    tokens = pack_tokens(range(1, pages * PAGE + 1))
    data = b"d" * (pages * BLOCK)
    assert service.insert_now(b"ns", tokens, owner=1, data=data) is None  # copied in a thread: await it
    assert service.stats()["pages"] == 0
    result = await service.insert(b"ns", tokens, owner=1, data=data)
    assert result.stored == pages
    assert service.lookup_now(b"ns", tokens, owner=1, lease=False).matched_tokens == pages * PAGE


def test_only_pfxget_and_pfxset_have_a_synchronous_attempt():
    table = build_command_table()
    attempts = {spec.fullname for spec in table.walk() if spec.now is not None}
    assert attempts == {"pfxget", "pfxset"}
    assert all(table.get(name).is_async for name in attempts)
