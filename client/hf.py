"""Hugging Face ``transformers`` causal LMs served through the prefix cache (torch).

Install the ``hf`` extra (``redis``, ``numpy``, ``transformers``) and a torch
build of your choice. Nothing in :mod:`pfxcache.client` imports this module;
torch and transformers are imported here only.

Supported models: decoder-only causal LMs whose every layer keeps plain
full-attention keys and values in a ``DynamicCache`` (Llama, Mistral without
sliding window, Qwen2/3, Phi-3, Gemma without sliding layers, ...). Models with
sliding-window, linear-attention or state-space layers are refused: their
per-layer state is not a per-token K/V sequence.

Page layout
-----------

One page is ``page_size`` consecutive tokens; its block (``block_bytes`` bytes
in the daemon's arena) holds the keys and values every layer computed for
those tokens, as the model stores them (keys after RoPE), in the model's dtype,
C-contiguous, in this order::

    block = [layer 0: K, V][layer 1: K, V] ... [layer L-1: K, V]
    K, V  = [kv_heads, page_size, head_dim]       (dtype of the model)

i.e. the block is the tensor ``[layers, 2, kv_heads, page_size, head_dim]``
flattened, with index 0 of the second axis the keys and 1 the values, so::

    block_bytes = layers x 2 x kv_heads x page_size x head_dim x dtype_size

``kv_heads`` is ``num_key_value_heads`` (``num_attention_heads`` when the
config has none) and ``head_dim`` the config's ``head_dim`` (``hidden_size //
num_attention_heads`` when it has none). :func:`block_bytes_for` computes it;
the daemon must be started with that ``--block-bytes`` and the same
``--page-size`` (a Llama-3-8B in bfloat16 with 16-token pages: 32 x 2 x 8 x 16 x
128 x 2 = 2 MiB per block). The bytes depend on the weights, the dtype and the
absolute positions of the tokens, so a namespace must name all three: one
namespace per model checkpoint and dtype (and tenant, LoRA or cache salt), and
pages are only ever reused at the positions they were computed at (prefixes).

What it offers
--------------

* :func:`pages_from_cache` / :func:`cache_from_pages` convert between a
  model's past key/values for a token range and a ``(npages, block_bytes)``
  uint8 tensor of pages, the rows :meth:`PrefixCache.save` and the arena's
  ``read_into``/``write_from`` move.
* :func:`generate_with_cache` is the worker's whole turn: look the prompt up,
  load the cached pages into a ``DynamicCache`` (through the mapped arena, or
  over RESP), prefill only the rest, store the prompt's new full pages,
  release the lease, then decode greedily. :func:`generate_without_cache`
  runs the same prefill and decode with no cache, for comparison: both give
  the same tokens (the logits differ by float rounding only, as the prefill
  is split differently).

The last-token rule: the logits for the first generated token come from the
prompt's last position, so at least the last prompt token is always computed.
A lookup therefore covers at most the whole pages strictly before the last
token: a prompt of ``n`` tokens reuses at most ``(n - 1) // page_size`` pages
(all its full pages unless ``n`` is a multiple of the page size, then all but
the last one).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .arena import kv_buffer
from .errors import CacheFullError

__all__ = [
    "GenerationResult",
    "KVLayout",
    "block_bytes_for",
    "cache_from_pages",
    "generate_with_cache",
    "generate_without_cache",
    "greedy_generate",
    "kv_layout",
    "pages_from_cache",
]


# -- layout ------------------------------------------------------------------------------------------


def _dtype(dtype: Any) -> torch.dtype:
    """A torch dtype from a torch dtype or its name (``"bfloat16"``, ``"torch.float16"``)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        value = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(value, torch.dtype):
            return value
    raise TypeError(f"not a torch dtype: {dtype!r}")


def _text_config(config: Any) -> Any:
    getter = getattr(config, "get_text_config", None)
    if getter is None:
        return config
    try:
        return getter(decoder=True)
    except TypeError:  # older transformers: no decoder argument
        return getter()


@dataclass(frozen=True)
class KVLayout:
    """The geometry of one page's block: ``[layers, 2, kv_heads, page_size, head_dim]`` of ``dtype``."""

    layers: int
    kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype

    @property
    def dtype_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """One block as a tensor: (layers, 2 (K, V), kv_heads, page_size, head_dim)."""
        return (self.layers, 2, self.kv_heads, self.page_size, self.head_dim)

    @property
    def block_bytes(self) -> int:
        return self.layers * 2 * self.kv_heads * self.page_size * self.head_dim * self.dtype_size


