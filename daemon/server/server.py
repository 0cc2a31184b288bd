"""The trio server: accept loops, one task per connection, cron, graceful shutdown.

A :class:`Server` is built from services that are already open (listeners,
prefix store, KV events ...): :mod:`pfxcache.daemon.server.assembly` opens
them in order and closes them in reverse order. The server runs them::

    serve()
      connections nursery ─ one task per client (connection.serve_connection)
        control nursery   ─ accept loop per listener, cron, metrics, signal watcher
                            waits for the shutdown request, then is cancelled

Shutdown (SIGTERM, SIGINT or ``SHUTDOWN``): stop accepting and close the
listeners; close idle connections at once; let connections that are running
commands finish them and write their replies, up to ``shutdown-timeout``
seconds; then cancel whatever is left. ``serve`` then returns, and the
assembly releases every resource (pidfile, unix socket file, KV event
sockets, the arena).
"""

from __future__ import annotations

import errno
import logging
import secrets
import signal
import socket as stdlib_socket
import time
from typing import Any, Callable

import trio

from pfxcache import __version__

from pfxcache.daemon.commands.table import CommandTable
from pfxcache.daemon.commands.transactions import WatchRegistry
from pfxcache.daemon.config.engine import Config
from pfxcache.daemon.observability import logs
from pfxcache.daemon.observability.metrics_http import MetricsEndpoint
from pfxcache.daemon.observability.observers import CommandObservers
from pfxcache.daemon.observability.process import ProcessMemory
from pfxcache.daemon.observability.stats import Stats
from pfxcache.daemon.security.acl import AclUsers
from pfxcache.daemon.server.clients import Client, ClientRegistry
from pfxcache.daemon.server.connection import send_chunks, serve_connection
from pfxcache.daemon.server.errors import StartupError
from pfxcache.daemon.server.gate import CommandGate
from pfxcache.daemon.server.listeners import Listener, ListenerSet, configure_client_socket
from pfxcache.daemon.server.push import PushQueue
from pfxcache.daemon.service.kv_event_service import KvEventService
from pfxcache.daemon.service.persistence import Persistence, PersistenceError
from pfxcache.daemon.service.prefix import PrefixService
from pfxcache.daemon.service.pubsub import PubSub

log = logging.getLogger("pfxcached")

#: The Redis release whose behaviour (replies, errors, INFO fields) we reproduce.
REDIS_COMPAT_VERSION = "7.0.15"

MAX_CLIENTS_ERROR = b"-ERR max number of clients reached\r\n"
# Byte for byte redis-server 7.0.15's text, typo ("Setup a an") included.
PROTECTED_MODE_ERROR = (
    b"-DENIED Redis is running in protected mode because protected mode is enabled and no password is set "
    b"for the default user. In this mode connections are only accepted from the loopback interface. If you "
    b"want to connect from external computers to Redis you may adopt one of the following solutions: 1) Just "
    b"disable protected mode sending the command 'CONFIG SET protected-mode no' from the loopback interface by "
    b"connecting to Redis from the same host the server is running, however MAKE SURE Redis is not publicly "
    b"accessible from internet if you do so. Use CONFIG REWRITE to make this change permanent. 2) Alternatively "
    b"you can just disable the protected mode by editing the Redis configuration file, and setting the protected "
    b"mode option to 'no', and then restarting the server. 3) If you started the server manually just for "
    b"testing, restart it with the '--protected-mode no' option. 4) Setup a an authentication password for the "
    b"default user. NOTE: You only need to do one of the above things in order for the server to start "
    b"accepting connections from the outside.\r\n"
)
LOOPBACK_PEERS = ("127.0.0.1", "::1")


