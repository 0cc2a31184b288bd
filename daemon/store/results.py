"""What the store's operations return: plain named tuples the daemon turns into replies."""

from __future__ import annotations

from typing import NamedTuple


class MatchResult(NamedTuple):
    matched_tokens: int
    lease_id: int  # 0: no lease (not asked for, or nothing matched)
    blocks: list[int]  # one block id per matched page, in order


class InsertResult(NamedTuple):
    stored: int  # pages newly cached by this insert
    existing: int  # pages from the offset on that were cached already (their data was not used)
    blocks: list[int]  # block ids of every page of the sequence, in order


class AllocResult(NamedTuple):
    lease_id: int
    blocks: list[int]


class EvictResult(NamedTuple):
    evicted: int  # pages evicted
    freed_bytes: int
    pinned: int  # pages in scope that were kept because a lease pins them
