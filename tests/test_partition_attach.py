"""PFXATTACH (issue 12 item 4): a tenant's worker, running as another user, maps its own arena
partition zero-copy through descriptors passed over the unix socket, and nothing else.

Real daemon, real unix socket, SCM_RIGHTS, real mappings. The workers run in forked children
that drop to uid/gid 65534 (nobody), so the kernel's checks are the real ones: they cannot open
the daemon's /proc/<pid>/fd paths, and read-only descriptors refuse writable mappings.
"""

from __future__ import annotations

import errno
import fcntl
import json
import mmap
import os
import shutil
import socket
import tempfile
import traceback

import numpy as np
import pytest
import redis

from pfxcache.client import PrefixCache
from pfxcache.client.partitioned import PartitionedArenaView, exchange
from pfxcache.protocol.replies import encode

PS, BB = 4, 4096
NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="workers of another user need root to setuid")


def pages(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, BB), dtype=np.uint8)


def tokens(first: int, n: int) -> list[int]:
    return [first, *range(1, n * PS)]


def as_nobody(fn, *args):
    """Run ``fn(*args)`` in a forked child running as uid/gid 65534; its JSON-able result."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = {"ok": fn(*args)}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            result = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 1 << 16):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    result = json.loads(b"".join(chunks) or b'{"error": "the child died"}')
    assert "error" not in result, result["error"]
    return result["ok"]


@pytest.fixture
def sock_dir():
    path = tempfile.mkdtemp(prefix="pfx-attach-")
    os.chmod(path, 0o755)  # nobody must reach the socket
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tenants(fresh_daemon, sock_dir):
    """A daemon with partitions a:* and b:*, users ta and tb (one tenant each), tr (a's reader) and
    an operator; returns (daemon, socket path, admin connection)."""
    path = os.path.join(sock_dir, "pfx.sock")
    daemon = fresh_daemon("--page-size", str(PS), "--block-bytes", str(BB), "--maxmemory", str(64 * BB),
                          "--evict-low-watermark", "0", "--arena-partition", "a:* 16",
                          "--arena-partition", "b:* 16", "--unixsocket", path, "--unixsocketperm", "777")
    admin = redis.Redis(host=daemon.host, port=daemon.port)
    admin.execute_command("ACL", "SETUSER", "ta", "on", ">pa", "~a:*", "+@pfx")
    admin.execute_command("ACL", "SETUSER", "tb", "on", ">pb", "~b:*", "+@pfx")
    admin.execute_command("ACL", "SETUSER", "tr", "on", ">pr", "~a:*", "+@pfx", "-pfxalloc", "-pfxset", "-pfxevict")
    admin.execute_command("ACL", "SETUSER", "ops", "on", ">po", "allkeys", "allchannels", "+@all")
    admin.execute_command("ACL", "SETUSER", "default", "off")
    return daemon, path, admin


def _tenant_worker(path: str, daemon_pid: int) -> dict:
    out: dict = {"uid": os.getuid()}
    cache = PrefixCache.from_url(f"unix://{path}", username="ta", password="pa")
    arena = cache.attach()
    out["view"] = type(arena).__name__
    out["ranges"] = [[first, end, writable, pattern.decode()] for first, end, writable, pattern in arena.ranges]
    src = pages(1, 3)
    stored = cache.save("a:doc", tokens(7, 3), src)
    out["save_via"] = stored.via
    got = np.zeros((3, BB), np.uint8)
    match = cache.load("a:doc", tokens(7, 3), got)
    out["load_via"], out["load_ok"] = match.via, bool(np.array_equal(got, src))
    # Zero-copy by hand: the leased blocks are the bytes, in this process's memory.
    found = cache.lookup("a:doc", tokens(7, 3))
    out["zero_copy_ok"] = bool(np.array_equal(arena.blocks(found.blocks), src))
    found.release()
    allocation = cache.alloc("a:raw", 2)
    arena.blocks(allocation.blocks)[:] = pages(2, 2)  # written straight into the shared memory
    cache.commit("a:raw", tokens(9, 2), allocation)
    allocation.release()
    # b's blocks are not mapped here, its keys are refused, the daemon's memfds do not open.
    try:
        arena.blocks([20])
        out["b_block"] = "read"
    except IndexError:
        out["b_block"] = "refused"
    try:
        cache.lookup("b:doc", tokens(7, 3))
        out["b_lookup"] = "allowed"
    except redis.ResponseError as exc:
        out["b_lookup"] = "refused" if "no permissions" in str(exc) else str(exc)
    opened = []
    for fd in range(64):
        try:
            os.close(os.open(f"/proc/{daemon_pid}/fd/{fd}", os.O_RDONLY))
            opened.append(fd)
        except OSError:
            pass
    out["proc_opened"] = opened
    cache.close()
    # The raw exchange: one descriptor, a's, which can be neither shrunk, grown nor resealed.
    layout, fds = exchange(path, "ta", "pa")
    out["fds"] = len(fds)
    refused = []
    for name, attempt in (("shrink", lambda fd: os.ftruncate(fd, 0)),
                          ("grow", lambda fd: os.ftruncate(fd, 1 << 30)),
                          ("fallocate", lambda fd: os.posix_fallocate(fd, 0, 1 << 30)),
                          ("seal-write", lambda fd: fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE))):
        try:
            attempt(fds[0])
        except OSError as exc:
            refused.append([name, errno.errorcode[exc.errno]])
    out["refused"] = refused
    for fd in fds:
        os.close(fd)
    return out


def test_a_tenant_worker_of_another_user_maps_only_its_partition_zero_copy(tenants):
    daemon, path, admin = tenants
    admin.execute_command("PFXSET", "b:doc", "TOKENS", *tokens(7, 3), "DATA", pages(3, 3).tobytes())
    out = as_nobody(_tenant_worker, path, daemon.proc.pid)
    assert out["uid"] == NOBODY and out["view"] == "PartitionedArenaView"
    assert out["ranges"] == [[0, 16, True, "a:*"]]
    assert out["save_via"] == "shm" and out["load_via"] == "shm" and out["load_ok"] and out["zero_copy_ok"]
    assert out["b_block"] == "refused" and out["b_lookup"] == "refused"
    assert out["proc_opened"] == []  # not one of the daemon's descriptors opens for another user
    assert out["fds"] == 1
    assert out["refused"] == [["shrink", "EPERM"], ["grow", "EPERM"], ["fallocate", "EPERM"], ["seal-write", "EPERM"]]
    # What the worker wrote through its mapping is what the daemon serves, byte for byte.
    for key, toks, want in (("a:doc", tokens(7, 3), pages(1, 3)), ("a:raw", tokens(9, 2), pages(2, 2))):
        found = admin.execute_command("PFXGET", key, "TOKENS", *toks, "WITHDATA", "NOLEASE")
        assert found[b"data"] == want.tobytes()
    found = admin.execute_command("PFXGET", "b:doc", "TOKENS", *tokens(7, 3), "WITHDATA", "NOLEASE")
    assert found[b"data"] == pages(3, 3).tobytes()  # b's KV untouched
    assert admin.execute_command("PFXCHECK") == b"OK"


def _reader_worker(path: str, block: int) -> dict:
    out: dict = {}
    layout, fds = exchange(path, "tr", "pr")
    parts = layout["partitions"]
    out["access"] = [dict(zip(p[::2], p[1::2]))[b"access"].decode() for p in parts]
    size = 16 * BB
    try:
        mmap.mmap(fds[0], size)  # MAP_SHARED, read-write
        out["rw_map"] = "mapped"
    except PermissionError:
        out["rw_map"] = "PermissionError"
    view = mmap.mmap(fds[0], size, prot=mmap.PROT_READ)
    out["first_bytes"] = list(view[block * BB : block * BB + 4])  # what the daemon stored, read-only
    view.close()
    try:  # reopening its own descriptor writable goes through the inode's mode: refused
        os.open(f"/proc/self/fd/{fds[0]}", os.O_RDWR)
        out["reopen_rw"] = "opened"
    except PermissionError:
        out["reopen_rw"] = "PermissionError"
    for fd in fds:
        os.close(fd)
    cache = PrefixCache.from_url(f"unix://{path}", username="tr", password="pr")
    arena = cache.attach()
    out["ranges"] = [[first, end, writable] for first, end, writable, _ in arena.ranges]
    got = np.zeros((2, BB), np.uint8)
    match = cache.load("a:doc", tokens(5, 2), got)
    out["load"] = [match.via, bool(np.array_equal(got, pages(4, 2)))]
    found = cache.lookup("a:doc", tokens(5, 2))
    block = arena.blocks(found.blocks)
    out["view_writeable"] = bool(block.flags.writeable)
    try:
        arena.write_from(found.blocks, np.zeros((2, BB), np.uint8))
        out["write_from"] = "written"
    except IndexError:
        out["write_from"] = "refused"
    found.release()
    cache.close()
    return out


def test_a_read_only_user_gets_a_read_only_descriptor(tenants):
    _, path, admin = tenants
    admin.execute_command("PFXSET", "a:doc", "TOKENS", *tokens(5, 2), "DATA", pages(4, 2).tobytes())
    blocks = admin.execute_command("PFXGET", "a:doc", "TOKENS", *tokens(5, 2), "NOLEASE")[b"blocks"]
    out = as_nobody(_reader_worker, path, blocks[0])
    assert out["access"] == ["ro"]
    assert out["rw_map"] == "PermissionError" and out["reopen_rw"] == "PermissionError"
    assert out["first_bytes"] == pages(4, 2)[0, :4].tolist()
    assert out["ranges"] == [[0, 16, False]]
    assert out["load"] == ["shm", True]
    assert out["view_writeable"] is False and out["write_from"] == "refused"
    found = admin.execute_command("PFXGET", "a:doc", "TOKENS", *tokens(5, 2), "WITHDATA", "NOLEASE")
    assert found[b"data"] == pages(4, 2).tobytes()


def _raw_attach(path: str, *commands: list[bytes]) -> tuple[list[bytes], int]:
    """Send ``commands`` on a raw unix socket connection: the raw reply bytes and how many fds came."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(b"".join(encode(c) for c in commands))
        data, ancillary, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(64 * 4))
        fds = []
        for _, _, payload in ancillary:
            fds += [int.from_bytes(payload[i : i + 4], "little") for i in range(0, len(payload), 4)]
        for fd in fds:
            os.close(fd)
        return data, len(fds)


