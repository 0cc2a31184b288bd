"""Seeing what happens, side by side with redis-server 7.0.15: MONITOR, SLOWLOG, LATENCY, MEMORY,
CLIENT PAUSE/UNPAUSE/REPLY, ACL LOG/DRYRUN/SAVE/LOAD, ROLE, DEBUG SLEEP.

Replies are compared byte for byte where they do not carry a clock, a port or
a process's memory; where they do, those fields are masked and the rest is
compared. redis-py (sync and asyncio, RESP2 and RESP3) and redis-cli read them.
"""

from __future__ import annotations

import asyncio
import queue
import re
import select
import socket
import subprocess
import threading
import time

import pytest
import redis
import redis.asyncio

from pfxcache.testing import start_daemon, start_redis_server
from test_transactions import Raw

GEOMETRY = ("--page-size", "4", "--block-bytes", "8", "--maxmemory", "4096")
STORE = ("PFXSET", "ns", "TOKENS", "1", "2", "3", "4", "DATA", "x" * 8)


@pytest.fixture(scope="module")
def aclfiles(tmp_path_factory):
    folder = tmp_path_factory.mktemp("acl")
    ours, theirs = folder / "ours.acl", folder / "theirs.acl"
    for path in (ours, theirs):
        path.write_text("user default on nopass ~* &* +@all\n")
    return ours, theirs


@pytest.fixture(scope="module")
def pfx(aclfiles):
    daemon = start_daemon(*GEOMETRY, "--enable-debug-command", "yes", "--aclfile", str(aclfiles[0]))
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def ref(aclfiles):
    server = start_redis_server("--enable-debug-command", "yes", "--aclfile", str(aclfiles[1]))
    yield server
    server.stop()


def both(pfx, ref, resp: int = 2) -> tuple[Raw, Raw]:
    return Raw(pfx.port, resp), Raw(ref.port, resp)


def same_replies(pfx, ref, commands, resp: int = 2, mask=lambda reply: reply) -> None:
    ours, theirs = both(pfx, ref, resp)
    try:
        for command in commands:
            mine, expected = mask(ours.call(*command)), mask(theirs.call(*command))
            assert mine == expected, (command, mine, expected)
    finally:
        ours.close()
        theirs.close()


def is_subsequence(ours: list, theirs: list) -> bool:
    it = iter(theirs)
    return all(line in it for line in ours)


@pytest.mark.parametrize("command", ["SLOWLOG", "LATENCY", "MEMORY", "DEBUG", "CLIENT", "ACL"])
def test_help_texts_are_7_0_15s_lines_for_what_we_have(pfx, ref, command) -> None:
    ours = redis.Redis(port=pfx.port).execute_command(command, "HELP")
    theirs = redis.Redis(port=ref.port).execute_command(command, "HELP")
    assert ours[0] == theirs[0] and ours[-2:] == theirs[-2:] == [b"HELP", b"    Prints this help."]
    assert is_subsequence(ours, theirs), (command, ours)
    if command in ("SLOWLOG", "MEMORY"):
        assert ours == theirs  # every subcommand is here


