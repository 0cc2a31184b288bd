"""Redis pub/sub, side by side with a real redis-server 7.0: the same conversations, the same bytes.

Each step sends one request on one of several connections and reads exactly the replies
(and messages) it must cause, on every connection concerned; the bytes must be equal on both
servers. Reading counts whole RESP frames, so nothing depends on timing. Then redis-cli
SUBSCRIBE and redis-py's PubSub, and the ACL channel rules of Redis 7.
"""

from __future__ import annotations

import socket
import subprocess
import time

import hiredis
import pytest
import redis

from pfxcache.testing import encode_command, start_daemon, start_redis_server
from support import wait_for


class Conn:
    """A raw connection that reads exactly n RESP frames and returns their bytes."""

    def __init__(self, address) -> None:
        self.sock = socket.create_connection(address, timeout=10)
        self.reader = hiredis.Reader()
        self.raw = bytearray()

    def send(self, *args) -> None:
        self.sock.sendall(encode_command(*args))

    def read(self, n: int) -> bytes:
        frames = 0
        out = bytearray()
        while frames < n:
            reply = self.reader.gets()
            if reply is False:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                self.reader.feed(chunk)
                self.raw += chunk
                continue
            frames += 1
        # Everything received so far belongs to these n frames: the servers send nothing unasked.
        out, self.raw = bytes(self.raw), bytearray()
        return out

    def nothing_pending(self) -> bool:
        self.sock.setblocking(False)
        try:
            return self.sock.recv(1, socket.MSG_PEEK) == b""  # closed
        except BlockingIOError:
            return True
        finally:
            self.sock.setblocking(True)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def servers():
    daemon = start_daemon("--arena", "memory", "--maxmemory", "1mb", "--block-bytes", "1024")
    real = start_redis_server()
    yield {"pfxcached": daemon.address, "redis-server": real.address}
    daemon.stop()
    real.stop()


