"""Which arena partitions an ACL user may map, and how: what PFXATTACH hands out.

A worker that maps a partition sees every page of every namespace stored there, so a user
gets a partition only when its key patterns allow *every* namespace the partition can hold:

* a user with ``allkeys`` (``~*``) gets every partition, the remainder included;
* any other user gets a partition whose pattern one of its key patterns *covers*: the same
  pattern, or a pattern ``<literal prefix>*`` whose prefix starts the partition's pattern
  (``~tenant-a:*`` covers ``tenant-a:*`` and ``tenant-a:big:*``). Deciding containment of two
  arbitrary globs is not attempted: an uncovered partition is simply not sent;
* never the remainder, which holds namespaces of anyone whom no partition matches.

A granted partition is writable only for a user that may write KV into it: one that may run
PFXALLOC (the only way to get blocks to write into). A user without it (``-pfxalloc``, e.g. a
worker that only loads cached KV) gets a descriptor opened read-only, so the kernel refuses it
a writable mapping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

GLOB_CHARS = frozenset(b"*?[\\")


class Grant(NamedTuple):
    """One partition a user may map."""

    number: int  # the partition's index in the arena's layout (its memfd)
    pattern: bytes
    first_block: int
    nblocks: int
    writable: bool


def covers(user_pattern: bytes, part_pattern: bytes) -> bool:
    """Whether every name ``part_pattern`` matches is matched by ``user_pattern`` (see module docstring)."""
    if user_pattern == part_pattern:
        return True
    if not user_pattern.endswith(b"*"):
        return False
    prefix = user_pattern[:-1]
    return not GLOB_CHARS.intersection(prefix) and part_pattern.startswith(prefix)


def grants(user: Any, layout: Sequence[dict]) -> list[Grant]:
    """The partitions of ``layout`` (PrefixStore.partitions(), or one remainder for an unpartitioned
    arena) that ``user`` (an acl.User) may map, in layout order."""
    if user is None or not user.enabled:
        return []
    writable = "pfxalloc" in user.allowed
    out = []
    for number, part in enumerate(layout):
        if user.all_keys:
            allowed = True
        elif part["remainder"]:
            allowed = False
        else:
            allowed = any(covers(pattern, part["pattern"]) for pattern in user.key_patterns)
        if allowed:
            out.append(Grant(number, part["pattern"], part["first-block"], part["nblocks"], writable))
    return out
