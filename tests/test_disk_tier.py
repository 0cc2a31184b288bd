"""The disk tier on real daemons: pages evicted from a tiny arena come back from disk in the same
PFXGET, byte for byte; restarts, kill -9, FLUSHALL, PFXEVICT, DEL, damaged files and injected I/O
faults cost misses and counters, never a wrong byte.

Every page's bytes are a function of its namespace and its whole token prefix (``payload``), so any
answer can be checked after any crash without keeping a copy.
"""

from __future__ import annotations

import glob
import os
import random
import signal
import threading
import time

import pytest
import redis

from pfxcache.testing import start_daemon

from support import fetch_checked, prefix_pages, store_prefix

PAGE = 4  # tokens a page
BLOCK = 4096  # bytes a page: one 4 KiB slot on disk
ARENA_BLOCKS = 16


def args(path, *extra: str, tier: int = 4 << 20, blocks: int = ARENA_BLOCKS) -> tuple[str, ...]:
    return ("--dir", str(path), "--page-size", str(PAGE), "--block-bytes", str(BLOCK),
            "--maxmemory", str(blocks * BLOCK), "--disk-tier-size", str(tier), *extra)


def payload(ns: str, tokens: list[int]) -> bytes:
    return prefix_pages(ns, tokens, PAGE, BLOCK)


def put(r: redis.Redis, ns: str, tokens: list[int]) -> None:
    store_prefix(r, ns, tokens, PAGE, BLOCK)


def get(r: redis.Redis, ns: str, tokens: list[int]) -> int:
    """Tokens matched; asserts the bytes served are the right ones."""
    return fetch_checked(r, ns, tokens, PAGE, BLOCK)


def tiers(r: redis.Redis) -> dict:
    return r.info("tiers")


def settle(r: redis.Redis, timeout: float = 30.0) -> dict:
    """Wait until the tier has recovered and written everything queued."""
    deadline = time.monotonic() + timeout
    while True:
        info = tiers(r)
        if info["tier_disk_loading"] == 0 and info["tier_disk_queue_pages"] == 0:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"the disk tier did not settle: {info}")
        time.sleep(0.02)


def stored_through(daemon_at, count: int, pages: int, seed: int, ns: str = "a"):
    """A write-through daemon holding ``count`` prompts of ``pages`` pages, all on disk, then killed
    with SIGKILL; returns the prompts."""
    d, r = daemon_at("--disk-tier-write", "through")
    settle(r)
    work = prompts(count, pages, seed=seed)
    for tokens in work:
        put(r, ns, tokens)
    settle(r)
    kill(d)
    return work


def kill(d) -> None:
    d.proc.kill()
    d.proc.wait(20)


def prompts(count: int, pages: int, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 50000) for _ in range(pages * PAGE)] for _ in range(count)]


@pytest.fixture
def daemon_at(tmp_path):
    started = []

    def start(*extra: str, path=tmp_path, env=None, **kw):
        d = start_daemon(*args(path, *extra, **kw), env=env)
        started.append(d)
        return d, redis.Redis(host=d.host, port=d.port)

    yield start
    for d in started:
        d.stop(signal.SIGKILL)


def test_pages_evicted_from_ram_come_back_from_disk(daemon_at):
    d, r = daemon_at()
    settle(r)
    work = prompts(20, 4)  # 80 pages through an arena of 16
    for tokens in work:
        put(r, "a", tokens)
    info = settle(r)
    assert info["tier_disk_demotions"] > 0 and info["tier_disk_pages"] > 0
    for tokens in work:
        assert get(r, "a", tokens) == len(tokens)
    info = tiers(r)
    assert info["tier_disk_hits"] > 0 and info["tier_disk_promotions"] > 0
    assert r.execute_command("PFXCHECK") == b"OK"
    described = r.execute_command("PFXINFO", "a")
    disk = described[b"tiers"][b"disk"]
    assert disk[b"pages"] == info["tier_disk_pages"] and disk[b"namespace-pages"] == info["tier_disk_pages"]


