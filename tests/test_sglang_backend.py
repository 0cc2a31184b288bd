"""pfxcache as SGLang HiCache's storage tier: ``PrefixCacheStorage`` created by SGLang 0.5.23's own
``StorageBackendFactory`` (``dynamic``), with SGLang's own host pool (``MHATokenToKVPoolHost`` on the
CPU), against real daemons.

Each test answers one rule of the backend or one of the issue's questions: bytes in equal bytes out
(plain tensors, and the v1 copies between the host pool and the arena or RESP, in every host
layout); leading hits after pressure eviction are what PFXGET says, with no holes; what
``batch_exists`` reported survives eviction pressure until the get; TP ranks keep their shards apart
and can both load what SGLang's MIN over ranks asks, MLA ranks share one writer's pages; tenants never
meet; stores send only what is missing and link below the previous batch; a killed daemon costs
misses, never an exception; the keys are SGLang's own SHA-256 chain.

Every page's bytes are a function of who wrote it and its key (``payload``), so any read is checked
without keeping a copy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import random
import signal
import sys
import threading

import pytest
import redis

from pfxcache.testing import start_daemon

# scripts/test installs SGLang's storage code and sets this: there a missing SGLang fails instead of skipping.
if importlib.util.find_spec("sglang") is None:
    if os.environ.get("PFXCACHE_REQUIRE_SGLANG") == "1":
        raise RuntimeError("SGLang is not installed (scripts/setup test installs sglang 0.5.23's storage code)")
    pytest.skip("SGLang is not installed (scripts/setup test installs sglang 0.5.23's storage code)",
                allow_module_level=True)

import torch  # noqa: E402  (after the skip: SGLang brings it)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo  # noqa: E402

from pfxcache.client.sglang import PrefixCacheStorage, page_keys  # noqa: E402
from pfxcache.tools.bench_sglang_backend import create, host_pool, pfxcache_extra, storage_config  # noqa: E402

PAGE = 4  # tokens a page
LAYERS, HEADS, HEAD_DIM = 2, 2, 8
PAGE_BYTES = 2 * LAYERS * PAGE * HEADS * HEAD_DIM * 2  # one bfloat16 page of K and V: 512
POOL_PAGES = 40  # host pool pages (after SGLang's padding page 0): 1..20 are stored, 21..40 read into
MODEL = "org/model"
LAYOUTS = ["page_first", "layer_first", "page_first_direct", "page_head"]


def payload(tag: str, key: str) -> bytes:
    return hashlib.shake_256(f"{tag}:{key}".encode()).digest(PAGE_BYTES)


def chain(seed: int, pages: int) -> list[str]:
    """SGLang's keys of a random prompt of ``pages`` pages."""
    rng = random.Random(seed)
    return page_keys([rng.randrange(1 << 31) for _ in range(pages * PAGE)], PAGE)


