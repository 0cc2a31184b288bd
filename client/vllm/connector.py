"""``PrefixCacheConnector``: vLLM's KVConnectorBase_V1 over pfxcache.

vLLM makes one instance per role: in the engine core
(``KVConnectorRole.SCHEDULER``), which holds a :class:`.scheduler.SchedulerHalf`,
and in every worker (``KVConnectorRole.WORKER``), which holds a
:class:`.worker.WorkerHalf`. This class only translates vLLM's calls and
objects into theirs; the plan between them is plain data (:mod:`.plan`),
wrapped in vLLM's metadata classes here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from .layout import PageGeometry, base_namespace, dtype_name
from .plan import StepPlan, WorkerReport
from .scheduler import SchedulerHalf, Settings
from .worker import WorkerHalf

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("pfxcache.vllm")


@dataclass
class PrefixCacheMetadata(KVConnectorMetadata):
    """Scheduler -> workers, once per step."""

    plan: StepPlan = field(default_factory=StepPlan)


@dataclass
class PrefixCacheWorkerMetadata(KVConnectorWorkerMetadata):
    """Workers -> scheduler, once per step (summed over the workers)."""

    report: WorkerReport = field(default_factory=WorkerReport)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, PrefixCacheWorkerMetadata)
        return PrefixCacheWorkerMetadata(self.report.merge(other.report))


@dataclass
class PrefixCacheStats(KVConnectorStats):
    """Counters (lookups, hit tokens, loads, stores, bytes, failures, errors) for vLLM's stats loggers."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        total = dict(self.data)
        for key, value in other.data.items():
            total[key] = total.get(key, 0) + value
        return PrefixCacheStats(total)

    def reduce(self) -> dict[str, int | float]:
        return {key: round(value, 6) if isinstance(value, float) else value for key, value in sorted(self.data.items())}

    def is_empty(self) -> bool:
        return not self.data


def geometry_of(vllm_config: VllmConfig) -> PageGeometry:
    """The page geometry of the model vLLM serves (all kv heads: pages are whole, whatever the TP split)."""
    model = vllm_config.model_config
    cache = vllm_config.cache_config
    if cache.cache_dtype not in ("auto", None):
        raise ValueError(f"pfxcache pages hold KV in the model's dtype; kv_cache_dtype {cache.cache_dtype!r} "
                         "is not supported (use auto)")
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        raise ValueError("pfxcache pages hold every layer: pipeline parallelism is not supported")
    return PageGeometry(
        layers=model.get_total_num_hidden_layers() if hasattr(model, "get_total_num_hidden_layers")
        else model.get_num_layers(vllm_config.parallel_config),
        kv_heads=model.get_total_num_kv_heads(),
        head_dim=model.get_head_size(),
        page_size=cache.block_size,
        dtype=dtype_name(model.dtype),
    )


def cpu_attention_isa(vllm_config: VllmConfig) -> str | None:
    """The kernel vLLM's CPU attention backend picks (it decides the KV layout), or None off the CPU."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    model = vllm_config.model_config
    return _get_attn_isa(model.dtype, vllm_config.cache_config.block_size, model.get_head_size(),
                         vllm_config.cache_config.cache_dtype)


class PrefixCacheConnector(KVConnectorBase_V1):
    """Shares prefix KV between vLLM engines through a pfxcache daemon (see :mod:`pfxcache.client.vllm`)."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        extra = dict(transfer.kv_connector_extra_config or {})
        policy = extra.get("load_failure_policy", "recompute")
        if policy not in ("recompute", "fail"):
            raise ValueError("load_failure_policy must be recompute or fail")
        # A cache is best effort: a page that cannot be loaded is recomputed, never a failed request
        # (vLLM's own default, "fail", suits disaggregated prefill, not a cache).
        transfer.kv_load_failure_policy = policy
        settings = Settings.from_extra_config(extra, transfer.kv_role or "kv_both")
        self.geometry = geometry_of(vllm_config)
        self._scheduler: SchedulerHalf | None = None
        self._worker: WorkerHalf | None = None
        if role == KVConnectorRole.SCHEDULER:
            parallel = vllm_config.parallel_config
            namespace = base_namespace(vllm_config.model_config.model, self.geometry.dtype, self.geometry.page_size)
            self._scheduler = SchedulerHalf(settings, self.geometry, namespace,
                                            workers=parallel.tensor_parallel_size)
            self._scheduler.start()
            log.info("pfxcache connector: %s, namespace %s, role %s", settings.url,
                     self._scheduler.base_namespace, transfer.kv_role)
        else:
            from vllm.distributed.parallel_state import (
                get_tensor_model_parallel_rank,
                get_tensor_model_parallel_world_size,
            )

            self._worker = WorkerHalf(self.geometry, tp_rank=get_tensor_model_parallel_rank(),
                                      tp_size=get_tensor_model_parallel_world_size(),
                                      socket_timeout=settings.timeout_seconds)

    @property
    def requires_kv_delivery(self) -> bool:
        return False    # a dropped store is only a later miss

    # -- scheduler side ----------------------------------------------------------------------------

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        if self._scheduler is not None:
            self._scheduler.block_ids_of = lambda req_id: kv_cache_manager.get_block_ids(req_id)[0]

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.lookup(request, num_computed_tokens), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        assert self._scheduler is not None
        if num_external_tokens > 0:
            self._scheduler.planned_load(request, blocks.get_block_ids()[0], num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self._scheduler is not None
        scheduled = scheduler_output.num_scheduled_tokens
        after: list[tuple[str, int]] = []
        for new in scheduler_output.scheduled_new_reqs:
            after.append((new.req_id, new.num_computed_tokens + scheduled.get(new.req_id, 0)))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            after.append((req_id, cached.num_computed_tokens[i] + scheduled.get(req_id, 0)))
        return PrefixCacheMetadata(self._scheduler.plan(after))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        assert self._scheduler is not None
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, PrefixCacheWorkerMetadata):
            self._scheduler.workers_reported(meta.report)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        summary = self._scheduler.finished(request)
        if summary is None:
            return False, None
        return False, {"pfxcache": {**summary, "stats": dict(self._scheduler.stats)}}

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self._scheduler is None:
            return None
        delta = self._scheduler.take_stats()
        return PrefixCacheStats(delta) if delta else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return PrefixCacheStats(dict(data or {}))

    # -- worker side -------------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register(kv_caches, cpu_attention_isa(self._vllm_config))

    def _plan(self) -> StepPlan | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta.plan if isinstance(meta, PrefixCacheMetadata) else None

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        plan = self._plan()
        if plan is not None and plan.loads and self._worker is not None:
            self._worker.load(plan)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return    # loads are whole and synchronous, done in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata,
                      **kwargs: Any) -> None:
        return    # stores copy every layer at once, in wait_for_save

    def wait_for_save(self) -> None:
        plan = self._plan()
        if plan is not None and plan.stores and self._worker is not None:
            self._worker.store(plan)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_failed_blocks() if self._worker is not None else set()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if self._worker is None:
            return None
        report = self._worker.take_report()
        return PrefixCacheWorkerMetadata(report) if report is not None else None

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._scheduler is not None:
            self._scheduler.close()
