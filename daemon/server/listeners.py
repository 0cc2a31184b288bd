"""The daemon's listening sockets: TCP on every ``bind`` address, and the optional unix socket.

A :class:`ListenerSet` is opened once at startup (a port of 0 asks the kernel
for one free port, shared by every address), rebound in place by CONFIG SET
``port``/``bind`` (the new sockets open first; on failure the old ones stay),
and closed once at exit, unix socket file included. The server's accept loops
run over its listeners; each :class:`Listener` carries the cancel scope of its
loop, so closing one stops its loop.
"""

from __future__ import annotations

import errno
import os
import socket as stdlib_socket
import stat
from typing import Any

import trio

from pfxcache.daemon.server.errors import StartupError

#: Linux refuses TCP_KEEPIDLE / TCP_KEEPINTVL above this (EINVAL).
MAX_TCP_KEEPALIVE = 32767


class Listener:
    """A listening socket and the cancel scope of its accept loop."""

    __slots__ = ("sock", "address", "is_unix", "scope")

    def __init__(self, sock: stdlib_socket.socket, address: str, is_unix: bool) -> None:
        self.sock = sock
        self.address = address
        self.is_unix = is_unix
        self.scope = trio.CancelScope()

    def close(self) -> None:
        """Stop its accept loop and close the socket (idempotent)."""
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
    still names are reused rather than bound twice. On failure every socket this
    call opened is closed again.
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
            except (TypeError, ValueError) as exc:  # a host that is no address or name (not ASCII, a NUL)
                sock.close()
                raise StartupError(
                    f"Could not create server TCP listening socket {host}:{port}: bind: Name or service not known"
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
    sock = None
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
        if sock is not None:
            sock.close()
        raise StartupError(f"Failed opening Unix socket: {exc}") from exc
    return Listener(sock, path, True)


def configure_client_socket(sock: stdlib_socket.socket, keepalive: int) -> None:
    """An accepted TCP client: no Nagle delay, and Redis's keepalive schedule."""
    sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_NODELAY, 1)
    if keepalive > 0:
        # Same probe schedule as Redis's anetKeepAlive: idle, then every idle/3, 3 probes.
        idle = min(keepalive, MAX_TCP_KEEPALIVE)
        sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_KEEPALIVE, 1)
        sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_KEEPINTVL, max(1, idle // 3))
        sock.setsockopt(stdlib_socket.IPPROTO_TCP, stdlib_socket.TCP_KEEPCNT, 3)


class ListenerSet:
    """Every listening socket of the daemon, and the TCP port they share.

    A context manager: leaving it closes every listener and removes the unix
    socket file it created.
    """

    def __init__(self, tcp: list[Listener], tcp_port: int, unix: Listener | None = None) -> None:
        self.tcp = tcp
        self.tcp_port = tcp_port
        self.unix = unix
        self._closed = False

    @classmethod
    def open(cls, config: Any) -> ListenerSet:
        """Listen as ``bind``, ``port``, ``unixsocket`` say; a StartupError leaves nothing open.

        Unlike Redis, port 0 does not disable TCP: it asks the kernel for a free port.
        """
        backlog = config["tcp-backlog"]
        tcp, port = open_tcp_listeners(config["bind"], config["port"], backlog)
        listeners = cls(tcp, port)
        if config["unixsocket"]:
            try:
                listeners.unix = open_unix_listener(config["unixsocket"], config["unixsocketperm"], backlog)
            except BaseException:
                listeners.close()
                raise
        return listeners

    def __enter__(self) -> ListenerSet:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def all(self) -> list[Listener]:
        """The TCP listeners, then the unix one."""
        return self.tcp + ([self.unix] if self.unix is not None else [])

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of each TCP listener (INFO, the startup log)."""
        return [listener.address for listener in self.tcp]

    def rebind(self, bind: Any, port: int, backlog: int) -> list[Listener]:
        """CONFIG SET port/bind: open the new listeners first, keep those that stay, close the rest.

        Returns the listeners newly opened (their accept loops are the caller's to start);
        on a StartupError the current listeners stay as they were.
        """
        current = {listener.address: listener for listener in self.tcp}
        wanted, port = open_tcp_listeners(bind, port, backlog, keep=current)
        for listener in self.tcp:
            if listener not in wanted:
                listener.close()
        fresh = [listener for listener in wanted if listener not in current.values()]
        self.tcp, self.tcp_port = wanted, port
        return fresh

    def stop_accepting(self) -> None:
        """Close every listening socket (the shutdown's first step); the unix socket file stays
        until :meth:`close`."""
        for listener in self.all:
            listener.close()

    def close(self) -> None:
        """Close every listener and remove the unix socket file (idempotent)."""
        self.stop_accepting()
        if self.unix is not None and not self._closed:
            try:
                os.unlink(self.unix.address)
            except OSError:
                pass
        self._closed = True  # the path may be another daemon's by now: unlinked once only
