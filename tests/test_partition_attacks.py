"""Attacks on the arena partitions (issue 12 item 4), by tenants' workers running as another user.

Every attack runs in a forked child dropped to uid/gid 65534 against a real daemon over its real
unix socket, with the real descriptors PFXATTACH passes: what the kernel refuses is really refused.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os

import numpy as np
import pytest
import redis

from pfxcache.client.partitioned import exchange
from test_partition_attach import BB, NOBODY, as_nobody, pages, sock_dir, tenants, tokens  # noqa: F401

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="workers of another user need root to setuid")

FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
MADV_REMOVE = 9


def punch(fd: int, offset: int, length: int) -> str:
    """fallocate(PUNCH_HOLE | KEEP_SIZE): 'punched' or the errno's name."""
    if _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return "punched"
    return errno.errorcode[ctypes.get_errno()]


def _punch_own_partition(path: str) -> str:
    layout, fds = exchange(path, "ta", "pa")
    try:
        return punch(fds[0], 0, 16 * BB)
    finally:
        for fd in fds:
            os.close(fd)


def _read_only_upgrades(path: str, block: int) -> dict:
    out: dict = {}
    layout, fds = exchange(path, "tr", "pr")
    fd, size = fds[0], 16 * BB
    out["punch"] = punch(fd, 0, size)
    view = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    # mprotect a read-only shared mapping to writable: the kernel refuses (no VM_MAYWRITE).
    addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    out["mprotect"] = "ok" if _libc.mprotect(addr, size, mmap.PROT_READ | mmap.PROT_WRITE) == 0 \
        else errno.errorcode[ctypes.get_errno()]
    out["madv_remove"] = "ok" if _libc.madvise(addr, size, MADV_REMOVE) == 0 else errno.errorcode[ctypes.get_errno()]
    # A private mapping is writable, but copy-on-write: the shared memory never changes.
    private = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    private[block * BB: block * BB + 4] = b"EVIL"
    private.close()
    for name, attempt in (("reopen_rw", lambda: os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDWR))),
                          ("reopen_wr", lambda: os.close(os.open(f"/proc/self/fd/{fd}", os.O_WRONLY))),
                          ("fchmod", lambda: os.fchmod(fd, 0o666)),
                          ("write", lambda: os.pwrite(fd, b"EVIL", block * BB)),
                          ("truncate", lambda: os.ftruncate(fd, 0)),
                          ("seal", lambda: fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)),
                          ("setfl", lambda: fcntl.fcntl(fd, fcntl.F_SETFL, os.O_RDWR))):
        try:
            attempt()
            out[name] = "ok"
        except OSError as exc:
            out[name] = errno.errorcode[exc.errno]
    out["bytes"] = list(view[block * BB: block * BB + 4])
    view.close()
    os.close(fd)
    return out


def test_a_hole_punched_in_a_partition_reads_as_zeros_and_never_kills_the_daemon(tenants):
    daemon, path, admin = tenants
    admin.execute_command("PFXSET", "a:doc", "TOKENS", *tokens(7, 3), "DATA", pages(1, 3).tobytes())
    admin.execute_command("PFXSET", "b:doc", "TOKENS", *tokens(7, 3), "DATA", pages(2, 3).tobytes())
    assert as_nobody(_punch_own_partition, path) == "punched"  # its own memory: the kernel lets it
    found = admin.execute_command("PFXGET", "a:doc", "TOKENS", *tokens(7, 3), "WITHDATA", "NOLEASE")
    assert found[b"data"] == bytes(3 * BB)  # zeros, no SIGBUS
    admin.execute_command("PFXSET", "a:new", "TOKENS", *tokens(8, 2), "DATA", pages(3, 2).tobytes())
    found = admin.execute_command("PFXGET", "a:new", "TOKENS", *tokens(8, 2), "WITHDATA", "NOLEASE")
    assert found[b"data"] == pages(3, 2).tobytes()  # writes into the hole land in fresh pages
    found = admin.execute_command("PFXGET", "b:doc", "TOKENS", *tokens(7, 3), "WITHDATA", "NOLEASE")
    assert found[b"data"] == pages(2, 3).tobytes()
    assert daemon.proc.poll() is None and admin.execute_command("PFXCHECK") == b"OK"


def test_a_read_only_descriptor_cannot_be_upgraded(tenants):
    _, path, admin = tenants
    admin.execute_command("PFXSET", "a:doc", "TOKENS", *tokens(5, 2), "DATA", pages(4, 2).tobytes())
    block = admin.execute_command("PFXGET", "a:doc", "TOKENS", *tokens(5, 2), "NOLEASE")[b"blocks"][0]
    out = as_nobody(_read_only_upgrades, path, block)
    assert out == {"punch": "EBADF", "mprotect": "EACCES", "madv_remove": "EACCES", "reopen_rw": "EACCES",
                   "reopen_wr": "EACCES", "fchmod": "EPERM", "write": "EBADF", "truncate": "EINVAL",
                   "seal": "EPERM", "setfl": "ok", "bytes": pages(4, 2)[0, :4].tolist()}
    found = admin.execute_command("PFXGET", "a:doc", "TOKENS", *tokens(5, 2), "WITHDATA", "NOLEASE")
    assert found[b"data"] == pages(4, 2).tobytes()