def kv_layout(config: Any, page_size: int, dtype: Any = torch.float32) -> KVLayout:
    """The :class:`KVLayout` of a transformers config (a ``PretrainedConfig``) for ``page_size`` and ``dtype``.

    Raises ValueError for models whose layers do not all keep full-attention K/V
    (sliding-window, linear-attention or state-space layers).
    """
    if not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer, not {page_size!r}")
    text = _text_config(config)
    layer_types = getattr(text, "layer_types", None)
    if layer_types and any(kind != "full_attention" for kind in layer_types):
        odd = sorted({kind for kind in layer_types if kind != "full_attention"})
        raise ValueError(f"layers of type {', '.join(odd)} do not keep per-token K/V; only full-attention "
                         "models can be paged")
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True) and not layer_types:
        raise ValueError("sliding-window attention keeps only the last window of K/V; such models cannot be paged")
    heads = int(text.num_attention_heads)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return KVLayout(int(text.num_hidden_layers), int(kv_heads), int(head_dim), page_size, _dtype(dtype))


def block_bytes_for(config: Any, page_size: int, dtype: Any = torch.float32) -> int:
    """``--block-bytes`` for a model: layers x 2 x kv_heads x page_size x head_dim x dtype size."""
    return kv_layout(config, page_size, dtype).block_bytes


# -- past key/values <-> pages -------------------------------------------------------------------------


