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
the ``COMMAND`` family. This module holds the table and dispatch (Redis 7.0's
``lookupCommand`` and ``processCommand`` errors); one row's schema and
derivations are in :mod:`.spec`, the ``COMMAND`` replies in
:mod:`.command_replies`.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pfxcache.protocol.replies import Error, quoted

# The COMMAND replies and the row types are re-exported: callers of the table
# (and its tests) find every name of the command-table layer here.
from .command_replies import (
    PairMap,
    command_docs_map,
    command_docs_reply,
    command_getkeys_reply,
    command_info_reply,
    command_list,
)
from .spec import ACL_CATEGORIES, CommandSpec, KeySpec, build_spec, get_keys, has_key_arguments

__all__ = [
    "ACL_CATEGORIES",
    "CommandSpec",
    "CommandTable",
    "DEFS_DIR",
    "KeySpec",
    "PairMap",
    "command_docs_map",
    "command_docs_reply",
    "command_getkeys_reply",
    "command_info_reply",
    "command_list",
    "get_keys",
    "has_key_arguments",
]

DEFS_DIR = Path(__file__).with_name("defs")


class CommandTable:
    """All commands, keyed by lowercase name; subcommands hang off their container.

    Iterating yields the top-level commands (``len`` is what ``COMMAND COUNT``
    reports); :meth:`walk` includes subcommands.
    """

    __slots__ = ("_by_bytes", "_commands", "_plain")

    #: The ACL categories rows may declare, in Redis's order (``ACL CAT``, ``+@category``).
    categories: tuple[str, ...] = ACL_CATEGORIES

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
                table._add(build_spec(declared, row, None, where))
        for declared, row, where in rows:
            if "container" in row:
                parent = table._commands.get(row["container"].lower())
                if parent is None:
                    raise ValueError(f"{where}: unknown container {row['container']!r}")
                table._add(build_spec(declared, row, parent, where))
        return table

    def bind_module(self, module: Any, *, replace: bool = False) -> None:
        """Bind every function in ``module`` marked with ``@handles(...)`` to its rows.

        Raises ``KeyError`` for a name with no row, and ``ValueError`` if a row
        already has a different handler (unless ``replace``).
        """
        for obj in vars(module).values():
            for fullname in getattr(obj, "handles_now", ()) if callable(obj) else ():
                spec = self.get(fullname)
                if spec is None:
                    raise KeyError(f"@handles_now({fullname!r}) in {module.__name__}: no such command row")
                spec.now = obj
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
        if isinstance(fullname, str):  # a client's bytes decoded with surrogateescape go back as they came
            fullname = fullname.encode("utf-8", "surrogateescape")
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
    # Error replies are str; the client's bytes go back as sent (redis-server echoes them raw).
    return quoted(data)


def _unknown_command_message(argv: list[bytes]) -> str:
    args = b""
    for arg in argv[1:]:
        if len(args) >= 128:
            break
        args += b"'" + _c_string(arg, 128 - len(args)) + b"' "
    return f"ERR unknown command '{_text(_c_string(argv[0], 128))}', with args beginning with: {_text(args)}"
