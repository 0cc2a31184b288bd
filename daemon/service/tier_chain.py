"""Lower tiers in order: the disk tier, then the shared tier, behind the one ``PrefixService.tier`` slot.

The prefix service talks to one tier object; with both a disk tier and a shared tier it talks to
a :class:`TierChain` of them, which answers as one tier:

* ``below(ident)``: any tier may continue the match (disk first: it answers from its catalog).
* ``promote``: each tier in order, the disk first; each continues where the RAM match ends after
  the tiers before it brought their pages in, so a prompt can be served from RAM, then disk, then
  the shared tier, in one PFXGET.
* forgetting, figures and checks: every tier's, in order; ``run`` starts every tier's tasks.

The store's single listener slots are shared by chaining (service/remote_tier.py fans out the
slot the disk tier set), not here: this module only orders calls.
"""

from __future__ import annotations

from typing import Any

import trio


class TierChain:
    """Tiers under the arena, fastest first, as one tier."""

    def __init__(self, tiers: list[Any]) -> None:
        self.tiers = tiers

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for tier in self.tiers:
                await nursery.start(tier.run)
            task_status.started()

    def below(self, ident: bytes) -> bool:
        return any(tier.below(ident) for tier in self.tiers)

    async def promote(self, namespace: bytes, tokens: bytes, lock: Any) -> None:
        for tier in self.tiers:
            await tier.promote(namespace, tokens, lock)

    def flush(self) -> int:
        return sum(tier.flush() for tier in self.tiers)

    def drop_namespace(self, namespace: bytes) -> int:
        return sum(tier.drop_namespace(namespace) for tier in self.tiers)

    def drop_prefix(self, namespace: bytes, tokens: bytes) -> int:
        return sum(tier.drop_prefix(namespace, tokens) for tier in self.tiers)

    def info(self) -> list[tuple[str, object]]:
        return [field for tier in self.tiers for field in tier.info()]

    def describe(self, namespace: bytes | None = None) -> dict:
        described: dict = {}
        for tier in self.tiers:
            described.update(tier.describe(namespace))
        return described

    def check(self) -> list[str]:
        return [problem for tier in self.tiers for problem in tier.check()]

    def close(self) -> None:
        for tier in reversed(self.tiers):
            tier.close()

    def __getattr__(self, name: str) -> Any:
        # What else callers read of the disk tier (tests, scripts: .catalog, .files): the first tier's.
        return getattr(self.tiers[0], name)


def tiers_of(tier: Any) -> list[Any]:
    """The tiers behind ``PrefixService.tier`` (None, one tier, or a chain), fastest first."""
    if tier is None:
        return []
    return list(tier.tiers) if isinstance(tier, TierChain) else [tier]
