"""Fuzzing a live daemon with hypothesis: bad bytes and bad arguments must never hurt it.

One pfxcached (tiny arena, so eviction and OOM paths run) serves the whole
module. Every exchange opens a connection, sends its bytes (split at random
offsets), half-closes and reads until the daemon closes: an exchange that does
not end within the timeout is a hang. Every byte received must parse as RESP
replies (hiredis), nothing left over, and every error reply names its code and
a reason. After each run the daemon still answers PING, is still the same
process, PFXCHECK (the store's invariants) passes, and the closed connections
hold nothing: no lease, no unfinished insert, no client, no subscription.
The examples are derandomized (tests/conftest.py's profile): a failure comes back
on every run.
"""

from __future__ import annotations

import os
import re
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
#: PFXCACHE_FUZZ_EXAMPLES=5000 for a longer run than CI's. Built on the profile tests/conftest.py loads:
#: "deterministic" (derandomized, CI's) draws the same examples on every run, HYPOTHESIS_PROFILE=explore fresh ones.
FUZZ = settings(settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic")),
                max_examples=int(os.environ.get("PFXCACHE_FUZZ_EXAMPLES", "200")), deadline=None,
                suppress_health_check=list(HealthCheck), database=None)

#: Commands whose random arguments could take the daemon down or lock the fuzzer out: not fuzzed
#: (and CONFIG RESETSTAT, which would zero the commandstats the argument fuzzer reads).
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


#: An error reply: an upper-case code, then a reason.
ERROR_REPLY = re.compile(r"[A-Z][A-Z_]* \S.*", re.DOTALL)


def assert_well_formed(reply) -> None:
    """A parsed reply holds only RESP values, and each error in it says what went wrong."""
    if isinstance(reply, hiredis.ReplyError):
        assert ERROR_REPLY.fullmatch(str(reply)), f"an error reply without a code and a reason: {reply!r}"
    elif isinstance(reply, (list, set)):
        for item in reply:
            assert_well_formed(item)
    elif isinstance(reply, dict):
        for key, value in reply.items():
            assert_well_formed(key)
            assert_well_formed(value)
    else:
        assert reply is None or isinstance(reply, (bytes, str, int, float, bool)), (type(reply), reply)


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


def held(client: redis.Redis) -> dict[str, int]:
    """What open connections hold in the daemon: each figure goes back to its idle value once they close."""
    stats = client.execute_command("PFXINFO")[b"stats"]
    info = client.info()
    return {
        "leases": stats[b"leases"], "fenced_leases": stats[b"fenced_leases"],
        "blocks_leased": stats[b"blocks_leased"], "pinned_pages": stats[b"pinned_pages"],
        "inserts_in_progress": stats[b"inserts_in_progress"],
        # every block in use is a cached page's: none kept by a connection that went away
        "blocks_used_uncached": stats[b"blocks_used"] - stats[b"blocks_cached"],
        "connected_clients": info["connected_clients"], "blocked_clients": info["blocked_clients"],
        "pubsub_channels": info["pubsub_channels"], "pubsub_patterns": info["pubsub_patterns"],
    }


def assert_nothing_held(client: redis.Redis, idle: dict[str, int], timeout: float = 5.0) -> None:
    """Within ``timeout`` (a closed connection is let go after its socket closes), ``held`` is back to ``idle``."""
    deadline = time.monotonic() + timeout
    while (now := held(client)) != idle and time.monotonic() < deadline:
        time.sleep(0.05)
    assert now == idle, {name: (now[name], idle[name]) for name in now if now[name] != idle[name]}


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


def test_random_and_mutated_resp_streams(target):
    watcher = redis.Redis(host=target.host, port=target.port, protocol=3)
    idle = held(watcher)
    connections = watcher.info("stats")["total_connections_received"]
    exchanges = 0

    @FUZZ
    @given(data=st.one_of(streams, st.binary(max_size=400)), offsets=st.lists(st.integers(0, 10**6), max_size=8))
    def send(data, offsets):
        nonlocal exchanges
        exchanges += 1
        for reply in parse_all(exchange(target.address, _split(data, offsets))):
            assert_well_formed(reply)

    send()
    assert exchanges >= FUZZ.max_examples, exchanges  # every example ran, none was skipped
    assert_healthy(target)
    # Every exchange reached the daemon as a connection of its own (and the health check one more).
    assert watcher.info("stats")["total_connections_received"] == connections + exchanges + 1
    assert_nothing_held(watcher, idle)
    watcher.close()


