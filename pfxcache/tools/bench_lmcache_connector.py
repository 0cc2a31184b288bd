"""LMCache's remote tier, pfxcache vs Redis: a 64-chunk lookup and load through LMCache's own RemoteBackend.

Each row is one LMCache worker (LMCache 0.5.6's ``RemoteBackend``, loaded through
``remote_storage_plugins``) doing what a request with a cached prompt costs it: ``batched_contains``
of the prompt's --chunks chunks, then ``batched_get_blocking`` of the hits, every byte checked.
Three tiers in the same run, on the same machine, with the same chunks:

* ``pfxcache shm``: ``pfxcache.client.lmcache.PrefixCacheConnector``, daemon on this host (the
  lookup pins the chunks, the load copies them out of the mapped arena);
* ``pfxcache resp``: the same connector with ``pfxcache_transfer: resp`` (the bytes over the socket,
  as from another host);
* ``redis``: LMCache's own ``redis://`` connector (``RedisConnector``) against redis-server.

Per geometry (--models): round trips per lookup + load (the servers' INFO commandstats, before and
after one of them), and the median of --rounds timed lookups + loads (rounds alternate the tiers'
order so all see the same machine load): milliseconds, chunks/s and GB/s, and pfxcache over redis.
Chunks are LMCache's default 256 tokens of bfloat16 KV; ``save_chunk_meta`` is on (LMCache's default:
a pfxcache page carries the chunk's metadata, Redis keeps it under a second key).

    scripts/bench-lmcache
    scripts/bench-lmcache --models tiny --rounds 21
    scripts/bench-lmcache --json
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import random
import statistics
import threading
import time

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")  # before LMCache's import: its INFO lines drown the table

from pfxcache.testing import start_daemon, start_redis_server  # noqa: E402
from pfxcache.tools.common import command_line, machine, progress_bar, tool_parser  # noqa: E402

TOKENS = 256  # LMCache's default chunk size
META = 28  # LMCache's RemoteMetadata of one layer group, which a pfxcache page carries
#: name -> (layers, KV heads, head dim): a chunk is 2 x layers x 256 x heads x dim bfloat16 values.
MODELS = {
    "tiny": (1, 1, 64),  # 64 KiB chunks: the round trips dominate
    "qwen2.5-0.5b": (24, 2, 64),  # 3 MiB chunks: the copies dominate
    "llama-3.1-8b": (32, 8, 128),  # 32 MiB chunks (64 of them: 2 GiB a load)
}
TIERS = ("pfxcache shm", "pfxcache resp", "redis")


def chunk_bytes(model: str) -> int:
    layers, heads, dim = MODELS[model]
    return 2 * layers * TOKENS * heads * dim * 2


class Worker:
    """One LMCache worker's storage side with a single remote tier, on its own event loop."""

    def __init__(self, model: str, chunks: int, plugin: str, extra: dict) -> None:
        import torch
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
        from lmcache.v1.storage_backend.remote_backend import RemoteBackend

        layers, heads, dim = MODELS[model]
        self.model = model
        self.metadata = LMCacheMetadata(model_name=model, world_size=1, local_world_size=1, worker_id=0,
                                        local_worker_id=0, kv_dtype=torch.bfloat16,
                                        kv_shape=(layers, 2, TOKENS, heads, dim), chunk_size=TOKENS)
        buffer_gb = 2.5 * chunks * chunk_bytes(model) / 2**30 + 0.01
        self.config = LMCacheEngineConfig.from_defaults(chunk_size=TOKENS, max_local_cpu_size=buffer_gb,
                                                        remote_serde="naive", remote_storage_plugins=[plugin],
                                                        extra_config=extra)
        self.cpu = LocalCPUBackend(self.config, self.metadata)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.backend = RemoteBackend(self.config, self.metadata, self.loop, self.cpu, plugin_name=plugin)

    def keys(self, hashes: list[int]) -> list:
        import torch
        from lmcache.utils import CacheEngineKey

        return [CacheEngineKey(self.model, 1, 0, h, torch.bfloat16) for h in hashes]

    def store(self, hashes: list[int], payloads: list[bytes]) -> None:
        import torch

        objs = []
        for data in payloads:
            obj = self.cpu.allocate(self.metadata.get_shapes(), self.metadata.get_dtypes(), None)
            obj.tensor.view(torch.uint8).reshape(-1).copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            objs.append(obj)
        self.backend.batched_contains(self.keys(hashes))  # as LMCache does before a store (and to learn the chain)
        put = self.backend.connection.batched_put(self.keys(hashes), objs)
        asyncio.run_coroutine_threadsafe(put, self.loop).result(600)

    def lookup_and_load(self, keys: list, check: list[bytes] | None = None) -> int:
        """batched_contains + batched_get_blocking of the hits; the chunks read (all checked when asked)."""
        hits = self.backend.batched_contains(keys)
        got = self.backend.batched_get_blocking(keys[:hits])
        n = 0
        for obj in got:
            if obj is None:
                break
            if check is not None and bytes(obj.byte_array) != check[n]:
                raise AssertionError(f"wrong bytes in chunk {n}")
            n += 1
        for obj in got:
            if obj is not None:
                obj.ref_count_down()
        return n

    def close(self) -> None:
        # Not RemoteBackend.close(): LMCache 0.5.6's RedisConnector.close() waits on its own event loop
        # (its job queue's shutdown) and never returns. The servers go away with their processes.
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def calls(address: tuple[str, int]) -> dict[str, int]:
    import redis

    with redis.Redis(host=address[0], port=address[1]) as r:
        return {name[len("cmdstat_"):]: v["calls"] for name, v in r.info("commandstats").items()}


