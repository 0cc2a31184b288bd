"""Fuzzing a live daemon with hypothesis: bad bytes and bad arguments must never hurt it.

One pfxcached (tiny arena, so eviction and OOM paths run) serves the whole
module. Every exchange opens a connection, sends its bytes (split at random
offsets), half-closes and reads until the daemon closes: an exchange that does
not end within the timeout is a hang. Every byte received must parse as RESP
replies (hiredis), nothing left over. After each run the daemon still answers
PING, is still the same process, and PFXCHECK (the store's invariants) passes.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections import Counter

import hiredis
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pfxcache.testing import encode_command, start_daemon

EXCHANGE_TIMEOUT = 10.0
#: PFXCACHE_FUZZ_EXAMPLES=5000 for a longer run than CI's.
FUZZ = settings(max_examples=int(os.environ.get("PFXCACHE_FUZZ_EXAMPLES", "200")), deadline=None, suppress_health_check=list(HealthCheck), database=None)

#: Commands whose random arguments could take the daemon down or lock the fuzzer out: not fuzzed
#: (and CONFIG RESETSTAT, which would zero the commandstats the last test reads).
UNSAFE = {"shutdown", "config|set", "config|rewrite", "client|kill", "acl|setuser", "acl|deluser", "acl|load",
          "acl|save", "config|resetstat",
          # a random timeout would stall every other test's client for that long
          "client|pause", "debug|sleep"}
#: Commands that do not answer once per request: once per channel (the subscribe family), not at
#: all (CLIENT REPLY OFF|SKIP), or with a stream (MONITOR). An exchange holding one is not counted.
UNCOUNTED = {"subscribe", "unsubscribe", "psubscribe", "punsubscribe", "ssubscribe", "sunsubscribe",
             "monitor", "client|reply"}


@pytest.fixture(scope="module")
def target():
    daemon = start_daemon("--page-size", "2", "--block-bytes", "16", "--maxmemory", "4096",
                          "--prompt-max-tokens", "64", "--evict-low-watermark", "0",
                          "--tenant-quota", "fz* 6 4 3")  # quota paths fuzzed too; PFXCHECK checks its counters
    admin = redis.Redis(host=daemon.host, port=daemon.port, protocol=2)
    tokens = [str(t) for t in range(8)]
    admin.execute_command("PFXSET", "seed", "TOKENS", *tokens, "DATA", b"s" * 64)
    yield daemon
    admin.close()
    assert daemon.stop() == 0, daemon.log_text()


def exchange(address, chunks: list[bytes]) -> bytes:
    """Send ``chunks`` as separate writes, half-close, read until the daemon closes."""
    sock = socket.create_connection(address, timeout=EXCHANGE_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    received = bytearray()
    deadline = time.monotonic() + EXCHANGE_TIMEOUT
    try:
        try:
            for chunk in chunks:
                if chunk:
                    sock.sendall(chunk)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # EPIPE, ECONNRESET, ENOTCONN
            pass  # the daemon closed first (a protocol error): what it sent is still readable
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"exchange did not end within {EXCHANGE_TIMEOUT}s: {bytes(received[:200])!r}")
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            except socket.timeout:
                raise AssertionError("exchange hung") from None
            if not chunk:
                break
            received += chunk
    finally:
        sock.close()
    return bytes(received)


def parse_all(data: bytes) -> list:
    """Every reply in ``data``; fails when it is not well-formed RESP or ends mid-reply."""
    reader = hiredis.Reader()
    reader.feed(data)
    replies = []
    while True:
        reply = reader.gets()
        if reply is False:
            break
        replies.append(reply)
    assert not reader.has_data(), f"a partial reply at the end: {data[-200:]!r}"
    return replies


def assert_healthy(daemon) -> None:
    assert daemon.proc.poll() is None, daemon.log_text()[-3000:]
    with socket.create_connection(daemon.address, timeout=EXCHANGE_TIMEOUT) as sock:
        sock.sendall(b"PING\r\n" + encode_command("PFXCHECK"))
        data = b""
        while data.count(b"\r\n") < 2:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    assert data == b"+PONG\r\n+OK\r\n", data


# -- RESP byte streams --------------------------------------------------------------------------

SAMPLES = [
    encode_command("PING"),
    encode_command("ECHO", "hello"),
    encode_command("PFXGET", "seed", "TOKENS", *range(8), "NOLEASE"),
    encode_command("PFXGET", "seed", "PACKED", struct.pack("<4I", 0, 1, 2, 3), "WITHDATA", "TTL", "100"),
    encode_command("PFXSET", "fz", "TOKENS", 1, 2, 3, 4, "DATA", b"d" * 32),
    encode_command("PFXALLOC", "fz", 2, "TTL", 500),
    encode_command("PFXRELEASE", 1, 2),
    encode_command("PFXEVICT", "fz", "PAGES", 1),
    encode_command("PFXINFO", "fz"),
    encode_command("HELLO", "3"),
    encode_command("CLIENT", "SETNAME", "fuzz"),
    b"PING\r\n",
    b"ECHO inline\r\n",
    b"*1\r\n$4\r\nPING\r\n",
    b"\r\n",
]


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    buf = bytearray(data)
    for kind, position, value in edits:
        if not buf:
            buf.append(value)
            continue
        position %= len(buf) + (1 if kind == 1 else 0)
        if kind == 0:
            buf[position % len(buf)] = value
        elif kind == 1:
            buf.insert(position, value)
        elif kind == 2:
            del buf[position % len(buf)]
        else:  # replace a digit-ish region with a big or negative length
            buf[position % len(buf): position % len(buf) + 1] = [b"-1", b"99999999999", b"0", b"2147483648"][value % 4]
    return bytes(buf)


def _split(data: bytes, offsets: list[int]) -> list[bytes]:
    cuts = sorted({o % (len(data) + 1) for o in offsets})
    pieces, start = [], 0
    for cut in cuts:
        pieces.append(data[start:cut])
        start = cut
    pieces.append(data[start:])
    return pieces


streams = st.builds(
    _mutate,
    st.lists(st.sampled_from(SAMPLES), min_size=1, max_size=8).map(b"".join),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6), st.integers(0, 255)), max_size=6),
)


@FUZZ
@given(data=st.one_of(streams, st.binary(max_size=400)), offsets=st.lists(st.integers(0, 10**6), max_size=8))
def test_random_and_mutated_resp_streams(target, data, offsets):
    parse_all(exchange(target.address, _split(data, offsets)))


def test_random_streams_leave_the_daemon_healthy(target):
    assert_healthy(target)


def test_a_pipeline_split_at_every_offset_gets_the_same_replies(target):
    pipeline = b"".join([
        encode_command("PING"), encode_command("ECHO", "x" * 40),
        encode_command("PFXGET", "seed", "TOKENS", *range(8), "NOLEASE"),
        encode_command("PFXEVICT", "ghost", "ALL"), encode_command("NOSUCH", "a"), b"PING inline\r\n",
        encode_command("PFXGET", "seed", "PACKED", struct.pack("<2I", 0, 1), "NOLEASE", "WITHDATA"),
    ])
    expected = exchange(target.address, [pipeline])
    assert len(parse_all(expected)) == 7
    for offset in range(1, len(pipeline)):
        assert exchange(target.address, [pipeline[:offset], pipeline[offset:]]) == expected, offset
    assert_healthy(target)


# -- random argument lists for every command ----------------------------------------------------

WORDS = [b"TOKENS", b"PACKED", b"NOLEASE", b"TTL", b"WITHDATA", b"OFFSET", b"DATA", b"BLOCKS", b"PAGES",
         b"BYTES", b"ALL", b"seed", b"fz", b"", b"0", b"1", b"2", b"3", b"-1", b"18446744073709551616",
         b"4294967296", b"007", b"*", b"ID", b"NAME", b"SETNAME", b"GET", b"INFO", b"DOCS", b"COUNT", b"LIST",
         b"FILTERBY", b"ACLCAT", b"PATTERN", b"3", b"2", b"AUTH", b"default", b"SKIPME", b"yes", b"ON", b"OFF"]

arguments = st.one_of(
    st.sampled_from(WORDS),
    st.integers(-(2**64), 2**64).map(lambda n: str(n).encode()),
    st.binary(max_size=40),
    st.lists(st.integers(0, 2**32 - 1), max_size=20).map(lambda ts: struct.pack(f"<{len(ts)}I", *ts)),
    st.binary(min_size=1, max_size=4).map(lambda b: b * 16),
)


@pytest.fixture(scope="module")
def command_names(target):
    (listed,) = parse_all(exchange(target.address, [encode_command("COMMAND", "LIST")]))
    names = [name.decode() for name in listed]
    assert {"pfxget", "pfxset", "pfxalloc", "pfxrelease", "pfxevict", "pfxinfo", "pfxcheck"} <= set(names)
    return sorted(n for n in names if n not in UNSAFE)


#: PFX commands the argument fuzzer sent (up to the first QUIT of each exchange), by name: what the
#: consistency test expects commandstats to count. Which commands a run draws depends on its seed.
SENT: Counter[str] = Counter()
PFX_COMMANDS = ("pfxget", "pfxset", "pfxalloc", "pfxrelease", "pfxevict", "pfxinfo")


@FUZZ
@given(data=st.data())
def test_random_arguments_for_every_command(target, command_names, data):
    # The PFX commands are drawn more often than the others, so the consistency test below
    # gets enough of them however many commands the table holds.
    names = st.sampled_from(command_names + [name for name in PFX_COMMANDS if name in command_names] * 3)
    calls = data.draw(st.lists(st.tuples(names, st.lists(arguments, max_size=12)), min_size=1, max_size=6))
    payload = []
    quits = uncounted = False
    for name, args in calls:
        argv = [part.encode() for part in name.split("|")] + args
        # Counted while the connection is in its plain state: after a QUIT, a (P)SUBSCRIBE, MONITOR or
        # CLIENT REPLY the daemon may close, refuse or answer differently, as Redis does.
        if not quits and not uncounted and name in PFX_COMMANDS:
            SENT[name] += 1
        quits = quits or name in ("quit",)
        uncounted = uncounted or name in UNCOUNTED
        payload.append(encode_command(*argv))
    replies = parse_all(exchange(target.address, [b"".join(payload)]))
    if not quits and not uncounted:
        assert len(replies) == len(calls), (calls, replies)


def test_every_command_with_random_arguments_leaves_the_store_consistent(target):
    assert_healthy(target)
    client = redis.Redis(host=target.host, port=target.port, protocol=3)
    deadline = time.monotonic() + 5
    while client.execute_command("PFXINFO")[b"stats"][b"leases"] and time.monotonic() < deadline:
        time.sleep(0.05)  # the fuzzers' connections are closed: their leases go with them
    info = client.execute_command("PFXINFO")
    assert info[b"stats"][b"leases"] == 0, info
    # Every PFX command the fuzzer sent was counted (it reached the table, the handler or the
    # arity check, never vanished), most reached the handlers, and memory stayed bounded.
    commandstats = client.info("commandstats")
    pfx = {name: commandstats.get(f"cmdstat_{name}", {}) for name in PFX_COMMANDS}
    counted = {name: stat.get("calls", 0) + stat.get("rejected_calls", 0) for name, stat in pfx.items()}
    assert all(counted[name] >= SENT[name] for name in PFX_COMMANDS), (counted, SENT)
    assert sum(SENT.values()) >= 20, SENT
    assert sum(stat.get("calls", 0) for stat in pfx.values()) >= 20, pfx
    assert client.info("memory")["used_memory_rss"] < 300 * 2**20
    client.close()
