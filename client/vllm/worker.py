"""The worker half: copies pages between vLLM's paged KV tensors and the daemon's arena.

Runs in each vLLM worker process, and talks to the daemon only on the RESP
path. The scheduler half sends, with every step's plan, the arena's
description (PFXINFO's ``arena`` map); the worker maps it once (the shm file,
or the CUDA arena's IPC handle) and from then on copies with torch between
two views of the same pages:

* vLLM's side: per layer, its paged KV tensor seen as keys and values
  ``[blocks, heads, block_size, head_dim]`` (:func:`paged_kv_views`; no copy,
  only strides -- whatever order the attention kernel keeps them in);
* the arena's side: the whole arena seen as ``[blocks, layers, 2, kv_heads,
  page_size, head_dim]`` in the model's dtype -- the page layout
  (:mod:`.layout`).

A load copies vLLM block by block from arena blocks before the forward pass
(``start_load_kv``, synchronous: the forward reads them at once); a store
copies the other way after it (``wait_for_save``). Runs of consecutive ids on
both sides become one strided slice copy per layer and kind (K, V); on a
GPU, ids in many short runs go through one gather/scatter per layer instead. With tensor parallelism each
worker copies its own heads' share of every page.

A partitioned arena (per-tenant ``arena-partition``s) has no file to open: over
a ``unix://`` URL the worker maps this user's partitions through ``PFXATTACH``
(descriptors over the socket, each partition at its block offset), and pages
of namespaces outside them move over RESP, job by job.

When the plan carries no arena (the daemon is on another host, or cannot be
mapped) the same pages travel over RESP: ``PFXGET ... NOLEASE WITHDATA`` for a
load, ``PFXSET ... OFFSET DATA`` for a store, on this worker's own connection.

Nothing here raises into vLLM: a load that cannot be done is reported as
failed blocks (vLLM recomputes them), a store that cannot be done is skipped;
both are counted and logged once per cause.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import torch

from ..arena import kv_buffer
from ..errors import AttachError
from ..partitioned import PartitionedArenaView
from .layout import PageGeometry
from .once import LogOnce
from .plan import LoadJob, StepPlan, WorkerReport

_LAYER_INDEX = re.compile(r"\.(\d+)\.")


def _layer_order(name: str) -> tuple[int, str]:
    match = _LAYER_INDEX.search(f".{name}.")
    return (int(match.group(1)) if match else 1 << 30, name)


def paged_kv_views(kv: torch.Tensor, block_size: int, heads: int, head_dim: int,
                   cpu_isa: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's paged KV tensor of one layer as two views (keys, values), ``[blocks, heads, <token, dim>]``.

    The trailing dimensions enumerate a block's tokens, then their head
    dimensions, in order: ``(block_size, head_dim)``, or a split of both when
    the kernel interleaves them (so that the view needs no copy). The page
    side is viewed with the same trailing shape (:meth:`WorkerHalf._page_views`).

    Layouts known: the CPU backend's ``[blocks, heads, block_size, 2 *
    head_dim]`` (per block and head, the keys then the values, in the order
    the attention kernel of ``cpu_isa`` writes them: ``vec``: keys
    ``[head_dim, block_size]``, values ``[block_size, head_dim]``; ``amx``
    (bfloat16): keys as 4-byte pairs of dims in groups of 16 tokens, values as
    pairs of tokens in groups of 16 dims -- csrc/cpu/cpu_attn_vec.hpp and
    cpu_attn_amx.hpp); FlashAttention's ``[2, blocks, block_size, heads,
    head_dim]``; FlashInfer's ``[blocks, 2, block_size, heads, head_dim]`` (NHD)
    and ``[blocks, 2, heads, block_size, head_dim]`` (HND). Anything else is a
    ValueError naming the shape.
    """
    shape = tuple(kv.shape)
    n, h, d = block_size, heads, head_dim
    if kv.dim() == 4 and shape[1:] == (h, n, 2 * d) and kv.is_contiguous():
        blocks = shape[0]
        halves = kv.view(blocks, h, 2, n * d)
        keys, values = halves[:, :, 0], halves[:, :, 1]
        if cpu_isa == "vec":
            return keys.view(blocks, h, d, n).transpose(2, 3), values.view(blocks, h, n, d)
        if cpu_isa == "amx" and kv.element_size() == 2 and n % 16 == 0 and d % 16 == 0:
            # keys: [token group, dim pair, 16 tokens, 2 dims]; values: [dim group, token pair, 16 dims, 2 tokens]
            k = keys.view(blocks, h, n // 16, d // 2, 16, 2).permute(0, 1, 2, 4, 3, 5)
            v = values.view(blocks, h, d // 16, n // 2, 16, 2).permute(0, 1, 3, 5, 2, 4)
            return k, v
        raise ValueError(f"vLLM's CPU attention kernel {cpu_isa!r} keeps a KV layout pfxcache does not know "
                         "(known: vec, amx with bfloat16)")
    if kv.dim() == 5:
        if shape[0] == 2 and shape[2:] == (n, h, d):
            return kv[0].permute(0, 2, 1, 3), kv[1].permute(0, 2, 1, 3)
        if shape[1] == 2 and shape[2:] == (n, h, d):
            return kv[:, 0].permute(0, 2, 1, 3), kv[:, 1].permute(0, 2, 1, 3)
        if shape[1] == 2 and shape[2:] == (h, n, d):
            return kv[:, 0], kv[:, 1]
    raise ValueError(f"unknown paged KV layout {shape} (block_size {n}, {h} kv heads, head_dim {d})")


def _contiguous_run(view: torch.Tensor) -> int:
    """Elements of one block that lie contiguously in memory in the view's own order (from the last dim)."""
    run, expected = 1, 1
    for dim in range(view.dim() - 1, 0, -1):
        if view.stride(dim) != expected and view.size(dim) != 1:
            break
        run *= view.size(dim)
        expected *= view.size(dim)
    return run


def _joint_view(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor | None:
    """Keys and values as one view ``[blocks, 2, ...]`` when the values are the keys shifted by a fixed
    number of elements (same shape and strides), else None."""
    if keys.shape != values.shape or keys.stride() != values.stride() or keys.dtype != values.dtype:
        return None
    shift = values.storage_offset() - keys.storage_offset()
    if shift <= 0 or keys.untyped_storage().data_ptr() != values.untyped_storage().data_ptr():
        return None
    return keys.as_strided((keys.shape[0], 2, *keys.shape[1:]), (keys.stride(0), shift, *keys.stride()[1:]),
                           keys.storage_offset())


def _runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
    """(src start, dst start, length) for the runs where both id lists go up by one together."""
    runs: list[tuple[int, int, int]] = []
    for s, t in zip(src, dst):
        if runs and s == runs[-1][0] + runs[-1][2] and t == runs[-1][1] + runs[-1][2]:
            first_s, first_t, length = runs[-1]
            runs[-1] = (first_s, first_t, length + 1)
        else:
            runs.append((s, t, 1))
    return runs


class _Kind:
    """One layer's keys or values on vLLM's side, with what the copies need, worked out once."""

    __slots__ = ("view", "physical", "order", "direct")

    def __init__(self, view: torch.Tensor) -> None:
        self.view = view
        # vLLM's memory order (contiguous per block), and whether the view's own order keeps runs long
        # enough (256 bytes) for a plain strided copy to run at memory speed.
        self.order = [0, *sorted(range(1, view.dim()), key=lambda d: -view.stride(d))]
        self.physical = view.permute(self.order)
        self.direct = _contiguous_run(view) * view.element_size() >= 256


class WorkerHalf:
    """Copies for one worker. ``tp_rank``/``tp_size``: which share of the kv heads this worker holds.

    ``open_arena``: maps PFXINFO's arena map to a view with ``torch_blocks``
    (default :func:`pfxcache.client.arena.open_arena`; tests pass one built on
    the CuPy stand-in). ``connect``: a URL -> PrefixCache factory for the RESP
    path (default ``PrefixCache.from_url(url, attach=False)``).
    """

    def __init__(self, geometry: PageGeometry, *, tp_rank: int = 0, tp_size: int = 1,
                 open_arena: Callable[[dict], Any] | None = None,
                 connect: Callable[[str], Any] | None = None, socket_timeout: float = 5.0,
                 gather: bool | None = None) -> None:
        if geometry.kv_heads % tp_size:
            raise ValueError(f"{geometry.kv_heads} kv heads do not split over {tp_size} tensor-parallel workers")
        self.geometry = geometry
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.local_heads = geometry.kv_heads // tp_size
        self._heads = slice(tp_rank * self.local_heads, (tp_rank + 1) * self.local_heads)
        self._dtype = getattr(torch, geometry.dtype)
        self._open_arena = open_arena
        self._connect = connect
        self._socket_timeout = socket_timeout
        self._gather = gather    # scattered ids by gather/scatter (None: on a GPU only; tests force it)
        self._layers: list[tuple[torch.Tensor, torch.Tensor]] = []   # per layer: vLLM's (keys, values) views
        self._kinds: list[tuple[_Kind, _Kind]] = []
        self._page_cache: tuple[Any, list] | None = None     # (pages tensor, its per-layer views)
        self._arena_key: Any = None
        self._arena_view: Any = None
        self._pages: torch.Tensor | None = None   # the arena as [nblocks, L, 2, H, page, D]
        self._arena_error: str | None = None
        self._resp: Any = None
        self._resp_url = ""
        self._failed_blocks: set[int] = set()
        self._buffers: dict[Any, torch.Tensor] = {}
        self._report = WorkerReport()
        self._warn = LogOnce()

    # -- vLLM's KV ---------------------------------------------------------------------------------

    def register(self, kv_caches: dict[str, torch.Tensor], cpu_isa: str | None = None) -> None:
        """Take vLLM's per-layer paged KV tensors (layer order from their names); ``cpu_isa``: the CPU
        attention kernel's (its KV layout depends on it)."""
        names = sorted(kv_caches, key=_layer_order)
        g = self.geometry
        if len(names) != g.layers:
            raise ValueError(f"vLLM registered {len(names)} KV layers; the page layout has {g.layers}")
        views = []
        for name in names:
            tensor = kv_caches[name]
            if tensor.dtype != self._dtype:
                raise ValueError(f"layer {name} keeps KV in {tensor.dtype}; the page layout is {g.dtype} "
                                 "(set kv_cache_dtype auto)")
            views.append(paged_kv_views(tensor, g.page_size, self.local_heads, g.head_dim, cpu_isa))
        self._layers = views
        self._kinds = []
        for keys, values in views:
            joint = _joint_view(keys, values)
            kinds = (_Kind(keys), _Kind(values))
            # Keys and values kept alike, at a fixed distance: one copy moves both (half the calls, and
            # for HND-like layouts runs twice as long).
            self._kinds.append((_Kind(joint),) if joint is not None and all(k.direct for k in kinds) else kinds)

    # -- the arena ---------------------------------------------------------------------------------

    def _arena_pages(self, arena: dict, url: str = "") -> torch.Tensor | None:
        """The arena of ``arena`` (PFXINFO's map) as page tensors, mapped on first sight; None if it cannot be.

        A partitioned arena (the scheduler marked it ``attach``) is mapped through PFXATTACH over ``url``'s
        unix socket: only this user's partitions, each at its block offset; ``_maps`` says which blocks."""
        key = (arena.get("backend"), arena.get("path"), arena.get("handle"), arena.get("pid"), arena.get("size"),
               arena.get("id"), url if arena.get("attach") else None)
        if key == self._arena_key:
            return self._pages
        self._close_arena()
        self._arena_key = key
        g = self.geometry
        try:
            if int(arena["block_bytes"]) != g.block_bytes:
                raise ValueError(f"arena blocks are {arena['block_bytes']} bytes, pages {g.block_bytes}")
            if arena.get("attach"):
                view = PartitionedArenaView.attach_url(url)
                if view.arena_id != arena.get("id"):
                    view.close()
                    raise AttachError("the daemon's arena changed since the scheduler read it (a restart)")
                raw = torch.from_numpy(view.array)  # the whole range: blocks outside the partitions never used
            else:
                opener = self._open_arena
                if opener is None:
                    from pfxcache.client.arena import open_arena as opener
                view = opener(arena)
                raw = view.torch_blocks(range(int(arena["nblocks"])))
            self._arena_view = view
            self._pages = raw.view(self._dtype).view(int(arena["nblocks"]), *g.shape)
            self._arena_error = None
        except Exception as exc:  # AttachError, no CuPy, wrong size...: RESP instead
            self._arena_error = f"{type(exc).__name__}: {exc}"
            self._warn(f"attach:{key}", "pfxcache: cannot map the daemon's arena here (%s); moving KV over RESP",
                       self._arena_error)
            self._pages = None
        return self._pages

    def _maps(self, ids: list[int], write: bool = False) -> bool:
        """Whether the mapped arena holds every block of ``ids`` (writable, with ``write``): a partitioned
        view maps only this user's partitions, and the rest of its range must never be read or written."""
        maps = getattr(self._arena_view, "maps", None)
        return maps is None or maps(ids, write)

    def _close_arena(self) -> None:
        self._pages = None
        self._page_cache = None
        if self._arena_view is not None:
            try:
                self._arena_view.close()
            except Exception:
                pass
            self._arena_view = None

    # -- copies ------------------------------------------------------------------------------------

    def _page_views(self, pages: torch.Tensor, layer: int) -> tuple[torch.Tensor, ...]:
        """This worker's heads of every page's keys and values of ``layer``, shaped like vLLM's views
        (one view of both when the layer copies them together)."""
        keys_view, values_view = self._layers[layer]
        count = pages.shape[0]
        if self._kinds and len(self._kinds[layer]) == 1:
            return (pages[:, layer, :, self._heads].view(count, 2, self.local_heads, *keys_view.shape[2:]),)
        keys = pages[:, layer, 0, self._heads].view(count, self.local_heads, *keys_view.shape[2:])
        values = pages[:, layer, 1, self._heads].view(count, self.local_heads, *values_view.shape[2:])
        return keys, values

    def _all_page_views(self, pages: torch.Tensor) -> list:
        """:meth:`_page_views` of every layer, kept for the mapped arena (made once, not every step)."""
        cached = self._page_cache
        if cached is not None and cached[0] is pages:
            return cached[1]
        views = [self._page_views(pages, layer) for layer in range(len(self._layers))]
        if pages is self._pages:
            self._page_cache = (pages, views)
        return views

    def _scratch(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A contiguous tensor of ``shape`` over a buffer kept between copies (no allocation per step)."""
        numel = 1
        for size in shape:
            numel *= size
        buffer = self._buffers.get(like.device)
        if buffer is None or buffer.numel() < numel:
            if like.device.type == "cpu":  # page-aligned: copies to and from the arena run at memcpy speed
                buffer = kv_buffer(numel, like.dtype)
            else:
                buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._buffers[like.device] = buffer
        return buffer[:numel].view(shape)

    def _copy_kind(self, kind: _Kind, page_view: torch.Tensor, runs: list[tuple[int, int, int]],
                   index: tuple[torch.Tensor, torch.Tensor] | None, to_vllm: bool) -> None:
        """One layer's keys (or values): pages <-> vLLM blocks, by slices of runs or by index.

        When vLLM's kernel keeps the block's elements in another order than
        the page (transposed or interleaved keys), a strided copy between two
        strided views is very slow (~1 GB/s on CPU); a copy that transposes
        into a contiguous buffer, then a plain one, is several times faster.
        So such copies go through a scratch buffer: the transposition always
        writes contiguous memory, the other copy keeps whole contiguous runs.
        """
        view, physical, order = kind.view, kind.physical, kind.order
        if index is not None:
            page_index, vllm_index = index
            if to_vllm:
                pages = page_view.index_select(0, page_index).to(view.device)
                view.index_copy_(0, vllm_index, pages) if kind.direct else \
                    physical.index_copy_(0, vllm_index, pages.permute(order).contiguous())
            else:
                back = [order.index(d) for d in range(view.dim())]
                blocks = view.index_select(0, vllm_index) if kind.direct else \
                    physical.index_select(0, vllm_index).permute(back).contiguous()
                page_view.index_copy_(0, page_index, blocks.to(page_view.device))
            return
        for src, dst, length in runs:
            pages, blocks = page_view[src:src + length], view[dst:dst + length]
            if kind.direct:
                (blocks.copy_(pages) if to_vllm else pages.copy_(blocks))
            elif to_vllm:
                scratch = self._scratch((length, *physical.shape[1:]), pages)
                scratch.copy_(pages.permute(order))          # transpose into contiguous memory
                physical[dst:dst + length].copy_(scratch)    # then whole runs
            else:
                scratch = self._scratch((length, *blocks.shape[1:]), pages)
                scratch.copy_(blocks)                        # transpose into contiguous memory
                pages.copy_(scratch)

    def _copy(self, pages: torch.Tensor, page_ids: list[int], vllm_ids: list[int], to_vllm: bool) -> int:
        """Between pages[page_ids] (this worker's heads) and vLLM's blocks vllm_ids, every layer; returns bytes.

        Runs of ids consecutive on both sides are slice copies; on a GPU, many
        short runs are one gather and one scatter per layer and kind instead.
        """
        runs = _runs(page_ids, vllm_ids)
        index = None
        # On a GPU many short runs are many kernel launches: one gather/scatter is better. On the CPU
        # index_copy_ into a strided view of vLLM's whole cache costs milliseconds whatever the count,
        # while a slice copy per run costs microseconds: runs, always.
        gather = pages.is_cuda if self._gather is None else self._gather
        if gather and not (len(runs) * 4 <= len(page_ids) or len(runs) <= 2):
            index = (torch.tensor(page_ids, device=pages.device),
                     torch.tensor(vllm_ids, device=self._layers[0][0].device))
        for kinds, page_views in zip(self._kinds, self._all_page_views(pages)):
            for kind, page_view in zip(kinds, page_views):
                self._copy_kind(kind, page_view, runs, index, to_vllm)
        return len(page_ids) * self.geometry.block_bytes // self.tp_size

    def _to_vllm(self, pages: torch.Tensor, page_ids: list[int], vllm_ids: list[int]) -> int:
        moved = self._copy(pages, page_ids, vllm_ids, to_vllm=True)
        self._sync(pages)
        return moved

    def _from_vllm(self, vllm_ids: list[int], pages: torch.Tensor, page_ids: list[int]) -> int:
        moved = self._copy(pages, page_ids, vllm_ids, to_vllm=False)
        self._sync(pages)
        return moved

    def _sync(self, pages: torch.Tensor) -> None:
        """On a GPU the copies are queued: wait for them, so that a lease is checked after the copy really
        ended and stored blocks are complete before the scheduler commits them for other processes."""
        for tensor in (pages, self._layers[0][0] if self._layers else pages):
            if tensor.is_cuda:
                torch.cuda.current_stream(tensor.device).synchronize()

    # -- RESP --------------------------------------------------------------------------------------

    def _connection(self, url: str) -> Any:
        if self._resp is None or self._resp_url != url:
            if self._resp is not None:
                self._resp.close()
            if self._connect is not None:
                self._resp = self._connect(url)
            else:
                from pfxcache.client import PrefixCache

                self._resp = PrefixCache.from_url(url, attach=False, socket_timeout=self._socket_timeout,
                                                  socket_connect_timeout=self._socket_timeout)
            self._resp_url = url
        return self._resp

    def _drop_connection(self) -> None:
        if self._resp is not None:
            try:
                self._resp.close()
            except Exception:
                pass
        self._resp = None

    def _page_tensor(self, data: bytes, npages: int) -> torch.Tensor:
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return flat.view(self._dtype).view(npages, *self.geometry.shape)

    # -- one step ----------------------------------------------------------------------------------

    def _count(self, name: str, value: float) -> None:
        self._report.counters[name] = self._report.counters.get(name, 0) + value

    def _fail_load(self, job: LoadJob, from_page: int, cause: str, message: str, *args: Any) -> None:
        self._failed_blocks.update(job.vllm_blocks[from_page:])
        self._report.failed_loads[job.req_id] = 1
        self._count("load_failures", 1)
        self._warn(cause, message, *args)

    def load(self, plan: StepPlan) -> None:
        """Copy every load job of the plan into vLLM's blocks (before the forward pass)."""
        arena = self._arena_pages(plan.arena, plan.url) if plan.arena is not None else None
        for job in plan.loads:
            started = time.perf_counter()
            pages = arena if arena is not None and self._maps(job.arena_blocks) else None
            try:
                if pages is not None:
                    moved = self._to_vllm(pages, job.arena_blocks, job.vllm_blocks)
                    if time.monotonic() > job.valid_until:
                        # The lease may have ended during the copy: those bytes may be another page's.
                        self._fail_load(job, 0, "lease", "pfxcache: a load outlived its lease (lease_ttl_ms too "
                                        "short for this engine?); vLLM recomputes those tokens")
                        continue
                else:
                    match = self._connection(plan.url).lookup(job.namespace, job.tokens, lease=False,
                                                             with_data=True)
                    have = min(match.matched_tokens // self.geometry.page_size - job.first_page,
                               len(job.vllm_blocks))
                    moved = 0
                    if have > 0:
                        data = memoryview(match.data)[job.first_page * self.geometry.block_bytes:]
                        buffer = self._page_tensor(bytes(data[: have * self.geometry.block_bytes]), have)
                        moved = self._to_vllm(buffer, list(range(have)), job.vllm_blocks[:have])
                    if have < len(job.vllm_blocks):
                        self._fail_load(job, max(have, 0), "short", "pfxcache: %d of %d pages were no longer "
                                        "cached when loaded over RESP; vLLM recomputes the rest",
                                        max(have, 0), len(job.vllm_blocks))
                        continue
            except Exception as exc:
                if pages is None:
                    self._drop_connection()
                self._fail_load(job, 0, f"load:{type(exc).__name__}", "pfxcache: load failed (%s: %s); vLLM "
                                "recomputes those tokens", type(exc).__name__, exc)
                continue
            self._report.loaded[job.req_id] = 1
            self._count("load_bytes", moved)
            self._count("load_pages", len(job.vllm_blocks))
            self._count("load_seconds", time.perf_counter() - started)

    def store(self, plan: StepPlan) -> None:
        """Copy every store job's pages out of vLLM's blocks (after the forward pass computed them)."""
        pages = self._arena_pages(plan.arena, plan.url) if plan.arena is not None else None
        for job in plan.stores:
            if job.req_id in self._report.failed_loads:
                # This step computed on top of pages that did not load: nothing it computed is right.
                self._report.failed_stores[job.req_id] = 1
                continue
            started = time.perf_counter()
            try:
                if job.arena_blocks:
                    if pages is None:
                        raise RuntimeError(f"the arena is not mapped here ({self._arena_error})")
                    if not self._maps(job.arena_blocks, write=True):
                        raise RuntimeError("the allocated blocks lie outside the writable partitions mapped here")
                    if time.monotonic() > job.valid_until:
                        raise TimeoutError("the allocation's lease may have ended; writing could hit reused blocks")
                    moved = self._from_vllm(job.vllm_blocks, pages, job.arena_blocks)
                else:
                    if self.tp_size > 1:
                        raise RuntimeError("storing over RESP needs whole pages: not with tensor parallelism")
                    buffer = kv_buffer((len(job.vllm_blocks), *self.geometry.shape), self._dtype)
                    moved = self._from_vllm(job.vllm_blocks, buffer, list(range(len(job.vllm_blocks))))
                    self._connection(plan.url).store(job.namespace, job.tokens, buffer.view(torch.uint8).numpy(),
                                                     offset=job.first_page * self.geometry.page_size)
            except Exception as exc:
                if not job.arena_blocks:
                    self._drop_connection()
                self._report.failed_stores[job.req_id] = 1
                self._count("store_failures", 1)
                self._warn(f"store:{type(exc).__name__}", "pfxcache: store skipped (%s: %s)", type(exc).__name__, exc)
                continue
            self._report.stored[job.req_id] = 1
            self._count("store_bytes", moved)
            self._count("store_pages", len(job.vllm_blocks))
            self._count("store_seconds", time.perf_counter() - started)

    def take_failed_blocks(self) -> set[int]:
        """vLLM block ids whose load failed since the last call (vLLM recomputes from the first of them)."""
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def take_report(self) -> WorkerReport | None:
        report, self._report = self._report, WorkerReport()
        return report if report else None

    def close(self) -> None:
        self._close_arena()
        self._drop_connection()
