"""The command table: one row per command, loaded from ``defs/*.json``.

The definitions in ``defs/`` follow the schema of Redis's ``src/commands/*.json``
(BSD-3-Clause, Copyright (c) Redis Ltd.). Their content is that of
redis-server 7.0.15 -- the version whose replies pfxcache reproduces -- with the
fields pfxcache does not use (``function``, ``reply_schema`` ...) and the
subcommands it does not implement left out. Rows that 7.0.15 lacks (``CLIENT
SETINFO``, ``CLIENT NO-TOUCH``) are written in the same style with their real
``since``. New commands (``PFXGET`` ...) are added as new files, not code.

Everything observable about a command derives from its row: dispatch
(:meth:`CommandTable.resolve`), arity errors, ACL categories, and the replies of
``COMMAND``, ``COMMAND INFO``, ``COMMAND DOCS``, ``COMMAND LIST`` and
``COMMAND GETKEYS[ANDFLAGS]``. The derivations follow Redis 7.0's ``server.c``
(``setImplicitACLCategories``, ``populateCommandLegacyRangeSpec``,
``addReplyCommandInfo``, ``addReplyCommandDocs``) and ``db.c``
(``getKeysUsingKeySpecs``), so reply bytes match redis-server's.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pfxcache.protocol.redis_strings import string2ll, stringmatchlen
from pfxcache.protocol.replies import Error, Set, SimpleString

__all__ = [
    "ACL_CATEGORIES",
    "CommandSpec",
    "CommandTable",
    "KeySpec",
    "command_docs_reply",
    "command_getkeys_reply",
    "command_info_reply",
    "command_list",
    "get_keys",
    "has_key_arguments",
]

DEFS_DIR = Path(__file__).with_name("defs")

#: ACL categories in Redis's table order, which is the order COMMAND INFO lists them in.
ACL_CATEGORIES: tuple[str, ...] = (
    "keyspace", "read", "write", "set", "sortedset", "list", "hash", "string",
    "bitmap", "hyperloglog", "geo", "stream", "pubsub", "admin", "fast", "slow",
    "blocking", "dangerous", "connection", "transaction", "scripting",
    # pfxcache's own: the prefix cache commands, so ACLs can say +@pfx / -@pfx.
    "pfx",
)
_CATEGORY_RANK = {name: i for i, name in enumerate(ACL_CATEGORIES)}

#: Command flags COMMAND INFO shows, in the order redis-server prints them
#: (``addReplyCommandFlags``). "module" and "movablekeys" are derived, never declared.
_REPLY_FLAGS: tuple[str, ...] = (
    "write", "readonly", "denyoom", "module", "admin", "pubsub", "noscript",
    "blocking", "loading", "stale", "skip_monitor", "skip_slowlog", "asking",
    "fast", "no_auth", "no_mandatory_keys", "no_async_loading", "no_multi",
    "movablekeys", "allow_busy",
)
#: Flags a row may declare that redis-server deliberately hides from COMMAND INFO.
_HIDDEN_FLAGS = frozenset({"may_replicate", "sentinel", "only_sentinel", "protected"})
_DECLARABLE_FLAGS = (frozenset(_REPLY_FLAGS) - {"module", "movablekeys"}) | _HIDDEN_FLAGS

#: Key-spec flags as COMMAND INFO / GETKEYSANDFLAGS spell them, in reply order.
_KEY_FLAGS: tuple[tuple[str, str], ...] = (
    ("RO", "RO"), ("RW", "RW"), ("OW", "OW"), ("RM", "RM"),
    ("ACCESS", "access"), ("UPDATE", "update"), ("INSERT", "insert"),
    ("DELETE", "delete"), ("NOT_KEY", "not_key"), ("INCOMPLETE", "incomplete"),
    ("VARIABLE_FLAGS", "variable_flags"),
)
_KEY_FLAG_NAMES = frozenset(json_name for json_name, _ in _KEY_FLAGS)

_ARG_TYPES = frozenset({
    "string", "integer", "double", "key", "pattern", "unix-time", "pure-token", "oneof", "block",
})
_ARG_FLAGS = ("optional", "multiple", "multiple_token")
_DOC_FLAGS = ("deprecated", "syscmd")
_GROUPS = frozenset({
    "generic", "string", "list", "set", "sorted-set", "hash", "pubsub", "transactions",
    "connection", "server", "scripting", "hyperloglog", "cluster", "sentinel", "geo",
    "stream", "bitmap", "module",
})
_TOP_LEVEL_FIELDS = frozenset({
    "summary", "complexity", "group", "since", "arity", "container", "function",
    "history", "deprecated_since", "replaced_by", "doc_flags", "command_flags",
    "acl_categories", "command_tips", "key_specs", "arguments", "get_keys_function",
    "reply_schema",
})


@dataclass(frozen=True, slots=True)
class KeySpec:
    """One entry of a command's ``key_specs`` (how to find some of its keys in argv).

    ``begin_search`` is ``"index"`` (keys start at argv[``index``]), ``"keyword"``
    (after the first ``keyword`` found searching from ``startfrom``; negative
    counts from the end) or ``"unknown"``. ``find_keys`` is ``"range"`` (up to
    ``lastkey`` relative to the first key, -1 = last argument, every ``keystep``;
    ``limit`` divides the remaining arguments), ``"keynum"`` (argument
    ``keynumidx`` holds the count, keys from ``firstkey`` every ``keystep``) or
    ``"unknown"``. All indexes are argv positions, argv[0] being the command.
    """

    flags: tuple[str, ...]  # reply spelling, reply order: ("RW", "access", ...)
    notes: str | None
    begin_search: str
    index: int = 0
    keyword: str = ""
    startfrom: int = 0
    find_keys: str = "unknown"
    lastkey: int = 0
    keystep: int = 1
    limit: int = 0
    keynumidx: int = 0
    firstkey: int = 0

    @property
    def is_index_range(self) -> bool:
        return self.begin_search == "index" and self.find_keys == "range"

    @classmethod
    def from_json(cls, data: dict, where: str) -> KeySpec:
        raw_flags = [f.upper() for f in data.get("flags", ())]
        unknown = set(raw_flags) - _KEY_FLAG_NAMES
        if unknown:
            raise ValueError(f"{where}: unknown key-spec flags {sorted(unknown)}")
        flags = tuple(reply for json_name, reply in _KEY_FLAGS if json_name in raw_flags)
        kwargs: dict[str, Any] = {"flags": flags, "notes": data.get("notes")}
        (bs_type, bs), = data["begin_search"].items()
        if bs_type == "index":
            kwargs.update(begin_search="index", index=int(bs["pos"]))
        elif bs_type == "keyword":
            kwargs.update(begin_search="keyword", keyword=bs["keyword"], startfrom=int(bs["startfrom"]))
        elif bs_type == "unknown":
            kwargs.update(begin_search="unknown")
        else:
            raise ValueError(f"{where}: unknown begin_search type {bs_type!r}")
        (fk_type, fk), = data["find_keys"].items()
        if fk_type == "range":
            kwargs.update(find_keys="range", lastkey=int(fk["lastkey"]), keystep=int(fk["step"]),
                          limit=int(fk["limit"]))
        elif fk_type == "keynum":
            kwargs.update(find_keys="keynum", keynumidx=int(fk["keynumidx"]),
                          firstkey=int(fk["firstkey"]), keystep=int(fk["step"]))
        elif fk_type == "unknown":
            kwargs.update(find_keys="unknown")
        else:
            raise ValueError(f"{where}: unknown find_keys type {fk_type!r}")
        return cls(**kwargs)


@dataclass(slots=True, eq=False)
class CommandSpec:
    """One command or subcommand, as declared by its ``defs/*.json`` row.

    ``flags`` holds the lowercase Redis flag names, the hidden ones
    (``sentinel`` ...) and the derived ``movablekeys`` included.
    ``acl_categories`` is spelled as COMMAND INFO reports it (``"@read"``),
    implicit categories included. ``first_key``/``last_key``/``key_step`` are
    the legacy range COMMAND INFO reports (``last_key`` absolute, -1 = last).
    ``handler`` is bound by :meth:`CommandTable.bind_module`; ``getkeys_proc``
    may be set for commands whose keys the key specs cannot describe (Redis's
    ``get_keys_function``): ``proc(spec, argv) -> list[(pos, flags)] | None``.
    """

    fullname: str
    name: str
    container: CommandSpec | None
    arity: int
    flags: frozenset[str]
    acl_categories: tuple[str, ...]
    first_key: int
    last_key: int
    key_step: int
    key_specs: list[KeySpec]
    tips: list[str]
    summary: str
    since: str | None
    group: str
    complexity: str | None
    history: list[list[str]]
    doc_flags: tuple[str, ...]
    deprecated_since: str | None
    replaced_by: str | None
    arguments: list[dict]
    subcommands: dict[str, CommandSpec] = field(default_factory=dict)
    handler: Callable | None = None
    is_async: bool = False
    getkeys_proc: Callable | None = None
    _subs_by_bytes: dict[bytes, CommandSpec] = field(default_factory=dict, repr=False)
    _info_reply: list | None = field(default=None, repr=False)
    _docs_reply: dict | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"<CommandSpec {self.fullname} arity={self.arity}>"

    def arity_ok(self, argc: int) -> bool:
        """Whether ``argc`` arguments (command name included) satisfy the arity."""
        return argc == self.arity if self.arity > 0 else argc >= -self.arity

    def walk(self) -> Iterator[CommandSpec]:
        """This command, then its subcommands."""
        yield self
        yield from self.subcommands.values()


# --------------------------------------------------------------------------- loading


def _implicit_categories(flags: frozenset[str], explicit: set[str]) -> set[str]:
    # Mirrors setImplicitACLCategories() in Redis 7.0's server.c.
    cats = set(explicit)
    if "write" in flags:
        cats.add("write")
    if "readonly" in flags and "scripting" not in cats:
        cats.add("read")
    if "admin" in flags:
        cats |= {"admin", "dangerous"}
    if "pubsub" in flags:
        cats.add("pubsub")
    if "fast" in flags:
        cats.add("fast")
    if "blocking" in flags:
        cats.add("blocking")
    if "fast" not in cats:
        cats.add("slow")
    return cats


def _legacy_range(specs: list[KeySpec]) -> tuple[int, int, int]:
    """(first, last, step) as COMMAND INFO reports them; populateCommandLegacyRangeSpec()."""
    if not specs:
        return 0, 0, 0
    if len(specs) == 1 and specs[0].is_index_range:
        spec = specs[0]
        last = spec.lastkey + spec.index if spec.lastkey >= 0 else spec.lastkey
        return spec.index, last, spec.keystep
    first = None
    last = 0
    prev_last = 0
    for spec in specs:
        if not spec.is_index_range:
            continue
        if spec.keystep != 1 or (prev_last and prev_last != spec.index - 1):
            continue
        first = spec.index if first is None else min(first, spec.index)
        last = _unsigned_max(last, spec.lastkey + spec.index if spec.lastkey >= 0 else spec.lastkey)
        prev_last = last
    if first is None:
        return 0, 0, 0
    return first, last, 1


def _movable_keys(specs: list[KeySpec]) -> bool:
    """Whether COMMAND INFO flags the command ``movablekeys``.

    redis-server 7.0.15 derives it from the key specs alone: a spec that is
    not a plain index+range, an incomplete spec, or range specs that the
    legacy (first, last, step) triple cannot describe.
    """
    if not specs:
        return False
    if len(specs) == 1 and specs[0].is_index_range:
        return "incomplete" in specs[0].flags
    movable = False
    prev_last = 0
    last = 0
    for spec in specs:
        if not spec.is_index_range:
            movable = True
            continue
        if spec.keystep != 1 or (prev_last and prev_last != spec.index - 1):
            movable = True
            continue
        if "incomplete" in spec.flags:
            movable = True
        last = _unsigned_max(last, spec.lastkey + spec.index if spec.lastkey >= 0 else spec.lastkey)
        prev_last = last
    return movable


def _unsigned_max(a: int, b: int) -> int:
    # max((unsigned)a, (unsigned)b) on 32-bit ints: a negative (open-ended) last key wins.
    m = max(a & 0xFFFFFFFF, b & 0xFFFFFFFF)
    return m - (1 << 32) if m >= 1 << 31 else m


def _check_arguments(args: list, where: str) -> None:
    for arg in args:
        if "name" not in arg or "type" not in arg:
            raise ValueError(f"{where}: every argument needs a name and a type: {arg!r}")
        if arg["type"] not in _ARG_TYPES:
            raise ValueError(f"{where}: unknown argument type {arg['type']!r}")
        nested = arg.get("arguments")
        if arg["type"] in ("oneof", "block"):
            if not nested:
                raise ValueError(f"{where}: {arg['type']} argument {arg['name']!r} needs arguments")
            _check_arguments(nested, where)
        elif nested:
            raise ValueError(f"{where}: argument {arg['name']!r} of type {arg['type']} has arguments")


def _build_spec(declared: str, row: dict, container: CommandSpec | None, where: str) -> CommandSpec:
    unknown_fields = set(row) - _TOP_LEVEL_FIELDS
    if unknown_fields:
        raise ValueError(f"{where}: unknown fields {sorted(unknown_fields)}")
    for required in ("summary", "group", "arity"):
        if required not in row:
            # redis-cli needs a summary and a group in COMMAND DOCS.
            raise ValueError(f"{where}: missing {required!r}")
    if row["group"] not in _GROUPS:
        raise ValueError(f"{where}: unknown group {row['group']!r}")
    name = declared.lower()
    fullname = f"{container.fullname}|{name}" if container else name
    declared_flags = {f.lower() for f in row.get("command_flags", ())}
    unknown = declared_flags - _DECLARABLE_FLAGS
    if unknown:
        raise ValueError(f"{where}: unknown command flags {sorted(unknown)}")
    explicit = {c.lower() for c in row.get("acl_categories", ())}
    bad = explicit - set(ACL_CATEGORIES)
    if bad:
        raise ValueError(f"{where}: unknown ACL categories {sorted(bad)}")
    key_specs = [KeySpec.from_json(ks, where) for ks in row.get("key_specs", ())]
    if _movable_keys(key_specs):
        declared_flags.add("movablekeys")
    flags = frozenset(declared_flags)
    categories = _implicit_categories(flags, explicit)
    first, last, step = _legacy_range(key_specs)
    doc_flags = {f.lower() for f in row.get("doc_flags", ())}
    if doc_flags - set(_DOC_FLAGS):
        raise ValueError(f"{where}: unknown doc flags {sorted(doc_flags - set(_DOC_FLAGS))}")
    arguments = row.get("arguments", [])
    _check_arguments(arguments, where)
    for arg in _iter_args(arguments):
        index = arg.get("key_spec_index")
        if index is not None and not 0 <= index < len(key_specs):
            raise ValueError(f"{where}: argument {arg['name']!r} has a bad key_spec_index")
    return CommandSpec(
        fullname=fullname,
        name=name,
        container=container,
        arity=int(row["arity"]),
        flags=flags,
        acl_categories=tuple("@" + c for c in sorted(categories, key=_CATEGORY_RANK.__getitem__)),
        first_key=first,
        last_key=last,
        key_step=step,
        key_specs=key_specs,
        tips=[t.lower() for t in row.get("command_tips", ())],
        summary=row["summary"],
        since=row.get("since"),
        group=row["group"],
        complexity=row.get("complexity"),
        history=[[str(since), str(text)] for since, text in row.get("history", ())],
        doc_flags=tuple(f for f in _DOC_FLAGS if f in doc_flags),
        deprecated_since=row.get("deprecated_since"),
        replaced_by=row.get("replaced_by"),
        arguments=arguments,
    )


def _iter_args(args: list) -> Iterator[dict]:
    for arg in args:
        yield arg
        yield from _iter_args(arg.get("arguments", ()))


class CommandTable:
    """All commands, keyed by lowercase name; subcommands hang off their container.

    Iterating yields the top-level commands (``len`` is what ``COMMAND COUNT``
    reports); :meth:`walk` includes subcommands.
    """

    __slots__ = ("_by_bytes", "_commands", "_plain")

    def __init__(self, specs: Iterable[CommandSpec] = ()) -> None:
        self._commands: dict[str, CommandSpec] = {}
        self._by_bytes: dict[bytes, CommandSpec] = {}
        # Commands without subcommands by their lower- and upper-case names,
        # so resolve() usually skips bytes.lower().
        self._plain: dict[bytes, CommandSpec] = {}
        for spec in specs:
            self._add(spec)

    def _add(self, spec: CommandSpec) -> None:
        if spec.container is None:
            if spec.name in self._commands:
                raise ValueError(f"duplicate command {spec.fullname!r}")
            self._commands[spec.name] = spec
            self._by_bytes[spec.name.encode()] = spec
            if not spec.subcommands:
                self._plain[spec.name.encode()] = self._plain[spec.name.upper().encode()] = spec
        else:
            parent = spec.container
            if spec.name in parent.subcommands:
                raise ValueError(f"duplicate command {spec.fullname!r}")
            parent.subcommands[spec.name] = spec
            parent._subs_by_bytes[spec.name.encode()] = spec
            self._plain.pop(parent.name.encode(), None)
            self._plain.pop(parent.name.upper().encode(), None)

    @classmethod
    def load(cls, directory: str | Path | None = None) -> CommandTable:
        """Load every ``*.json`` row in ``directory`` (default: ``defs/`` next to this module).

        Containers are loaded before their subcommands; files are read in name
        order so the table (and ``COMMAND`` replies) have a stable order.
        """
        directory = Path(directory) if directory is not None else DEFS_DIR
        rows: list[tuple[str, dict, str]] = []
        for path in sorted(directory.glob("*.json")):
            with path.open(encoding="utf-8") as f:
                doc = json.load(f)
            if not isinstance(doc, dict) or len(doc) != 1:
                raise ValueError(f"{path.name}: expected one top-level command object")
            (declared, row), = doc.items()
            rows.append((declared, row, path.name))
        table = cls()
        for declared, row, where in rows:
            if "container" not in row:
                table._add(_build_spec(declared, row, None, where))
        for declared, row, where in rows:
            if "container" in row:
                parent = table._commands.get(row["container"].lower())
                if parent is None:
                    raise ValueError(f"{where}: unknown container {row['container']!r}")
                table._add(_build_spec(declared, row, parent, where))
        return table

    def bind_module(self, module: Any, *, replace: bool = False) -> None:
        """Bind every function in ``module`` marked with ``@handles(...)`` to its rows.

        Raises ``KeyError`` for a name with no row, and ``ValueError`` if a row
        already has a different handler (unless ``replace``).
        """
        for obj in vars(module).values():
            names = getattr(obj, "handles", None)
            if not names or not callable(obj):
                continue
            for fullname in names:
                spec = self.get(fullname)
                if spec is None:
                    raise KeyError(f"@handles({fullname!r}) in {module.__name__}: no such command row")
                if spec.handler is not None and spec.handler is not obj and not replace:
                    raise ValueError(f"{fullname!r} is already handled by {spec.handler.__qualname__}")
                spec.handler = obj
                spec.is_async = inspect.iscoroutinefunction(obj)

    # ----------------------------------------------------------------- lookups

    def __iter__(self) -> Iterator[CommandSpec]:
        return iter(self._commands.values())

    def __len__(self) -> int:
        return len(self._commands)

    def __contains__(self, fullname: object) -> bool:
        return isinstance(fullname, str) and self.get(fullname) is not None

    def walk(self) -> Iterator[CommandSpec]:
        """Every command and subcommand, each container followed by its subcommands."""
        for spec in self._commands.values():
            yield from spec.walk()

    def get(self, fullname: str | bytes) -> CommandSpec | None:
        """Look up ``"ping"`` or ``"client|id"`` (any case), strictly, as ``COMMAND INFO`` does.

        ``"client"`` is the container itself; ``"ping|x"``, ``"client|"`` and
        deeper names are ``None`` (lookupCommandBySds).
        """
        if isinstance(fullname, str):
            fullname = fullname.encode()
        parts = fullname.lower().split(b"|")
        if len(parts) > 2:
            return None
        spec = self._by_bytes.get(parts[0])
        if spec is None or len(parts) == 1:
            return spec
        return spec._subs_by_bytes.get(parts[1])

    def lookup(self, argv: list[bytes]) -> CommandSpec | None:
        """The command ``argv`` names, non-strictly (lookupCommand): a container
        with no further argument is the container itself; an unknown
        subcommand is ``None``."""
        spec = self._by_bytes.get(argv[0].lower())
        if spec is None or len(argv) == 1 or not spec._subs_by_bytes:
            return spec
        return spec._subs_by_bytes.get(argv[1].lower())

    def resolve(self, argv: list[bytes]) -> CommandSpec | Error:
        """The row that executes ``argv``, or the Error redis-server's processCommand replies.

        ``argv`` must hold at least the command name.
        """
        # Hot path: a plain command spelled as clients usually spell it.
        spec = self._plain.get(argv[0])
        if spec is not None:
            arity = spec.arity
            if (len(argv) == arity) if arity > 0 else (len(argv) >= -arity):
                return spec
        spec = self._by_bytes.get(argv[0].lower())
        if spec is None:
            return Error(_unknown_command_message(argv))
        if spec._subs_by_bytes and len(argv) > 1:
            sub = spec._subs_by_bytes.get(argv[1].lower())
            if sub is None:
                subname = _text(_c_string(argv[1], 128))
                return Error(f"ERR unknown subcommand '{subname}'. Try {_text(_c_string(argv[0]).upper())} HELP.")
            spec = sub
        if not spec.arity_ok(len(argv)):
            return Error(f"ERR wrong number of arguments for '{spec.fullname}' command")
        return spec


def _c_string(data: bytes, limit: int | None = None) -> bytes:
    # Redis formats arguments with printf("%.Ns"), which stops at a NUL byte.
    nul = data.find(b"\0")
    if nul >= 0:
        data = data[:nul]
    return data if limit is None else data[:limit]


def _text(data: bytes) -> str:
    # Error replies are str; undecodable bytes (rare in command names) become U+FFFD.
    return data.decode("utf-8", "replace")


def _unknown_command_message(argv: list[bytes]) -> str:
    args = b""
    for arg in argv[1:]:
        if len(args) >= 128:
            break
        args += b"'" + _c_string(arg, 128 - len(args)) + b"' "
    return f"ERR unknown command '{_text(_c_string(argv[0], 128))}', with args beginning with: {_text(args)}"


# --------------------------------------------------------------------------- replies


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
            _status_set(f for f in _REPLY_FLAGS if f in spec.flags),
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
    flags = [f for f in _ARG_FLAGS if arg.get(f)]
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
                valid = category[1:] in _CATEGORY_RANK
                predicate = lambda spec, c=category, v=valid: v and c in spec.acl_categories
            elif kind == b"pattern":
                predicate = lambda spec, p=value: stringmatchlen(p, spec.fullname.encode(), True)
            else:
                return Error("ERR syntax error")
            i += 3
        else:
            return Error("ERR syntax error")
    return [spec.fullname for spec in table.walk() if predicate is None or predicate(spec)]


# --------------------------------------------------------------------------- GETKEYS


def has_key_arguments(spec: CommandSpec) -> bool:
    """doesCommandHaveKeys(): a getkeys proc, or a key spec not marked NOT_KEY."""
    return spec.getkeys_proc is not None or any("not_key" not in ks.flags for ks in spec.key_specs)


def get_keys(spec: CommandSpec, argv: list[bytes], *, include_not_keys: bool = False) -> list[tuple[int, tuple[str, ...]]] | None:
    """Key positions in ``argv`` (argv[0] is the command) with their key-spec flags.

    Follows getKeysUsingKeySpecs(): returns ``None`` when a spec does not fit
    ``argv`` (bad numkeys, out of range), which callers treat as a syntax error.
    A row's ``getkeys_proc`` takes over when its key specs have
    ``VARIABLE_FLAGS`` or cannot describe ``argv``.
    """
    has_varflags = any("variable_flags" in ks.flags for ks in spec.key_specs)
    if has_varflags and spec.getkeys_proc is not None:
        return spec.getkeys_proc(spec, argv)
    result = _keys_from_specs(spec, argv, include_not_keys)
    if result is None and spec.getkeys_proc is not None:
        return spec.getkeys_proc(spec, argv)
    return result


def _keys_from_specs(spec: CommandSpec, argv: list[bytes], include_not_keys: bool) -> list[tuple[int, tuple[str, ...]]] | None:
    argc = len(argv)
    keys: list[tuple[int, tuple[str, ...]]] = []
    for ks in spec.key_specs:
        if "not_key" in ks.flags and not include_not_keys:
            continue
        if ks.begin_search == "index":
            first = ks.index
        elif ks.begin_search == "keyword":
            first = 0
            start = ks.startfrom if ks.startfrom > 0 else argc + ks.startfrom
            end = argc - 1 if ks.startfrom > 0 else 1
            step = 1 if start <= end else -1
            keyword = ks.keyword.lower().encode()
            i = start
            while i != end:
                if i >= argc or i < 1:
                    break
                if argv[i].lower() == keyword:
                    first = i + 1
                    break
                i += step
            if not first:
                continue
        else:
            return None
        if ks.find_keys == "range":
            step = ks.keystep
            if ks.lastkey >= 0:
                last = first + ks.lastkey
            elif not ks.limit:
                last = argc + ks.lastkey
            else:
                last = first + ((argc - first) // ks.limit + ks.lastkey)
        elif ks.find_keys == "keynum":
            step = ks.keystep
            if first + ks.keynumidx >= argc:
                return None
            numkeys = string2ll(argv[first + ks.keynumidx])
            if numkeys is None or numkeys < 0:
                return None
            first += ks.firstkey
            last = first + numkeys - 1
        else:
            return None
        if last >= argc or last < first or first >= argc:
            return None
        for i in range(first, last + 1, step):
            keys.append((i, ks.flags))
    return keys


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