def page_tensor(data: bytes) -> torch.Tensor:
    """A flat bfloat16 page, as SGLang's generic path hands pages over."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(torch.bfloat16)


def as_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


class Rank:
    """One SGLang rank: the backend SGLang's factory makes, with its own host pool (or none)."""

    def __init__(self, url: str, *, tp_rank: int = 0, tp_size: int = 1, mla: bool = False, pool: bool = True,
                 layout: str = "page_first", **options) -> None:
        self.tag = "mla" if mla else f"tp{tp_rank}"
        self.pool = host_pool(POOL_PAGES, layers=LAYERS, heads=HEADS, head_dim=HEAD_DIM, page_size=PAGE,
                              layout=layout) if pool else None
        config = storage_config(pfxcache_extra(url, **options), tp_rank=tp_rank, tp_size=tp_size, mla=mla,
                                model=MODEL)
        self.backend: PrefixCacheStorage = create("dynamic", config, self.pool)

    def put(self, keys: list[str]) -> bool:
        return self.backend.batch_set(keys, [page_tensor(payload(self.tag, k)) for k in keys])

    def read(self, keys: list[str]) -> int:
        """Pages batch_get brought (a leading run, the rest None), each checked against its payload."""
        targets = [torch.zeros(PAGE_BYTES // 2, dtype=torch.bfloat16) for _ in keys]
        got = self.backend.batch_get(keys, targets)
        found = next((i for i, page in enumerate(got) if page is None), len(keys))
        assert all(page is None for page in got[found:]), "a page after a miss"
        for key, page in zip(keys, got[:found]):
            assert as_bytes(page) == payload(self.tag, key), "wrong bytes"
        return found

    def rows(self, first: int, n: int) -> torch.Tensor:
        """Host indices of pool pages first..first+n-1 (one page_size run each)."""
        return torch.arange(first * PAGE, (first + n) * PAGE, dtype=torch.int64)

    def fill(self, first: int, keys: list[str]) -> None:
        for i, key in enumerate(keys):
            self.pool.set_from_flat_data_page((first + i) * PAGE, page_tensor(payload(self.tag, key)))

    def put_v1(self, keys: list[str], extra_info=None) -> list[bool]:
        self.fill(1, keys)
        return self.backend.batch_set_v1(keys, self.rows(1, len(keys)), extra_info)

    def read_v1(self, keys: list[str]) -> int:
        first = 1 + POOL_PAGES // 2
        self.pool.kv_buffer.zero_()
        ok = self.backend.batch_get_v1(keys, self.rows(first, len(keys)))
        found = ok.index(False) if False in ok else len(ok)
        assert not any(ok[found:]), "a page after a miss"
        for i, key in enumerate(keys[:found]):
            page = self.pool.get_data_page((first + i) * PAGE, flat=True)
            assert as_bytes(page) == payload(self.tag, key), "wrong bytes in the host pool"
        return found

    def close(self) -> None:
        self.backend.close()


def _is_peer(thing) -> bool:
    """A finder or stand-in module of bench-store's peer, or a module it loaded from its copy of the wheel."""
    peer = sys.modules.get("pfxcache.tools.sglang_peer")
    if peer is None:
        return False
    return type(thing).__module__ == peer.__name__ or str(getattr(thing, "__file__", "")).startswith(
        str(peer.peer_dir()))


@pytest.fixture(autouse=True)
def real_sglang():
    """bench-store's peer (pfxcache.tools.sglang_peer), once a test in this process loaded it, answers every
    ``sglang.*`` import with stand-ins: within each test here, SGLang itself answers."""
    finders = [f for f in sys.meta_path if _is_peer(f)]
    stand_ins = {n: m for n, m in sys.modules.items() if n.startswith("sglang") and _is_peer(m)}
    for finder in finders:
        sys.meta_path.remove(finder)
    for name in stand_ins:
        del sys.modules[name]
    yield
    sys.meta_path[0:0] = finders
    for name, module in stand_ins.items():
        sys.modules.setdefault(name, module)


@pytest.fixture
def lab():
    """Daemons and ranks made by a test, all stopped afterwards."""
    made: list = []

    class Lab:
        def daemon(self, *extra: str, pages: int = 64, block_bytes: int = PAGE_BYTES, port: int | None = None):
            # LRU, evicting on demand only: which pages pressure takes is then the same every run.
            args = ["--page-size", str(PAGE), "--block-bytes", str(block_bytes), "--maxmemory",
                    str(pages * block_bytes), "--maxmemory-policy", "lru", "--evict-low-watermark", "0", *extra]
            d = start_daemon(*args, *(("--port", str(port)) if port else ()))
            made.append(d)
            return d

        def rank(self, d, *, user: str = "", **kw) -> Rank:
            rank = Rank(f"redis://{user}{d.host}:{d.port}/0", **kw)
            made.append(rank)
            return rank

    yield Lab()
    for thing in reversed(made):
        if isinstance(thing, Rank):
            thing.close()
        else:
            thing.stop(signal.SIGKILL)


def raw(d) -> redis.Redis:
    return redis.Redis(host=d.host, port=d.port, protocol=3)


def pfxget(d, namespace: str, keys: list[str]) -> int:
    """PFXGET NOLEASE of ``keys`` in ``namespace``, as the daemon answers it."""
    with raw(d) as r:
        return r.execute_command("PFXGET", namespace, "HASHES", len(keys), *keys, "NOLEASE")[b"matched"]


def active_leases(d) -> int:
    with raw(d) as r:
        return int(r.info("pfxcache")["pfxcache_active_leases"])


def commands(r: redis.Redis) -> dict[str, int]:
    return {name[len("cmdstat_"):]: v["calls"] for name, v in r.info("commandstats").items()}


def delta(r: redis.Redis, before: dict[str, int]) -> dict[str, int]:
    """Commands the daemon ran since ``before`` (this INFO included)."""
    return {k: v - before.get(k, 0) for k, v in commands(r).items() if v != before.get(k, 0)}


@pytest.mark.parametrize("transfer", ["auto", "resp"])
def test_pages_round_trip_byte_for_byte_through_sglangs_loader(lab, transfer):
    d = lab.daemon()
    rank = lab.rank(d, pfxcache_transfer=transfer)
    assert type(rank.backend) is PrefixCacheStorage  # SGLang's factory loaded our class
    assert (rank.backend._cache.via == "shm") == (transfer == "auto")
    keys = chain(1, 6)
    assert rank.backend.batch_exists(keys) == 0 and rank.read(keys) == 0
    assert rank.put(keys[:4]) and rank.backend.batch_exists(keys) == 4
    assert rank.put(keys) and rank.read(keys) == 6
    assert rank.backend.exists(keys[5]) and not rank.backend.exists(chain(2, 1)[0])
    single = chain(3, 1)[0]
    assert rank.backend.set(single, page_tensor(payload(rank.tag, single)))
    target = torch.zeros(PAGE_BYTES // 2, dtype=torch.bfloat16)
    assert as_bytes(rank.backend.get(single, target)) == payload(rank.tag, single)
    assert rank.backend.get(chain(4, 1)[0], target) is None
    assert active_leases(d) == 0  # every pin and copy lease ended


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("transfer", ["auto", "resp"])
def test_v1_copies_between_sglangs_host_pool_and_the_daemon(lab, layout, transfer):
    d = lab.daemon()
    rank = lab.rank(d, layout=layout, pfxcache_transfer=transfer)
    assert rank.backend.namespace == f"sglang:{MODEL}:tp0of1:{layout}:bfloat16"
    keys = chain(10, 8)
    assert rank.put_v1(keys) == [True] * 8
    assert rank.backend.batch_exists(keys) == 8 and rank.read_v1(keys) == 8
    # A page is SGLang's flat data page: the generic path reads what v1 wrote, byte for byte.
    assert rank.read(keys) == 8
    assert rank.read_v1(chain(11, 3)) == 0
    assert active_leases(d) == 0


def test_plain_calls_work_without_register_mem_pool_host(lab):
    d = lab.daemon()
    rank = lab.rank(d, pool=False)
    keys = chain(20, 3)
    assert rank.put(keys) and rank.read(keys) == 3
    assert rank.backend.get(keys[0]).numel() == PAGE_BYTES  # no target: a new uint8 tensor
    # The v1 calls need the host pool: refused (logged once), never raised.
    assert rank.backend.batch_get_v1(keys, torch.arange(3 * PAGE)) == [False] * 3
    assert rank.backend.batch_set_v1(keys, torch.arange(3 * PAGE)) == [False] * 3
    # A page of the wrong size is refused, not stored.
    assert not rank.backend.batch_set(chain(21, 1), [torch.zeros(7, dtype=torch.uint8)])
    rank.backend.clear()  # SGLang's clear_storage_backend: this rank's pages go
    assert rank.backend.batch_exists(keys) == 0


@pytest.mark.parametrize("transfer", ["auto", "resp"])
def test_leading_hits_after_pressure_eviction_are_what_pfxget_says_with_no_holes(lab, transfer):
    d = lab.daemon(pages=24)
    rank = lab.rank(d, pfxcache_transfer=transfer)
    chains = [chain(100 + i, 6) for i in range(10)]  # 60 pages through a 24-block arena
    for keys in chains:  # two batches each, the second hung below the first (SGLang's prefix keys)
        assert all(rank.put_v1(keys[:3]))
        assert all(rank.put_v1(keys[3:], HiCacheStorageExtraInfo(prefix_keys=keys[:3])))
    namespace = rank.backend.namespace
    seen = []
    for keys in chains:
        hits = rank.backend.batch_exists(keys)
        assert hits == pfxget(d, namespace, keys)
        assert rank.read_v1(keys) == hits
        for start in range(hits + 1, len(keys)):  # after a miss, nothing of the chain is held
            assert pfxget(d, namespace, keys[start:]) == 0
        tail = rank.backend.batch_exists(keys[3:])  # a batch found from its own first key
        assert tail == pfxget(d, namespace, keys[3:]) and rank.read_v1(keys[3:]) == tail
        seen.append(hits)
    assert seen[-1] == 6 and min(seen) < 6  # the newest chain is whole; older ones were evicted
    assert active_leases(d) == 0
    with raw(d) as r:
        assert r.execute_command("PFXCHECK") == b"OK"


@pytest.mark.parametrize("transfer", ["auto", "resp"])
@pytest.mark.parametrize("pin", [True, False])
def test_what_batch_exists_reported_is_read_by_the_next_get_under_eviction_pressure(lab, transfer, pin):
    d = lab.daemon(pages=16)
    rank = lab.rank(d, pfxcache_transfer=transfer, pfxcache_lease_ttl_ms=10_000 if pin else 0)
    writer = lab.rank(d, tp_rank=0, pool=False, pfxcache_namespace="other")
    keys = chain(200, 8)
    assert all(rank.put_v1(keys))
    assert rank.backend.batch_exists(keys) == 8
    for i in range(6):  # 24 other pages through the 8 blocks the lookup left unpinned
        assert writer.put(chain(300 + i, 4))
    if pin:
        assert rank.read_v1(keys) == 8  # all that exists reported, every byte right
        assert active_leases(d) == 0  # the get ended the pin
        for i in range(6):
            writer.put(chain(400 + i, 4))
        assert rank.backend.batch_exists(keys) < 8  # unpinned now: evicted like any page
    else:
        assert rank.read_v1(keys) < 8  # without the pin, the pressure took them


def test_a_lookup_is_one_command_and_its_get_two_more(lab):
    d = lab.daemon()
    rank = lab.rank(d)
    keys = chain(500, 16)
    assert all(rank.put_v1(keys))
    with raw(d) as r:
        before = commands(r)
        assert rank.backend.batch_exists(keys) == 16
        assert delta(r, before) == {"pfxget": 1, "info": 1}
        before = commands(r)
        assert rank.read_v1(keys) == 16
        assert delta(r, before) == {"pfxget": 1, "pfxrelease": 1, "info": 1}  # lookup, copy, end the pin


def test_batches_store_only_what_is_missing_and_link_below_the_previous_batch(lab):
    d = lab.daemon()
    rank = lab.rank(d)
    keys = chain(600, 10)
    assert all(rank.put_v1(keys[:5]))
    assert rank.backend.stats["pages_stored"] == 5
    assert all(rank.put_v1(keys[:8]))
    assert rank.backend.stats["pages_stored"] == 8  # only the three missing pages went
    assert all(rank.put_v1(keys[8:], HiCacheStorageExtraInfo(prefix_keys=keys[:8])))
    namespace = rank.backend.namespace
    assert pfxget(d, namespace, keys) == 10
    with raw(d) as r:  # evicting page 5 drops everything hung below it, across the batches
        r.execute_command("PFXEVICT", namespace, "HASHES", 5, *keys[:5])
    assert pfxget(d, namespace, keys) == 4 and pfxget(d, namespace, keys[8:]) == 0
    # Without the prefix keys a batch stands alone: the same eviction leaves it.
    other = chain(601, 6)
    assert all(rank.put_v1(other[:3])) and all(rank.put_v1(other[3:]))
    with raw(d) as r:
        r.execute_command("PFXEVICT", namespace, "HASHES", 3, *other[:3])
    assert pfxget(d, namespace, other) == 2 and pfxget(d, namespace, other[3:]) == 3


def test_two_tp_ranks_keep_their_shards_and_can_both_load_what_min_asks(lab):
    d = lab.daemon(pages=24)
    ranks = [lab.rank(d, tp_rank=r, tp_size=2) for r in range(2)]
    assert [rank.backend.namespace.split(":")[2] for rank in ranks] == ["tp0of2", "tp1of2"]
    chains = [chain(700 + i, 6) for i in range(4)]
    for keys in chains:  # the ranks store the same pages, each its own shard's bytes
        for rank in ranks:
            assert all(rank.put_v1(keys))
    for keys in chains:
        hits = [rank.backend.batch_exists(keys) for rank in ranks]
        assert hits == [pfxget(d, rank.backend.namespace, keys) for rank in ranks]
        agreed = min(hits)  # SGLang's all_reduce(MIN) over the ranks
        for rank in ranks:
            assert rank.read_v1(keys[:agreed]) == agreed  # each its own bytes (read_v1 checks the tag)
    assert active_leases(d) == 0
    assert [pfxget(d, rank.backend.namespace, chains[-1]) for rank in ranks] == [6, 6]


def test_mla_ranks_share_one_writers_pages(lab):
    d = lab.daemon()
    ranks = [lab.rank(d, tp_rank=r, tp_size=2, mla=True) for r in range(2)]
    assert ranks[0].backend.namespace == ranks[1].backend.namespace == f"sglang:{MODEL}:mla:page_first:bfloat16"
    keys = chain(800, 5)
    assert all(ranks[1].put_v1(keys))  # not the writer: nothing sent
    assert pfxget(d, ranks[0].backend.namespace, keys) == 0
    assert all(ranks[0].put_v1(keys))
    assert [rank.read_v1(keys) for rank in ranks] == [5, 5]


def test_sglangs_three_storage_threads_share_one_backend(lab):
    """SGLang calls batch_exists (prefetch thread), batch_get (I/O thread) and batch_set (backup thread)
    at once: every read right, no call fails, no lease left."""
    d = lab.daemon(pages=256)
    rank = lab.rank(d)
    stored = [chain(1500 + i, 4) for i in range(4)]
    for keys in stored:
        assert rank.put(keys)
    failures: list[BaseException] = []

    def run(fn) -> None:
        try:
            for i in range(25):
                fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    def prefetch(i: int) -> None:
        keys = stored[i % len(stored)]
        assert rank.backend.batch_exists(keys) == 4 and rank.read(keys) == 4

    def backup(i: int) -> None:
        assert all(rank.put_v1(chain(1600 + i, 4)))

    threads = [threading.Thread(target=run, args=(fn,)) for fn in (prefetch, prefetch, backup)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    assert rank.read_v1(chain(1624, 4)) == 4 and active_leases(d) == 0


ACL = ("user tenant-a on >pa ~a:* +@pfx +ping +hello\n"
       "user tenant-b on >pb ~b:* +@pfx +ping +hello\n")


def test_two_tenants_never_see_each_others_pages(lab, tmp_path):
    aclfile = tmp_path / "users.acl"
    aclfile.write_text(ACL)
    d = lab.daemon("--aclfile", str(aclfile))
    a = lab.rank(d, user="tenant-a:pa@", pfxcache_namespace="a:sglang")
    b = lab.rank(d, user="tenant-b:pb@", pfxcache_namespace="b:sglang")
    keys = chain(900, 4)
    assert all(a.put_v1(keys))
    assert b.backend.batch_exists(keys) == 0 and b.read_v1(keys) == 0
    assert a.backend.batch_exists(keys) == 4 and a.read_v1(keys) == 4
    b.tag = "tenant-b"  # the same keys, other bytes: each tenant reads its own
    assert all(b.put_v1(keys)) and b.read_v1(keys) == 4
    assert a.read_v1(keys) == 4
    # B pointed at A's namespace: the daemon refuses, B sees misses and no exception.
    spy = lab.rank(d, user="tenant-b:pb@", pfxcache_namespace="a:sglang")
    assert spy.backend.batch_exists(keys) == 0 and spy.read_v1(keys) == 0
    assert spy.put_v1(chain(901, 2)) == [False, False]
    assert a.backend.batch_exists(chain(901, 2)) == 0
    assert spy.backend.stats["errors"] > 0


def test_a_daemon_killed_mid_run_costs_misses_never_an_exception(lab, caplog):
    d = lab.daemon()
    rank = lab.rank(d, pfxcache_retry_seconds=0)
    keys = chain(1000, 4)
    assert all(rank.put_v1(keys)) and rank.put(chain(1001, 2))
    assert rank.backend.batch_exists(keys) == 4  # pinned ...
    d.stop(signal.SIGKILL)  # ... and the daemon dies before the get
    with caplog.at_level(logging.WARNING, logger="pfxcache.sglang"):
        for _ in range(3):
            assert rank.read_v1(keys) == 0 and rank.read(chain(1001, 2)) == 0
            assert rank.backend.batch_exists(keys) == 0 and not rank.backend.exists(keys[0])
            assert rank.put_v1(chain(1002, 2)) == [False, False] and not rank.put(chain(1003, 1))
            assert rank.backend.get(keys[0]) is None and not rank.backend.set(keys[0], page_tensor(bytes(PAGE_BYTES)))
            rank.backend.clear()
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1  # logged once
    # A new daemon on the same port: the backend reconnects and caches again.
    d2 = lab.daemon(port=d.port)
    assert all(rank.put_v1(keys)) and rank.backend.batch_exists(keys) == 4 and rank.read_v1(keys) == 4
    assert rank.backend.stats["reconnects"] == 1 and d2.proc.poll() is None


def test_a_daemon_of_the_wrong_block_bytes_is_a_clear_error_at_register(lab, caplog):
    d = lab.daemon(block_bytes=2 * PAGE_BYTES)
    with pytest.raises(ValueError, match=f"--block-bytes {PAGE_BYTES}"):
        lab.rank(d)
    # Without a host pool the backend cannot know a page's size: pages of another size are refused.
    with caplog.at_level(logging.ERROR, logger="pfxcache.sglang"):
        rank = lab.rank(d, pool=False)
        assert not rank.put(chain(1100, 2))
    assert any("block-bytes" in r.getMessage() for r in caplog.records)
    # Page keys need key pages of 4 tokens or more: a daemon of 2-token pages serves misses, logged.
    small = lab.daemon("--page-size", "2")
    with caplog.at_level(logging.ERROR, logger="pfxcache.sglang"):
        rank = lab.rank(small, pool=False)
        assert not rank.put(chain(1101, 1)) and rank.backend.batch_exists(chain(1101, 1)) == 0
    assert any("--page-size 4 or more" in r.getMessage() for r in caplog.records)


def test_keys_are_sglangs_own_sha256_chain(lab):
    from sglang.srt.mem_cache.utils import get_hash_str, get_storage_hash_str, storage_namespace_seed

    rng = random.Random(1200)
    for n in (1, PAGE, 3 * PAGE, 5 * PAGE + 3):  # the last page may be partial
        tokens = [rng.randrange(1 << 31) for _ in range(n)]
        assert page_keys(tokens, PAGE) == get_hash_str(tokens, None, page_size=PAGE)
        prior = get_hash_str(tokens[:PAGE], None, page_size=PAGE)[0]
        assert page_keys(tokens, PAGE, prior) == get_hash_str(tokens, prior, page_size=PAGE)
    wide = [1, 2, (1 << 40) + 5, 7]  # past u32: SGLang's wide encoding
    assert page_keys(wide, PAGE) == get_hash_str(wide, None, page_size=PAGE)
    seed = storage_namespace_seed("lora-7", "salt")
    tokens = [rng.randrange(1 << 31) for _ in range(2 * PAGE)]
    assert page_keys(tokens, PAGE, seed) == get_storage_hash_str(tokens, seed, page_size=PAGE)
    # Pages SGLang stored under its own keys are found by a tool computing them with page_keys.
    d = lab.daemon()
    rank = lab.rank(d)
    assert all(rank.put_v1(get_hash_str(tokens, None, page_size=PAGE)))
    assert pfxget(d, rank.backend.namespace, page_keys(tokens, PAGE)) == 2


def test_the_benchmark_runs_and_checks_every_byte(capsys):
    from pfxcache.tools import bench_sglang_backend

    argv = ["--layers", "2", "--heads", "2", "--head-dim", "8", "--page-size", "4", "--pages", "8",
            "--rounds", "1", "--warmup", "0", "--quiet", "--json"]
    assert bench_sglang_backend.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["via"]["pfxcache"] == "shm" and doc["page_bytes"] == PAGE_BYTES
    assert set(doc["results"]) == {"memcpy", "memcpy pieces", "file set", "file get (disk)", "file get (cached)",
                                   "pfxcache set", "pfxcache get", "pfxcache v1 set", "pfxcache v1 get", "v1-resp set",
                                   "v1-resp get"}



def test_the_benchmark_gets_the_same_pages_from_mooncake_store_beside_ours(capsys):
    """--mooncake: Mooncake Store's CPU build (master, holder, reader over TCP) fetches the same number of
    pages of the same size; its reader checks every byte. Skipped where scripts/setup could not install it."""
    from pfxcache.tools import bench_sglang_backend, mooncake_peer

    try:
        mooncake_peer.locate()
    except mooncake_peer.PeerUnavailable as exc:
        pytest.skip(str(exc))
    argv = ["--layers", "2", "--heads", "2", "--head-dim", "8", "--page-size", "4", "--pages", "8",
            "--rounds", "2", "--warmup", "0", "--quiet", "--json", "--mooncake"]
    assert bench_sglang_backend.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["results"]["mooncake get"]["ms"] > 0
    assert "pfxcache v1 get / mooncake get" in doc["ratios"]
    assert "pfxcache v1 get / mooncake get" not in doc["targets_met"]  # side by side: no target
