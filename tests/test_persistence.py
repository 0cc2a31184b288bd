"""Snapshots of the RAM arena and Redis's persistence commands, on real daemons, files and signals.

Every restart is checked byte for byte with WITHDATA against what was stored; damaged files must
cost misses and a counter, never a wrong byte and never a failed start.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import redis

from pfxcache.testing import start_daemon, start_redis_server

PAGE = 4  # tokens a page
BLOCK = 256  # bytes a page


def geometry(path, *extra: str, block: int = BLOCK) -> tuple[str, ...]:
    return ("--dir", str(path), "--page-size", str(PAGE), "--block-bytes", str(block),
            "--maxmemory", str(4 << 20), *extra)


def page_bytes(tag: int, n: int) -> bytes:
    """n pages, each filled with its own byte pattern."""
    return b"".join(bytes([(tag * 31 + i * 7 + j) % 251 for j in range(BLOCK)]) for i in range(n))


def put(r: redis.Redis, ns: str, tokens: list[int], offset: int = 0, tag: int = 1) -> bytes:
    n = len(tokens) // PAGE - offset // PAGE
    data = page_bytes(tag, n)
    args = ["PFXSET", ns, "TOKENS", *tokens]
    if offset:
        args += ["OFFSET", offset]
    r.execute_command(*args, "DATA", data)
    return data


def get(r: redis.Redis, ns: str, tokens: list[int]) -> tuple[int, bytes]:
    reply = r.execute_command("PFXGET", ns, "TOKENS", *tokens, "NOLEASE", "WITHDATA")
    return reply[b"matched"], reply.get(b"data", b"")


def stop_with(daemon, sig: int) -> None:
    daemon.proc.send_signal(sig)
    try:
        daemon.proc.wait(20)
    except Exception:  # noqa: BLE001
        daemon.proc.kill()
        raise AssertionError(f"pfxcached did not exit after signal {sig}:\n{daemon.log_text()}")


def shutdown(r: redis.Redis, *flags: str) -> None:
    with pytest.raises(redis.ConnectionError):
        r.execute_command("SHUTDOWN", *flags)


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting {timeout}s for {what}")
        time.sleep(0.02)


def persistence(r: redis.Redis) -> dict:
    return r.info("persistence")


def sample(r: redis.Redis) -> dict[tuple[str, tuple[int, ...]], bytes]:
    """A small forest: two namespaces, a shared prefix with two branches, a long run."""
    stored = {}
    a = list(range(1, 9))
    stored[("a", tuple(a))] = put(r, "a", a, tag=1)
    b = a + list(range(100, 112))
    stored[("a", tuple(b))] = stored[("a", tuple(a))] + put(r, "a", b, offset=8, tag=2)
    c = a + list(range(200, 204))
    stored[("a", tuple(c))] = stored[("a", tuple(a))] + put(r, "a", c, offset=8, tag=3)
    d = list(range(300, 340))
    stored[("other", tuple(d))] = put(r, "other", d, tag=4)
    return stored


def verify(r: redis.Redis, stored: dict) -> None:
    for (ns, tokens), data in stored.items():
        matched, got = get(r, ns, list(tokens))
        assert matched == len(tokens), f"{ns} {tokens[:4]}...: matched {matched} of {len(tokens)}"
        assert got == data, f"{ns} {tokens[:4]}...: bytes differ"


def test_restart_after_shutdown_save(tmp_path):
    daemon = start_daemon(*geometry(tmp_path))
    r = redis.Redis(port=daemon.port)
    stored = sample(r)
    shutdown(r, "SAVE")
    daemon.proc.wait(20)
    assert daemon.proc.returncode == 0, daemon.log_text()
    assert (tmp_path / "dump.pfx").exists()
    assert not [name for name in os.listdir(tmp_path) if name.startswith("temp-")]
    again = start_daemon(*geometry(tmp_path))
    try:
        r = redis.Redis(port=again.port)
        verify(r, stored)
        info = persistence(r)
        assert info["loading"] == 0 and info["rdb_changes_since_last_save"] == 0
        assert info["pfx_snapshot_load_status"] == "ok" and info["pfx_snapshot_pages_dropped"] == 0
        assert r.execute_command("PFXCHECK") == b"OK"
    finally:
        again.stop()


def test_shutdown_nosave_and_no_schedule_write_nothing(tmp_path):
    daemon = start_daemon(*geometry(tmp_path))
    r = redis.Redis(port=daemon.port)
    sample(r)
    shutdown(r, "NOSAVE")
    daemon.proc.wait(20)
    daemon = start_daemon(*geometry(tmp_path))
    sample(redis.Redis(port=daemon.port))
    assert daemon.stop() == 0  # SIGTERM without save points: no save
    assert not (tmp_path / "dump.pfx").exists()


def test_restart_after_sigterm_with_save_points(tmp_path):
    daemon = start_daemon(*geometry(tmp_path, "--save", "3600 1000000"))
    r = redis.Redis(port=daemon.port)
    stored = sample(r)
    assert persistence(r)["rdb_changes_since_last_save"] > 0
    stop_with(daemon, signal.SIGTERM)
    assert daemon.proc.returncode == 0, daemon.log_text()
    again = start_daemon(*geometry(tmp_path, "--save", "3600 1000000"))
    try:
        verify(redis.Redis(port=again.port), stored)
    finally:
        again.stop()


def test_sigkill_keeps_what_the_last_completed_save_holds(tmp_path):
    daemon = start_daemon(*geometry(tmp_path))
    r = redis.Redis(port=daemon.port)
    stored = sample(r)
    assert r.execute_command("SAVE") is True
    assert persistence(r)["rdb_changes_since_last_save"] == 0
    late = list(range(900, 916))
    put(r, "late", late, tag=9)
    assert persistence(r)["rdb_changes_since_last_save"] == 4
    stop_with(daemon, signal.SIGKILL)
    again = start_daemon(*geometry(tmp_path))
    try:
        r = redis.Redis(port=again.port)
        verify(r, stored)
        assert get(r, "late", late)[0] == 0
    finally:
        again.stop()


def test_the_save_schedule_saves_in_the_background(tmp_path):
    daemon = start_daemon(*geometry(tmp_path, "--save", "1 1"))
    try:
        r = redis.Redis(port=daemon.port)
        before = persistence(r)["rdb_saves"]
        stored = sample(r)
        wait_for(lambda: persistence(r)["rdb_saves"] > before and persistence(r)["rdb_changes_since_last_save"] == 0,
                 "the save schedule's background save")
        assert persistence(r)["rdb_last_bgsave_status"] == "ok"
    finally:
        stop_with(daemon, signal.SIGKILL)
    again = start_daemon(*geometry(tmp_path))
    try:
        verify(redis.Redis(port=again.port), stored)
    finally:
        again.stop()


def test_bgsave_while_clients_read_and_write(tmp_path):
    args = ("--dir", str(tmp_path), "--page-size", str(PAGE), "--block-bytes", str(64 << 10),
            "--maxmemory", str(256 << 20))
    daemon = start_daemon(*args)
    r = redis.Redis(port=daemon.port)
    big = bytes(range(256)) * (64 << 10 >> 8)
    stored = {}
    for i in range(8):  # 8 x 256 pages of 64 KiB: 128 MiB for the background save to write
        tokens = list(range(i * 10_000, i * 10_000 + 256 * PAGE))
        data = bytes([i]) + big[1:] + big * 255
        r.execute_command("PFXSET", f"ns{i}", "TOKENS", *tokens, "DATA", data)
        stored[(f"ns{i}", tuple(tokens))] = data
    stop = threading.Event()
    errors: list[str] = []
    done = [0]

    def worker() -> None:
        w = redis.Redis(port=daemon.port)
        n = 0
        while not stop.is_set():
            n += 1
            tokens = list(range(5_000_000 + n * PAGE, 5_000_000 + (n + 1) * PAGE))
            w.execute_command("PFXSET", "busy", "TOKENS", *tokens, "DATA", bytes([n % 256]) * (64 << 10))
            matched, data = get(w, "ns3", list(range(30_000, 30_000 + 8)))
            if matched != 8 or data != stored[("ns3", tuple(range(30_000, 30_000 + 256 * PAGE)))][: 2 * (64 << 10)]:
                errors.append(f"read during BGSAVE: matched {matched}")
            done[0] = n

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        wait_for(lambda: done[0] > 0, "the worker's first round")
        assert r.execute_command("BGSAVE") is True  # redis-py reads +Background saving started as True
        pings = 0
        while persistence(r)["rdb_bgsave_in_progress"]:
            assert r.ping() is True
            pings += 1
            try:
                reply = r.execute_command("BGSAVE")
            except redis.ResponseError as exc:
                assert str(exc) == "Background save already in progress"
            else:
                assert reply is True  # the first one had just finished
            time.sleep(0.01)
        wait_for(lambda: persistence(r)["rdb_bgsave_in_progress"] == 0, "the background save")
        assert persistence(r)["rdb_last_bgsave_status"] == "ok"
        assert r.execute_command("PFXCHECK") == b"OK"
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors[:3]
    assert r.execute_command("PFXCHECK") == b"OK"
    stop_with(daemon, signal.SIGKILL)
    again = start_daemon(*args)
    try:
        verify(redis.Redis(port=again.port), stored)
    finally:
        again.stop()


def _fill(r: redis.Redis, count: int = 8) -> dict:
    """count x 64 pages of 256 KiB: enough bytes that a background save is still writing a moment later."""
    stored = {}
    for i in range(count):
        tokens = list(range(1_000_000 + i * 1_000, 1_000_000 + i * 1_000 + 64 * PAGE))
        data = bytes([i + 1]) * (64 * (256 << 10))
        r.execute_command("PFXSET", f"big{i}", "TOKENS", *tokens, "DATA", data)
        stored[(f"big{i}", tuple(tokens))] = data
    return stored


BIG = ("--block-bytes", str(256 << 10), "--maxmemory", str(512 << 20))


def test_sigkill_during_a_bgsave_keeps_the_previous_snapshot(tmp_path):
    args = ("--dir", str(tmp_path), "--page-size", str(PAGE), *BIG)
    daemon = start_daemon(*args)
    r = redis.Redis(port=daemon.port)
    first = _fill(r, 2)
    assert r.execute_command("SAVE") is True
    later = _fill(r, 8)
    assert r.execute_command("BGSAVE") is True
    stop_with(daemon, signal.SIGKILL)
    again = start_daemon(*args)
    try:
        r = redis.Redis(port=again.port)
        for (ns, tokens), data in {**first, **later}.items():  # the old file or the new one: never a wrong byte
            matched, got = get(r, ns, list(tokens))
            assert got == data[: matched // PAGE * (256 << 10)], ns
        for (ns, tokens), data in first.items():
            assert get(r, ns, list(tokens)) == (len(tokens), data)
        assert persistence(r)["pfx_snapshot_load_status"] == "ok"
    finally:
        again.stop()


def test_flushall_during_a_bgsave_flushes(tmp_path):
    daemon = start_daemon("--dir", str(tmp_path), "--page-size", str(PAGE), *BIG)
    try:
        r = redis.Redis(port=daemon.port)
        _fill(r, 8)
        assert r.execute_command("BGSAVE") is True
        assert r.execute_command("FLUSHALL") is True  # calls off the save, whose pins would keep every page
        assert r.dbsize() == 0
        wait_for(lambda: persistence(r)["rdb_bgsave_in_progress"] == 0, "the background save to end")
        assert persistence(r)["rdb_last_bgsave_status"] == "ok"
        assert r.execute_command("PFXCHECK") == b"OK"
    finally:
        daemon.stop()


def _saved(tmp_path) -> dict:
    daemon = start_daemon(*geometry(tmp_path))
    r = redis.Redis(port=daemon.port)
    stored = sample(r)
    shutdown(r, "SAVE")
    daemon.proc.wait(20)
    return stored


def _served_or_missed(r: redis.Redis, stored: dict) -> int:
    """Pages served; every byte served is right (a prefix of what was stored)."""
    served = 0
    for (ns, tokens), data in stored.items():
        matched, got = get(r, ns, list(tokens))
        assert got == data[: matched // PAGE * BLOCK], f"{ns}: wrong bytes served"
        served += matched // PAGE
    return served


def test_a_corrupted_page_drops_that_page_and_its_subtree_only(tmp_path):
    stored = _saved(tmp_path)
    path = tmp_path / "dump.pfx"
    raw = bytearray(path.read_bytes())
    # the branch of tag 2 (3 pages below a): damage its second page; its third goes with it
    target = page_bytes(2, 3)[BLOCK:2 * BLOCK]
    at = raw.index(target)
    raw[at + 17] ^= 0xFF
    path.write_bytes(bytes(raw))
    daemon = start_daemon(*geometry(tmp_path))
    try:
        r = redis.Redis(port=daemon.port)
        a = list(range(1, 9))
        assert get(r, "a", a) == (8, stored[("a", tuple(a))])
        branch = a + list(range(100, 112))
        assert get(r, "a", branch) == (12, stored[("a", tuple(branch))][: 3 * BLOCK])  # one page after a
        c = a + list(range(200, 204))
        assert get(r, "a", c) == (12, stored[("a", tuple(c))])  # the other branch is whole
        d = tuple(range(300, 340))
        assert get(r, "other", list(d)) == (40, stored[("other", d)])
        info = persistence(r)
        assert info["pfx_snapshot_load_status"] == "corrupt"
        assert info["pfx_snapshot_records_failed"] == 1 and info["pfx_snapshot_pages_dropped"] == 2
        assert r.execute_command("PFXCHECK") == b"OK"
    finally:
        daemon.stop()
    assert "Snapshot" in daemon.log_text() and "corrupt" in daemon.log_text()


@pytest.mark.parametrize("cut", [0.0, 0.1, 0.5, 0.9, -3])
def test_a_truncated_file_costs_misses_never_a_wrong_byte(tmp_path, cut):
    stored = _saved(tmp_path)
    path = tmp_path / "dump.pfx"
    raw = path.read_bytes()
    size = len(raw) + cut if isinstance(cut, int) else int(len(raw) * cut)
    path.write_bytes(raw[:size])
    daemon = start_daemon(*geometry(tmp_path))
    try:
        r = redis.Redis(port=daemon.port)
        _served_or_missed(r, stored)
        assert persistence(r)["pfx_snapshot_load_status"] == "truncated"
        assert r.execute_command("PFXCHECK") == b"OK"
    finally:
        daemon.stop()


def test_random_damage_never_serves_a_wrong_byte(tmp_path):
    stored = _saved(tmp_path)
    path = tmp_path / "dump.pfx"
    clean = path.read_bytes()
    for at in range(0, len(clean), max(1, len(clean) // 7)):
        raw = bytearray(clean)
        raw[at] ^= 0x5A
        path.write_bytes(bytes(raw))
        daemon = start_daemon(*geometry(tmp_path))
        try:
            r = redis.Redis(port=daemon.port)
            _served_or_missed(r, stored)
            assert persistence(r)["pfx_snapshot_load_status"] != "ok", f"damage at byte {at} not seen"
        finally:
            daemon.stop()
            path.write_bytes(bytes(raw))  # the stop must not rewrite it (no save points)


def test_another_geometry_or_a_foreign_file_loads_nothing(tmp_path):
    stored = _saved(tmp_path)
    daemon = start_daemon(*geometry(tmp_path, block=2 * BLOCK))
    try:
        r = redis.Redis(port=daemon.port)
        assert all(get(r, ns, list(tokens))[0] == 0 for ns, tokens in stored)
        assert persistence(r)["pfx_snapshot_load_status"] == "foreign"
    finally:
        daemon.stop()
    assert "foreign" in daemon.log_text()
    (tmp_path / "dump.pfx").write_bytes(b"REDIS0011" + bytes(500))
    daemon = start_daemon(*geometry(tmp_path))
    try:
        assert persistence(redis.Redis(port=daemon.port))["pfx_snapshot_load_status"] in ("foreign", "corrupt")
    finally:
        daemon.stop()


def test_a_missing_file_is_an_empty_start(tmp_path):
    daemon = start_daemon(*geometry(tmp_path, "--save", "60 1"))
    try:
        info = persistence(redis.Redis(port=daemon.port))
        assert info["pfx_snapshot_load_status"] == "missing" and info["rdb_last_load_keys_loaded"] == 0
    finally:
        daemon.stop()


def test_two_daemons_on_one_path(tmp_path):
    first = start_daemon(*geometry(tmp_path, "--save", "60 1"))
    try:
        with pytest.raises(RuntimeError, match="in use by another pfxcached"):
            start_daemon(*geometry(tmp_path, "--save", "60 1"))
        other = start_daemon(*geometry(tmp_path, "--save", "60 1", "--dbfilename", "other.pfx"))
        other.stop()
        # One without save points starts (it loads nothing there) but may not save there.
        plain = start_daemon(*geometry(tmp_path))
        try:
            with pytest.raises(redis.ResponseError):
                redis.Redis(port=plain.port).execute_command("SAVE")
        finally:
            plain.stop()
        assert "in use by another pfxcached" in plain.log_text()
    finally:
        first.stop()


def _persistence_fields(r: redis.Redis) -> list[str]:
    return list(r.info("persistence"))  # in the order the reply lists them


def test_replies_side_by_side_with_redis(tmp_path):
    (tmp_path / "redis").mkdir()
    (tmp_path / "pfx").mkdir()
    server = start_redis_server("--dir", str(tmp_path / "redis"))
    daemon = start_daemon(*geometry(tmp_path / "pfx"))
    try:
        ours, theirs = redis.Redis(port=daemon.port), redis.Redis(port=server.port)
        ours_raw = redis.Redis(port=daemon.port, decode_responses=False)
        for client in (ours, theirs):
            assert client.execute_command("SAVE") is True
        assert ours.execute_command("SAVE") == theirs.execute_command("SAVE")
        assert type(ours.execute_command("LASTSAVE")) is type(theirs.execute_command("LASTSAVE"))
        assert abs(ours_raw.lastsave().timestamp() - theirs.lastsave().timestamp()) < 120
        for client in (ours, theirs):
            assert client.execute_command("BGSAVE") is True
            wait_for(lambda: persistence(client)["rdb_bgsave_in_progress"] == 0, "BGSAVE")
        for args in (("BGSAVE", "NOPE"), ("BGSAVE", "SCHEDULE", "X"), ("LASTSAVE", "X"), ("SAVE", "X"),
                     ("SHUTDOWN", "SAVE", "NOSAVE")):
            replies = []
            for client in (ours, theirs):
                try:
                    replies.append(("ok", client.execute_command(*args)))
                except redis.ResponseError as exc:
                    replies.append(("err", str(exc)))
            assert replies[0] == replies[1], args
        redis_fields = _persistence_fields(theirs)
        our_fields = [f for f in _persistence_fields(ours) if not f.startswith("pfx_")]
        assert our_fields == redis_fields
        a, b = persistence(ours), persistence(theirs)
        for field in ("loading", "rdb_bgsave_in_progress", "rdb_changes_since_last_save",
                      "rdb_last_bgsave_status", "rdb_current_bgsave_time_sec", "aof_enabled"):
            assert a[field] == b[field], field
        assert a["rdb_saves"] == b["rdb_saves"] == 3
    finally:
        daemon.stop()
        server.stop()


# -- the store's snapshot module, in process -------------------------------------------------------

def _store(block: int = 64):
    from pfxcache.daemon.store.arena import MemoryArena
    from pfxcache.daemon.store.store import PrefixStore
    return PrefixStore(MemoryArena(block, 64), page_size=2, shards=4, policy="lru")


def _tokens(*values: int) -> bytes:
    import array
    return array.array("I", values).tobytes()


def test_snapshot_round_trip_and_pins_in_process(tmp_path):
    from pfxcache.daemon.store import snapshot
    store = _store()
    store.insert(b"n", _tokens(1, 2, 3, 4), data=b"a" * 64 + b"b" * 64)
    store.insert(b"n", _tokens(1, 2, 3, 4, 5, 6), offset=4, data=b"c" * 64)
    store.insert(b"m", _tokens(9, 9), data=b"d" * 64)
    cap = snapshot.capture(store)
    assert cap.pages == 4 and store.check() == []
    assert store.evict_all(b"n").evicted == 0  # pinned while the snapshot is written
    snapshot.write_file(cap, store.arena, store.page_size, str(tmp_path), "dump.pfx")
    cap.release()
    assert store.check() == [] and not store.snapshot_pins
    assert store.evict_all(b"n").evicted == 3  # unpinned again
    loaded = _store()
    report = snapshot.load_file(loaded, str(tmp_path / "dump.pfx"))
    assert (report.status, report.pages_loaded, report.pages_dropped) == ("ok", 4, 0)
    match = loaded.match(b"n", _tokens(1, 2, 3, 4, 5, 6), lease=False)
    assert loaded.arena.read(match.blocks) == b"a" * 64 + b"b" * 64 + b"c" * 64
    assert loaded.check() == []
    assert snapshot.load_file(_store(block=128), str(tmp_path / "dump.pfx")).status == "foreign"
    assert snapshot.load_file(_store(), str(tmp_path / "nothing.pfx")).status == "missing"
