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

import trio
from trio.lowlevel import wait_readable, wait_writable

from pfxcache.protocol.replies import ReplyBuffer, encode_into
from pfxcache.protocol.requests import NEED_DATA, ProtocolError, RequestParser

from pfxcache.daemon.server.clients import Client
from pfxcache.daemon.commands.context import NO_REPLY, Context, Muted
from pfxcache.daemon.commands.dispatch import Pending, execute, execute_pending
from pfxcache.daemon.server.fd_passing import discard_fds, send_with_fds

log = logging.getLogger("pfxcached")
_now = time.perf_counter_ns

# Redis reads 16 KiB at a time; a larger first read costs nothing and helps pipelines.
READ_SIZE = 64 * 1024
#: Replies buffered past this are written before the next pipelined request runs:
#: a client that pipelines big reads (PFXGET WITHDATA) and does not read its
#: replies holds at most this much (plus one reply) in the daemon, not one reply
#: per request it sent.
FLUSH_BYTES = 1 << 20


#: A pipelined batch lets the other connections run once it has run this long: its
#: commands take no checkpoint of their own (PFXGET and PFXSET neither, when their shard
#: lock is free), and 64 KiB of small PFXSETs that evict can take a while. The clock is
#: read every BATCH_CHECK commands, so a batch of a few requests never reads it.
BATCH_BUDGET_NS = 2_000_000
BATCH_CHECK = 16


class _Flush:
    __slots__ = ()


FLUSH = _Flush()


class _Yield:
    __slots__ = ()


YIELD = _Yield()


class OutputLimitReached(ConnectionError):
    """The client went over ``client-output-buffer-limit``: the connection is closed."""


class OutputLimit:
    """``client-output-buffer-limit`` (normal class) for one connection, as in Redis.

    Consulted only when a write would block: the bytes the daemon still holds
    for the client (the replies ``send`` has not accepted yet) may not exceed
    the hard limit, nor stay above the soft limit for more than soft-seconds.
    A client that does not read its replies is then disconnected instead of
    pinning the daemon's memory (and, for WITHDATA, its copy pins).
    """

    __slots__ = ("server", "client", "soft_since")

    def __init__(self, server: Any, client: Client) -> None:
        self.server = server
        self.client = client
        self.soft_since: float | None = None

    def fine(self) -> None:
        """Everything written: the soft limit's clock starts over."""
        self.soft_since = None

    async def wait_writable(self, sock: socket.socket, pending: int) -> None:
        """Wait until ``sock`` takes more, or raise OutputLimitReached."""
        hard, soft, seconds = self.server.config["client-output-buffer-limit"][0]
        if hard and pending > hard:
            self._reached(pending)
        if not soft or pending <= soft:
            self.soft_since = None
            await wait_writable(sock)
            return
        now = time.monotonic()
        if self.soft_since is None:
            self.soft_since = now
        remaining = seconds - (now - self.soft_since)
        if remaining < 0:
            self._reached(pending)
        # Wake up when the soft limit's time is up even if the client never reads.
        with trio.move_on_after(remaining + 0.01):
            await wait_writable(sock)

    def _reached(self, pending: int) -> None:
        client = self.client
        self.server.stats.client_output_buffer_limit_disconnections += 1
        log.warning(
            "Client id=%d addr=%s scheduled to be closed ASAP for overcoming of output buffer limits "
            "(%d bytes of replies unsent).", client.id, client.addr, pending,
        )
        raise OutputLimitReached(pending)


async def send_chunks(sock: socket.socket, chunks: list, limit: OutputLimit | None = None) -> int:
    """Write every buffer in ``chunks``; return the bytes written.

    With ``limit``, a write that would block checks client-output-buffer-limit
    (OutputLimitReached when the client is over it).
    """
    total = 0
    if len(chunks) == 1:
        view = memoryview(chunks[0])
        while view:
            try:
                sent = sock.send(view)
            except BlockingIOError:
                if limit is None:
                    await wait_writable(sock)
                else:
                    await limit.wait_writable(sock, view.nbytes)
                continue
            total += sent
            view = view[sent:]
        if limit is not None:
            limit.fine()
        return total
    views = [memoryview(chunk) for chunk in chunks]
    pending = sum(view.nbytes for view in views)
    while views:
        try:
            sent = sock.sendmsg(views[:1024])  # IOV_MAX
        except BlockingIOError:
            if limit is None:
                await wait_writable(sock)
            else:
                await limit.wait_writable(sock, pending)
            continue
        total += sent
        pending -= sent
        while sent:
            first = views[0]
            if sent >= first.nbytes:
                sent -= first.nbytes
                views.pop(0)
            else:
                views[0] = first[sent:]
                sent = 0
    if limit is not None:
        limit.fine()
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
    limit = OutputLimit(server, client)
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
                        await _write_replies(client, sock, out, stats, limit)
                    elif step is YIELD:
                        await trio.lowlevel.checkpoint()
                    else:
                        _emit(ctx, parser, out, await execute_pending(ctx, step))
                    step = _run_buffered_requests(ctx, parser, out)
                if client.pubsub is None and not client.outgoing_fds:  # no push writer, no descriptors
                    rest = _send_now(sock, out, stats)
                    if rest is not None:
                        await _send_rest(sock, rest, stats, limit)
                else:
                    await _write_replies(client, sock, out, stats, limit)
            except OSError:  # the peer is gone
                break
            finally:
                client.busy = False
                client.query_buffered = parser.buffered()
            if server.shutting_down:
                break
    finally:
        server.parsers.pop(client.id, None)
        if client.outgoing_fds:  # killed between a PFXATTACH and its reply
            discard_fds(client)


