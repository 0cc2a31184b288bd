"""MULTI/EXEC state: a client's queued commands, and the namespaces clients WATCH.

Redis's semantics (``multi.c`` in 7.0): after MULTI, commands that pass the
checks made before execution (known name, arity, AUTH, ACL) are queued and
answered ``+QUEUED``; one that fails them is answered with its error and
*flags* the transaction, so that EXEC answers ``-EXECABORT`` and runs nothing.
EXEC runs the queue and answers an array with one reply per command (errors
raised while running are replies like any other; the rest still runs).

WATCH: a namespace is **touched** when a page enters or leaves it (a PFXSET
that stores, PFXEVICT, eviction of any cause, DEL/UNLINK, FLUSHALL/FLUSHDB,
expiry) or when its expiry is set or removed (EXPIRE family, PERSIST). Reads,
leases (PFXGET, PFXALLOC, PFXRELEASE) and TOUCH do not touch it. A touched
namespace marks every client watching it; their EXEC then answers a null array
(``*-1``; RESP3 ``_``) and runs nothing. The store reports touches through its
``touched`` hook, which is set only while some client watches something, so
an unwatched store pays nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MultiState", "WatchRegistry", "EXECABORT", "QUEUED_TEXT"]

EXECABORT = "EXECABORT Transaction discarded because of previous errors."
QUEUED_TEXT = "QUEUED"

#: Commands that run at once inside MULTI instead of being queued (Redis's processCommand list).
NOT_QUEUED = frozenset({"exec", "discard", "multi", "watch", "quit", "reset"})


class MultiState:
    """One client's open transaction."""

    __slots__ = ("commands", "failed", "writes", "any_async")

    def __init__(self) -> None:
        self.commands: list[tuple[Any, list[bytes]]] = []  # (command row, argv)
        #: A command was refused while queueing: EXEC answers EXECABORT.
        self.failed = False
        #: A queued command is a write (CLIENT PAUSE WRITE holds the EXEC back).
        self.writes = False
        #: A queued command's handler is async: EXEC runs alone (see gate.py).
        self.any_async = False

    def queue(self, spec: Any, argv: list[bytes], writes: bool) -> None:
        self.commands.append((spec, argv))
        self.writes = self.writes or writes
        self.any_async = self.any_async or spec.is_async


class WatchRegistry:
    """Who watches which namespace, and the dirty marks touches leave.

    ``store`` is the prefix store; its ``touched`` hook is pointed at
    :meth:`touched` while anything is watched, and cleared when nothing is.
    """

    def __init__(self) -> None:
        self._store: Any = None
        self._watchers: dict[bytes, set[int]] = {}  # namespace -> client ids
        self._watched: dict[int, set[bytes]] = {}  # client id -> namespaces
        self._dirty: set[int] = set()  # client ids whose watched namespaces were touched

    def attach(self, store: Any) -> None:
        self._store = store
        self._hook()

    def watch(self, client_id: int, name: bytes) -> None:
        self._watchers.setdefault(name, set()).add(client_id)
        self._watched.setdefault(client_id, set()).add(name)
        self._hook()

    def watched(self, client_id: int) -> set[bytes]:
        return self._watched.get(client_id, set())

    def is_dirty(self, client_id: int) -> bool:
        return client_id in self._dirty

    def unwatch(self, client_id: int) -> None:
        """UNWATCH, EXEC, DISCARD, RESET, a disconnect: forget the client's watches and mark."""
        for name in self._watched.pop(client_id, ()):
            watchers = self._watchers.get(name)
            if watchers is not None:
                watchers.discard(client_id)
                if not watchers:
                    del self._watchers[name]
        self._dirty.discard(client_id)
        self._hook()

    def touched(self, name: bytes) -> None:
        """The store's hook: ``name``'s pages or expiry changed."""
        watchers = self._watchers.get(name)
        if watchers:
            self._dirty.update(watchers)

    def _hook(self) -> None:
        if self._store is not None:
            self._store.touched = self.touched if self._watchers else None
