"""Regressions from a review: what must never take the daemon down or let it grow without bound."""

from __future__ import annotations

import glob
import socket
import subprocess
import sys
import time

import redis

from pfxcache.testing import encode_command
from support import RawClient
from pfxcache.daemon.store import MemoryArena, PrefixStore


def test_huge_tcp_keepalive_does_not_kill_the_server(fresh_daemon):
    daemon = fresh_daemon()
    client = redis.Redis(host=daemon.host, port=daemon.port)
    assert client.config_set("tcp-keepalive", 40000)  # Linux refuses TCP_KEEPIDLE > 32767
    client.close()
    for _ in range(3):
        with RawClient(daemon.address) as raw:
            assert raw.call_raw("PING") == b"+PONG\r\n"
    assert daemon.proc.poll() is None


def test_unread_pipelined_withdata_replies_are_not_all_buffered(fresh_daemon):
    daemon = fresh_daemon("--page-size", "1", "--block-bytes", "1mb", "--maxmemory", "32mb",
                          "--evict-low-watermark", "0")
    admin = redis.Redis(host=daemon.host, port=daemon.port)
    tokens = [str(t) for t in range(16)]
    admin.execute_command("PFXSET", "big", "TOKENS", *tokens, "DATA", b"x" * (16 << 20))
    before = admin.info("memory")["used_memory_rss"]
    hog = socket.create_connection(daemon.address)
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    request = encode_command("PFXGET", "big", "TOKENS", *tokens, "NOLEASE", "WITHDATA")
    hog.sendall(request * 40)  # 40 x 16 MiB of replies, none of them read
    time.sleep(1.5)
    grown = admin.info("memory")["used_memory_rss"] - before
    assert admin.ping()  # the daemon still serves others
    hog.close()
    admin.close()
    # Without backpressure this is ~640 MiB; with it, about one reply plus the flush threshold.
    assert grown < 120 * 2**20, grown