ERRORS = [
    ("SLOWLOG", "GET", "x"), ("SLOWLOG", "GET", "-2"), ("SLOWLOG", "GET", "1", "2"), ("SLOWLOG", "LEN", "x"),
    ("SLOWLOG", "NOPE"), ("SLOWLOG",), ("SLOWLOG", "RESET", "x"),
    ("LATENCY", "HISTORY"), ("LATENCY", "HISTORY", "nope"), ("LATENCY", "LATEST", "x"), ("LATENCY", "NOPE"),
    ("LATENCY", "RESET", "nope", "other"),
    ("MEMORY", "NOPE"), ("MEMORY", "PURGE", "x"), ("MEMORY", "DOCTOR", "x"), ("MEMORY", "STATS", "x"),
    ("ROLE",), ("ROLE", "x"),
    ("DEBUG",), ("DEBUG", "NOPE"), ("DEBUG", "SLEEP"), ("DEBUG", "SLEEP", "x"), ("DEBUG", "SLEEP", "0"),
    ("CLIENT", "PAUSE"), ("CLIENT", "PAUSE", "x"), ("CLIENT", "PAUSE", "-1"), ("CLIENT", "PAUSE", "10", "NOPE"),
    ("CLIENT", "PAUSE", "10", "WRITE", "x"), ("CLIENT", "PAUSE", "0"), ("CLIENT", "UNPAUSE"), ("CLIENT", "UNPAUSE", "x"),
    ("CLIENT", "REPLY"), ("CLIENT", "REPLY", "NOPE"), ("CLIENT", "REPLY", "ON", "x"), ("CLIENT", "REPLY", "ON"),
    ("ACL", "LOG", "x"), ("ACL", "LOG", "1", "2"), ("ACL", "LOG", "RESET"), ("ACL", "LOG"), ("ACL", "LOG", "-1"),
    ("ACL", "DRYRUN", "nobody", "ping"), ("ACL", "DRYRUN", "default", "nope"), ("ACL", "DRYRUN", "default", "echo"),
    ("ACL", "DRYRUN", "default", "ping"), ("ACL", "DRYRUN", "default"), ("ACL", "SAVE", "x"), ("ACL", "LOAD", "x"),
    ("MONITOR", "x"), ("MULTI",), ("MONITOR",), ("EXEC",),
]


@pytest.mark.parametrize("resp", [2, 3])
def test_errors_and_fixed_replies_are_redis_servers(pfx, ref, resp) -> None:
    same_replies(pfx, ref, ERRORS, resp)


def test_debug_is_refused_unless_enabled_as_in_redis(redis_server) -> None:
    daemon = start_daemon(*GEOMETRY)
    try:
        same_replies(daemon, redis_server, [("DEBUG", "HELP"), ("DEBUG", "SLEEP", "0"), ("DEBUG", "NOPE")])
    finally:
        daemon.stop()


# -- SLOWLOG, LATENCY ------------------------------------------------------------------------------

def _mask_slowlog(reply: bytes) -> bytes:
    """Entry ids, timestamps, durations and client ports vary: mask them, keep the shape and text."""
    reply = re.sub(rb"\*6\r\n:\d+\r\n:\d+\r\n:\d+\r\n", b"*6\r\n:I\r\n:T\r\n:D\r\n", reply)
    reply = re.sub(rb"\$2\r\nid\r\n:\d+\r\n", b"$2\r\nid\r\n:N\r\n", reply)  # HELLO's client id
    return re.sub(rb"\$\d+\r\n127\.0\.0\.1:\d+\r\n", b"$A\r\n127.0.0.1:P\r\n", reply)


SLOW_SEQUENCE = [
    ("CONFIG", "SET", "slowlog-log-slower-than", "0"), ("SLOWLOG", "RESET"), ("CLIENT", "SETNAME", "ops"),
    ("ECHO", "v" * 200), ("PING", *[str(i) for i in range(40)]), ("AUTH", "secret"),
    ("HELLO", "2", "AUTH", "default", "pw"), ("EXEC",),
    ("CONFIG", "SET", "slowlog-log-slower-than", "-1"), ("SLOWLOG", "GET", "-1"), ("SLOWLOG", "LEN"),
    ("SLOWLOG", "GET", "2"), ("SLOWLOG", "GET", "0"),
    ("CONFIG", "SET", "slowlog-max-len", "2"), ("SLOWLOG", "LEN"), ("SLOWLOG", "RESET"), ("SLOWLOG", "LEN"),
    ("CONFIG", "SET", "slowlog-max-len", "128"), ("CONFIG", "SET", "slowlog-log-slower-than", "10000"),
]


