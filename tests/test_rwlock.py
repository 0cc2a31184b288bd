"""The shard reader-writer lock: sharing, exclusion, fairness, cancellation."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from pfxcache.daemon.service.rwlock import RWLock


async def test_readers_share_writers_exclude():
    lock = RWLock()
    events = []

    async def reader(name):
        async with lock.read():
            events.append(("in", name))
            await trio.sleep(0.01)
            events.append(("out", name))

    async def writer(name):
        async with lock.write():
            events.append(("in", name))
            await trio.sleep(0.01)
            events.append(("out", name))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, "r1")
        nursery.start_soon(reader, "r2")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(writer, "w")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(reader, "r3")
    # r1 and r2 overlap; w runs alone after both; r3 (arrived after w) waits for w.
    assert set(events[:2]) == {("in", "r1"), ("in", "r2")}  # trio may start them in either order
    w_in = events.index(("in", "w"))
    assert set(events[2:w_in]) == {("out", "r1"), ("out", "r2")}
    assert events[w_in + 1] == ("out", "w")
    assert events[w_in + 2:] == [("in", "r3"), ("out", "r3")]


async def test_stream_of_readers_cannot_starve_a_writer():
    lock = RWLock()
    writer_done = trio.Event()
    reads_after_writer_done = 0
    stop = trio.Event()

    async def reader_stream(nursery):
        # Keep the lock read-held by overlapping readers, forever, until told to stop.
        async def one_read():
            nonlocal reads_after_writer_done
            async with lock.read():
                if writer_done.is_set():
                    reads_after_writer_done += 1
                await trio.sleep(0.005)

        while not stop.is_set():
            nursery.start_soon(one_read)
            await trio.sleep(0.001)

    async def writer():
        await trio.sleep(0.02)
        async with lock.write():
            writer_done.set()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader_stream, nursery)
            nursery.start_soon(writer)
            await writer_done.wait()
            await trio.sleep(0.02)
            stop.set()
    assert reads_after_writer_done > 0


async def test_cancelled_waiting_writer_lets_queued_readers_in():
    lock = RWLock()
    await lock.acquire_read()
    got_read = trio.Event()

    async def late_reader():
        async with lock.read():
            got_read.set()

    writer_scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_acquire_write_in, lock, writer_scope)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(late_reader)
        await trio.testing.wait_all_tasks_blocked()
        assert not got_read.is_set()  # queued behind the writer
        writer_scope.cancel()
        with trio.fail_after(1):
            await got_read.wait()
    lock.release_read()
    assert lock.statistics() == {"readers": 0, "writer": 0, "waiting_readers": 0, "waiting_writers": 0}


async def _acquire_write_in(lock, scope):
    with scope:
        await lock.acquire_write()
        lock.release_write()


async def test_cancelled_reader_leaves_no_trace():
    lock = RWLock()
    await lock.acquire_write()
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def waiting_reader():
            with scope:
                await lock.acquire_read()
                raise AssertionError("must not be granted while the writer holds the lock")

        nursery.start_soon(waiting_reader)
        await trio.testing.wait_all_tasks_blocked()
        assert lock.statistics()["waiting_readers"] == 1
        scope.cancel()
    assert lock.statistics()["waiting_readers"] == 0
    lock.release_write()
    await lock.acquire_write()  # free again
    lock.release_write()


async def test_writer_is_granted_before_newcomers():
    lock = RWLock()
    order = []
    await lock.acquire_read()

    async def writer():
        async with lock.write():
            order.append("w")

    async def reader():
        async with lock.read():
            order.append("r")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        lock.release_read()
    assert order == ["w", "r"]


def test_release_without_hold_is_an_error():
    lock = RWLock()
    with pytest.raises(RuntimeError):
        lock.release_read()
    with pytest.raises(RuntimeError):
        lock.release_write()


async def test_uncontended_read_hold_takes_no_checkpoint():
    lock = RWLock()
    with trio.testing.assert_no_checkpoints():
        async with lock.read():
            assert lock.statistics()["readers"] == 1
        async with lock.read():
            async with lock.read():  # readers share: still no wait
                assert lock.statistics()["readers"] == 2
    assert lock.statistics() == {"readers": 0, "writer": 0, "waiting_readers": 0, "waiting_writers": 0}


async def test_try_acquire_read_never_jumps_a_queued_writer():
    lock = RWLock()
    assert lock.try_acquire_read()
    order = []

    async def writer():
        async with lock.write():
            order.append("w")

    async def reader():
        async with lock.read():  # the fast path must refuse: a writer waits
            order.append("r")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()
        assert not lock.try_acquire_read()  # a writer is queued: no barging
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert lock.statistics() == {"readers": 1, "writer": 0, "waiting_readers": 1, "waiting_writers": 1}
        lock.release_read()
    assert order == ["w", "r"]
    await lock.acquire_write()
    assert not lock.try_acquire_read()  # a writer holds it
    lock.release_write()


async def test_stream_of_fast_path_readers_cannot_starve_a_writer():
    # Readers that only ever use the no-checkpoint fast path (back to back, no await between
    # their holds) still let a queued writer in: once it waits, every new read hold queues.
    lock = RWLock()
    granted = []

    async def writer():
        async with lock.write():
            granted.append("w")

    async def readers(name):
        for i in range(100):
            async with lock.read():
                granted.append(name)
                await trio.sleep(0)  # hold across a checkpoint: the two streams' holds overlap

    async with trio.open_nursery() as nursery:
        nursery.start_soon(readers, "a")
        nursery.start_soon(readers, "b")
        await trio.sleep(0)
        nursery.start_soon(writer)
    assert granted.index("w") < 10  # a barging fast path would keep the read count above 0 for all 200
