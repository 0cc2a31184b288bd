"""Isolation and availability: restarts never leave a worker on a stale arena, the arena cannot be
used to crash the daemon, tenants cannot starve each other, startup and shutdown survive what
others left behind. Issue 12, items 1, 4, 5 and 7.

Real daemons over real sockets, workers with the real client mapping the real arena.
"""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np
import pytest
import redis

from pfxcache.testing import free_port, start_daemon
from support import wait_for

PS, BB = 4, 256


def expected_pages(worker: int, prompt: int, pages: int) -> np.ndarray:
    """The KV bytes of a prompt: one distinct pattern per (worker, prompt, page)."""
    out = np.empty((pages, BB), dtype=np.uint8)
    for page in range(pages):
        seed = hashlib.blake2b(f"{worker}/{prompt}/{page}".encode(), digest_size=8).digest()
        out[page] = np.frombuffer(seed * (BB // 8), dtype=np.uint8)
    return out


def prompt_tokens(worker: int, prompt: int, pages: int) -> list[int]:
    return [worker * 1000 + prompt, *range(1, pages * PS)]


# -- item 1: a daemon restart under load never leaves a worker on the old arena ------------------------


def test_restart_under_load_never_serves_or_caches_wrong_bytes_through_the_mapped_arena():
    from pfxcache.client import LeaseLostError, PrefixCache, PrefixCacheError

    port = free_port()
    args = ("--port", str(port), "--page-size", str(PS), "--block-bytes", str(BB), "--maxmemory", str(1024 * BB),
            "--evict-low-watermark", "0")
    daemon = start_daemon(*args)
    url = f"redis://127.0.0.1:{port}/0"
    stop = threading.Event()
    corrupt: list[str] = []
    done_after_restart = [0] * 4
    restarted = threading.Event()
    caches = [PrefixCache.from_url(url, attach=True, socket_timeout=10) for _ in range(4)]
    for cache in caches:
        cache.attach()

    def work(worker: int) -> None:
        cache = caches[worker]
        rounds = 0
        while not stop.is_set():
            rounds += 1
            prompt = rounds % 6
            pages = 1 + prompt % 4
            tokens = prompt_tokens(worker, prompt, pages)
            expected = expected_pages(worker, prompt, pages)
            try:
                cache.save(f"w{worker}", tokens, expected)
                out = np.zeros((pages, BB), dtype=np.uint8)
                match = cache.load(f"w{worker}", tokens, out)
                got = match.matched_tokens // PS
                if not np.array_equal(out[:got], expected[:got]):
                    corrupt.append(f"worker {worker} prompt {prompt}: {got} pages, wrong bytes via {match.via}")
                if restarted.is_set() and match.via == "shm" and got:
                    done_after_restart[worker] += 1
                # And what a neighbour cached: a writer and a reader on different mappings must agree.
                other = (worker + 1) % 4
                theirs = np.zeros((pages, BB), dtype=np.uint8)
                match = cache.load(f"w{other}", prompt_tokens(other, prompt, pages), theirs)
                got = match.matched_tokens // PS
                if not np.array_equal(theirs[:got], expected_pages(other, prompt, pages)[:got]):
                    corrupt.append(f"worker {worker} reading {other}'s prompt {prompt}: wrong bytes via {match.via}")
            except (redis.ConnectionError, redis.TimeoutError, LeaseLostError, PrefixCacheError):
                time.sleep(0.01)  # the daemon is restarting, or refused a write made across the restart

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        assert daemon.stop() == 0
        daemon = start_daemon(*args)  # same port, a new pid: a new arena
        restarted.set()
        wait_for(lambda: min(done_after_restart) >= 20, 60, "every worker to load through the new arena")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    try:
        assert corrupt == [], corrupt[:5]
        # Nothing the new daemon cached holds anything but the bytes its worker meant.
        check = redis.Redis(port=port, protocol=3)
        for worker in range(4):
            for prompt in range(6):
                pages = 1 + prompt % 4
                tokens = prompt_tokens(worker, prompt, pages)
                reply = check.execute_command("PFXGET", f"w{worker}", "TOKENS", *tokens, "WITHDATA", "NOLEASE")
                got = reply[b"matched"] // PS
                assert reply[b"data"] == expected_pages(worker, prompt, pages)[:got].tobytes(), (worker, prompt)
        assert check.execute_command("PFXCHECK") == b"OK"
        new_arena = check.execute_command("PFXINFO")[b"arena"][b"id"].decode()
        assert all(cache._arena_id == new_arena for cache in caches)
        check.close()
    finally:
        for cache in caches:
            cache.close()
        daemon.stop()


# -- item 4: the arena cannot be truncated under the daemon, nor opened by other users ---------------


def test_truncating_the_arena_is_refused_and_the_daemon_keeps_serving(fresh_daemon):
    import os
    import subprocess

    daemon = fresh_daemon("--page-size", str(PS), "--block-bytes", str(BB), "--maxmemory", str(64 * BB))
    client = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    client.execute_command("PFXSET", "t", "TOKENS", *range(8), "DATA", b"k" * (2 * BB))
    path = client.execute_command("PFXINFO")[b"arena"][b"path"].decode()
    result = subprocess.run(["truncate", "-s", "0", path], capture_output=True, text=True)
    assert result.returncode != 0 and "not permitted" in result.stderr
    for size in (0, BB, 1 << 40):  # shrinking and growing are both sealed off
        try:
            os.truncate(path, size)
            raise AssertionError(f"the arena was resized to {size}")
        except PermissionError:
            pass
    assert os.stat(path).st_size == 64 * BB
    reply = client.execute_command("PFXGET", "t", "TOKENS", *range(8), "WITHDATA", "NOLEASE")
    assert reply[b"data"] == b"k" * (2 * BB) and daemon.proc.poll() is None
    client.close()


def test_a_worker_running_as_another_user_cannot_map_the_arena(fresh_daemon):
    import os
    import subprocess
    import sys

    system_python = "/usr/bin/python3"  # the venv's interpreter may sit where that user cannot read
    if os.geteuid() != 0 or not os.path.exists(system_python):
        pytest.skip("needs root (to run the worker as another user) and /usr/bin/python3")
    daemon = fresh_daemon("--block-bytes", str(BB), "--maxmemory", str(64 * BB))
    client = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    path = client.execute_command("PFXINFO")[b"arena"][b"path"].decode()
    # What any worker does to map it (the client's ShmArenaView does the same).
    worker = (f"import mmap, os, sys\ntry:\n    fd = os.open({path!r}, os.O_RDWR)\n"
              "except PermissionError as exc:\n    print('refused:', exc)\n    sys.exit(0)\n"
              f"mmap.mmap(fd, {64 * BB})\nsys.exit('mapped the arena')\n")
    result = subprocess.run([system_python, "-c", worker], capture_output=True, text=True, user=65534,
                            group=65534, extra_groups=[], cwd="/")
    assert result.returncode == 0 and "refused" in result.stdout, result.stdout + result.stderr
    client.close()


# -- item 7: startup and shutdown survive what others left behind -----------------------------------


def test_startup_is_not_stopped_by_fifos_directories_or_stale_files_under_the_arena_name():
    import os
    import uuid

    name = "pfxiso" + uuid.uuid4().hex[:8]
    planted = {
        "reused-pid": f"/dev/shm/{name}-1-7000",  # pid 1 is alive: an unrelated process reused the pid
        "own-pid": f"/dev/shm/{name}-{os.getpid()}-7001",
        "fifo": f"/dev/shm/{name}-999999999-7002",  # opening it for reading would block forever
        "directory": f"/dev/shm/{name}-3-7003",
    }
    for kind in ("reused-pid", "own-pid"):
        with open(planted[kind], "wb") as file:
            file.write(b"stale arena")
        an_hour_ago = time.time() - 3600  # left by an earlier life, not one being created now
        os.utime(planted[kind], (an_hour_ago, an_hour_ago))
    os.mkfifo(planted["fifo"])
    os.mkdir(planted["directory"])
    daemon = None
    try:
        daemon = start_daemon("--arena-name", name, ready_timeout=30)
        client = redis.Redis(host=daemon.host, port=daemon.port)
        assert client.ping()
        client.close()
        # Stale arena files nobody holds are reclaimed whatever pid their name carries.
        assert not os.path.exists(planted["reused-pid"]) and not os.path.exists(planted["own-pid"])
        assert daemon.stop() == 0
    finally:
        if daemon is not None:
            daemon.stop()
        for path in planted.values():
            if os.path.isdir(path):
                os.rmdir(path)
            elif os.path.lexists(path):
                os.unlink(path)


@pytest.mark.parametrize("second, logged", [("SIGTERM", "ignored, the shutdown is in progress"),
                                             ("SIGINT", "You insist... exiting now.")])
def test_a_second_signal_during_a_graceful_shutdown_never_skips_the_cleanup(tmp_path, second, logged):
    # Redis ignores a second SIGTERM, and takes a second SIGINT as "quit now": either way the
    # pidfile and the arena go.
    import os
    import signal
    import socket

    from pfxcache.testing import encode_command

    pidfile = tmp_path / "pfxcached.pid"
    daemon = start_daemon("--page-size", "1", "--block-bytes", "1mb", "--maxmemory", "32mb",
                          "--evict-low-watermark", "0", "--shutdown-timeout", "3", "--pidfile", str(pidfile))
    admin = redis.Redis(host=daemon.host, port=daemon.port)
    tokens = [str(t) for t in range(16)]
    admin.execute_command("PFXSET", "big", "TOKENS", *tokens, "DATA", b"x" * (16 << 20))
    path = redis.Redis(host=daemon.host, port=daemon.port, protocol=3).execute_command("PFXINFO")[b"arena"][b"path"]
    admin.close()
    # A client that never reads its replies keeps the daemon busy writing: the shutdown waits for it.
    hog = socket.create_connection(daemon.address)
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.sendall(encode_command("PFXGET", "big", "TOKENS", *tokens, "NOLEASE", "WITHDATA") * 4)
    time.sleep(0.5)
    daemon.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "scheduling shutdown" in daemon.log_text(), 10, "the shutdown to start")
    daemon.proc.send_signal(getattr(signal, second))  # an impatient supervisor, or user
    try:
        assert daemon.proc.wait(30) == 0, daemon.log_text()[-2000:]
    finally:
        hog.close()
    assert not pidfile.exists() and not os.path.exists(path.decode())
    assert logged in daemon.log_text() and "bye bye" in daemon.log_text()


# -- item 5: per-tenant quotas and per-connection lease limits ---------------------------------------

QUOTA_ACL = ("user tenant-a on >pa ~a:* +@pfx -@admin\n"
             "user tenant-b on >pb ~b:* +@pfx -@admin\n")


def test_a_hog_tenant_is_held_to_its_quota_and_the_others_keep_their_cache(fresh_daemon, tmp_path):
    aclfile = tmp_path / "users.acl"
    aclfile.write_text(QUOTA_ACL)
    daemon = fresh_daemon("--page-size", str(PS), "--block-bytes", str(BB), "--maxmemory", str(64 * BB),
                          "--evict-low-watermark", "0", "--aclfile", str(aclfile),
                          "--tenant-quota", "a:* 8 6 3")
    a = redis.Redis(host=daemon.host, port=daemon.port, protocol=3, username="tenant-a", password="pa")
    b = redis.Redis(host=daemon.host, port=daemon.port, protocol=3, username="tenant-b", password="pb")
    admin = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    assert admin.config_get("tenant-quota") == {"tenant-quota": "a:* 8 6 3"}
    # The week-long hog of the issue: refused, nothing taken.
    try:
        a.execute_command("PFXALLOC", "a:hog", 60, "TTL", 604800000)
        raise AssertionError("the hog got its blocks")
    except redis.ResponseError as exc:
        assert "quota" in str(exc)
    assert admin.execute_command("PFXINFO")[b"arena"][b"blocks-free"] == 64
    held = a.execute_command("PFXALLOC", "a:hog", 6)[b"lease"]
    try:
        a.execute_command("PFXALLOC", "a:hog", 1)
        raise AssertionError("past the leased-blocks quota")
    except redis.ResponseError as exc:
        assert "quota" in str(exc)
    # B caches 30 pages; A caches 20, more than its 8: A's own pages go, never B's.
    for i in range(30):
        b.execute_command("PFXSET", f"b:{i}", "TOKENS", i, 1, 2, 3, "DATA", b"b" * BB)
    assert a.execute_command("PFXRELEASE", held) == 1
    for i in range(20):
        a.execute_command("PFXSET", f"a:{i % 5}", "TOKENS", i, 1, 2, 3, "DATA", b"a" * BB)
    assert sum(a.execute_command("PFXINFO", f"a:{i}")[b"stats"][b"pages"] for i in range(5)) <= 8
    for i in range(30):
        reply = b.execute_command("PFXGET", f"b:{i}", "TOKENS", i, 1, 2, 3, "NOLEASE", "WITHDATA")
        assert reply[b"data"] == b"b" * BB, i
    # Leases: three at most; B is not affected.
    a.execute_command("PFXSET", "a:l", "TOKENS", 7, 7, 7, 7, "DATA", b"l" * BB)
    leases = [a.execute_command("PFXGET", "a:l", "TOKENS", 7, 7, 7, 7)[b"lease"] for _ in range(3)]
    try:
        a.execute_command("PFXGET", "a:l", "TOKENS", 7, 7, 7, 7)
        raise AssertionError("past the lease quota")
    except redis.ResponseError as exc:
        assert "quota" in str(exc)
    assert all(b.execute_command("PFXGET", "b:1", "TOKENS", 1, 1, 2, 3)[b"lease"] for _ in range(5))
    assert a.execute_command("PFXRELEASE", *leases) == 3
    # Quotas change at runtime, like any directive.
    assert admin.config_set("tenant-quota", "a:* 8 60 3")
    assert a.execute_command("PFXALLOC", "a:hog", 40)[b"lease"]
    assert admin.execute_command("PFXCHECK") == b"OK"
    for client in (a, b, admin):
        client.close()


def test_a_connection_holds_at_most_lease_max_per_client_leases(fresh_daemon):
    daemon = fresh_daemon("--page-size", str(PS), "--block-bytes", str(BB), "--maxmemory", str(64 * BB),
                          "--client-lease-limit", "3")
    one = redis.Redis(host=daemon.host, port=daemon.port, protocol=3, single_connection_client=True)
    other = redis.Redis(host=daemon.host, port=daemon.port, protocol=3, single_connection_client=True)
    one.execute_command("PFXSET", "l", "TOKENS", 1, 2, 3, 4, "DATA", b"l" * BB)
    leases = [one.execute_command("PFXGET", "l", "TOKENS", 1, 2, 3, 4)[b"lease"] for _ in range(2)]
    leases.append(one.execute_command("PFXALLOC", "l", 1)[b"lease"])
    for command in (("PFXGET", "l", "TOKENS", 1, 2, 3, 4), ("PFXALLOC", "l", 1)):
        try:
            one.execute_command(*command)
            raise AssertionError("a fourth lease")
        except redis.ResponseError as exc:
            assert "client-lease-limit" in str(exc)
    assert one.execute_command("PFXGET", "l", "TOKENS", 1, 2, 3, 4, "NOLEASE")[b"matched"] == 4
    assert other.execute_command("PFXGET", "l", "TOKENS", 1, 2, 3, 4)[b"lease"]
    assert one.execute_command("PFXRELEASE", leases[0]) == 1
    assert one.execute_command("PFXGET", "l", "TOKENS", 1, 2, 3, 4)[b"lease"]
    one.close()
    other.close()


def test_closing_a_connection_releases_its_leases_in_slices():
    # The daemon releases a closed connection's leases RELEASE_SLICE at a time, serving others between.
    from pfxcache.daemon.store import MemoryArena, PrefixStore

    store = PrefixStore(MemoryArena(8, 64), page_size=1)
    store.insert(b"ns", np.arange(1, 5, dtype="<u4").tobytes(), data=b"x" * 32)
    for _ in range(25):
        store.match(b"ns", np.arange(1, 5, dtype="<u4").tobytes(), owner=7)
    assert [store.release_owner(7, 10) for _ in range(4)] == [10, 10, 5, 0]
    assert store.stats()["leases"] == 0 and store.check() == []