@pytest.mark.parametrize("resp", [2, 3])
def test_slowlog_entries_have_redis_7s_shape(pfx, ref, resp) -> None:
    same_replies(pfx, ref, SLOW_SEQUENCE, resp, mask=_mask_slowlog)


def _mask_numbers(reply: bytes) -> bytes:
    reply = re.sub(rb":\d+\r\n", b":N\r\n", reply)  # unix times, milliseconds
    reply = re.sub(rb"(\d+)ms", b"Nms", reply)
    return re.sub(rb"^\$\d+", b"$L", reply)


def test_latency_events_and_doctor_as_redis_server(pfx, ref) -> None:
    """A DEBUG SLEEP past latency-monitor-threshold is a 'command' event on both servers."""
    same_replies(pfx, ref, [
        ("LATENCY", "RESET"), ("LATENCY", "DOCTOR"), ("CONFIG", "SET", "latency-monitor-threshold", "5"),
        ("LATENCY", "DOCTOR"), ("LATENCY", "LATEST"),
        ("DEBUG", "SLEEP", "0.03"), ("LATENCY", "LATEST"), ("LATENCY", "HISTORY", "command"),
        ("LATENCY", "HISTORY", "fast-command"), ("LATENCY", "DOCTOR"),
        ("CONFIG", "SET", "slowlog-log-slower-than", "-1"), ("LATENCY", "DOCTOR"),
        ("CONFIG", "SET", "slowlog-log-slower-than", "10000"),
        ("LATENCY", "RESET", "nope"), ("LATENCY", "RESET", "command", "nope"), ("LATENCY", "LATEST"),
        ("CONFIG", "SET", "latency-monitor-threshold", "0"), ("LATENCY", "DOCTOR"),
    ], mask=_mask_numbers)


def test_latency_records_arena_copies(fresh_daemon) -> None:
    daemon = fresh_daemon("--page-size", "4", "--block-bytes", str(1 << 20), "--maxmemory", str(64 << 20),
                          "--latency-monitor-threshold", "1")
    r = redis.Redis(port=daemon.port)
    tokens = [str(t) for t in range(1, 33)]  # 8 MiB of DATA
    r.execute_command("PFXSET", "big", "TOKENS", *tokens, "DATA", b"k" * (8 << 20))
    r.execute_command("PFXGET", "big", "TOKENS", *tokens, "NOLEASE", "WITHDATA")
    events = {entry[0] for entry in r.execute_command("LATENCY", "LATEST")}
    assert b"arena-copy" in events  # an 8 MiB copy takes more than 1 ms; "command" events depend on the machine
    assert r.execute_command("LATENCY", "HISTORY", "arena-copy")
    r.close()


# -- MONITOR ---------------------------------------------------------------------------------------

MONITORED = [
    ("PING",), ("ECHO", b'a b"\\\n\r\t\x07\x08\x01\xff\x7f'), ("EXISTS", "k"), ("CONFIG", "GET", "port"),
    ("AUTH", "secret"), ("HELLO", "2", "AUTH", "default", "pw"), ("MULTI",), ("ECHO", "in-tx"), ("EXEC",),
    ("ACL", "WHOAMI"), ("NOPE",), ("ECHO", "last"),
]


def _monitor_lines(port: int) -> list[bytes]:
    monitor, client = Raw(port), Raw(port)
    try:
        assert monitor.call("MONITOR") == b"+OK\r\n"
        for command in MONITORED:
            client.call(*command)
        lines = []
        while len(lines) < 9:
            lines.append(monitor.read())
        return lines
    finally:
        monitor.close()
        client.close()


def test_monitor_lines_are_redis_servers(pfx, ref) -> None:
    line = re.compile(rb"^\+\d+\.\d{6} \[0 127\.0\.0\.1:\d+\] ")
    ours, theirs = _monitor_lines(pfx.port), _monitor_lines(ref.port)
    assert all(line.match(item) for item in ours)
    assert [line.sub(b"", item) for item in ours] == [line.sub(b"", item) for item in theirs]
    assert line.sub(b"", ours[1]) == b'"ECHO" "a b\\"\\\\\\n\\r\\t\\a\\b\\x01\\xff\\x7f"\r\n'


