"""The Prometheus endpoint: a small HTTP/1.1 server (h11 over trio) that answers ``GET /metrics``.

It runs on the daemon's event loop, like every other task: a scrape reads the
figures between two commands, so it sees the store consistent and needs no
lock (prometheus-client's own HTTP server would read them from another
thread). One task per connection, keep-alive as Prometheus uses it, a request
size limit and an idle timeout so a stuck or hostile client costs one task
and nothing else. ``metrics-port`` 0 (the default) opens nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING

import h11
import trio

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("pfxcached")

IDLE_TIMEOUT = 30.0  # seconds a connection may sit without sending a whole request
MAX_REQUEST_BYTES = 16 * 1024  # request line and headers; scrapes carry no body
MAX_CONNECTIONS = 64  # concurrent scrape connections; more are closed at once

INDEX = b"pfxcache metrics: see /metrics\n"


class MetricsEndpoint:
    """Listeners on ``metrics-bind``:``metrics-port`` serving ``registry``."""

    def __init__(self, listeners: list[trio.SocketListener], registry: CollectorRegistry) -> None:
        self.listeners = listeners
        self.registry = registry
        self.addresses = [_address(listener) for listener in listeners]
        self.port = int(self.addresses[0].rsplit(":", 1)[1]) if self.addresses else 0
        self._open = 0

    @classmethod
    async def open(cls, bind: list[str] | tuple[str, ...], port: int,
                   registry: CollectorRegistry) -> MetricsEndpoint | None:
        """Bind every address (None when ``port`` is 0); OSError when one cannot be bound."""
        if not port:
            return None
        listeners: list[trio.SocketListener] = []
        try:
            for host in bind:
                listeners += await trio.open_tcp_listeners(port, host=host.lstrip("-"))
        except OSError:
            for listener in listeners:
                await listener.aclose()
            raise
        return cls(listeners, registry)

    async def serve(self) -> None:
        """Serve until cancelled (the daemon's shutdown), then close the listeners."""
        try:
            async with trio.open_nursery() as nursery:
                for listener in self.listeners:
                    nursery.start_soon(self._accept, listener, nursery)
        finally:
            for listener in self.listeners:
                with trio.CancelScope(shield=True):
                    await listener.aclose()

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # out of descriptors and the like: wait, do not spin
                log.warning("metrics endpoint: accept failed: %s", exc)
                await trio.sleep(0.1)
                continue
            if self._open >= MAX_CONNECTIONS:
                await stream.aclose()
                continue
            nursery.start_soon(self._connection, stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        self._open += 1
        try:
            await _serve_http(stream, self._respond)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            pass
        finally:
            self._open -= 1
            await trio.aclose_forcefully(stream)

    def _respond(self, request: h11.Request) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        if request.method not in (b"GET", b"HEAD"):
            return 405, [(b"allow", b"GET, HEAD"), (b"content-type", b"text/plain")], b"only GET and HEAD\n"
        path = request.target.split(b"?", 1)[0]
        if path == b"/metrics":
            from prometheus_client.exposition import choose_encoder  # with the registry: installed

            accept = dict(request.headers).get(b"accept", b"").decode("latin-1")
            encoder, content_type = choose_encoder(accept)
            return 200, [(b"content-type", content_type.encode())], encoder(self.registry)
        if path == b"/":
            return 200, [(b"content-type", b"text/plain")], INDEX
        return 404, [(b"content-type", b"text/plain")], b"not found: see /metrics\n"


async def _serve_http(stream: trio.SocketStream,
                      respond: Callable[[h11.Request], tuple[int, list[tuple[bytes, bytes]], bytes]]) -> None:
    """Answer the requests of one connection until it closes, errs or idles out."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    while True:
        event = await _next_event(conn, stream)
        if event is None:
            return
        if isinstance(event, h11.Request):
            # h11 bounds a request that arrives in pieces; one that arrives whole is bounded here.
            size = len(event.target) + sum(len(name) + len(value) + 4 for name, value in event.headers)
            if size > MAX_REQUEST_BYTES:
                status, body = 431, b"request headers too large\n"
                headers = [(b"content-type", b"text/plain"), (b"connection", b"close")]
            else:
                status, headers, body = respond(event)
            head = event.method == b"HEAD"
            headers = [*headers, (b"content-length", str(len(body)).encode())]
            await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers,
                                                         reason=HTTPStatus(status).phrase.encode())))
            if not head:
                await stream.send_all(conn.send(h11.Data(data=body)))
            await stream.send_all(conn.send(h11.EndOfMessage()))
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            return
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> h11.Event | None:
    """The next request-side event (reading as needed), or None: closed, timed out, or a bad request."""
    with trio.move_on_after(IDLE_TIMEOUT):
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                await _refuse(conn, stream, exc)
                return None
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)  # b"" marks the end of the stream
                continue
            if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, (h11.Data, h11.EndOfMessage)):
                if isinstance(event, h11.EndOfMessage):
                    return event
                continue  # a request body: read and ignored
            return event
    return None


async def _refuse(conn: h11.Connection, stream: trio.SocketStream, exc: h11.RemoteProtocolError) -> None:
    """Answer a malformed request with its error status, if a response can still be sent."""
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    body = f"bad request: {exc}\n".encode()
    status = exc.error_status_hint
    try:
        await stream.send_all(conn.send(h11.Response(
            status_code=status, reason=HTTPStatus(status).phrase.encode(),
            headers=[(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode()),
                     (b"connection", b"close")])))
        await stream.send_all(conn.send(h11.Data(data=body)))
        await stream.send_all(conn.send(h11.EndOfMessage()))
    except h11.LocalProtocolError:
        pass


def _address(listener: trio.SocketListener) -> str:
    host, port = listener.socket.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
