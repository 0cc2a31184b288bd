"""Arena partitions (issue 12 item 4): the namespaces of a tenant store only in its partition's
blocks, a full partition evicts only its own pages, and bad layouts are startup errors.

Real daemons over real sockets; the store-level property test runs every operation against a
partitioned store and checks every invariant (PFXCHECK's) after each one.
"""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest
import redis

from pfxcache.daemon.store import PrefixStore
from pfxcache.daemon.store.arena import MemoryArena
from pfxcache.daemon.store.errors import BadRequest, OutOfMemory

PS, BB = 4, 4096  # one memory page per block: every partition size is page aligned


def tokens(first: int, pages: int = 1) -> list[int]:
    return [first, *range(1, pages * PS)]


def partitioned(fresh_daemon, *extra: str):
    daemon = fresh_daemon("--page-size", str(PS), "--block-bytes", str(BB), "--maxmemory", str(64 * BB),
                          "--evict-low-watermark", "0", "--arena-partition", "a:* 16",
                          "--arena-partition", "b:* 64kb", *extra)
    return daemon, redis.Redis(host=daemon.host, port=daemon.port)


def layout(client) -> list[dict]:
    return client.execute_command("PFXINFO")[b"arena"][b"partitions"]


def test_each_partition_gets_its_range_and_the_rest_is_shared(fresh_daemon):
    _, client = partitioned(fresh_daemon)
    parts = layout(client)
    assert [(p[b"pattern"], p[b"first-block"], p[b"nblocks"], p[b"remainder"]) for p in parts] == [
        (b"a:*", 0, 16, 0), (b"b:*", 16, 16, 0), (b"*", 32, 32, 1)]
    ranges = {b"a:1": range(0, 16), b"b:1": range(16, 32), b"other": range(32, 64)}
    for name, where in ranges.items():
        for i in range(5):
            client.execute_command("PFXSET", name, "TOKENS", *tokens(i, 2), "DATA", bytes([i]) * 2 * BB)
        found = client.execute_command("PFXGET", name, "TOKENS", *tokens(3, 2))
        assert found[b"blocks"] and all(b in where for b in found[b"blocks"]), (name, found)
        client.execute_command("PFXRELEASE", found[b"lease"])
        fresh = client.execute_command("PFXALLOC", name, 3)[b"blocks"]
        assert all(b in where for b in fresh), (name, fresh)
    assert client.execute_command("PFXCHECK") == b"OK"
    assert client.config_get("arena-partition") == {"arena-partition": "a:* 16 b:* 64kb"}
    info = client.info("pfxcache")
    assert info["pfxcache_arena_partitions"] == 3
    assert info["pfxcache_arena_partition0"] == {"pattern": "a:*", "first_block": 0, "nblocks": 16, "free": 3,
                                                 "pages": 10}
    assert info["pfxcache_arena_partition2"]["pattern"] == "*"


def test_a_full_partition_evicts_only_its_own_pages(fresh_daemon):
    _, client = partitioned(fresh_daemon)
    for i in range(8):  # b holds 8 of its 16 blocks, the remainder 8 of its 32
        client.execute_command("PFXSET", "b:keep", "TOKENS", *tokens(i), "DATA", bytes([i + 1]) * BB)
        client.execute_command("PFXSET", "shared", "TOKENS", *tokens(i), "DATA", bytes([i + 101]) * BB)
    before = {name: client.execute_command("PFXINFO", name)[b"stats"][b"pages"] for name in ("b:keep", "shared")}
    for i in range(100):  # far more than a's 16 blocks
        client.execute_command("PFXSET", f"a:{i % 3}", "TOKENS", *tokens(i), "DATA", bytes([i % 251]) * BB)
    info = client.execute_command("PFXINFO")
    a_part = info[b"arena"][b"partitions"][0]
    assert a_part[b"pages"] == 16 and info[b"stats"][b"evictions_pressure"] == 100 - 16
    for name in ("b:keep", "shared"):
        stats = client.execute_command("PFXINFO", name)[b"stats"]
        assert stats[b"pages"] == before[name] and stats[b"evictions"] == 0
    for i in range(8):  # every page of b and of the remainder still hits, with its own bytes
        for name, byte in (("b:keep", i + 1), ("shared", i + 101)):
            found = client.execute_command("PFXGET", name, "TOKENS", *tokens(i), "WITHDATA", "NOLEASE")
            assert found[b"matched"] == PS and found[b"data"] == bytes([byte]) * BB
    assert client.execute_command("PFXCHECK") == b"OK"


