"""Namespaces as Redis keys: KEYS, SCAN, EXISTS, TYPE, DEL/UNLINK, TOUCH, RANDOMKEY,
OBJECT, MEMORY USAGE, the EXPIRE family, and RENAME (refused).

A namespace is the key of every PFX* command, so the generic keyspace commands
act on namespaces, with Redis 7.0.15's replies and errors. Deleting a namespace
makes it vanish at once: its unpinned pages are freed now, its pinned pages when
their leases end (they stay readable to the lease holder meanwhile, and never
to anyone else). A namespace with an expiry is deleted as a whole when it
comes due: a session-bound cache. Both the idle time and the access frequency
of a namespace are always tracked, whatever the eviction policy, so ``OBJECT
FREQ`` and ``OBJECT IDLETIME`` always answer (Redis answers only one of them,
depending on its policy).
"""

from __future__ import annotations

from typing import Any

from pfxcache.protocol.redis_strings import stringmatchlen
from pfxcache.protocol.replies import SimpleString, Error, quoted

from . import handles
from .context import Context
from .connection_commands import NOT_AN_INTEGER, SYNTAX_ERROR, parse_integer

#: What TYPE answers for a namespace: a module-style type name (9 characters).
TYPE_NAME = "pfx-cache"
#: What OBJECT ENCODING answers.
ENCODING = "radix-tree"

LLONG_MAX = 2**63 - 1
ULLONG_MAX = 2**64 - 1
INVALID_CURSOR = Error("ERR invalid cursor")
NO_SUCH_KEY = Error("ERR no such key")
RENAME_REFUSED = Error(
    "ERR namespaces cannot be renamed: a namespace names the model, tenant and salt its KV was "
    "computed for, and its pages are sharded by it; store under the new name or DEL the old one"
)


def _keyspace(ctx: Context) -> Any:
    return ctx.server.prefix.store.keys


# -- listing ----------------------------------------------------------------------------------


@handles("keys")
def keys(ctx: Context, argv: list[bytes]) -> Any:
    pattern = argv[1]
    names = _keyspace(ctx).names()
    if pattern == b"*":
        return names
    return [name for name in names if stringmatchlen(pattern, name)]


@handles("scan")
def scan(ctx: Context, argv: list[bytes]) -> Any:
    cursor = _parse_cursor(argv[1])
    if cursor is None:
        return INVALID_CURSOR
    count, pattern, type_name = 10, None, None
    i = 2
    while i < len(argv):
        option = argv[i].lower()
        if i + 1 >= len(argv):
            return SYNTAX_ERROR
        value = argv[i + 1]
        if option == b"count":
            count = parse_integer(value)
            if count is None:
                return NOT_AN_INTEGER
            if count < 1:
                return SYNTAX_ERROR
        elif option == b"match":
            pattern = value
        elif option == b"type":
            type_name = value
        else:
            return SYNTAX_ERROR
        i += 2
    next_cursor, names = _keyspace(ctx).scan(cursor, count)
    if pattern is not None and pattern != b"*":
        names = [name for name in names if stringmatchlen(pattern, name)]
    if type_name is not None and type_name.lower() != TYPE_NAME.encode():
        names = []
    return [str(next_cursor), names]


def _parse_cursor(raw: bytes) -> int | None:
    # Redis reads the cursor with strtoul: an optional sign, decimal digits, nothing else
    # (no leading space); a negative value wraps around, and an empty one is 0.
    if not raw:
        return 0
    body = raw[1:] if raw[:1] in (b"+", b"-") else raw
    if not body.isdigit():
        return None
    value = int(body)
    if value > ULLONG_MAX:
        return None
    return (-value) % (ULLONG_MAX + 1) if raw[:1] == b"-" else value


@handles("randomkey")
def randomkey(ctx: Context, argv: list[bytes]) -> Any:
    return _keyspace(ctx).random_name()


@handles("exists")
def exists(ctx: Context, argv: list[bytes]) -> Any:
    store = _keyspace(ctx)
    return sum(1 for name in argv[1:] if store.exists(name))


@handles("type")
def type_(ctx: Context, argv: list[bytes]) -> Any:
    return SimpleString(TYPE_NAME if _keyspace(ctx).exists(argv[1]) else "none")


@handles("touch")
def touch(ctx: Context, argv: list[bytes]) -> Any:
    store = _keyspace(ctx)
    return sum(1 for name in argv[1:] if store.touch(name))


@handles("del", "unlink")
def delete(ctx: Context, argv: list[bytes]) -> Any:
    store = _keyspace(ctx)
    return sum(1 for name in argv[1:] if store.delete(name))


@handles("rename", "renamenx")
def rename(ctx: Context, argv: list[bytes]) -> Any:
    if not _keyspace(ctx).exists(argv[1]):
        return NO_SUCH_KEY
    return RENAME_REFUSED


# -- OBJECT and MEMORY USAGE -------------------------------------------------------------------