# (connection, command, {connection: frames to read}) — connection 0 subscribes, 1 publishes.
RESP2_SCRIPT = [
    (0, ("SUBSCRIBE",), {0: 1}),
    (0, ("SUBSCRIBE", "news", "sport"), {0: 2}),
    (0, ("SUBSCRIBE", "news"), {0: 1}),
    (0, ("PSUBSCRIBE", "n*", "s?ort"), {0: 2}),
    (0, ("PING",), {0: 1}),
    (0, ("PING", "hello"), {0: 1}),
    (0, ("ECHO", "x"), {0: 1}),
    (0, ("DBSIZE",), {0: 1}),
    (0, ("CONFIG", "GET", "maxmemory"), {0: 1}),
    (0, ("CLIENT", "ID", "extra"), {0: 1}),
    (0, ("NOSUCHCOMMAND",), {0: 1}),
    (0, ("ECHO",), {0: 1}),
    (0, ("PUBLISH", "news", "x"), {0: 1}),
    (1, ("PUBLISH", "news", "breaking"), {1: 1, 0: 2}),
    (1, ("PUBLISH", "sport", "goal"), {1: 1, 0: 2}),
    (1, ("PUBLISH", "nothing-here", "x"), {1: 1, 0: 1}),
    (1, ("PUBLISH", "zzz", "x"), {1: 1}),
    (1, ("PUBLISH", "news"), {1: 1}),
    (1, ("PUBSUB", "CHANNELS", "n*"), {1: 1}),
    (1, ("PUBSUB", "CHANNELS", "zz*"), {1: 1}),
    (1, ("PUBSUB", "NUMSUB", "news", "sport", "zzz"), {1: 1}),
    (1, ("PUBSUB", "NUMSUB"), {1: 1}),
    (1, ("PUBSUB", "NUMPAT"), {1: 1}),
    (1, ("PUBSUB", "NUMPAT", "x"), {1: 1}),
    (1, ("PUBSUB", "CHANNELS", "a", "b"), {1: 1}),
    (1, ("PUBSUB", "NOPE"), {1: 1}),
    (1, ("PUBSUB",), {1: 1}),
    (0, ("UNSUBSCRIBE", "news", "never"), {0: 2}),
    (0, ("PUNSUBSCRIBE", "n*"), {0: 1}),
    (1, ("PUBLISH", "news", "after"), {1: 1, 0: 0}),
    (0, ("UNSUBSCRIBE",), {0: 1}),
    (0, ("PUNSUBSCRIBE",), {0: 1}),
    (0, ("UNSUBSCRIBE",), {0: 1}),
    (0, ("PUNSUBSCRIBE",), {0: 1}),
    (0, ("DBSIZE",), {0: 1}),
    (0, ("PING",), {0: 1}),
    (0, ("SUBSCRIBE", "again"), {0: 1}),
    (0, ("RESET",), {0: 1}),
    (0, ("DBSIZE",), {0: 1}),
    (1, ("PUBSUB", "NUMSUB", "again"), {1: 1}),
    (0, ("PSUBSCRIBE", "q*"), {0: 1}),
    (0, ("PUNSUBSCRIBE",), {0: 1}),
    # Sharded pub/sub: channels of their own, counted apart; patterns never see them.
    (0, ("SSUBSCRIBE", "orders", "orders:eu"), {0: 2}),
    (0, ("SUBSCRIBE", "orders"), {0: 1}),
    (0, ("PSUBSCRIBE", "o*"), {0: 1}),
    (0, ("DBSIZE",), {0: 1}),
    (1, ("SPUBLISH", "orders", "o1"), {1: 1, 0: 1}),
    (1, ("PUBLISH", "orders", "o2"), {1: 1, 0: 2}),
    (1, ("SPUBLISH", "nobody", "x"), {1: 1}),
    (1, ("PUBSUB", "SHARDCHANNELS", "orders:*"), {1: 1}),
    (1, ("PUBSUB", "SHARDNUMSUB", "orders", "orders:eu", "orders:us"), {1: 1}),
    (1, ("PUBSUB", "SHARDNUMSUB"), {1: 1}),
    (1, ("PUBSUB", "SHARDCHANNELS", "a", "b"), {1: 1}),
    (1, ("PUBSUB", "HELP"), {1: 1}),
    (0, ("UNSUBSCRIBE",), {0: 1}),
    (0, ("PUNSUBSCRIBE",), {0: 1}),
    (0, ("DBSIZE",), {0: 1}),
    (0, ("SUNSUBSCRIBE", "orders:eu", "never"), {0: 2}),
    (0, ("SUNSUBSCRIBE",), {0: 1}),
    (0, ("SUNSUBSCRIBE",), {0: 1}),
    (0, ("DBSIZE",), {0: 1}),
    (0, ("SSUBSCRIBE",), {0: 1}),
    (0, ("SPUBLISH", "a"), {0: 1}),
    (0, ("QUIT",), {0: 1}),
]

RESP3_SCRIPT = [
    (0, ("SUBSCRIBE", "news"), {0: 1}),
    (0, ("PSUBSCRIBE", "n*"), {0: 1}),
    (0, ("PING",), {0: 1}),
    (0, ("DBSIZE",), {0: 1}),
    (0, ("ECHO", "still works"), {0: 1}),
    (1, ("PUBLISH", "news", "breaking"), {1: 1, 0: 2}),
    (0, ("UNSUBSCRIBE",), {0: 1}),
    (0, ("PUNSUBSCRIBE", "n*", "x*"), {0: 2}),
    (0, ("UNSUBSCRIBE",), {0: 1}),
    (0, ("SSUBSCRIBE", "orders"), {0: 1}),
    (1, ("SPUBLISH", "orders", "o1"), {1: 1, 0: 1}),
    (0, ("SUNSUBSCRIBE",), {0: 1}),
    (0, ("SUBSCRIBE", "a"), {0: 1}),
    (0, ("RESET",), {0: 1}),
    (0, ("PING",), {0: 1}),
]


