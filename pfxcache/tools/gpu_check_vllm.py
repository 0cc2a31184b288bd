"""The vLLM step of ``scripts/gpu-check --vllm``: vLLM's CUDA build sharing prefix KV through the CUDA arena.

Needs vLLM's CUDA build in .venv (``pip install vllm``) next to CuPy; exits 2
saying so when it is missing. Starts ``pfxcached --arena cuda`` sized for a
tiny random Llama (no download), then three engines on the GPU: one without
the connector (the reference tokens) and two with it. Engine A computes a
shared system prompt and stores its pages (the workers write into the arena
through its IPC handle, device to device); a fresh engine B, vLLM's prefix
caching off, must get every full page before each prompt's last token from
pfxcache (``num_cached_tokens``) and produce the reference's greedy tokens;
then no lease is left and PFXCHECK is OK.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile

import numpy as np

BLOCK = 16  # vLLM's default block_size on CUDA


def vllm_step(device: int, quiet: bool) -> dict:
    """Run the step; ``{"ok": bool, "checks": {...}, ...}`` (``{"skipped": reason}`` without vLLM)."""
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vLLM is not installed (pip install vllm: the CUDA build)"}
    import redis

    from pfxcache.client.vllm import geometry_for_model
    from pfxcache.testing import start_daemon
    from pfxcache.tools.vllm_engine import EngineProcess, make_tiny_model

    def say(text: str) -> None:
        if not quiet:
            print(f"[gpu-check vllm] {text}", file=sys.stderr, flush=True)

    model = make_tiny_model(tempfile.mkdtemp(prefix="gpu-check-vllm-"))
    geometry = geometry_for_model(model, BLOCK)
    say(f"pfxcached --arena cuda, {geometry.daemon_args()}")
    daemon = start_daemon("--arena", "cuda", "--arena-device", str(device), "--page-size", str(BLOCK),
                          "--block-bytes", str(geometry.block_bytes), "--maxmemory", "256mb", ready_timeout=120)
    url = f"redis://{daemon.host}:{daemon.port}/0"
    env = {"CUDA_VISIBLE_DEVICES": str(device)}
    engine_args = {"gpu_memory_utilization": 0.15}
    engines = []
    checks: dict[str, bool] = {}
    try:
        say("starting 3 engines (reference, A and B with the connector)")
        engines = [EngineProcess(model, block_size=BLOCK, engine_args=engine_args, env=env),
                   EngineProcess(model, url=url, block_size=BLOCK, engine_args=engine_args, env=env),
                   EngineProcess(model, url=url, block_size=BLOCK, engine_args=engine_args, env=env)]
        for engine in engines:
            engine.wait_ready(600)
        ref, a, b = engines
        rng = np.random.default_rng(3)
        system = rng.integers(3, 500, 8 * BLOCK).tolist()
        prompts = [system + rng.integers(3, 500, 5 + 11 * i).tolist() for i in range(4)]
        expected = [out["tokens"] for out in ref.generate(prompts, max_tokens=16)["outputs"]]
        checks["a_tokens"] = [out["tokens"] for out in a.generate(prompts, max_tokens=16)["outputs"]] == expected
        got = b.generate(prompts, max_tokens=16)["outputs"]
        usable = [(len(p) - 1) // BLOCK * BLOCK for p in prompts]
        checks["b_every_page_from_pfxcache"] = [out["cached"] for out in got] == usable
        checks["b_tokens"] = [out["tokens"] for out in got] == expected
        client = redis.Redis(host=daemon.host, port=daemon.port)
        stats = client.info("pfxcache")
        checks["info_hits"] = stats["pfxcache_hits_tokens"] >= sum(usable)
        checks["no_lease_left"] = stats["pfxcache_active_leases"] == 0
        checks["pfxcheck"] = client.execute_command("PFXCHECK") == b"OK"
        report = {"block_bytes": geometry.block_bytes, "cached": [out["cached"] for out in got],
                  "usable": usable, "load_seconds": got[-1]["pfxcache"]["stats"].get("load_seconds"),
                  "load_bytes": got[-1]["pfxcache"]["stats"].get("load_bytes")}
    finally:
        for engine in engines:
            engine.stop()
        code = daemon.stop()
    checks["daemon_exit_0"] = code == 0
    return {**report, "checks": checks, "ok": all(checks.values())}
