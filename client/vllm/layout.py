"""The page layout vLLM's KV is stored in, the daemon geometry it needs, and the namespace of a request.

Imports neither vLLM nor torch: the geometry helper runs anywhere a model's
``config.json`` is (``python -m pfxcache.client.vllm MODEL_DIR``).

One layout for every integration (the one :mod:`pfxcache.client.hf`
documents): a page of ``page_size`` tokens is one arena block holding, for each
layer in order, the keys then the values of those tokens, each
``[kv_heads, page_size, head_dim]`` in the model's dtype, contiguous::

    block = tensor[layers, 2, kv_heads, page_size, head_dim]
    block-bytes = layers x 2 x kv_heads x page_size x head_dim x dtype size

whatever vLLM's own paged layout is (the worker half converts while it
copies). The daemon's ``page-size`` must equal vLLM's ``block_size``: one
vLLM block is one daemon page.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

# bytes per element of the dtypes vLLM serves KV in (names as torch and vLLM spell them)
DTYPE_SIZES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` / ``"bfloat16"`` / ``"torch.float16"`` -> ``"bfloat16"`` / ``"float16"``."""
    name = str(dtype).removeprefix("torch.")
    name = {"float": "float32", "half": "float16"}.get(name, name)
    if name not in DTYPE_SIZES:
        raise ValueError(f"KV dtype {dtype!r} is not one the page layout covers ({', '.join(sorted(DTYPE_SIZES))})")
    return name


@dataclass(frozen=True)
class PageGeometry:
    """The shape of one page's block: ``[layers, 2, kv_heads, page_size, head_dim]`` of ``dtype``."""

    layers: int
    kv_heads: int
    head_dim: int
    page_size: int
    dtype: str

    @property
    def dtype_size(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.layers, 2, self.kv_heads, self.page_size, self.head_dim)

    @property
    def block_bytes(self) -> int:
        return self.layers * 2 * self.kv_heads * self.page_size * self.head_dim * self.dtype_size

    def daemon_args(self) -> str:
        """The directives the daemon must be started with for this model."""
        return f"--page-size {self.page_size} --block-bytes {self.block_bytes}"

    def describe(self) -> str:
        return (f"{self.layers} layers x 2 x {self.kv_heads} kv heads x {self.page_size} tokens x "
                f"{self.head_dim} head dim x {self.dtype_size} bytes ({self.dtype})")

    def check_daemon(self, page_size: int, block_bytes: int, url: str = "the daemon") -> None:
        """ValueError naming the daemon directives this model needs when the daemon's geometry differs."""
        if page_size == self.page_size and block_bytes == self.block_bytes:
            return
        raise ValueError(
            f"pfxcache at {url} has page-size {page_size} and block-bytes {block_bytes}; this vLLM engine "
            f"({self.describe()}, block_size {self.page_size}) needs a daemon started with {self.daemon_args()}")


def _text_config(config: dict) -> dict:
    """The language model's part of a config (multimodal configs nest it)."""
    for key in ("text_config", "language_config", "llm_config"):
        inner = config.get(key)
        if isinstance(inner, dict) and "num_hidden_layers" in inner:
            return inner
    return config


def geometry_from_config(config: dict, page_size: int, dtype: Any = None) -> PageGeometry:
    """The page geometry of a Hugging Face ``config.json`` (as a dict) for vLLM's ``block_size``.

    ``dtype``: the KV dtype vLLM runs the model in (default: the config's
    ``torch_dtype``/``dtype``; float32 when it names none).
    """
    if not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"block_size must be a positive integer, not {page_size!r}")
    text = _text_config(config)
    try:
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
    except KeyError as exc:
        raise ValueError(f"the model config has no {exc.args[0]}: not a decoder the page layout covers") from None
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or text["hidden_size"] // heads)
    if dtype is None or str(dtype) == "auto":
        dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "float32"
    return PageGeometry(layers, kv_heads, head_dim, page_size, dtype_name(dtype))


def geometry_for_model(model_dir: str, page_size: int, dtype: Any = None) -> PageGeometry:
    """:func:`geometry_from_config` of ``model_dir/config.json``."""
    path = os.path.join(model_dir, "config.json") if os.path.isdir(model_dir) else model_dir
    with open(path, encoding="utf-8") as handle:
        return geometry_from_config(json.load(handle), page_size, dtype)


# -- namespaces -------------------------------------------------------------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def base_namespace(model: str, dtype: Any, page_size: int) -> str:
    """The namespace of a model's pages: ``vllm:<model>:<dtype>:p<page>``.

    ``model`` is what vLLM was given (a hub name or a path); a path is made
    absolute so two spellings of one directory share pages while two
    directories never do. Long or odd names are hashed to keep keys short.
    """
    name = os.path.abspath(model) if os.path.exists(model) else model
    if len(name) > 120 or any(c.isspace() for c in name):
        name = f"{os.path.basename(name.rstrip('/'))[:40]}#{_digest(name)}"
    return f"vllm:{name}:{dtype_name(dtype)}:p{page_size}"


def request_namespace(base: str, cache_salt: str | None = None, lora_name: str | None = None) -> str:
    """``base`` with a request's tenant salt and LoRA adapter folded in (so neither ever shares pages).

    The salt is hashed: it is a tenant's secret (vLLM's ``cache_salt``) and must
    not show up in ``INFO`` or ``PFXINFO`` key names.
    """
    namespace = base
    if lora_name:
        namespace += f":lora={lora_name}"
    if cache_salt:
        namespace += f":salt={hashlib.sha256(cache_salt.encode()).hexdigest()[:32]}"
    return namespace