def run_script(address, script, resp3: bool) -> list[bytes]:
    conns = [Conn(address), Conn(address)]
    transcript = []
    try:
        if resp3:
            conns[0].send("HELLO", "3")
            conns[0].read(1)  # server and version fields differ: not compared
        for who, command, reads in script:
            conns[who].send(*command)
            for reader, frames in reads.items():
                transcript.append((command, reader, conns[reader].read(frames)))
        assert all(conn.nothing_pending() for conn in conns)
    finally:
        for conn in conns:
            conn.close()
    return transcript


@pytest.mark.parametrize("resp3", [False, True], ids=["resp2", "resp3"])
def test_conversations_match_redis_server(servers, resp3):
    script = RESP3_SCRIPT if resp3 else RESP2_SCRIPT
    ours = run_script(servers["pfxcached"], script, resp3)
    theirs = run_script(servers["redis-server"], script, resp3)
    for mine, real in zip(ours, theirs):
        assert mine == real, f"{mine[0]} read on connection {mine[1]}"


def test_channels_listing_matches(servers):
    """PUBSUB CHANNELS without a pattern lists every active channel (order is Redis's hash order: compare sets)."""
    def listing(address):
        sub, other = Conn(address), Conn(address)
        try:
            sub.send("SUBSCRIBE", "a", "b", "c")
            sub.read(3)
            other.send("PUBSUB", "CHANNELS")
            reply = other.read(1)
            return sorted(hiredis_parse(reply))
        finally:
            sub.close()
            other.close()
    assert listing(servers["pfxcached"]) == listing(servers["redis-server"]) == [b"a", b"b", b"c"]


def hiredis_parse(raw: bytes):
    reader = hiredis.Reader()
    reader.feed(raw)
    return reader.gets()


def test_redis_py_pubsub(servers):
    client = redis.Redis(*servers["pfxcached"])
    for protocol in (2, 3):
        sub = redis.Redis(*servers["pfxcached"], protocol=protocol).pubsub()
        sub.subscribe("jobs")
        sub.psubscribe("job*")
        assert sub.get_message(timeout=5)["type"] == "subscribe"
        assert sub.get_message(timeout=5)["type"] == "psubscribe"
        assert client.publish("jobs", "run") == 2
        got = [sub.get_message(timeout=5) for _ in range(2)]
        assert [(m["type"], m["channel"], m["data"]) for m in got] == [
            ("message", b"jobs", b"run"), ("pmessage", b"jobs", b"run")]
        assert got[1]["pattern"] == b"job*"
        sub.close()
    wait_for(lambda: client.pubsub_numpat() == 0, 5, "the subscribers to go")


def test_redis_cli_subscribe(servers):
    host, port = servers["pfxcached"]
    cli = subprocess.Popen(["redis-cli", "-h", host, "-p", str(port), "SUBSCRIBE", "alerts"],
                           stdout=subprocess.PIPE, text=True)
    try:
        client = redis.Redis(host, port)
        wait_for(lambda: client.pubsub_numsub("alerts") == [(b"alerts", 1)], 10, "redis-cli to subscribe")
        assert client.publish("alerts", "disk full") == 1
        lines = []
        while len(lines) < 6:
            lines.append(cli.stdout.readline().rstrip("\n"))
        assert lines == ["subscribe", "alerts", "1", "message", "alerts", "disk full"]
    finally:
        cli.kill()
        cli.wait()


def test_slow_subscriber_is_disconnected_at_the_pubsub_limit():
    daemon = start_daemon("--arena", "memory", "--maxmemory", "1mb", "--block-bytes", "1024",
                          "--client-output-buffer-limit", "pubsub", "256kb", "0", "0")
    try:
        sub = socket.create_connection(daemon.address)
        sub.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sub.sendall(encode_command("SUBSCRIBE", "firehose"))
        client = redis.Redis(*daemon.address)
        wait_for(lambda: client.pubsub_numsub("firehose") == [(b"firehose", 1)], 10, "the subscription")
        payload = b"x" * 65536
        # The subscriber never reads: once its unsent messages pass 256 KiB it is dropped,
        # and publishing never waits for it.
        wait_for(lambda: client.publish("firehose", payload) == 0, 30, "the slow subscriber to be dropped")
        assert int(client.info("stats")["client_output_buffer_limit_disconnections"]) >= 1
        assert client.ping()
        sub.close()
    finally:
        daemon.stop()


