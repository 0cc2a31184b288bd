"""What the store tells a listener about pages entering and leaving it (KV events, store side).

The store calls one ``StoreEvents`` sink, synchronously, at the moment a change
happens: pages linked into a tree by an insert, pages removed by eviction,
PFXEVICT or a namespace's deletion, and everything cleared by FLUSHALL. The
sink must be cheap and must not call back into the store: the daemon's sink
(``daemon/kv_events.py``) only queues the facts for a publisher thread and the
pub/sub channels. With no sink set the store computes nothing.

Pages are named by their stable block hashes (``block_hashes.py``); a stored
run's ``parent_hash`` is the hash of the page before its first page, or None
when the run starts at the first page of a prompt (vLLM's convention).
"""

from __future__ import annotations

from typing import Protocol

from .block_hashes import chain, end_hash, namespace_seed, node_hashes


class StoreEvents(Protocol):
    """The listener interface the store calls (see the module docstring)."""

    def blocks_stored(self, namespace: bytes, parent_hash: int | None, block_hashes: list[int],
                      tokens: bytes) -> None:
        """Whole pages were cached: one hash per page, ``tokens`` their packed uint32 token ids."""

    def blocks_removed(self, namespace: bytes, block_hashes: list[int]) -> None:
        """Pages left the cache (children before their parents)."""

    def all_cleared(self, namespaces: list[bytes]) -> None:
        """FLUSHALL: every page of ``namespaces`` is gone (pinned survivors are announced again right after)."""


class EventLog:
    """A StoreEvents sink that keeps every call as a tuple: for tools, replays and tests."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def blocks_stored(self, namespace, parent_hash, block_hashes, tokens) -> None:
        self.events.append(("stored", namespace, parent_hash, list(block_hashes), bytes(tokens)))

    def blocks_removed(self, namespace, block_hashes) -> None:
        self.events.append(("removed", namespace, list(block_hashes)))

    def all_cleared(self, namespaces) -> None:
        self.events.append(("cleared", list(namespaces)))


class EventFanout:
    """One store sink that forwards to several (the ZMQ publisher and the pub/sub channels)."""

    def __init__(self, sinks: list) -> None:
        self.sinks = sinks

    def blocks_stored(self, namespace, parent_hash, block_hashes, tokens) -> None:
        for sink in self.sinks:
            sink.blocks_stored(namespace, parent_hash, block_hashes, tokens)

    def blocks_removed(self, namespace, block_hashes) -> None:
        for sink in self.sinks:
            sink.blocks_removed(namespace, block_hashes)

    def all_cleared(self, namespaces) -> None:
        for sink in self.sinks:
            sink.all_cleared(namespaces)


# -- what the store calls, given the radix nodes concerned -------------------------------------------


def announce_stored(sink: StoreEvents, leaf) -> None:
    """A new leaf was linked below its parent."""
    parent = leaf.parent
    parent_hash = end_hash(parent) if parent.parent is not None else None
    sink.blocks_stored(leaf.tree.scope, parent_hash, node_hashes(leaf), leaf.key)


def announce_trim(sink: StoreEvents, node, k: int) -> None:
    """The last ``k`` pages of ``node`` are about to be evicted."""
    sink.blocks_removed(node.tree.scope, node_hashes(node)[len(node.blocks) - k :])


def announce_drop(sink: StoreEvents, tree, top) -> None:
    """The unpinned nodes of ``top``'s subtree are about to be dropped (as ``RadixTree.drop_subtree`` does)."""
    hashes: list[int] = []
    for node in tree.subtree(top):  # descendants first
        if node.parent is not None and node.lock_ref == 0:
            hashes.extend(reversed(node_hashes(node)))
    if hashes:
        sink.blocks_removed(tree.scope, hashes)


def announce_survivors(sink: StoreEvents, tree) -> None:
    """Every page still in ``tree`` (after a clear), parents before children."""
    stack = list(tree.root.children.values())
    while stack:
        node = stack.pop()
        announce_stored(sink, node)
        stack.extend(node.children.values())


def check_hashes(tree) -> list[str]:
    """Cached block hashes that no longer match their node's pages (stale after a change of the tree)."""
    problems = []
    stack = [(child, namespace_seed(tree.scope)) for child in tree.root.children.values()]
    while stack:
        node, parent = stack.pop()
        end = chain(parent, node.key, tree.page_bytes)[-1]
        if node.block_hash is not None and node.block_hash != end:
            problems.append(f"tree {tree.scope!r}/{tree.shard} node {node!r}: stale block hash")
        stack.extend((child, end) for child in node.children.values())
    return problems
