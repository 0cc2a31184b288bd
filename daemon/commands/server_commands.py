"""Server commands: INFO, CONFIG, DBSIZE, TIME, SHUTDOWN, FLUSHALL, FLUSHDB, SAVE, BGSAVE, LASTSAVE."""

from __future__ import annotations

import time
from typing import Any

from pfxcache.protocol.replies import OK, Error, SimpleString, Verbatim

from pfxcache.daemon.observability import info as info_sections
from pfxcache.daemon.config.engine import ConfigError
from pfxcache.daemon.service.persistence import PersistenceError
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
async def flush(ctx: Context, argv: list[bytes]) -> Any:
    if len(argv) > 2 or (len(argv) == 2 and argv[1].lower() not in (b"async", b"sync")):
        return SYNTAX_ERROR
    await ctx.server.persistence.abort_bgsave()  # its pins would keep every page
    ctx.server.prefix.flush()
    return OK


@handles("shutdown")
async def shutdown(ctx: Context, argv: list[bytes]) -> Any:
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
    # Redis's meanings: SAVE saves, NOSAVE does not, neither saves when the save schedule is not
    # empty. The save is made here, so that a failure is this client's error and the daemon stays
    # up (FORCE: it stops anyway). The client gets no reply on success: its connection closes as
    # the server goes away.
    save = True if b"save" in flags else False if b"nosave" in flags else None
    persistence = ctx.server.persistence
    await persistence.wait_bgsave()
    if not persistence.save_on_shutdown(save) and b"force" not in flags:
        return Error("ERR Errors trying to SHUTDOWN. Check logs.")
    ctx.server.request_shutdown("SHUTDOWN", save=False)
    ctx.client.close_after_reply = True
    return NO_REPLY


@handles("save")
def save(ctx: Context, argv: list[bytes]) -> Any:
    try:
        ctx.server.persistence.save()
    except PersistenceError as exc:
        return Error(str(exc))
    return OK


@handles("bgsave")
def bgsave(ctx: Context, argv: list[bytes]) -> Any:
    if len(argv) > 2 or (len(argv) == 2 and argv[1].lower() != b"schedule"):
        return SYNTAX_ERROR
    try:
        ctx.server.start_bgsave()
    except PersistenceError as exc:
        return Error(str(exc))
    return SimpleString("Background saving started")


@handles("lastsave")
def lastsave(ctx: Context, argv: list[bytes]) -> Any:
    return ctx.server.persistence.last_save_time


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
