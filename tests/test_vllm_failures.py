"""A real vLLM engine keeps answering with correct tokens when its pfxcache daemon dies, and reconnects.

Two engines of a tiny Llama, vLLM's prefix caching off, one moving pages
through the mapped arena and one over RESP (there the workers' own
connections break too, so loads fail after the lookup and vLLM recomputes
them through its load-error path). The daemon is SIGKILLed while a batch that
would hit is in flight, the engines serve without it, and pick up a new
daemon on the same port once ``retry_seconds`` have passed.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import wait_for
from vllm_support import (
    PAGE,
    check,
    daemon_for,
    info,
    start_engines,
    tiny_model,
    url_of,
    usable_tokens,
)

pytestmark = pytest.mark.timeout(1800)

SYSTEM = np.random.default_rng(5).integers(3, 500, 3 * PAGE).tolist()
BATCH = [SYSTEM + np.random.default_rng(50 + i).integers(3, 500, 10 + 7 * i).tolist() for i in range(6)]


def test_the_daemon_killed_mid_run(tmp_path_factory):
    model = tiny_model(tmp_path_factory)
    daemon = daemon_for(model)
    port, url = daemon.port, url_of(daemon)
    settings = {"retry_seconds": 1, "timeout_seconds": 2}
    engines = []
    try:
        engines = start_engines(dict(model=model, url=url, extra=settings),
                                dict(model=model, url=url, extra={**settings, "transfer": "resp"}))
        # The reference: every prompt under a salt of its own, so nothing can hit: all computed.
        computed = engines[0].generate(BATCH, max_tokens=12, salts=[f"ref-{i}" for i in range(len(BATCH))])
        assert [out["cached"] for out in computed["outputs"]] == [0] * len(BATCH)
        reference = [out["tokens"] for out in computed["outputs"]]
        for engine in engines:
            assert [out["tokens"] for out in engine.generate(BATCH, max_tokens=12)["outputs"]] == reference
        hits = [out["cached"] for out in engines[1].generate(BATCH, max_tokens=12)["outputs"]]
        assert hits == [usable_tokens(p) for p in BATCH]

        for engine in engines:                      # a batch that would hit everything...
            engine.submit(BATCH, max_tokens=12)
        daemon.stop(9)                              # ...and the daemon SIGKILLed under it
        for engine in engines:
            assert [out["tokens"] for out in engine.result()["outputs"]] == reference
        for engine in engines:                      # no daemon at all now
            outs = engine.generate(BATCH, max_tokens=12)["outputs"]
            assert [out["tokens"] for out in outs] == reference
            assert [out["cached"] for out in outs] == [0] * len(BATCH)
            assert outs[-1]["pfxcache"]["stats"]["errors"] >= 1

        daemon = daemon_for(model, "--port", str(port))
        for engine in engines:                      # back after retry_seconds: stores again, then hits
            wait_for(lambda: engine.generate(BATCH[:1])["outputs"][0]["pfxcache"]["stats"].get("reconnects"),
                     120, "the engine to reconnect")
            engine.generate(BATCH, max_tokens=12)
            outs = engine.generate(BATCH, max_tokens=12)["outputs"]
            assert [out["cached"] for out in outs] == [usable_tokens(p) for p in BATCH]
            assert [out["tokens"] for out in outs] == reference
        wait_for(lambda: info(daemon)["pfxcache_active_leases"] == 0, 30, "every lease to end")
        assert check(daemon) == b"OK"
    finally:
        for engine in engines:
            engine.stop()
        daemon.stop()