def test_a_promoted_hit_answers_like_a_ram_hit(daemon_at):
    d, r = daemon_at()
    settle(r)
    first, *rest = prompts(10, 4, seed=2)
    put(r, "a", first)
    for tokens in rest:
        put(r, "a", tokens)
    settle(r)
    reply = r.execute_command("PFXGET", "a", "TOKENS", *first, "TTL", 5000)
    assert reply[b"matched"] == len(first)
    assert reply[b"lease"] > 0 and len(reply[b"blocks"]) == 4
    r.execute_command("PFXRELEASE", reply[b"lease"])
    assert r.execute_command("PFXCHECK") == b"OK"


def test_a_prefix_runs_from_ram_on_into_disk(daemon_at):
    d, r = daemon_at()
    settle(r)
    base = prompts(1, 2, seed=3)[0]
    tails = [base + t for t in prompts(12, 3, seed=4)]
    for tokens in tails:
        put(r, "a", tokens)
    settle(r)
    for tokens in tails:
        assert get(r, "a", tokens) == len(tokens)
    # A prompt that diverges after the shared prefix: the disk never supplies a page past a hole.
    other = base + prompts(1, 3, seed=99)[0]
    assert get(r, "a", other) == len(base)


def test_restart_serves_what_was_on_disk(daemon_at, tmp_path):
    d, r = daemon_at()
    settle(r)
    work = prompts(20, 4, seed=5)
    for tokens in work:
        put(r, "a", tokens)
    settle(r)
    on_disk = tiers(r)["tier_disk_pages"]
    with pytest.raises(redis.ConnectionError):
        r.execute_command("SHUTDOWN", "NOSAVE")
    d.proc.wait(20)
    d2, r2 = daemon_at()
    info = settle(r2)
    assert info["tier_disk_pages"] >= on_disk - 1
    # Write-back keeps the pages RAM evicted; a prompt whose first page never left RAM is a miss
    # after the restart (nothing saved the arena), every other one is served whole or not at all.
    served = sum(get(r2, "a", tokens) == len(tokens) for tokens in work)
    assert served >= len(work) - ARENA_BLOCKS // 4  # all but the prompts RAM still held
    assert r2.execute_command("PFXCHECK") == b"OK"


def test_write_through_survives_kill_9(daemon_at):
    work = stored_through(daemon_at, 12, 3, seed=6)
    d2, r2 = daemon_at("--disk-tier-write", "through")
    settle(r2)
    for tokens in work:
        assert get(r2, "a", tokens) == len(tokens)


def test_flushall_reaches_the_disk_and_stays_flushed(daemon_at):
    d, r = daemon_at("--disk-tier-write", "through")
    settle(r)
    work = prompts(6, 3, seed=7)
    for tokens in work:
        put(r, "a", tokens)
    settle(r)
    r.execute_command("FLUSHALL")
    assert tiers(r)["tier_disk_pages"] == 0
    for tokens in work:
        assert get(r, "a", tokens) == 0
    kill(d)
    d2, r2 = daemon_at()
    assert settle(r2)["tier_disk_pages"] == 0
    for tokens in work:
        assert get(r2, "a", tokens) == 0


def test_pfxevict_and_del_reach_the_disk(daemon_at):
    d, r = daemon_at("--disk-tier-write", "through")
    settle(r)
    base = prompts(1, 1, seed=8)[0]
    branch = [base + t for t in prompts(4, 2, seed=9)]
    for tokens in branch:
        put(r, "a", tokens)
    keep = prompts(3, 2, seed=10)
    for tokens in keep:
        put(r, "b", tokens)
    settle(r)
    r.execute_command("PFXEVICT", "a", "TOKENS", *base)
    for tokens in branch:
        assert get(r, "a", tokens) == 0
    r.execute_command("DEL", "b")
    for tokens in keep:
        assert get(r, "b", tokens) == 0
    assert tiers(r)["tier_disk_pages"] == 0
    kill(d)
    d2, r2 = daemon_at()
    settle(r2)
    assert tiers(r2)["tier_disk_pages"] == 0


