"""What the scheduler half tells the workers each step, and what the workers report back: plain data.

vLLM pickles the connector metadata from the engine core to every worker
(and the workers' reports back), so everything here is ints, strings, lists
and dicts of them -- no connections, no tensors, nothing of vLLM's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class LoadJob:
    """Copy cached pages into vLLM's blocks before the forward pass reads them.

    ``vllm_blocks[i]`` receives arena block ``arena_blocks[i]``, the page of
    prompt tokens ``(first_page + i) * page_size ...``. ``valid_until``: the
    ``time.monotonic()`` by which the scheduler's lease is surely still alive
    (the lease pins the blocks); a copy that ends later is refused.
    ``tokens``/``namespace``: what the RESP path looks up instead
    (``tokens`` = the prompt up to the last loaded page).
    """

    req_id: str
    namespace: str
    first_page: int
    vllm_blocks: list[int]
    arena_blocks: list[int]
    tokens: list[int]
    valid_until: float


@dataclass
class StoreJob:
    """Copy the prompt's new full pages out of vLLM's blocks once this step has computed them.

    Arena path: into the blocks the scheduler allocated (``arena_blocks``),
    which it then commits with ``PFXSET ... BLOCKS``. RESP path
    (``arena_blocks`` empty): the worker sends ``PFXSET ... OFFSET
    first_page*page DATA`` itself. ``tokens``: the prompt's full pages.
    """

    req_id: str
    namespace: str
    first_page: int
    vllm_blocks: list[int]
    arena_blocks: list[int]
    tokens: list[int]
    valid_until: float


@dataclass
class StepPlan:
    """One step's work for the workers. ``arena``: PFXINFO's arena map (None: move bytes over RESP)."""

    loads: list[LoadJob] = field(default_factory=list)
    stores: list[StoreJob] = field(default_factory=list)
    arena: dict[str, Any] | None = None
    url: str = ""

    def __bool__(self) -> bool:
        return bool(self.loads or self.stores)


@dataclass
class WorkerReport:
    """What the workers did this step, per request, summed over the workers by ``merge``.

    ``loaded``/``stored``: how many workers finished the job; ``failed_loads``
    / ``failed_stores``: how many could not (the scheduler then never commits
    the store; vLLM recomputes failed loads through its load-error path).
    ``counters``: bytes and seconds moved, for the connector's stats.
    """

    loaded: dict[str, int] = field(default_factory=dict)
    stored: dict[str, int] = field(default_factory=dict)
    failed_loads: dict[str, int] = field(default_factory=dict)
    failed_stores: dict[str, int] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)

    def merge(self, other: WorkerReport) -> WorkerReport:
        merged = WorkerReport()
        for name in ("loaded", "stored", "failed_loads", "failed_stores", "counters"):
            mine, theirs = getattr(self, name), getattr(other, name)
            total = dict(mine)
            for key, value in theirs.items():
                total[key] = total.get(key, 0) + value
            setattr(merged, name, total)
        return merged

    def __bool__(self) -> bool:
        return bool(self.loaded or self.stored or self.failed_loads or self.failed_stores or self.counters)