async def _write_replies(client: Client, sock: socket.socket, out: ReplyBuffer, stats: Any,
                         limit: OutputLimit) -> None:
    """Write the buffered replies; with a push writer (a subscriber), under its lock so frames never interleave."""
    if client.outgoing_fds:  # PFXATTACH's descriptors go with these bytes
        await send_with_fds(client, sock, out, stats)
        return
    subs = client.pubsub
    if subs is None:
        await _write(sock, out, stats, limit)
        return
    async with subs.push.lock:
        await _write(sock, out, stats, limit)


async def _write(sock: socket.socket, out: ReplyBuffer, stats: Any, limit: OutputLimit | None = None) -> None:
    """Write the buffered replies (OSError when the peer is gone or is over its output limit)."""
    rest = _send_now(sock, out, stats)
    if rest is not None:
        await _send_rest(sock, rest, stats, limit)


def _send_now(sock: socket.socket, out: ReplyBuffer, stats: Any) -> list | None:
    """Send the buffered replies as far as the socket takes them without waiting.

    Usually the whole batch fits the socket buffer and goes in one ``send``,
    with no coroutine and no await: None. Otherwise the buffers still to write
    (batches with large payloads always), for :func:`_send_rest`.
    """
    if not out.nbytes:
        return None
    chunks = out.take()
    if len(chunks) != 1:
        return chunks
    chunk = chunks[0]
    try:
        sent = sock.send(chunk)
    except BlockingIOError:
        return chunks
    if sent < len(chunk):
        stats.total_net_output_bytes += sent  # the rest is counted by _send_rest, as one write
        return [memoryview(chunk)[sent:]]
    # (The output limit's soft clock is already clear: every earlier write ended in fine().)
    stats.total_net_output_bytes += sent
    stats.total_writes_processed += 1
    return None


async def _send_rest(sock: socket.socket, rest: list, stats: Any, limit: OutputLimit | None) -> None:
    """Write what :func:`_send_now` left, waiting for the socket (and checking the output limit)."""
    sent = await send_chunks(sock, rest, limit)
    if limit is not None:
        limit.fine()
    stats.total_net_output_bytes += sent
    stats.total_writes_processed += 1


def _run_buffered_requests(ctx: Context, parser: RequestParser,
                           out: ReplyBuffer) -> Pending | _Flush | _Yield | None:
    """Run the complete requests buffered, in order, encoding replies into ``out``.

    Stops at a command whose handler is async and returns it for the caller
    to await (a plain function keeps the common, all-sync batch free of
    coroutine overhead), and returns FLUSH when ``out`` has grown past
    FLUSH_BYTES so the caller writes before running more, and YIELD once the
    batch has run for BATCH_BUDGET_NS so the caller lets other connections run.
    """
    client = ctx.client
    server = ctx.server
    ran = 0
    started = 0
    while not client.close_after_reply:
        if out.nbytes >= FLUSH_BYTES:
            return FLUSH
        ran += 1
        if ran % BATCH_CHECK == 0:
            if not started:
                started = _now()
            elif _now() - started >= BATCH_BUDGET_NS:
                return YIELD
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
        # _emit, inlined: this loop runs once per request.
        if client.mute or reply.__class__ is Muted:
            _emit(ctx, parser, out, reply)
            continue
        if reply is not NO_REPLY:
            encode_into(out, reply, client.resp)
        parser.authenticated = client.authenticated or not server.auth_required
    return None


def _emit(ctx: Context, parser: RequestParser, out: ReplyBuffer, reply: Any) -> None:
    client = ctx.client
    if reply.__class__ is Muted:  # EXEC: its parts were muted or not as they ran
        encode_into(out, reply.reply, client.resp)
    elif client.mute:  # CLIENT REPLY OFF / SKIP
        if client.mute > 0:
            client.mute -= 1
    elif reply is not NO_REPLY:
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