def test_damaged_segments_cost_misses_never_wrong_bytes(daemon_at, tmp_path):
    work = stored_through(daemon_at, 10, 3, seed=11)
    rng = random.Random(12)
    for seg in glob.glob(str(tmp_path / "pfxtier" / "seg-*")):
        size = os.path.getsize(seg)
        with open(seg, "r+b") as f:
            for _ in range(200):  # flip bytes all over: headers, payloads, the segment header
                pos = rng.randrange(size)
                f.seek(pos)
                byte = f.read(1)
                f.seek(pos)
                f.write(bytes([byte[0] ^ 0xFF]) if byte else b"\xff")
    d2, r2 = daemon_at()
    settle(r2)
    for tokens in work:
        get(r2, "a", tokens)  # asserts the bytes of whatever is served
    assert r2.execute_command("PFXCHECK") == b"OK"


def test_a_second_daemon_on_the_same_tier_is_refused(daemon_at, tmp_path):
    d, r = daemon_at()
    with pytest.raises(RuntimeError, match="in use by pid"):
        start_daemon(*args(tmp_path))


def test_a_bad_tier_path_is_a_clear_startup_error(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(RuntimeError, match="disk tier"):
        start_daemon(*args(tmp_path, "--disk-tier-path", str(missing)))
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(RuntimeError, match="disk tier"):
        start_daemon(*args(tmp_path, "--disk-tier-path", str(afile)))


def test_read_errors_are_misses(daemon_at):
    d, r = daemon_at(env={"PFXCACHE_TIER_FAULTS": "eio:read:1"})
    settle(r)
    work = prompts(20, 4, seed=13)
    for tokens in work:
        put(r, "a", tokens)
    settle(r)
    for tokens in work:
        get(r, "a", tokens)  # never an error, never a wrong byte
    info = tiers(r)
    assert info["tier_disk_hits"] == 0 and info["tier_disk_read_misses"] > 0
    assert r.execute_command("PFXCHECK") == b"OK"


def test_write_errors_drop_pages_and_serving_goes_on(daemon_at):
    d, r = daemon_at(env={"PFXCACHE_TIER_FAULTS": "eio:write:1"})
    settle(r)
    work = prompts(20, 4, seed=14)
    for tokens in work:
        put(r, "a", tokens)
    info = settle(r)
    assert info["tier_disk_pages"] == 0 and info["tier_disk_io_errors"] > 0
    for tokens in work:
        get(r, "a", tokens)
    assert r.execute_command("PFXCHECK") == b"OK"


def test_a_late_read_is_a_miss_then_a_hit(daemon_at):
    d, r = daemon_at("--disk-tier-read-timeout", "20", env={"PFXCACHE_TIER_FAULTS": "delay:read:400ms"})
    settle(r)
    work = prompts(20, 4, seed=15)
    for tokens in work:
        put(r, "a", tokens)
    settle(r)
    first = work[0]
    assert get(r, "a", first) < len(first)  # the read outlived the wait
    deadline = time.monotonic() + 10
    while get(r, "a", first) < len(first):
        assert time.monotonic() < deadline, "the late read never landed"
        time.sleep(0.05)
    assert tiers(r)["tier_disk_promotions_late"] >= 1


def test_concurrent_workers_through_a_tiny_arena(daemon_at):
    # 6 workers, each pinning at most 3 pages and writing 3 more: 48 blocks always leave room.
    d, r = daemon_at(blocks=48)
    settle(r)
    work = prompts(120, 3, seed=16)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        c = redis.Redis(host=d.host, port=d.port)
        try:
            for _ in range(120):
                tokens = rng.choice(work)
                if rng.random() < 0.4:
                    put(c, "w", tokens)
                else:
                    get(c, "w", tokens)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[0]
    settle(r)
    assert r.execute_command("PFXCHECK") == b"OK"
    assert tiers(r)["tier_disk_hits"] > 0


def test_a_tenant_cannot_fill_the_disk_for_the_others(daemon_at):
    # 64 disk slots for an arena of 16 blocks: tenant t (4 pages in RAM) may hold 16 on disk.
    d, r = daemon_at("--tenant-quota", "t* 4 0 0", tier=64 * BLOCK)
    settle(r)
    others = prompts(10, 2, seed=17)
    for tokens in others:
        put(r, "o", tokens)
    for tokens in prompts(60, 2, seed=18):  # 120 pages: would fill the disk twice over
        put(r, "t", tokens)
    settle(r)
    assert tiers(r)["tier_disk_pages"] <= 16 + len(others) * 2
    for tokens in others:
        assert get(r, "o", tokens) == len(tokens)
    assert r.execute_command("PFXCHECK") == b"OK"


def test_the_metrics_endpoint_shows_the_disk_tier(daemon_at):
    import re
    import urllib.request

    from pfxcache.testing import free_port

    pytest.importorskip("prometheus_client")
    port = free_port()
    d, r = daemon_at("--metrics-port", str(port))
    settle(r)
    for tokens in prompts(20, 4, seed=19):
        put(r, "a", tokens)
    info = settle(r)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    pages = re.search(r'^pfxcache_tier_pages\{tier="disk"\} (\S+)$', text, re.M)
    demoted = re.search(r'^pfxcache_tier_demotions_total\{tier="disk"\} (\S+)$', text, re.M)
    assert pages and float(pages.group(1)) == info["tier_disk_pages"] > 0
    assert demoted and float(demoted.group(1)) == info["tier_disk_demotions"]


def test_kv_events_say_where_a_page_went(daemon_at):
    """Demotion: BlockRemoved (the arena's medium) then BlockStored with medium DISK; promotion:
    BlockStored in the arena's medium again; the disk's own eviction: BlockRemoved DISK."""
    import msgspec
    import zmq

    from pfxcache.daemon.service.kv_events import END_SEQ
    from pfxcache.testing import free_port

    replay = f"tcp://127.0.0.1:{free_port()}"
    pub = f"tcp://127.0.0.1:{free_port()}"
    d, r = daemon_at("--kv-events-endpoint", pub, "--kv-events-replay-endpoint", replay,
                     "--kv-events-replay-buffer", "100000", "--maxmemory-policy", "lru", tier=24 * BLOCK)
    settle(r)
    work = prompts(20, 3, seed=20)  # 60 pages through 16 blocks and 24 slots
    for tokens in work:
        put(r, "a", tokens)
    settle(r)
    for tokens in reversed(work):  # the newest prompts RAM no longer holds are on disk (24 slots)
        get(r, "a", tokens)
        if tiers(r)["tier_disk_promotions"]:
            break
    assert tiers(r)["tier_disk_promotions"] > 0
    deadline = time.monotonic() + 20
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(replay)
        while True:  # the publisher thread has caught up once the promotion's BlockStored is there
            sock.send_multipart([b"", (0).to_bytes(8, "big")])
            events = []
            while True:
                assert sock.poll(20000), "no replay reply"
                frames = sock.recv_multipart()
                if frames[1] == END_SEQ:
                    break
                events += msgspec.msgpack.decode(frames[2])[1]
            media = [(e["type"], e.get("medium")) for e in events]
            if media.count(("BlockStored", "CPU")) > len(work) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        sock.close()
        ctx.term()
    assert ("BlockStored", "DISK") in media
    assert ("BlockRemoved", "DISK") in media  # 60 pages through 16 blocks and 24 slots: the disk evicted some
    first_disk = media.index(("BlockStored", "DISK"))
    assert ("BlockRemoved", "CPU") in media[:first_disk]  # it left RAM before it reached the disk
    # the promotion: one more BlockStored in RAM than the PFXSETs made (one each)
    assert media.count(("BlockStored", "CPU")) > len(work)