OBJECT_HELP = [
    "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ENCODING <key>",
    "    Return the kind of internal representation used in order to store the value",
    "    associated with a <key>.",
    "FREQ <key>",
    "    Return the access frequency index of the <key>. The returned integer is",
    "    proportional to the logarithm of the recent access frequency of the key.",
    "IDLETIME <key>",
    "    Return the idle time of the <key>, that is the approximated number of",
    "    seconds elapsed since the last access to the key.",
    "REFCOUNT <key>",
    "    Return the number of references of the value associated with the specified",
    "    <key>.",
    "HELP",
    "    Prints this help.",
]


@handles("object|help")
def object_help(ctx: Context, argv: list[bytes]) -> Any:
    return [SimpleString(line) for line in OBJECT_HELP]


@handles("object|encoding")
def object_encoding(ctx: Context, argv: list[bytes]) -> Any:
    return ENCODING if _keyspace(ctx).exists(argv[2]) else None


@handles("object|refcount")
def object_refcount(ctx: Context, argv: list[bytes]) -> Any:
    return 1 if _keyspace(ctx).exists(argv[2]) else None


@handles("object|freq")
def object_freq(ctx: Context, argv: list[bytes]) -> Any:
    return _keyspace(ctx).frequency(argv[2])


@handles("object|idletime")
def object_idletime(ctx: Context, argv: list[bytes]) -> Any:
    return _keyspace(ctx).idle_seconds(argv[2])


@handles("memory|usage")
def memory_usage(ctx: Context, argv: list[bytes]) -> Any:
    if len(argv) not in (3, 5):
        return SYNTAX_ERROR
    if len(argv) == 5:
        if argv[3].lower() != b"samples":
            return SYNTAX_ERROR
        if parse_integer(argv[4]) is None:
            return NOT_AN_INTEGER
    return _keyspace(ctx).memory(argv[2])


# -- expiry --------------------------------------------------------------------------------------

_CONDITIONS = (b"nx", b"xx", b"gt", b"lt")


def _expire(ctx: Context, argv: list[bytes], *, unit_ms: int, absolute: bool) -> Any:
    flags = set()
    for raw in argv[3:]:
        word = raw.lower()
        if word not in _CONDITIONS:
            return Error(f"ERR Unsupported option {quoted(raw)}")
        flags.add(word)
    if b"nx" in flags and len(flags) > 1:
        return Error("ERR NX and XX, GT or LT options at the same time are not compatible")
    if {b"gt", b"lt"} <= flags:
        return Error("ERR GT and LT options at the same time are not compatible")
    amount = parse_integer(argv[2])  # after the options, as Redis checks them
    if amount is None:
        return NOT_AN_INTEGER
    command = argv[0].decode("utf-8", "replace").lower()
    invalid = Error(f"ERR invalid expire time in '{command}' command")
    if amount > LLONG_MAX // unit_ms or amount < -(LLONG_MAX // unit_ms):
        return invalid
    store = _keyspace(ctx)
    when = amount * unit_ms
    if not absolute:
        when += store.now_ms()
        if when > LLONG_MAX:
            return invalid
    if not store.exists(argv[1]):
        return 0
    current = store.expiry(argv[1])  # None: no expiry (an infinite TTL, for GT/LT)
    if b"nx" in flags and current is not None:
        return 0
    if b"xx" in flags and current is None:
        return 0
    if b"gt" in flags and (current is None or when <= current):
        return 0
    if b"lt" in flags and current is not None and when >= current:
        return 0
    store.set_expiry(argv[1], when)  # a time in the past deletes it now, as Redis does
    return 1


#: EXPIRE's four forms: the unit of their argument in ms, and whether it is a Unix time.
_EXPIRE_FORMS = {b"expire": (1000, False), b"pexpire": (1, False), b"expireat": (1000, True), b"pexpireat": (1, True)}
#: TTL's four forms: the unit of their reply in ms, and whether it is a Unix time.
_TTL_FORMS = {b"ttl": (1000, False), b"pttl": (1, False), b"expiretime": (1000, True), b"pexpiretime": (1, True)}


@handles("expire", "pexpire", "expireat", "pexpireat")
def expire(ctx: Context, argv: list[bytes]) -> Any:
    unit_ms, absolute = _EXPIRE_FORMS[argv[0].lower()]
    return _expire(ctx, argv, unit_ms=unit_ms, absolute=absolute)


def _ttl(ctx: Context, name: bytes, *, unit_ms: int, absolute: bool) -> int:
    store = _keyspace(ctx)
    if not store.exists(name):
        return -2
    when = store.expiry(name)
    if when is None:
        return -1
    if absolute:
        return when // unit_ms
    left = max(0, when - store.now_ms())
    return (left + unit_ms // 2) // unit_ms


@handles("ttl", "pttl", "expiretime", "pexpiretime")
def ttl(ctx: Context, argv: list[bytes]) -> Any:
    unit_ms, absolute = _TTL_FORMS[argv[0].lower()]
    return _ttl(ctx, argv[1], unit_ms=unit_ms, absolute=absolute)


@handles("persist")
def persist(ctx: Context, argv: list[bytes]) -> Any:
    store = _keyspace(ctx)
    if not store.exists(argv[1]) or store.expiry(argv[1]) is None:
        return 0
    store.set_expiry(argv[1], None)
    return 1