def test_bad_pidfile_is_a_clean_startup_error_that_leaves_no_arena(tmp_path):
    name = f"pfxtest{int(time.time() * 1000) % 10**9}"
    result = subprocess.run(
        [sys.executable, "-m", "pfxcache.daemon", "--port", "0", "--arena-name", name,
         "--pidfile", str(tmp_path / "missing-dir" / "x.pid")],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 1
    assert "pidfile" in result.stdout + result.stderr and "Traceback" not in result.stdout + result.stderr
    assert glob.glob(f"/dev/shm/{name}-*") == []


def test_empty_namespaces_do_not_accumulate(fresh_daemon):
    daemon = fresh_daemon("--page-size", "4", "--block-bytes", "16")
    client = redis.Redis(host=daemon.host, port=daemon.port)
    pipe = client.pipeline(transaction=False)
    for i in range(300):
        pipe.execute_command("PFXSET", f"k{i}", "TOKENS", "1", "DATA", b"")  # no whole page
        pipe.execute_command("PFXGET", f"ghost{i}", "TOKENS", "1", "2", "3", "4")  # a miss
    pipe.execute()
    for i in range(50):
        lease = client.execute_command("PFXALLOC", f"a{i}", 1)
        client.execute_command("PFXRELEASE", lease[b"lease"] if isinstance(lease, dict) else lease[1])
    info = client.execute_command("PFXINFO")
    stats = info[b"stats"] if isinstance(info, dict) else None
    assert client.dbsize() == 0
    assert stats is None or stats[b"namespaces"] == 0
    client.close()


def test_a_copy_pin_without_deadline_outlives_expiry_and_gets_its_ttl_after():
    now = [0.0]
    store = PrefixStore(MemoryArena(4, 8), page_size=1, shards=1, clock=lambda: now[0])
    store.insert(b"a", b"\x01\x00\x00\x00\x02\x00\x00\x00", data=b"AAAABBBB")
    pinned = store.match(b"a", b"\x01\x00\x00\x00\x02\x00\x00\x00", ttl_ms=0, owner=1)  # as WITHDATA pins
    now[0] += 3600
    assert store.expire() == 0  # no deadline: the copy cannot lose its pages
    assert store.renew(pinned.lease_id, 1, 1000)  # the copy is done: the lease gets its TTL
    assert not store.renew(pinned.lease_id, 2, 1000)  # only its owner may
    now[0] += 0.5
    assert store.expire() == 0
    now[0] += 1.0
    assert store.expire() == 1
    assert store.check() == []


def test_pfxcheck_answers_ok_on_a_consistent_store_and_lists_violations(fresh_daemon):
    daemon = fresh_daemon("--page-size", "1", "--block-bytes", "4", "--maxmemory", "4096")
    client = redis.Redis(host=daemon.host, port=daemon.port)
    assert client.execute_command("PFXCHECK") == b"OK"
    client.execute_command("PFXSET", "a", "TOKENS", "1", "2", "DATA", b"x" * 8)
    client.execute_command("PFXALLOC", "a", 2)
    client.execute_command("PFXGET", "a", "TOKENS", "1", "2")
    assert client.execute_command("PFXCHECK") == b"OK"
    with RawClient(daemon.address) as raw:
        assert raw.call_raw("PFXCHECK", "x") == b"-ERR wrong number of arguments for 'pfxcheck' command\r\n"
        assert b"+admin\r\n" in raw.call_raw("COMMAND", "INFO", "PFXCHECK")
    client.close()

    # A corrupted store: the handler lists what is wrong as one -ERR line.
    from types import SimpleNamespace

    from pfxcache.daemon.commands.prefix_commands import pfxcheck
    from pfxcache.protocol.replies import Error

    store = PrefixStore(MemoryArena(4, 8), page_size=1, shards=1)
    ctx = SimpleNamespace(server=SimpleNamespace(prefix=SimpleNamespace(store=store)))
    assert not isinstance(pfxcheck(ctx, [b"PFXCHECK"]), Error)
    store._leased_by[0] = 12345
    reply = pfxcheck(ctx, [b"PFXCHECK"])
    assert isinstance(reply, Error)
    assert reply.message.startswith("ERR store check failed, 1 violation(s): lease index maps block 0")


def _unread_withdata_hog(daemon, count: int = 4, size: int = 16 << 20) -> tuple[socket.socket, redis.Redis]:
    """A client that pipelines WITHDATA reads of ``size`` bytes each and never reads a reply.

    The replies are larger than what the kernel's socket buffers take (tcp_wmem's 4 MiB), so
    most of the first one stays unsent in the daemon.
    """
    admin = redis.Redis(host=daemon.host, port=daemon.port)
    tokens = [str(t) for t in range(size // (4 << 20))]
    admin.execute_command("PFXSET", "big", "TOKENS", *tokens, "DATA", b"x" * size)
    hog = socket.create_connection(daemon.address)
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.sendall(encode_command("PFXGET", "big", "TOKENS", *tokens, "NOLEASE", "WITHDATA") * count)
    return hog, admin


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _clients(admin: redis.Redis) -> int:
    return admin.info("clients")["connected_clients"]


OBL = ("--page-size", "1", "--block-bytes", "4mb", "--maxmemory", "32mb", "--evict-low-watermark", "0")


def test_output_buffer_hard_limit_disconnects_a_client_that_does_not_read(fresh_daemon):
    daemon = fresh_daemon(*OBL, "--client-output-buffer-limit", "normal", "1mb", "0", "0")
    hog, admin = _unread_withdata_hog(daemon)
    assert admin.config_get("client-output-buffer-limit") == {
        "client-output-buffer-limit": "normal 1048576 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60"
    }
    assert _wait_for(lambda: admin.info("stats")["client_output_buffer_limit_disconnections"] == 1)
    assert _wait_for(lambda: _clients(admin) == 1)
    assert "scheduled to be closed ASAP for overcoming of output buffer limits" in daemon.log_text()
    hog.close()  # (draining what the kernel already holds through a 4 KiB window takes minutes)
    assert admin.ping()
    assert admin.execute_command("PFXCHECK") == b"OK"
    info = admin.execute_command("PFXINFO")
    assert info[b"stats"][b"leases"] == 0 if isinstance(info, dict) else True
    admin.close()


def test_output_buffer_soft_limit_disconnects_after_soft_seconds(fresh_daemon):
    daemon = fresh_daemon(*OBL)
    admin = redis.Redis(host=daemon.host, port=daemon.port)
    assert admin.config_set("client-output-buffer-limit", "normal 0 512kb 1")
    admin.close()
    started = time.monotonic()
    hog, admin = _unread_withdata_hog(daemon)
    time.sleep(0.5)
    assert admin.info("stats")["client_output_buffer_limit_disconnections"] == 0  # not yet: under soft-seconds
    assert _wait_for(lambda: admin.info("stats")["client_output_buffer_limit_disconnections"] == 1)
    assert 1.0 <= time.monotonic() - started < 4.0
    assert _wait_for(lambda: _clients(admin) == 1)
    hog.close()
    assert admin.execute_command("PFXCHECK") == b"OK"
    admin.close()


def test_output_buffer_limits_leave_a_reading_client_alone(fresh_daemon):
    daemon = fresh_daemon(*OBL, "--client-output-buffer-limit", "normal", "8mb", "1mb", "5")
    admin = redis.Redis(host=daemon.host, port=daemon.port)
    tokens = ["1"]
    admin.execute_command("PFXSET", "big", "TOKENS", *tokens, "DATA", b"x" * (4 << 20))
    pipe = admin.pipeline(transaction=False)
    for _ in range(10):
        pipe.execute_command("PFXGET", "big", "TOKENS", *tokens, "NOLEASE", "WITHDATA")
    replies = pipe.execute()
    assert all(len(r[b"data"] if isinstance(r, dict) else r[-1]) == 4 << 20 for r in replies)
    assert admin.info("stats")["client_output_buffer_limit_disconnections"] == 0
    admin.close()


def test_a_huge_declared_bulk_sent_slowly_holds_only_what_arrived(fresh_daemon):
    daemon = fresh_daemon()
    admin = redis.Redis(host=daemon.host, port=daemon.port)
    before = admin.info("memory")["used_memory_rss"]
    slow = socket.create_connection(daemon.address)
    slow.sendall(b"*2\r\n$4\r\nECHO\r\n$500000000\r\n")  # declares ~477 MiB, under proto-max-bulk-len
    for _ in range(20):
        slow.sendall(b"x" * 65536)
        time.sleep(0.02)
    time.sleep(0.3)
    held = admin.info("memory")["used_memory_rss"] - before
    listing = admin.client_list()
    admin.close()
    slow.close()
    # ~1.3 MiB arrived: the daemon holds about that, never the declared size.
    assert held < 64 * 2**20, held
    assert any(int(row["qbuf"]) >= 1_000_000 for row in listing)  # and it shows in CLIENT LIST
