"""Where the daemon is put together: its services built in order, closed in reverse order.

:func:`run_daemon` is the whole life of a daemon, as ``pfxcached`` runs it::

    signal receiver                 installed first, removed last: a second SIGTERM during
                                    the shutdown below is ignored, never fatal
      open_daemon(config)           an AsyncExitStack; each step below is closed by it
        host memory check           before anything is allocated (host_memory.py)
        listeners                   the port is known from here (port 0 picks one)
        command table, ACL users    open nothing; a bad ACL is a StartupError
        prefix service              arena (named after the port) and store; the log says
                                    its geometry
        disk tier                   its path checked and locked (recovered once serving)
        persistence                 the dir's lock and the snapshot loaded into the store,
                                    before any client is accepted
        KV events                   ZMQ publisher, pub/sub channels, the store's sink
        server                      the state handlers see, over the services above
        pidfile                     written once everything it names exists
        metrics endpoint            its registry reads the server
      server.serve()                accept, serve, drain

Each service is built with what it needs, complete when built, and its
closing is pushed on the stack the moment it exists: a failure at any step
(a StartupError with the reason, for the log) and the end of ``serve`` alike
unwind the stack, closing the metrics listeners, removing the pidfile,
stopping the KV event sockets, releasing the arena and closing the listeners
(the unix socket file removed), in that order. The listeners open before the
arena because the arena's name carries the port, and a port already taken
must not cost a reservation of ``maxmemory`` first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Any, AsyncIterator, Iterator

import trio

from pfxcache.protocol.redis_strings import stringmatchlen

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
    tier_commands,
    transaction_commands,
)
from pfxcache.daemon.commands.table import CommandTable
from pfxcache.daemon.config.engine import Config
from pfxcache.daemon.observability.info import human_bytes
from pfxcache.daemon.observability.metrics import build_registry
from pfxcache.daemon.observability.metrics_http import MetricsEndpoint
from pfxcache.daemon.observability.observers import CommandObservers
from pfxcache.daemon.security.acl import AclUsers
from pfxcache.daemon.server.errors import StartupError
from pfxcache.daemon.server.host_memory import HostLimit, host_limits, shortfall
from pfxcache.daemon.server.listeners import ListenerSet
from pfxcache.daemon.server.server import Server
from pfxcache.daemon.service.kv_event_service import KvEventService
from pfxcache.daemon.service.persistence import Persistence, PersistenceError
from pfxcache.daemon.service.remote_tier import RemoteTierService
from pfxcache.daemon.service.tier_chain import TierChain
from pfxcache.daemon.service.tiering import TierService
from pfxcache.daemon.tier.files import TierPathError
from pfxcache.daemon.service.prefix import PrefixService
from pfxcache.daemon.service.pubsub import PubSub

log = logging.getLogger("pfxcached")

#: Arenas in the host's memory, which the host must be able to back; a cuda arena is the GPU's.
HOST_ARENAS = ("shm", "memory")


def build_command_table() -> CommandTable:
    """The command table with every handler module bound to its rows."""
    table = CommandTable.load()
    for module in (connection_commands, server_commands, introspection, prefix_commands, acl_commands,
                   keyspace_commands, pubsub_commands, transaction_commands, observe_commands, attach_commands,
                   tier_commands):
        table.bind_module(module)
    return table


def load_acl(config: Config, commands: CommandTable) -> AclUsers:
    """The ACL users of the configuration (``user`` lines, then ``aclfile``); ``default`` follows
    requirepass, as in Redis. A StartupError says what is wrong."""
    acl = AclUsers(commands)
    acl.set_default_password(config["requirepass"])
    try:
        acl.load_users(config.acl_users)
    except ValueError as exc:
        raise StartupError(f"Error in the ACL users of the configuration: {exc}") from None
    aclfile = config["aclfile"] if "aclfile" in config else ""
    if aclfile:
        try:
            acl.load_file(aclfile)
        except (OSError, ValueError) as exc:
            raise StartupError(f"Error loading the ACL file {aclfile}: {exc}") from None
    return acl


def check_host_memory(config: Config, *, limits: list[HostLimit] | None = None) -> None:
    """A StartupError when the host cannot back the arena ``maxmemory`` asks for.

    Run before anything is allocated: reserving more than the host can give does not fail,
    it makes the kernel's OOM killer end a process, perhaps another daemon (host_memory.py).
    """
    if config["arena"] not in HOST_ARENAS:
        return
    block_bytes = config["block-bytes"]
    nbytes = config["maxmemory"] // block_bytes * block_bytes
    tight = shortfall(nbytes, host_limits() if limits is None else limits)
    if tight is not None:
        raise StartupError(
            f"Can't reserve the block arena: maxmemory {human_bytes(nbytes)} ({nbytes} bytes, arena "
            f"{config['arena']}) is more than this host can give: {tight}. Lower maxmemory: the kernel's "
            f"OOM killer would end this or another process before such an arena is full."
        )


def open_prefix_service(config: Config, tcp_port: int, observers: CommandObservers) -> PrefixService:
    """The arena and the store over it; a StartupError when the arena cannot be created."""
    try:
        prefix = PrefixService(config, tcp_port=tcp_port, glob=stringmatchlen, latency_event=observers.event)
    except (ValueError, OSError) as exc:
        raise StartupError(f"Cannot create the block arena: {exc}") from exc
    arena, store = prefix.arena, prefix.store
    log.info("Arena %s of %s: %d blocks of %d bytes, page-size %d tokens, maxmemory %s, maxmemory-policy %s, "
             "%d shards", arena.backend, human_bytes(arena.size), arena.nblocks, arena.block_bytes,
             store.page_size, human_bytes(config["maxmemory"]), config["maxmemory-policy"], config["shards"])
    return prefix


def open_disk_tier(config: Config, prefix: PrefixService) -> TierService:
    """The disk tier's files and catalog (recovered later, in the background); a StartupError when
    its path cannot be used (missing, not a writable directory, another daemon's)."""
    # A file size limit (RLIMIT_FSIZE) must fail the write with EFBIG, not kill the daemon.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        tier = TierService(config, prefix)
    except (TierPathError, ValueError, OSError) as exc:
        raise StartupError(f"Can't open the disk tier: {exc}") from exc
    log.info("Disk tier at %s: %s in %d slots, write-%s, fsync %s", tier.files.directory,
             human_bytes(tier.files.nslots * tier.files.slot_stride), tier.files.nslots,
             config["disk-tier-write"], config["disk-tier-fsync"])
    return tier


def open_remote_tier(config: Config, prefix: PrefixService) -> RemoteTierService:
    """The shared tier's settings checked (it connects once serving, and reconnects by itself); a
    StartupError when the URL is not one. The log line shows the URL without its password."""
    try:
        import redis.cluster  # noqa: F401  (the client the shared tier runs in worker threads)
    except ImportError as exc:
        raise StartupError(f"remote-tier needs redis-py (pip install 'pfxcache[remote]'): {exc}") from exc
    try:
        tier = RemoteTierService(config, prefix)
    except ValueError as exc:
        raise StartupError(f"Can't use the shared tier: {exc}") from exc
    log.info("Shared tier %s: write-%s, timeout %d ms, queue %s, ttl %s", tier.target, tier.write_mode,
             config["remote-tier-timeout"], human_bytes(config["remote-tier-queue"]),
             f"{config['remote-tier-ttl']} s" if config["remote-tier-ttl"] else "none")
    return tier


def build_server(config: Config, listeners: ListenerSet, stack: contextlib.ExitStack | contextlib.AsyncExitStack,
                 ) -> Server:
    """The services behind the listeners, in order, each one's closing pushed on ``stack``;
    then the server over them."""
    commands = build_command_table()
    acl = load_acl(config, commands)
    observers = CommandObservers(config)
    prefix = open_prefix_service(config, listeners.tcp_port, observers)
    stack.callback(prefix.close)
    if config["disk-tier-size"]:
        prefix.tier = open_disk_tier(config, prefix)
        stack.callback(prefix.tier.close)
    if config["remote-tier"]:
        remote = open_remote_tier(config, prefix)
        stack.callback(remote.close)  # before the disk tier's: it restores the listeners it chained
        prefix.tier = TierChain([prefix.tier, remote]) if prefix.tier is not None else remote
    persistence = Persistence(config, prefix)
    stack.callback(persistence.close)
    try:
        persistence.open()  # the snapshot is loaded before any client is accepted
    except PersistenceError as exc:
        raise StartupError(f"Can't use the snapshot: {exc}") from exc
    pubsub = PubSub()
    kv_events = KvEventService(config, prefix.store, pubsub)
    stack.callback(kv_events.close)
    try:
        kv_events.start()
    except ValueError as exc:
        raise StartupError(f"Cannot publish KV events: {exc}") from exc
    return Server(config, commands=commands, acl=acl, observers=observers, listeners=listeners,
                  prefix=prefix, pubsub=pubsub, kv_events=kv_events, persistence=persistence)


@contextlib.contextmanager
def pidfile(path: str) -> Iterator[None]:
    """Write the process id to ``path`` (none when ""), and remove the file on the way out."""
    if not path:
        yield
        return
    try:
        with open(path, "w") as file:
            file.write(f"{os.getpid()}\n")
    except OSError as exc:
        raise StartupError(f"Can't write the pidfile {path}: {exc.strerror}") from exc
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


async def open_metrics(config: Config, server: Server, stack: contextlib.AsyncExitStack) -> MetricsEndpoint | None:
    """The Prometheus endpoint when ``metrics-port`` is set (else None), closed by ``stack``."""
    if not config["metrics-port"]:
        return None
    try:
        metrics = await MetricsEndpoint.open(config["metrics-bind"], config["metrics-port"], build_registry(server))
    except ImportError as exc:
        raise StartupError(f"metrics-port needs prometheus-client (pip install prometheus-client): {exc}") from exc
    except OSError as exc:
        raise StartupError(f"Cannot open the metrics endpoint on port {config['metrics-port']}: "
                           f"{exc.strerror or exc}") from exc
    # not None: open() returns None only for port 0, returned above
    for listener in metrics.listeners:  # serve() closes them too: closing twice is harmless
        stack.push_async_callback(listener.aclose)
    return metrics


@contextlib.asynccontextmanager
async def open_daemon(config: Config) -> AsyncIterator[tuple[Server, MetricsEndpoint | None]]:
    """Every service of the daemon, open, in order; closed in reverse order on the way out,
    whether a step failed (the StartupError propagates) or the server is done."""
    async with contextlib.AsyncExitStack() as stack:
        check_host_memory(config)
        listeners = stack.enter_context(ListenerSet.open(config))
        config.record("port", listeners.tcp_port)  # port 0: CONFIG GET port answers the port bound
        server = build_server(config, listeners, stack)
        stack.enter_context(pidfile(config["pidfile"]))
        metrics = await open_metrics(config, server, stack)
        yield server, metrics


async def run_daemon(config: Config, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Build the daemon, serve until shutdown, release everything; a StartupError when it cannot start.

    ``task_status.started`` receives the server once it accepts connections.
    """
    with contextlib.ExitStack() as handlers:
        signals = None
        if threading.current_thread() is threading.main_thread():
            # Installed before anything opens and removed after everything closed: a second
            # SIGTERM during the graceful shutdown is ignored, as Redis does, instead of killing
            # the process with its pidfile and arena left behind.
            signals = handlers.enter_context(trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT))
        served = False
        try:
            async with open_daemon(config) as (server, metrics):
                served = True
                await server.serve(metrics=metrics, signals=signals, task_status=task_status)
        finally:
            if served:
                log.warning("pfxcached is now ready to exit, bye bye...")
