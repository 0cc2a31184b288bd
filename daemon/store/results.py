"""What the store's operations return: named tuples (and InsertResult, which joins its ids when read) the daemon turns into replies."""

from __future__ import annotations

from array import array
from typing import NamedTuple

from .block_ids import BlockPath


class MatchResult(NamedTuple):
    matched_tokens: int
    lease_id: int  # 0: no lease (not asked for, or nothing matched)
    blocks: list[int]  # one block id per matched page, in order


class InsertResult:
    """What an insert returns: ``stored`` pages newly cached by it, ``existing`` pages from the offset on
    that were cached already (their data was not used), and ``blocks``: the block ids of every page of
    the sequence, in order.

    ``blocks`` are joined from the path's nodes when first read (RadixTree.path_nodes: the ids as they
    were at commit), so an insert whose caller reads only the counts copies no id. Compares, unpacks and
    indexes as the tuple ``(stored, existing, blocks)``.
    """

    __slots__ = ("stored", "existing", "_blocks", "_path", "_skip")

    def __init__(self, stored: int, existing: int, blocks=None, *, path=None, skip: int = 0) -> None:
        self.stored = stored
        self.existing = existing
        self._blocks = blocks
        self._path = path  # (nodes, their arrays) when blocks is None
        self._skip = skip  # key pages: the path's pages before the sequence's first (page_keys.py)

    @property
    def blocks(self):
        if self._blocks is None:
            nodes, arrays = self._path
            path = BlockPath()
            for ids in arrays:
                path.extend(ids if isinstance(ids, array) else array("q", ids))
            path.nodes = nodes
            self._blocks = path[self._skip :].tolist() if self._skip else path
            self._path = None
        return self._blocks

    def __iter__(self):
        return iter((self.stored, self.existing, self.blocks))

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index):
        return (self.stored, self.existing, self.blocks)[index]

    def __eq__(self, other) -> bool:
        if isinstance(other, (InsertResult, tuple)):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"InsertResult(stored={self.stored}, existing={self.existing}, blocks={self.blocks!r})"


class AllocResult(NamedTuple):
    lease_id: int
    blocks: list[int]


class EvictResult(NamedTuple):
    evicted: int  # pages evicted
    freed_bytes: int
    pinned: int  # pages in scope that were kept because a lease pins them
