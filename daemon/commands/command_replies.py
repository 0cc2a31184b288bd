"""The ``COMMAND`` family's replies, derived from the command table's rows.

``COMMAND INFO`` (:func:`command_info_reply`, addReplyCommandInfo),
``COMMAND DOCS`` (:func:`command_docs_reply`, addReplyCommandDocs),
``COMMAND LIST`` and ``COMMAND GETKEYS[ANDFLAGS]``, as Redis 7.0's
``server.c`` builds them, so reply bytes match redis-server's. The handlers
that call these are in :mod:`.introspection`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pfxcache.protocol.redis_strings import stringmatchlen
from pfxcache.protocol.replies import Error, Set, SimpleString

from .spec import ARG_FLAGS, CATEGORY_RANK, REPLY_FLAGS, CommandSpec, KeySpec, get_keys, has_key_arguments

if TYPE_CHECKING:
    from .table import CommandTable

__all__ = [
    "PairMap",
    "command_docs_map",
    "command_docs_reply",
    "command_getkeys_reply",
    "command_info_reply",
    "command_list",
]


def _status_set(names: Iterable[str]) -> Set:
    return Set([SimpleString(n) for n in names])


def _key_spec_reply(spec: KeySpec) -> dict:
    reply: dict[str, Any] = {}
    if spec.notes:
        reply["notes"] = spec.notes
    reply["flags"] = _status_set(spec.flags)
    if spec.begin_search == "index":
        reply["begin_search"] = {"type": "index", "spec": {"index": spec.index}}
    elif spec.begin_search == "keyword":
        reply["begin_search"] = {
            "type": "keyword",
            "spec": {"keyword": spec.keyword, "startfrom": spec.startfrom},
        }
    else:
        reply["begin_search"] = {"type": "unknown", "spec": {}}
    if spec.find_keys == "range":
        reply["find_keys"] = {
            "type": "range",
            "spec": {"lastkey": spec.lastkey, "keystep": spec.keystep, "limit": spec.limit},
        }
    elif spec.find_keys == "keynum":
        reply["find_keys"] = {
            "type": "keynum",
            "spec": {"keynumidx": spec.keynumidx, "firstkey": spec.firstkey, "keystep": spec.keystep},
        }
    else:
        reply["find_keys"] = {"type": "unknown", "spec": {}}
    return reply


def command_info_reply(spec: CommandSpec) -> list:
    """The 10-element ``COMMAND INFO`` entry (addReplyCommandInfo), cached per row.

    Note that an empty subcommand list is an empty *set* while a container's
    subcommands are an *array*, exactly as redis-server 7.0 sends them.
    """
    if spec._info_reply is None:
        spec._info_reply = [
            spec.fullname,
            spec.arity,
            _status_set(f for f in REPLY_FLAGS if f in spec.flags),
            spec.first_key,
            spec.last_key,
            spec.key_step,
            _status_set(spec.acl_categories),
            Set(list(spec.tips)),
            Set([_key_spec_reply(ks) for ks in spec.key_specs]),
            [command_info_reply(s) for s in spec.subcommands.values()] if spec.subcommands else Set([]),
        ]
    return spec._info_reply


def _argument_reply(arg: dict) -> dict:
    # redis-server's generator lowercases argument names and uppercases tokens.
    reply: dict[str, Any] = {"name": arg["name"].lower(), "type": arg["type"]}
    if "key_spec_index" in arg:
        reply["key_spec_index"] = int(arg["key_spec_index"])
    if arg.get("token") is not None:
        # An empty token is real: MIGRATE's "" placeholder for the key.
        reply["token"] = arg["token"].upper()
    for key in ("summary", "since", "deprecated_since"):
        if arg.get(key):
            reply[key] = arg[key]
    flags = [f for f in ARG_FLAGS if arg.get(f)]
    if flags:
        reply["flags"] = _status_set(flags)
    if arg["type"] in ("oneof", "block"):
        reply["arguments"] = [_argument_reply(a) for a in arg["arguments"]]
    return reply


def command_docs_reply(spec: CommandSpec) -> dict:
    """The documentation map of one command (addReplyCommandDocs), cached per row."""
    if spec._docs_reply is None:
        reply: dict[str, Any] = {"summary": spec.summary}
        if spec.since:
            reply["since"] = spec.since
        reply["group"] = spec.group
        if spec.complexity:
            reply["complexity"] = spec.complexity
        if spec.doc_flags:
            reply["doc_flags"] = _status_set(spec.doc_flags)
        if spec.deprecated_since:
            reply["deprecated_since"] = spec.deprecated_since
        if spec.replaced_by:
            reply["replaced_by"] = spec.replaced_by
        if spec.history:
            reply["history"] = Set([list(entry) for entry in spec.history])
        if spec.arguments:
            reply["arguments"] = [_argument_reply(a) for a in spec.arguments]
        if spec.subcommands:
            reply["subcommands"] = {s.fullname: command_docs_reply(s) for s in spec.subcommands.values()}
        spec._docs_reply = reply
    return spec._docs_reply


class PairMap(dict):
    """A map reply whose keys may repeat, as in ``COMMAND DOCS ping ping``.

    The encoder only uses ``len()`` and ``items()`` of a dict, so this
    subclass carries its pairs in a list and reports those instead.
    """

    __slots__ = ("pairs",)

    def __init__(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        super().__init__()
        self.pairs = list(pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def items(self):  # type: ignore[override]
        return iter(self.pairs)

    def __repr__(self) -> str:
        return f"PairMap({self.pairs!r})"


def command_docs_map(table: CommandTable, names: list[bytes]) -> dict:
    """``COMMAND DOCS [name ...]``: every command, or the named ones that exist, in order."""
    if not names:
        return {spec.fullname: command_docs_reply(spec) for spec in table}
    pairs = []
    for name in names:
        spec = table.get(name)
        if spec is not None:
            pairs.append((spec.fullname, command_docs_reply(spec)))
    if len({name for name, _ in pairs}) == len(pairs):
        return dict(pairs)
    return PairMap(pairs)


# --------------------------------------------------------------------------- COMMAND LIST


def command_list(table: CommandTable, args: list[bytes]) -> list | Error:
    """``COMMAND LIST [FILTERBY MODULE m|ACLCAT c|PATTERN p]``; ``args`` follow ``LIST``."""
    predicate: Callable[[CommandSpec], bool] | None = None
    i = 0
    while i < len(args):
        more = len(args) - 1 - i
        if args[i].lower() == b"filterby" and more == 2:
            kind, value = args[i + 1].lower(), args[i + 2]
            if kind == b"module":
                # pfxcache loads no modules, so no command belongs to one.
                predicate = lambda spec: False
            elif kind == b"aclcat":
                category = "@" + value.decode("latin-1").lower()
                valid = category[1:] in CATEGORY_RANK
                predicate = lambda spec, c=category, v=valid: v and c in spec.acl_categories
            elif kind == b"pattern":
                predicate = lambda spec, p=value: stringmatchlen(p, spec.fullname.encode(), True)
            else:
                return Error("ERR syntax error")
            i += 3
        else:
            return Error("ERR syntax error")
    return [spec.fullname for spec in table.walk() if predicate is None or predicate(spec)]


def command_getkeys_reply(table: CommandTable, argv: list[bytes], with_flags: bool) -> Any:
    """``COMMAND GETKEYS|GETKEYSANDFLAGS <command> [args...]``; ``argv`` is the full command."""
    target = argv[2:]
    spec = table.lookup(target)
    if spec is None:
        return Error("ERR Invalid command specified")
    if not has_key_arguments(spec):
        return Error("ERR The command has no key arguments")
    if not spec.arity_ok(len(target)):
        return Error("ERR Invalid number of arguments specified for command")
    keys = get_keys(spec, target)
    if not keys:
        if "no_mandatory_keys" in spec.flags:
            return []
        return Error("ERR Invalid arguments specified for command")
    if with_flags:
        return [[target[pos], _status_set(flags)] for pos, flags in keys]
    return [target[pos] for pos, _ in keys]