#: How long a monitor may take to show a command already answered: past it, the test fails saying what it missed.
MONITOR_WAIT = 5.0


def _lines_of(stream) -> queue.Queue:
    """The lines of a child's output, read by a thread so that the test waits for each one a bounded time."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


def _next_line(lines: queue.Queue, what: str) -> str:
    try:
        return lines.get(timeout=MONITOR_WAIT)
    except queue.Empty:
        pytest.fail(f"redis-cli MONITOR printed no line within {MONITOR_WAIT}s; expected {what}")


def test_monitor_shows_pfx_commands_and_redis_cli_monitor_reads_them(pfx) -> None:
    proc = subprocess.Popen(["redis-cli", "-p", str(pfx.port), "MONITOR"], stdout=subprocess.PIPE, text=True)
    try:
        lines = _lines_of(proc.stdout)
        assert _next_line(lines, "OK") == "OK\n"
        client = Raw(pfx.port)  # a raw connection: no HELLO or CLIENT SETINFO of a client library before it
        port = client.sock.getsockname()[1]
        assert client.call(*STORE).startswith(b"*")  # stored: its pages' reply, not an error
        client.close()
        line = _next_line(lines, "the PFXSET")
        assert re.fullmatch(rf'\d+\.\d{{6}} \[0 127\.0\.0\.1:{port}\] "PFXSET" "ns" "TOKENS" "1" "2" "3" "4" "DATA" '
                            r'"x{8}"\n', line), line
    finally:
        proc.kill()
        proc.wait()


def test_a_monitor_still_runs_commands_and_reset_ends_monitoring(pfx, ref) -> None:
    for port in (pfx.port, ref.port):
        conn, admin = Raw(port), Raw(port)
        assert conn.call("MONITOR") == b"+OK\r\n"
        conn.send("MONITOR")  # again: no reply at all
        assert conn.call("PING") == b"+PONG\r\n"
        assert conn.read().endswith(b'"PING"\r\n')  # its own command, shown to itself
        # a monitor is a replica: no keyspace commands, flag O, not held by CLIENT PAUSE
        assert conn.call("EXISTS", "k") == b"-ERR Replica can't interact with the keyspace\r\n"
        assert conn.call("DBSIZE") == b"-ERR Replica can't interact with the keyspace\r\n"
        admin.call("CLIENT", "PAUSE", "1000", "ALL")  # ends by itself: ALL holds UNPAUSE too
        assert conn.call("ECHO", "x") == b"$1\r\nx\r\n"
        assert conn.read().endswith(b'"ECHO" "x"\r\n')
        flags = conn.call("CLIENT", "INFO").split(b" flags=", 1)[1].split(b" ", 1)[0]
        assert flags == b"O"
        conn.read()
        admin.close()
        assert conn.call("RESET") == b"+RESET\r\n"
        assert conn.call("PING") == b"+PONG\r\n"
        conn.close()


def test_redis_py_monitor(pfx) -> None:
    r = redis.Redis(port=pfx.port, socket_timeout=MONITOR_WAIT)  # the monitor's reads wait that long at most
    other = redis.Redis(port=pfx.port)
    address, port = other.client_info()["addr"].rsplit(":", 1)  # connected (HELLO sent) before the monitor starts
    with r.monitor() as monitor:
        assert other.execute_command("ECHO", "seen") == b"seen"
        try:
            event = monitor.next_command()
        except redis.TimeoutError:
            pytest.fail(f"MONITOR showed nothing within {MONITOR_WAIT}s of an answered ECHO")
        del event["time"]
        assert event == {"db": 0, "client_address": address, "client_port": port, "client_type": "tcp",
                         "command": "ECHO seen"}
    other.close()
    r.close()


# -- CLIENT PAUSE / UNPAUSE / REPLY ------------------------------------------------------------------

def _answered(conn: Raw, wait: float) -> bool:
    """Whether a reply is (or within ``wait`` seconds becomes) readable on ``conn``."""
    return bool(conn.buffer) or bool(select.select([conn.sock], [], [], wait)[0])


@pytest.mark.parametrize("server", ["pfx", "ref"])
def test_client_pause_write_holds_writes_not_reads(pfx, ref, server) -> None:
    port = (pfx if server == "pfx" else ref).port
    write = STORE if server == "pfx" else ("SET", "ns", "1")
    admin, writer, reader = Raw(port), Raw(port), Raw(port)
    try:
        assert admin.call("CLIENT", "PAUSE", "60000", "WRITE") == b"+OK\r\n"
        writer.send(*write)
        assert reader.call("EXISTS", "nope") == b":0\r\n"  # a read is answered during the pause
        assert reader.call("PING") == b"+PONG\r\n"
        assert not _answered(writer, 0.3)  # the write waits (it is not refused)
        assert admin.call("CLIENT", "UNPAUSE") == b"+OK\r\n"
        assert writer.read() != b""
        writer.call("DEL", "ns")
    finally:
        for conn in (admin, writer, reader):
            conn.close()


@pytest.mark.parametrize("server", ["pfx", "ref"])
def test_client_pause_all_holds_everything_until_it_ends(pfx, ref, server) -> None:
    port = (pfx if server == "pfx" else ref).port
    admin, reader = Raw(port), Raw(port)
    try:
        assert admin.call("CLIENT", "PAUSE", "1500", "ALL") == b"+OK\r\n"
        reader.send("PING")
        admin.send("CLIENT", "UNPAUSE")  # held too, as redis-server holds it
        assert not _answered(reader, 0.3) and not _answered(admin, 0)
        assert reader.read() == b"+PONG\r\n"  # once the 1.5 s are over
        assert admin.read() == b"+OK\r\n"
    finally:
        admin.close()
        reader.close()


def test_a_paused_write_inside_exec_waits_and_pfx_state_is_intact(pfx) -> None:
    admin, tx = Raw(pfx.port), Raw(pfx.port)
    try:
        tx.call("MULTI")
        tx.call(*STORE)
        admin.call("CLIENT", "PAUSE", "60000", "WRITE")
        tx.send("EXEC")
        assert not _answered(tx, 0.3)
        admin.call("CLIENT", "UNPAUSE")
        assert tx.read().startswith(b"*1\r\n*6\r\n$6\r\nstored\r\n")
        assert admin.call("PFXCHECK") == b"+OK\r\n"
        admin.call("DEL", "ns")
    finally:
        admin.close()
        tx.close()


def _stream(port: int, commands) -> bytes:
    conn = Raw(port)
    try:
        for command in commands:
            conn.send(*command)
        conn.send("ECHO", "end")
        data = b""
        while not data.endswith(b"$3\r\nend\r\n"):
            data += conn.sock.recv(65536)
        return data
    finally:
        conn.close()


def test_client_reply_off_on_skip_as_redis_server(pfx, ref) -> None:
    commands = [("PING",), ("CLIENT", "REPLY", "OFF"), ("PING", "a"), ("CLIENT", "REPLY", "SKIP"), ("PING", "b"),
                ("CLIENT", "REPLY", "ON"), ("PING", "c"), ("CLIENT", "REPLY", "SKIP"), ("PING", "d"),
                ("PING", "e"), ("CLIENT", "REPLY", "SKIP"), ("CLIENT", "REPLY", "ON"), ("NOPE",)]
    assert _stream(pfx.port, commands) == _stream(ref.port, commands)


# -- ACL LOG, DRYRUN, SAVE, LOAD ---------------------------------------------------------------------

def _mask_acl_log(reply: bytes) -> bytes:
    reply = re.sub(rb"age-seconds\r\n(\$\d+\r\n[0-9.e-]+|,[0-9.e-]+)\r\n", b"age-seconds\r\nA\r\n", reply)
    # client-info is a CLIENT LIST line: its buffer sizes are redis-server's own; keep cmd and user.
    return re.sub(rb"client-info\r\n\$\d+\r\n[^\r]*(cmd=\S+ user=\S+)[^\r]*\r\n", rb"client-info\r\n\1\r\n", reply)


ACL_SEQUENCE = [
    ("ACL", "LOG", "RESET"),
    ("ACL", "SETUSER", "tenant", "on", ">pw", "+exists", "+ttl", "+acl|whoami", "+publish", "~a*", "&news*"),
    ("AUTH", "tenant", "bad"), ("AUTH", "tenant", "bad"), ("HELLO", "2", "AUTH", "nobody", "x"),
    ("AUTH", "tenant", "pw"), ("EXISTS", "a1"), ("EXISTS", "b1"), ("EXISTS", "a2", "b2"), ("DBSIZE",),
    ("PUBLISH", "news1", "x"), ("PUBLISH", "sports", "x"),
    ("MULTI",), ("DBSIZE",), ("TTL", "zz"), ("EXEC",),
    ("AUTH", "default", "x"),
    ("ACL", "DRYRUN", "tenant", "exists", "a"), ("ACL", "DRYRUN", "tenant", "exists", "b"),
    ("ACL", "DRYRUN", "tenant", "dbsize"), ("ACL", "DRYRUN", "tenant", "acl", "whoami"),
    ("ACL", "DRYRUN", "tenant", "acl", "list"), ("ACL", "DRYRUN", "tenant", "ttl"),
    ("ACL", "DRYRUN", "tenant", "publish", "sports", "x"), ("ACL", "DRYRUN", "tenant", "publish", "news2", "x"),
    ("ACL", "LOG"), ("ACL", "LOG", "2"), ("ACL", "LOG", "0"),
    ("CONFIG", "SET", "acllog-max-len", "1"), ("ACL", "LOG"), ("CONFIG", "SET", "acllog-max-len", "128"),
    ("ACL", "DELUSER", "tenant"), ("ACL", "LOG", "RESET"), ("ACL", "LOG"),
]


@pytest.mark.parametrize("resp", [2, 3])
def test_acl_log_and_dryrun_as_redis_server(pfx, ref, resp) -> None:
    same_replies(pfx, ref, ACL_SEQUENCE, resp, mask=_mask_acl_log)


def test_acl_save_and_load_with_aclfile_as_redis_server(pfx, ref, aclfiles) -> None:
    ours_file, theirs_file = aclfiles
    same_replies(pfx, ref, [
        ("ACL", "SETUSER", "saved", "on", ">pw", "~k*", "+@read", "-ttl"), ("ACL", "SAVE"), ("ACL", "LIST"),
        ("ACL", "DELUSER", "saved"), ("ACL", "LOAD"), ("ACL", "LIST"),
    ])
    assert ours_file.read_text() == theirs_file.read_text()
    for text in ("user default on nopass ~* &* +@all\nuser bad on +nosuchcmd\n", "garbage line\n",
                 "user default on nopass ~* &* +@all\nuser a on\nuser a off\n",
                 "user default on nopass ~* &* +@all\nuser x on >p ~* +@all\n"):
        ours_file.write_text(text)
        theirs_file.write_text(text)
        same_replies(pfx, ref, [("ACL", "LOAD"), ("ACL", "LIST")],
                     mask=lambda reply: reply.replace(str(ours_file).encode(), b"F").replace(str(theirs_file).encode(), b"F"))
    ours_file.write_text("user default on nopass ~* &* +@all\n")
    theirs_file.write_text("user default on nopass ~* &* +@all\n")
    same_replies(pfx, ref, [("ACL", "LOAD"), ("ACL", "LIST")])


def test_acl_save_and_load_need_an_aclfile_as_in_redis(redis_server) -> None:
    daemon = start_daemon(*GEOMETRY)
    try:
        same_replies(daemon, redis_server, [("ACL", "SAVE"), ("ACL", "LOAD")])
    finally:
        daemon.stop()


# -- MEMORY, ROLE, redis-py ------------------------------------------------------------------------

def test_memory_stats_has_redis_servers_fields_and_doctor_its_text(pfx, ref) -> None:
    ours = redis.Redis(port=pfx.port).memory_stats()
    theirs = redis.Redis(port=ref.port).memory_stats()
    assert set(theirs) <= set(ours)
    assert ours["dataset.bytes"] == 0 and ours["arena.bytes"] == 4096
    same_replies(pfx, ref, [("MEMORY", "DOCTOR"), ("MEMORY", "MALLOC-STATS")][:1])
    assert redis.Redis(port=pfx.port).execute_command("MEMORY", "PURGE") == b"OK"


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_reads_every_reply(pfx, protocol) -> None:
    r = redis.Redis(port=pfx.port, protocol=protocol)
    try:
        r.config_set("slowlog-log-slower-than", "-1")  # off while the log is emptied: nothing slow slips in
        assert r.slowlog_reset() is True
        r.config_set("slowlog-log-slower-than", "0")  # every command from this one on, each once it has run
        r.execute_command(*STORE)
        entries = r.slowlog_get(5)
        assert {"id", "start_time", "duration", "command"} <= set(entries[0])
        assert [entry["command"] for entry in entries] == [b"PFXSET ns TOKENS 1 2 3 4 DATA xxxxxxxx",
                                                           b"CONFIG SET slowlog-log-slower-than 0"]
        assert r.slowlog_len() == 3  # and the SLOWLOG GET
        assert r.slowlog_reset() is True
        r.config_set("slowlog-log-slower-than", "10000")
        assert r.role() == [b"master", 0, []]
        assert "peak.allocated" in r.memory_stats()
        assert r.client_pause(1, all=False) is True and r.client_unpause() == b"OK"
        assert r.acl_log_reset() is True
        assert r.acl_log(2) == []
        assert r.acl_dryrun("default", "PING") == b"OK"
        info = r.info("everything")
        assert "pfxcache_pages" in info and "role" in info
        r.delete("ns")
    finally:
        r.close()


def test_redis_py_asyncio(pfx) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis(port=pfx.port, protocol=3)
        try:
            await r.config_set("slowlog-log-slower-than", "-1")
            assert await r.slowlog_reset() is True
            assert await r.slowlog_len() == 0
            await r.config_set("slowlog-log-slower-than", "10000")
            await r.execute_command("LATENCY", "RESET")
            assert await r.execute_command("LATENCY", "LATEST") == []
            assert "keys.count" in await r.memory_stats()
        finally:
            await r.aclose()

    asyncio.run(main())


def test_info_everything_has_every_section_of_redis_server_in_its_order(pfx, ref) -> None:
    def titles(port: int, *args: str) -> list[str]:
        conn = Raw(port)
        text = conn.call("INFO", *args).decode()
        conn.close()
        return [line[2:] for line in text.split("\r\n") if line.startswith("# ")]

    for args in (("everything",), ("all",), (), ("default",), ("latencystats",), ("commandstats", "cpu")):
        ours, theirs = titles(pfx.port, *args), titles(ref.port, *args)
        assert ours[:len(theirs)] == theirs, args  # then the module-style sections (# pfxcache ...)
    lines = redis.Redis(port=pfx.port).info("latencystats")
    assert any(name.startswith("latency_percentiles_usec_") for name in lines)
