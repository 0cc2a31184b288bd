"""The trio server: listeners, one task per connection, cron, graceful shutdown.

Structure (as in trio's and hypercorn's servers)::

    serve()
      connections nursery ─ one task per client (connection.serve_connection)
        control nursery   ─ accept loop per listener, cron, signal watcher
                            waits for the shutdown request, then is cancelled

Shutdown (SIGTERM, SIGINT or ``SHUTDOWN``): stop accepting and close the
listeners; close idle connections at once; let connections that are running
commands finish them and write their replies, up to ``shutdown-timeout``
seconds; then cancel whatever is left and release every resource (pidfile,
unix socket file; later the arena and the leases).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import signal
import socket as stdlib_socket
import stat
import threading
import time
from typing import Any

import trio

from pfxcache import __version__
from pfxcache.protocol.redis_strings import stringmatchlen

from pfxcache.daemon.observability import logs
from pfxcache.daemon.security.acl import AclUsers
from pfxcache.daemon.server.clients import Client, ClientRegistry
from pfxcache.daemon.commands import (
    acl_commands,
    attach_commands,
    connection_commands,
    introspection,
    keyspace_commands,
    observe_commands,
    prefix_commands,
    pubsub_commands,
    server_commands,
    transaction_commands,
)
from pfxcache.daemon.commands.table import CommandTable
from pfxcache.daemon.config.engine import Config
from pfxcache.daemon.server.connection import send_chunks, serve_connection
from pfxcache.daemon.service.kv_event_service import KvEventService
from pfxcache.daemon.server.gate import CommandGate
from pfxcache.daemon.observability.metrics import build_registry
from pfxcache.daemon.observability.metrics_http import MetricsEndpoint
from pfxcache.daemon.observability.observers import CommandObservers
from pfxcache.daemon.service.prefix import PrefixService
from pfxcache.daemon.observability.process import ProcessMemory
from pfxcache.daemon.service.pubsub import PubSub
from pfxcache.daemon.server.push import PushQueue
from pfxcache.daemon.observability.stats import Stats
from pfxcache.daemon.commands.transactions import WatchRegistry

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


class StartupError(Exception):
    """The daemon cannot start (port in use, bad unix socket path ...)."""


def build_command_table() -> CommandTable:
    """The command table with every handler module bound to its rows."""
    table = CommandTable.load()
    for module in (connection_commands, server_commands, introspection, prefix_commands, acl_commands,
                   keyspace_commands, pubsub_commands, transaction_commands, observe_commands, attach_commands):
        table.bind_module(module)
    return table


class Listener:
    """A listening socket and the cancel scope of its accept loop."""

    __slots__ = ("sock", "address", "is_unix", "scope")

    def __init__(self, sock: stdlib_socket.socket, address: str, is_unix: bool) -> None:
        self.sock = sock
        self.address = address
        self.is_unix = is_unix
        self.scope = trio.CancelScope()

    def close(self) -> None:
        self.scope.cancel()
        if self.sock.fileno() != -1:
            trio.lowlevel.notify_closing(self.sock)
            self.sock.close()


def _bind_addresses(bind: Any) -> list[str]:
    return bind.split() if isinstance(bind, str) else list(bind)


def open_tcp_listeners(bind: Any, port: int, backlog: int, *, keep: dict[str, Listener] | None = None,
                       ) -> tuple[list[Listener], int]:
    """Bind every address of the ``bind`` directive; port 0 picks one free port for all.

    Addresses prefixed with ``-`` are optional, as in Redis: failing to bind
    them is not an error. Listeners in ``keep`` (by address) that the directive
    still names are reused rather than bound twice.
    """
    keep = keep or {}
    listeners: list[Listener] = []
    try:
        for entry in _bind_addresses(bind):
            optional = entry.startswith("-")
            host = entry.lstrip("-")
            if host == "*":
                host = "0.0.0.0"
            if port and f"{host}:{port}" in keep:
                listeners.append(keep[f"{host}:{port}"])
                continue
            family = stdlib_socket.AF_INET6 if ":" in host else stdlib_socket.AF_INET
            sock = stdlib_socket.socket(family, stdlib_socket.SOCK_STREAM)
            try:
                sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_REUSEADDR, 1)
                if family == stdlib_socket.AF_INET6:
                    sock.setsockopt(stdlib_socket.IPPROTO_IPV6, stdlib_socket.IPV6_V6ONLY, 1)
                sock.bind((host, port))
                sock.listen(backlog)
                sock.setblocking(False)
            except OSError as exc:
                sock.close()
                if optional and exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):
                    continue
                raise StartupError(
                    f"Could not create server TCP listening socket {host}:{port}: bind: {exc.strerror}"
                ) from exc
            if port == 0:
                port = sock.getsockname()[1]
            listeners.append(Listener(sock, f"{host}:{port}", False))
    except BaseException:
        for listener in listeners:
            if listener not in keep.values():
                listener.sock.close()
        raise
    if not listeners:
        raise StartupError(f"Failed listening on port {port} (tcp), aborting.")
    return listeners, port


def open_unix_listener(path: str, perm: int, backlog: int) -> Listener:
    """Listen on a unix socket, replacing a stale socket file left by a killed daemon."""
    try:
        if os.path.exists(path):
            if not stat.S_ISSOCK(os.stat(path).st_mode):
                raise StartupError(f"Unix socket path {path} exists and is not a socket")
            os.unlink(path)
        sock = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
        sock.bind(path)
        if perm:
            os.chmod(path, perm)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        raise StartupError(f"Failed opening Unix socket: {exc}") from exc
    return Listener(sock, path, True)


#: Linux refuses TCP_KEEPIDLE / TCP_KEEPINTVL above this (EINVAL).
MAX_TCP_KEEPALIVE = 32767


def _configure_client_socket(sock: stdlib_socket.socket, keepalive: int) -> None:
    sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_NODELAY, 1)
    if keepalive > 0:
        # Same probe schedule as Redis's anetKeepAlive: idle, then every idle/3, 3 probes.
        idle = min(keepalive, MAX_TCP_KEEPALIVE)
        sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_KEEPALIVE, 1)
        sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_KEEPINTVL, max(1, idle // 3))
        sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_KEEPCNT, 3)


class Server:
    """The daemon: configuration, command table, clients, stats, and the serve loop.

    Handlers see it as a :class:`~pfxcache.daemon.commands.context.ServerState`:
    each figure INFO shows is read from its owner (``config``, ``stats``,
    ``clients``, ``prefix``, ``memory``), not forwarded by the server.
    """

    def __init__(self, config: Config, commands: CommandTable | None = None) -> None:
        self.config = config
        self.commands = commands if commands is not None else build_command_table()
        self.stats = Stats()
        self.clients = ClientRegistry()
        #: Redis pub/sub: channels, patterns and their subscribers.
        self.pubsub = PubSub()
        #: KV events (ZMQ publisher, pub/sub channels), started once the store exists.
        self.kv_events = KvEventService(self)
        #: Holds commands back: CLIENT PAUSE, an EXEC running alone.
        self.gate = CommandGate()
        #: The namespaces clients WATCH.
        self.watches = WatchRegistry()
        #: MONITOR, SLOWLOG, LATENCY, ACL LOG.
        self.observers = CommandObservers(config)
        #: ACL users; ``default`` follows requirepass, as in Redis.
        self.acl = AclUsers(self.commands)
        self.acl.set_default_password(config["requirepass"])
        try:
            self.acl.load_users(config.acl_users)
        except ValueError as exc:
            raise StartupError(f"Error in the ACL users of the configuration: {exc}") from None
        aclfile = config["aclfile"] if "aclfile" in config else ""
        if aclfile:
            try:
                self.acl.load_file(aclfile)
            except (OSError, ValueError) as exc:
                raise StartupError(f"Error loading the ACL file {aclfile}: {exc}") from None
        #: client id -> its request parser, so CONFIG SET of protocol limits reaches live connections.
        self.parsers: dict[int, Any] = {}
        self.run_id = secrets.token_hex(20)
        self.started_at = time.time()
        self.started_monotonic = time.monotonic()
        self.version = __version__
        self.redis_version = REDIS_COMPAT_VERSION
        self.tcp_port = 0
        self.addresses: list[str] = []
        self.shutting_down = False
        #: The process's memory and its peak (INFO memory), sampled by the cron.
        self.memory = ProcessMemory()
        #: The prefix store service, created once the port is known (it names the
        #: arena), before the first client connects.
        self.prefix: PrefixService = None  # type: ignore[assignment]
        self._listeners: list[Listener] = []
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

    def request_shutdown(self, reason: str = "SHUTDOWN") -> None:
        """Begin a graceful shutdown (idempotent)."""
        if self._shutdown_requested is not None and not self._shutdown_requested.is_set():
            log.warning("User requested shutdown (%s)...", reason)
            self._shutdown_requested.set()

    # -- config hooks --------------------------------------------------------------

    def _update_parsers(self, _old: Any, _new: Any) -> None:
        for parser in self.parsers.values():
            parser.proto_max_bulk_len = self.config["proto-max-bulk-len"]
            parser.query_buffer_limit = self.config["client-query-buffer-limit"]

    def _rebind_port(self, _old: Any, new: Any) -> None:
        self._rebind(new)

    def _rebind_bind(self, _old: Any, _new: Any) -> None:
        self._rebind(self.tcp_port)  # the port stays, even when it was picked for port 0

    def _rebind(self, port: int) -> None:
        """CONFIG SET port/bind: open the new listeners first, keep those that stay, drop the rest."""
        if self._control_nursery is None:
            return
        current = {listener.address: listener for listener in self._listeners if not listener.is_unix}
        try:
            wanted, port = open_tcp_listeners(self.config["bind"], port, self.config["tcp-backlog"], keep=current)
        except StartupError as exc:
            raise ValueError(f"Unable to listen on this port: {exc}") from exc
        fresh = [listener for listener in wanted if listener not in current.values()]
        for listener in current.values():
            if listener not in wanted:
                listener.close()
        self._listeners = [listener for listener in self._listeners if listener.is_unix] + wanted
        self.tcp_port = port
        self.config.record("port", port)
        self.addresses = [listener.address for listener in wanted]
        for listener in fresh:
            self._control_nursery.start_soon(self._accept_loop, listener)
        log.info("Listening on %s", ", ".join(self.addresses))

    # -- serving -------------------------------------------------------------------

    def _open_listeners(self) -> None:
        config = self.config
        listeners: list[Listener] = []
        # Unlike Redis, port 0 does not disable TCP: it asks the kernel for a free port.
        tcp, self.tcp_port = open_tcp_listeners(config["bind"], config["port"], config["tcp-backlog"])
        config.record("port", self.tcp_port)  # port 0: CONFIG GET port answers the port bound
        listeners += tcp
        if config["unixsocket"]:
            listeners.append(open_unix_listener(config["unixsocket"], config["unixsocketperm"], config["tcp-backlog"]))
        self._listeners = listeners
        self.addresses = [listener.address for listener in listeners if not listener.is_unix]

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run until shutdown. ``task_status.started`` receives the server once it listens."""
        self._shutdown_requested = trio.Event()
        self._open_listeners()
        try:
            self.prefix = PrefixService(self.config, tcp_port=self.tcp_port, glob=stringmatchlen)
        except (ValueError, OSError) as exc:
            for listener in self._listeners:
                listener.close()
            raise StartupError(f"Cannot create the block arena: {exc}") from exc
        self.watches.attach(self.prefix.store)
        self.prefix.latency_event = self.observers.event
        try:
            self.kv_events.start()
        except ValueError as exc:
            for listener in self._listeners:
                listener.close()
            self.prefix.close()
            raise StartupError(f"Cannot publish KV events: {exc}") from exc
        try:
            self._write_pidfile()
        except OSError as exc:
            for listener in self._listeners:
                listener.close()
            self.kv_events.close()
            self.prefix.close()
            raise StartupError(f"Can't write the pidfile {self.config['pidfile']}: {exc.strerror}") from exc
        metrics = await self._open_metrics()
        # The signal handlers stay installed until the very end of the cleanup below: a second
        # SIGTERM during a graceful shutdown is ignored, as Redis does, instead of killing the
        # process with its pidfile and arena left behind.
        signals = contextlib.ExitStack()
        receiver = None
        if threading.current_thread() is threading.main_thread():
            receiver = signals.enter_context(trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT))
        try:
            async with trio.open_nursery() as connections:
                self._connection_nursery = connections
                async with trio.open_nursery() as control:
                    self._control_nursery = control
                    for listener in self._listeners:
                        control.start_soon(self._accept_loop, listener)
                    control.start_soon(self._cron)
                    if metrics is not None:
                        control.start_soon(metrics.serve)
                        for address in metrics.addresses:
                            log.log(logs.ANNOUNCE, "Metrics endpoint on http://%s/metrics", address)
                    if receiver is not None:
                        # Watched until the drain below is over (connections' nursery, not control's).
                        await connections.start(self._watch_signals, receiver)
                    for listener in self._listeners:
                        kind = "unix" if listener.is_unix else "tcp"
                        log.log(logs.ANNOUNCE, "Ready to accept connections %s on %s", kind, listener.address)
                    self.prefix.memory.mark_startup()  # the empty daemon, listeners and all: metadata's zero
                    task_status.started(self)
                    await self._shutdown_requested.wait()
                    self.shutting_down = True
                    control.cancel_scope.cancel()
                self._control_nursery = None
                for listener in self._listeners:
                    listener.close()
                await self._drain_clients()
                connections.cancel_scope.cancel()
        finally:
            for listener in self._listeners:
                listener.close()
                if listener.is_unix:
                    _unlink_quietly(listener.address)
            self.kv_events.close()
            self.prefix.close()
            self._remove_pidfile()
            log.warning("pfxcached is now ready to exit, bye bye...")
            signals.close()

    async def _open_metrics(self) -> Any:
        """The Prometheus endpoint when ``metrics-port`` is set (else None); a StartupError if it cannot bind."""
        if not self.config["metrics-port"]:
            return None
        try:
            return await MetricsEndpoint.open(self.config["metrics-bind"], self.config["metrics-port"],
                                              build_registry(self))
        except ImportError as exc:
            for listener in self._listeners:
                listener.close()
            self.prefix.close()
            self._remove_pidfile()
            raise StartupError(f"metrics-port needs prometheus-client (pip install prometheus-client): {exc}") from exc
        except OSError as exc:
            for listener in self._listeners:
                listener.close()
            self.prefix.close()
            self._remove_pidfile()
            raise StartupError(f"Cannot open the metrics endpoint on port {self.config['metrics-port']}: "
                               f"{exc.strerror or exc}") from exc

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
            _configure_client_socket(sock, self.config["tcp-keepalive"])
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

    def _write_pidfile(self) -> None:
        path = self.config["pidfile"]
        if path:
            with open(path, "w") as file:
                file.write(f"{os.getpid()}\n")

    def _remove_pidfile(self) -> None:
        if self.config["pidfile"]:
            _unlink_quietly(self.config["pidfile"])


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


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
