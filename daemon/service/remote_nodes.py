"""The shared tier's cluster node by node: each node's connection state, and the operator's
operation that visits every primary (dropping a namespace).

Rules:

* **Node state is observed, not inferred.** While the tier is connected, :func:`probe_nodes` (a
  worker thread, every ``NODE_CHECK_S``) PINGs every node the client knows, each bounded by the
  client's socket timeout; a node that answers is ``up``, one that does not is ``down`` and
  counts an error. Failed calls of the tier that can be put on one node (a key's error reply in a
  pipeline) count there too. A node the client stops listing (a topology change) keeps its line,
  ``down``, until ``MAX_NODES`` newer ones push it out; while the tier reconnects, lines keep
  their last state.
* **Only addresses are shown**: ``host:port``, never a URL or a credential.
* **Dropping a namespace** (:func:`drop_namespace_keys`, ``PFXTIER DROP``) SCANs each primary for
  the namespace's keys (``SCAN MATCH`` of its tag, ``COUNT SCAN_COUNT`` a call) and UNLINKs them in
  pipelines of at most ``UNLINK_BATCH`` keys, so no call is large and memory stays bounded. It is
  safe while daemons run (a page gone is a miss for them); a page written again afterwards, by
  any daemon of the fleet, is there again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from pfxcache.daemon.tier import remote_format

NODE_CHECK_S = 1.0
MAX_NODES = 64
SCAN_COUNT = 1000
UNLINK_BATCH = 500


class NodeState:
    """What this daemon knows of one node of the cluster."""

    __slots__ = ("addr", "errors", "last_error", "role", "up")

    def __init__(self, addr: str, role: str) -> None:
        self.addr = addr
        self.role = role  # master | replica
        self.up: bool | None = None  # None: not probed yet
        self.errors = 0
        self.last_error = ""

    @property
    def state(self) -> str:
        return "unknown" if self.up is None else "up" if self.up else "down"


class ClusterNodes:
    """The table of nodes INFO's ``tier_remote_node<i>`` lines, the metrics and PFXTIER INFO show."""

    def __init__(self, seeds: list[tuple[str, int]]) -> None:
        self._nodes: OrderedDict[str, NodeState] = OrderedDict()
        for host, port in seeds:
            self._node(f"{host}:{port}", "master")

    def _node(self, addr: str, role: str) -> NodeState:
        node = self._nodes.get(addr)
        if node is None:
            node = self._nodes[addr] = NodeState(addr, role)
            while len(self._nodes) > MAX_NODES:
                self._nodes.popitem(last=False)
        node.role = role
        return node

    def apply(self, probed: list[tuple[str, str, str | None]]) -> None:
        """On the loop: the results of :func:`probe_nodes` (address, role, None or the error)."""
        seen = set()
        for addr, role, error in probed:
            node = self._node(addr, role)
            seen.add(addr)
            node.up = error is None
            if error is not None:
                node.errors += 1
                node.last_error = error
        for addr, node in self._nodes.items():
            if addr not in seen and probed:  # no longer in the client's topology
                node.up = False

    def blame(self, addrs: list[str]) -> None:
        """Failed calls put on one node each (their addresses)."""
        for addr in addrs:
            node = self._nodes.get(addr)
            if node is not None:
                node.errors += 1

    def info(self) -> list[tuple[str, object]]:
        lines: list[tuple[str, object]] = [("tier_remote_nodes", len(self._nodes))]
        lines += [(f"tier_remote_node{i}", f"addr={n.addr},role={n.role},state={n.state},errors={n.errors}")
                  for i, n in enumerate(self._nodes.values())]
        return lines

    def describe(self) -> list[dict]:
        return [{"addr": n.addr, "role": n.role, "state": n.state, "errors": n.errors}
                for n in self._nodes.values()]


def probe_nodes(client: Any, target: Any) -> list[tuple[str, str, str | None]]:
    """Worker thread: PING every node ``client`` knows; (address, role, None or the scrubbed error)."""
    if not hasattr(client, "get_nodes"):  # one Redis
        host, port = target.nodes[0]
        return [(f"{host}:{port}", "master", _ping(client, target))]
    return [(f"{n.host}:{n.port}", "replica" if n.server_type == "replica" else "master",
             _ping(n.redis_connection, target)) for n in list(client.get_nodes())]


def _ping(connection: Any, target: Any) -> str | None:
    if connection is None:
        return "no connection"
    try:
        connection.ping()
        return None
    except Exception as exc:  # anything redis-py raises: the node did not answer
        return target.scrub(f"{type(exc).__name__}: {exc}")


def node_of(client: Any, key: bytes) -> str | None:
    """The address of the node serving ``key`` now (no I/O), or None (one Redis, or unknown)."""
    try:
        node = client.get_node_from_key(key)
    except Exception:  # no slot owner known: nothing to blame
        return None
    return f"{node.host}:{node.port}" if node is not None else None


def drop_namespace_keys(client: Any, namespace: bytes) -> int:
    """Remove every key of ``namespace`` from the shared tier, each primary scanned; blocking.
    Returns the keys unlinked. Raises what redis-py raises when a primary cannot be scanned."""
    pattern = remote_format.namespace_pattern(namespace)
    removed = 0
    for node in client.get_primaries() if hasattr(client, "get_primaries") else [None]:
        cursor = 0
        while True:
            if node is None:
                cursor, keys = client.scan(cursor, match=pattern, count=SCAN_COUNT)
            else:
                cursors, keys = client.scan(cursor, match=pattern, count=SCAN_COUNT, target_nodes=node)
                cursor = cursors[node.name]
            for start in range(0, len(keys), UNLINK_BATCH):
                pipe = client.pipeline(transaction=False)
                for key in keys[start : start + UNLINK_BATCH]:
                    pipe.unlink(key)
                removed += sum(reply for reply in pipe.execute() if isinstance(reply, int))
            if cursor == 0:
                break
    return removed
