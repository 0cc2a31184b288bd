"""The store core of pfxcached: arena, block allocator, radix trees, leases, eviction policies.

Modules: ``store`` (the PrefixStore facade), ``figures`` (its counters and gauges), ``arguments``
(its argument checks), ``namespaces`` (a namespace's trees and counters), ``inserts`` (an insert in flight), ``results`` (what operations
return), ``invariants`` (``PrefixStore.check``), and the parts: ``allocator``, ``radix``, ``leases``,
``policies``/``reuse``/``guard`` (eviction; ``registry`` names them), ``arena``/``cuda_arena``.

Plain synchronous data structures (no trio, no protocol): the daemon owns the
event loop and the locks, and maps RESP commands onto ``PrefixStore``.
"""

from __future__ import annotations

import sys
from array import array

from .allocator import FREE, LEASED, TREE, BlockAllocator
from .arena import Arena, MemfdArena, MemoryArena, ShmArena
from .errors import BadRequest, NoPrefix, OutOfMemory, StoreError
from .leases import ALLOC, READ, Lease, LeaseTable
from .policies import EvictionIndex
from .radix import Node, RadixTree
from .registry import POLICIES
from .inserts import InsertPlan
from .results import AllocResult, EvictResult, InsertResult, MatchResult
from .store import PrefixStore


def pack_tokens(ids) -> bytes:
    """Token ids -> packed little-endian uint32 bytes (the store's token format)."""
    packed = array("I", ids)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def unpack_tokens(data: bytes) -> list[int]:
    """Packed little-endian uint32 bytes -> token ids."""
    packed = array("I")
    packed.frombytes(data)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()


__all__ = [
    "ALLOC",
    "FREE",
    "LEASED",
    "POLICIES",
    "READ",
    "TREE",
    "AllocResult",
    "Arena",
    "BadRequest",
    "BlockAllocator",
    "EvictResult",
    "EvictionIndex",
    "InsertPlan",
    "InsertResult",
    "Lease",
    "LeaseTable",
    "MatchResult",
    "MemfdArena",
    "MemoryArena",
    "NoPrefix",
    "Node",
    "OutOfMemory",
    "PrefixStore",
    "RadixTree",
    "ShmArena",
    "StoreError",
    "pack_tokens",
    "unpack_tokens",
]
