"""Block ids in replies, encoded once per radix node rather than once per page and request.

A PFXGET hit of a 4,096-token prompt carries 256 block ids; encoding them is
most of the reply's cost. The ids of a cached path do not change while the
path stays cached, so each node keeps its blocks' encoding
(``Node.blocks_encoded``, reset by the tree whenever the node's blocks change)
and a reply joins the pieces of the nodes on its path.
"""

from __future__ import annotations

from array import array
from typing import Any

from pfxcache.protocol.replies import IntArray, encode_int_elements


def block_ids_reply(blocks: Any) -> IntArray | array:
    """The reply value for a list of block ids: per-node pieces for a store path, else one array."""
    nodes = getattr(blocks, "nodes", None)
    if nodes is None:  # fresh blocks (PFXALLOC): no node to cache them on
        return array("q", blocks)
    parts = []
    for node in nodes:
        encoded = node.blocks_encoded
        if encoded is None:
            encoded = node.blocks_encoded = encode_int_elements(node.blocks)
        parts.append(encoded)
    return IntArray(len(blocks), b"".join(parts))
