"""One compatibility target, exactly: redis-server 7.0.15, compared side by side.

The help texts, CLIENT's subcommands and CLIENT LIST's fields are 7.0.15's (not
7.2's); Redis's maxmemory-policy names are accepted; CONFIG RESETSTAT resets
what Redis resets; a stock Debian redis.conf starts the daemon; CONFIG SET bind
adds and drops addresses without rebinding those that stay; CONFIG GET port
tells the port bound for ``port 0``; an error that quotes the client's bytes
echoes them as sent, never as U+FFFD.
"""

from __future__ import annotations

import os
import socket

import pytest
import redis

from pfxcache.testing import encode_command, start_daemon
from support import RawClient

DEBIAN_CONF = "/etc/redis/redis.conf"


@pytest.fixture(scope="module")
def pfx():
    daemon = start_daemon("--page-size", "4", "--block-bytes", "8", "--maxmemory", "1024")
    yield daemon
    daemon.stop()


@pytest.fixture
def r(pfx):
    client = redis.Redis(*pfx.address, protocol=2)
    yield client
    client.close()


@pytest.fixture
def ref(redis_server):
    client = redis.Redis(port=redis_server.port, protocol=2)
    yield client
    client.close()


def reply(client, *args):
    try:
        return client.execute_command(*args)
    except redis.ResponseError as exc:
        return ("error", str(exc))


def is_subsequence(ours: list, theirs: list) -> bool:
    it = iter(theirs)
    return all(line in it for line in ours)


NOT_UTF8 = b"\xff\xfe\xc3("  # invalid as UTF-8 in three ways: bytes never used, a bad continuation


@pytest.mark.parametrize("payload", [
    encode_command(b"fo" + NOT_UTF8, b"a" + NOT_UTF8, b"b"),  # unknown command and its args
    encode_command(b"CLIENT", b"bo" + NOT_UTF8),  # unknown subcommands
    encode_command(b"CONFIG", NOT_UTF8, b"x"),
    encode_command(b"PUBSUB", NOT_UTF8, b"x"),
    encode_command(b"HELLO", b"3", NOT_UTF8),
    encode_command(b"CLIENT", b"LIST", b"TYPE", NOT_UTF8),
    encode_command(b"CLIENT", b"KILL", b"TYPE", NOT_UTF8),
    encode_command(b"ACL", b"SETUSER", b"someone", b"+nope" + NOT_UTF8),  # a name looked up in the table
    encode_command(NOT_UTF8 * 50, NOT_UTF8 * 50),  # cut at 128 bytes, mid-character
    b"fo" + NOT_UTF8 + b" a" + NOT_UTF8 + b"\r\n",  # inline commands
    b"client bo" + NOT_UTF8 + b"\r\n",
    b"config " + NOT_UTF8 + b" x\r\n",
], ids=lambda payload: repr(payload[:24]))
def test_errors_quote_the_clients_bytes_as_redis_server_does(pfx, redis_server, payload: bytes) -> None:
    replies = []
    for address in (pfx.address, redis_server.address):
        with RawClient(address) as conn:
            conn.send(payload)
            replies.append(conn.read_raw())
    ours, theirs = replies
    assert theirs.startswith(b"-ERR ") and b"\xff" in theirs  # the case quotes raw bytes at all
    assert ours == theirs


@pytest.mark.parametrize("command", ["CLIENT", "CONFIG", "ACL", "OBJECT"])
def test_help_texts_are_7_0_15s_lines_for_what_we_have(r, ref, command) -> None:
    ours, theirs = r.execute_command(command, "HELP"), ref.execute_command(command, "HELP")
    assert ours[0] == theirs[0] and ours[-2:] == theirs[-2:] == [b"HELP", b"    Prints this help."]
    assert is_subsequence(ours, theirs), (command, ours)


