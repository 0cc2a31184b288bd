"""The PFX* commands' flags tell the truth about what they do.

Flags drive ACL categories (``+@read`` must not grant a command that pins
blocks), redis-cli's hints and cluster clients' routing (a ``readonly`` command
may be sent to a replica). PFXGET creates a lease, so it is a write that is
fast, like Redis's GETEX (a read that also updates the key's TTL), and its key
spec says RW ACCESS UPDATE as GETEX's does. Checked on a real daemon next to a
real redis-server.
"""

from __future__ import annotations

import socket

import hiredis
import pytest
import redis
from redis.client import NEVER_DECODE
from pfxcache.testing import encode_command, start_daemon, start_redis_server

NEVER = {NEVER_DECODE: True}

# command -> (flags that must be there, flags that must not)
EXPECTED = {
    "pfxget": ({"write", "fast"}, {"readonly"}),
    "pfxset": ({"write", "denyoom"}, {"readonly"}),
    "pfxalloc": ({"write", "denyoom"}, {"readonly"}),
    "pfxrelease": ({"write", "fast"}, {"readonly"}),
    "pfxevict": ({"write"}, {"readonly"}),
    "pfxinfo": ({"readonly", "fast"}, {"write"}),
}


def _text(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (list, tuple)):
        return [_text(v) for v in value]
    if isinstance(value, dict):
        return {_text(k): _text(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def daemon():
    instance = start_daemon("--maxmemory", str(64 * 1024), "--page-size", "4", "--block-bytes", "1024")
    yield instance
    assert instance.stop() == 0, instance.log_text()


@pytest.fixture(scope="module")
def ours(daemon):
    client = redis.Redis(host=daemon.host, port=daemon.port, protocol=2)
    yield client
    client.close()


@pytest.fixture(scope="module")
def real_redis():
    server = start_redis_server()
    client = redis.Redis(host="127.0.0.1", port=server.port, protocol=2)
    yield client
    client.close()
    server.stop()


def call(client, *args):
    """One command over a fresh raw socket, its reply parsed by hiredis exactly as sent (no redis-py callbacks)."""
    kwargs = client.connection_pool.connection_kwargs
    reader = hiredis.Reader()
    with socket.create_connection((kwargs["host"], kwargs["port"]), timeout=10) as sock:
        sock.sendall(encode_command(*args))
        reply = False
        while reply is False:
            chunk = sock.recv(65536)
            assert chunk, "connection closed before a whole reply"
            reader.feed(chunk)
            reply = reader.gets()
    return _text(reply)


def key_flags(info: list) -> set[str]:
    """The flags of the first key spec in a COMMAND INFO entry."""
    spec = info[8][0]
    return set(dict(zip(spec[::2], spec[1::2]))["flags"])


def command_info(client, name: str) -> list:
    return call(client, "COMMAND", "INFO", name)[0]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_flags_and_categories(ours, name):
    info = command_info(ours, name)
    flags, categories = set(info[2]), set(info[6])
    must, must_not = EXPECTED[name]
    assert must <= flags and not (must_not & flags), flags
    # The ACL categories follow from the flags as Redis derives them.
    assert ("@write" in categories) == ("write" in flags)
    assert ("@read" in categories) == ("readonly" in flags)
    assert ("@fast" in categories) == ("fast" in flags) and ("@slow" in categories) != ("fast" in flags)
    assert (name in call(ours, "ACL", "CAT", "write")) == ("write" in flags)
    assert (name in call(ours, "ACL", "CAT", "read")) == ("readonly" in flags)


def test_pfxget_is_flagged_as_redis_flags_getex(ours, real_redis):
    """GETEX reads a key and updates its TTL: the closest Redis command to a lookup that leases."""
    pfxget, getex = command_info(ours, "pfxget"), command_info(real_redis, "getex")
    assert set(pfxget[2]) == set(getex[2]) == {"write", "fast"}
    assert key_flags(pfxget) == key_flags(getex) == {"RW", "access", "update"}
    ours_keys = call(ours, "COMMAND", "GETKEYSANDFLAGS", "PFXGET", "ns", "TOKENS", "1")
    theirs = call(real_redis, "COMMAND", "GETKEYSANDFLAGS", "GETEX", "ns")
    assert [(k, set(f)) for k, f in ours_keys] == [(k, set(f)) for k, f in theirs] == [("ns", {"RW", "access", "update"})]


def test_a_read_only_user_cannot_pin_blocks(daemon, ours):
    """+@read grants PFXINFO but not PFXGET (which leases); +@write then grants it."""
    ours.execute_command("ACL", "SETUSER", "reader", "on", ">pw", "~*", "-@all", "+@read")
    reader = redis.Redis(host=daemon.host, port=daemon.port, username="reader", password="pw", protocol=2)
    try:
        assert reader.execute_command("PFXINFO")
        with pytest.raises(redis.exceptions.NoPermissionError, match="pfxget"):
            reader.execute_command("PFXGET", "ns", "TOKENS", "1", "2", "3", "4")
        ours.execute_command("ACL", "SETUSER", "reader", "+@write")
        reply = _text(reader.execute_command("PFXGET", "ns", "TOKENS", "1", "2", "3", "4", **NEVER))
        assert dict(zip(reply[::2], reply[1::2]))["matched"] == 0
    finally:
        reader.close()
        ours.execute_command("ACL", "DELUSER", "reader")