def _raw(path: str, *commands: list[bytes], replies: int) -> tuple[bytes, int]:
    """Send ``commands`` on a raw unix socket connection, read until ``replies`` CRLF-ended replies
    of simple types came: the bytes and how many descriptors came with them (closed)."""
    import array
    import socket

    from pfxcache.protocol.replies import encode

    data, nfds = b"", 0
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(b"".join(encode(c) for c in commands))
        while data.count(b"\r\n") < replies:
            chunk, ancillary, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(253 * 4))
            for _, _, payload in ancillary:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % 4])
                nfds += len(fds)
                for fd in fds:
                    os.close(fd)
            if not chunk:
                break
            data += chunk
    return data, nfds


def test_no_descriptor_travels_without_its_reply_under_client_reply_off_or_skip(tenants):
    """Muted, PFXATTACH's descriptors used to go out with the next reply (a PONG, CLIENT REPLY ON's
    +OK): the worker got memory with no layout saying which partition it was."""
    _, path, admin = tenants
    auth = [b"AUTH", b"ops", b"po"]
    data, nfds = _raw(path, auth, [b"CLIENT", b"REPLY", b"SKIP"], [b"PFXATTACH"], [b"PING"], replies=2)
    assert data == b"+OK\r\n+PONG\r\n" and nfds == 0
    data, nfds = _raw(path, auth, [b"CLIENT", b"REPLY", b"OFF"], [b"PFXATTACH"], [b"CLIENT", b"REPLY", b"ON"],
                      [b"PING"], replies=3)
    assert data == b"+OK\r\n+OK\r\n+PONG\r\n" and nfds == 0
    # In a transaction a later CLIENT REPLY OFF would mute EXEC's reply after PFXATTACH ran: refused there.
    data, nfds = _raw(path, auth, [b"MULTI"], [b"PFXATTACH"], [b"CLIENT", b"REPLY", b"OFF"], [b"EXEC"],
                      [b"CLIENT", b"REPLY", b"ON"], [b"PING"], replies=5)
    assert data.startswith(b"+OK\r\n+OK\r\n-ERR Command not allowed inside a transaction") and nfds == 0
    data, nfds = _raw(path, auth, [b"PFXATTACH"], [b"PING"], replies=20)  # unmuted: all three
    assert nfds == 3 and data.endswith(b"+PONG\r\n")
    assert admin.execute_command("PFXCHECK") == b"OK"


def test_the_partitions_one_reply_can_carry_are_a_startup_limit():
    from pfxcache.testing import start_daemon

    too_many = [arg for i in range(128) for arg in ("--arena-partition", f"t{i}:* 1")]
    with pytest.raises(Exception, match="at most 127 arena-partition"):
        started = start_daemon("--block-bytes", "4096", "--maxmemory", str(256 * 4096), *too_many)
        started.stop()  # it should not have started (every operator's PFXATTACH would be refused)


def _switch_user_and_commit_across(path: str) -> dict:
    """As ta, allocate in a's partition; AUTH as tb on the same connection; commit a's blocks to b."""
    import redis as redis_py

    out: dict = {}
    conn = redis_py.Redis(unix_socket_path=path, username="ta", password="pa")
    reply = conn.execute_command("PFXALLOC", "a:x", 2)
    reply = dict(zip(reply[::2], reply[1::2])) if isinstance(reply, list) else reply
    blocks = reply[b"blocks"]
    conn.execute_command("AUTH", "tb", "pb")
    try:
        conn.execute_command("PFXSET", "b:x", "TOKENS", *tokens(3, 2), "BLOCKS", *blocks)
        out["commit"] = "accepted"
    except redis_py.ResponseError as exc:
        out["commit"] = str(exc)
    try:
        conn.execute_command("PFXSET", "a:x", "TOKENS", *tokens(3, 2), "BLOCKS", *blocks)
        out["commit_a_as_b"] = "accepted"
    except redis_py.ResponseError as exc:
        out["commit_a_as_b"] = str(exc)
    conn.close()
    return out


def test_blocks_allocated_as_one_tenant_cannot_be_committed_as_another_on_the_same_connection(tenants):
    _, path, admin = tenants
    out = as_nobody(_switch_user_and_commit_across, path)
    assert "not in the arena partition" in out["commit"]
    assert "no permissions" in out["commit_a_as_b"]
    assert admin.execute_command("DBSIZE") == 0
    assert admin.execute_command("PFXCHECK") == b"OK"