def test_pfxattach_is_refused_over_tcp_and_unauthenticated(tenants):
    daemon, path, admin = tenants
    before = admin.execute_command("PFXINFO")[b"stats"]
    with socket.create_connection(daemon.address, timeout=5) as tcp:
        tcp.sendall(encode([b"AUTH", b"ops", b"po"]) + encode([b"PFXATTACH"]))
        reply = b""
        while reply.count(b"\r\n") < 2:
            reply += tcp.recv(4096)
    assert reply.startswith(b"+OK\r\n-ERR PFXATTACH works only on the unix socket")
    data, nfds = _raw_attach(path, [b"PFXATTACH"])  # default is off: not authenticated
    assert data.startswith(b"-NOAUTH") and nfds == 0
    data, nfds = _raw_attach(path, [b"AUTH", b"ta", b"wrong"], [b"PFXATTACH"])
    assert b"WRONGPASS" in data and nfds == 0
    admin.execute_command("ACL", "SETUSER", "nopfx", "on", ">pn", "~a:*", "+ping")
    data, nfds = _raw_attach(path, [b"AUTH", b"nopfx", b"pn"], [b"PFXATTACH"])
    assert b"-NOPERM" in data and b"pfxattach" in data and nfds == 0
    admin.execute_command("ACL", "SETUSER", "wide", "on", ">pw", "~a*", "+@pfx")  # covers a:*, not b:*
    data, nfds = _raw_attach(path, [b"AUTH", b"wide", b"pw"], [b"PFXATTACH"])
    assert nfds == 1 and b"a:*" in data and b"b:*" not in data
    admin.execute_command("ACL", "SETUSER", "odd", "on", ">po", "~a:?x*", "+@pfx")  # covers no partition
    data, nfds = _raw_attach(path, [b"AUTH", b"odd", b"po"], [b"PFXATTACH"])
    assert nfds == 0 and data.endswith(b"$10\r\npartitions\r\n*0\r\n")
    data, nfds = _raw_attach(path, [b"AUTH", b"ops", b"po"], [b"PFXATTACH"])
    assert nfds == 3  # an operator: both partitions and the shared remainder
    assert admin.execute_command("PFXINFO")[b"stats"] == before
    assert admin.execute_command("PFXCHECK") == b"OK"


