"""The ``COMMAND`` family: every reply derives from the command table's rows.

``ctx.server.commands`` is the :class:`~pfxcache.daemon.commands.table.CommandTable`; the
replies are built in :mod:`~pfxcache.daemon.commands.command_replies`.
Reply shapes and error texts are those of redis-server 7.0.15 (``server.c``:
``commandCommand`` and friends).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pfxcache.daemon.commands import handles
from pfxcache.daemon.commands.context import Context
from pfxcache.daemon.commands.command_replies import (
    command_docs_map,
    command_getkeys_reply,
    command_info_reply,
    command_list,
)
from pfxcache.protocol.replies import SimpleString

__all__ = ["help_reply"]

_COMMAND_HELP = (
    "(no subcommand)",
    "    Return details about all Redis commands.",
    "COUNT",
    "    Return the total number of commands in this Redis server.",
    "LIST",
    "    Return a list of all commands in this Redis server.",
    "INFO [<command-name> ...]",
    "    Return details about multiple Redis commands.",
    "    If no command names are given, documentation details for all",
    "    commands are returned.",
    "DOCS [<command-name> ...]",
    "    Return documentation details about multiple Redis commands.",
    "    If no command names are given, documentation details for all",
    "    commands are returned.",
    "GETKEYS <full-command>",
    "    Return the keys from a full Redis command.",
    "GETKEYSANDFLAGS <full-command>",
    "    Return the keys and the access flags from a full Redis command.",
)


def help_reply(command: bytes, lines: Iterable[str]) -> list[SimpleString]:
    """A ``<CMD> HELP`` reply as Redis's addReplyHelp() builds it.

    The header names the command as the client typed it, uppercased, and
    the ``HELP`` entry closes every list.
    """
    name = command.split(b"\0", 1)[0].upper().decode("utf-8", "replace")
    reply = [SimpleString(f"{name} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:")]
    reply.extend(SimpleString(line) for line in lines)
    reply.append(SimpleString("HELP"))
    reply.append(SimpleString("    Prints this help."))
    return reply


@handles("command")
def command(ctx: Context, argv: list[bytes]) -> Any:
    """``COMMAND``: the INFO entry of every top-level command."""
    return [command_info_reply(spec) for spec in ctx.server.commands]


@handles("command|count")
def command_count(ctx: Context, argv: list[bytes]) -> Any:
    """``COMMAND COUNT``: the number of top-level commands."""
    return len(ctx.server.commands)


@handles("command|info")
def command_info(ctx: Context, argv: list[bytes]) -> Any:
    """``COMMAND INFO [name ...]``: one entry per name (null if unknown), or all commands."""
    table = ctx.server.commands
    if len(argv) == 2:
        return [command_info_reply(spec) for spec in table]
    entries = []
    for name in argv[2:]:
        spec = table.get(name)
        entries.append(None if spec is None else command_info_reply(spec))
    return entries


@handles("command|docs")
def command_docs(ctx: Context, argv: list[bytes]) -> Any:
    """``COMMAND DOCS [name ...]``: a map of name to documentation; unknown names are skipped."""
    return command_docs_map(ctx.server.commands, argv[2:])


@handles("command|list")
def command_list_(ctx: Context, argv: list[bytes]) -> Any:
    """``COMMAND LIST [FILTERBY MODULE m|ACLCAT c|PATTERN p]``: names, subcommands included."""
    return command_list(ctx.server.commands, argv[2:])


@handles("command|getkeys")
def command_getkeys(ctx: Context, argv: list[bytes]) -> Any:
    """``COMMAND GETKEYS <command> [arg ...]``: the key arguments of a full command."""
    return command_getkeys_reply(ctx.server.commands, argv, with_flags=False)


@handles("command|getkeysandflags")
def command_getkeysandflags(ctx: Context, argv: list[bytes]) -> Any:
    """``COMMAND GETKEYSANDFLAGS <command> [arg ...]``: each key with its key-spec flags."""
    return command_getkeys_reply(ctx.server.commands, argv, with_flags=True)


@handles("command|help")
def command_help(ctx: Context, argv: list[bytes]) -> Any:
    """``COMMAND HELP``."""
    return help_reply(argv[0], _COMMAND_HELP)
