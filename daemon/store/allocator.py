"""Block ids of the arena: a free stack plus a state per block.

Every block is in exactly one state: FREE (on the free stack), TREE (owned by
a cached page of a radix tree) or LEASED (held by an allocation lease or an
insert in progress). The state array exists so that invariants can be checked
and client-supplied block ids validated in O(1).
"""

from __future__ import annotations

FREE, TREE, LEASED = 0, 1, 2
STATE_NAMES = ("free", "tree", "leased")


class BlockAllocator:
    """O(1)-per-block allocation and release of block ids ``0..nblocks-1``."""

    def __init__(self, nblocks: int) -> None:
        self.nblocks = nblocks
        # Reversed so that a fresh arena hands out 0, 1, 2, ... (contiguous reads stay cache friendly).
        self._free = list(range(nblocks - 1, -1, -1))
        self._state = bytearray(nblocks)  # all FREE
        self._counts = [nblocks, 0, 0]

    @property
    def free_count(self) -> int:
        """Blocks on the free stack."""
        return len(self._free)

    def count(self, state: int) -> int:
        """How many blocks are in ``state``."""
        return self._counts[state]

    def state(self, block: int) -> int:
        """The state of one block."""
        return self._state[block]

    def take(self, n: int, state: int = LEASED) -> list[int]:
        """Pop ``n`` free blocks and put them in ``state``; the caller made sure they exist."""
        if n > len(self._free):
            raise RuntimeError(f"allocator: {n} blocks requested, {len(self._free)} free")
        if n <= 0:
            return []
        ids = self._free[-n:]
        del self._free[-n:]
        ids.reverse()
        st = self._state
        for b in ids:
            st[b] = state
        self._counts[FREE] -= n
        self._counts[state] += n
        return ids

    def release(self, ids: list[int]) -> None:
        """Return blocks to the free stack (they must not be free already)."""
        st = self._state
        for b in ids:  # validate first: a double free is a store bug, and must not corrupt the stack
            if st[b] == FREE:
                raise RuntimeError(f"allocator: block {b} freed twice")
        if len(ids) > 1 and len(set(ids)) != len(ids):
            raise RuntimeError("allocator: duplicate ids in one release")
        counts = self._counts
        for b in ids:
            counts[st[b]] -= 1
            st[b] = FREE
        counts[FREE] += len(ids)
        self._free.extend(ids)

    def move(self, ids: list[int], src: int, dst: int) -> None:
        """Change the state of held blocks (LEASED -> TREE when a write is committed)."""
        st = self._state
        for b in ids:
            if st[b] != src:
                raise RuntimeError(f"allocator: block {b} is {STATE_NAMES[st[b]]}, expected {STATE_NAMES[src]}")
        for b in ids:
            st[b] = dst
        self._counts[src] -= len(ids)
        self._counts[dst] += len(ids)

    def check(self) -> list[str]:
        """Violations of the allocator's own invariants (empty when consistent)."""
        problems = []
        seen = set()
        for b in self._free:
            if b in seen:
                problems.append(f"block {b} twice on the free stack")
            seen.add(b)
            if self._state[b] != FREE:
                problems.append(f"block {b} on the free stack but {STATE_NAMES[self._state[b]]}")
        actual = [self._state.count(s) for s in (FREE, TREE, LEASED)]
        if actual != self._counts:
            problems.append(f"state counts {self._counts} != actual {actual}")
        if actual[FREE] != len(self._free):
            problems.append(f"{actual[FREE]} blocks marked free but {len(self._free)} on the free stack")
        return problems