def _attach_then_wait_for_revocation(path: str, go_read: int, done_write: int) -> dict:
    import redis as redis_py

    out: dict = {}
    layout, fds = exchange(path, "ta", "pa")
    view = mmap.mmap(fds[0], 16 * BB)
    os.close(fds[0])
    conn = redis_py.Redis(unix_socket_path=path, username="ta", password="pa")
    conn.execute_command("PFXINFO", "a:x")  # connected and authenticated before the change
    os.write(done_write, b"1")  # attached: the parent narrows ta now
    os.read(go_read, 1)
    view[0:4] = b"KEPT"  # the kernel cannot take a mapping back
    out["kept"] = bytes(view[0:4]).decode()
    view.close()
    again = conn.execute_command("PFXATTACH")
    again = dict(zip(again[::2], again[1::2])) if isinstance(again, list) else again
    out["again"] = len(again[b"partitions"])
    conn.close()
    return out


def test_a_narrowed_user_keeps_what_it_mapped_but_its_next_attach_gets_nothing(tenants):
    """The documented limit (README, Isolation): descriptors already passed are not revoked."""
    import threading

    _, path, admin = tenants
    go_read, go_write = os.pipe()
    done_read, done_write = os.pipe()

    def revoke() -> None:
        os.read(done_read, 1)
        admin.execute_command("ACL", "SETUSER", "ta", "resetkeys", "~c:*", "-pfxalloc")
        os.write(go_write, b"1")

    thread = threading.Thread(target=revoke)
    thread.start()
    try:
        out = as_nobody(_attach_then_wait_for_revocation, path, go_read, done_write)
    finally:
        os.close(done_write)  # a child that died early: the thread reads EOF, never waits forever
        thread.join()
        for fd in (go_read, go_write, done_read):
            os.close(fd)
    assert out == {"kept": "KEPT", "again": 0}


def _vandal(path: str, go_read: int, stop_read: int) -> dict:
    """ta's worker: writes garbage over all of its own partition and punches holes in it until told
    to stop (each round checks for the parent's stop byte)."""
    layout, fds = exchange(path, "ta", "pa")
    view = mmap.mmap(fds[0], 16 * BB)
    rng = np.random.default_rng(7)
    os.set_blocking(stop_read, False)
    os.read(go_read, 1)
    rounds = 0
    while True:
        try:
            if os.read(stop_read, 1):
                break
        except BlockingIOError:
            pass
        block = int(rng.integers(0, 16))
        if rounds % 3:
            view[block * BB: (block + 1) * BB] = rng.integers(0, 256, BB, dtype=np.uint8).tobytes()
        else:
            punch(fds[0], block * BB, BB)
        rounds += 1
    view.close()
    os.close(fds[0])
    return {"rounds": rounds}


@pytest.mark.parametrize("seed", [1, 2])
def test_a_vandal_in_its_own_partition_never_touches_other_tenants_bytes_nor_the_daemon(tenants, seed):
    """While a's worker scribbles over and punches holes in all of a's partition, b's namespaces and
    the shared remainder go through inserts, evictions under pressure, FLUSHALL and policy switches,
    and every byte read back is the one written; a's own reads never crash the daemon."""
    import threading

    daemon, path, admin = tenants
    go_read, go_write = os.pipe()
    stop_read, stop_write = os.pipe()
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(as_nobody(_vandal, path, go_read, stop_read)))
    thread.start()
    rng = np.random.default_rng(seed)
    expected: dict = {}
    try:
        os.write(go_write, b"1")
        for step in range(300):
            roll = rng.random()
            name = f"{'b' if rng.random() < 0.5 else 'c'}:{int(rng.integers(0, 6))}"
            first, n = 1000 * step + seed, int(rng.integers(1, 4))  # no insert continues another
            if roll < 0.45:
                data = rng.integers(0, 256, (n, BB), dtype=np.uint8)
                try:
                    admin.execute_command("PFXSET", name, "TOKENS", *tokens(first, n), "DATA", data.tobytes())
                    expected[(name, first, n)] = data.tobytes()
                except redis.ResponseError as exc:
                    assert "OOM" in str(exc)
            elif roll < 0.85 and expected:
                keys = list(expected)
                key = keys[int(rng.integers(0, len(keys)))]
                found = admin.execute_command("PFXGET", key[0], "TOKENS", *tokens(key[1], key[2]), "WITHDATA",
                                              "NOLEASE")
                have = found[b"data"]
                assert have == expected[key][: len(have)], f"step {step}: {key} changed"  # evicted tails only
            elif roll < 0.9:
                admin.execute_command("PFXGET", "a:x", "TOKENS", *tokens(first, 2), "WITHDATA", "NOLEASE")
                admin.execute_command("PFXSET", "a:x", "TOKENS", *tokens(first, 2), "DATA", bytes(2 * BB))
            elif roll < 0.95:
                admin.execute_command("CONFIG", "SET", "maxmemory-policy", ["lru", "guard", "lfu"][step % 3])
            else:
                admin.execute_command("FLUSHALL")
                expected.clear()
    finally:
        os.write(stop_write, b"1")
        thread.join()
        for fd in (go_read, go_write, stop_read, stop_write):
            os.close(fd)
    assert result["rounds"] > 0
    assert daemon.proc.poll() is None and admin.execute_command("PFXCHECK") == b"OK"
