"""Integrity: no worker ever gets bytes it should not (stale, foreign, recycled), and small
correctness rules a Redis user relies on (hz, integer syntax, lease-ttl 0). Issue 12.

Everything runs against a real pfxcached over real sockets; where Redis defines the behaviour
(integer syntax) a real redis-server answers the same requests side by side.
"""

from __future__ import annotations

import time

import pytest
import redis

from support import wait_for


def ticks(client: redis.Redis) -> int:
    return int(client.info("pfxcache")["pfxcache_ticks"])


# -- item 8: hz, integer syntax, lease-ttl 0 --------------------------------------------------------


def test_config_set_hz_changes_how_often_background_work_runs(fresh_daemon):
    daemon = fresh_daemon()
    client = redis.Redis(host=daemon.host, port=daemon.port)
    assert client.config_set("hz", 1)
    time.sleep(1.1)  # the tick sleeping at the old hz ends
    start = ticks(client)
    time.sleep(2.5)
    # An upper bound: a loaded machine only makes ticks later, never more frequent.
    assert ticks(client) - start <= 4, "hz 1 must mean about one background run a second"
    assert client.config_set("hz", 500)
    start = ticks(client)
    # 100 runs take 0.2 s at 500 Hz and 10 s at the default 10 Hz.
    wait_for(lambda: ticks(client) - start >= 100, 5, "100 background runs at hz 500")
    client.close()


# Redis's string2ll decides what is an integer; TOKENS lists end at the first argument that is not one.
INTEGER_SPELLINGS = [b"0", b"7", b"007", b"00", b"-0", b"+1", b" 1", b"1 ", b"-1", b"4294967295",
                     b"4294967296", b"1e3", b"0x10", b"\xd9\xa3"]


@pytest.mark.parametrize("raw", INTEGER_SPELLINGS, ids=repr)
def test_token_ids_are_integers_exactly_when_redis_says_so(daemon, redis_server, raw):
    reference = redis.Redis(host=redis_server.host, port=redis_server.port)
    ours = redis.Redis(host=daemon.host, port=daemon.port)
    try:
        reference.execute_command("INCRBY", "integrity:n", raw)
        redis_integer = True
    except redis.ResponseError as exc:
        assert "not an integer" in str(exc)
        redis_integer = False
    finally:
        reference.delete("integrity:n")
    try:
        ours.execute_command("PFXGET", "integrity", "TOKENS", raw, "NOLEASE")
        error = None
    except redis.ResponseError as exc:
        error = str(exc)
    if not redis_integer:
        # Not an integer: the TOKENS list ended before it, and it is no option either.
        assert error is not None and "unknown option" in error, (raw, error)
    elif 0 <= int(raw) <= 2**32 - 1:
        assert error is None, (raw, error)
    else:
        assert error is not None and "unsigned 32-bit" in error, (raw, error)
    reference.close()
    ours.close()


def test_lease_ttl_zero_means_leases_without_deadline(fresh_daemon):
    daemon = fresh_daemon("--lease-ttl", "0", "--page-size", "2", "--block-bytes", "8")
    client = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    assert client.config_get("lease-ttl") == {"lease-ttl": "0"}
    client.execute_command("PFXSET", "t", "TOKENS", 1, 2, "DATA", b"x" * 8)
    lease = client.execute_command("PFXGET", "t", "TOKENS", 1, 2)[b"lease"]
    assert client.config_set("lease-ttl", 1)  # later leases get 1 ms; the one taken keeps no deadline
    start = ticks(client)
    wait_for(lambda: ticks(client) - start >= 3, 10, "three expiry passes")
    assert client.execute_command("PFXINFO")[b"stats"][b"leases"] == 1
    assert client.config_set("lease-ttl", 0)
    assert client.execute_command("PFXRELEASE", lease) == 1
    client.close()


# -- item 2: fresh blocks never show what another tenant wrote --------------------------------------

TENANTS_ACL = ("user tenant-a on >pa ~a:* +@pfx -@admin\n"
               "user tenant-b on >pb ~b:* +@pfx -@admin\n")


@pytest.fixture
def tenants(fresh_daemon, tmp_path):
    aclfile = tmp_path / "users.acl"
    aclfile.write_text(TENANTS_ACL)
    daemon = fresh_daemon("--page-size", "4", "--block-bytes", "128", "--maxmemory", "1024",
                          "--evict-low-watermark", "0", "--aclfile", str(aclfile))
    opened = []

    def connect(user: str, password: str) -> redis.Redis:
        client = redis.Redis(host=daemon.host, port=daemon.port, protocol=3, username=user, password=password)
        opened.append(client)
        return client

    yield daemon, connect
    for client in opened:
        client.close()


def test_allocated_blocks_never_hold_another_tenants_evicted_bytes(tenants):
    daemon, connect = tenants
    a, b = connect("tenant-a", "pa"), connect("tenant-b", "pb")
    # B fills every block of the arena with its secret, then forgets it.
    for i in range(8):
        b.execute_command("PFXSET", f"b:{i}", "TOKENS", i, 2, 3, 4, "DATA", b"SECRET!!" * 16)
    assert b.execute_command("PFXINFO")[b"arena"][b"blocks-free"] == 0
    for i in range(8):
        b.execute_command("PFXEVICT", f"b:{i}", "ALL")
    # A allocates every block, commits them unwritten, and reads them back over RESP.
    for i in range(8):
        (block,) = a.execute_command("PFXALLOC", f"a:{i}", 1)[b"blocks"]
        a.execute_command("PFXSET", f"a:{i}", "TOKENS", 9, 9, 9, i, "BLOCKS", block)
        data = a.execute_command("PFXGET", f"a:{i}", "TOKENS", 9, 9, 9, i, "WITHDATA", "NOLEASE")[b"data"]
        assert data == b"\0" * 128, data


def test_arena_zero_clears_exactly_the_given_blocks_in_runs_or_scattered():
    from pfxcache.daemon.store import MemoryArena

    arena = MemoryArena(8, 200)
    arena.write(range(200), bytes(range(200)) * 8)
    scattered = list(range(199, 50, -3))  # more runs than one memset each
    for ids in ([0, 1, 2, 7], scattered, []):
        arena.zero(ids)
    zeroed = {0, 1, 2, 7, *scattered}
    for block in range(200):
        expected = bytes(8) if block in zeroed else (bytes(range(200)) * 8)[block * 8 : block * 8 + 8]
        assert arena.read([block]) == expected, block
