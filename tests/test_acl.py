"""ACL users: tenants confined to their namespaces, AUTH, ACL subcommands, and
the error texts and ACL LIST format compared with a real redis-server 7.0."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import redis

from pfxcache.testing import start_daemon, start_redis_server
from support import RawClient

PS, BB = 4, 1024
SMALL = ("--page-size", str(PS), "--block-bytes", str(BB), "--evict-low-watermark", "0")
NOPERM_KEY = "this user has no permissions to access one of the keys used as arguments"


def packed(tokens) -> bytes:
    return np.asarray(list(tokens), dtype="<u4").tobytes()


def as_map(reply) -> dict:
    if isinstance(reply, dict):
        return {(k.decode() if isinstance(k, bytes) else k): v for k, v in reply.items()}
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


@pytest.fixture(scope="module")
def tenants(tmp_path_factory):
    """A daemon whose ACL file defines two tenants; the default user stays open."""
    aclfile = tmp_path_factory.mktemp("acl") / "users.acl"
    aclfile.write_text(
        "# tenants\n"
        "user tenant-a on >pa ~tenant-a:* +@pfx -@admin\n"
        "\n"
        "user tenant-b on >pb ~tenant-b:* +@pfx -@admin\n"
    )
    daemon = start_daemon(*SMALL, "--aclfile", str(aclfile))
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def connect(daemon, username=None, password=None, protocol=3) -> redis.Redis:
    return redis.Redis(host=daemon.host, port=daemon.port, protocol=protocol, username=username,
                       password=password, socket_timeout=30)


def test_tenant_cannot_touch_another_tenants_namespaces(tenants) -> None:
    a = connect(tenants, "tenant-a", "pa")
    b = connect(tenants, "tenant-b", "pb")
    with pytest.raises(redis.exceptions.NoPermissionError, match="'acl\\|whoami' command"):
        a.execute_command("ACL", "WHOAMI")  # not in +@pfx
    tokens = list(range(100, 108))
    stored = as_map(b.execute_command("PFXSET", "tenant-b:m", "PACKED", packed(tokens), "DATA", b"x" * 2 * BB))
    assert stored["stored"] == 2
    hit = as_map(b.execute_command("PFXGET", "tenant-b:m", "PACKED", packed(tokens)))
    assert hit["matched"] == 8 and hit["lease"] > 0
    alloc = as_map(b.execute_command("PFXALLOC", "tenant-b:m", 1))

    # Read, probe (matched length), info, evict, alloc, store: all NOPERM on tenant-b's keys.
    for args in (
        ("PFXGET", "tenant-b:m", "PACKED", packed(tokens)),
        ("PFXGET", "tenant-b:m", "TOKENS", *tokens, "NOLEASE"),
        ("PFXINFO", "tenant-b:m"),
        ("PFXEVICT", "tenant-b:m", "ALL"),
        ("PFXALLOC", "tenant-b:m", 1),
        ("PFXSET", "tenant-b:m", "TOKENS", *tokens, "DATA", b"y" * 2 * BB),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError, match=NOPERM_KEY):
            a.execute_command(*args)

    # Leases belong to the connection that took them: tenant-a cannot release or commit them.
    assert a.execute_command("PFXRELEASE", hit["lease"], alloc["lease"]) == 0
    with pytest.raises(redis.ResponseError):
        a.execute_command("PFXSET", "tenant-a:m", "TOKENS", 1, 2, 3, 4, "BLOCKS", *alloc["blocks"])
    # ... nor can the default user on another connection.
    admin = connect(tenants)
    assert admin.execute_command("PFXRELEASE", hit["lease"]) == 0
    with pytest.raises(redis.ResponseError):
        admin.execute_command("PFXSET", "tenant-b:m2", "TOKENS", 1, 2, 3, 4, "BLOCKS", *alloc["blocks"])
    # Tenant-b's data is intact and its leases are still its own.
    assert as_map(b.execute_command("PFXGET", "tenant-b:m", "PACKED", packed(tokens), "NOLEASE"))["matched"] == 8
    assert b.execute_command("PFXRELEASE", hit["lease"], alloc["lease"]) == 2

    # Its own namespaces work.
    own = as_map(a.execute_command("PFXSET", "tenant-a:m", "PACKED", packed(tokens), "DATA", b"z" * 2 * BB))
    assert own["stored"] == 2
    assert as_map(a.execute_command("PFXGET", "tenant-a:m", "PACKED", packed(tokens), "NOLEASE"))["matched"] == 8
    assert as_map(a.execute_command("PFXEVICT", "tenant-a:m", "ALL"))["evicted"] == 2
    # -@admin and no +@server commands: CONFIG is refused.
    with pytest.raises(redis.exceptions.NoPermissionError, match="'config\\|get' command"):
        a.execute_command("CONFIG", "GET", "port")
    with pytest.raises(redis.exceptions.NoPermissionError, match="'acl\\|setuser' command"):
        a.execute_command("ACL", "SETUSER", "tenant-a", "allkeys")
    # The default user (no requirepass) still runs everything.
    assert admin.execute_command("CONFIG", "GET", "port")
    for client in (a, b, admin):
        client.close()


def test_auth_errors_and_disabled_users(tenants) -> None:
    admin = connect(tenants)
    with pytest.raises(redis.exceptions.AuthenticationError):
        connect(tenants, "tenant-a", "wrong").ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        connect(tenants, "nobody", "x").ping()
    assert admin.execute_command("ACL", "SETUSER", "frozen", "off", ">pw", "+@all", "allkeys")
    with pytest.raises(redis.exceptions.AuthenticationError):
        connect(tenants, "frozen", "pw").ping()
    admin.execute_command("ACL", "SETUSER", "frozen", "on")
    frozen = connect(tenants, "frozen", "pw")
    assert frozen.ping()
    # HELLO 3 AUTH user pass, over a raw connection.
    with RawClient(tenants.address) as raw:
        assert raw.call_raw("HELLO", "3", "AUTH", "tenant-a", "bad").startswith(b"-WRONGPASS")
        assert raw.call_raw("HELLO", "3", "AUTH", "tenant-a", "pa").startswith(b"%")
        assert raw.call_raw("PFXINFO", "tenant-b:z") == b"-NOPERM " + NOPERM_KEY.encode() + b"\r\n"
        assert raw.call_raw("AUTH", "frozen", "pw") == b"+OK\r\n"
        assert raw.call_raw("ACL", "WHOAMI") == b"$6\r\nfrozen\r\n"
    assert admin.execute_command("ACL", "DELUSER", "frozen", "nosuch") == 1
    with pytest.raises(redis.exceptions.ConnectionError):
        frozen.ping()  # a deleted user's connections are closed
    admin.close()


def test_acl_subcommands(tenants) -> None:
    admin = connect(tenants, protocol=2)
    digest = hashlib.sha256(b"pa").hexdigest()
    assert admin.execute_command("ACL", "USERS") == [b"default", b"tenant-a", b"tenant-b"]
    # "-@admin" removes nothing from "+@pfx" since PFXCHECK left @pfx (issue 17): ACL LIST omits
    # the rule, as redis-server omits "-@admin" after "+@read".
    assert admin.execute_command("ACL", "LIST") == [
        b"user default on nopass ~* &* +@all",
        f"user tenant-a on #{digest} ~tenant-a:* resetchannels -@all +@pfx".encode(),
        f"user tenant-b on #{hashlib.sha256(b'pb').hexdigest()} ~tenant-b:* resetchannels -@all +@pfx".encode(),
    ]
    assert admin.execute_command("ACL", "SETUSER", "tmp", "on", "nopass", "~x:*", "~y:*", "+ping", "+pfxget")
    assert admin.execute_command("ACL", "GETUSER", "tmp") == [
        b"flags", [b"on", b"nopass"], b"passwords", [], b"commands", b"-@all +ping +pfxget",
        b"keys", b"~x:* ~y:*", b"channels", b"", b"selectors", [],
    ]
    assert admin.execute_command("ACL", "GETUSER", "nosuch") is None
    assert admin.execute_command("ACL", "WHOAMI") == b"default"
    assert b"pfx" in admin.execute_command("ACL", "CAT")
    assert set(admin.execute_command("ACL", "CAT", "pfx")) >= {b"pfxget", b"pfxset", b"pfxrelease"}
    for args, message in (
        (("ACL", "SETUSER", "tmp", "+nosuch"), r"Error in ACL SETUSER modifier '\+nosuch': Unknown command"),
        (("ACL", "SETUSER", "tmp", "bogus"), "modifier 'bogus': Syntax error"),
        (("ACL", "SETUSER", "tmp", "<nothere>"), "password you are trying to remove"),
        (("ACL", "DELUSER", "default"), "The 'default' user cannot be removed"),
        (("ACL", "CAT", "nosuch"), "Unknown category 'nosuch'"),
    ):
        with pytest.raises(redis.ResponseError, match=message):
            admin.execute_command(*args)
    assert admin.execute_command("ACL", "DELUSER", "tmp") == 1
    assert admin.execute_command("ACL", "DELUSER", "tmp") == 0
    admin.close()


def test_default_user_follows_requirepass() -> None:
    daemon = start_daemon("--requirepass", "s3cret")
    try:
        r = connect(daemon, protocol=2)
        with pytest.raises(redis.exceptions.AuthenticationError):
            r.ping()
        r = connect(daemon, "default", "s3cret", protocol=2)
        assert r.ping()
        digest = hashlib.sha256(b"s3cret").hexdigest()
        assert r.execute_command("ACL", "LIST") == [f"user default on #{digest} ~* &* +@all".encode()]
        r.config_set("requirepass", "")
        assert connect(daemon, protocol=2).ping()
        assert r.execute_command("ACL", "LIST") == [b"user default on nopass ~* &* +@all"]
        r.close()
    finally:
        assert daemon.stop() == 0


# -- differential: the same requests to redis-server 7.0 and pfxcached ------------------------------

SETUP = [
    ("ACL", "SETUSER", "alice", "on", ">secret", "~t:*", "+ping"),  # one rule: 7.0 orders several by command id
    ("ACL", "SETUSER", "carol", "off", ">pw", "+@all", "allkeys"),
]
SCRIPT = [
    ("AUTH", "alice", "wrong"),
    ("AUTH", "nobody", "x"),
    ("AUTH", "carol", "pw"),
    ("HELLO", "2", "AUTH", "alice", "nope"),
    ("AUTH", "alice", "secret"),
    ("ACL", "WHOAMI"),
    ("PING",),
    ("CONFIG", "SET", "hz", "10"),
    ("ACL", "LIST"),
    ("ACL", "SETUSER", "x", "+bogus"),
]


def _run(address, commands) -> list[bytes]:
    with RawClient(address) as raw:
        return [raw.call_raw(*args) for args in commands]


def test_error_texts_and_formats_match_redis() -> None:
    theirs = start_redis_server()  # first: without redis-server no daemon is left behind
    ours = start_daemon()
    try:
        for side in (ours, theirs):
            _run(side.address, SETUP)
        want = _run(theirs.address, SCRIPT)
        got = _run(ours.address, SCRIPT)
        assert got == want
        listed = _run(theirs.address, [("ACL", "LIST"), ("ACL", "GETUSER", "alice")])
        assert _run(ours.address, [("ACL", "LIST"), ("ACL", "GETUSER", "alice")]) == listed
        # The key error: redis-server's GET and our PFXGET on a key outside ~t:*.
        for side in (ours, theirs):
            _run(side.address, [("ACL", "SETUSER", "alice", "+pfxget" if side is ours else "+get")])
        redis_key_error = _run(theirs.address, [("AUTH", "alice", "secret"), ("GET", "u:1")])[1]
        our_key_error = _run(ours.address, [("AUTH", "alice", "secret"), ("PFXGET", "u:1", "TOKENS", "1")])[1]
        assert our_key_error == redis_key_error == b"-NOPERM " + NOPERM_KEY.encode() + b"\r\n"
    finally:
        ours.stop()
        theirs.stop()


def test_users_in_the_config_file_survive_config_rewrite(tmp_path):
    import redis

    from pfxcache.testing import start_daemon

    conf = tmp_path / "pfx.conf"
    conf.write_text("port 0\n# tenants\nuser alice on >secret ~tenant-a:* +@pfx +ping\n")
    daemon = start_daemon(str(conf))
    try:
        alice = redis.Redis(host=daemon.host, port=daemon.port, username="alice", password="secret")
        assert alice.ping()
        assert alice.execute_command("PFXGET", "tenant-a:x", "TOKENS", "1")[b"matched"] == 0
        with pytest.raises(redis.exceptions.NoPermissionError):
            alice.execute_command("PFXGET", "tenant-b:x", "TOKENS", "1")
        alice.close()
        admin = redis.Redis(host=daemon.host, port=daemon.port)
        admin.config_set("timeout", 7)
        assert admin.config_rewrite()
        admin.close()
    finally:
        daemon.stop()
    text = conf.read_text()
    assert "user alice on >secret ~tenant-a:* +@pfx +ping" in text and "timeout 7" in text
    bad = tmp_path / "bad.conf"
    bad.write_text("port 0\nuser bob on +nosuchcommand\n")
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "pfxcache.daemon", str(bad)], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 1 and "bob" in result.stdout + result.stderr