def _layer_kv(past_key_values: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, values) of one layer, ``[batch, kv_heads, seq, head_dim]``, from any cache shape."""
    layers = getattr(past_key_values, "layers", None)
    if layers is not None:  # transformers 5.x (and late 4.x): Cache.layers[i].keys / .values
        entry = layers[layer]
        return entry.keys, entry.values
    if hasattr(past_key_values, "key_cache"):  # transformers 4.4x DynamicCache
        return past_key_values.key_cache[layer], past_key_values.value_cache[layer]
    keys, values = past_key_values[layer][:2]  # the legacy tuple of (keys, values) per layer
    return keys, values


def _num_layers(past_key_values: Any) -> int:
    layers = getattr(past_key_values, "layers", None)
    if layers is not None:
        return len(layers)
    if hasattr(past_key_values, "key_cache"):
        return len(past_key_values.key_cache)
    return len(past_key_values)


def pages_from_cache(past_key_values: Any, start_token: int, end_token: int, page_size: int,
                     *, batch_index: int = 0) -> torch.Tensor:
    """The pages of tokens ``start_token..end_token`` of a model's past key/values, in the block layout.

    ``past_key_values``: a transformers ``DynamicCache`` (or the legacy tuple of
    per-layer ``(keys, values)``), ``[batch, kv_heads, seq, head_dim]`` per layer.
    Both token positions must be multiples of ``page_size`` and the cache must
    hold at least ``end_token`` tokens. Returns a C-contiguous
    ``(npages, block_bytes)`` ``torch.uint8`` tensor on the cache's device (a
    copy: the cache may go on growing): the argument ``src`` of
    :meth:`PrefixCache.save` or ``arena.write_from``.
    """
    if start_token % page_size or end_token % page_size or not 0 <= start_token <= end_token:
        raise ValueError(f"token range {start_token}..{end_token} is not whole pages of {page_size}")
    npages = (end_token - start_token) // page_size
    nlayers = _num_layers(past_key_values)
    parts = []
    for layer in range(nlayers):
        keys, values = _layer_kv(past_key_values, layer)
        if keys is None or keys.dim() != 4 or keys.shape[-2] < end_token:
            held = 0 if keys is None or keys.dim() != 4 else keys.shape[-2]
            raise ValueError(f"layer {layer} holds {held} tokens of K/V; tokens up to {end_token} are needed")
        for tensor in (keys, values):
            part = tensor[batch_index, :, start_token:end_token, :]          # [H, npages * page, D]
            heads, _, dim = part.shape
            parts.append(part.reshape(heads, npages, page_size, dim).transpose(0, 1))  # [P, H, page, D]
    if not parts:
        raise ValueError("the cache holds no layers")
    # [P, L * 2, H, page, D] -> [P, L, 2, H, page, D], contiguous per page.
    pages = torch.stack(parts, dim=1).contiguous()
    return pages.view(torch.uint8).reshape(npages, -1)


def cache_from_pages(pages: Any, config: Any, page_size: int, dtype: Any = torch.float32, *,
                     device: Any = None, cache: Any = None) -> Any:
    """A transformers ``DynamicCache`` holding the K/V of ``pages`` (the first ``len(pages) * page_size`` tokens).

    ``pages``: ``(npages, block_bytes)`` bytes in the block layout (uint8
    numpy array or torch tensor; any shape with that many bytes is taken as
    rows of ``block_bytes``). ``config``, ``page_size`` and ``dtype`` give the
    layout (:func:`kv_layout`). ``device``: where the K/V go (default: where
    ``pages`` is). ``cache``: an empty cache to fill instead of a new one.
    The K/V are copies, independent of ``pages``.
    """
    from transformers import DynamicCache

    layout = kv_layout(config, page_size, dtype)
    if isinstance(pages, np.ndarray):
        pages = torch.from_numpy(np.ascontiguousarray(pages).view(np.uint8))
    elif not isinstance(pages, torch.Tensor):
        pages = torch.frombuffer(bytearray(pages), dtype=torch.uint8)
    flat = pages.contiguous().reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    if flat.numel() % layout.block_bytes:
        raise ValueError(f"{flat.numel()} bytes are not whole blocks of {layout.block_bytes}")
    npages = flat.numel() // layout.block_bytes
    if device is not None:
        flat = flat.to(device)
    if cache is None:
        try:
            cache = DynamicCache(config=config)
        except TypeError:  # transformers 4.x: DynamicCache() takes no config
            cache = DynamicCache()
    if npages == 0:
        return cache
    # [P, L, 2, H, page, D] -> [L, 2, H, P, page, D] -> per layer [1, H, P * page, D]
    blocks = flat.view(layout.dtype).reshape(npages, *layout.shape).permute(1, 2, 3, 0, 4, 5)
    seq = npages * page_size
    for layer in range(layout.layers):
        keys = blocks[layer, 0].reshape(layout.kv_heads, seq, layout.head_dim).unsqueeze(0).clone()
        values = blocks[layer, 1].reshape(layout.kv_heads, seq, layout.head_dim).unsqueeze(0).clone()
        cache.update(keys, values, layer)
    return cache


# -- generation ------------------------------------------------------------------------------------------


@dataclass
class GenerationResult:
    """One prompt's turn: what was generated and what the cache saved.

    ``tokens``: the generated ids (greedy). ``reused_tokens``: prompt tokens whose
    K/V came from the cache; ``computed_tokens``: the prompt tokens the prefill
    computed (prompt - reused). ``stored_pages``: pages this turn added to the
    cache (``existing_pages``: pages it offered that another worker had cached
    meanwhile). ``load_seconds``: lookup + copy of the pages + building the
    model's cache; ``prefill_seconds``: the forward pass over the computed
    tokens; ``store_seconds``: extracting and storing the new pages;
    ``decode_seconds``: the decode loop. ``prefill_logits``: the logits of the
    prompt's last position (float32, CPU), which chose the first token;
    ``logits``: every step's logits ``(len(tokens), vocab)`` when asked for.
    ``via``: how the bytes moved (``"shm"``, ``"cuda"``, ``"resp"``, or
    ``None`` without a cache).
    """

    tokens: list[int]
    prompt_tokens: int
    reused_tokens: int = 0
    computed_tokens: int = 0
    stored_pages: int = 0
    existing_pages: int = 0
    load_seconds: float = 0.0
    prefill_seconds: float = 0.0
    store_seconds: float = 0.0
    decode_seconds: float = 0.0
    prefill_logits: torch.Tensor | None = field(default=None, repr=False)
    logits: torch.Tensor | None = field(default=None, repr=False)
    via: str | None = None
    cache_full: bool = False

    @property
    def hit_rate(self) -> float:
        """Reused prompt tokens / prompt tokens."""
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def time_to_first_token(self) -> float:
        """Seconds until the first generated token was known: load + prefill."""
        return self.load_seconds + self.prefill_seconds


def _token_list(input_ids: Any) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError("one prompt at a time: input_ids must be [1, n] or [n]")
            input_ids = input_ids[0]
        return [int(t) for t in input_ids.tolist()]
    array = np.asarray(input_ids)
    if array.ndim == 2:
        if array.shape[0] != 1:
            raise ValueError("one prompt at a time: input_ids must be [1, n] or [n]")
        array = array[0]
    return [int(t) for t in array.tolist()]


def _cache_kwarg(model: Any) -> tuple[str, dict[str, int]]:
    """How the model's forward takes its KV cache (``cache`` in transformers 5.x, ``past_key_values``
    before) and asks for the last position's logits only (``logits_to_keep``, ``num_logits_to_keep``)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    name = "cache" if "cache" in params else "past_key_values"
    keep = next(({kw: 1} for kw in ("logits_to_keep", "num_logits_to_keep") if kw in params), {})
    return name, keep


