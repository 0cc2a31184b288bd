"""What a command handler sees: the :class:`Context` of one connection.

A handler receives ``(ctx, argv)``. ``ctx.client`` is the connected
:class:`~pfxcache.daemon.server.clients.Client`; ``ctx.server`` is the server as
handlers may use it, described by :class:`ServerState` -- the parts of the
daemon that own each figure (config, stats, clients, ACL users, the prefix
service, process memory) and the few server actions a command triggers. The
server (:mod:`pfxcache.daemon.server.server`) satisfies :class:`ServerState`
structurally; nothing here imports it, so handlers and INFO sit below the
server with no import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # types only: nothing here is needed at import time
    from pfxcache.daemon.security.acl import AclUsers
    from pfxcache.daemon.server.clients import Client, ClientRegistry
    from pfxcache.daemon.config.engine import Config
    from pfxcache.daemon.service.kv_event_service import KvEventService
    from pfxcache.daemon.server.gate import CommandGate
    from pfxcache.daemon.observability.observers import CommandObservers
    from pfxcache.daemon.service.prefix import PrefixService
    from pfxcache.daemon.observability.process import ProcessMemory
    from pfxcache.daemon.service.pubsub import PubSub
    from pfxcache.daemon.observability.stats import Stats
    from pfxcache.daemon.commands.transactions import WatchRegistry
    from .table import CommandTable

__all__ = ["LATER", "MUTE_OFF", "NO_REPLY", "PAUSE_ALL", "PAUSE_WRITE", "Context", "Later", "Muted", "NoReply",
           "ServerState"]

#: ``client.mute`` under CLIENT REPLY OFF (0: replies are written; n > 0: SKIP, the next n are not).
MUTE_OFF = -1
#: The kinds of CLIENT PAUSE, as ``ctx.server.gate`` holds them: writes only, or every command.
PAUSE_WRITE = "write"
PAUSE_ALL = "all"


class NoReply:
    """Returned by a handler whose connection closes without a reply (SHUTDOWN)."""

    __slots__ = ()


NO_REPLY = NoReply()


class Muted:
    """A reply its command already filtered through CLIENT REPLY (EXEC): sent as it is, whatever the mute now."""

    __slots__ = ("reply",)

    def __init__(self, reply: Any) -> None:
        self.reply = reply


class Later:
    """What a synchronous attempt (``handles_now``) returns when the command has to wait."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "LATER"


LATER = Later()


class ServerState(Protocol):
    """The server as handlers and INFO see it; each figure is read from its owner."""

    config: Config
    commands: CommandTable
    stats: Stats
    clients: ClientRegistry
    gate: CommandGate
    watches: WatchRegistry
    observers: CommandObservers
    acl: AclUsers
    #: The prefix store service (built before the server, see server/assembly.py).
    prefix: PrefixService
    memory: ProcessMemory
    #: Redis pub/sub channels and patterns; KV events (ZMQ publisher, pub/sub channels).
    pubsub: PubSub
    kv_events: KvEventService
    run_id: str
    version: str
    redis_version: str
    tcp_port: int
    started_at: float

    @property
    def auth_required(self) -> bool: ...

    @property
    def uptime(self) -> float: ...

    def request_shutdown(self, reason: str = "SHUTDOWN") -> None: ...


class Context:
    """What a handler sees: the server and the client that sent the command.

    One per connection, reused for every command it sends.
    """

    __slots__ = ("server", "client")

    def __init__(self, server: ServerState, client: Client) -> None:
        self.server = server
        self.client = client
