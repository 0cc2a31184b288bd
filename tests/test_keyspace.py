"""Namespaces as Redis keys: KEYS, SCAN, EXISTS, TYPE, DEL/UNLINK, TOUCH, OBJECT, MEMORY USAGE, EXPIRE...

Errors and replies that Redis defines are compared with a real redis-server
holding a string key of the same name; what only a namespace has (pages,
leases) is checked through the PFX* commands on the same daemon.
"""

from __future__ import annotations

import subprocess
import time

import pytest
import redis

from pfxcache.testing import start_daemon
from support import wait_for

GEOMETRY = ("--page-size", "4", "--block-bytes", "8", "--maxmemory", "4096")


@pytest.fixture(scope="module")
def pfx():
    daemon = start_daemon(*GEOMETRY)
    yield daemon
    daemon.stop()


@pytest.fixture
def r(pfx):
    client = redis.Redis(*pfx.address, protocol=2)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def ref(redis_server):
    client = redis.Redis(port=redis_server.port, protocol=2)
    client.flushall()
    yield client
    client.close()


def store(r, name: str, *tokens: int) -> None:
    pages = len(tokens) // 4
    r.execute_command("PFXSET", name, "TOKENS", *tokens, "DATA", b"x" * 8 * pages)


def reply(client, *args):
    try:
        return client.execute_command(*args)
    except redis.ResponseError as exc:
        return ("error", str(exc))


# Commands whose replies must be the same when the key exists in both servers (a string in
# redis-server, a namespace here) or exists in neither.
SAME_REPLIES = [
    ("EXISTS", "k", "k", "nope"),
    ("EXISTS", "nope"),
    ("TYPE", "nope"),
    ("TTL", "k"), ("PTTL", "k"), ("TTL", "nope"), ("PTTL", "nope"),
    ("EXPIRETIME", "k"), ("PEXPIRETIME", "nope"),
    ("PERSIST", "k"), ("PERSIST", "nope"),
    ("EXPIRE", "nope", "10"),
    ("EXPIRE", "k", "10", "NX", "XX"), ("EXPIRE", "k", "10", "GT", "LT"), ("EXPIRE", "k", "10", "FOO"),
    ("EXPIRE", "k", "x"), ("EXPIRE", "k", "x", "FOO"), ("EXPIRE", "k", "99999999999999999"),
    ("PEXPIRE", "k", "9223372036854775807"), ("EXPIREAT", "k", "-9999999999999999999"),
    ("EXPIRE", "k"), ("TTL",), ("DEL",), ("KEYS",), ("SCAN",),
    ("EXPIRE", "k", "100", "XX"), ("EXPIRE", "k", "100", "NX"), ("EXPIRE", "k", "200", "LT"),
    ("EXPIRE", "k", "50", "GT"), ("TTL", "k"), ("PERSIST", "k"), ("TTL", "k"),
    ("EXPIRE", "k", "100", "GT"), ("EXPIRE", "k", "100", "LT"), ("PERSIST", "k"),
    ("SCAN", "x"), ("SCAN", ""), ("SCAN", "+"), ("SCAN", " 1"), ("SCAN", "0x1"), ("SCAN", "18446744073709551616"), ("SCAN", "0", "COUNT", "0"),
    ("SCAN", "0", "COUNT", "x"), ("SCAN", "0", "FOO", "1"), ("SCAN", "0", "MATCH"),
    ("SCAN", "0", "MATCH", "k*"), ("SCAN", "0", "MATCH", "z*"), ("SCAN", "0", "COUNT", "5", "MATCH", "?"),
    ("KEYS", "k"), ("KEYS", "[a-j]"), ("KEYS", "nope*"),
    ("OBJECT", "FREQ", "nope"), ("OBJECT", "IDLETIME", "nope"), ("OBJECT", "ENCODING", "nope"),
    ("OBJECT", "REFCOUNT", "nope"), ("OBJECT", "HELP"), ("OBJECT", "NOPE", "k"), ("OBJECT",),
    ("MEMORY", "USAGE", "nope"), ("MEMORY", "USAGE", "k", "SAMPLES", "x"),
    ("MEMORY", "USAGE", "k", "FOO", "1"), ("MEMORY", "USAGE", "k", "SAMPLES"),
    ("RENAME", "nope", "x"), ("RENAMENX", "nope", "x"), ("RENAME", "k"),
    ("TOUCH", "k", "nope", "k"), ("UNLINK", "nope"), ("DEL", "nope", "k", "k"), ("EXISTS", "k"),
    ("RANDOMKEY",), ("DBSIZE",),
]


def test_replies_match_redis_server(r, ref) -> None:
    store(r, "k", 1, 2, 3, 4)
    ref.set("k", "v")
    for args in SAME_REPLIES:
        ours, theirs = reply(r, *args), reply(ref, *args)
        if args[0] in ("TTL", "PTTL") and isinstance(ours, int) and ours > 0:
            # A time to live counts down between the two calls; a loaded machine may cross a second.
            slack = 1 if args[0] == "TTL" else 1000
            assert abs(ours - theirs) <= slack, args
            continue
        assert ours == theirs, args


