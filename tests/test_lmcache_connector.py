"""pfxcache as LMCache's remote tier: ``PrefixCacheConnector`` loaded by LMCache 0.5.6's own plugin loader
(``RemoteBackend`` with ``remote_storage_plugins``, and ``CreateConnector``) against real daemons.

Each test answers one of LMCache's users' complaints about its Redis tier or one rule of the
connector: bytes in equal bytes out; leading hits after pressure eviction are what PFXGET says, with
no holes; what ``batched_contains`` reported survives eviction pressure until the get (no
exists-then-get race, LMCache issue 1467's crash); TP ranks can both serve what LMCache's min over
ranks asks; metadata and data are one page (PR 426); one command per lookup (RFC 1239); tenants kept
apart; a killed daemon costs misses, never an exception.

Every chunk's bytes are a function of its rank and chunk hash (``payload``), so any read is checked
without keeping a copy.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import os
import random
import signal
import threading

import pytest
import redis

from pfxcache.testing import start_daemon

# scripts/test installs lmcache and sets this: there a missing LMCache fails instead of skipping.
if importlib.util.find_spec("lmcache") is None:
    if os.environ.get("PFXCACHE_REQUIRE_LMCACHE") == "1":
        raise RuntimeError("LMCache is not installed (scripts/setup test installs lmcache 0.5.6)")
    pytest.skip("LMCache is not installed (scripts/setup test installs lmcache 0.5.6)", allow_module_level=True)

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")  # LMCache's INFO lines would bury a failure's report

import torch  # noqa: E402  (after the skip: LMCache brings it)
from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.protocol import RemoteMetadata  # noqa: E402
from lmcache.v1.storage_backend.connector import CreateConnector  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: E402
from lmcache.v1.storage_backend.remote_backend import RemoteBackend  # noqa: E402

from pfxcache.client.lmcache import PrefixCacheConnector  # noqa: E402

CHUNK = 16  # tokens a chunk
LAYERS, HEADS, HEAD_DIM = 2, 2, 8
FULL = 2 * LAYERS * CHUNK * HEADS * HEAD_DIM * 2  # bytes of a full bfloat16 chunk: 2048
META = 28  # RemoteMetadata of one group: 7 int32
MODEL = "org/model"


def block_bytes(meta: bool) -> int:
    return FULL + (META if meta else 0)


def payload(worker: int, chunk_hash: int, tokens: int = CHUNK) -> bytes:
    """The bytes of a chunk of ``tokens`` tokens (its [2, layers, tokens, hidden] bfloat16 tensor)."""
    return hashlib.shake_256(b"%d:%x" % (worker, chunk_hash)).digest(FULL * tokens // CHUNK)


def chain(seed: int, n: int, shared: list[int] | None = None) -> list[int]:
    """Chunk hashes of a prompt: ``shared`` leading ones, then fresh ones (LMCache chains its hashes)."""
    rng = random.Random(seed)
    out = list(shared or [])
    while len(out) < n:
        out.append(rng.getrandbits(63))
    return out[:n]


class Engine:
    """One LMCache worker's storage side: config, metadata, local CPU buffer, an event loop and the
    RemoteBackend that loads the connector through ``remote_storage_plugins``."""

    def __init__(self, url: str, *, meta: bool = True, transfer: str = "auto", worker: int = 0, world: int = 1,
                 **extra) -> None:
        self.worker, self.world = worker, world
        self.metadata = LMCacheMetadata(model_name=MODEL, world_size=world, local_world_size=world, worker_id=worker,
                                        local_worker_id=worker, kv_dtype=torch.bfloat16,
                                        kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD_DIM), chunk_size=CHUNK)
        self.config = LMCacheEngineConfig.from_defaults(
            chunk_size=CHUNK, max_local_cpu_size=0.02, remote_serde="naive", remote_storage_plugins=["pfxcache"],
            extra_config={"save_chunk_meta": meta,
                          "remote_storage_plugin.pfxcache.module_path": "pfxcache.client.lmcache",
                          "remote_storage_plugin.pfxcache.class_name": "PrefixCacheConnector",
                          "remote_storage_plugin.pfxcache.pfxcache_url": url,
                          "pfxcache_transfer": transfer, **extra})
        self.cpu = LocalCPUBackend(self.config, self.metadata)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.backend = RemoteBackend(self.config, self.metadata, self.loop, self.cpu, plugin_name="pfxcache")
        self.connector: PrefixCacheConnector = self.backend.connection.getWrappedConnector()

    def keys(self, hashes: list[int]) -> list[CacheEngineKey]:
        return [CacheEngineKey(MODEL, self.world, self.worker, h, torch.bfloat16) for h in hashes]

    def chunk(self, chunk_hash: int, tokens: int = CHUNK):
        obj = self.cpu.allocate(self.metadata.get_shapes(tokens), self.metadata.get_dtypes(), None)
        data = bytearray(payload(self.worker, chunk_hash, tokens))
        obj.tensor.view(torch.uint8).reshape(-1).copy_(torch.frombuffer(data, dtype=torch.uint8))
        return obj

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    def put(self, hashes: list[int], last_tokens: int = CHUNK) -> None:
        """LMCache's store of a batch: the wrapper's batched_put (it drops the references afterwards)."""
        objs = [self.chunk(h, last_tokens if i == len(hashes) - 1 else CHUNK) for i, h in enumerate(hashes)]
        self.run(self.backend.connection.batched_put(self.keys(hashes), objs))

    def store(self, hashes: list[int]) -> None:
        """What a request does: look its prompt up, then store the chunks after the hit."""
        hits = self.backend.batched_contains(self.keys(hashes))
        self.read(hashes[:hits])  # the load, which ends the lookup's lease
        if hits < len(hashes):
            self.put(hashes[hits:])

    def read(self, hashes: list[int]) -> int:
        """batched_get_blocking: the leading run read (every byte and shape checked), freed again."""
        got = self.backend.batched_get_blocking(self.keys(hashes))
        return self.check(hashes, got)

    def check(self, hashes: list[int], got: list) -> int:
        n = 0
        for h, obj in zip(hashes, got):
            if obj is None:
                break
            assert bytes(obj.byte_array) == payload(self.worker, h, obj.get_shapes()[0][2]), f"wrong bytes for {h:x}"
            n += 1
        assert all(obj is None for obj in got[n:]), "a hit after a miss"
        for obj in got[:n]:
            obj.ref_count_down()
        return n

    def close(self) -> None:
        self.backend.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def lab():
    """Daemons and engines made by a test, all stopped afterwards."""
    made: list = []

    class Lab:
        def daemon(self, *extra: str, meta: bool = True, pages: int = 64, port: int | None = None):
            args = ["--page-size", "4", "--block-bytes", str(block_bytes(meta)),
                    "--maxmemory", str(pages * block_bytes(meta)), *extra]
            d = start_daemon(*args, *(("--port", str(port)) if port else ()))
            made.append(d)
            return d

        def engine(self, d, *, user: str = "", **kw) -> Engine:
            e = Engine(f"redis://{user}{d.host}:{d.port}/0", **kw)
            made.append(e)
            return e

    yield Lab()
    for thing in reversed(made):
        if isinstance(thing, Engine):
            thing.close()
        else:
            thing.stop(signal.SIGKILL)


def raw(d) -> redis.Redis:
    return redis.Redis(host=d.host, port=d.port, protocol=3)


def pfxget(d, e: Engine, hashes: list[int]) -> int:
    """PFXGET NOLEASE of the chunks in the engine's namespace, as the daemon answers it."""
    namespace = f"lmcache:{MODEL}@{e.world}@{e.worker}@bfloat16"
    keys = [b"%x" % h for h in hashes]
    with raw(d) as r:
        return r.execute_command("PFXGET", namespace, "HASHES", len(keys), *keys, "NOLEASE")[b"matched"]


