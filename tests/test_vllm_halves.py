"""The connector's two halves against a real daemon, without vLLM: layouts, copies, leases, failures.

The scheduler half talks to a real pfxcached; the worker half copies between
torch tensors laid out as vLLM's attention kernels keep them (written here the
way csrc/cpu/cpu_attn_vec.hpp and cpu_attn_amx.hpp write them) and the real
arena -- the shared-memory one, and the CUDA one on the CuPy stand-in of
test_cuda. Requests are the few attributes of vLLM's ``Request`` the scheduler
half reads. The end-to-end tests with real engines are in test_vllm*.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import types

import pytest
import redis

torch = pytest.importorskip("torch")

from pfxcache.client import PrefixCache
from pfxcache.client.partitioned import PartitionedArenaView
from pfxcache.client.vllm import geometry_from_config, request_namespace
from pfxcache.client.vllm.layout import PageGeometry, base_namespace
from pfxcache.client.vllm.plan import LoadJob, StepPlan, StoreJob
from pfxcache.client.vllm.scheduler import LEASE_MARGIN_S, SchedulerHalf, Settings
from pfxcache.client.vllm.worker import WorkerHalf, paged_kv_views

from pfxcache.testing import start_daemon

NBLOCKS = 24


# -- vLLM's layouts, written as its kernels write them ---------------------------------------------------


def kv_tensor(layout: str, blocks: int, heads: int, n: int, d: int, dtype=torch.bfloat16) -> torch.Tensor:
    shapes = {"vec": (blocks, heads, n, 2 * d), "amx": (blocks, heads, n, 2 * d), "flash": (2, blocks, n, heads, d),
              "nhd": (blocks, 2, n, heads, d), "hnd": (blocks, 2, heads, n, d)}
    return torch.zeros(shapes[layout], dtype=dtype)


def write_like_vllm(kv: torch.Tensor, layout: str, block: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Put one block's K and V (``[heads, n, d]`` each) where vLLM's kernel for ``layout`` puts them."""
    heads, n, d = keys.shape
    if layout in ("vec", "amx"):
        flat = kv[block].view(heads, 2, n * d)
        t, c = torch.meshgrid(torch.arange(n), torch.arange(d), indexing="ij")
        if layout == "vec":   # keys column-major [d, n], values row-major [n, d]
            key_at, value_at = c * n + t, t * d + c
        else:                 # AMX: keys as dim pairs in 16-token groups, values as token pairs in 16-dim groups
            key_at = (t // 16) * 16 * d + (c // 2) * 32 + (t % 16) * 2 + c % 2
            value_at = (t // 2) * 32 + t % 2 + (c // 16) * (n * 16) + (c % 16) * 2
        for h in range(heads):
            flat[h, 0][key_at.reshape(-1)] = keys[h].reshape(-1)
            flat[h, 1][value_at.reshape(-1)] = values[h].reshape(-1)
    elif layout == "flash":
        kv[0, block], kv[1, block] = keys.permute(1, 0, 2), values.permute(1, 0, 2)
    elif layout == "nhd":
        kv[block, 0], kv[block, 1] = keys.permute(1, 0, 2), values.permute(1, 0, 2)
    else:
        kv[block, 0], kv[block, 1] = keys, values


def logical(kv_views, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    keys, values = kv_views
    heads = keys.shape[1]
    return keys[block].reshape(heads, -1), values[block].reshape(heads, -1)


@pytest.mark.parametrize("layout", ["vec", "amx", "flash", "nhd", "hnd"])
def test_paged_views_read_what_the_kernels_wrote(layout):
    heads, n, d = 2, 32, 32
    kv = kv_tensor(layout, 3, heads, n, d)
    keys, values = torch.randn(heads, n, d).bfloat16(), torch.randn(heads, n, d).bfloat16()
    write_like_vllm(kv, layout, 1, keys, values)
    views = paged_kv_views(kv, n, heads, d, cpu_isa=layout if layout in ("vec", "amx") else None)
    got_keys, got_values = views[0][1], views[1][1]
    assert torch.equal(got_keys.reshape(heads, n, d), keys) and torch.equal(got_values.reshape(heads, n, d), values)
    assert views[0].untyped_storage().data_ptr() == kv.untyped_storage().data_ptr()   # views, not copies


def test_paged_views_refuse_unknown_layouts():
    with pytest.raises(ValueError, match="'neon'.*known: vec, amx"):
        paged_kv_views(kv_tensor("vec", 2, 2, 32, 32), 32, 2, 32, cpu_isa="neon")
    with pytest.raises(ValueError, match="unknown paged KV layout"):
        paged_kv_views(torch.zeros(2, 3, 4), 32, 2, 32)


# -- geometry and namespaces ---------------------------------------------------------------------------


def test_geometry_agrees_with_the_transformers_integration():
    transformers = pytest.importorskip("transformers")
    from pfxcache.client import hf

    config = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                      num_hidden_layers=3, head_dim=64)
    geometry = geometry_from_config(config.to_dict(), 32, "bfloat16")
    assert geometry.block_bytes == hf.block_bytes_for(config, 32, "bfloat16") == 3 * 2 * 2 * 32 * 64 * 2
    assert geometry.daemon_args() == f"--page-size 32 --block-bytes {geometry.block_bytes}"
    with pytest.raises(ValueError, match="needs a daemon started with --page-size 32 --block-bytes 49152"):
        geometry.check_daemon(16, 49152, "redis://x")


def test_the_geometry_command(tmp_path):
    import json
    import subprocess
    import sys

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 2,
                                                      "num_key_value_heads": 1, "hidden_size": 128,
                                                      "torch_dtype": "bfloat16"}))
    done = subprocess.run([sys.executable, "-m", "pfxcache.client.vllm", str(tmp_path), "--block-size", "32"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "--page-size 32 --block-bytes 16384"
    missing = subprocess.run([sys.executable, "-m", "pfxcache.client.vllm", str(tmp_path / "nope")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "error:" in missing.stderr


def test_namespaces_separate_models_dtypes_pages_salts_and_adapters(tmp_path):
    base = base_namespace(str(tmp_path), "bfloat16", 32)
    assert base == f"vllm:{tmp_path}:bfloat16:p32"
    assert len({base, base_namespace(str(tmp_path), "float16", 32), base_namespace(str(tmp_path), "bfloat16", 64),
                base_namespace("meta-llama/Llama-3-8B", "bfloat16", 32)}) == 4
    salted = request_namespace(base, cache_salt="secret-a")
    assert "secret-a" not in salted and salted != request_namespace(base, cache_salt="secret-b")
    assert request_namespace(base, lora_name="sql") != request_namespace(base, lora_name="chat") != base
    with pytest.raises(ValueError, match="unknown pfxcache settings.*pfxcache_ulr"):
        Settings.from_extra_config({"pfxcache_ulr": "redis://x"})
    assert Settings.from_extra_config({}, "kv_consumer").store is False
    assert Settings.from_extra_config({}, "kv_producer").load is False


# -- the halves against a real daemon ------------------------------------------------------------------


GEOMETRY = PageGeometry(layers=2, kv_heads=2, head_dim=32, page_size=32, dtype="bfloat16")


@pytest.fixture
def daemon():
    instance = start_daemon("--page-size", str(GEOMETRY.page_size), "--block-bytes", str(GEOMETRY.block_bytes),
                            "--maxmemory", str(GEOMETRY.block_bytes * NBLOCKS))
    yield instance
    instance.stop()


def url(daemon) -> str:
    return f"redis://{daemon.host}:{daemon.port}/0"


class Engine:
    """One engine's worth of the connector: a scheduler half, a worker half and vLLM-laid-out KV."""

    def __init__(self, daemon, layout: str = "vec", clock=None, gather=None, **settings):
        self.layout = layout
        self.kv = {f"model.layers.{i}.self_attn.attn": kv_tensor(layout, 16, 2, 32, 32) for i in range(2)}
        self.blocks: dict[str, list[int]] = {}
        settings.setdefault("url", url(daemon))
        extra = {} if clock is None else {"clock": clock}
        self.scheduler = SchedulerHalf(Settings(**settings), GEOMETRY, "test:model", **extra)
        self.scheduler.block_ids_of = self.blocks.__getitem__
        self.scheduler.start()
        self.worker = WorkerHalf(GEOMETRY, gather=gather)
        self.worker.register(self.kv, cpu_isa=layout if layout in ("vec", "amx") else None)

    def fill(self, block: int, seed: int) -> None:
        """Give vLLM block ``block`` KV of its own (what the forward pass would compute)."""
        gen = torch.Generator().manual_seed(seed)
        for tensor in self.kv.values():
            keys, values = (torch.randn(2, 32, 32, generator=gen).bfloat16() for _ in range(2))
            write_like_vllm(tensor, self.layout, block, keys, values)

    def logical(self, block: int) -> list[torch.Tensor]:
        return [torch.cat(logical(view, block)) for view in self.worker._layers]

    def run(self, request, blocks: list[int]) -> tuple[int, set[int]]:
        """Schedule a request as vLLM would: lookup, allocate ``blocks``, one step over the whole prompt."""
        self.blocks[request.request_id] = blocks
        external = self.scheduler.lookup(request, 0)
        if external:
            self.scheduler.planned_load(request, blocks, external)
        plan = self.scheduler.plan([(request.request_id, len(request.prompt_token_ids))])
        self.worker.load(plan)
        failed = self.worker.take_failed_blocks()
        for block in blocks[external // 32:]:
            self.fill(block, seed=block * 31 + len(request.prompt_token_ids))
        self.worker.store(plan)
        self.scheduler.workers_reported(self.worker.take_report())
        return external, failed


def request(req_id: str, prompt: list[int], salt: str | None = None):
    return types.SimpleNamespace(request_id=req_id, prompt_token_ids=prompt, cache_salt=salt, lora_request=None)


def leases(daemon) -> int:
    return redis.Redis(host=daemon.host, port=daemon.port).info("pfxcache")["pfxcache_active_leases"]


def pfxcheck(daemon) -> bytes:
    return redis.Redis(host=daemon.host, port=daemon.port).execute_command("PFXCHECK")


PROMPT = list(range(1, 3 * 32 + 6))      # 3 full pages and a tail


@pytest.mark.parametrize("gather", [False, True], ids=["runs", "gather"])
@pytest.mark.parametrize("layout", ["vec", "amx", "flash"])
def test_pages_move_from_one_engine_to_another(daemon, layout, gather):
    a, b = Engine(daemon, layout, gather=gather), Engine(daemon, layout, gather=gather)
    loaded, _ = a.run(request("r1", PROMPT), [3, 6, 4, 8])          # scattered on both engines
    assert loaded == 0 and a.scheduler.stats["stored_pages"] == 3
    a.scheduler.finished(request("r1", PROMPT))
    assert leases(daemon) == 0

    loaded, failed = b.run(request("r1", PROMPT), [9, 2, 12, 11])   # vLLM's blocks: not a run
    assert loaded == 3 * 32 and not failed
    for mine, theirs in zip((3, 6, 4), (9, 2, 12)):
        assert all(torch.equal(x, y) for x, y in zip(a.logical(mine), b.logical(theirs)))
    b.scheduler.finished(request("r1", PROMPT))
    assert leases(daemon) == 0 and pfxcheck(daemon) == b"OK"
    assert b.scheduler.stats["load_bytes"] == 3 * GEOMETRY.block_bytes


def test_the_page_bytes_are_the_documented_layout(daemon):
    a = Engine(daemon, "vec")
    a.run(request("r1", PROMPT), [0, 1, 2, 3])
    with PrefixCache.from_url(url(daemon)) as cache:
        match = cache.lookup("test:model", PROMPT, lease=False, with_data=True)
    pages = torch.frombuffer(bytearray(match.data), dtype=torch.bfloat16).view(3, *GEOMETRY.shape)
    for page in range(3):
        for layer in range(2):
            keys, values = logical(a.worker._layers[layer], page)
            assert torch.equal(pages[page, layer, 0].reshape(2, -1), keys)
            assert torch.equal(pages[page, layer, 1].reshape(2, -1), values)


def test_a_lease_that_may_have_ended_refuses_the_load(daemon):
    Engine(daemon).run(request("r1", PROMPT), [0, 1, 2, 3])
    b = Engine(daemon)
    with PrefixCache.from_url(url(daemon)) as cache:
        match = cache.lookup("test:model", PROMPT[:64], lease=False)
    stale = LoadJob("r2", "test:model", 0, [5, 6], match.blocks, PROMPT[:64], valid_until=0.0)
    with PrefixCache.from_url(url(daemon)) as cache:
        b.worker.load(StepPlan(loads=[stale], arena=cache.info().arena))
    assert b.worker.take_failed_blocks() == {5, 6}
    report = b.worker.take_report()
    assert report.failed_loads == {"r2": 1} and not report.loaded


def test_a_lease_shorter_than_the_margin_serves_no_loads(daemon):
    Engine(daemon).run(request("r1", PROMPT), [0, 1, 2, 3])
    short = Engine(daemon, lease_ttl_ms=int(LEASE_MARGIN_S * 1000))
    loaded, failed = short.run(request("r1", PROMPT), [4, 5, 6, 7])
    assert loaded == 0 and not failed
    short.scheduler.finished(request("r1", PROMPT))
    assert leases(daemon) == 0


def test_resp_path_loads_and_stores_and_reports_pages_that_went_missing(daemon):
    a = Engine(daemon, transfer="resp")
    assert a.run(request("r1", PROMPT), [0, 1, 2, 3])[0] == 0
    assert a.scheduler.stats["stored_pages"] == 3 and "store_failures" not in a.scheduler.stats
    b = Engine(daemon, transfer="resp")
    loaded, failed = b.run(request("r1", PROMPT), [7, 8, 9, 10])
    assert loaded == 96 and not failed
    assert all(torch.equal(x, y) for x, y in zip(a.logical(1), b.logical(8)))
    # A load planned for more pages than the daemon still has: the first load, the rest are failed blocks.
    job = LoadJob("r9", "test:model", 0, [11, 12, 13, 14], [], PROMPT[:128], valid_until=float("inf"))
    b.worker.load(StepPlan(loads=[job], url=url(daemon)))
    assert b.worker.take_failed_blocks() == {14}
    assert all(torch.equal(x, y) for x, y in zip(a.logical(2), b.logical(13)))


def test_a_store_after_a_failed_load_is_skipped(daemon):
    a = Engine(daemon)
    with PrefixCache.from_url(url(daemon)) as cache:
        arena = cache.info().arena
    bad = LoadJob("r1", "test:model", 0, [1], [0], PROMPT[:32], valid_until=0.0)
    store = StoreJob("r1", "test:model", 0, [1, 2, 3], [0, 1, 2], PROMPT[:96], valid_until=float("inf"))
    plan = StepPlan(loads=[bad], stores=[store], arena=arena)
    a.worker.load(plan)
    a.worker.store(plan)
    report = a.worker.take_report()
    assert report.failed_stores == {"r1": 1} and not report.stored


def test_salted_requests_use_their_own_namespace(daemon):
    a = Engine(daemon)
    a.run(request("r1", PROMPT, salt="tenant-a"), [0, 1, 2, 3])
    assert a.run(request("r2", PROMPT, salt="tenant-b"), [4, 5, 6, 7])[0] == 0
    assert a.run(request("r3", PROMPT, salt="tenant-a"), [8, 9, 10, 11])[0] == 96
    keys = redis.Redis(host=daemon.host, port=daemon.port).keys("test:model*")
    assert {k.decode() for k in keys} == {request_namespace("test:model", "tenant-a"),
                                          request_namespace("test:model", "tenant-b")}


def test_oom_skips_the_store(daemon):
    a = Engine(daemon)
    with PrefixCache.from_url(url(daemon)) as holder:       # pin every block: nothing can be stored
        allocation = holder.alloc("hog", NBLOCKS)
        assert a.run(request("r1", PROMPT), [0, 1, 2, 3]) == (0, set())
        assert a.scheduler.stats["oom"] == 1 and "stored_pages" not in a.scheduler.stats
        allocation.release()
    a.scheduler.finished(request("r1", PROMPT))
    assert leases(daemon) == 0


def test_geometry_mismatch_is_an_error_at_start_naming_the_directives(daemon):
    wrong = PageGeometry(layers=4, kv_heads=2, head_dim=32, page_size=32, dtype="bfloat16")
    scheduler = SchedulerHalf(Settings(url=url(daemon)), wrong, "test:model")
    with pytest.raises(ValueError, match=f"--page-size 32 --block-bytes {wrong.block_bytes}"):
        scheduler.start()


def test_a_dead_daemon_is_survived_and_reconnected_later(daemon):
    skipped = [0.0]       # the scheduler's clock runs ahead by this much: retry_seconds pass without waiting
    port = daemon.port
    a = Engine(daemon, clock=lambda: time.monotonic() + skipped[0], retry_seconds=5.0)
    a.run(request("r1", PROMPT), [0, 1, 2, 3])
    daemon.stop(9)                                          # SIGKILL: no goodbye
    assert a.run(request("r2", PROMPT), [4, 5, 6, 7]) == (0, set())
    assert a.scheduler.stats["errors"] == 1
    assert a.run(request("r3", PROMPT), [8, 9, 10, 11]) == (0, set())
    assert a.scheduler.stats["errors"] == 1                 # not retried before retry_seconds
    again = start_daemon("--port", str(port), "--page-size", "32", "--block-bytes", str(GEOMETRY.block_bytes))
    try:
        skipped[0] += 6
        assert a.run(request("r4", PROMPT), [12, 13, 14, 15]) == (0, set())   # stores into the new daemon
        assert a.scheduler.stats["reconnects"] == 1
        assert a.run(request("r5", PROMPT), [1, 2, 3, 0])[0] == 96
    finally:
        again.stop()


def test_the_cuda_arena_on_the_stand_in(daemon):
    from pfxcache.client.cuda import attach_cuda
    from pfxcache.daemon.store.cuda_arena import CudaArena
    from test_cuda import FAKE_CUPY

    fake = types.ModuleType("fake_cupy")
    exec(compile(FAKE_CUPY, "fake_cupy", "exec"), fake.__dict__)
    arena = CudaArena(GEOMETRY.block_bytes, 8, cupy=fake)
    info = dict(arena.describe(), pid=os.getpid() + 1)       # as a worker process sees it
    a, b = (WorkerHalf(GEOMETRY, open_arena=lambda i: attach_cuda(i, cupy=fake)) for _ in range(2))
    kv_a = {f"l.{i}.attn": kv_tensor("flash", 8, 2, 32, 32) for i in range(2)}
    kv_b = {f"l.{i}.attn": kv_tensor("flash", 8, 2, 32, 32) for i in range(2)}
    for tensor in kv_a.values():
        tensor.copy_(torch.randn(tensor.shape).bfloat16())
    a.register(kv_a)
    b.register(kv_b)
    store = StoreJob("r", "ns", 0, [2, 3], [5, 6], PROMPT[:64], valid_until=float("inf"))
    a.store(StepPlan(stores=[store], arena=info))
    assert a.take_report().stored == {"r": 1}
    load = LoadJob("r", "ns", 0, [0, 7], [5, 6], PROMPT[:64], valid_until=float("inf"))
    b.load(StepPlan(loads=[load], arena=info))
    assert not b.take_failed_blocks()
    for name in kv_a:
        assert torch.equal(kv_a[name][:, 2], kv_b[name][:, 0]) and torch.equal(kv_a[name][:, 3], kv_b[name][:, 7])
    a.close()
    b.close()
    arena.close()


def test_tensor_parallel_workers_each_copy_their_heads(daemon):
    with PrefixCache.from_url(url(daemon)) as cache:
        arena = cache.info().arena
        allocation = cache.alloc("tp", 1)
        ranks = [WorkerHalf(GEOMETRY, tp_rank=r, tp_size=2) for r in range(2)]
        full = {f"l.{i}.attn": kv_tensor("hnd", 4, 2, 32, 32) for i in range(2)}
        for tensor in full.values():
            tensor.copy_(torch.randn(tensor.shape).bfloat16())
        for rank, worker in enumerate(ranks):
            worker.register({name: t[:, :, rank:rank + 1].contiguous() for name, t in full.items()})
            worker.store(StepPlan(stores=[StoreJob("r", "tp", 0, [1], allocation.blocks, PROMPT[:32],
                                                   float("inf"))], arena=arena))
        cache.commit("tp", PROMPT[:32], allocation)
        allocation.release()
        data = cache.lookup("tp", PROMPT[:32], lease=False, with_data=True).data
    page = torch.frombuffer(bytearray(data), dtype=torch.bfloat16).view(*GEOMETRY.shape)
    for layer, tensor in enumerate(full.values()):
        assert torch.equal(page[layer, 0], tensor[1, 0]) and torch.equal(page[layer, 1], tensor[1, 1])
    with pytest.raises(ValueError, match="do not split over 4"):
        WorkerHalf(GEOMETRY, tp_size=4)


def test_consumers_only_load_and_producers_only_store(daemon):
    producer = Engine(daemon, load=False)
    consumer = Engine(daemon, store=False)
    assert consumer.run(request("r1", PROMPT), [0, 1, 2, 3])[0] == 0
    assert "stored_pages" not in consumer.scheduler.stats            # nothing was stored by the consumer
    assert producer.run(request("r1", PROMPT), [0, 1, 2, 3])[0] == 0
    assert producer.scheduler.stats["stored_pages"] == 3
    assert producer.run(request("r2", PROMPT), [4, 5, 6, 7])[0] == 0  # a producer never loads
    assert consumer.run(request("r3", PROMPT), [4, 5, 6, 7])[0] == 96
    for engine, ids in ((producer, ("r1", "r2")), (consumer, ("r1", "r3"))):
        for req_id in ids:
            engine.scheduler.finished(request(req_id, PROMPT))
    assert leases(daemon) == 0


def test_acl_users_come_in_the_url(fresh_daemon):
    acl = fresh_daemon("--page-size", str(GEOMETRY.page_size), "--block-bytes", str(GEOMETRY.block_bytes),
                       "--maxmemory", str(GEOMETRY.block_bytes * NBLOCKS))
    admin = redis.Redis(host=acl.host, port=acl.port)
    admin.execute_command("ACL", "SETUSER", "tenant", "on", ">s3cret", "~tenant:*", "+@pfx", "+hello", "+ping")
    allowed = Engine(acl, url=f"redis://tenant:s3cret@{acl.host}:{acl.port}/0", namespace="tenant:model")
    allowed.run(request("r1", PROMPT), [0, 1, 2, 3])
    assert allowed.scheduler.stats["stored_pages"] == 3
    denied = Engine(acl, url=f"redis://tenant:s3cret@{acl.host}:{acl.port}/0")   # test:model: not its keys
    assert denied.run(request("r1", PROMPT), [0, 1, 2, 3]) == (0, set())
    assert denied.scheduler.stats["errors"] >= 1 and "stored_pages" not in denied.scheduler.stats


@pytest.fixture
def partitioned(fresh_daemon):
    """A daemon with an arena partition for a:* on a unix socket; users ta (a:*) and taz (a:* and z:*)."""
    sock_dir = tempfile.mkdtemp(prefix="pfx-vllm-")
    path = os.path.join(sock_dir, "pfx.sock")
    daemon = fresh_daemon("--page-size", str(GEOMETRY.page_size), "--block-bytes", str(GEOMETRY.block_bytes),
                          "--maxmemory", str(GEOMETRY.block_bytes * NBLOCKS), "--arena-partition", "a:* 12",
                          "--unixsocket", path)
    admin = redis.Redis(host=daemon.host, port=daemon.port)
    for user, patterns in (("ta", ("~a:*",)), ("taz", ("~a:*", "~z:*"))):
        admin.execute_command("ACL", "SETUSER", user, "on", ">pw", *patterns, "+@pfx", "+hello", "+ping")
    yield daemon, path, admin
    shutil.rmtree(sock_dir, ignore_errors=True)


def calls(admin, command: str) -> int:
    return admin.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def loads_in_a_fresh_engine(daemon, a, **settings) -> None:
    """Another engine with ``settings`` loads the 3 pages ``a`` stored for PROMPT, byte for byte, and leaves
    no lease behind."""
    b = Engine(daemon, **settings)
    loaded, failed = b.run(request("r1", PROMPT), [9, 2, 12, 11])
    assert loaded == 3 * 32 and not failed
    for mine, theirs in zip((3, 6, 4), (9, 2, 12)):
        assert all(torch.equal(x, y) for x, y in zip(a.logical(mine), b.logical(theirs)))
    b.scheduler.finished(request("r1", PROMPT))
    assert leases(daemon) == 0 and pfxcheck(daemon) == b"OK"


def test_a_tenant_moves_pages_through_its_partition_over_the_unix_socket(partitioned):
    daemon, path, admin = partitioned
    a = Engine(daemon, url=f"unix://ta:pw@{path}", namespace="a:model")
    loaded, _ = a.run(request("r1", PROMPT), [3, 6, 4, 8])
    assert loaded == 0 and a.scheduler.stats["stored_pages"] == 3
    assert isinstance(a.worker._arena_view, PartitionedArenaView)   # mapped through PFXATTACH, no file
    assert calls(admin, "pfxalloc") == 1 and a.scheduler.stats["store_bytes"] == 3 * GEOMETRY.block_bytes
    a.scheduler.finished(request("r1", PROMPT))

    loads_in_a_fresh_engine(daemon, a, url=f"unix://ta:pw@{path}", namespace="a:model")


def test_namespaces_outside_the_partitions_move_over_resp_with_the_same_url(partitioned):
    daemon, path, admin = partitioned
    a = Engine(daemon, url=f"unix://taz:pw@{path}", namespace="z:model")   # z:* lies in no partition
    a.run(request("r1", PROMPT), [3, 6, 4, 8])
    assert a.scheduler.stats["stored_pages"] == 3 and calls(admin, "pfxalloc") == 0
    a.scheduler.finished(request("r1", PROMPT))
    loads_in_a_fresh_engine(daemon, a, url=f"unix://taz:pw@{path}", namespace="z:model")


def test_over_tcp_a_partitioned_arena_moves_pages_over_resp(partitioned):
    daemon, _, admin = partitioned
    a = Engine(daemon, url=f"redis://ta:pw@{daemon.host}:{daemon.port}/0", namespace="a:model")
    a.run(request("r1", PROMPT), [3, 6, 4, 8])
    assert a.scheduler.stats["stored_pages"] == 3 and calls(admin, "pfxalloc") == 0
    assert a.worker._arena_view is None
    a.scheduler.finished(request("r1", PROMPT))
    assert leases(daemon) == 0
