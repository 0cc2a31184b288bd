"""Server commands: INFO, CONFIG, DBSIZE, TIME, SHUTDOWN, FLUSHALL, FLUSHDB."""

from __future__ import annotations

import time
from typing import Any

from pfxcache.protocol.replies import OK, Error, SimpleString, Verbatim

from pfxcache.daemon.observability import info as info_sections
from pfxcache.daemon.config.engine import ConfigError
from . import handles
from .connection_commands import SYNTAX_ERROR
from .context import NO_REPLY, Context


@handles("info")
def info(ctx: Context, argv: list[bytes]) -> Any:
    sections = [arg.decode("utf-8", "replace") for arg in argv[1:]]
    return Verbatim(info_sections.render(ctx.server, sections))


@handles("dbsize")
def dbsize(ctx: Context, argv: list[bytes]) -> Any:
    return ctx.server.prefix.namespace_count()


@handles("time")
def time_(ctx: Context, argv: list[bytes]) -> Any:
    now = time.time_ns() // 1000
    return [str(now // 1_000_000), str(now % 1_000_000)]


@handles("flushall", "flushdb")
def flush(ctx: Context, argv: list[bytes]) -> Any:
    if len(argv) > 2 or (len(argv) == 2 and argv[1].lower() not in (b"async", b"sync")):
        return SYNTAX_ERROR
    ctx.server.prefix.flush()
    return OK


@handles("shutdown")
def shutdown(ctx: Context, argv: list[bytes]) -> Any:
    flags = set()
    for raw in argv[1:]:
        word = raw.lower()
        if word not in (b"nosave", b"save", b"now", b"force", b"abort"):
            return SYNTAX_ERROR
        flags.add(word)
    if {b"nosave", b"save"} <= flags or (b"abort" in flags and len(flags) > 1):
        return SYNTAX_ERROR
    if b"abort" in flags:
        return Error("ERR No shutdown in progress.")
    # Nothing is persisted, so SAVE and NOSAVE both just stop the daemon; the
    # client gets no reply: its connection closes as the server goes away.
    ctx.server.request_shutdown("SHUTDOWN")
    ctx.client.close_after_reply = True
    return NO_REPLY


# -- CONFIG -----------------------------------------------------------------------

CONFIG_HELP = [
    "CONFIG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GET <pattern>",
    "    Return parameters matching the glob-like <pattern> and their values.",
    "SET <directive> <value>",
    "    Set the configuration <directive> to <value>.",
    "RESETSTAT",
    "    Reset statistics reported by the INFO command.",
    "REWRITE",
    "    Rewrite the configuration file.",
    "HELP",
    "    Prints this help.",
]


@handles("config|help")
def config_help(ctx: Context, argv: list[bytes]) -> Any:
    return [SimpleString(line) for line in CONFIG_HELP]


@handles("config|get")
def config_get(ctx: Context, argv: list[bytes]) -> Any:
    return ctx.server.config.get(argv[2:])


@handles("config|set")
def config_set(ctx: Context, argv: list[bytes]) -> Any:
    if len(argv) % 2:
        return SYNTAX_ERROR
    pairs = [(argv[i], argv[i + 1]) for i in range(2, len(argv), 2)]
    try:
        ctx.server.config.set(pairs)
    except ConfigError as exc:
        return Error(exc.message)
    return OK


@handles("config|resetstat")
def config_resetstat(ctx: Context, argv: list[bytes]) -> Any:
    ctx.server.stats.reset()
    ctx.server.prefix.reset_keyspace_stats()
    return OK


@handles("config|rewrite")
def config_rewrite(ctx: Context, argv: list[bytes]) -> Any:
    try:
        ctx.server.config.rewrite()
    except ConfigError as exc:
        return Error(exc.message)
    except OSError as exc:
        return Error(f"ERR Rewriting config file: {exc.strerror}")
    return OK