def commands(r: redis.Redis) -> dict[str, int]:
    return {name[len("cmdstat_"):]: v["calls"] for name, v in r.info("commandstats").items()}


def delta(r: redis.Redis, before: dict[str, int]) -> dict[str, int]:
    """Commands the daemon ran since ``before`` (this INFO included)."""
    return {k: v - before.get(k, 0) for k, v in commands(r).items() if v != before.get(k, 0)}


def active_leases(d) -> int:
    with raw(d) as r:
        return int(r.info("pfxcache")["pfxcache_active_leases"])


MODES = [(True, "auto"), (False, "auto"), (True, "resp"), (False, "resp")]


@pytest.mark.parametrize("meta,transfer", MODES)
def test_chunks_round_trip_byte_for_byte_through_lmcaches_loader(lab, meta, transfer):
    d = lab.daemon(meta=meta)
    e = lab.engine(d, meta=meta, transfer=transfer)
    assert isinstance(e.connector, PrefixCacheConnector)
    assert e.connector.page_bytes == block_bytes(meta)
    assert e.connector.via == ("shm" if transfer == "auto" else "resp")
    prompt = chain(1, 8)
    e.store(prompt)
    assert e.backend.batched_contains(e.keys(prompt)) == 8
    assert e.read(prompt) == 8
    # One page per chunk, under the namespace model@world@worker@dtype, the chunk hash as its key.
    assert pfxget(d, e, prompt) == 8
    single = e.backend.get_blocking(e.keys(prompt)[3])
    assert e.check(prompt[3:4], [single]) == 1
    assert e.backend.contains(e.keys(prompt)[7]) and not e.backend.contains(e.keys([12345])[0])
    # A prompt's last, partial chunk: kept with its own shape when the page carries the metadata.
    tail = prompt + chain(2, 1)
    e.backend.batched_contains(e.keys(tail))
    e.put(tail[8:], last_tokens=CHUNK // 2)
    got = e.backend.batched_get_blocking(e.keys(tail))
    if meta:
        assert got[8] is not None and list(got[8].get_shapes()[0]) == [2, LAYERS, CHUNK // 2, HEADS * HEAD_DIM]
    assert e.check(tail, got) == (9 if meta else 8)
    assert active_leases(d) == 0  # the gets ended the lookups' leases


def test_create_connector_builds_it_from_a_plugin_url(lab):
    d = lab.daemon()
    e = lab.engine(d)
    made = CreateConnector("plugin://pfxcache", e.loop, e.cpu, e.config, e.metadata)
    try:
        inner = made.getWrappedConnector()
        assert isinstance(inner, PrefixCacheConnector) and inner.url == f"redis://{d.host}:{d.port}/0"
        e.put(chain(3, 2))
        assert made.batched_contains(e.keys(chain(3, 2))) == 2
        got = e.run(made.batched_get(e.keys(chain(3, 2))))
        assert e.check(chain(3, 2), got) == 2
    finally:
        e.run(made.close())


@pytest.mark.parametrize("form", ["yaml", "env"])
def test_the_documented_config_builds_it_with_lmcaches_backend_factory(lab, tmp_path, monkeypatch, form):
    from lmcache.v1.storage_backend import CreateStorageBackends

    d = lab.daemon()
    url = f"redis://{d.host}:{d.port}/0"
    if form == "yaml":  # docs/integrations.md's lmcache.yaml
        config_file = tmp_path / "lmcache.yaml"
        config_file.write_text(f"""chunk_size: {CHUNK}
local_cpu: true
max_local_cpu_size: 0.02
remote_storage_plugins: ["pfxcache"]
extra_config:
  remote_storage_plugin.pfxcache.module_path: pfxcache.client.lmcache
  remote_storage_plugin.pfxcache.class_name: PrefixCacheConnector
  remote_storage_plugin.pfxcache.pfxcache_url: {url}
""")
        config = LMCacheEngineConfig.from_file(str(config_file))
    else:  # and its environment form
        monkeypatch.setenv("LMCACHE_CHUNK_SIZE", str(CHUNK))
        monkeypatch.setenv("LMCACHE_MAX_LOCAL_CPU_SIZE", "0.02")
        monkeypatch.setenv("LMCACHE_REMOTE_STORAGE_PLUGINS", "pfxcache")
        monkeypatch.setenv("LMCACHE_EXTRA_CONFIG", '{"remote_storage_plugin.pfxcache.module_path": '
                           '"pfxcache.client.lmcache", "remote_storage_plugin.pfxcache.class_name": '
                           '"PrefixCacheConnector", "pfxcache_url": "%s"}' % url)
        config = LMCacheEngineConfig.from_env()
    e = lab.engine(d)  # for its metadata, loop and key helpers
    remote = CreateStorageBackends(config, e.metadata, e.loop)["RemoteBackend-pfxcache"]
    try:
        assert isinstance(remote.connection.getWrappedConnector(), PrefixCacheConnector)
        e.put(chain(4, 3))
        assert remote.batched_contains(e.keys(chain(4, 3))) == 3
        assert e.check(chain(4, 3), remote.batched_get_blocking(e.keys(chain(4, 3)))) == 3
    finally:
        remote.close()


@pytest.mark.parametrize("transfer", ["auto", "resp"])
def test_leading_hits_after_pressure_eviction_are_what_pfxget_says_with_no_holes(lab, transfer):
    d = lab.daemon(pages=24)
    e = lab.engine(d, transfer=transfer)
    trunk = chain(10, 3)
    prompts = [chain(100 + i, 6, trunk[: i % 4]) for i in range(14)]  # 84 chunks through 24 pages, shared prefixes
    for prompt in prompts:
        e.store(prompt)
    seen = []
    for prompt in prompts:
        expected = pfxget(d, e, prompt)
        hits = e.backend.batched_contains(e.keys(prompt))
        assert hits == expected
        assert e.read(prompt) == hits  # the whole run readable, nothing after it
        seen.append(hits)
    assert 0 < sum(seen) < 84  # the pressure evicted, not everything


@pytest.mark.parametrize("transfer", ["auto", "resp"])
def test_what_contains_reported_is_read_by_the_next_get_under_eviction_pressure(lab, transfer):
    d = lab.daemon(pages=32)
    e = lab.engine(d, transfer=transfer)
    other = lab.engine(d, transfer=transfer, worker=1, world=2)
    prompt, hint = chain(20, 8), chain(21, 4)
    e.store(prompt)
    e.store(hint)
    assert e.backend.batched_contains(e.keys(prompt)) == 8  # pinned until the get
    assert e.backend.contains(e.keys(hint)[0])  # exists pins nothing
    for i in range(12):  # 96 fresh chunks through an arena of 32 pages
        other.store(chain(200 + i, 8))
    assert pfxget(d, e, hint) == 0  # the pressure was real: what was not pinned is gone
    assert e.read(prompt) == 8
    assert active_leases(d) == 0  # once read, the chunks are ordinary pages again


def test_a_pin_lost_with_its_connection_never_serves_another_pages_bytes(lab):
    d = lab.daemon(pages=16)
    e = lab.engine(d)  # through the arena: the pins are block ids
    other = lab.engine(d, worker=1, world=2)
    prompt = chain(120, 8)
    e.store(prompt)
    assert e.backend.batched_contains(e.keys(prompt)) == 8
    with raw(d) as r:  # the daemon drops the connector's connection, and with it the lease
        r.execute_command("CLIENT", "KILL", "ID", e.connector._cache.client.client_id())
    for i in range(4):  # 32 other chunks through 16 pages: the pinned blocks now hold other pages
        other.store(chain(1200 + i, 8))
    assert pfxget(d, e, prompt) == 0
    assert e.read(prompt) == 0  # the copies are thrown away (a miss), never served


def test_a_copy_made_after_its_lease_ended_is_thrown_away_and_read_again(lab, monkeypatch):
    import pfxcache.client.lmcache_pins as module

    d = lab.daemon()
    # The connector trusts its pins 5 s longer than the daemon keeps the lease (a stalled worker).
    monkeypatch.setattr(module, "LEASE_MARGIN_S", -5.0)
    e = lab.engine(d, pfxcache_lease_ttl_ms=200)
    prompt = chain(125, 4)
    e.store(prompt)
    assert e.backend.batched_contains(e.keys(prompt)) == 4
    threading.Event().wait(0.5)  # the daemon fences the lease: PFXRELEASE will count 0
    with raw(d) as r:
        before = commands(r)
        assert e.read(prompt) == 4  # right bytes: copied again under a fresh lease
        assert delta(r, before) == {"pfxrelease": 2, "pfxget": 1, "info": 1}


def test_two_tp_ranks_can_both_serve_what_lmcaches_min_over_ranks_asks(lab):
    d = lab.daemon(pages=40)
    ranks = [lab.engine(d, worker=w, world=2) for w in (0, 1)]
    other = lab.engine(d, worker=0, world=4)  # another engine's stores: the pressure
    prompts = [chain(300 + i, 6, chain(30, 2)) for i in range(10)]
    for prompt in prompts:
        for rank in ranks:
            rank.store(prompt)
    newest = prompts[-1]  # stored identically and not evicted: the ranks agree exactly
    assert [rank.backend.batched_contains(rank.keys(newest)) for rank in ranks] == [6, 6]
    assert [rank.read(newest) for rank in ranks] == [6, 6]
    unread = 0
    for n, prompt in enumerate(prompts):
        hits = [rank.backend.batched_contains(rank.keys(prompt)) for rank in ranks]
        assert hits == [pfxget(d, rank, prompt) for rank in ranks]
        for i in range(5):  # evictions between the lookups and the loads
            other.put(chain(3000 + 10 * n + i, 8))
        want = min(hits)  # what LMCache's lookup client tells vLLM
        # Every rank loads all of it (each from its own namespace: Engine.check knows the rank's bytes).
        assert [rank.read(prompt[:want]) for rank in ranks] == [want, want]
        unread += sum(want == 0 < h for h in hits)  # no load: that lookup's lease waits (TTL, or superseded)
    assert active_leases(d) <= unread  # the loads ended every lease they read from


def test_metadata_and_data_are_one_page_never_evicted_apart(lab):
    d = lab.daemon(pages=20)
    e = lab.engine(d)
    rng = random.Random(5)
    stored = []
    for i in range(16):  # prompts ending in partial chunks of every size, through 20 pages
        prompt = chain(400 + i, 3)
        e.backend.batched_contains(e.keys(prompt))
        tokens = rng.randrange(1, CHUNK + 1)
        e.put(prompt, last_tokens=tokens)
        stored.append((prompt, tokens))
    present = 0
    for prompt, tokens in stored:
        for key, h in zip(e.keys(prompt), prompt):
            exists = e.backend.contains(key)
            got = e.backend.get_blocking(key)
            assert exists == (got is not None), "metadata without its data (or data without its metadata)"
            if got is not None:
                size = tokens if h == prompt[-1] else CHUNK
                assert list(got.get_shapes()[0]) == [2, LAYERS, size, HEADS * HEAD_DIM]
                assert e.check([h], [got]) == 1
                present += 1
    assert 0 < present < 48
    # The page's trailer is LMCache's own RemoteMetadata: the layout the docs describe.
    prompt, tokens = stored[-1]
    namespace = f"lmcache:{MODEL}@1@0@bfloat16"
    with raw(d) as r:
        page = r.execute_command("PFXGET", namespace, "HASHES", 1, b"%x" % prompt[-1], "NOLEASE", "WITHDATA")[b"data"]
    assert len(page) == block_bytes(True)
    trailer = RemoteMetadata.deserialize(page[FULL:])
    assert trailer.length == FULL * tokens // CHUNK and page[:trailer.length] == payload(0, prompt[-1], tokens)


@pytest.mark.parametrize("transfer", ["auto", "resp"])
def test_a_lookup_of_64_chunks_is_one_command_and_its_load_one_more(lab, transfer):
    d = lab.daemon(pages=80)
    e = lab.engine(d, transfer=transfer)
    prompt = chain(50, 64)
    e.store(prompt)
    with raw(d) as r:
        before = commands(r)
        assert e.backend.batched_contains(e.keys(prompt)) == 64
        assert delta(r, before) == {"pfxget": 1, "info": 1}  # (the INFO is this test's own)
        before = commands(r)
        assert e.read(prompt) == 64
        # Through the mapped arena the pinned pages are copied with no command; over RESP, one PFXGET WITHDATA.
        assert delta(r, before) == ({"pfxrelease": 1, "info": 1} if transfer == "auto"
                                    else {"pfxget": 1, "pfxrelease": 1, "info": 1})


def test_big_transfers_over_resp_go_in_slices_that_chain(lab, monkeypatch):
    import pfxcache.client.lmcache as module

    monkeypatch.setattr(module, "WITHDATA_BYTES", 3 * block_bytes(True))  # 3 chunks a command
    d = lab.daemon()
    e = lab.engine(d, transfer="resp")
    prompt = chain(110, 8)
    with raw(d) as r:
        before = commands(r)
        e.backend.batched_contains(e.keys(prompt))
        e.put(prompt)
        assert delta(r, before) == {"pfxget": 2, "pfxset": 3, "info": 1}  # lookup, what is missing, 3 slices
        assert r.execute_command("PFXGET", f"lmcache:{MODEL}@1@0@bfloat16", "HASHES", 8,
                                 *[b"%x" % h for h in prompt], "NOLEASE")[b"matched"] == 8  # one chain
        before = commands(r)
        assert e.backend.batched_contains(e.keys(prompt)) == 8 and e.read(prompt) == 8
        assert delta(r, before) == {"pfxget": 1 + 3, "pfxrelease": 1, "info": 1}


def test_batches_store_only_what_is_missing_and_link_below_their_parent(lab):
    d = lab.daemon()
    e = lab.engine(d)
    prompt = chain(60, 8)
    assert e.backend.batched_contains(e.keys(prompt)) == 0  # LMCache looks a prompt up before storing it
    e.put(prompt[:3])
    e.put(prompt[3:6])  # a later batch of the same request: linked below chunk 2
    e.put(prompt[2:8])  # overlapping: only the two missing are sent
    assert e.connector.stats["stored"] == 8
    assert pfxget(d, e, prompt) == 8
    lone = chain(61, 5)
    e.put(lone[2:])  # a batch whose parent this connector never saw: a chain of its own, found by its first key
    assert pfxget(d, e, lone) == 0 and pfxget(d, e, lone[2:]) == 3
    assert e.backend.remove(e.keys(prompt)[5]) and pfxget(d, e, prompt) == 5


def test_the_async_lookup_and_load_lmcache_uses_for_prefetch(lab):
    d = lab.daemon()
    e = lab.engine(d)
    prompt = chain(70, 6)
    e.store(prompt)
    hits = e.run(e.backend.batched_async_contains("req-1", e.keys(prompt + chain(71, 2))))
    assert hits == 6
    got = e.run(e.backend.batched_get_non_blocking("req-1", e.keys(prompt)))
    assert len(got) == 6 and e.check(prompt, got) == 6
    assert active_leases(d) == 0


def test_leases_no_get_consumes_end_after_their_ttl_when_superseded_or_too_many(lab, monkeypatch):
    import pfxcache.client.lmcache_pins as module

    d = lab.daemon()
    e = lab.engine(d, pfxcache_lease_ttl_ms=1050)  # readable for 50 ms (the lease's TTL less a 1 s margin)
    prompts = [chain(80 + i, 2) for i in range(6)]
    for prompt in prompts:
        e.store(prompt)
    assert active_leases(d) == 0
    e.backend.batched_contains(e.keys(prompts[0]))
    assert active_leases(d) == 1
    threading.Event().wait(0.2)
    e.backend.batched_contains(e.keys(prompts[1]))  # the stale lease ends first
    assert active_leases(d) == 1
    threading.Event().wait(0.2)
    assert e.read(prompts[1]) == 2  # an expired pin is read afresh, and its lease ends with the get
    assert active_leases(d) == 0
    again = lab.engine(d)
    for _ in range(5):  # LMCache asks again while a request waits: each lookup supersedes the one before
        assert again.backend.batched_contains(again.keys(prompts[2])) == 2
    assert active_leases(d) == 2  # the newest, and the one it superseded (ended by the next lookup or get)
    again.read(prompts[2])
    assert active_leases(d) == 0
    monkeypatch.setattr(module, "MAX_LEASES", 2)
    for prompt in prompts:
        assert again.backend.batched_contains(again.keys(prompt)) == 2
    assert active_leases(d) == 3  # MAX_LEASES kept, plus the newest


ACL = ("user tenant-a on >pa ~a:* +@pfx +ping +hello\n"
       "user tenant-b on >pb ~b:* +@pfx +ping +hello\n")


def test_two_tenants_never_see_each_others_chunks(lab, tmp_path):
    aclfile = tmp_path / "users.acl"
    aclfile.write_text(ACL)
    d = lab.daemon("--aclfile", str(aclfile))
    a = lab.engine(d, user="tenant-a:pa@", pfxcache_namespace="a:lmcache")
    b = lab.engine(d, user="tenant-b:pb@", pfxcache_namespace="b:lmcache", worker=0)
    prompt = chain(90, 4)
    a.store(prompt)
    assert b.backend.batched_contains(b.keys(prompt)) == 0 and b.read(prompt) == 0
    assert a.read(prompt) == 4
    # B pointed at A's namespace: the daemon refuses, B sees misses and no exception.
    spy = lab.engine(d, user="tenant-b:pb@", pfxcache_namespace="a:lmcache")
    assert spy.backend.batched_contains(spy.keys(prompt)) == 0 and spy.read(prompt) == 0
    spy.put(chain(91, 2))
    assert a.backend.batched_contains(a.keys(chain(91, 2))) == 0
    assert spy.connector.stats["errors"] > 0


def test_a_daemon_killed_mid_run_costs_misses_never_an_exception(lab):
    d = lab.daemon()
    e = lab.engine(d, pfxcache_retry_seconds=0)
    prompt = chain(95, 4)
    e.store(prompt)
    assert e.backend.batched_contains(e.keys(prompt)) == 4  # pinned ...
    d.stop(signal.SIGKILL)  # ... and the daemon dies before the load
    assert e.backend.batched_get_blocking(e.keys(prompt)) == [None] * 4
    assert e.backend.get_blocking(e.keys(prompt)[0]) is None
    assert e.backend.batched_contains(e.keys(prompt)) == 0
    assert not e.backend.contains(e.keys(prompt)[0])
    e.put(chain(96, 2))
    assert e.run(e.backend.batched_async_contains("r", e.keys(prompt))) == 0
    assert e.run(e.backend.batched_get_non_blocking("r", e.keys(prompt))) == []
    assert not e.backend.remove(e.keys(prompt)[0])
    assert e.run(e.connector.ping()) == 1
    # A new daemon on the same port: the connector reconnects and caches again.
    d2 = lab.daemon(port=d.port)
    e.store(prompt)
    assert e.backend.batched_contains(e.keys(prompt)) == 4 and e.read(prompt) == 4
    assert e.connector.stats["reconnects"] == 1 and e.run(e.connector.ping()) == 0
    assert d2.proc.poll() is None


def test_a_daemon_of_the_wrong_geometry_serves_misses(lab, caplog):
    d = lab.daemon(meta=False)  # pages without the metadata trailer
    with caplog.at_level("ERROR", logger="pfxcache.lmcache"):
        e = lab.engine(d, meta=True)
    assert any(f"--block-bytes {block_bytes(True)}" in r.getMessage() for r in caplog.records)
    e.put(chain(97, 2))
    assert e.backend.batched_contains(e.keys(chain(97, 2))) == 0
