"""A pipelined batch lets other connections run once it has run for a while.

Synchronous commands (PFXGET and PFXSET included, when their shard lock is free) take no
checkpoint of their own, so the connection's batch loop yields after BATCH_BUDGET_NS of work;
the replies stay whole and in order across the yields.
"""

from __future__ import annotations

import contextlib
import socket

import pytest
import trio

from pfxcache.daemon.server import connection
from pfxcache.daemon.server.clients import Client
from pfxcache.daemon.commands.context import Context
from pfxcache.daemon.config.engine import Config
from pfxcache.daemon.server.assembly import build_server
from pfxcache.daemon.server.listeners import ListenerSet
from pfxcache.protocol.replies import ReplyBuffer
from pfxcache.protocol.requests import RequestParser
from pfxcache.testing import encode_command

REQUESTS = 100


@pytest.fixture
def server():
    """A server over a small memory arena, listening nowhere: the batches come over a socket pair."""
    config = Config()
    config.apply_args(["--arena", "memory", "--maxmemory", "1mb"])
    with contextlib.ExitStack() as stack:
        yield build_server(config, ListenerSet([], 0), stack)


def _batch(budget_ns: int, monkeypatch, server) -> tuple[list, bytes]:
    monkeypatch.setattr(connection, "BATCH_BUDGET_NS", budget_ns)
    client = Client(1, "127.0.0.1:1", "127.0.0.1:2", 3)
    client.authenticated = True
    ctx = Context(server, client)
    parser = RequestParser()
    parser.feed(b"".join(encode_command("ECHO", str(i)) for i in range(REQUESTS)))
    out = ReplyBuffer()
    steps = []
    while (step := connection._run_buffered_requests(ctx, parser, out)) is not None:
        steps.append(step)
    return steps, b"".join(bytes(chunk) for chunk in out.take())


def test_a_long_batch_yields_and_keeps_its_replies_in_order(monkeypatch, server):
    steps, replies = _batch(0, monkeypatch, server)  # every check finds the budget spent
    assert steps and all(step is connection.YIELD for step in steps)
    # after a yield the batch starts over: the clock starts at its BATCH_CHECK-th command and
    # is looked at again BATCH_CHECK commands later, so each stretch runs 2 * BATCH_CHECK - 1
    assert len(steps) == (REQUESTS - 1) // (2 * connection.BATCH_CHECK - 1)
    assert replies == b"".join(b"$%d\r\n%d\r\n" % (len(str(i)), i) for i in range(REQUESTS))


def test_a_short_batch_runs_through(monkeypatch, server):
    steps, replies = _batch(10**12, monkeypatch, server)
    assert steps == []
    assert replies.count(b"\r\n") == 2 * REQUESTS


async def test_a_connection_that_yields_answers_every_request(monkeypatch, server):
    """serve_connection itself on a socket pair, the budget spent at every check: the
    pipeline's replies arrive whole and in order across the checkpoints."""
    monkeypatch.setattr(connection, "BATCH_BUDGET_NS", 0)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    client = Client(1, "127.0.0.1:1", "127.0.0.1:2", ours.fileno())
    client.authenticated = True
    expected = b"".join(b"$%d\r\n%d\r\n" % (len(str(i)), i) for i in range(REQUESTS))
    received = bytearray()
    theirs.sendall(b"".join(encode_command("ECHO", str(i)) for i in range(REQUESTS)))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection.serve_connection, server, ours, client)
            with trio.fail_after(10):
                while len(received) < len(expected):
                    await trio.lowlevel.wait_readable(theirs)
                    received += theirs.recv(1 << 16)
            nursery.cancel_scope.cancel()
    finally:
        ours.close()
        theirs.close()
    assert bytes(received) == expected