def test_the_leak_check_sees_a_lease_held_by_an_open_connection(target):
    watcher = redis.Redis(host=target.host, port=target.port, protocol=3)
    idle = held(watcher)
    holder = redis.Redis(host=target.host, port=target.port, protocol=3)
    reply = holder.execute_command("PFXGET", "seed", "TOKENS", *range(8))
    assert reply[b"lease"], reply
    with pytest.raises(AssertionError, match=r"'leases': \(1, 0\)"):
        assert_nothing_held(watcher, idle | {"connected_clients": idle["connected_clients"] + 1}, timeout=0.2)
    holder.close()  # the lease goes with its connection
    assert_nothing_held(watcher, idle)
    watcher.close()


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


PFX_COMMANDS = ("pfxget", "pfxset", "pfxalloc", "pfxrelease", "pfxevict", "pfxinfo")


def _pfx_counted(client: redis.Redis) -> Counter[str]:
    """How many of each PFX command the daemon counted: run, or refused at the table or the arity check."""
    commandstats = client.info("commandstats")
    return Counter({name: commandstats.get(f"cmdstat_{name}", {}).get("calls", 0)
                    + commandstats.get(f"cmdstat_{name}", {}).get("rejected_calls", 0) for name in PFX_COMMANDS})


def test_random_arguments_for_every_command(target, command_names):
    watcher = redis.Redis(host=target.host, port=target.port, protocol=3)
    idle = held(watcher)
    counted_before = _pfx_counted(watcher)
    calls_before = sum(watcher.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0)
                       for name in PFX_COMMANDS)
    # PFX commands sent (up to the first QUIT of each exchange), by name: what commandstats must count.
    sent: Counter[str] = Counter()
    # The PFX commands are drawn more often than the others, so that enough of them are sent
    # however many commands the table holds.
    names = st.sampled_from(command_names + [name for name in PFX_COMMANDS if name in command_names] * 3)

    @FUZZ
    @given(calls=st.lists(st.tuples(names, st.lists(arguments, max_size=12)), min_size=1, max_size=6))
    def send(calls):
        payload = []
        quits = uncounted = False
        for name, args in calls:
            argv = [part.encode() for part in name.split("|")] + args
            # Counted while the connection is in its plain state: after a QUIT, a (P)SUBSCRIBE, MONITOR or
            # CLIENT REPLY the daemon may close, refuse or answer differently, as Redis does.
            if not quits and not uncounted and name in PFX_COMMANDS:
                sent[name] += 1
            quits = quits or name in ("quit",)
            uncounted = uncounted or name in UNCOUNTED
            payload.append(encode_command(*argv))
        replies = parse_all(exchange(target.address, [b"".join(payload)]))
        for reply in replies:
            assert_well_formed(reply)
        if not quits and not uncounted:
            assert len(replies) == len(calls), (calls, replies)

    send()
    assert_healthy(target)
    # The fuzzers' connections are closed: their leases, inserts and subscriptions went with them.
    assert_nothing_held(watcher, idle)
    # Every PFX command sent was counted (it reached the table, the handler or the arity check, never
    # vanished), most reached the handlers, and memory stayed bounded.
    counted = _pfx_counted(watcher) - counted_before
    assert {name: counted[name] for name in PFX_COMMANDS if counted[name] < sent[name]} == {}, (counted, sent)
    assert sum(sent.values()) >= 20, sent
    calls = sum(watcher.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0) for name in PFX_COMMANDS)
    assert calls - calls_before >= 20, (calls, calls_before)
    assert watcher.info("memory")["used_memory_rss"] < 300 * 2**20
    watcher.close()
