"""Per-connection client state, and the registry of connected clients.

This is the state ``CLIENT LIST``/``CLIENT INFO`` show and ``CLIENT KILL``
acts on. It knows nothing of sockets: the connection task owns the socket and
gives the client a ``kill`` callback that cancels it.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator


class Client:
    """One connected client, as Redis describes it in ``CLIENT LIST``."""

    __slots__ = (
        "id",
        "addr",
        "laddr",
        "fd",
        "name",
        "resp",
        "db",
        "user",
        "authenticated",
        "created",
        "last_interaction",
        "last_command",
        "close_after_reply",
        "busy",
        "is_unix",
        "query_buffered",
        "kill",
        "pubsub",
        "open_push",
        "multi",
        "mute",
        "monitoring",
        "outgoing_fds",
    )

    def __init__(self, client_id: int, addr: str, laddr: str, fd: int, *, is_unix: bool = False) -> None:
        now = time.monotonic()
        self.id = client_id
        self.addr = addr
        self.laddr = laddr
        self.fd = fd
        self.name = ""
        self.resp = 2
        self.db = 0
        self.user = "default"
        self.authenticated = False
        self.created = now
        self.last_interaction = now
        self.last_command = "NULL"
        #: Set by a handler (QUIT, a protocol error) to close once the reply is written.
        self.close_after_reply = False
        #: True while the connection runs commands; shutdown lets those finish.
        self.busy = False
        self.is_unix = is_unix
        self.query_buffered = 0
        #: Cancels the connection task (set by the connection).
        self.kill: Callable[[], None] = lambda: None
        #: pubsub.ClientSubscriptions once the client subscribes (None before).
        self.pubsub = None
        #: Starts the connection's push writer and returns its push.PushQueue (set by the server).
        self.open_push: Callable[[], object] = lambda: None
        #: transactions.MultiState between MULTI and EXEC/DISCARD (None outside a transaction).
        self.multi = None
        #: CLIENT REPLY: 0 replies are written; commands.context.MUTE_OFF (OFF) none until ON; n > 0 (SKIP) the
        #: next n are dropped (the SKIP's own, then the next command's).
        self.mute = 0
        #: In MONITOR mode (Redis treats a monitor as a replica: flag O, no keyspace commands).
        self.monitoring = False
        #: Descriptors to send with the next write (PFXATTACH's partitions, fd_passing.py).
        self.outgoing_fds: list[int] = []

    @property
    def subscribed(self) -> bool:
        """In Redis's subscribed state: at least one channel or pattern."""
        return self.pubsub is not None and self.pubsub.total > 0

    def describe(self) -> str:
        """The ``CLIENT LIST`` line for this client (Redis 7.0.15's fields, in its order)."""
        now = time.monotonic()
        subs = self.pubsub
        sub, psub, ssub = (len(subs.channels), len(subs.patterns), len(subs.shard_channels)) if subs else (0, 0, 0)
        flags = (("O" if self.monitoring else "") + ("P" if sub or psub or ssub else "")
                 + ("x" if self.multi is not None else "")
                 + ("U" if self.is_unix else "")) or "N"
        return (
            f"id={self.id} addr={self.addr} laddr={self.laddr} fd={self.fd} name={self.name} "
            f"age={int(now - self.created)} idle={int(now - self.last_interaction)} "
            f"flags={flags} db={self.db} sub={sub} psub={psub} ssub={ssub} "
            f"multi={len(self.multi.commands) if self.multi is not None else -1} "
            f"qbuf={self.query_buffered} qbuf-free=0 argv-mem=0 multi-mem=0 rbs=16384 rbp=0 "
            f"obl=0 oll=0 omem=0 tot-mem={self.query_buffered} events=r cmd={self.last_command} "
            f"user={self.user} redir=-1 resp={self.resp}"
        )


class ClientRegistry:
    """The connected clients, by id. Ids grow from 1 and are never reused."""

    __slots__ = ("_clients", "_next_id")

    def __init__(self) -> None:
        self._clients: dict[int, Client] = {}
        self._next_id = 1

    def new_id(self) -> int:
        client_id = self._next_id
        self._next_id += 1
        return client_id

    def add(self, client: Client) -> None:
        self._clients[client.id] = client

    def remove(self, client: Client) -> None:
        self._clients.pop(client.id, None)

    def get(self, client_id: int) -> Client | None:
        return self._clients.get(client_id)

    def __len__(self) -> int:
        return len(self._clients)

    def __iter__(self) -> Iterator[Client]:
        return iter(list(self._clients.values()))
