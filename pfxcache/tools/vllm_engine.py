"""A real vLLM engine in its own process, driven over JSON lines: for the tests and the vLLM benchmark.

``python -m pfxcache.tools.vllm_engine --model DIR [--url URL] [--prefix-caching] [--extra JSON]``
builds one ``vllm.LLM`` (CPU build friendly: eager, no tokenizer, token-id
prompts), prints ``READY <json>`` and then answers one JSON line per request
line on stdin::

    {"prompts": [[1, 2, ...], ...], "salts": [null, "tenant-a", ...], "max_tokens": 8}
    -> {"outputs": [{"tokens": [...], "cached": 64, "pfxcache": {...}}, ...], "seconds": 0.4}

``cached`` is vLLM's ``num_cached_tokens`` (local prefix cache plus what the
connector loaded), ``pfxcache`` the connector's summary of the request
(``kv_transfer_params``). :class:`EngineProcess` starts, talks to and stops
one; :func:`make_tiny_model` writes a small Llama with seeded weights (no
download) that vLLM's CPU backend accepts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

CONNECTOR = {"kv_connector": "PrefixCacheConnector", "kv_connector_module_path": "pfxcache.client.vllm"}
BLOCK_SIZE = 32  # the CPU attention backend wants a multiple of 32


def make_tiny_model(path: str, *, seed: int = 0, layers: int = 2, hidden: int = 128, heads: int = 2,
                    kv_heads: int = 1, head_dim: int = 64, vocab: int = 512, dtype: str = "bfloat16",
                    init_range: float = 0.2) -> str:
    """A Llama with seeded random weights saved to ``path`` (config.json + model.safetensors); returns ``path``.

    Real weights rather than vLLM's dummy loader, so that transformers can load
    the very same model (pages written by vLLM are then read by
    :mod:`pfxcache.client.hf`). ``init_range`` well above the usual 0.02 keeps
    the logits far apart, so greedy tokens vary and do not tie.
    """
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=4096, initializer_range=init_range, tie_word_embeddings=False,
        torch_dtype=dtype)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.save_pretrained(path)
    return path


# -- the engine process --------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kwargs: dict[str, Any] = {}
    if args.url:
        extra = {"pfxcache_url": args.url, **json.loads(args.extra or "{}")}
        kwargs["kv_transfer_config"] = KVTransferConfig(**CONNECTOR, kv_role=args.role,
                                                        kv_connector_extra_config=extra)
    started = time.perf_counter()
    kwargs.update(json.loads(args.engine_args or "{}"))
    llm = LLM(model=args.model, skip_tokenizer_init=True, enforce_eager=True, dtype=args.dtype, seed=0,
              block_size=args.block_size, max_model_len=args.max_model_len,
              enable_prefix_caching=args.prefix_caching, max_num_seqs=args.max_num_seqs, **kwargs)
    print("READY " + json.dumps({"seconds": time.perf_counter() - started}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        prompts = []
        salts = request.get("salts") or [None] * len(request["prompts"])
        for ids, salt in zip(request["prompts"], salts):
            prompt: dict[str, Any] = {"prompt_token_ids": ids}
            if salt:
                prompt["cache_salt"] = salt
            prompts.append(prompt)
        params = SamplingParams(temperature=0, max_tokens=request.get("max_tokens", 8), detokenize=False)
        began = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - began
        reply = {"seconds": seconds, "outputs": [
            {"tokens": list(out.outputs[0].token_ids), "cached": out.num_cached_tokens,
             "pfxcache": (out.kv_transfer_params or {}).get("pfxcache"),
             "ttft": _ttft(out)}
            for out in outputs]}
        print("REPLY " + json.dumps(reply), flush=True)


def _ttft(output: Any) -> float | None:
    metrics = getattr(output, "metrics", None)
    first = getattr(metrics, "first_token_latency", None)
    return float(first) if first is not None else None


class EngineProcess:
    """One engine (``python -m pfxcache.tools.vllm_engine``) in its own process group."""

    def __init__(self, model: str, *, url: str | None = None, prefix_caching: bool = False,
                 extra: dict | None = None, role: str = "kv_both", dtype: str = "bfloat16",
                 block_size: int = BLOCK_SIZE, max_model_len: int = 2048, max_num_seqs: int = 8,
                 engine_args: dict | None = None, env: dict | None = None) -> None:
        command = [sys.executable, "-m", "pfxcache.tools.vllm_engine", "--model", model, "--dtype", dtype,
                   "--block-size", str(block_size), "--max-model-len", str(max_model_len),
                   "--max-num-seqs", str(max_num_seqs), "--role", role, "--engine-args", json.dumps(engine_args or {})]
        if url:
            command += ["--url", url, "--extra", json.dumps(extra or {})]
        if prefix_caching:
            command.append("--prefix-caching")
        environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false",
                       **(env or {})}
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=environment, start_new_session=True)
        self.log: deque[str] = deque(maxlen=400)
        self._lines: deque[str] = deque()
        self._ready = threading.Event()
        self._cond = threading.Condition()
        self.start_seconds: float | None = None
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.log.append(line)
            if line.startswith("READY "):
                self.start_seconds = json.loads(line[6:])["seconds"]
                self._ready.set()
            elif line.startswith("REPLY "):
                with self._cond:
                    self._lines.append(line[6:])
                    self._cond.notify_all()
        self._ready.set()
        with self._cond:
            self._cond.notify_all()

    def log_text(self) -> str:
        return "\n".join(self.log)

    def wait_ready(self, timeout: float = 600.0) -> EngineProcess:
        if not self._ready.wait(timeout) or self.start_seconds is None:
            self.stop()
            raise RuntimeError("the vLLM engine did not start:\n" + self.log_text())
        return self

    def submit(self, prompts: list[list[int]], *, max_tokens: int = 8, salts: list | None = None) -> None:
        """Send one batch without waiting for it (:meth:`result` collects the reply)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"prompts": prompts, "max_tokens": max_tokens, "salts": salts}) + "\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 600.0) -> dict:
        """The reply to the oldest batch submitted and not collected yet."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._lines:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise RuntimeError("the vLLM engine did not answer:\n" + self.log_text())
                self._cond.wait(min(left, 1.0))
            return json.loads(self._lines.popleft())

    def generate(self, prompts: list[list[int]], *, max_tokens: int = 8, salts: list | None = None,
                 timeout: float = 600.0) -> dict:
        """Generate greedily for ``prompts`` (one batch); the reply's ``outputs`` follow the prompts' order."""
        self.submit(prompts, max_tokens=max_tokens, salts=salts)
        return self.result(timeout)

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()    # the engine leaves its loop and shuts down
                self.proc.wait(timeout)
            except (subprocess.TimeoutExpired, OSError, ValueError):
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            self.proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pfxcache.tools.vllm_engine", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--url", default=None, help="pfxcache URL (no connector without it)")
    parser.add_argument("--extra", default=None, help="more kv_connector_extra_config, as JSON")
    parser.add_argument("--role", default="kv_both")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--block-size", type=int, default=BLOCK_SIZE)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--prefix-caching", action="store_true", help="vLLM's own prefix cache (off by default)")
    parser.add_argument("--engine-args", default=None, help="more vllm.LLM keyword arguments, as JSON")
    _serve(parser.parse_args(argv))


if __name__ == "__main__":
    main()