def test_scan_takes_cursors_as_strtoul_does(r, ref) -> None:
    # redis-server masks a huge cursor to a bucket of its randomly seeded table, so what it returns
    # varies; the cursor is valid on both, and ours ends the scan.
    store(r, "k", 1, 2, 3, 4)
    ref.set("k", "v")
    for cursor in ("-1", "18446744073709551615", "+5"):
        assert isinstance(reply(ref, "SCAN", cursor), tuple) and reply(ref, "SCAN", cursor)[0] != "error"
        assert reply(r, "SCAN", cursor)[0] != "error"
    assert reply(r, "SCAN", "-1") == reply(r, "SCAN", "18446744073709551615") == (0, [])


def test_type_and_object_of_a_namespace(r) -> None:
    store(r, "llama:a", 1, 2, 3, 4, 5, 6, 7, 8)
    assert r.type("llama:a") == b"pfx-cache"
    assert r.object("encoding", "llama:a") == b"radix-tree"
    assert r.object("refcount", "llama:a") == 1
    assert r.object("idletime", "llama:a") == 0
    before = r.object("freq", "llama:a")
    assert before >= 5
    for _ in range(20):
        r.execute_command("PFXGET", "llama:a", "TOKENS", 1, 2, 3, 4, "NOLEASE")
    assert r.object("freq", "llama:a") > before
    assert r.execute_command("SCAN", 0, "TYPE", "pfx-cache")[1] == [b"llama:a"]
    assert r.execute_command("SCAN", 0, "TYPE", "string")[1] == []


def test_memory_usage_counts_blocks_and_metadata(r) -> None:
    store(r, "small", 1, 2, 3, 4)
    store(r, "big", *range(1, 41))
    small, big = r.memory_usage("small"), r.memory_usage("big")
    assert small > 8 and big > 10 * 8
    assert big > small
    assert r.memory_usage("small", samples=0) == small


def test_scan_returns_every_namespace_once_while_others_come_and_go(r) -> None:
    names = [f"ns:{i}" for i in range(120)]
    for i, name in enumerate(names):
        store(r, name, i, i, i, i)
    seen: list[bytes] = []
    cursor = 0
    steps = 0
    while True:
        cursor, batch = r.scan(cursor, count=7)
        seen += batch
        steps += 1
        # Churn during the iteration: new namespaces appear, unrelated ones go.
        store(r, f"extra:{steps}", steps, 1, 1, 1)
        r.delete(f"extra:{steps - 1}")
        if cursor == 0:
            break
    assert steps > 10
    assert {n.decode() for n in seen if n.startswith(b"ns:")} == set(names)
    assert len([n for n in seen if n.startswith(b"ns:")]) == len(names)
    assert sorted(r.keys("ns:*")) == sorted(n.encode() for n in names)
    assert r.dbsize() == len(r.keys("*"))


def test_del_frees_unpinned_pages_now_and_pinned_ones_when_their_lease_ends(pfx, r) -> None:
    holder = redis.Redis(*pfx.address, protocol=2)
    store(r, "gone", 1, 2, 3, 4, 5, 6, 7, 8)
    store(r, "gone", 1, 2, 3, 4, 9, 9, 9, 9)  # a second branch, unpinned
    free_before = r.execute_command("PFXINFO")[r.execute_command("PFXINFO").index(b"arena") + 1]
    lookup = holder.execute_command("PFXGET", "gone", "TOKENS", 1, 2, 3, 4, 5, 6, 7, 8)
    lease = lookup[3]
    assert lookup[1] == 8 and lease
    assert r.delete("gone") == 1
    # The key is gone at once, for everyone.
    assert r.exists("gone") == 0 and r.keys("*") == [] and r.dbsize() == 0
    assert r.execute_command("PFXGET", "gone", "TOKENS", 1, 2, 3, 4, 5, 6, 7, 8, "NOLEASE")[1] == 0
    # A namespace of the same name starts empty and never sees the old pages.
    store(r, "gone", 1, 2, 3, 4)
    assert r.execute_command("PFXGET", "gone", "TOKENS", 1, 2, 3, 4, 5, 6, 7, 8, "NOLEASE")[1] == 4
    assert r.execute_command("PFXCHECK") == b"OK"
    info = dict(zip(*[iter(r.execute_command("PFXINFO"))] * 2))
    assert info[b"stats"][info[b"stats"].index(b"pinned_pages") + 1] == 2
    # The lease holder's pins end: its pages are freed, the new namespace keeps its page.
    assert holder.execute_command("PFXRELEASE", lease) == 1
    info = dict(zip(*[iter(r.execute_command("PFXINFO"))] * 2))
    stats = dict(zip(*[iter(info[b"stats"])] * 2))
    assert stats[b"pinned_pages"] == 0 and stats[b"pages"] == 1
    assert r.execute_command("PFXCHECK") == b"OK"
    assert free_before  # the arena section was there to read
    holder.close()


