"""The eviction policy interface: what the eviction index asks of a policy, and where a policy keeps node state.

The store's candidates are the unpinned leaves of its radix trees. The trees tell
the eviction index (policies.EvictionIndex) whenever a node enters or leaves that
set; the index tells the policy, which keeps the candidates in its order and names
the next victim on request. So the interface is an *order* (:class:`EvictionOrder`):
``push`` a candidate, ``drop`` one (its ``version`` moved on: entries that carry the
old version are stale), ``peek`` at the next victim. Everything else has a default
in :class:`Policy`: a policy overrides what it uses and nothing else.

A policy may also watch the request stream (:class:`RequestObserver`: every lookup,
store and lease release, with the pages involved); it says so with
``observes_requests`` and the index then forwards them, while other policies pay
nothing for the stream.

Node state. A policy keeps what it knows of a node in ``node.policy_data``, the one
slot Node has for every policy. The tree asks the policy what becomes of it when a
node's edge is cut in two (``split``) or loses its last pages (``trimmed``); a whole
eviction clears it, and so does a switch of policy (``reset`` on every node): a new
policy never reads another's state. A policy that runs others as parts (the guard
and its experts) keeps a composite there and gives each part a :class:`NodeState`
naming its field; a policy on its own reads and writes the slot itself (``OWN``).

A policy is registered by its ``maxmemory-policy`` name in registry.POLICIES; nothing
else branches on names.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, ClassVar, Protocol

from .radix import Node


class EvictionOrder(Protocol):
    """What the eviction index calls: the candidates in an order, and what becomes of their state."""

    name: ClassVar[str]  # the maxmemory-policy value
    summary: ClassVar[str]  # one line for the config's documentation
    # A namespace's own instance (for_scope) orders exactly as this one, so while one namespace has
    # candidates the index may peek this one for it.
    scope_shares_order: ClassVar[bool]
    observes_requests: ClassVar[bool]  # it is a RequestObserver too
    live: int  # candidates indexed

    @classmethod
    def for_store(cls, capacity: int, page_bytes: int) -> EvictionOrder:
        """The global instance for a store of ``capacity`` pages of ``page_bytes`` each."""

    def for_scope(self) -> EvictionOrder:
        """The instance for one namespace's candidates (EVICT commands), sharing what this one learns."""

    def push(self, node: Node, uncovered: bool = False) -> None:
        """Index a candidate (its version was just bumped); ``uncovered``: its last child was evicted."""

    def drop(self) -> None:
        """One indexed candidate left the set (its version was bumped, so its entry is stale)."""

    def peek(self, now: float) -> Node | None:
        """The next victim (it stays indexed), or None when there is no candidate."""

    def nodes(self) -> list[Node]:
        """The indexed candidates (consistency checks)."""

    def pushed(self) -> list[Node]:
        """The indexed candidates in the order they were pushed (to build a namespace's instance)."""

    def evicted(self, node: Node, whole: bool) -> None:
        """Pages of ``node`` are about to be evicted: its tail, or ``whole`` it."""

    def split(self, top: Node, child: Node, pages: int) -> None:
        """``child``'s edge was cut after ``pages`` pages; ``top`` is its new upper part: set its state."""

    def trimmed(self, node: Node, pages: int) -> None:
        """``node`` lost its tail and keeps its first ``pages`` pages."""

    def reset(self, node: Node) -> None:
        """Set ``node``'s state afresh: this policy replaced another (a switch)."""

    def describe(self) -> dict[str, Any]:
        """What INFO and PFXINFO show of what the policy learned (empty: nothing)."""

    def memory_bytes(self, nodes: int, pages: int) -> int:
        """About what the policy holds for a store of ``nodes`` nodes and ``pages`` pages (INFO)."""


class RequestObserver(Protocol):
    """The request stream, for a policy that learns from it (``observes_requests``)."""

    def looked_up(self, scope: bytes, tokens: bytes, npages: int, matched: int, node: Node | None = None,
                  lease_id: int = 0) -> None:
        """A lookup of ``npages`` whole pages of ``tokens`` in ``scope`` matched ``matched``, ending at ``node``;
        ``lease_id`` pins the match (0: none)."""

    def stored(self, scope: bytes, tokens: bytes, npages: int) -> None:
        """An insert of ``npages`` whole pages of ``tokens`` was committed."""

    def released(self, lease_id: int) -> None:
        """A lease ended."""


class Policy:
    """Defaults for every member of EvictionOrder and RequestObserver but the order itself."""

    name: ClassVar[str] = "abstract"
    summary: ClassVar[str] = ""
    scope_shares_order: ClassVar[bool] = False
    observes_requests: ClassVar[bool] = False

    @classmethod
    def for_store(cls, capacity: int, page_bytes: int) -> Policy:
        return cls()

    def for_scope(self) -> Policy:
        return type(self)()

    def evicted(self, node: Node, whole: bool) -> None:
        """Nothing to learn from an eviction."""

    def split(self, top: Node, child: Node, pages: int) -> None:
        """Both parts of the edge share the state of its latest access."""
        top.policy_data = child.policy_data

    def trimmed(self, node: Node, pages: int) -> None:
        """State is per node, not per page: nothing to cut."""

    def reset(self, node: Node) -> None:
        node.policy_data = None

    def describe(self) -> dict[str, Any]:
        return {}

    def memory_bytes(self, nodes: int, pages: int) -> int:
        return 0

    def looked_up(self, scope: bytes, tokens: bytes, npages: int, matched: int, node: Node | None = None,
                  lease_id: int = 0) -> None:
        """Not watched."""

    def stored(self, scope: bytes, tokens: bytes, npages: int) -> None:
        """Not watched."""

    def released(self, lease_id: int) -> None:
        """Not watched."""


class NodeState:
    """Where a policy reads (``get(node)``) and writes (``put(node, value)``) its state on a node."""

    __slots__ = ("get", "put")

    def __init__(self, get: Callable[[Node], Any], put: Callable[[Node, Any], None]) -> None:
        self.get = get
        self.put = put


#: A policy on its own: ``node.policy_data`` itself (C-level getter and setter).
OWN = NodeState(attrgetter("policy_data"), Node.policy_data.__set__)


def field_of(holder: type, field: str) -> NodeState:
    """Field ``field`` of the composite (a ``holder`` instance) that ``node.policy_data`` holds.

    The policy that owns the composite sees that every node it can reach holds one.
    """
    set_field = getattr(holder, field).__set__

    def put(node: Node, value: Any) -> None:
        set_field(node.policy_data, value)

    return NodeState(attrgetter(f"policy_data.{field}"), put)
