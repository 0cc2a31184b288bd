"""ACL LOG: the commands, keys and AUTHs the ACL refused, as redis-server 7.0 records them.

An entry is grouped with an earlier one of the same reason, context, object
and user that is less than 60 seconds old (its count grows and it moves to
the front), as Redis does; ``acllog-max-len`` entries are kept, newest first.
Reasons: ``command``, ``key``, ``auth``; contexts: ``toplevel``, ``multi``.
"""

from __future__ import annotations

import time

__all__ = ["AclLog"]

GROUPING_MS = 60_000


class Entry:
    __slots__ = ("count", "reason", "context", "object", "username", "created_ms", "client_info")

    def __init__(self, reason: str, context: str, obj: str, username: str, client_info: str) -> None:
        self.count = 1
        self.reason = reason
        self.context = context
        self.object = obj
        self.username = username
        self.created_ms = int(time.time() * 1000)
        self.client_info = client_info

    def reply(self) -> dict:
        return {
            "count": self.count,
            "reason": self.reason,
            "context": self.context,
            "object": self.object,
            "username": self.username,
            "age-seconds": (int(time.time() * 1000) - self.created_ms) / 1000,
            "client-info": self.client_info,
        }


class AclLog:
    """The ACL log of one server."""

    __slots__ = ("entries", "max_len")

    def __init__(self, max_len: int = 128) -> None:
        self.entries: list[Entry] = []  # newest first
        self.max_len = max_len

    def add(self, reason: str, context: str, obj: str, username: str, client_info: str) -> None:
        now = int(time.time() * 1000)
        for i, entry in enumerate(self.entries):
            if (entry.reason, entry.context, entry.object, entry.username) == (reason, context, obj, username) \
                    and now - entry.created_ms < GROUPING_MS:
                entry.count += 1
                entry.created_ms = now
                entry.client_info = client_info
                del self.entries[i]
                self.entries.insert(0, entry)
                return
        self.entries.insert(0, Entry(reason, context, obj, username, client_info))
        self.trim()

    def trim(self) -> None:
        del self.entries[self.max_len:]

    def get(self, count: int | None = None) -> list[dict]:
        entries = self.entries if count is None else self.entries[:count]
        return [entry.reply() for entry in entries]

    def reset(self) -> None:
        self.entries.clear()
