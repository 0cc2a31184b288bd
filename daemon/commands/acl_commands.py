"""ACL commands: SETUSER, GETUSER, LIST, WHOAMI, DELUSER, USERS, CAT, LOG, DRYRUN, SAVE, LOAD, HELP.

Replies and error texts are redis-server 7.0's; the user model is
:mod:`pfxcache.daemon.security.acl`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from pfxcache.protocol.replies import OK, Error, SimpleString

from pfxcache.daemon.security.acl import AclError, load_acl_file, valid_username
from . import handles
from .connection_commands import NOT_AN_INTEGER, parse_integer
from .context import Context

log = logging.getLogger("pfxcached")
from .spec import ACL_CATEGORIES


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


@handles("acl|setuser")
def acl_setuser(ctx: Context, argv: list[bytes]) -> Any:
    name = _text(argv[2])
    if not valid_username(name):
        return Error("ERR Usernames can't contain spaces or null characters")
    try:
        ctx.server.acl.setuser(name, [_text(raw) for raw in argv[3:]])
    except AclError as exc:
        return Error(f"ERR {exc}")
    _drop_revoked_subscribers(ctx, name)
    return OK


def _drop_revoked_subscribers(ctx: Context, name: str) -> None:
    """As Redis 7: a connection of ``name`` subscribed to a channel or pattern the new rules no
    longer allow is closed (ACLKillPubsubClientsIfNeeded)."""
    user = ctx.server.acl.users.get(name)
    if user is None or user.all_channels:
        return
    for client in list(ctx.server.clients):
        subs = client.pubsub
        if client.user != name or subs is None or not subs.count:
            continue
        if all(user.channel_allowed(ch, False) for ch in subs.channels) and \
                all(user.channel_allowed(p, True) for p in subs.patterns):
            continue
        if client is ctx.client:
            client.close_after_reply = True
        else:
            client.kill()


@handles("acl|getuser")
def acl_getuser(ctx: Context, argv: list[bytes]) -> Any:
    acl = ctx.server.acl
    user = acl.users.get(_text(argv[2]))
    return None if user is None else acl.getuser(user)


@handles("acl|list")
def acl_list(ctx: Context, argv: list[bytes]) -> Any:
    acl = ctx.server.acl
    return [acl.describe(acl.users[name]) for name in sorted(acl.users, key=lambda n: n.encode("utf-8", "surrogateescape"))]


@handles("acl|users")
def acl_users(ctx: Context, argv: list[bytes]) -> Any:
    return sorted(ctx.server.acl.users, key=lambda n: n.encode("utf-8", "surrogateescape"))


@handles("acl|whoami")
def acl_whoami(ctx: Context, argv: list[bytes]) -> Any:
    return ctx.client.user


@handles("acl|deluser")
def acl_deluser(ctx: Context, argv: list[bytes]) -> Any:
    acl = ctx.server.acl
    names = [_text(raw) for raw in argv[2:]]
    if "default" in names:
        return Error("ERR The 'default' user cannot be removed")
    deleted = 0
    for name in names:
        if acl.deluser(name):
            deleted += 1
            # As Redis: the connections authenticated as a removed user are closed.
            for client in list(ctx.server.clients):
                if client.user == name:
                    if client is ctx.client:
                        client.close_after_reply = True
                    else:
                        client.kill()
    return deleted


@handles("acl|cat")
def acl_cat(ctx: Context, argv: list[bytes]) -> Any:
    if len(argv) > 3:
        return Error("ERR unknown subcommand or wrong number of arguments for 'CAT'. Try ACL HELP.")
    if len(argv) == 2:
        return list(ACL_CATEGORIES)
    category = _text(argv[2]).lower()
    if category not in ACL_CATEGORIES:
        return Error(f"ERR Unknown category '{_text(argv[2])}'")
    wanted = "@" + category
    return [spec.fullname for spec in ctx.server.commands.walk() if wanted in spec.acl_categories]


# Redis 7.0.15's ACL HELP, with the lines of the subcommands this daemon has.
ACL_HELP = [
    "ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CAT [<category>]",
    "    List all commands that belong to <category>, or all command categories",
    "    when no category is specified.",
    "DELUSER <username> [<username> ...]",
    "    Delete a list of users.",
    "DRYRUN <username> <command> [<arg> ...]",
    "    Returns whether the user can execute the given command without executing the command.",
    "GETUSER <username>",
    "    Get the user's details.",
    "LIST",
    "    Show users details in config file format.",
    "LOAD",
    "    Reload users from the ACL file.",
    "LOG [<count> | RESET]",
    "    Show the ACL log entries.",
    "SAVE",
    "    Save the current config to the ACL file.",
    "SETUSER <username> <attribute> [<attribute> ...]",
    "    Create or modify a user with the specified attributes.",
    "USERS",
    "    List all the registered usernames.",
    "WHOAMI",
    "    Return the current connection username.",
    "HELP",
    "    Prints this help.",
]


@handles("acl|help")
def acl_help(ctx: Context, argv: list[bytes]) -> Any:
    return [SimpleString(line) for line in ACL_HELP]


# -- ACL LOG, DRYRUN, SAVE, LOAD ------------------------------------------------------------------

NO_ACLFILE = Error(
    "ERR This Redis instance is not configured to use an ACL file. You may want to specify users via the "
    "ACL SETUSER command and then issue a CONFIG REWRITE (assuming you have a Redis configuration file set) "
    "in order to store users in the Redis configuration."
)


@handles("acl|log")
def acl_log(ctx: Context, argv: list[bytes]) -> Any:
    log = ctx.server.observers.acl_log
    if len(argv) > 3:
        return Error("ERR unknown subcommand or wrong number of arguments for 'LOG'. Try ACL HELP.")
    if len(argv) == 3:
        if argv[2].lower() == b"reset":
            log.reset()
            return OK
        count = parse_integer(argv[2])
        if count is None:
            return NOT_AN_INTEGER
        return log.get(max(count, 0))
    return log.get(10)


@handles("acl|dryrun")
def acl_dryrun(ctx: Context, argv: list[bytes]) -> Any:
    acl, table = ctx.server.acl, ctx.server.commands
    name = _text(argv[2])
    if name not in acl.users:
        return Error(f"ERR User '{name}' not found")
    command = argv[3:]
    spec = table.lookup(command)
    if spec is None:
        return Error(f"ERR Command '{_text(argv[3])}' not found")
    if not spec.arity_ok(len(command)):
        return Error(f"ERR wrong number of arguments for '{spec.fullname}' command")
    if acl.check(name, spec, command) is None:
        return OK
    reason, obj = acl.denial(name, spec, command)
    if reason in ("key", "channel"):
        return f"This user has no permissions to access the '{obj}' {reason}"
    return f"This user has no permissions to run the '{obj}' command"


def _aclfile(ctx: Context) -> str:
    return ctx.server.config["aclfile"]


@handles("acl|save")
def acl_save(ctx: Context, argv: list[bytes]) -> Any:
    path = _aclfile(ctx)
    if not path:
        return NO_ACLFILE
    lines = acl_list(ctx, argv)
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        log.warning("Opening temp ACL file for ACL SAVE: %s", exc)
        try:
            os.unlink(temporary)
        except OSError:
            pass
        return Error("ERR There was an error trying to save the ACLs. Please check the server logs for more "
                     "information")
    return OK


@handles("acl|load")
def acl_load(ctx: Context, argv: list[bytes]) -> Any:
    path = _aclfile(ctx)
    if not path:
        return NO_ACLFILE
    acl = ctx.server.acl
    try:
        users = load_acl_file(acl.commands, path)
    except OSError as exc:
        return Error(f"ERR Error loading ACLs, opening file '{path}': {exc.strerror}")
    except ValueError as exc:
        return Error(f"ERR {exc}")
    acl.replace_users(users)
    # As Redis: connections of users that changed or went away are closed.
    for client in list(ctx.server.clients):
        if client.user not in users and client is not ctx.client:
            client.kill()
    return OK