def _model_dtype(model: Any) -> torch.dtype:
    return next(model.parameters()).dtype


def _model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _empty_cache(model: Any) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


def _forward(model: Any, ids: list[int], past: Any, start: int, cache_kw: tuple[str, dict[str, int]]) -> torch.Tensor:
    """Run ``ids`` at positions ``start..`` on top of ``past`` (updated in place); the last position's logits."""
    device = _model_device(model)
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    position_ids = torch.arange(start, start + len(ids), dtype=torch.long, device=device).unsqueeze(0)
    name, keep = cache_kw
    out = model(input_ids=input_ids, position_ids=position_ids, use_cache=True, **keep, **{name: past})
    return out.logits[0, -1].float()


def _decode(model: Any, past: Any, first_logits: torch.Tensor, position: int, max_new_tokens: int,
            eos_token_id: Any, keep_logits: bool, cache_kw: Any) -> tuple[list[int], torch.Tensor | None]:
    """Greedy decoding from the prefill's last logits; ``position`` is the next token's position."""
    stop = set() if eos_token_id is None else (
        {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(t) for t in eos_token_id})
    tokens: list[int] = []
    steps: list[torch.Tensor] = []
    logits = first_logits
    for step in range(max_new_tokens):
        if keep_logits:
            steps.append(logits.cpu())
        token = int(torch.argmax(logits))
        tokens.append(token)
        if token in stop or step == max_new_tokens - 1:
            break
        logits = _forward(model, [token], past, position, cache_kw)
        position += 1
    return tokens, (torch.stack(steps) if keep_logits and steps else None)


def _check_model(model: Any, ids: list[int], max_new_tokens: int) -> None:
    if not ids:
        raise ValueError("the prompt is empty")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    if getattr(model, "training", False):
        raise ValueError("the model is in training mode: call model.eval() (dropout would change every run)")


@torch.no_grad()
def generate_without_cache(model: Any, input_ids: Any, max_new_tokens: int, *, eos_token_id: Any = None,
                           keep_logits: bool = False) -> GenerationResult:
    """The reference: prefill the whole prompt, then the same greedy decoding as :func:`generate_with_cache`."""
    ids = _token_list(input_ids)
    _check_model(model, ids, max_new_tokens)
    cache_kw = _cache_kwarg(model)
    device = _model_device(model)
    past = _empty_cache(model)
    started = time.perf_counter()
    last = _forward(model, ids, past, 0, cache_kw)
    _sync(device)
    prefill = time.perf_counter() - started
    started = time.perf_counter()
    tokens, logits = _decode(model, past, last, len(ids), max_new_tokens, eos_token_id, keep_logits, cache_kw)
    _sync(device)
    return GenerationResult(tokens=tokens, prompt_tokens=len(ids), computed_tokens=len(ids),
                            prefill_seconds=prefill, decode_seconds=time.perf_counter() - started,
                            prefill_logits=last.cpu(), logits=logits)


def greedy_generate(model: Any, input_ids: Any, max_new_tokens: int, **kwargs: Any) -> list[int]:
    """The generated ids of :func:`generate_without_cache` (a plain greedy decode)."""
    return generate_without_cache(model, input_ids, max_new_tokens, **kwargs).tokens