def test_a_partition_whose_pages_are_all_pinned_refuses_and_never_borrows(fresh_daemon):
    _, client = partitioned(fresh_daemon)
    hog = client.execute_command("PFXALLOC", "a:hog", 16)
    assert len(hog[b"blocks"]) == 16
    with pytest.raises(redis.ResponseError, match="cannot allocate 1 blocks in arena partition 'a:\\*'"):
        client.execute_command("PFXSET", "a:x", "TOKENS", *tokens(1), "DATA", b"x" * BB)
    with pytest.raises(redis.ResponseError, match="cannot allocate .*partition 'a:\\*'"):
        client.execute_command("PFXALLOC", "a:x", 1)
    # b and the remainder are untouched by a's exhaustion
    client.execute_command("PFXSET", "b:x", "TOKENS", *tokens(1), "DATA", b"y" * BB)
    client.execute_command("PFXSET", "other", "TOKENS", *tokens(1), "DATA", b"z" * BB)
    assert client.execute_command("PFXRELEASE", hog[b"lease"]) == 1
    assert client.execute_command("PFXCHECK") == b"OK"


def test_blocks_of_another_partition_cannot_be_committed(fresh_daemon):
    _, client = partitioned(fresh_daemon)
    blocks = client.execute_command("PFXALLOC", "b:x", 1)[b"blocks"]
    before = client.execute_command("PFXINFO")[b"stats"]
    with pytest.raises(redis.ResponseError, match=f"block {blocks[0]} is not in the arena partition"):
        client.execute_command("PFXSET", "a:x", "TOKENS", *tokens(1), "BLOCKS", blocks[0])
    assert client.execute_command("PFXINFO")[b"stats"] == before
    client.execute_command("PFXSET", "b:x", "TOKENS", *tokens(1), "BLOCKS", blocks[0])  # its own: fine
    assert client.execute_command("PFXGET", "b:x", "TOKENS", *tokens(1), "NOLEASE")[b"matched"] == PS
    assert client.execute_command("PFXCHECK") == b"OK"


def test_arena_partition_is_immutable(fresh_daemon):
    _, client = partitioned(fresh_daemon)
    with pytest.raises(redis.ResponseError, match="can't set immutable config"):
        client.config_set("arena-partition", "c:* 4")
    assert client.config_get("arena-partition") == {"arena-partition": "a:* 16 b:* 64kb"}


def test_the_watermark_keeps_each_partition_free_with_its_own_pages(fresh_daemon):
    _, client = partitioned(fresh_daemon)
    for i in range(40):
        client.execute_command("PFXSET", "a:x", "TOKENS", *tokens(i), "DATA", b"a" * BB)
    for i in range(8):
        client.execute_command("PFXSET", "b:x", "TOKENS", *tokens(i), "DATA", b"b" * BB)
    client.config_set("evict-low-watermark", "25")
    parts = wait_parts(client, lambda parts: parts[0][b"free"] >= 4)
    assert parts[1][b"pages"] == 8  # b had room to spare: nothing of it went
    assert client.execute_command("PFXCHECK") == b"OK"


def wait_parts(client, predicate):
    from support import wait_for

    wait_for(lambda: predicate(layout(client)), 10, "the watermark task")
    return layout(client)