def test_unlink_and_del_count_like_redis(r) -> None:
    for name in ("a", "b", "c"):
        store(r, name, 1, 2, 3, 4)
    assert r.delete("a", "a", "nope") == 1
    assert r.unlink("b", "c") == 2
    assert r.dbsize() == 0


def test_a_namespace_expires_as_a_whole(pfx, r) -> None:
    store(r, "session:1", 1, 2, 3, 4, 5, 6, 7, 8)
    store(r, "session:2", 1, 2, 3, 4)
    assert r.pexpire("session:1", 200)
    assert 0 < r.pttl("session:1") <= 200
    assert r.ttl("session:2") == -1
    # Lazy: the first command after the deadline finds nothing.
    time.sleep(0.25)
    assert r.execute_command("PFXGET", "session:1", "TOKENS", 1, 2, 3, 4, "NOLEASE")[1] == 0
    assert r.exists("session:1") == 0
    # Active: nobody touches it, the daemon's cron deletes it.
    assert r.pexpire("session:2", 100)
    wait_for(lambda: r.dbsize() == 0, 5.0, "session:2 to expire")
    info = r.info("stats")
    assert info["expired_keys"] >= 2
    assert r.execute_command("PFXCHECK") == b"OK"


def test_expire_in_the_past_deletes_now_and_writes_keep_the_ttl(r) -> None:
    store(r, "x", 1, 2, 3, 4)
    assert r.expire("x", -1) is True
    assert r.exists("x") == 0
    store(r, "y", 1, 2, 3, 4)
    r.expire("y", 100)
    store(r, "y", 1, 2, 3, 4, 5, 6, 7, 8)  # a PFXSET extends the namespace: the TTL stays
    assert 0 < r.ttl("y") <= 100
    assert r.expireat("y", int(time.time()) + 1000)
    assert abs(r.execute_command("EXPIRETIME", "y") - (int(time.time()) + 1000)) <= 1


def test_rename_is_refused_with_a_reason(r) -> None:
    store(r, "a", 1, 2, 3, 4)
    with pytest.raises(redis.ResponseError, match="cannot be renamed"):
        r.rename("a", "b")
    assert r.keys("*") == [b"a"]


def test_info_keyspace_counts_namespaces_and_expiring_ones(r) -> None:
    store(r, "a", 1, 2, 3, 4)
    store(r, "b", 1, 2, 3, 4)
    r.expire("b", 1000)
    db0 = r.info("keyspace")["db0"]
    assert (db0["keys"], db0["expires"]) == (2, 1)
    assert 990_000 < db0["avg_ttl"] <= 1_000_000


def test_redis_cli_scan_bigkeys_memkeys_hotkeys(pfx, r) -> None:
    for i in range(5):
        store(r, f"tenant:{i}", *range(1, 4 * (i + 1) + 1))
    cli = ["redis-cli", "-h", pfx.host, "-p", str(pfx.port)]
    scanned = subprocess.run([*cli, "--scan", "--pattern", "tenant:*"], capture_output=True, text=True, timeout=30)
    assert sorted(scanned.stdout.split()) == [f"tenant:{i}" for i in range(5)]
    big = subprocess.run([*cli, "--bigkeys"], capture_output=True, text=True, timeout=30)
    assert big.returncode == 0 and "5 pfx-caches" in big.stdout, big.stdout + big.stderr
    mem = subprocess.run([*cli, "--memkeys"], capture_output=True, text=True, timeout=30)
    assert mem.returncode == 0 and "Biggest pfx-cache found '\"tenant:4\"'" in mem.stdout, mem.stdout
    hot = subprocess.run([*cli, "--hotkeys"], capture_output=True, text=True, timeout=30)
    assert hot.returncode == 0 and "hot key found with counter" in hot.stdout, hot.stdout + hot.stderr


def test_redis_py_scan_iter_sync_and_asyncio(pfx, r) -> None:
    import asyncio

    import redis.asyncio as aioredis

    for i in range(30):
        store(r, f"s:{i}", i, 0, 0, 0)
    assert sorted(r.scan_iter(match="s:*", count=4)) == sorted(f"s:{i}".encode() for i in range(30))

    async def main():
        client = aioredis.Redis(host=pfx.host, port=pfx.port, protocol=3)
        try:
            return sorted([name async for name in client.scan_iter(count=3)])
        finally:
            await client.aclose()

    assert asyncio.run(main()) == sorted(f"s:{i}".encode() for i in range(30))


def test_tenant_acl_key_patterns_apply(pfx, r) -> None:
    r.execute_command("ACL", "SETUSER", "tenant", "on", ">pw", "~t:*", "+@keyspace", "+@pfx")
    try:
        store(r, "t:1", 1, 2, 3, 4)
        store(r, "other", 1, 2, 3, 4)
        tenant = redis.Redis(*pfx.address, username="tenant", password="pw", protocol=2)
        assert tenant.delete("t:1") == 1
        with pytest.raises(redis.exceptions.NoPermissionError):
            tenant.delete("other")
        assert r.exists("other") == 1
        tenant.close()
    finally:
        r.execute_command("ACL", "DELUSER", "tenant")
