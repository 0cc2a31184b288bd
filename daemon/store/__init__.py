"""The store core of pfxcached: arena, block allocator, radix trees, leases, eviction policies.

``store`` holds ``PrefixStore``, the facade the daemon maps RESP commands onto. It is
composed of parts, each with its own state and a few public methods, made in this order:
``partitions`` (the allocator, eviction index and page counters, the whole arena's and each
arena partition's), ``namespaces`` (the namespace records and their trees), ``evictions``
(the evictor), ``leases``, ``keyspace`` (namespaces as keys: DEL, EXPIRE, SCAN), ``quotas``
(tenant quotas), ``lookups`` (the read path), ``inserts`` (the write path and the insert
plans in flight) and ``figures`` (counters and gauges); ``listeners`` holds who is told of
changes, ``invariants`` checks the parts against each other (``PrefixStore.check``).
Beneath them: ``allocator``, ``radix``, ``arguments``, ``results``, ``errors``, ``events``,
the eviction policies (``policy`` is their interface, ``registry`` names them) and the
arenas (``arena``, ``cuda_arena``, ``partitioned_arena``).

Plain synchronous data structures (no trio, no protocol): the daemon owns the
event loop and the locks, and maps RESP commands onto ``PrefixStore``.
"""

from __future__ import annotations

import sys
from array import array

from .allocator import FREE, LEASED, TREE, BlockAllocator
from .arena import Arena, MemfdArena, MemoryArena, ShmArena
from .errors import BadRequest, NoPrefix, OutOfMemory, StoreError
from .inserts import InsertPlan
from .leases import ALLOC, READ, Lease, LeaseTable
from .policies import EvictionIndex
from .radix import Node, RadixTree
from .registry import POLICIES
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