class Server:
    """The daemon: configuration, command table, clients, stats, and the serve loop.

    Handlers see it as a :class:`~pfxcache.daemon.commands.context.ServerState`:
    each figure INFO shows is read from its owner (``config``, ``stats``,
    ``clients``, ``prefix``, ``memory``), not forwarded by the server.

    Every service it is given is open already and stays open until ``serve``
    returns; the server closes none of them (their opener does, see assembly.py).
    """

    def __init__(self, config: Config, *, commands: CommandTable, acl: AclUsers, observers: CommandObservers,
                 listeners: ListenerSet, prefix: PrefixService, pubsub: PubSub,
                 kv_events: KvEventService, persistence: Persistence) -> None:
        self.config = config
        self.commands = commands
        #: ACL users; ``default`` follows requirepass, as in Redis.
        self.acl = acl
        #: MONITOR, SLOWLOG, LATENCY, ACL LOG.
        self.observers = observers
        #: The listening sockets; CONFIG SET port/bind rebinds them in place.
        self.listeners = listeners
        #: The prefix store service: arena, store, leases.
        self.prefix = prefix
        #: Redis pub/sub: channels, patterns and their subscribers.
        self.pubsub = pubsub
        #: KV events (ZMQ publisher, pub/sub channels).
        self.kv_events = kv_events
        #: Snapshots: SAVE, BGSAVE, the save schedule, the save on shutdown.
        self.persistence = persistence
        self._shutdown_save: bool | None = None
        self.stats = Stats()
        self.clients = ClientRegistry()
        #: Holds commands back: CLIENT PAUSE, an EXEC running alone.
        self.gate = CommandGate()
        #: The namespaces clients WATCH.
        self.watches = WatchRegistry()
        self.watches.attach(prefix.store)
        #: client id -> its request parser, so CONFIG SET of protocol limits reaches live connections.
        self.parsers: dict[int, Any] = {}
        self.run_id = secrets.token_hex(20)
        self.started_at = time.time()
        self.started_monotonic = time.monotonic()
        self.version = __version__
        self.redis_version = REDIS_COMPAT_VERSION
        self.shutting_down = False
        #: The process's memory and its peak (INFO memory), sampled by the cron.
        self.memory = ProcessMemory()
        self._shutdown_requested: trio.Event | None = None
        self._drain_scope: trio.CancelScope | None = None  # the wait for busy clients, cut short by a second SIGINT
        self._control_nursery: trio.Nursery | None = None
        self._connection_nursery: trio.Nursery | None = None
        config.on_change("proto-max-bulk-len", self._update_parsers)
        config.on_change("client-query-buffer-limit", self._update_parsers)
        config.on_change("loglevel", lambda _old, new: logs.set_level(new))
        config.on_change("requirepass", lambda _old, new: self.acl.set_default_password(new))
        config.on_change("port", self._rebind_port)
        config.on_change("bind", self._rebind_bind)

    # -- state the handlers read -------------------------------------------------

    @property
    def auth_required(self) -> bool:
        """True when clients must AUTH before running commands (the default user is not on + nopass)."""
        return not self.acl.default_open

    @property
    def uptime(self) -> float:
        return time.monotonic() - self.started_monotonic

    @property
    def tcp_port(self) -> int:
        """The TCP port listened on (the one the kernel picked for ``port 0``)."""
        return self.listeners.tcp_port

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of each TCP listener."""
        return self.listeners.addresses

    def request_shutdown(self, reason: str = "SHUTDOWN", *, save: bool | None = None) -> None:
        """Begin a graceful shutdown (idempotent). ``save``: whether the daemon saves a snapshot once
        the clients are drained (None: when the save schedule is not empty)."""
        if self._shutdown_requested is not None and not self._shutdown_requested.is_set():
            self._shutdown_save = save
            log.warning("User requested shutdown (%s)...", reason)
            self._shutdown_requested.set()

    # -- config hooks --------------------------------------------------------------

    def _update_parsers(self, _old: Any, _new: Any) -> None:
        for parser in self.parsers.values():
            parser.proto_max_bulk_len = self.config["proto-max-bulk-len"]
            parser.query_buffer_limit = self.config["client-query-buffer-limit"]

    def _rebind_port(self, _old: Any, new: Any) -> None:
        self._rebind(new, failure=lambda exc: f"Unable to listen on this port: {exc}")

    def _rebind_bind(self, _old: Any, _new: Any) -> None:
        # The port stays, even when it was picked for port 0. redis-server's reply names no address.
        self._rebind(self.tcp_port, failure=lambda exc: "Failed to bind to specified addresses.")

    def _rebind(self, port: int, failure: Callable[[StartupError], str]) -> None:
        """CONFIG SET port/bind: open the new listeners first, keep those that stay, drop the rest."""
        if self._control_nursery is None:
            return
        try:
            fresh = self.listeners.rebind(self.config["bind"], port, self.config["tcp-backlog"])
        except StartupError as exc:
            log.warning("CONFIG SET port/bind: %s", exc)
            raise ValueError(failure(exc)) from exc
        self.config.record("port", self.listeners.tcp_port)
        for listener in fresh:
            self._control_nursery.start_soon(self._accept_loop, listener)
        log.info("Listening on %s", ", ".join(self.addresses))

    # -- serving -------------------------------------------------------------------

    async def serve(self, *, metrics: MetricsEndpoint | None = None, signals: Any = None,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until shutdown, then drain the clients. ``task_status.started`` receives the
        server once it accepts; ``signals`` (a trio signal receiver) asks for the shutdown."""
        self._shutdown_requested = trio.Event()
        async with trio.open_nursery() as connections:
            self._connection_nursery = connections
            async with trio.open_nursery() as control:
                self._control_nursery = control
                for listener in self.listeners.all:
                    control.start_soon(self._accept_loop, listener)
                control.start_soon(self._cron)
                if self.prefix.tier is not None:
                    await control.start(self.prefix.tier.run)
                if metrics is not None:
                    control.start_soon(metrics.serve)
                    for address in metrics.addresses:
                        log.log(logs.ANNOUNCE, "Metrics endpoint on http://%s/metrics", address)
                if signals is not None:
                    # Watched until the drain below is over (connections' nursery, not control's).
                    await connections.start(self._watch_signals, signals)
                for listener in self.listeners.all:
                    kind = "unix" if listener.is_unix else "tcp"
                    log.log(logs.ANNOUNCE, "Ready to accept connections %s on %s", kind, listener.address)
                self.prefix.memory.mark_startup()  # the empty daemon, listeners and all: metadata's zero
                task_status.started(self)
                await self._shutdown_requested.wait()
                self.shutting_down = True
                control.cancel_scope.cancel()
            self._control_nursery = None
            self.listeners.stop_accepting()
            await self._drain_clients()
            connections.cancel_scope.cancel()
        # The control nursery waited for a background save's thread; the final save comes after
        # the last client's write. A failure is logged; a signal's shutdown still exits.
        self.persistence.save_on_shutdown(self._shutdown_save)

    def start_bgsave(self) -> None:
        """BGSAVE: the write runs in the control nursery (PersistenceError when it cannot start)."""
        nursery = self._control_nursery
        if nursery is None:
            raise PersistenceError("ERR shutdown in progress")
        self.persistence.start_bgsave(nursery)

    async def _drain_clients(self) -> None:
        """Close idle clients now; give busy ones ``shutdown-timeout`` seconds to finish."""
        for client in self.clients:
            if not client.busy:
                client.kill()
        deadline = self.config["shutdown-timeout"]
        with trio.move_on_after(deadline) as scope:
            self._drain_scope = scope
            while len(self.clients):
                for client in self.clients:
                    if not client.busy:
                        client.kill()
                await trio.sleep(0.01)
        if scope.cancelled_caught:
            log.warning("Shutdown deadline of %ss reached: closing %d busy clients", deadline, len(self.clients))

    async def _accept_loop(self, listener: Listener) -> None:
        with listener.scope:
            while True:
                try:
                    await trio.lowlevel.wait_readable(listener.sock)
                    sock, peer = listener.sock.accept()
                except BlockingIOError:
                    continue
                except trio.ClosedResourceError:  # closed by a rebind
                    return
                except OSError as exc:
                    if exc.errno == errno.EBADF:  # the listener was closed by a rebind
                        return
                    # Out of descriptors or memory, or a connection that died in the
                    # backlog (ECONNABORTED, EPROTO, EPERM ...): never a reason to stop serving.
                    log.warning("Accepting client connection: %s", exc)
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        await trio.sleep(0.1)
                    continue
                try:
                    sock.setblocking(False)
                    self._admit(sock, peer, listener)
                except OSError as exc:  # the peer vanished while we set the socket up
                    log.warning("Setting up client connection: %s", exc)
                    sock.close()

    def _admit(self, sock: stdlib_socket.socket, peer: Any, listener: Listener) -> None:
        """The checks Redis makes on accept: maxclients, then protected mode."""
        if len(self.clients) >= self.config["maxclients"]:
            self.stats.rejected_connections += 1
            _send_and_close(sock, MAX_CLIENTS_ERROR)
            return
        if listener.is_unix:
            addr, laddr = f"{listener.address}:0", listener.address
        else:
            configure_client_socket(sock, self.config["tcp-keepalive"])
            addr = _format_address(peer)
            laddr = _format_address(sock.getsockname())
        self.stats.total_connections_received += 1
        if (
            not listener.is_unix
            and self.config["protected-mode"]
            and not self.auth_required
            and peer[0] not in LOOPBACK_PEERS
        ):
            log.warning("Rejected connection from %s: protected mode", addr)
            _send_and_close(sock, PROTECTED_MODE_ERROR)
            return
        client = Client(self.clients.new_id(), addr, laddr, sock.fileno(), is_unix=listener.is_unix)
        client.authenticated = not self.auth_required
        self.clients.add(client)
        assert self._connection_nursery is not None
        self._connection_nursery.start_soon(self._run_client, sock, client)

    async def _run_client(self, sock: stdlib_socket.socket, client: Client) -> None:
        with trio.CancelScope() as scope:
            client.kill = scope.cancel
            client.open_push = lambda: self._open_push(sock, client)
            try:
                await serve_connection(self, sock, client)
            except Exception:  # a bug must cost this connection, never the server
                log.exception("Closing client id=%d addr=%s after an internal error", client.id, client.addr)
            finally:
                self.clients.remove(client)
                if client.pubsub is not None:
                    self.pubsub.drop_client(client)
                    client.pubsub.push.close()
                    trio.lowlevel.notify_closing(sock)  # wakes its push writer if it waits on the socket
                self.watches.unwatch(client.id)
                self.observers.monitors.remove(client.id)
                sock.close()
                # Leases belong to their connection: a worker that dies frees its pins. Shielded:
                # a killed client's scope is cancelled, and its leases must go all the same.
                with trio.CancelScope(shield=True):
                    await self.prefix.release_owner(client.id)

    def _open_push(self, sock: stdlib_socket.socket, client: Client) -> PushQueue:
        """Start the writer task of a connection's out-of-band frames (its first SUBSCRIBE)."""
        push = PushQueue(self, client, lambda chunks: send_chunks(sock, chunks))
        assert self._connection_nursery is not None
        self._connection_nursery.start_soon(push.run)
        return push

    async def _cron(self) -> None:
        """Periodic work, like Redis's serverCron: ops/sec samples, idle timeouts, memory peak."""
        # ``hz`` is read on every run: CONFIG SET hz takes effect at the next tick. The once a
        # second work goes by the clock, not by a tick count, so it stays once a second at any hz.
        next_second = time.monotonic() + 1.0
        while True:
            await trio.sleep(1.0 / self.config["hz"])
            self.stats.sample()
            if not self.gate.exclusive:  # no store work lands inside an EXEC running alone
                self.prefix.tick(paused=self.gate.paused)
            now = time.monotonic()
            if now >= next_second:
                next_second = now + 1.0
                self._close_idle_clients()
                self.memory.sample()
                self.persistence.cron(self._control_nursery)

    def _close_idle_clients(self) -> None:
        timeout = self.config["timeout"]
        if not timeout:
            return
        now = time.monotonic()
        for client in self.clients:
            # Like Redis sparing blocked clients: a connection holding leases may be a worker still
            # computing with its blocks; closing it would hand them to others under its feet.
            idle = not client.busy and now - client.last_interaction > timeout
            if idle and not self.prefix.holds_leases(client.id):
                log.log(15, "Closing idle client id=%d addr=%s", client.id, client.addr)
                client.kill()

    async def _watch_signals(self, signals: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for signum in signals:
            name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT"
            if not self._shutdown_requested.is_set():
                log.warning("Received %s scheduling shutdown...", name)
                self.request_shutdown(name)
            elif signum == signal.SIGINT:
                # Redis: a second Ctrl+C means "quit now". We still clean up, without waiting.
                log.warning("You insist... exiting now.")
                if self._drain_scope is not None:
                    self._drain_scope.cancel()
            else:
                log.warning("Received %s during shutdown: ignored, the shutdown is in progress", name)


def _format_address(address: Any) -> str:
    host, port = address[0], address[1]
    return f"{host}:{port}"


def _send_and_close(sock: stdlib_socket.socket, payload: bytes) -> None:
    # A fresh socket's send buffer always takes a few hundred bytes: no need to await.
    try:
        sock.send(payload)
    except OSError:
        pass
    sock.close()
