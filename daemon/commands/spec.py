"""A command row: the schema of ``defs/*.json`` and what derives from one row.

The definitions follow the schema of Redis's ``src/commands/*.json``
(BSD-3-Clause, Copyright (c) Redis Ltd.). :func:`build_spec` validates one row
and derives what redis-server derives from it: the implicit ACL categories
(``setImplicitACLCategories``), the legacy key range and ``movablekeys``
(``populateCommandLegacyRangeSpec``), and :func:`get_keys`, the key positions
of an argv (``db.c``'s ``getKeysUsingKeySpecs``), all as in Redis 7.0.

The vocabulary (ACL categories, command flags in reply order) lives here too,
so that the table (:mod:`.table`), the ``COMMAND`` replies
(:mod:`.command_replies`) and the ACL read one list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pfxcache.protocol.redis_strings import string2ll

__all__ = [
    "ACL_CATEGORIES",
    "ARG_FLAGS",
    "CATEGORY_RANK",
    "REPLY_FLAGS",
    "CommandSpec",
    "KeySpec",
    "build_spec",
    "get_keys",
    "has_key_arguments",
]

#: ACL categories in Redis's table order, which is the order COMMAND INFO lists them in.
ACL_CATEGORIES: tuple[str, ...] = (
    "keyspace", "read", "write", "set", "sortedset", "list", "hash", "string",
    "bitmap", "hyperloglog", "geo", "stream", "pubsub", "admin", "fast", "slow",
    "blocking", "dangerous", "connection", "transaction", "scripting",
    # pfxcache's own: the prefix cache commands, so ACLs can say +@pfx / -@pfx.
    "pfx",
)
CATEGORY_RANK = {name: i for i, name in enumerate(ACL_CATEGORIES)}

#: Command flags COMMAND INFO shows, in the order redis-server prints them
#: (``addReplyCommandFlags``). "module" and "movablekeys" are derived, never declared.
REPLY_FLAGS: tuple[str, ...] = (
    "write", "readonly", "denyoom", "module", "admin", "pubsub", "noscript",
    "blocking", "loading", "stale", "skip_monitor", "skip_slowlog", "asking",
    "fast", "no_auth", "no_mandatory_keys", "no_async_loading", "no_multi",
    "movablekeys", "allow_busy",
)
#: Flags a row may declare that redis-server deliberately hides from COMMAND INFO.
_HIDDEN_FLAGS = frozenset({"may_replicate", "sentinel", "only_sentinel", "protected"})
_DECLARABLE_FLAGS = (frozenset(REPLY_FLAGS) - {"module", "movablekeys"}) | _HIDDEN_FLAGS

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
ARG_FLAGS = ("optional", "multiple", "multiple_token")
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
    #: The synchronous attempt of an async handler (``handles_now``), or None.
    now: Callable | None = None
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

    def keys(self, argv: list[bytes]) -> list[tuple[int, tuple[str, ...]]] | None:
        """Key positions in ``argv`` with their flags: :func:`get_keys`."""
        return get_keys(self, argv)


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


def build_spec(declared: str, row: dict, container: CommandSpec | None, where: str) -> CommandSpec:
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
        acl_categories=tuple("@" + c for c in sorted(categories, key=CATEGORY_RANK.__getitem__)),
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