def _unpartitioned_worker(path: str) -> dict:
    tenant = PrefixCache.from_url(f"unix://{path}", username="ta", password="pa")
    tenant.save("a:x", tokens(1, 1), pages(5, 1))
    got = np.zeros((1, BB), np.uint8)
    via = tenant.load("a:x", tokens(1, 1), got).via
    tenant.close()
    operator = PrefixCache.from_url(f"unix://{path}", username="ops", password="po")
    arena = operator.attach()
    ranges = [[first, end, writable] for first, end, writable, _ in arena.ranges]
    operator.close()
    return {"tenant_via": via, "tenant_ok": bool(np.array_equal(got, pages(5, 1))), "operator_ranges": ranges}


def test_without_partitions_only_operators_attach_and_tenants_use_resp(fresh_daemon, sock_dir):
    path = os.path.join(sock_dir, "pfx.sock")
    daemon = fresh_daemon("--page-size", str(PS), "--block-bytes", str(BB), "--maxmemory", str(64 * BB),
                          "--unixsocket", path, "--unixsocketperm", "777")
    admin = redis.Redis(host=daemon.host, port=daemon.port)
    admin.execute_command("ACL", "SETUSER", "ta", "on", ">pa", "~a:*", "+@pfx")
    admin.execute_command("ACL", "SETUSER", "ops", "on", ">po", "allkeys", "+@all")
    out = as_nobody(_unpartitioned_worker, path)
    assert out == {"tenant_via": "resp", "tenant_ok": True, "operator_ranges": [[0, 64, True]]}