@pytest.mark.parametrize("args", [
    ("CLIENT", "SETINFO", "LIB-NAME", "x"), ("CLIENT", "NO-TOUCH", "ON"), ("CLIENT", "NOPE"),
    ("ACL", "NOPE"), ("OBJECT", "NOPE"),
])
def test_7_2_subcommands_are_unknown_as_in_7_0_15(r, ref, args) -> None:
    assert reply(r, *args) == reply(ref, *args)


def test_client_list_has_7_0_15s_fields_in_its_order(r, ref) -> None:
    def fields(client):
        return [item.split("=", 1)[0] for item in client.execute_command("CLIENT", "INFO").decode().split()]

    assert fields(r) == fields(ref)


def test_redis_policy_names_are_accepted_with_a_documented_mapping(r, ref) -> None:
    mapping = {"allkeys-lru": "lru", "volatile-lru": "lru", "allkeys-lfu": "lfu", "volatile-lfu": "lfu",
               "allkeys-random": "lru", "volatile-random": "lru", "volatile-ttl": "lru", "noeviction": "noeviction"}
    try:
        for name, ours in mapping.items():
            assert reply(r, "CONFIG", "SET", "maxmemory-policy", name) == reply(ref, "CONFIG", "SET",
                                                                                  "maxmemory-policy", name) == b"OK"
            assert r.config_get("maxmemory-policy") == {"maxmemory-policy": ours}
    finally:
        r.config_set("maxmemory-policy", "hybrid")


def test_noeviction_refuses_writes_when_full_and_evicts_nothing(r) -> None:
    r.flushall()
    r.config_set("maxmemory-policy", "noeviction")
    try:
        blocks = 1024 // 8
        for i in range(blocks):
            r.execute_command("PFXSET", f"n:{i}", "TOKENS", i, 1, 1, 1, "DATA", b"x" * 8)
        with pytest.raises(redis.ResponseError, match="noeviction"):
            r.execute_command("PFXSET", "one-more", "TOKENS", 9, 9, 9, 9, "DATA", b"y" * 8)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            r.execute_command("PFXALLOC", "one-more", 1)
        assert r.dbsize() == blocks and r.info("stats")["evicted_keys"] == 0
        assert r.execute_command("PFXEVICT", "n:0", "ALL")[1] == 1  # explicit eviction still works
        r.config_set("maxmemory-policy", "lru")
        assert r.execute_command("PFXSET", "one-more", "TOKENS", 9, 9, 9, 9, "DATA", b"y" * 8)[1] == 1
        r.execute_command("PFXSET", "two-more", "TOKENS", 8, 8, 8, 8, "DATA", b"y" * 8)  # evicts by LRU
        assert r.execute_command("PFXCHECK") == b"OK"
    finally:
        r.config_set("maxmemory-policy", "hybrid")
        r.flushall()


def test_config_resetstat_resets_what_redis_resets(r, ref) -> None:
    r.execute_command("PFXSET", "a", "TOKENS", 1, 2, 3, 4, "DATA", b"x" * 8)
    r.execute_command("PFXGET", "a", "TOKENS", 1, 2, 3, 4, 5, "NOLEASE")
    r.execute_command("PFXEVICT", "a", "ALL")
    ref.set("a", 1)
    ref.get("a")
    ref.get("nope")
    fields = ("keyspace_hits", "keyspace_misses", "evicted_keys", "expired_keys", "total_error_replies")
    assert r.info("stats")["keyspace_hits"] > 0
    for client in (r, ref):
        client.config_resetstat()
    ours, theirs = r.info("stats"), ref.info("stats")
    assert {f: ours[f] for f in fields} == {f: theirs[f] for f in fields} == dict.fromkeys(fields, 0)
    assert r.info("pfxcache")["pfxcache_hits_tokens"] > 0  # our own counters stay cumulative
    ref.delete("a")  # the reference is shared by the session's tests


