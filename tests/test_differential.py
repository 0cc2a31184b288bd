"""The same bytes to pfxcached and to a real redis-server 7; replies compared byte for byte.

Each case is raw request bytes on a fresh connection. Unless the case closes
the connection itself, ``QUIT`` is appended so both servers close and the
whole reply stream is known; the comparison covers the bytes and whether the
server closed before the QUIT was answered.
"""

from __future__ import annotations

import re

import pytest

from pfxcache.testing import start_daemon, start_redis_server
from support import exchange

QUIT = b"*1\r\n$4\r\nQUIT\r\n"


def talk(address, payload: bytes, *, append_quit: bool = True) -> tuple[bytes, bool]:
    """Return (reply bytes, closed early). With QUIT appended, its +OK is stripped."""
    reply, closed = exchange(address, payload + (QUIT if append_quit else b""), settle=0.5)
    if append_quit and closed and reply.endswith(b"+OK\r\n"):
        return reply[: -len(b"+OK\r\n")], False
    return reply, closed


def mask(reply: bytes) -> bytes:
    """Blank out what legitimately differs between two servers: client ids."""
    return re.sub(rb"(\$2\r\nid\r\n):\d+", rb"\1:ID", reply)


PROTOCOL_CASES = {
    "empty lines and blanks": (b"\r\n   \r\n\r\nPING\r\n", True),
    "negative multibulk": (b"*-10\r\n*1\r\n$4\r\nPING\r\n", True),
    "zero multibulk": (b"*0\r\n*1\r\n$4\r\nPING\r\n", True),
    "huge multibulk": (b"*3000000000\r\n", True),
    "non-numeric multibulk": (b"*abc\r\n", True),
    "expected dollar": (b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n", True),
    "negative bulk": (b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$-10\r\n", True),
    "non-numeric bulk": (b"*1\r\n$blabla\r\n", True),
    "bulk over proto-max-bulk-len": (b"*1\r\n$600000000\r\n", True),
    "bare word in multibulk": (b"*1\r\nfoo\r\n", True),
    "ping with too many args": (b"PING x y z\r\n", True),
    "unbalanced quotes": (b'set """test-key""" test-value\r\nping\r\n', False),
    "too big inline": (b"\x00" + b"a" * 70000, False),
    "too big mbulk count": (b"*\x00" + b"1" * 70000, False),
    "too big bulk count": (b"*1\r\n$" + b"1" * 70000, False),
    "unknown command": (b"FOO a b\r\n", True),
    "unknown command multibulk": (b"*3\r\n$3\r\nfoo\r\n$1\r\na\r\n$1\r\nb\r\n", True),
    "unknown command long args": (b"FOO " + b"x" * 200 + b" " + b"y" * 50 + b"\r\n", True),
    "inline quoting": (b'ECHO "a\\x41\\nb"\r\nECHO \'it\'\'s\'\r\n', True),
    "inline lf only": (b"PING\nECHO hi\n", True),
    "pipeline": (b"PING\r\n*2\r\n$4\r\nECHO\r\n$3\r\nabc\r\n*1\r\n$4\r\nPING\r\n", True),
    "binary bulk": (b"*2\r\n$4\r\nECHO\r\n$4\r\n\r\n\x00\xff\r\n", True),
    "quit": (b"QUIT\r\nPING\r\n", False),
}

COMMAND_CASES = {
    "ping": b"PING\r\nPING hello\r\n",
    "echo arity": b"ECHO\r\nECHO a b\r\n",
    "hello 2": b"HELLO 2\r\n",
    "hello 3": b"HELLO 3\r\n",
    "hello none": b"HELLO\r\n",
    "hello 4": b"HELLO 4\r\n",
    "hello 1": b"HELLO 1\r\n",
    "hello abc": b"HELLO abc\r\n",
    "hello bad option": b"HELLO 3 FOO\r\n",
    "hello auth missing": b"HELLO 3 AUTH default\r\n",
    "hello setname bad": b'HELLO 3 SETNAME "a b"\r\n',
    "hello setname": b"HELLO 3 SETNAME worker-1\r\nCLIENT GETNAME\r\n",
    "resp3 types": b"HELLO 3\r\nCLIENT GETNAME\r\nPING\r\nECHO x\r\n",
    "auth without password": b"AUTH secret\r\n",
    "auth default user": b"AUTH default anything\r\n",
    "auth unknown user": b"AUTH bob secret\r\n",
    "auth too many": b"AUTH a b c\r\n",
    "select": b"SELECT 0\r\nSELECT 1\r\nSELECT abc\r\nSELECT -1\r\nSELECT 99999999999\r\n",
    "select arity": b"SELECT\r\n",
    # string2ll is strict: no '+', '_', leading zeros or "-0" (int() takes "1_0").
    "strict integers": b"SELECT +0\r\nSELECT 00\r\nSELECT -0\r\nSELECT 0_0\r\nHELLO 3_0\r\nCLIENT KILL ID 1_0\r\n",
    "client setname": b'CLIENT SETNAME "a b"\r\nCLIENT SETNAME ok-name\r\nCLIENT GETNAME\r\nCLIENT SETNAME ""\r\nCLIENT GETNAME\r\n',
    "client unknown subcommand": b"CLIENT FOO\r\n",
    "client no subcommand": b"CLIENT\r\n",
    "client no-evict": b"CLIENT NO-EVICT on\r\nCLIENT NO-EVICT off\r\nCLIENT NO-EVICT maybe\r\n",
    "client kill nobody": b"CLIENT KILL 1.2.3.4:5\r\nCLIENT KILL ID 999999\r\nCLIENT KILL ID abc\r\nCLIENT KILL FOO bar\r\n",
    "client list bad type": b"CLIENT LIST TYPE foo\r\nCLIENT LIST TYPE pubsub\r\n",
    "config get shared": b"CONFIG GET save\r\nCONFIG GET appendonly\r\nCONFIG GET timeout\r\nCONFIG GET maxclients\r\nCONFIG GET tcp-keepalive\r\nCONFIG GET proto-max-bulk-len\r\nCONFIG GET client-query-buffer-limit\r\nCONFIG GET protected-mode\r\nCONFIG GET loglevel\r\nCONFIG GET hz\r\nCONFIG GET nosuchthing\r\n",
    "config get resp3": b"HELLO 3\r\nCONFIG GET save\r\nCONFIG GET maxclients\r\n",
    "config set errors": b"CONFIG SET\r\nCONFIG SET timeout\r\nCONFIG SET nosuch 1\r\nCONFIG SET timeout abc\r\nCONFIG SET timeout 1 hz\r\n",
    "config set ok": b"CONFIG SET timeout 0\r\nCONFIG GET timeout\r\n",
    "config unknown": b"CONFIG FOO\r\n",
    "flushall": b"FLUSHALL\r\nFLUSHALL ASYNC\r\nFLUSHALL SYNC\r\nFLUSHALL BAD\r\nFLUSHDB\r\n",
    "dbsize": b"DBSIZE\r\n",
    "shutdown abort": b"SHUTDOWN ABORT\r\nSHUTDOWN BAD\r\nSHUTDOWN SAVE NOSAVE\r\n",
    "reset": b"HELLO 3\r\nCLIENT SETNAME x\r\nRESET\r\nCLIENT GETNAME\r\nPING\r\n",
    "empty and case": b"ping\r\nPiNg\r\n*1\r\n$4\r\npInG\r\n",
}


@pytest.fixture(scope="module")
def pair():
    reference = start_redis_server("--databases", "1")  # pfxcached has db 0 only; first: nothing left behind without it
    ours = start_daemon()
    yield ours, reference
    reference.stop()
    assert ours.stop() == 0, ours.log_text()


@pytest.mark.parametrize("name", sorted(PROTOCOL_CASES))
def test_protocol_matches_redis(pair, name):
    ours, reference = pair
    payload, append_quit = PROTOCOL_CASES[name]
    expected = talk(reference.address, payload, append_quit=append_quit)
    actual = talk(ours.address, payload, append_quit=append_quit)
    assert actual == expected


@pytest.mark.parametrize("name", sorted(COMMAND_CASES))
def test_command_replies_match_redis(pair, name):
    ours, reference = pair
    payload = COMMAND_CASES[name]
    expected = talk(reference.address, payload)
    actual = talk(ours.address, payload)
    assert (mask(actual[0]), actual[1]) == (mask(expected[0]), expected[1])


@pytest.fixture(scope="module")
def password_pair():
    reference = start_redis_server("--requirepass", "s3cret", "--databases", "1")
    ours = start_daemon("--requirepass", "s3cret")
    yield ours, reference
    reference.stop()
    assert ours.stop() == 0, ours.log_text()


AUTH_CASES = {
    "noauth": b"PING\r\nECHO x\r\nCONFIG GET save\r\n",
    "unknown command before auth": b"FOO\r\n",
    "wrong password": b"AUTH nope\r\nAUTH default nope\r\nPING\r\n",
    "right password": b"AUTH s3cret\r\nPING\r\n",
    "user and password": b"AUTH default s3cret\r\nPING\r\n",
    "hello without auth": b"HELLO 3\r\n",
    "hello with auth": b"HELLO 3 AUTH default s3cret\r\nPING\r\n",
    "hello wrong auth": b"HELLO 3 AUTH default nope\r\n",
    "unauthenticated multibulk limit": b"*11\r\n",
    "unauthenticated bulk limit": b"*1\r\n$16385\r\n",
    "authenticated then large": b"AUTH s3cret\r\n*11\r\n" + b"$4\r\nECHO\r\n" + b"$1\r\nx\r\n" * 10,
    "reset forgets auth": b"AUTH s3cret\r\nRESET\r\nPING\r\n",
}


@pytest.mark.parametrize("name", sorted(AUTH_CASES))
def test_auth_matches_redis(password_pair, name):
    ours, reference = password_pair
    payload = AUTH_CASES[name]
    expected = talk(reference.address, payload)
    actual = talk(ours.address, payload)
    assert (mask(actual[0]), actual[1]) == (mask(expected[0]), expected[1])


def test_protected_mode_denies_non_loopback_peer_like_redis(fresh_daemon):
    """No password + a peer that is not 127.0.0.1/::1 -> Redis's DENIED text, closed."""
    ours = fresh_daemon()
    reference = start_redis_server()
    try:
        expected = exchange(reference.address, b"PING\r\n", source="127.0.0.2")
        actual = exchange(ours.address, b"PING\r\n", source="127.0.0.2")
    finally:
        reference.stop()
    assert expected[0].startswith(b"-DENIED Redis is running in protected mode")
    assert actual == expected
    # The loopback peer itself is welcome.
    assert exchange(ours.address, b"PING\r\n")[0] == b"+PONG\r\n"


def test_protected_mode_off_or_password_admits_other_peers(fresh_daemon):
    open_daemon = fresh_daemon("--protected-mode", "no")
    assert exchange(open_daemon.address, b"PING\r\n", source="127.0.0.2")[0] == b"+PONG\r\n"
    locked = fresh_daemon("--requirepass", "pw")
    assert exchange(locked.address, b"PING\r\n", source="127.0.0.2")[0] == b"-NOAUTH Authentication required.\r\n"