@torch.no_grad()
def generate_with_cache(model: Any, cache: Any, namespace: Any, input_ids: Any, max_new_tokens: int, *,
                        page_size: int | None = None, eos_token_id: Any = None, keep_logits: bool = False,
                        store: bool = True, ttl_ms: int | None = None) -> GenerationResult:
    """Greedy generation for one prompt, reusing and feeding the prefix cache.

    1. Look up the prompt's whole pages before its last token (the last-token
       rule, module docstring) in ``namespace``; the matched pages stay pinned
       by the lookup's lease until step 4.
    2. Copy them into a new ``DynamicCache``: straight from the mapped arena
       (``arena.read_into``) when the cache is attached, from the ``WITHDATA``
       reply over RESP otherwise.
    3. Prefill only the remaining prompt tokens, at positions ``reused..n-1``.
    4. Store the prompt's full pages the cache lacks (``save``: alloc +
       ``write_from`` + commit when attached, ``PFXSET DATA`` otherwise; a full
       cache (``CacheFullError``) only skips the store, flagged in
       ``cache_full``), then release the lease.
    5. Decode ``max_new_tokens`` tokens greedily (fewer when ``eos_token_id``
       comes).

    ``cache``: a :class:`pfxcache.client.PrefixCache`. ``namespace`` must name the
    model, its dtype and the tenant (module docstring). ``page_size``: checked
    against the daemon's when given; the daemon's ``block-bytes`` must be
    :func:`block_bytes_for` the model (ValueError otherwise). ``store=False``
    only reads the cache. ``input_ids``: one prompt, ``[n]`` or ``[1, n]``.
    The model must be in eval mode.
    """
    ids = _token_list(input_ids)
    _check_model(model, ids, max_new_tokens)
    cache_kw = _cache_kwarg(model)
    device = _model_device(model)
    dtype = _model_dtype(model)

    started = time.perf_counter()
    _ = cache.attached  # maps the arena when it can (and reads the daemon's geometry once)
    info = cache.geometry if cache.geometry is not None else cache.info()
    page = info.page_size
    if page_size is not None and page_size != page:
        raise ValueError(f"page_size {page_size} but the daemon's page-size is {page}")
    layout = kv_layout(model.config, page, dtype)
    if layout.block_bytes != info.block_bytes:
        raise ValueError(f"the daemon's block-bytes is {info.block_bytes}; this model ({layout.layers} layers x 2 x "
                         f"{layout.kv_heads} kv heads x {page} tokens x {layout.head_dim} head dim x "
                         f"{layout.dtype_size} bytes of {dtype}) needs --block-bytes {layout.block_bytes}")

    usable = (len(ids) - 1) // page * page       # whole pages before the last token
    full = len(ids) // page * page               # whole pages of the prompt
    match = None
    reused = 0
    try:
        if usable:
            match = cache.lookup(namespace, ids[:usable], lease=True, ttl_ms=ttl_ms)
            reused = match.matched_tokens
        if reused:
            if torch.device(device).type == "cpu":  # page-aligned: the arena copy runs at memcpy speed
                buffer = kv_buffer((reused // page, info.block_bytes), torch=True)
            else:
                buffer = torch.empty((reused // page, info.block_bytes), dtype=torch.uint8, device=device)
            if match.data is not None:
                via = "resp"
                data = torch.frombuffer(bytearray(match.data), dtype=torch.uint8)
                buffer.reshape(-1).copy_(data)
            else:
                via = cache.arena.backend
                cache.arena.read_into(match.blocks, buffer)
            past = cache_from_pages(buffer, model.config, page, dtype, cache=_empty_cache(model))
        else:
            via = cache.via
            past = _empty_cache(model)
        _sync(device)
        load = time.perf_counter() - started

        started = time.perf_counter()
        last = _forward(model, ids[reused:], past, reused, cache_kw)
        _sync(device)
        prefill = time.perf_counter() - started

        started = time.perf_counter()
        stored = existing = 0
        full_cache = False
        if store and full > reused:
            pages = pages_from_cache(past, reused, full, page)
            try:
                result = cache.save(namespace, ids[:full], pages, offset=reused, ttl_ms=ttl_ms)
                stored, existing = result.stored, result.existing
            except CacheFullError:
                full_cache = True
        store_seconds = time.perf_counter() - started
    finally:
        if match is not None:
            match.release()

    started = time.perf_counter()
    tokens, logits = _decode(model, past, last, len(ids), max_new_tokens, eos_token_id, keep_logits, cache_kw)
    _sync(device)
    return GenerationResult(tokens=tokens, prompt_tokens=len(ids), reused_tokens=reused,
                            computed_tokens=len(ids) - reused, stored_pages=stored, existing_pages=existing,
                            load_seconds=load, prefill_seconds=prefill, store_seconds=store_seconds,
                            decode_seconds=time.perf_counter() - started, prefill_logits=last.cpu(),
                            logits=logits, via=via, cache_full=full_cache)
