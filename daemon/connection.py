"""One task per connection: thin glue between a socket and the sans-IO parser.

Wait until the socket is readable, read what it has, parse every complete
request in it, run each one in order, encode the replies into one buffer and
write them with one send (``sendmsg`` with scatter buffers when a reply carries
large bulk data). Cleanup is in ``finally``: whatever ends the task, the client
is unregistered and every resource it holds is released.

The socket is a plain non-blocking stdlib socket driven with
``trio.lowlevel.wait_readable``/``wait_writable``: a request/reply round trip
then costs one wait, one ``recv`` and one ``send``, where trio's socket
wrappers add a failed ``recv`` and two extra scheduler checkpoints per
operation. ``wait_readable`` is the connection's checkpoint, so a client that
pipelines without pause still yields to the others once per batch.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

from trio.lowlevel import wait_readable, wait_writable

from pfxcache.protocol.replies import ReplyBuffer, encode_into
from pfxcache.protocol.requests import NEED_DATA, ProtocolError, RequestParser

from .clients import Client
from .dispatch import NO_REPLY, Context, Pending, execute, execute_pending

log = logging.getLogger("pfxcached")

# Redis reads 16 KiB at a time; a larger first read costs nothing and helps pipelines.
READ_SIZE = 64 * 1024
#: Replies buffered past this are written before the next pipelined request runs:
#: a client that pipelines big reads (PFXGET WITHDATA) and does not read its
#: replies holds at most this much (plus one reply) in the daemon, not one reply
#: per request it sent.
FLUSH_BYTES = 1 << 20


class _Flush:
    __slots__ = ()


FLUSH = _Flush()


async def send_chunks(sock: socket.socket, chunks: list) -> int:
    """Write every buffer in ``chunks``; return the bytes written."""
    total = 0
    if len(chunks) == 1:
        view = memoryview(chunks[0])
        while view:
            try:
                sent = sock.send(view)
            except BlockingIOError:
                await wait_writable(sock)
                continue
            total += sent
            view = view[sent:]
        return total
    views = [memoryview(chunk) for chunk in chunks]
    while views:
        try:
            sent = sock.sendmsg(views[:1024])  # IOV_MAX
        except BlockingIOError:
            await wait_writable(sock)
            continue
        total += sent
        while sent:
            first = views[0]
            if sent >= first.nbytes:
                sent -= first.nbytes
                views.pop(0)
            else:
                views[0] = first[sent:]
                sent = 0
    return total


async def serve_connection(server: Any, sock: socket.socket, client: Client) -> None:
    """Serve one client until it quits, errs, is killed or the server stops."""
    config = server.config
    stats = server.stats
    ctx = Context(server, client)
    parser = RequestParser(
        proto_max_bulk_len=config["proto-max-bulk-len"],
        query_buffer_limit=config["client-query-buffer-limit"],
        authenticated=client.authenticated or not server.auth_required,
    )
    server.parsers[client.id] = parser
    out = ReplyBuffer()
    try:
        while not client.close_after_reply:
            await wait_readable(sock)
            try:
                data = sock.recv(max(READ_SIZE, parser.wanted()))
            except BlockingIOError:
                continue
            except OSError:
                break
            if not data:
                break
            client.last_interaction = time.monotonic()
            stats.total_net_input_bytes += len(data)
            stats.total_reads_processed += 1
            parser.feed(data)
            client.busy = True
            try:
                step = _run_buffered_requests(ctx, parser, out)
                while step is not None:
                    if step is FLUSH:
                        await _write(sock, out, stats)
                    else:
                        _emit(ctx, parser, out, await execute_pending(ctx, step))
                    step = _run_buffered_requests(ctx, parser, out)
                await _write(sock, out, stats)
            except OSError:  # the peer is gone
                break
            finally:
                client.busy = False
                client.query_buffered = parser.buffered()
            if server.shutting_down:
                break
    finally:
        server.parsers.pop(client.id, None)


async def _write(sock: socket.socket, out: ReplyBuffer, stats: Any) -> None:
    """Write the buffered replies (OSError when the peer is gone)."""
    if not len(out):
        return
    chunks = out.take()
    try:
        # Usually the whole batch of replies fits the socket buffer: write it
        # here and await only when it does not.
        sent = sock.send(chunks[0]) if len(chunks) == 1 else 0
        if len(chunks) > 1 or sent < len(chunks[0]):
            if len(chunks) == 1:
                chunks = [memoryview(chunks[0])[sent:]]
            sent += await send_chunks(sock, chunks)
    except BlockingIOError:
        sent = await send_chunks(sock, chunks)
    stats.total_net_output_bytes += sent
    stats.total_writes_processed += 1


def _run_buffered_requests(ctx: Context, parser: RequestParser, out: ReplyBuffer) -> Pending | _Flush | None:
    """Run the complete requests buffered, in order, encoding replies into ``out``.

    Stops at a command whose handler is async and returns it for the caller
    to await (a plain function keeps the common, all-sync batch free of
    coroutine overhead), and returns FLUSH when ``out`` has grown past
    FLUSH_BYTES so the caller writes before running more.
    """
    client = ctx.client
    while not client.close_after_reply:
        if len(out) >= FLUSH_BYTES:
            return FLUSH
        try:
            argv = parser.next_command()
        except ProtocolError as error:
            _protocol_error(ctx, error, out)
            return None
        if argv is NEED_DATA:
            return None
        reply = execute(ctx, argv)
        if reply.__class__ is Pending:
            return reply
        _emit(ctx, parser, out, reply)
    return None


def _emit(ctx: Context, parser: RequestParser, out: ReplyBuffer, reply: Any) -> None:
    client = ctx.client
    if reply is not NO_REPLY:
        encode_into(out, reply, client.resp)
    # AUTH / HELLO / RESET change the limits of the very next request.
    parser.authenticated = client.authenticated or not ctx.server.auth_required


def _protocol_error(ctx: Context, error: ProtocolError, out: ReplyBuffer) -> None:
    client = ctx.client
    stats = ctx.server.stats
    if error.reply is not None:
        stats.error("ERR")
        out.write(error.reply)
        log.log(15, "Protocol error (%s) from client: id=%d addr=%s", error.message, client.id, client.addr)
    else:
        stats.client_query_buffer_limit_disconnections += 1
        log.warning("Closing client that reached max query buffer length: id=%d addr=%s", client.id, client.addr)
    client.close_after_reply = True
