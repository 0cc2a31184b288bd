"""NVIDIA Dynamo's standalone KV indexer as a child process: start it, register daemons, ask it.

Dynamo (``pip install ai-dynamo-runtime``, 1.6.1; in pfxcache's ``test`` extra) ships
``python -m dynamo.indexer``: it subscribes to KV events in vLLM's ZMQ format, keeps a
radix tree of which worker holds which blocks, and answers ``POST /query`` with each
worker's longest cached prefix. How to point it at pfxcached (read from its 1.6.1 build):

* register each daemon with ``POST /register {"instance_id", "endpoint", "replay_endpoint",
  "model_name", "block_size"}``: ``endpoint`` is the daemon's ``kv-events-endpoint``,
  ``replay_endpoint`` its ``kv-events-replay-endpoint`` (the ``--workers`` flag takes no replay
  address), ``block_size`` its ``page-size``;
* query with ``lora_name`` = the namespace (pfxcached publishes each namespace as
  ``lora_name``, which Dynamo folds into its block hashes): namespaces holding the same tokens
  never merge. Without it a query sees only events whose ``lora_name`` is empty.

On a sequence gap, or when it joins after the first batch, the indexer asks the replay socket
for what it missed (``kv-events-replay-buffer`` batches are kept).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from pfxcache.testing import free_port


class KvIndexer:
    """A running ``python -m dynamo.indexer`` on a free loopback port."""

    def __init__(self, proc: subprocess.Popen, port: int, log_path: str | None) -> None:
        self.proc = proc
        self.port = port
        self.log_path = log_path

    def _post(self, path: str, body: dict, timeout: float = 10.0) -> tuple[int, Any]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                text = reply.read().decode()
                return reply.status, json.loads(text) if text else None
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def register(self, instance_id: int, endpoint: str, *, replay_endpoint: str = "", model: str = "pfxcache",
                 block_size: int) -> None:
        body = {"instance_id": instance_id, "endpoint": endpoint, "model_name": model, "block_size": block_size}
        if replay_endpoint:
            body["replay_endpoint"] = replay_endpoint
        status, reply = self._post("/register", body)
        if status not in (200, 201):
            raise RuntimeError(f"the indexer refused the registration: {status} {reply}")

    def query(self, tokens: list[int], namespace: str, *, model: str = "pfxcache") -> dict[int, int]:
        """Longest cached prefix (tokens) per registered instance that holds any of it."""
        status, reply = self._post("/query", {"token_ids": tokens, "model_name": model, "lora_name": namespace})
        if status != 200:
            raise RuntimeError(f"the indexer's /query failed: {status} {reply}")
        return {int(k): v["longest_matched"] for k, v in reply["instances"].items()}

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the indexer exited with {self.proc.returncode}: {self.log()}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2).read()
                return
            except urllib.error.HTTPError:
                return  # it answers
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the indexer did not start listening") from None
                time.sleep(0.1)

    def log(self) -> str:
        if not self.log_path:
            return ""
        with open(self.log_path, errors="replace") as file:
            return file.read()[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def indexer_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("dynamo") is not None and importlib.util.find_spec("dynamo.indexer") is not None


def start_indexer(log_path: str | None = None, threads: int = 1) -> KvIndexer:
    """Start Dynamo's standalone indexer (HTTP on a free port) and wait until it answers."""
    port = free_port()
    out = open(log_path, "w") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "dynamo.indexer", "--port", str(port), "--threads", str(threads)],
                            stdout=out, stderr=subprocess.STDOUT)
    if log_path:
        out.close()
    indexer = KvIndexer(proc, port, log_path)
    try:
        indexer.wait_ready()
    except BaseException:
        indexer.stop()
        raise
    return indexer
