"""The scheduler half: looks requests up in pfxcache, plans loads and stores, holds and ends the leases.

Runs in vLLM's engine core (one per engine), single-threaded, and is the only
part that talks to the daemon when the arena is mapped. Per request:

1. ``lookup`` (vLLM's ``get_num_new_matched_tokens``): one ``PFXGET`` of the
   prompt's full pages with a lease. vLLM is offered the matched pages beyond
   its own local hit, never the page holding the last prompt token (vLLM must
   compute at least one token to sample from).
2. ``planned_load`` (``update_state_after_alloc``): the pages go into the
   blocks vLLM allocated; the job reaches the workers in the next plan.
3. ``plan`` (``build_connector_meta``): the loads, and a store for every
   request whose prompt's full pages are all computed after this step:
   ``PFXALLOC`` of the pages the daemon lacks, which the workers fill from
   vLLM's blocks once the forward pass ran.
4. ``workers_reported`` (``update_connector_output``): ``PFXSET ... BLOCKS``
   commits the filled blocks after the cached prefix; the allocation's lease
   and then the lookup's end as soon as nothing needs them -- loads done and
   store committed -- not when the request finishes decoding.

Pages are stored as soon as the prompt is computed rather than when the
request finishes: their bytes are final then, another engine can use them
during this request's decode, and vLLM never has to keep finished blocks
alive for us.

Failures never reach vLLM: the daemon unreachable, restarted or killed (a
connection error) drops the connection and its leases, is logged once and
counted, and the next request after ``retry_seconds`` reconnects; ``-OOM``
skips the store; a lease that may have ended refuses the load (vLLM
recomputes). Only a daemon whose geometry does not fit the model is an error,
at engine start.
"""

from __future__ import annotations

import logging
import os
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from pfxcache.client.core import is_local_host
from pfxcache.client.errors import AttachError, CacheFullError, PrefixCacheError
from pfxcache.client.partitioned import layout_of
from pfxcache.protocol.redis_strings import stringmatchlen

from .layout import PageGeometry, request_namespace
from .once import LogOnce
from .plan import LoadJob, StepPlan, StoreJob, WorkerReport

log = logging.getLogger("pfxcache.vllm")

# A load or store must end this long before its lease could: the worker
# checks the deadline after copying, so this bounds the copy time we trust.
LEASE_MARGIN_S = 1.0

TRANSFERS = ("auto", "arena", "resp")


@dataclass(frozen=True)
class Settings:
    """The connector's part of ``kv_connector_extra_config`` (keys as written there)."""

    url: str = "redis://127.0.0.1:6390/0"
    namespace: str | None = None        # overrides the derived base namespace
    lease_ttl_ms: int | None = None     # None: the daemon's lease-ttl
    transfer: str = "auto"              # auto: the arena when it can be mapped here, else RESP
    retry_seconds: float = 5.0          # after a connection failure, wait this long before reconnecting
    timeout_seconds: float = 2.0        # socket timeout: a hung daemon costs at most this per call
    load: bool = True                   # kv_consumer / kv_both
    store: bool = True                  # kv_producer / kv_both

    KEYS = {"pfxcache_url": "url", "pfxcache_namespace": "namespace", "lease_ttl_ms": "lease_ttl_ms",
            "transfer": "transfer", "retry_seconds": "retry_seconds", "timeout_seconds": "timeout_seconds"}

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any], role: str = "kv_both") -> Settings:
        known = set(cls.KEYS) | {"load_failure_policy"}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"unknown pfxcache settings in kv_connector_extra_config: {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")
        values: dict[str, Any] = {cls.KEYS[key]: value for key, value in extra.items() if key in cls.KEYS}
        if values.get("transfer", "auto") not in TRANSFERS:
            raise ValueError(f"transfer must be one of {', '.join(TRANSFERS)}, not {values['transfer']!r}")
        if values.get("lease_ttl_ms") is not None:
            values["lease_ttl_ms"] = int(values["lease_ttl_ms"])
            if values["lease_ttl_ms"] < 1:
                raise ValueError("lease_ttl_ms must be a positive number of milliseconds")
        roles = {"kv_both": (True, True), "kv_consumer": (True, False), "kv_producer": (False, True)}
        if role not in roles:
            raise ValueError(f"kv_role {role!r}: pfxcache supports kv_both, kv_consumer and kv_producer")
        values["load"], values["store"] = roles[role]
        return cls(**values)