ACL_SCRIPT = [
    ("ACL", "SETUSER", "tenant", "on", "nopass", "+@all", "~*", "resetchannels", "&__kvevents@0__:tenant-a*",
     "&news"),
    ("AUTH", "tenant", "x"),
    ("SUBSCRIBE", "news"),
    ("SUBSCRIBE", "news", "other"),
    ("SUBSCRIBE", "__kvevents@0__:tenant-a:1"),
    ("PSUBSCRIBE", "news"),
    ("PSUBSCRIBE", "__kvevents@0__:tenant-a*"),
    ("PSUBSCRIBE", "__kvevents@0__:*"),
    ("PUBLISH", "news", "x"),
    ("PUBLISH", "other", "x"),
    ("UNSUBSCRIBE", "other"),
    ("SSUBSCRIBE", "news"),
    ("SSUBSCRIBE", "news", "other"),
    ("SPUBLISH", "news", "x"),
    ("SPUBLISH", "other", "x"),
]


def test_acl_channel_rules_match_redis_server(servers):
    def transcript(address):
        admin = Conn(address)
        conn = Conn(address)
        out = []
        try:
            admin.send(*ACL_SCRIPT[0])
            out.append(admin.read(1))
            for command in ACL_SCRIPT[1:]:
                conn.send(*command)
                frames = len(command) - 1 if command[0] in ("SUBSCRIBE", "PSUBSCRIBE", "UNSUBSCRIBE", "SSUBSCRIBE") else 1
                reply = conn.read(1)
                if not reply.startswith(b"-") and frames > 1:
                    reply += conn.read(frames - 1)
                out.append(reply)
            admin.send("ACL", "GETUSER", "tenant")
            getuser = hiredis_parse(admin.read(1))
            out.append(getuser[getuser.index(b"channels") + 1])
            admin.send("ACL", "DELUSER", "tenant")
            admin.read(1)
        finally:
            admin.close()
            conn.close()
        return out
    ours = transcript(servers["pfxcached"])
    theirs = transcript(servers["redis-server"])
    assert len(ours) == len(theirs) == len(ACL_SCRIPT) + 1
    for command, mine, real in zip(ACL_SCRIPT + [("ACL GETUSER channels",)], ours, theirs):
        assert mine == real, command


def test_revoking_a_channel_closes_its_subscribers_as_redis_does(servers):
    """ACL SETUSER that takes a subscribed channel away disconnects the subscriber (Redis 7)."""
    def outcome(address):
        admin, sub, other = Conn(address), Conn(address), Conn(address)
        try:
            admin.send("ACL", "SETUSER", "t2", "on", "nopass", "+@all", "resetchannels", "&a", "&b*")
            admin.read(1)
            for conn, channel in ((sub, "a"), (other, "b1")):
                conn.send("AUTH", "t2", "x")
                conn.read(1)
                conn.send("SUBSCRIBE", channel)
                conn.read(1)
            admin.send("ACL", "SETUSER", "t2", "resetchannels", "&b*")
            admin.read(1)
            sub.sock.settimeout(10)
            closed = sub.sock.recv(100) == b""
            other.send("PING")
            alive = other.read(1)
            admin.send("ACL", "DELUSER", "t2")
            admin.read(1)
            return closed, alive
        finally:
            for conn in (admin, sub, other):
                conn.close()
    assert outcome(servers["pfxcached"]) == outcome(servers["redis-server"]) == (True, b"*2\r\n$4\r\npong\r\n$0\r\n\r\n")
