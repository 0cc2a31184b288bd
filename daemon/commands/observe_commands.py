"""Seeing what happens: MONITOR, SLOWLOG, LATENCY, MEMORY STATS|DOCTOR|MALLOC-STATS|PURGE|HELP,
ROLE and DEBUG SLEEP|HELP, with redis-server 7.0.15's replies and errors.

The records themselves live in :mod:`pfxcache.daemon.observability.observers` (slow log,
latency events, monitors); help texts are 7.0.15's lines for the
subcommands pfxcached has.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import time
from typing import Any

from pfxcache.protocol.replies import OK, Error, Verbatim, quoted

from pfxcache.daemon.service.pubsub import ClientSubscriptions
from . import handles
from .connection_commands import LLONG_MAX, parse_integer
from .context import NO_REPLY, Context
from .introspection import help_reply

LOOPBACK = ("127.0.0.1", "::1")
DEBUG_REFUSED = Error(
    'ERR DEBUG command not allowed. If the enable-debug-command option is set to "local", you can run it from '
    "a local connection, otherwise you need to set this option in the configuration file, and then restart the "
    "server."
)


# -- MONITOR -----------------------------------------------------------------------------------


@handles("monitor")
def monitor(ctx: Context, argv: list[bytes]) -> Any:
    client = ctx.client
    monitors = ctx.server.observers.monitors
    if client.id in monitors:
        return NO_REPLY  # as redis-server: a replica's MONITOR is ignored, without a reply
    if client.pubsub is None:  # the out-of-band writer pub/sub uses: lines never split a reply
        client.pubsub = ClientSubscriptions(client.open_push())
    monitors.add(client.id, client.pubsub.push)
    client.monitoring = True
    return OK


# -- SLOWLOG -----------------------------------------------------------------------------------

_SLOWLOG_HELP = (
    "GET [<count>]",
    "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
    "    Entries are made of:",
    "    id, timestamp, time in microseconds, arguments array, client IP and port,",
    "    client name",
    "LEN",
    "    Return the length of the slowlog.",
    "RESET",
    "    Reset the slowlog.",
)


@handles("slowlog|help")
def slowlog_help(ctx: Context, argv: list[bytes]) -> Any:
    return help_reply(argv[0], _SLOWLOG_HELP)


@handles("slowlog|get")
def slowlog_get(ctx: Context, argv: list[bytes]) -> Any:
    if len(argv) > 3:
        return Error("ERR unknown subcommand or wrong number of arguments for 'GET'. Try SLOWLOG HELP.")
    count = 10
    if len(argv) == 3:
        count = parse_integer(argv[2])
        if count is None or count < -1:
            return Error("ERR count should be greater than or equal to -1")
    return ctx.server.observers.slowlog.get(count)


@handles("slowlog|len")
def slowlog_len(ctx: Context, argv: list[bytes]) -> Any:
    return len(ctx.server.observers.slowlog.entries)


@handles("slowlog|reset")
def slowlog_reset(ctx: Context, argv: list[bytes]) -> Any:
    ctx.server.observers.slowlog.reset()
    return OK


# -- LATENCY -----------------------------------------------------------------------------------

_LATENCY_HELP = (
    "DOCTOR",
    "    Return a human readable latency analysis report.",
    "HISTORY <event>",
    "    Return time-latency samples for the <event> class.",
    "LATEST",
    "    Return the latest latency samples for all events.",
    "RESET [<event> ...]",
    "    Reset latency data of one or more <event> classes.",
    "    (default: reset all data for all event classes)",
)


@handles("latency|help")
def latency_help(ctx: Context, argv: list[bytes]) -> Any:
    return help_reply(argv[0], _LATENCY_HELP)


@handles("latency|latest")
def latency_latest(ctx: Context, argv: list[bytes]) -> Any:
    return ctx.server.observers.latency.latest()


@handles("latency|history")
def latency_history(ctx: Context, argv: list[bytes]) -> Any:
    return ctx.server.observers.latency.history(argv[2].decode("utf-8", "replace"))


@handles("latency|reset")
def latency_reset(ctx: Context, argv: list[bytes]) -> Any:
    return ctx.server.observers.latency.reset([arg.decode("utf-8", "replace") for arg in argv[2:]])


@handles("latency|doctor")
def latency_doctor(ctx: Context, argv: list[bytes]) -> Any:
    observers = ctx.server.observers
    return Verbatim(observers.latency.doctor(observers.slower_than, ctx.server.config["hz"]))


# -- MEMORY ------------------------------------------------------------------------------------

_MEMORY_HELP = (
    "DOCTOR",
    "    Return memory problems reports.",
    "MALLOC-STATS",
    "    Return internal statistics report from the memory allocator.",
    "PURGE",
    "    Attempt to purge dirty pages for reclamation by the allocator.",
    "STATS",
    "    Return information about the memory usage of the server.",
    "USAGE <key> [SAMPLES <count>]",
    "    Return memory in bytes used by <key> and its value. Nested values are",
    "    sampled up to <count> times (default: 5, 0 means sample all).",
)
#: Below this much memory Redis's MEMORY DOCTOR declines to judge (it says so).
DOCTOR_MIN_BYTES = 5 * 1024 * 1024


@handles("memory|help")
def memory_help(ctx: Context, argv: list[bytes]) -> Any:
    return help_reply(argv[0], _MEMORY_HELP)


@handles("memory|stats")
def memory_stats(ctx: Context, argv: list[bytes]) -> Any:
    """Redis's MEMORY STATS fields, from the figures INFO memory shows, then pfxcache's own (arena.*)."""
    server = ctx.server
    figures = server.prefix.memory_figures()
    used, peak, rss = figures.used_bytes, max(figures.peak_bytes, figures.used_bytes), figures.rss_bytes
    keys = server.prefix.namespace_count()
    net = used - figures.startup_heap_bytes
    return {
        "peak.allocated": peak,
        "total.allocated": used,
        "startup.allocated": figures.startup_heap_bytes,
        "replication.backlog": 0,
        "clients.slaves": 0,
        "clients.normal": 0,
        "cluster.links": 0,
        "aof.buffer": 0,
        "lua.caches": 0,
        "functions.caches": 0,
        "db.0": {"overhead.hashtable.main": figures.metadata_bytes, "overhead.hashtable.expires": 0,
                 "overhead.hashtable.slot-to-keys": 0},
        "overhead.total": figures.heap_bytes,
        "keys.count": keys,
        "keys.bytes-per-key": net // keys if keys else 0,
        "dataset.bytes": figures.dataset_bytes,
        "dataset.percentage": 100.0 * figures.dataset_bytes / net if net > 0 else 0.0,
        "peak.percentage": 100.0 * used / peak if peak else 100.0,
        "allocator.allocated": used,
        "allocator.active": used,
        "allocator.resident": rss,
        "allocator-fragmentation.ratio": 1.0,
        "allocator-fragmentation.bytes": 0,
        "allocator-rss.ratio": rss / used if used else 1.0,
        "allocator-rss.bytes": rss - used,
        "rss-overhead.ratio": 1.0,
        "rss-overhead.bytes": 0,
        "fragmentation": rss / used if used else 1.0,
        "fragmentation.bytes": rss - used,
        # pfxcache's own: the arena maxmemory sizes, and the metadata its pages cost.
        "arena.bytes": figures.arena_bytes,
        "arena.resident": figures.arena_resident_bytes,
        "arena.dataset.bytes": figures.dataset_bytes,
        "metadata.bytes": figures.metadata_bytes,
        "metadata.bytes-per-page": figures.metadata_per_page,
        "pages.count": figures.pages,
    }


@handles("memory|doctor")
def memory_doctor(ctx: Context, argv: list[bytes]) -> Any:
    figures = ctx.server.prefix.memory_figures()
    # Redis judges its allocations; the interpreter's own heap is not the cache's doing, so what
    # counts here is what the cache holds: KV data plus the metadata indexing it.
    if figures.dataset_bytes + figures.metadata_bytes < DOCTOR_MIN_BYTES:
        text = ("Hi Sam, this instance is empty or is using very little memory, my issues detector can't be used "
                "in these conditions. Please, leave for your mission on Earth and fill it with some data. The new "
                "Sam and I will be back to our programming as soon as I finished rebooting.\n")
        return Verbatim(text)
    issues = []
    if figures.peak_bytes and figures.used_bytes / figures.peak_bytes < 0.5:
        issues.append(" * Peak memory: In the past this instance used more than 150% the memory that is "
                      "currently using. The allocator is normally not able to release memory after a peak, so "
                      "you can expect to see a big fragmentation ratio, however this is actually harmless and is "
                      "only due to the memory peak, and if the Redis instance Resident Set Size (RSS) is "
                      "currently bigger than expected, the memory will be used as soon as you fill the Redis "
                      "instance with more data. If the memory peak was only occasional and you want to try to "
                      "reclaim memory, please try the MEMORY PURGE command, otherwise the only other option is to "
                      "shutdown and restart the instance.\n\n")
    if figures.pages and figures.metadata_per_page > ctx.server.prefix.arena.block_bytes:
        issues.append(" * Metadata: the index of the cached pages costs more than their KV data. A larger "
                      "page-size (more tokens per page) makes fewer, larger pages.\n\n")
    if not issues:
        return Verbatim("Hi Sam, I can't find any memory issue in your instance. I can only account for what "
                        "occurs on this base.\n")
    return Verbatim("Sam, I detected a few issues in this Redis instance memory implants:\n\n" + "".join(issues)
                    + "I'm here to keep you safe, Sam. I want to help you.\n")


@handles("memory|malloc-stats")
def memory_malloc_stats(ctx: Context, argv: list[bytes]) -> Any:
    return Verbatim("Stats not supported for the current allocator")


@handles("memory|purge")
def memory_purge(ctx: Context, argv: list[bytes]) -> Any:
    """Collect unreachable objects and give free heap pages back to the system (glibc's malloc_trim)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    return OK


def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


# -- ROLE, DEBUG -------------------------------------------------------------------------------


@handles("role")
def role(ctx: Context, argv: list[bytes]) -> Any:
    return ["master", 0, []]


_DEBUG_HELP = (
    "SLEEP <seconds>",
    "    Stop the server for <seconds>. Decimals allowed.",
)


def _debug_allowed(ctx: Context) -> bool:
    setting = ctx.server.config["enable-debug-command"]
    if setting == "yes":
        return True
    if setting == "local":
        client = ctx.client
        return client.is_unix or client.addr.rsplit(":", 1)[0] in LOOPBACK
    return False


@handles("debug")
def debug(ctx: Context, argv: list[bytes]) -> Any:
    """DEBUG SLEEP blocks the whole server, as Redis's does: it is how a stall is simulated
    (SLOWLOG, LATENCY, clients' timeouts); DEBUG HELP lists what is here."""
    if not _debug_allowed(ctx):
        return DEBUG_REFUSED
    sub = argv[1].lower()
    if sub == b"help" and len(argv) == 2:
        return help_reply(argv[0], _DEBUG_HELP)
    if sub == b"sleep" and len(argv) == 3:
        seconds = _atof(argv[2])
        time.sleep(max(0.0, min(seconds, float(LLONG_MAX) / 1e6)))
        return OK
    name = quoted(argv[1].split(b"\0", 1)[0])
    return Error(f"ERR unknown subcommand or wrong number of arguments for '{name}'. Try DEBUG HELP.")


def _atof(raw: bytes) -> float:
    """C's atof: the longest leading decimal number, 0 when there is none (DEBUG SLEEP x sleeps 0)."""
    text = raw.decode("ascii", "replace").strip()
    for end in range(len(text), 0, -1):
        try:
            value = float(text[:end])
        except ValueError:
            continue
        return value if value == value else 0.0
    return 0.0

