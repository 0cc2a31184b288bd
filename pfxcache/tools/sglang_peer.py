"""SGLang's RadixCache, taken from its PyPI wheel, as a reference the store benchmark runs against.

pfxcache never depends on SGLang: ``scripts/setup sglang`` fetches the
``sglang==0.5.23`` wheel once (``pip download --no-deps``, ~40 MB) and keeps
only ``sglang/srt/mem_cache/`` from it under the benchmark's own folder
(``scripts/out/peers/sglang-0.5.23/``, ignored by git); this module imports
``radix_cache.RadixCache`` from there, and installs nothing. Nothing is
installed into the project's environment.

SGLang's mem_cache package imports most of the serving stack at module level
(kernels, metrics, the scheduler's types, triton); none of it runs on the
paths measured here (match_prefix, insert, evict, lock refs of a simulated
cache, with KV events and metrics off). The module files that those paths
execute are SGLang's own, unchanged: ``radix_cache``, ``base_prefix_cache``,
``evict_policy``, ``cache_init_params``, ``events``, ``utils``. Every other
``sglang.*`` module is replaced by an empty stand-in whose names are inert
placeholders. The allocator handed to the cache is a no-op (SGLang's own needs
a device KV pool): SGLang's evict pays nothing to free its tokens, where the
pfxcache store's evict returns its blocks to its allocator.

It needs torch (RadixCache values are tensors): the ``torch`` extra, or
``scripts/setup demo``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

from pfxcache.tools.common import OUT

VERSION = "0.5.23"
#: The SGLang modules the measured paths run, loaded from the wheel as they are.
REAL_MODULES = frozenset(
    f"sglang.srt.mem_cache.{name}"
    for name in ("radix_cache", "base_prefix_cache", "evict_policy", "cache_init_params", "events", "utils")
)


SETUP = "scripts/setup sglang"  # what puts the wheel's mem_cache/ in peer_dir()


class PeerUnavailable(Exception):
    """SGLang's RadixCache cannot be loaded here; the message says why."""


def peer_dir() -> Path:
    """Where ``scripts/setup sglang`` keeps ``sglang/srt/mem_cache/`` of the wheel."""
    return OUT / "peers" / f"sglang-{VERSION}"


def locate() -> Path:
    """The folder holding ``sglang/srt/mem_cache/`` of the wheel (PeerUnavailable naming the setup when absent)."""
    root = peer_dir()
    if not (root / "sglang" / "srt" / "mem_cache" / "radix_cache.py").exists():
        raise PeerUnavailable(f"SGLang {VERSION}'s radix cache is not in {root}: run {SETUP}")
    return root


class _Placeholder(types.ModuleType):
    """An ``sglang.*`` module the measured paths never run: any name in it is an inert class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {
            "__init__": lambda self, *args, **kwargs: None,
            "__call__": lambda self, *args, **kwargs: None,
            "__class_getitem__": classmethod(lambda cls, item: cls),
        })
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "sglang" and not name.startswith("sglang."):
            return None
        if name in REAL_MODULES:
            return importlib.util.spec_from_file_location(name, self.root / (name.replace(".", "/") + ".py"))
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Placeholder(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class NoopAllocator:
    """What a simulated RadixCache frees evicted tokens into: nothing (see the module docstring)."""

    device = "cpu"

    def __init__(self) -> None:
        self.freed_tokens = 0

    def free_segment(self, value: Any, start_pos: int = 0) -> None:
        self.freed_tokens += len(value) - start_pos

    def free(self, value: Any) -> None:
        self.freed_tokens += len(value)


class SGLang:
    """The loaded classes: ``RadixCache``, ``RadixKey`` and the params of match / insert / evict."""

    def __init__(self) -> None:
        try:
            import torch
        except ImportError:
            raise PeerUnavailable("SGLang's RadixCache needs torch (pip install torch, or scripts/setup demo)") from None
        self.torch = torch
        root = locate()
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder(root))
        radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        params = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
        self.RadixCache = radix.RadixCache
        self.RadixKey = radix.RadixKey
        self.MatchPrefixParams = params.MatchPrefixParams
        self.InsertParams = params.InsertParams
        self.EvictParams = params.EvictParams
        self.source = Path(radix.__file__)

    def new_cache(self, page_size: int) -> tuple[Any, NoopAllocator]:
        allocator = NoopAllocator()
        return self.RadixCache.create_simulated(mock_allocator=allocator, page_size=page_size), allocator


def load() -> SGLang:
    """SGLang's RadixCache, from where scripts/setup put it (PeerUnavailable with the reason otherwise)."""
    try:
        return SGLang()
    except PeerUnavailable:
        raise
    except Exception as exc:  # an import of the wheel's code failed: say what, do not guess
        raise PeerUnavailable(f"cannot import SGLang {VERSION}'s radix_cache: {type(exc).__name__}: {exc}") from exc
