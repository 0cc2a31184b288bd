"""What the store tells a listener about pages entering and leaving it (KV events, store side).

The store calls one ``StoreEvents`` sink, synchronously, at the moment a change
happens: pages linked into a tree by an insert, pages removed by eviction,
PFXEVICT or a namespace's deletion, and everything cleared by FLUSHALL. The
sink must be cheap and must not call back into the store: the daemon's sink
(``daemon/service/kv_events.py``) only queues the facts for a publisher thread and the
pub/sub channels. With no sink set the store computes nothing.

Pages are named by their stable block hashes (``block_hashes.py``); a stored
run's ``parent_hash`` is the hash of the page before its first page, or None
when the run starts at the first page of a prompt (vLLM's convention).
"""

from __future__ import annotations

from typing import Protocol

from .block_hashes import HASH_BYTES, chain, namespace_seed, node_hashes, parent_hash, to_ints


class StoreEvents(Protocol):
    """The listener interface the store calls (see the module docstring).

    Hashes come packed: 8 big-endian bytes per page (``block_hashes.to_ints`` reads them),
    so the event loop never builds an integer per page.
    """

    def blocks_stored(self, namespace: bytes, parent_hash: bytes | None, block_hashes: bytes,
                      tokens: bytes, medium: str | None = None) -> None:
        """Whole pages were cached: one hash per page, ``tokens`` their packed uint32 token ids.
        ``medium``: where (vLLM's event field): None for the arena, "DISK" for the disk tier."""

    def blocks_removed(self, namespace: bytes, block_hashes: bytes, medium: str | None = None) -> None:
        """Pages left the cache (children before their parents, a run's last page first); ``medium``
        as for blocks_stored."""

    def all_cleared(self, namespaces: list[bytes]) -> None:
        """FLUSHALL: every page of ``namespaces`` is gone (pinned survivors are announced again right after)."""


class EventLog:
    """A StoreEvents sink that keeps every call as a tuple, hashes as integers: for tools and tests."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def blocks_stored(self, namespace, parent_hash, block_hashes, tokens, medium=None) -> None:
        parent = None if parent_hash is None else to_ints(parent_hash)[0]
        event = ("stored", namespace, parent, to_ints(block_hashes), bytes(tokens))
        self.events.append(event if medium is None else (*event, medium))

    def blocks_removed(self, namespace, block_hashes, medium=None) -> None:
        event = ("removed", namespace, to_ints(block_hashes))
        self.events.append(event if medium is None else (*event, medium))

    def all_cleared(self, namespaces) -> None:
        self.events.append(("cleared", list(namespaces)))


class EventFanout:
    """One store sink that forwards to several (the ZMQ publisher and the pub/sub channels)."""

    def __init__(self, sinks: list) -> None:
        self.sinks = sinks

    def blocks_stored(self, namespace, parent_hash, block_hashes, tokens, medium=None) -> None:
        for sink in self.sinks:
            sink.blocks_stored(namespace, parent_hash, block_hashes, tokens, medium)

    def blocks_removed(self, namespace, block_hashes, medium=None) -> None:
        for sink in self.sinks:
            sink.blocks_removed(namespace, block_hashes, medium)

    def all_cleared(self, namespaces) -> None:
        for sink in self.sinks:
            sink.all_cleared(namespaces)


# -- what the store calls, given the radix nodes concerned -------------------------------------------


def _live(tree) -> bool:
    """False for the trees of a namespace deleted while leases pinned pages (DEL with a Tombstone
    scope, keyspace.py): their pages were announced removed at the DEL, so nothing more is said."""
    return type(tree.scope) is bytes


def _backwards(packed: bytes) -> bytes:
    """Packed hashes, last page first (8-byte items reversed in C: the byte order inside stays)."""
    return memoryview(packed).cast("Q")[::-1].tobytes()


def announce_stored(sink: StoreEvents, leaf) -> None:
    """A new leaf was linked below its parent."""
    if _live(leaf.tree):
        sink.blocks_stored(leaf.tree.scope, parent_hash(leaf), node_hashes(leaf), leaf.key)


def announce_trim(sink: StoreEvents, node, k: int) -> None:
    """The last ``k`` pages of ``node`` are about to be evicted."""
    if _live(node.tree):
        hashes = node_hashes(node)
        sink.blocks_removed(node.tree.scope, _backwards(hashes[len(hashes) - k * HASH_BYTES :]))


def _removed_below(sink: StoreEvents, tree, top, pinned_too: bool) -> None:
    parts: list[bytes] = []
    for node in tree.subtree(top):  # descendants first
        if node.parent is not None and (pinned_too or node.lock_ref == 0):
            parts.append(_backwards(node_hashes(node)))
    if parts:
        sink.blocks_removed(tree.scope, b"".join(parts))


def announce_drop(sink: StoreEvents, tree, top) -> None:
    """The unpinned nodes of ``top``'s subtree are about to be dropped (as ``RadixTree.drop_subtree`` does)."""
    if _live(tree):
        _removed_below(sink, tree, top, pinned_too=False)


def announce_deleted(sink: StoreEvents, tree) -> None:
    """DEL of a namespace while leases still pin pages of ``tree``: to lookups they are gone now."""
    if _live(tree):
        _removed_below(sink, tree, tree.root, pinned_too=True)


def announce_survivors(sink: StoreEvents, tree) -> None:
    """Every page still in ``tree`` (after a clear), parents before children."""
    if not _live(tree):
        return
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
        hashes = chain(parent, node.key, tree.page_bytes)
        if node.page_hashes is not None and node.page_hashes != hashes:
            problems.append(f"tree {tree.scope!r}/{tree.shard} node {node!r}: stale block hashes")
        stack.extend((child, hashes[-HASH_BYTES:]) for child in node.children.values())
    return problems