def _daemon_args(path: str) -> tuple[str, ...]:
    return ("--page-size", str(PS), "--block-bytes", str(BB), "--maxmemory", str(64 * BB),
            "--arena-partition", "a:* 16", "--unixsocket", path, "--unixsocketperm", "777",
            "--requirepass", "secret")


def test_a_restarted_daemon_is_attached_again_never_served_from_the_old_partition(sock_dir):
    from pfxcache.testing import start_daemon

    path = os.path.join(sock_dir, "pfx.sock")
    daemon = start_daemon(*_daemon_args(path))
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # redis-py reconnects by itself on the next command (as workers configure it): the cache must notice.
    cache = PrefixCache.from_url(f"unix://{path}", password="secret", socket_timeout=10,
                                 retry=Retry(NoBackoff(), 3), retry_on_error=[redis.ConnectionError])
    try:
        old = cache.attach()
        assert isinstance(old, PartitionedArenaView)
        cache.save("a:x", tokens(1, 2), pages(6, 2))
        daemon.stop()
        daemon = start_daemon(*_daemon_args(path))
        got = np.full((2, BB), 7, np.uint8)
        match = cache.load("a:x", tokens(1, 2), got)  # a new daemon: nothing cached, nothing read
        assert match.matched_tokens == 0 and (got == 7).all()
        cache.save("a:x", tokens(1, 2), pages(8, 2))  # its blocks come from the new arena: attached again
        assert old.closed and isinstance(cache.arena, PartitionedArenaView) and cache.arena is not old
        assert cache.load("a:x", tokens(1, 2), got).via == "shm" and np.array_equal(got, pages(8, 2))
        admin = redis.Redis(host=daemon.host, port=daemon.port, password="secret")
        found = admin.execute_command("PFXGET", "a:x", "TOKENS", *tokens(1, 2), "WITHDATA", "NOLEASE")
        assert found[b"data"] == pages(8, 2).tobytes()
    finally:
        cache.close()
        daemon.stop()


def _async_worker(path: str) -> list:
    import asyncio

    from pfxcache.client import AsyncPrefixCache

    async def work() -> list:
        cache = AsyncPrefixCache.from_url(f"unix://{path}", username="ta", password="pa")
        arena = await cache.attach()
        await cache.save("a:async", tokens(3, 2), pages(9, 2))
        got = np.zeros((2, BB), np.uint8)
        match = await cache.load("a:async", tokens(3, 2), got)
        await cache.aclose()
        return [type(arena).__name__, match.via, bool(np.array_equal(got, pages(9, 2)))]

    return asyncio.run(work())


def test_the_async_client_attaches_over_the_unix_socket_too(tenants):
    _, path, _ = tenants
    assert as_nobody(_async_worker, path) == ["PartitionedArenaView", "shm", True]


def test_the_daemon_keeps_no_descriptor_it_passed_or_could_not_pass(tenants):
    from support import wait_for

    daemon, path, admin = tenants

    def open_fds() -> int:
        return len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))

    baseline = open_fds()
    for i in range(30):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(path)
            sock.sendall(encode([b"AUTH", b"ops", b"po"]) + encode([b"PFXATTACH"]) * 3)
            if i % 2:  # read them (and drop the received ones), or hang up at once
                _, ancillary, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(64 * 4))
                for _, _, payload in ancillary:
                    for j in range(0, len(payload), 4):
                        os.close(int.from_bytes(payload[j : j + 4], "little"))
    wait_for(lambda: open_fds() == baseline, 10, "the daemon to close every descriptor it opened")
    with socket.socket(socket.AF_UNIX) as sock:  # and none on a subscribed connection
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(encode([b"AUTH", b"ops", b"po"]) + encode([b"SUBSCRIBE", b"ch"]) + encode([b"PFXATTACH"]))
        reply = b""
        while b"\r\n-" not in reply:
            reply += sock.recv(4096)
    assert b"-ERR" in reply and b"pfxattach" in reply
    assert admin.execute_command("PFXCHECK") == b"OK"


def test_over_tcp_a_partitioned_arena_or_a_tenant_falls_back_to_resp_with_the_reason(tenants):
    daemon, _, admin = tenants
    for user, password in (("ops", "po"), ("ta", "pa")):
        cache = PrefixCache.from_url(f"redis://{daemon.host}:{daemon.port}/0", username=user, password=password)
        try:
            assert not cache.attached and "unix socket" in cache.attach_error
            cache.save("a:tcp", tokens(4, 1), pages(10, 1))
            got = np.zeros((1, BB), np.uint8)
            assert cache.load("a:tcp", tokens(4, 1), got).via == "resp" and np.array_equal(got, pages(10, 1))
        finally:
            cache.close()