def test_lfu_directives_as_redis(r, ref) -> None:
    for name, value in (("lfu-log-factor", "3"), ("lfu-decay-time", "0")):
        original = ref.config_get(name)[name]
        assert r.config_get(name) == ref.config_get(name)
        assert reply(r, "CONFIG", "SET", name, value) == reply(ref, "CONFIG", "SET", name, value)
        assert reply(r, "CONFIG", "SET", name, "-1") == reply(ref, "CONFIG", "SET", name, "-1")
        assert r.config_get(name) == ref.config_get(name)
        r.config_set(name, original)
        ref.config_set(name, original)


def test_config_get_star_covers_every_name_redis_shows(r, ref) -> None:
    assert set(ref.config_get("*")) <= set(r.config_get("*"))


@pytest.mark.skipif(not os.path.exists(DEBIAN_CONF), reason="Debian's redis.conf is not installed")
def test_a_stock_debian_redis_conf_starts_the_daemon_with_one_warning(tmp_path) -> None:
    daemon = start_daemon(DEBIAN_CONF, "--port", "0", "--logfile", "", "--pidfile", str(tmp_path / "pid"),
                          "--dir", str(tmp_path), "--maxmemory", "1mb", "--block-bytes", "1024")
    try:
        client = redis.Redis(*daemon.address)
        assert client.ping()
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert client.config_get("tcp-keepalive") == {"tcp-keepalive": "300"}
        client.close()
        warnings = [line for line in daemon.log if "have no effect" in line]
        assert len(warnings) == 1
        assert "daemonize yes" in warnings[0] and "databases 16" in warnings[0] and "appendfsync" in warnings[0]
        assert "FATAL" not in daemon.log_text()
    finally:
        daemon.stop()


def _can_bind_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _can_bind_ipv6(), reason="no IPv6 loopback here")
def test_config_set_bind_adds_an_address_and_keeps_the_open_ones(redis_server) -> None:
    daemon = start_daemon()
    try:
        client = redis.Redis(*daemon.address)
        ref = redis.Redis(port=redis_server.port)
        original = ref.config_get("bind")["bind"]
        try:
            assert reply(client, "CONFIG", "SET", "bind", "127.0.0.1 ::1") == reply(
                ref, "CONFIG", "SET", "bind", "127.0.0.1 ::1") == b"OK"
        finally:
            ref.config_set("bind", original)
            ref.close()
        assert client.ping()  # the connection over the kept listener lives on
        assert redis.Redis("::1", daemon.port).ping()
        assert redis.Redis("127.0.0.1", daemon.port).ping()
        assert client.config_set("bind", "::1")
        assert redis.Redis("::1", daemon.port).ping()
        with pytest.raises(redis.ConnectionError):
            redis.Redis("127.0.0.1", daemon.port, socket_connect_timeout=2).ping()
        client.close()
    finally:
        daemon.stop()


def test_config_get_port_tells_the_port_bound_for_port_0() -> None:
    daemon = start_daemon("--port", "0")
    try:
        client = redis.Redis(*daemon.address)
        assert client.config_get("port") == {"port": str(daemon.port)}
        assert client.info("server")["tcp_port"] == daemon.port
        client.close()
    finally:
        daemon.stop()


def test_config_set_bind_to_a_name_that_is_no_host_fails_as_redis_does(redis_server) -> None:
    """A bind address that is not ASCII is refused with redis-server's error; the daemon keeps its listeners."""
    daemon = start_daemon()
    try:
        client = redis.Redis(*daemon.address)
        ref = redis.Redis(port=redis_server.port)
        try:
            ours, theirs = (reply(c, "CONFIG", "SET", "bind", b"a\xff") for c in (client, ref))
        finally:
            ref.close()
        assert ours == theirs
        assert ours == ("error", "CONFIG SET failed (possibly related to argument 'bind') - "
                                 "Failed to bind to specified addresses.")
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert client.ping()
    finally:
        daemon.stop()
