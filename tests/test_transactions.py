"""MULTI/EXEC/DISCARD/WATCH/UNWATCH: Redis 7.0.15's replies byte for byte, WATCH on namespaces,
PFX* commands in a transaction with no other client's command in between, redis-py pipelines.

Sequences Redis defines run on one raw connection to each server and the
replies are compared byte for byte (RESP2 and RESP3). What only a namespace
has (pages, touches) is checked on the daemon through the PFX* commands.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading

import pytest
import redis
import redis.asyncio

from pfxcache.testing import encode_command, start_daemon

GEOMETRY = ("--page-size", "4", "--block-bytes", "8", "--maxmemory", "4096")
PROMPT = ("TOKENS", "1", "2", "3", "4")


@pytest.fixture(scope="module")
def pfx():
    daemon = start_daemon(*GEOMETRY)
    yield daemon
    daemon.stop()


def frame_end(buf: bytes, pos: int = 0) -> int | None:
    """Where the RESP2/RESP3 reply starting at ``buf[pos]`` ends, or None if it is not all there."""
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        return None
    kind, head = buf[pos:pos + 1], buf[pos + 1:line_end]
    after = line_end + 2
    if kind in b"$!=":
        size = int(head)
        if size < 0:
            return after
        return after + size + 2 if len(buf) >= after + size + 2 else None
    if kind in b"*~>%|":
        count = int(head)
        if count < 0:
            return after
        for _ in range(count * (2 if kind in b"%|" else 1)):
            after = frame_end(buf, after)
            if after is None:
                return None
        if kind == b"|":  # an attribute precedes the reply it describes
            return frame_end(buf, after)
        return after
    return after


class Raw:
    """One raw connection: send a command, read exactly the bytes of one reply."""

    def __init__(self, port: int, resp: int = 2) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.buffer = b""
        if resp == 3:
            self.call("HELLO", "3")

    def send(self, *args) -> None:
        self.sock.sendall(encode_command(*args))

    def read(self) -> bytes:
        """The bytes of the next whole reply."""
        while True:
            end = frame_end(self.buffer) if self.buffer else None
            if end is not None:
                frame, self.buffer = self.buffer[:end], self.buffer[end:]
                return frame
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk

    def call(self, *args) -> bytes:
        self.send(*args)
        return self.read()

    def close(self) -> None:
        self.sock.close()


SEQUENCES = [
    # nesting, queueing, errors while queueing, EXECABORT
    [("MULTI",), ("MULTI",), ("PING",), ("ECHO", "x"), ("EXEC",)],
    [("MULTI",), ("NOPE", "a"), ("PING",), ("EXEC",), ("EXEC",)],
    [("MULTI",), ("PING", "a", "b"), ("EXEC",)],
    [("MULTI",), ("WATCH", "k"), ("PING",), ("EXEC",)],
    [("MULTI",), ("EXEC", "x"), ("EXEC",)],
    [("MULTI", "x"), ("DISCARD", "x"), ("WATCH",), ("UNWATCH", "x"), ("EXEC",), ("DISCARD",)],
    [("MULTI",), ("ECHO", "q"), ("DISCARD",), ("EXEC",)],
    [("MULTI",), ("EXEC",)],
    [("MULTI",), ("RESET",), ("EXEC",)],
    [("MULTI",), ("SHUTDOWN",), ("EXEC",)],
    [("MULTI",), ("UNWATCH",), ("EXISTS", "nope"), ("EXEC",)],
    [("WATCH", "nope"), ("MULTI",), ("EXISTS", "nope"), ("DEL", "nope"), ("EXEC",)],
    [("WATCH", "a", "b"), ("UNWATCH",), ("MULTI",), ("TTL", "a"), ("EXEC",)],
    [("MULTI",), ("CONFIG", "GET", "maxclients"), ("CLIENT", "ID", "x"), ("EXEC",)],
    [("MULTI",), ("SELECT", "x"), ("SELECT", "0"), ("PING",), ("EXEC",)],
]


@pytest.mark.parametrize("resp", [2, 3])
@pytest.mark.parametrize("sequence", SEQUENCES, ids=lambda seq: " ".join(c[0] for c in seq))
def test_sequences_answer_as_redis_server(pfx, redis_server, resp, sequence) -> None:
    ours, theirs = Raw(pfx.port, resp), Raw(redis_server.port, resp)
    try:
        for side in (ours, theirs):  # the reference is shared by the session: start both from empty
            assert side.call("FLUSHALL") == b"+OK\r\n"
        for command in sequence:
            mine, ref = ours.call(*command), theirs.call(*command)
            if command[0] == "CONFIG":  # queued in both; the value differs (maxclients)
                continue
            assert mine == ref, (command, mine, ref)
    finally:
        ours.close()
        theirs.close()


MUTED_SEQUENCES = [
    # CLIENT REPLY inside and around MULTI: Redis writes EXEC's header, then each reply as it runs,
    # dropped while muted at that moment (the count stays), and a SKIP inside mutes the command after EXEC
    [("MULTI",), ("PING",), ("CLIENT", "REPLY", "OFF"), ("PING",), ("EXEC",), ("PING",)],
    [("MULTI",), ("PING",), ("CLIENT", "REPLY", "SKIP"), ("ECHO", "a"), ("EXEC",), ("ECHO", "b"), ("ECHO", "c")],
    [("CLIENT", "REPLY", "OFF"), ("MULTI",), ("PING",), ("CLIENT", "REPLY", "ON"), ("ECHO", "x"), ("EXEC",)],
    [("MULTI",), ("ECHO", "a"), ("EXEC",), ("CLIENT", "REPLY", "SKIP"), ("MULTI",), ("ECHO", "b"), ("EXEC",)],
    [("MULTI",), ("CLIENT", "REPLY", "OFF"), ("CLIENT", "REPLY", "ON"), ("ECHO", "a"), ("EXEC",), ("ECHO", "b")],
    [("MULTI",), ("ECHO", "a"), ("CLIENT", "REPLY", "SKIP"), ("EXEC",), ("ECHO", "b"), ("ECHO", "c")],
    [("MULTI",), ("CLIENT", "REPLY", "SKIP"), ("CLIENT", "REPLY", "SKIP"), ("ECHO", "a"), ("EXEC",), ("ECHO", "b")],
    [("MULTI",), ("CLIENT", "REPLY", "OFF"), ("CLIENT", "REPLY", "SKIP"), ("ECHO", "a"), ("EXEC",), ("ECHO", "b")],
    [("MULTI",), ("CLIENT", "REPLY", "SKIP"), ("CLIENT", "REPLY", "ON"), ("ECHO", "a"), ("EXEC",), ("ECHO", "b")],
    [("MULTI",), ("CLIENT", "REPLY", "BAD"), ("ECHO", "a"), ("EXEC",)],
    [("CLIENT", "REPLY", "SKIP"), ("EXEC",), ("MULTI",), ("CLIENT", "REPLY", "OFF"), ("EXEC",), ("ECHO", "z")],
]
END = ("ECHO", "end of sequence")


def muted_stream(port: int, resp: int, sequence: list) -> bytes:
    """Every byte the server sends for ``sequence``, then CLIENT REPLY ON and END (muted replies leave no frame)."""
    side = Raw(port, resp)
    try:
        assert side.call("FLUSHALL") == b"+OK\r\n"
        for command in (*sequence, ("CLIENT", "REPLY", "ON"), END):
            side.send(*command)
        tail = b"$15\r\nend of sequence\r\n"
        stream = side.buffer
        while not stream.endswith(tail):
            chunk = side.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            stream += chunk
        return stream
    finally:
        side.close()


@pytest.mark.parametrize("resp", [2, 3])
@pytest.mark.parametrize("sequence", MUTED_SEQUENCES, ids=lambda seq: " ".join(c[-1] for c in seq))
def test_exec_under_client_reply_streams_as_redis_server(pfx, redis_server, resp, sequence) -> None:
    mine, ref = muted_stream(pfx.port, resp, sequence), muted_stream(redis_server.port, resp, sequence)
    assert mine == ref


def test_exec_of_async_commands_under_client_reply_skip(pfx) -> None:
    """The async path (PFX* commands run alone) mutes as the synchronous one: SKIP mutes the command after EXEC."""
    alone = muted_stream(pfx.port, 2, [("PFXSET", "skip-alone", *PROMPT, "DATA", "x" * 8)])
    stored = alone[: -len(b"+OK\r\n$15\r\nend of sequence\r\n")]
    stream = muted_stream(pfx.port, 2, [("MULTI",), ("PFXSET", "skip-queued", *PROMPT, "DATA", "x" * 8),
                                        ("CLIENT", "REPLY", "SKIP"), ("EXEC",), ("ECHO", "muted"), ("ECHO", "c")])
    assert stream == b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n" + stored + b"$1\r\nc\r\n+OK\r\n$15\r\nend of sequence\r\n"


def test_watch_touched_by_another_client_aborts_as_in_redis(pfx, redis_server) -> None:
    """The same dance on both servers: WATCH, another client writes the key, EXEC answers null."""
    for resp in (2, 3):
        replies = {}
        for name, port, write in (("ours", pfx.port, ("PFXSET", "w", *PROMPT, "DATA", "x" * 8)),
                                  ("ref", redis_server.port, ("SET", "w", "1"))):
            watcher, other = Raw(port, resp), Raw(port)
            other.call("DEL", "w")
            seen = [watcher.call("WATCH", "w"), other.call(*write)[:0], watcher.call("MULTI"),
                    watcher.call("EXISTS", "w"), watcher.call("EXEC"),
                    # after an aborted EXEC nothing is watched any more: the next one runs
                    watcher.call("MULTI"), watcher.call("EXISTS", "w"), watcher.call("EXEC")]
            other.call("DEL", "w")
            watcher.close()
            other.close()
            replies[name] = seen
        assert replies["ours"] == replies["ref"]
        assert replies["ours"][4] == (b"*-1\r\n" if resp == 2 else b"_\r\n")


def _watch_then(pfx, setup, action, *, resp: int = 2) -> bytes:
    """WATCH ns (after ``setup``), run ``action`` on another connection, then MULTI/PING/EXEC."""
    watcher, other = Raw(pfx.port, resp), Raw(pfx.port)
    try:
        other.call("FLUSHALL")
        for command in setup:
            other.call(*command)
        assert watcher.call("WATCH", "ns") == b"+OK\r\n"
        for command in action:
            other.call(*command)
        watcher.call("MULTI")
        watcher.call("PING")
        return watcher.call("EXEC")
    finally:
        watcher.close()
        other.close()


STORE = ("PFXSET", "ns", *PROMPT, "DATA", "x" * 8)
STORE_TWO = ("PFXSET", "ns", "TOKENS", *"12345678", "DATA", "x" * 16)
ABORTED, RAN = b"*-1\r\n", b"*1\r\n+PONG\r\n"


@pytest.mark.parametrize(("setup", "action"), [
    ((), (STORE,)),  # a page enters
    ((STORE,), (STORE_TWO,)),  # one more page enters
    ((STORE_TWO,), (("PFXEVICT", "ns", "PAGES", "1"),)),
    ((STORE,), (("PFXEVICT", "ns", "ALL"),)),
    ((STORE,), (("DEL", "ns"),)),
    ((STORE,), (("UNLINK", "ns"),)),
    ((STORE,), (("FLUSHALL",),)),
    ((STORE,), (("FLUSHDB",),)),
    ((STORE,), (("EXPIRE", "ns", "100"),)),
    ((STORE, ("EXPIRE", "ns", "100")), (("PERSIST", "ns"),)),
    ((STORE,), (("PEXPIRE", "ns", "1"), ("PFXGET", "ns", *PROMPT, "NOLEASE"))),  # expiry
])
def test_a_namespace_is_touched_when_its_pages_or_expiry_change(pfx, setup, action) -> None:
    assert _watch_then(pfx, setup, action) == ABORTED


@pytest.mark.parametrize(("setup", "action"), [
    ((), ()),
    ((STORE,), (("PFXGET", "ns", *PROMPT),)),  # a read that leases
    ((STORE,), (("PFXGET", "ns", *PROMPT, "NOLEASE", "WITHDATA"),)),
    ((STORE,), (STORE,)),  # nothing new stored
    ((STORE,), (("TOUCH", "ns"), ("EXISTS", "ns"), ("TTL", "ns"), ("PFXINFO", "ns"))),
    ((STORE,), (("PFXALLOC", "ns", "1"),)),
    ((STORE,), (("PERSIST", "ns"),)),  # no expiry to remove
    ((STORE,), (("PFXSET", "other", *PROMPT, "DATA", "x" * 8), ("DEL", "other"))),
    ((), (("DEL", "ns"), ("PFXEVICT", "ns", "ALL"))),  # nothing to delete
])
def test_reads_leases_and_other_namespaces_do_not_touch(pfx, setup, action) -> None:
    assert _watch_then(pfx, setup, action) == RAN


def test_eviction_for_space_touches_the_evicted_namespace(fresh_daemon) -> None:
    daemon = fresh_daemon("--page-size", "4", "--block-bytes", "512", "--maxmemory", "1024")  # two blocks
    watcher, other = Raw(daemon.port), Raw(daemon.port)
    try:
        other.call("PFXSET", "ns", *PROMPT, "DATA", "x" * 512)
        watcher.call("WATCH", "ns")
        other.call("PFXSET", "big", "TOKENS", *"12345678", "DATA", "y" * 1024)  # needs both blocks
        assert other.call("EXISTS", "ns") == b":0\r\n"
        watcher.call("MULTI")
        watcher.call("PING")
        assert watcher.call("EXEC") == ABORTED
    finally:
        watcher.close()
        other.close()


def test_pfx_commands_queue_and_run_in_order(pfx) -> None:
    conn = Raw(pfx.port)
    try:
        conn.call("FLUSHALL")
        assert conn.call("MULTI") == b"+OK\r\n"
        for command in (STORE, ("PFXGET", "ns", *PROMPT, "5", "NOLEASE"), ("DEL", "ns"),
                        ("PFXGET", "ns", *PROMPT, "NOLEASE"), ("PFXCHECK",)):
            assert conn.call(*command) == b"+QUEUED\r\n"
        reply = conn.call("EXEC")
        assert reply.startswith(b"*5\r\n*6\r\n$6\r\nstored\r\n:1\r\n")
        assert b"$7\r\nmatched\r\n:4\r\n" in reply and reply.endswith(b":1\r\n*6\r\n$7\r\nmatched\r\n:0\r\n"
                                                                     b"$5\r\nlease\r\n:0\r\n$6\r\nblocks\r\n*0\r\n+OK\r\n")
        # a PFX* argument error is one reply of the EXEC, the others still run
        conn.call("MULTI")
        conn.call("PFXGET", "ns", "NOPE", "1")
        conn.call("PING")
        assert conn.call("EXEC") == b"*2\r\n-ERR expected TOKENS or PACKED, got 'NOPE'\r\n+PONG\r\n"
    finally:
        conn.close()


def test_client_list_shows_the_queued_commands_as_redis_server(pfx, redis_server) -> None:
    for port in (pfx.port, redis_server.port):
        conn, other = Raw(port), redis.Redis(port=port)
        conn.call("CLIENT", "SETNAME", "tx")
        conn.call("MULTI")
        conn.call("PING")
        conn.call("PING")
        line = next(c for c in other.client_list() if c["name"] == "tx")
        assert (line["multi"], line["flags"]) == ("2", "x"), port
        conn.call("DISCARD")
        line = next(c for c in other.client_list() if c["name"] == "tx")
        assert (line["multi"], line["flags"]) == ("-1", "N"), port
        other.close()
        conn.close()


# -- no interleaving ----------------------------------------------------------------------------

BIG = ("--page-size", "4", "--block-bytes", str(1 << 18), "--maxmemory", str(64 << 20))


def test_an_exec_with_async_commands_lets_no_other_client_in(fresh_daemon) -> None:
    """A transaction stores two runs whose DATA is copied in worker threads (the loop is free
    meanwhile); a reader on another connection, racing it, must see all of it or none of it.
    Without the gate the reader lands between the two PFXSETs (it sees the first run only)."""
    daemon = fresh_daemon(*BIG)
    writer, reader = Raw(daemon.port), Raw(daemon.port)
    page = 1 << 18
    first = [str(t) for t in range(1, 17)]  # 4 pages: 1 MiB of DATA, copied off the loop
    second = first + [str(t) for t in range(17, 33)]
    seen = set()
    try:
        for round_ in range(12):
            writer.call("FLUSHALL")
            writer.send("MULTI")
            writer.send("PFXSET", "ns", "TOKENS", *first, "DATA", b"a" * (4 * page))
            writer.send("PFXSET", "ns", "TOKENS", *second, "OFFSET", "16", "DATA", b"b" * (4 * page))
            writer.send("EXEC")
            replies = []
            for _ in range(8):  # the reader asks while the EXEC runs
                replies.append(reader.call("PFXGET", "ns", "TOKENS", *second, "NOLEASE"))
            for _ in range(4):
                writer.read()
            for reply in replies:
                matched = int(reply.split(b"matched\r\n:", 1)[1].split(b"\r\n", 1)[0])
                seen.add(matched)
                assert matched in (0, 32), (round_, matched)
    finally:
        writer.close()
        reader.close()


def test_an_exec_waits_for_commands_already_under_way(fresh_daemon) -> None:
    """A PFXSET copying in a worker thread when the EXEC arrives finishes first: the EXEC sees it whole."""
    daemon = fresh_daemon(*BIG)
    page = 1 << 18
    tokens = [str(t) for t in range(1, 33)]  # 8 pages: 2 MiB copied off the loop
    loader, tx = Raw(daemon.port), Raw(daemon.port)
    try:
        for _ in range(8):
            loader.call("FLUSHALL")
            loader.send("PFXSET", "ns", "TOKENS", *tokens, "DATA", b"a" * (8 * page))
            tx.send("MULTI")
            tx.send("EXISTS", "ns")
            tx.send("PFXGET", "ns", "TOKENS", *tokens, "NOLEASE")
            tx.send("EXEC")
            loader.read()
            tx.read(), tx.read(), tx.read()
            reply = tx.read()
            exists = reply.split(b"\r\n")[1]
            matched = int(reply.split(b"matched\r\n:", 1)[1].split(b"\r\n", 1)[0])
            # Both replies come from one moment: before the PFXSET (0, 0) or after it (1, 32),
            # never EXISTS from before its commit and PFXGET from after it.
            assert (exists, matched) in ((b":0", 0), (b":1", 32))
    finally:
        loader.close()
        tx.close()


def test_two_clients_exec_alone_one_after_the_other(fresh_daemon) -> None:
    daemon = fresh_daemon(*BIG)
    page = 1 << 18
    tokens = [str(t) for t in range(1, 17)]
    conns = [Raw(daemon.port) for _ in range(3)]
    try:
        for _ in range(4):
            for i, conn in enumerate(conns):
                conn.send("MULTI")
                conn.send("PFXSET", f"ns{i}", "TOKENS", *tokens, "DATA", bytes([65 + i]) * (4 * page))
                conn.send("PFXGET", f"ns{i}", "TOKENS", *tokens, "NOLEASE", "WITHDATA")
                conn.send("EXEC")
            for i, conn in enumerate(conns):
                assert [conn.read() for _ in range(3)] == [b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n"]
                reply = conn.read()
                assert bytes([65 + i]) * (4 * page) in reply
            conns[0].call("FLUSHALL")
    finally:
        for conn in conns:
            conn.close()


def test_a_killed_client_inside_exec_opens_the_gate(fresh_daemon) -> None:
    daemon = fresh_daemon(*BIG)
    page = 1 << 18
    tokens = [str(t) for t in range(1, 33)]
    doomed = Raw(daemon.port)
    doomed.send("MULTI")
    for i in range(4):
        doomed.send("PFXSET", f"ns{i}", "TOKENS", *tokens, "DATA", b"z" * (8 * page))
    doomed.send("EXEC")
    doomed.sock.shutdown(socket.SHUT_RDWR)
    doomed.close()
    survivor = redis.Redis(port=daemon.port, socket_timeout=10)
    assert survivor.ping()
    assert survivor.execute_command("PFXCHECK") == b"OK"
    survivor.close()


# -- redis-py ----------------------------------------------------------------------------------

def _pipeline_commands(pipe) -> None:
    pipe.execute_command("PFXSET", "pipe", *PROMPT, "DATA", b"p" * 8)
    pipe.execute_command("PFXGET", "pipe", *PROMPT, "NOLEASE", "WITHDATA")
    pipe.execute_command("EXISTS", "pipe")
    pipe.execute_command("DEL", "pipe")


def _check_pipeline(results) -> None:
    stored, found, exists, deleted = results
    stored = {k.decode() if isinstance(k, bytes) else k: v for k, v in
              (stored.items() if isinstance(stored, dict) else zip(stored[::2], stored[1::2]))}
    found = {k.decode() if isinstance(k, bytes) else k: v for k, v in
             (found.items() if isinstance(found, dict) else zip(found[::2], found[1::2]))}
    assert stored["stored"] == 1 and found["matched"] == 4 and found["data"] == b"p" * 8
    assert (exists, deleted) == (1, 1)


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_transactional_pipeline(pfx, protocol) -> None:
    client = redis.Redis(port=pfx.port, protocol=protocol)
    try:
        pipe = client.pipeline()  # transaction=True: MULTI ... EXEC
        _pipeline_commands(pipe)
        _check_pipeline(pipe.execute())
        # WATCH through redis-py's helper: a touch from elsewhere raises WatchError
        other = redis.Redis(port=pfx.port, protocol=protocol)
        with client.pipeline() as pipe:
            pipe.watch("pipe")
            other.execute_command("PFXSET", "pipe", *PROMPT, "DATA", b"q" * 8)
            pipe.multi()
            pipe.execute_command("EXISTS", "pipe")
            with pytest.raises(redis.WatchError):
                pipe.execute()
        other.delete("pipe")
        other.close()
        # an error while queueing: redis-py raises it and the server discarded the transaction
        pipe = client.pipeline()
        pipe.execute_command("PFXGET")
        with pytest.raises(redis.ResponseError):
            pipe.execute()
        assert client.ping()
    finally:
        client.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_asyncio_transactional_pipeline(pfx, protocol) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis(port=pfx.port, protocol=protocol)
        try:
            pipe = client.pipeline(transaction=True)
            _pipeline_commands(pipe)
            _check_pipeline(await pipe.execute())
            results = await asyncio.gather(*(_one(client, i) for i in range(8)))
            assert results == [1] * 8
        finally:
            await client.aclose()

    async def _one(client, i: int) -> int:
        async with client.pipeline(transaction=True) as pipe:
            pipe.execute_command("PFXSET", f"a{i}", *PROMPT, "DATA", b"x" * 8)
            pipe.execute_command("EXISTS", f"a{i}")
            return (await pipe.execute())[1]

    asyncio.run(main())


def test_redis_cli_runs_a_transaction_as_with_redis_server(pfx, redis_server) -> None:
    script = "MULTI\nPING\nECHO x\nMULTI\nEXEC\nEXEC\nDISCARD\n"
    outputs = [subprocess.run(["redis-cli", "-p", str(port)], input=script, capture_output=True, text=True,
                              timeout=20).stdout for port in (pfx.port, redis_server.port)]
    assert outputs[0] == outputs[1]
    assert "QUEUED" in outputs[0] and "EXEC without MULTI" in outputs[0]


def test_a_touch_by_a_command_under_way_when_exec_came_aborts_it(fresh_daemon) -> None:
    """WATCH, then a PFXSET of the watched namespace is copying in a worker thread when EXEC
    arrives: EXEC waits for it, sees the touch and answers null. Were the WATCH checked before
    waiting, the EXEC would run and its PFXGET would see the pages the PFXSET stored."""
    daemon = fresh_daemon(*BIG)
    page = 1 << 18
    tokens = [str(t) for t in range(1, 33)]  # 8 pages: 2 MiB copied off the loop
    loader, tx = Raw(daemon.port), Raw(daemon.port)
    try:
        for _ in range(8):
            loader.call("FLUSHALL")
            tx.call("WATCH", "ns")
            tx.call("MULTI")
            tx.call("PFXGET", "ns", "TOKENS", *tokens, "NOLEASE")
            loader.send("PFXSET", "ns", "TOKENS", *tokens, "DATA", b"a" * (8 * page))
            tx.send("EXEC")
            loader.read()
            reply = tx.read()
            # Either the EXEC ran first (it saw nothing) or it saw the touch (null): never both
            # "ran" and "saw the pages".
            assert reply == b"*-1\r\n" or b"matched\r\n:0\r\n" in reply, reply[:80]
    finally:
        loader.close()
        tx.close()