@pytest.mark.parametrize("args, reason", [
    (("--arena-partition", "a:* 0"), "must hold at least one block"),
    (("--arena-partition", "a:* 12q"), "sizes are a number of blocks or of bytes"),
    (("--arena-partition", "a:*"), "groups of <namespace pattern> <size>"),
    (("--arena-partition", "a:* 4 a:* 8"), "'a:*' is given twice"),
    (("--arena-partition", "a:* 1kb"), "holds no block of block-bytes 4096"),
    (("--arena-partition", "a:* 40 b:* 24"), "the arena partitions take 64 blocks, but maxmemory holds 64"),
    (("--arena-partition", "a:* 1gb"), "maxmemory holds 64"),
    (("--arena-partition", "a:* 4", "--arena", "memory"), "arena-partition needs the shm arena"),
    (("--arena-partition", "a:* 4", "--arena", "cuda"), "arena-partition needs the shm arena"),
])
def test_bad_partitions_are_clear_startup_errors(args, reason):
    result = subprocess.run(
        [sys.executable, "-m", "pfxcache.daemon", "--port", "0", "--block-bytes", str(BB),
         "--maxmemory", str(64 * BB), *args], capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert reason in output and "Traceback" not in output, output


def test_sizes_round_up_to_whole_memory_pages(fresh_daemon):
    daemon = fresh_daemon("--page-size", str(PS), "--block-bytes", "1000", "--maxmemory", str(1000 * 1024),
                          "--arena-partition", "a:* 5")
    client = redis.Redis(host=daemon.host, port=daemon.port)
    a_part, rest = layout(client)
    assert a_part[b"nblocks"] == 512 and rest[b"first-block"] == 512  # 512 x 1000 bytes: 125 pages of 4 kB


# -- the store alone: every operation keeps every invariant, partitions included ------------------------


@pytest.mark.parametrize("policy", ["guard", "lru", "lfu", "hybrid", "tempo"])
def test_random_operations_keep_partitions_consistent_and_apart(policy):
    store = PrefixStore(MemoryArena(64, 40), page_size=2, shards=2, policy=policy,
                        partitions=[(b"a:*", 8), (b"b:*", 8)])
    ranges = {b"a": range(0, 8), b"b": range(8, 16)}
    rng = random.Random(12)
    leases: list[int] = []
    for step in range(1500):
        name = rng.choice([b"a:1", b"a:2", b"b:1", b"c", b"d"])
        packed = np.array([rng.randrange(40) for _ in range(rng.randrange(2, 12))], "<u4").tobytes()
        where = ranges.get(name[:1], range(16, 40))
        op = rng.random()
        try:
            if op < 0.6:
                result = store.insert(name, packed, data=None)
                assert all(b in where for b in result.blocks)
            elif op < 0.75:
                found = store.match(name, packed, owner=1)
                assert all(b in where for b in found.blocks)
                if found.lease_id:
                    leases.append(found.lease_id)
            elif op < 0.85:
                got = store.alloc(name, rng.randrange(1, 3), owner=1)
                assert all(b in where for b in got.blocks)
                leases.append(got.lease_id)
            elif op < 0.9:
                store.evict_pages(name, rng.randrange(4))
            elif op < 0.92:
                store.evict_to_watermark(10)
            elif op < 0.93:
                store.flush()
            elif op < 0.94:
                store.set_policy(rng.choice(["lru", policy]))
            elif op < 0.95:
                store.keys.delete(name)
        except (OutOfMemory, BadRequest):
            pass
        while len(leases) > 3:
            store.release(leases.pop(rng.randrange(len(leases))), 1)
        problems = store.check()
        assert not problems, (step, problems)


# -- a live partitioned daemon under random command sequences -------------------------------------------

FUZZ_NAMES = ["a:1", "a:2", "b:1", "c"]
FUZZ_RANGES = {"a": range(0, 16), "b": range(16, 32), "c": range(32, 64)}
ZERO_MARK = 999  # sequences committed with BLOCKS (never written: zero bytes) start with it


def page_bytes(name: str, toks: list[int], page: int) -> bytes:
    """What every page holds in this test: a function of its namespace and prefix (zeros for BLOCKS ones)."""
    if toks[0] == ZERO_MARK:
        return bytes(BB)
    import hashlib

    seed = hashlib.blake2b(f"{name}/{toks[: (page + 1) * PS]}".encode(), digest_size=16).digest()
    return seed * (BB // 16)


def fuzz_step(rng: random.Random, client, leases: list, held: list) -> None:
    name = rng.choice(FUZZ_NAMES)
    npages = rng.randrange(1, 5)
    base = rng.randrange(6)  # few distinct prompts, so lookups hit and inserts extend cached prefixes
    toks = [base, *[(base * 7 + i) % 5 for i in range(1, 4 * PS)]][: npages * PS]
    op = rng.random()
    try:
        if op < 0.35:
            data = b"".join(page_bytes(name, toks, p) for p in range(npages))
            client.execute_command("PFXSET", name, "TOKENS", *toks, "DATA", data)
        elif op < 0.6:
            form = rng.choice([["WITHDATA", "NOLEASE"], ["WITHDATA"], []])
            found = client.execute_command("PFXGET", name, "TOKENS", *toks, *form)
            blocks = found[b"blocks"]
            assert all(b in FUZZ_RANGES[name[0]] for b in blocks), (name, blocks)
            if b"data" in found:
                pages = found[b"matched"] // PS
                assert found[b"data"] == b"".join(page_bytes(name, toks, p) for p in range(pages))
            if found[b"lease"]:
                leases.append(found[b"lease"])
        elif op < 0.7:
            got = client.execute_command("PFXALLOC", name, rng.randrange(1, 4))
            assert all(b in FUZZ_RANGES[name[0]] for b in got[b"blocks"])
            held.append((name, got[b"lease"], got[b"blocks"]))
        elif op < 0.8 and held:
            owner, lease, blocks = held.pop(rng.randrange(len(held)))
            target = rng.choice([owner, owner, *FUZZ_NAMES])  # sometimes another partition's key
            marked = [ZERO_MARK, *range(1, len(blocks) * PS)]
            try:
                client.execute_command("PFXSET", target, "TOKENS", *marked, "BLOCKS", *blocks)
                assert target[0] == owner[0] or target == owner, (owner, target)
            finally:
                client.execute_command("PFXRELEASE", lease)
        elif op < 0.88 and leases:
            client.execute_command("PFXRELEASE", leases.pop(rng.randrange(len(leases))))
        elif op < 0.95:
            form = rng.choice([["ALL"], ["PAGES", rng.randrange(1, 4)], ["BYTES", rng.randrange(1, 3 * BB)],
                               ["TOKENS", *toks]])
            client.execute_command("PFXEVICT", name, *form)
        elif op < 0.98:
            client.execute_command("DEL", name)
        else:
            client.execute_command("FLUSHALL")
    except redis.ResponseError as exc:
        text = str(exc)
        assert any(reason in text for reason in ("cannot allocate", "not in the arena partition")), text


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_command_sequences_keep_partitions_apart_and_every_byte_right(fresh_daemon, seed):
    _, client = partitioned(fresh_daemon)
    client = redis.Redis(host=client.connection_pool.connection_kwargs["host"],
                         port=client.connection_pool.connection_kwargs["port"], single_connection_client=True)
    rng = random.Random(seed)
    leases: list = []
    held: list = []
    for step in range(400):
        fuzz_step(rng, client, leases, held)
        while len(leases) > 4:
            client.execute_command("PFXRELEASE", leases.pop(0))
        if step % 50 == 49:
            assert client.execute_command("PFXCHECK") == b"OK", step
    assert client.execute_command("PFXCHECK") == b"OK"


def test_config_rewrite_keeps_the_partitions_and_the_file_starts_the_same_layout(tmp_path):
    from pfxcache.daemon.config.engine import Config

    path = tmp_path / "pfx.conf"
    path.write_text("arena-partition a:* 16\narena-partition \"b:*\" 1000k\nhz 10\n")
    config = Config()
    config.load_file(str(path))
    assert [tuple(rule) for rule in config["arena-partition"]] == [("a:*", 16, "blocks"), ("b:*", 10**6, "bytes")]
    config.set([(b"hz", b"20")])
    config.rewrite()
    again = Config()
    again.load_file(str(path))
    assert again["arena-partition"] == config["arena-partition"] and again["hz"] == 20
    assert "1000000b" in path.read_text() or "1000k" in path.read_text()