def round_trips(worker: Worker, keys: list, address: tuple[str, int]) -> tuple[int, dict[str, int]]:
    """Commands one lookup + load sends (the server's commandstats around it, less the INFO that reads them)."""
    before = calls(address)
    worker.lookup_and_load(keys)
    after = calls(address)
    diff = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    diff.pop("info", None)
    diff.pop("hello", None)  # the INFO's own connection
    return sum(diff.values()), diff


def bench_model(model: str, args, bar) -> dict:
    size = chunk_bytes(model)
    rng = random.Random(model)
    hashes = [rng.getrandbits(63) for _ in range(args.chunks)]
    payloads = [hashlib.shake_256(b"%s:%d" % (model.encode(), h)).digest(size) for h in hashes]
    daemon = start_daemon("--page-size", "16", "--block-bytes", str(size + META),
                          "--maxmemory", str((args.chunks + 8) * (size + META)), "--arena", "shm")
    server = start_redis_server()
    workers: dict[str, Worker] = {}
    try:
        pfx_url = f"redis://{daemon.host}:{daemon.port}/0"
        plugin = {"remote_storage_plugin.pfxcache.module_path": "pfxcache.client.lmcache",
                  "remote_storage_plugin.pfxcache.class_name": "PrefixCacheConnector",
                  "remote_storage_plugin.pfxcache.pfxcache_url": pfx_url}
        workers["pfxcache shm"] = Worker(model, args.chunks, "pfxcache", {**plugin, "pfxcache_transfer": "arena"})
        workers["pfxcache resp"] = Worker(model, args.chunks, "pfxcache", {**plugin, "pfxcache_transfer": "resp"})
        workers["redis"] = Worker(model, args.chunks, "redis", {
            "remote_storage_plugin.redis.redis_url": f"redis://{server.host}:{server.port}"})
        workers["pfxcache shm"].store(hashes, payloads)
        workers["redis"].store(hashes, payloads)
        address = {"pfxcache shm": daemon.address, "pfxcache resp": daemon.address, "redis": server.address}
        keys = {tier: w.keys(hashes) for tier, w in workers.items()}
        rows: dict[str, dict] = {}
        for tier, worker in workers.items():
            if worker.lookup_and_load(keys[tier], check=payloads) != args.chunks:  # warm, and every byte checked
                raise AssertionError(f"{tier}: not every chunk came back")
            total, detail = round_trips(worker, keys[tier], address[tier])
            rows[tier] = {"round_trips": total, "commands": detail, "seconds": []}
        for round_no in range(args.rounds):
            order = TIERS if round_no % 2 == 0 else TIERS[::-1]
            for tier in order:
                started = time.perf_counter()
                n = workers[tier].lookup_and_load(keys[tier])
                rows[tier]["seconds"].append(time.perf_counter() - started)
                if n != args.chunks:
                    raise AssertionError(f"{tier}: {n} of {args.chunks} chunks in round {round_no}")
                bar.update(1)
        for row in rows.values():
            median = statistics.median(row["seconds"])
            row.update(ms=1000 * median, chunks_per_s=args.chunks / median, gb_per_s=args.chunks * size / median / 1e9)
        for tier in TIERS[:2]:
            rows[tier]["over_redis"] = rows["redis"]["ms"] / rows[tier]["ms"]
        return {"model": model, "chunk_bytes": size, "chunks": args.chunks, "tiers": rows}
    finally:
        for worker in workers.values():
            worker.close()
        daemon.stop()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("bench-lmcache", __doc__)
    parser.add_argument("--models", default="tiny,qwen2.5-0.5b",
                        help=f"comma-separated geometries, of {', '.join(MODELS)} (default tiny,qwen2.5-0.5b)")
    parser.add_argument("--chunks", type=int, default=64, help="chunks a lookup asks for (default 64)")
    parser.add_argument("--rounds", type=int, default=11, help="timed lookups + loads per tier (default 11)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r} (known: {', '.join(MODELS)})")
    if importlib.util.find_spec("lmcache") is None:
        parser.error("LMCache is not installed (scripts/setup test installs lmcache 0.5.6's storage code)")
    command = command_line("bench-lmcache", argv)
    bar = progress_bar(len(models) * args.rounds * len(TIERS), "bench-lmcache", "lookup")
    results = [bench_model(model, args, bar) for model in models]
    bar.close()
    if args.json:
        print(json.dumps({"command": command, "machine": machine(), "results": results}))
        return 0
    print(f"# {command}")
    print(f"batched_contains + batched_get_blocking of {args.chunks} chunks of {TOKENS} tokens through LMCache's "
          f"RemoteBackend, median of {args.rounds}")
    for result in results:
        print(f"{result['model']} ({result['chunk_bytes'] // 1024} KiB chunks):")
        for tier in TIERS:
            row = result["tiers"][tier]
            ratio = f"   {row['over_redis']:.1f}x redis" if "over_redis" in row else ""
            commands = ", ".join(f"{n} {name.upper()}" for name, n in sorted(row["commands"].items()))
            print(f"  {tier:<14} {row['round_trips']:>4} round trips ({commands}); {row['ms']:8.2f} ms  "
                  f"{row['chunks_per_s']:8.0f} chunks/s  {row['gb_per_s']:6.2f} GB/s{ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