@dataclass
class _Request:
    """What the scheduler half knows of one request."""

    namespace: str
    tokens: list[int]          # the prompt's full pages
    usable: int                # tokens vLLM may take from the cache (whole pages before the last token)
    match: Any = None          # the lookup (a Match holding the lease), None when none is held
    matched: int = 0           # tokens the lookup matched (whole pages)
    valid_until: float = 0.0   # the lookup's lease surely lives until then
    local_tokens: int = 0      # vLLM's local hit when it asked
    loads_pending: int = 0     # load jobs sent, not yet reported by every worker
    loaded_tokens: int = 0
    store: str = "todo"        # todo -> inflight -> done (or none: nothing to store / not storing)
    reports: dict[str, int] = field(default_factory=dict)
    finished: bool = False
    looked_up: bool = False    # one PFXGET per request (again only if the connection, and so the lease, was lost)


class SchedulerHalf:
    """Lookups, plans and leases for one engine.

    ``block_ids_of``: request id -> vLLM's block ids of the request (the KV
    cache manager's, bound after construction). ``workers``: how many workers
    report each step (tensor parallel size). ``connect``: a URL -> PrefixCache
    factory (default: ``PrefixCache.from_url``). ``clock``: for the lease
    deadlines the workers check (``time.monotonic``, shared by the processes
    of one host).
    """

    def __init__(self, settings: Settings, geometry: PageGeometry, base_namespace: str, *, workers: int = 1,
                 connect: Callable[[str], Any] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.geometry = geometry
        self.base_namespace = settings.namespace or base_namespace
        self.workers = workers
        self.block_ids_of: Callable[[str], list[int]] | None = None
        self._connect_fn = connect
        self._clock = clock
        self._cache: Any = None
        self._arena: dict | None = None
        self._lease_ttl_ms = settings.lease_ttl_ms or 30_000
        self._retry_at = 0.0
        self._down_logged = False
        self._requests: dict[str, _Request] = {}
        self._loads: list[LoadJob] = []
        self._stores: dict[str, tuple[Any, StoreJob]] = {}
        self.stats: dict[str, float] = {}
        self._stats_delta: dict[str, float] = {}
        self._warn = LogOnce()

    # -- the connection ------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect at engine start: a geometry mismatch raises (a configuration error); unreachable only logs."""
        self._connection(raise_geometry=True)

    def _count(self, name: str, value: float = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + value
        self._stats_delta[name] = self._stats_delta.get(name, 0) + value

    def _connection(self, raise_geometry: bool = False) -> Any:
        if self._cache is not None:
            return self._cache
        now = self._clock()
        if now < self._retry_at:
            return None
        url = self.settings.url
        try:
            if self._connect_fn is not None:
                cache = self._connect_fn(url)
            else:
                from pfxcache.client import PrefixCache

                cache = PrefixCache.from_url(url, attach=False, socket_timeout=self.settings.timeout_seconds,
                                             socket_connect_timeout=self.settings.timeout_seconds)
            info = cache.info()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._lost(exc)
            return None
        try:
            self.geometry.check_daemon(info.page_size, info.block_bytes, url)
        except ValueError:
            cache.close()
            if raise_geometry:
                raise
            self._retry_at = now + self.settings.retry_seconds
            self._warn(f"geometry:{info.page_size}:{info.block_bytes}", "pfxcache: the daemon at %s now has "
                       "page-size %d / block-bytes %d, not this model's (%s): serving without the cache", url,
                       info.page_size, info.block_bytes, self.geometry.daemon_args(), level=logging.ERROR)
            self._count("errors")
            return None
        self._cache = cache
        self._arena = self._mappable_arena(info.arena)
        self._lease_ttl_ms = self.settings.lease_ttl_ms or info.lease_ttl_ms
        if self._down_logged:
            log.warning("pfxcache: connected again to %s", url)
            self._count("reconnects")
        self._down_logged = False
        return cache

    def _mappable_arena(self, arena: dict) -> dict | None:
        """The arena map the workers should copy through, or None for RESP."""
        if self.settings.transfer == "resp":
            return None
        if arena.get("backend") == "shm" and not arena.get("path"):
            return self._attachable(arena)
        if self.settings.transfer == "arena":
            return dict(arena)
        if not is_local_host(urllib.parse.urlsplit(self.settings.url).hostname):
            return None
        if arena.get("backend") == "shm":
            path = arena.get("path")
            try:
                if not path or os.path.getsize(path) != int(arena["size"]):
                    return None
            except OSError:
                return None
            return dict(arena)
        if arena.get("backend") == "cuda":
            return dict(arena)    # the workers open the IPC handle (the engine core keeps off the GPU)
        return None

    def _attachable(self, arena: dict) -> dict | None:
        """A partitioned arena (or a tenant's view): the partitions this URL's user may map over the unix
        socket (PFXATTACH), for the workers to attach to, or None for RESP (the reason logged once)."""
        try:
            ranges = layout_of(self.settings.url)
        except AttachError as exc:
            self._warn(f"attach:{exc}", "pfxcache: moving KV over RESP: %s", exc)
            return None
        if not ranges:
            self._warn("attach:none", "pfxcache: moving KV over RESP: this user's key patterns cover no arena "
                       "partition")
            return None
        return dict(arena, attach=True, partitions=[list(r) for r in ranges])

    def _stores_in_arena(self, namespace: str) -> bool:
        """Whether a store of ``namespace`` goes through the mapped arena: a partitioned one only where a
        writable partition of this user's holds the namespace (else its pages move over RESP)."""
        if self._arena is None:
            return False
        partitions = self._arena.get("partitions")
        name = namespace.encode()
        return partitions is None or any(writable and stringmatchlen(pattern, name)
                                         for _, _, writable, pattern in partitions)

    def _lost(self, exc: BaseException) -> None:
        """The daemon is gone or hung: drop the connection (its leases end with it) and retry later."""
        self._count("errors")
        if not self._down_logged:
            log.warning("pfxcache at %s is unreachable (%s: %s): serving without the cache, retrying every %.0f s",
                        self.settings.url, type(exc).__name__, exc, self.settings.retry_seconds)
            self._down_logged = True
        if self._cache is not None:
            try:
                self._cache.close()
            except Exception:
                pass
        self._cache = None
        self._arena = None
        self._retry_at = self._clock() + self.settings.retry_seconds
        for state in self._requests.values():
            if state.match is not None:
                state.match = None    # that lease ended with the connection: look up again if asked again
                state.looked_up = False
        self._stores.clear()

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run one daemon call; None when it failed (counted, and logged once per cause)."""
        try:
            return fn()
        except CacheFullError:
            self._count("oom")
            return None
        except PrefixCacheError as exc:
            self._count("errors")
            self._warn(f"{what}:{exc}", "pfxcache: %s refused: %s (counted in errors, logged once)", what, exc)
            return None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._lost(exc)
            return None

    def _deadline(self, sent: float) -> float:
        return sent + self._lease_ttl_ms / 1000 - LEASE_MARGIN_S

    # -- 1. lookup ----------------------------------------------------------------------------------

    def lookup(self, request: Any, local_tokens: int) -> int:
        """Tokens beyond vLLM's ``local_tokens`` the cache can supply for ``request`` (whole pages)."""
        state = self._requests.get(request.request_id)
        if state is None:
            state = self._track(request)
            if state is None:
                return 0
        state.local_tokens = local_tokens
        if not state.looked_up and state.tokens and not state.finished:
            self._look_up(state)
        if not self.settings.load or state.match is None or self._clock() > state.valid_until:
            return 0
        return max(0, min(state.matched, state.usable) - local_tokens)

    def _track(self, request: Any) -> _Request | None:
        prompt = getattr(request, "prompt_token_ids", None)
        if not prompt:
            return None     # prompt embeddings: no token ids to key the cache by
        page = self.geometry.page_size
        lora = getattr(request, "lora_request", None)
        namespace = request_namespace(self.base_namespace, getattr(request, "cache_salt", None),
                                      getattr(lora, "lora_name", None) if lora is not None else None)
        full = len(prompt) // page * page
        state = _Request(namespace, list(prompt[:full]), (len(prompt) - 1) // page * page)
        if not self.settings.store:
            state.store = "none"
        self._requests[request.request_id] = state
        return state

    def _look_up(self, state: _Request) -> None:
        cache = self._connection()
        if cache is None:
            return
        sent = self._clock()
        match = self._call("PFXGET", lambda: cache.lookup(state.namespace, state.tokens, lease=True,
                                                          ttl_ms=self.settings.lease_ttl_ms, with_data=False))
        if match is None:
            return
        self._count("lookups")
        self._count("lookup_hit_tokens", match.matched_tokens)
        state.looked_up = True
        state.matched, state.valid_until = match.matched_tokens, self._deadline(sent)
        state.match = match if match.lease else None

    # -- 2. the load plan ----------------------------------------------------------------------------

    def planned_load(self, request: Any, block_ids: list[int], external_tokens: int) -> None:
        """vLLM allocated ``block_ids`` and takes ``external_tokens`` from us: plan their copy."""
        state = self._requests.get(request.request_id)
        if external_tokens <= 0 or state is None or state.match is None:
            return
        page = self.geometry.page_size
        first = state.local_tokens // page
        count = external_tokens // page
        job = LoadJob(request.request_id, state.namespace, first, list(block_ids[first:first + count]),
                      list(state.match.blocks[first:first + count]), state.tokens[:(first + count) * page],
                      state.valid_until)
        state.loads_pending += 1
        state.loaded_tokens = external_tokens
        self._loads.append(job)
        self._count("load_tokens_planned", external_tokens)

    # -- 3. a step's plan ----------------------------------------------------------------------------

    def plan(self, scheduled: list[tuple[str, int]]) -> StepPlan:
        """The step's plan; ``scheduled``: (request id, tokens computed once this step ran) of every request."""
        cache = self._cache
        plan = StepPlan(loads=self._loads, arena=self._arena if cache is not None else None, url=self.settings.url)
        self._loads = []
        for req_id, computed in scheduled:
            state = self._requests.get(req_id)
            if state is None or state.store != "todo" or computed < len(state.tokens):
                continue
            job = self._store_job(req_id, state)
            if job is not None:
                plan.stores.append(job)
        return plan

    def _store_job(self, req_id: str, state: _Request) -> StoreJob | None:
        page = self.geometry.page_size
        first, total = state.matched // page, len(state.tokens) // page
        cache = self._connection()
        if total <= first or cache is None or self.block_ids_of is None:
            state.store = "none"
            self._release_if_done(req_id, state)
            return None
        if first and state.match is None:
            state.store = "none"    # the cached prefix is no longer pinned: an OFFSET store could miss it
            return None
        vllm_blocks = list(self.block_ids_of(req_id)[first:total])
        count = total - first
        if len(vllm_blocks) != count:
            state.store = "none"
            return None
        arena_blocks: list[int] = []
        valid_until = float("inf")
        if self._stores_in_arena(state.namespace):
            sent = self._clock()
            allocation = self._call("PFXALLOC", lambda: cache.alloc(state.namespace, count,
                                                                      ttl_ms=self.settings.lease_ttl_ms))
            if allocation is None:
                state.store = "none"
                self._release_if_done(req_id, state)
                return None
            arena_blocks, valid_until = list(allocation.blocks), self._deadline(sent)
        else:
            allocation = None
        job = StoreJob(req_id, state.namespace, first, vllm_blocks, arena_blocks, state.tokens, valid_until)
        self._stores[req_id] = (allocation, job)
        state.store = "inflight"
        state.reports = {}
        return job

    # -- 4. the workers' report -------------------------------------------------------------------------

    def workers_reported(self, report: WorkerReport | None) -> None:
        """Commit finished stores, end leases nothing needs any more, take the workers' counters."""
        if report is None:
            return
        for name, value in report.counters.items():
            self._count(name, value)
        for req_id in set(report.loaded) | set(report.failed_loads):
            state = self._requests.get(req_id)
            if state is None:
                continue
            done = report.loaded.get(req_id, 0) + report.failed_loads.get(req_id, 0)
            if report.failed_loads.get(req_id):
                state.loaded_tokens = 0
            state.loads_pending = max(0, state.loads_pending - (1 if done >= self.workers else 0))
            self._release_if_done(req_id, state)
        for req_id in set(report.stored) | set(report.failed_stores):
            state = self._requests.get(req_id)
            if state is None or req_id not in self._stores:
                continue
            for key in ("stored", "failed_stores"):
                state.reports[key] = state.reports.get(key, 0) + getattr(report, key).get(req_id, 0)
            if state.reports.get("stored", 0) + state.reports.get("failed_stores", 0) < self.workers:
                continue
            allocation, job = self._stores.pop(req_id)
            if state.reports.get("failed_stores"):
                self._count("store_failures")
            elif allocation is not None:
                cache = self._cache
                offset = job.first_page * self.geometry.page_size
                result = self._call("PFXSET BLOCKS", lambda: cache.commit(job.namespace, job.tokens, allocation,
                                                                           offset=offset)) if cache else None
                if result is not None:
                    self._count("stored_pages", result.stored)
                    self._count("existing_pages", result.existing)
            else:
                self._count("stored_pages", len(job.vllm_blocks))
            if allocation is not None and self._cache is not None:
                self._call("PFXRELEASE", allocation.release)
            state.store = "done"
            self._release_if_done(req_id, state)

    def _release_if_done(self, req_id: str, state: _Request) -> None:
        if state.loads_pending or state.store in ("todo", "inflight"):
            return
        if state.match is not None:
            match, state.match = state.match, None
            if self._cache is not None and match.lease:
                self._call("PFXRELEASE", match.release)
        if state.finished:
            self._requests.pop(req_id, None)

    # -- the end of a request -------------------------------------------------------------------------

    def finished(self, request: Any) -> dict[str, Any] | None:
        """vLLM is done with the request: end what it holds (once its loads and store are through)."""
        state = self._requests.get(request.request_id)
        if state is None:
            return None
        state.finished = True
        if state.store == "todo":
            state.store = "none"   # finished (or aborted) before its prompt was computed
        summary = {"namespace": state.namespace, "matched_tokens": state.matched,
                   "loaded_tokens": state.loaded_tokens}
        self._release_if_done(request.request_id, state)
        return summary

    def take_stats(self) -> dict[str, float]:
        """The counters changed since the last call (for vLLM's stats loggers)."""
        delta, self._stats_delta = self._stats_delta, {}
        return delta

    def close(self) -> None:
        if self._cache is not None:
            try:
                self._cache.close()
            except Exception:
                pass
            self._cache = None
