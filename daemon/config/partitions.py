"""The ``arena-partition`` directive's kind: per-tenant partitions of the shm arena.

``arena-partition <namespace pattern> <size>``, one line per partition (or several groups of
two on one line), in the order their blocks are laid out; a namespace stores into the first
partition whose pattern matches it (the glob of ACL key patterns), every other one into the
remainder. ``<size>`` is a number of blocks (``4096``) or of bytes with a unit (``64mb``,
rounded down to whole blocks). Startup only: the arena's memory is cut at startup.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pfxcache.daemon.config.kinds import Directive, Kind, format_memory, memtoull

#: A size with a unit is bytes; a bare number is blocks.
_BYTES = re.compile(r"[0-9]+(b|k|kb|m|mb|g|gb)", re.IGNORECASE)
_BLOCKS = re.compile(r"[0-9]{1,18}")
#: With the remainder, the descriptors one PFXATTACH reply carries to an operator: at most
#: attach_commands.MAX_PENDING_FDS (and the client's MAX_FDS), well under SCM_MAX_FD (253).
MAX_PARTITIONS = 127


@dataclass(frozen=True, slots=True)
class ArenaPartitions(Kind):
    """The typed value: ``((pattern, amount, unit), ...)`` with unit ``"blocks"`` or ``"bytes"``;
    :func:`partition_blocks` turns it into block counts once block-bytes is known."""

    multi_arg = True

    def parse(self, args: Sequence[str], d: Directive) -> tuple[tuple[str, int, str], ...]:
        return self.parse_over(d.initial(), args, d)

    def parse_over(self, old: Any, args: Sequence[str], d: Directive) -> tuple[tuple[str, int, str], ...]:
        if len(args) == 1 and args[0] == "":
            return ()
        if len(args) == 1:  # one quoted argument ("a:* 64mb"), as the command line gives it
            args = args[0].split(" ")
        if len(args) % 2:
            raise ValueError("Wrong number of arguments in arena-partition: groups of <namespace pattern> <size>")
        rules = list(old)
        for pattern, size in zip(args[::2], args[1::2]):
            if not pattern:
                raise ValueError("arena-partition patterns must not be empty")
            if any(rule[0] == pattern for rule in rules):
                raise ValueError(f"arena-partition '{pattern}' is given twice")
            if _BLOCKS.fullmatch(size):
                amount, unit = int(size), "blocks"
            elif _BYTES.fullmatch(size):
                amount, unit = memtoull(size), "bytes"
            else:
                raise ValueError(f"arena-partition sizes are a number of blocks or of bytes with a unit "
                                 f"(k, kb, m, mb, g, gb), got '{size}'")
            if amount < 1:
                raise ValueError(f"arena-partition '{pattern}' must hold at least one block, got '{size}'")
            rules.append((pattern, amount, unit))
        if len(rules) > MAX_PARTITIONS:
            raise ValueError(f"at most {MAX_PARTITIONS} arena-partition lines (one PFXATTACH passes every "
                             f"partition and the remainder as descriptors of one message)")
        return tuple(rules)

    def show(self, value: Sequence[Sequence[Any]]) -> str:
        return " ".join(f"{pattern} {amount if unit == 'blocks' else _bytes_text(amount)}"
                        for pattern, amount, unit in value)

    def describe(self, d: Directive) -> str:
        return "groups of <namespace pattern> <size: blocks, or bytes with a unit such as 64mb>"


def _bytes_text(amount: int) -> str:
    text = format_memory(amount)
    return text + "b" if text.isdigit() else text  # a bare number would read back as blocks


def partition_blocks(rules: Sequence[tuple[str, int, str]], block_bytes: int) -> list[tuple[bytes, int]]:
    """``[(pattern, blocks)]`` of the directive's value; ValueError for a partition under one block."""
    out = []
    for pattern, amount, unit in rules:
        blocks = amount if unit == "blocks" else amount // block_bytes
        if blocks < 1:
            raise ValueError(f"arena-partition '{pattern}' ({format_memory(amount)}) holds no block of "
                             f"block-bytes {block_bytes}")
        out.append((pattern.encode("utf-8", "surrogateescape"), blocks))
    return out
