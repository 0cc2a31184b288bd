"""Tests of pfxcache.protocol.requests: request parsing as redis-server 7.0 does it.

Most tests run twice: with the hiredis fast path and with the exact parser
alone (``use_hiredis=False``).  The differential tests at the end send the
same bytes to a real redis-server and compare replies and closing.
"""

from __future__ import annotations

import itertools
import random
import re
import selectors
import socket
import sys
import time

import hiredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pfxcache.protocol.requests import (
    NEED_DATA,
    ProtocolError,
    RequestParser,
)
from pfxcache.testing import start_redis_server

FAST_AND_EXACT = pytest.mark.parametrize("use_hiredis", [True, False], ids=["fast", "exact"])
KIB = 1024
MIB = 1024 * 1024


def enc(args) -> bytes:
    """Canonical RESP encoding of a request."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def drain(parser: RequestParser, out: list) -> bool:
    """Pull commands until NEED_DATA or an error; record them; True once failed."""
    while True:
        try:
            cmd = parser.next_command()
        except ProtocolError as exc:
            out.append(("error", exc.reply, exc.message))
            return True
        if cmd is NEED_DATA:
            return False
        assert type(cmd) is list and cmd and all(type(a) is bytes for a in cmd)
        out.append(cmd)


def events(data: bytes, chunks=None, **kwargs) -> list:
    """Commands and the final error (if any) for ``data`` fed in pieces.

    ``chunks`` is None (one feed), an int (pieces of that size) or a list of
    split offsets.
    """
    parser = RequestParser(**kwargs)
    if chunks is None:
        pieces = [data]
    elif isinstance(chunks, int):
        pieces = [data[i : i + chunks] for i in range(0, len(data), chunks)]
    else:
        cuts = [0, *sorted(chunks), len(data)]
        pieces = [data[a:b] for a, b in itertools.pairwise(cuts)]
    out: list = []
    for piece in pieces:
        parser.feed(piece)
        if drain(parser, out):
            break
    return out


def err(message: bytes):
    return ("error", b"-ERR " + message + b"\r\n", message.decode("latin-1"))


# ---------------------------------------------------------------------------
# The reference table (checked on redis 7.0.15).
# ---------------------------------------------------------------------------

PE = b"Protocol error: "
TABLE = [
    # (id, input, commands before the end, error or None)
    ("empty-lines", b"\r\n\r\n  \t \r\nPING\r\n", [[b"PING"]], None),
    ("lf-only-lines", b"\n\nPING\n", [[b"PING"]], None),
    ("negative-and-zero-count", b"*-10\r\n*0\r\n*-1\r\nPING\r\n", [[b"PING"]], None),
    ("count-over-int-max", b"*3000000000\r\n", [], err(PE + b"invalid multibulk length")),
    ("count-not-a-number", b"*abc\r\n", [], err(PE + b"invalid multibulk length")),
    ("count-int-max+1", b"*2147483648\r\n", [], err(PE + b"invalid multibulk length")),
    ("count-leading-zero", b"*01\r\n", [], err(PE + b"invalid multibulk length")),
    ("count-plus", b"*+1\r\n", [], err(PE + b"invalid multibulk length")),
    ("count-minus-zero", b"*-0\r\n", [], err(PE + b"invalid multibulk length")),
    ("count-empty", b"*\r\n", [], err(PE + b"invalid multibulk length")),
    (
        "expected-dollar",
        b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n",
        [],
        err(PE + b"expected '$', got 'f'"),
    ),
    (
        "negative-bulk-length",
        b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$-10\r\n",
        [],
        err(PE + b"invalid bulk length"),
    ),
    ("bulk-length-blabla", b"*1\r\n$blabla\r\n", [], err(PE + b"invalid bulk length")),
    ("bulk-length-empty", b"*1\r\n$\r\n", [], err(PE + b"invalid bulk length")),
    ("bulk-length-leading-zero", b"*1\r\n$04\r\nPING\r\n", [], err(PE + b"invalid bulk length")),
    ("bulk-null", b"*1\r\n$-1\r\n", [], err(PE + b"invalid bulk length")),
    (
        "bulk-over-proto-max",
        b"*1\r\n$536870913\r\n",
        [],
        err(PE + b"invalid bulk length"),
    ),
    ("single-arg-no-dollar", b"*1\r\nfoo\r\n", [], err(PE + b"expected '$', got 'f'")),
    ("got-cr-shown-as-space", b"*1\r\n\r\n", [], err(PE + b"expected '$', got ' '")),
    ("got-lf-shown-as-space", b"*1\r\n\n\r\n", [], err(PE + b"expected '$', got ' '")),
    ("got-raw-byte", b"*1\r\n\xff\r\n", [], err(PE + b"expected '$', got '\xff'")),
    ("resp3-status-item", b"*1\r\n+PING\r\n", [], err(PE + b"expected '$', got '+'")),
    # Same length as a canonical request: only the '$' check tells them apart.
    ("status-and-verbatim", b"*2\r\n+a\r\n=5\r\ntxt:b\r\n", [], err(PE + b"expected '$', got '+'")),
    (
        "unbalanced-quotes",
        b'set """test-key""" test-value\r\nping\r\n',
        [],
        err(PE + b"unbalanced quotes in request"),
    ),
    ("too-big-inline", b"\x00" + b"a" * (64 * KIB + 1), [], err(PE + b"too big inline request")),
    ("too-big-inline-no-nul", b"a" * (64 * KIB + 1), [], err(PE + b"too big inline request")),
    (
        "too-big-mbulk-count",
        b"*\x00" + b"a" * (64 * KIB),
        [],
        err(PE + b"too big mbulk count string"),
    ),
    (
        "too-big-bulk-count",
        b"*1\r\n$" + b"1" * (64 * KIB + 1),
        [],
        err(PE + b"too big bulk count string"),
    ),
    # Commands before the error in the same pipeline are still parsed.
    (
        "error-after-commands",
        b"PING\r\n*1\r\n$4\r\nPING\r\n*1\r\n$x\r\n",
        [[b"PING"], [b"PING"]],
        err(PE + b"invalid bulk length"),
    ),
]

# After the table input: these bytes must not change the result (beyond the
# commands they add when there was no error).
TRAILER = b"*1\r\n$4\r\nPING\r\n" + b"PING\r\n" + b"\r\n" + b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
TRAILER_COMMANDS = [[b"PING"], [b"PING"], [b"GET", b"k"]]


def _table_expected(commands, error, trailer: bool):
    if error is not None:
        return [*commands, error]
    return [*commands, *(TRAILER_COMMANDS if trailer else [])]


@FAST_AND_EXACT
@pytest.mark.parametrize("row", TABLE, ids=[row[0] for row in TABLE])
def test_table_whole(row, use_hiredis):
    _, data, commands, error = row
    assert events(data, use_hiredis=use_hiredis) == _table_expected(commands, error, False)
    assert events(data + TRAILER, use_hiredis=use_hiredis) == _table_expected(commands, error, True)


@FAST_AND_EXACT
@pytest.mark.parametrize("row", TABLE, ids=[row[0] for row in TABLE])
def test_table_byte_at_a_time(row, use_hiredis):
    _, data, commands, error = row
    assert events(data, 1, use_hiredis=use_hiredis) == _table_expected(commands, error, False)
    expected = _table_expected(commands, error, True)
    assert events(data + TRAILER, 1, use_hiredis=use_hiredis) == expected
    # A few other chunkings as well.
    for size in (2, 3, 7, 4096):
        assert events(data + TRAILER, size, use_hiredis=use_hiredis) == expected


@FAST_AND_EXACT
def test_error_is_sticky(use_hiredis):
    parser = RequestParser(use_hiredis=use_hiredis)
    parser.feed(b"*1\r\n$4\r\nPING\r\n*x\r\n*1\r\n$4\r\nPING\r\n")
    assert parser.next_command() == [b"PING"]
    with pytest.raises(ProtocolError) as first:
        parser.next_command()
    assert first.value.reply == b"-ERR Protocol error: invalid multibulk length\r\n"
    assert first.value.message == "Protocol error: invalid multibulk length"
    parser.feed(b"PING\r\n")  # ignored
    for _ in range(3):
        with pytest.raises(ProtocolError) as again:
            parser.next_command()
        assert (again.value.reply, again.value.message) == (first.value.reply, first.value.message)
    assert parser.buffered() == 0


def test_need_data_sentinel():
    assert repr(NEED_DATA) == "NEED_DATA"
    assert not NEED_DATA
    parser = RequestParser()
    assert parser.next_command() is NEED_DATA
    parser.feed(b"")
    assert parser.next_command() is NEED_DATA


# ---------------------------------------------------------------------------
# Redis quirks that the table does not show.
# ---------------------------------------------------------------------------

QUIRKS = [
    # The byte after a count line's '\r' and the two bytes after a payload are skipped unchecked.
    (b"*1\rX$4\r\nPING\r\n", [[b"PING"]]),
    (b"*1\r\n$4\rXPING\r\n", [[b"PING"]]),
    (b"*1\r\n$4\r\nPINGXY*1\r\n$4\r\nPING\r\n", [[b"PING"], [b"PING"]]),
    # Inline: a '\r' before the '\n' is stripped (one), other blanks split.
    (b"PING\r\r\n", [[b"PING"]]),
    (b"GET  a\tb\r\n", [[b"GET", b"a", b"b"]]),
    # A NUL before the line end hides it (strchr): nothing is parsed.
    (b"PING\x00\r\nPING\r\n", []),
    (b"*1\x00\r\n$4\r\nPING\r\n", []),
    (b"*1\r\n$4\x00\r\nPING\r\n", []),
    # ...but NULs inside bulk payloads are fine.
    (b"*2\r\n$3\r\nGET\r\n$3\r\n\x00\r\n\r\n", [[b"GET", b"\x00\r\n"]]),
    # LLONG_MIN is a valid (ignored) count; one less is not a number.
    (b"*-9223372036854775808\r\nPING\r\n", [[b"PING"]]),
    (b"*-9223372036854775809\r\n", [err(PE + b"invalid multibulk length")]),
    (b"*1\r\n$9223372036854775808\r\n", [err(PE + b"invalid bulk length")]),
    # A line that is not a '*' request is inline, even with a leading blank.
    (b" *1\r\n", [[b"*1"]]),
    (b"$4\r\nPING\r\n", [[b"$4"], [b"PING"]]),
    # Count lines may be long, up to the 64 KiB limit.
    (b"*1" + b" " * 1000 + b"\r\n", [err(PE + b"invalid multibulk length")]),
]


@FAST_AND_EXACT
@pytest.mark.parametrize("data,expected", QUIRKS)
def test_quirks(data, expected, use_hiredis):
    assert events(data, use_hiredis=use_hiredis) == expected
    assert events(data, 1, use_hiredis=use_hiredis) == expected


@FAST_AND_EXACT
def test_nul_line_fails_only_past_limit(use_hiredis):
    parser = RequestParser(use_hiredis=use_hiredis, inline_max=100)
    parser.feed(b"PING\x00\r\nPING\r\n")
    assert parser.next_command() is NEED_DATA
    parser.feed(b"x" * (100 - parser.buffered()))
    assert parser.next_command() is NEED_DATA  # exactly inline_max pending: not over it
    parser.feed(b"\r\n")
    with pytest.raises(ProtocolError, match="too big inline request"):
        parser.next_command()


@FAST_AND_EXACT
def test_line_limit_boundary(use_hiredis):
    # Redis (reading a byte at a time) accepts a line end within inline_max + 1 bytes.
    limit = 64 * KIB
    ok = b"ECHO " + b"a" * (limit - 5) + b"\n"  # the '\n' is byte limit + 1
    assert events(ok, use_hiredis=use_hiredis) == [[b"ECHO", b"a" * (limit - 5)]]
    bad = b"ECHO " + b"a" * (limit - 4) + b"\n"
    assert events(bad, use_hiredis=use_hiredis) == [err(PE + b"too big inline request")]
    # The same for a count line: '\r' may be the (limit + 1)th byte.
    assert events(b"*" + b"1" * (limit - 1) + b"\r\n", use_hiredis=use_hiredis) == [
        err(PE + b"invalid multibulk length")
    ]
    assert events(b"*" + b"1" * limit + b"\r\n", use_hiredis=use_hiredis) == [
        err(PE + b"too big mbulk count string")
    ]


@given(st.lists(st.binary(max_size=20), min_size=1, max_size=8))
@settings(max_examples=200, deadline=None)
def test_inline_quoting_roundtrip(args):
    # Any bytes survive "\xHH"-quoting (and plain tokens survive unquoted).
    parts = []
    for i, arg in enumerate(args):
        if i % 2 and arg and all(c > 32 and c not in b"\"'\x7f" for c in arg):
            parts.append(arg)
        else:
            parts.append(b'"' + b"".join(b"\\x%02x" % c for c in arg) + b'"')
    line = b" ".join(parts) + b"\r\n"
    assert events(line) == [args]


# ---------------------------------------------------------------------------
# Pipelines, binary safety, big payloads, limits.
# ---------------------------------------------------------------------------


@FAST_AND_EXACT
def test_pipeline_one_feed(use_hiredis):
    rng = random.Random(1)
    commands = [
        [b"SET", b"key:%d" % i, rng.randbytes(rng.choice((0, 1, 10, 100, 1000, 20000)))]
        for i in range(1000)
    ]
    data = b"".join(enc(c) for c in commands)
    assert events(data, use_hiredis=use_hiredis) == commands
    assert events(data, 1500, use_hiredis=use_hiredis) == commands


@FAST_AND_EXACT
def test_mixed_inline_and_multibulk(use_hiredis):
    data = (
        b"PING\r\n"
        + enc([b"SET", b"a", b"1"])
        + b'SET b "two words"\r\n'
        + enc([b"GET", b"b"])
        + b"\r\n"
        + enc([b"DEL", b"a", b"b"])
        + b"QUIT\n"
    )
    expected = [
        [b"PING"],
        [b"SET", b"a", b"1"],
        [b"SET", b"b", b"two words"],
        [b"GET", b"b"],
        [b"DEL", b"a", b"b"],
        [b"QUIT"],
    ]
    for chunks in (None, 1, 5):
        assert events(data, chunks, use_hiredis=use_hiredis) == expected


@FAST_AND_EXACT
def test_binary_safe_and_empty_args(use_hiredis):
    commands = [
        [b"SET", b"k\r\n", b"\r\n\r\n*1\r\n$4\r\nPING\r\n"],
        [b"SET", b"", b""],
        [b"\x00\xff", b"$3", b"*1"],
        [b""],
    ]
    data = b"".join(enc(c) for c in commands)
    assert events(data, use_hiredis=use_hiredis) == commands
    assert events(data, 1, use_hiredis=use_hiredis) == commands
    assert events(b"*1\r\n$0\r\n\r\n", use_hiredis=use_hiredis) == [[b""]]


@FAST_AND_EXACT
def test_large_bulk_in_small_pieces(use_hiredis):
    value = random.Random(2).randbytes(10 * MIB)
    data = enc([b"SET", b"big", value]) + enc([b"GET", b"big"])
    parser = RequestParser(use_hiredis=use_hiredis)
    out: list = []
    fed = 0
    max_wanted = 0
    for i in range(0, len(data), 4096):
        piece = data[i : i + 4096]
        parser.feed(piece)
        fed += len(piece)
        assert parser.buffered() <= fed
        # The buffer's allocation is bounded by what arrived, not by what was declared.
        assert sys.getsizeof(parser._buf) <= 1.25 * fed + 64 * KIB
        wanted = parser.wanted()
        assert 0 < wanted <= max(16 * KIB, 2 * fed)
        max_wanted = max(max_wanted, wanted)
        drain(parser, out)
    assert out == [[b"SET", b"big", value], [b"GET", b"big"]]
    assert max_wanted > 16 * KIB  # the reader was told to read big
    assert sys.getsizeof(parser._buf) < 64 * KIB  # the big buffer was released
    assert parser.buffered() == 0
    assert parser.wanted() == 16 * KIB


@FAST_AND_EXACT
def test_declared_huge_bulk_sent_slowly(use_hiredis):
    parser = RequestParser(use_hiredis=use_hiredis)
    parser.feed(b"*2\r\n$3\r\nSET\r\n$536870912\r\n")
    assert parser.next_command() is NEED_DATA
    assert parser.wanted() == 16 * KIB
    fed = 0
    for _ in range(2000):
        parser.feed(b"x")
        fed += 1
        assert parser.next_command() is NEED_DATA
    assert parser.buffered() == 3 + fed
    assert sys.getsizeof(parser._buf) < 64 * KIB
    assert parser.wanted() == 16 * KIB
    parser.feed(b"x" * 100_000)
    assert parser.next_command() is NEED_DATA
    # At most twice what arrived of the bulk, never the whole declared size.
    assert 16 * KIB < parser.wanted() <= 2 * (102_000 + 3)


@FAST_AND_EXACT
def test_wanted_stops_at_end_of_big_bulk(use_hiredis):
    parser = RequestParser(use_hiredis=use_hiredis)
    parser.feed(b"*1\r\n$40000\r\n" + b"x" * 39_000)
    assert parser.next_command() is NEED_DATA
    assert parser.wanted() == 1002  # the rest of the payload and its CRLF
    parser.feed(b"x" * 1000 + b"\r\n")
    assert parser.next_command() == [b"x" * 40_000]
    assert parser.wanted() == 16 * KIB


@FAST_AND_EXACT
def test_query_buffer_limit(use_hiredis):
    parser = RequestParser(use_hiredis=use_hiredis, query_buffer_limit=1000)
    parser.feed(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2000\r\n")
    assert parser.next_command() is NEED_DATA
    parser.feed(b"x" * 900)
    assert parser.next_command() is NEED_DATA
    assert parser.buffered() <= 1000
    parser.feed(b"x" * 200)  # would go over the limit: closed without a reply
    with pytest.raises(ProtocolError) as exc:
        parser.next_command()
    assert exc.value.reply is None
    assert "query buffer" in exc.value.message
    assert parser.buffered() == 0
    with pytest.raises(ProtocolError) as again:
        parser.next_command()
    assert (again.value.reply, again.value.message) == (None, exc.value.message)


@FAST_AND_EXACT
def test_query_buffer_limit_counts_parsed_args(use_hiredis):
    # Arguments of a partial command count, so many medium args cannot add up.
    parser = RequestParser(use_hiredis=use_hiredis, query_buffer_limit=10_000)
    parser.feed(b"*100\r\n")
    for _ in range(9):
        parser.feed(enc([b"x" * 1000])[4:])
        assert parser.next_command() is NEED_DATA
    assert parser.buffered() >= 9000
    parser.feed(enc([b"x" * 1000])[4:])
    with pytest.raises(ProtocolError) as exc:
        parser.next_command()
    assert exc.value.reply is None


@FAST_AND_EXACT
def test_query_buffer_limit_set_at_runtime(use_hiredis):
    parser = RequestParser(use_hiredis=use_hiredis)
    parser.feed(b"*1\r\n$100\r\n" + b"x" * 50)
    assert parser.next_command() is NEED_DATA
    parser.query_buffer_limit = 60
    parser.feed(b"x" * 20)
    with pytest.raises(ProtocolError):
        parser.next_command()


@FAST_AND_EXACT
def test_proto_max_bulk_len_at_runtime(use_hiredis):
    parser = RequestParser(use_hiredis=use_hiredis, proto_max_bulk_len=10)
    parser.feed(enc([b"SET", b"k", b"0123456789"]))
    assert parser.next_command() == [b"SET", b"k", b"0123456789"]
    parser.proto_max_bulk_len = 9
    parser.feed(enc([b"SET", b"k", b"0123456789"]))
    with pytest.raises(ProtocolError, match="invalid bulk length"):
        parser.next_command()


@FAST_AND_EXACT
def test_auth_limits(use_hiredis):
    def run(data, authenticated):
        return events(data, use_hiredis=use_hiredis, authenticated=authenticated)

    eleven = [b"DEL", *[b"k%d" % i for i in range(10)]]
    assert run(enc(eleven[:10]), False) == [eleven[:10]]
    assert run(enc(eleven), False) == [err(PE + b"unauthenticated multibulk length")]
    assert run(enc(eleven), True) == [eleven]
    assert run(b"*11\r\n", False) == [err(PE + b"unauthenticated multibulk length")]
    assert run(b"*-11\r\nPING\r\n", False) == [[b"PING"]]
    assert run(b"*3000000000\r\n", False) == [err(PE + b"invalid multibulk length")]
    ok = [b"SET", b"k", b"v" * 16384]
    big = [b"SET", b"k", b"v" * 16385]
    assert run(enc(ok), False) == [ok]
    assert run(enc(big), False) == [err(PE + b"unauthenticated bulk length")]
    assert run(enc(big), True) == [big]
    assert run(b"*1\r\n$16385\r\n", False) == [err(PE + b"unauthenticated bulk length")]
    assert run(b"*1\r\n$-1\r\n", False) == [err(PE + b"invalid bulk length")]
    # Inline requests have no such limit (only the 64 KiB line limit).
    assert run(b"SET k " + b"v" * 20000 + b"\r\n", False) == [[b"SET", b"k", b"v" * 20000]]


@FAST_AND_EXACT
def test_auth_in_pipeline_changes_limits_for_next_command(use_hiredis):
    eleven = [b"DEL", *[b"k%d" % i for i in range(10)]]
    big = [b"SET", b"k", b"v" * 20000]
    data = enc([b"AUTH", b"pw"]) + enc(eleven) + enc(big) + enc([b"AUTH", b"x"]) + enc(eleven)
    parser = RequestParser(use_hiredis=use_hiredis, authenticated=False)
    parser.feed(data)
    assert parser.next_command() == [b"AUTH", b"pw"]
    parser.authenticated = True
    assert parser.next_command() == eleven
    assert parser.next_command() == big
    assert parser.next_command() == [b"AUTH", b"x"]
    parser.authenticated = False
    with pytest.raises(ProtocolError, match="unauthenticated multibulk length"):
        parser.next_command()


def test_feed_accepts_buffers_and_copies_them():
    parser = RequestParser()
    scratch = bytearray(b"*1\r\n$4\r\nPING\r\n")
    parser.feed(memoryview(scratch)[:10])
    scratch[:] = b"X" * len(scratch)  # the caller reuses its buffer
    parser.feed(b"NG\r\n")
    assert parser.next_command() == [b"PING"]
    parser.feed(bytearray(b"PING\r\n"))
    assert parser.next_command() == [b"PING"]


# ---------------------------------------------------------------------------
# The hiredis fast path.
# ---------------------------------------------------------------------------


def test_hiredis_is_as_strict_as_redis():
    # The fast path relies on this: a request that hiredis decodes into an
    # array of bulk strings is laid out canonically, so its length is known.
    for bad in (b"*01\r\n", b"*+1\r\n", b"*-0\r\n", b"* 1\r\n", b"*1 \r\n", b"*\r\n"):
        reader = hiredis.Reader()
        reader.feed(bad + b"$1\r\na\r\n")
        with pytest.raises(hiredis.ProtocolError):
            reader.gets()
    for bad in (b"$01", b"$+1", b"$ 1", b"$1 ", b"$-0", b"$"):
        reader = hiredis.Reader()
        reader.feed(b"*1\r\n" + bad + b"\r\na\r\n")
        with pytest.raises(hiredis.ProtocolError):
            reader.gets()


def _fast_path_spans(data: bytes):
    """(start, end, command) of each command that the fast path accepted."""
    parser = RequestParser(use_hiredis=True)
    parser.feed(data)  # one feed: positions stay valid
    spans = []
    while True:
        start = parser._pos
        fast = parser._reader is not None or (start < len(data) and data[start] == ord("*"))
        try:
            cmd = parser.next_command()
        except ProtocolError:
            break
        if cmd is NEED_DATA:
            break
        if fast and parser._reader is not None:
            spans.append((start, parser._pos, cmd))
    return spans


def _matches_canonical(raw: bytes, cmd) -> bool:
    # Equal to enc(cmd) except for the two unchecked bytes after each payload.
    canonical = enc(cmd)
    if len(raw) != len(canonical):
        return False
    offset = len(b"*%d\r\n" % len(cmd))
    if raw[:offset] != canonical[:offset]:
        return False
    for arg in cmd:
        head = b"$%d\r\n" % len(arg)
        size = len(head) + len(arg)
        if raw[offset : offset + size] != canonical[offset : offset + size]:
            return False
        offset += size + 2
    return True


def test_fast_path_used_and_canonical():
    rng = random.Random(3)
    commands = [[rng.randbytes(rng.randrange(0, 3000)) for _ in range(rng.randrange(1, 5))] for _ in range(300)]
    data = b"".join(enc(c) for c in commands)
    spans = _fast_path_spans(data)
    assert len(spans) >= 250  # most go through hiredis
    for start, end, cmd in spans:
        assert _matches_canonical(data[start:end], cmd)


def count_exact_calls(monkeypatch) -> list:
    """Make RequestParser._exact append to the returned list on every call."""
    calls: list = []
    original = RequestParser._exact

    def counting(self):
        calls.append(1)
        return original(self)

    monkeypatch.setattr(RequestParser, "_exact", counting)
    return calls


def test_fast_path_does_not_call_exact_parser(monkeypatch):
    calls = count_exact_calls(monkeypatch)
    parser = RequestParser()
    batch = enc([b"SET", b"key", b"v" * 100]) * 16
    for _ in range(10):
        parser.feed(batch)
        out: list = []
        drain(parser, out)
        assert len(out) == 16
    assert calls == []


def test_fast_path_falls_back_on_partial_request():
    parser = RequestParser()
    data = enc([b"SET", b"key", b"v" * 100]) * 3
    parser.feed(data[:-10])
    assert parser.next_command() == [b"SET", b"key", b"v" * 100]
    assert parser.next_command() == [b"SET", b"key", b"v" * 100]
    assert parser.next_command() is NEED_DATA
    assert parser._reader is None  # the exact parser owns the partial request
    # The SET and key arguments, and 92 bytes of the value (its $100 header is consumed).
    assert parser.buffered() == 3 + 3 + 92
    parser.feed(data[-10:] + data)
    out: list = []
    drain(parser, out)
    assert out == [[b"SET", b"key", b"v" * 100]] * 4
    assert parser._reader is not None  # back on the fast path


BIG_AGGREGATES = [
    b"*2147483647\r\n$1\r\nx\r\n",  # valid for Redis: it waits for the rest
    b"*1\r\n*2147483647\r\n$1\r\nx\r\n",
    b"*2\r\n$1\r\nx\r\n>2147483647\r\n$1\r\nx\r\n",
    b"*2\r\n$1\r\nxAB~2147483647\r\n$1\r\nx\r\n",  # after the 2 unchecked bytes
    b"*2\r\n$1\r\nx\r\n|4000000000\r\n$1\r\nx\r\n",
    b"*3\r\n$1\r\nx\r\n%4000000000\r\n$1\r\nx\r\n",
]


class _SpyReader:
    """A hiredis.Reader that records everything it is fed."""

    def __init__(self, streams: list):
        self._real = hiredis.Reader()
        self.stream = bytearray()
        streams.append(self.stream)

    def feed(self, buf, off=0, length=-1):
        end = len(buf) if length < 0 else off + length
        self.stream.extend(buf[off:end])
        self._real.feed(buf, off, end - off)

    def gets(self):
        return self._real.gets()


class SpyReaders:
    """Stands in for the hiredis module: records what each Reader is fed."""

    HiredisError = hiredis.HiredisError

    def __init__(self):
        self.streams: list[bytearray] = []

    def Reader(self):  # hiredis.Reader
        return _SpyReader(self.streams)


def _shown_big_aggregate(streams) -> bool:
    return any(re.search(rb"[*~>|%][1-9][0-9]{5}", bytes(s)) for s in streams)


@pytest.mark.parametrize("data", BIG_AGGREGATES)
@pytest.mark.parametrize("chunks", [None, 1, 7])
def test_big_aggregate_headers_never_reach_hiredis(data, chunks, monkeypatch):
    # hiredis-py allocates a list of the announced size and frees it slot by
    # slot (seconds for 2**31): the guard must keep such headers from it.
    import pfxcache.protocol.requests as requests_module

    spy = SpyReaders()
    monkeypatch.setattr(requests_module, "hiredis", spy)
    started = time.perf_counter()
    fast = events(data + TRAILER, chunks, use_hiredis=True)
    assert time.perf_counter() - started < 0.5
    assert spy.streams  # the fast path was tried...
    assert not _shown_big_aggregate(spy.streams)  # ...but never saw the header
    assert fast == events(data + TRAILER, chunks, use_hiredis=False)


def test_guard_keeps_commands_before_a_big_header_on_the_fast_path(monkeypatch):
    calls = []
    original = RequestParser._exact

    def counting(self):
        calls.append(self._pos)
        return original(self)

    monkeypatch.setattr(RequestParser, "_exact", counting)
    # A value that looks like a big aggregate header is fine: only the
    # request containing it goes through the exact parser.
    commands = [[b"SET", b"k%d" % i, b"v"] for i in range(20)]
    commands[10][2] = b"price *1234567 units"
    data = b"".join(enc(c) for c in commands)
    assert events(data) == commands
    assert len(calls) == 1


def test_big_requests_switch_to_exact_parser_and_back(monkeypatch):
    calls = count_exact_calls(monkeypatch)
    parser = RequestParser()
    big = enc([b"SET", b"k", b"v" * 100_000])
    small = enc([b"GET", b"k"])
    parser.feed(big * 5)
    out: list = []
    drain(parser, out)
    assert len(out) == 5
    exact_calls = len(calls)
    assert exact_calls >= 5  # big requests go to the exact parser...
    parser.feed(small * 50)
    out = []
    drain(parser, out)
    assert out == [[b"GET", b"k"]] * 50
    assert len(calls) - exact_calls <= 2  # ...and small ones back to hiredis


# ---------------------------------------------------------------------------
# Properties.
# ---------------------------------------------------------------------------

_args = st.one_of(
    st.binary(max_size=30),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=3), st.integers(1000, 40000)),
)
_commands = st.lists(st.lists(_args, min_size=1, max_size=5), max_size=12)


@given(_commands, st.data())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_roundtrip_random_splits(commands, data):
    stream = b"".join(enc(c) for c in commands)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    for use_hiredis in (True, False):
        assert events(stream, cuts, use_hiredis=use_hiredis) == commands


_tokens = st.sampled_from(
    [
        b"*", b"*1", b"*2", b"*3", b"*0", b"*-1", b"*11", b"$", b"$0", b"$1", b"$3", b"$4",
        b"$-1", b"$01", b"+", b"-", b":", b"=", b"%", b"~", b">", b"_", b",", b"#", b"(",
        b"\r\n", b"\r", b"\n", b"\r\n", b"\r\n", b" ", b"\t", b"\x0b", b"\x00", b"0", b"1",
        b"PING", b"foo", b'"', b"'", b"\\", b"\\x41", b"\\n", b"txt:",
        b"*100000", b"~999999", b">1234567", b"$100000", b"123456",
    ]
)
_garbage = st.lists(
    st.one_of(_tokens, st.binary(min_size=1, max_size=4), st.lists(_args, min_size=1, max_size=3).map(enc)),
    max_size=40,
).map(b"".join)


@given(_garbage, st.data(), st.booleans())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fast_and_exact_agree_on_random_streams(stream, data, authenticated):
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    kwargs = {"authenticated": authenticated, "inline_max": 64}
    exact_whole = events(stream, use_hiredis=False, **kwargs)
    assert events(stream, use_hiredis=True, **kwargs) == exact_whole
    # The outcome does not depend on how the bytes are split either.
    assert events(stream, cuts, use_hiredis=True, **kwargs) == exact_whole
    assert events(stream, cuts, use_hiredis=False, **kwargs) == exact_whole
    # Whatever the fast path accepted was canonical.
    for start, end, cmd in _fast_path_spans(stream):
        assert _matches_canonical(stream[start:end], cmd)


# ---------------------------------------------------------------------------
# Differential tests against a real redis-server.
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def redis_port():
    server = start_redis_server()
    yield server.port
    server.stop()


@pytest.fixture(scope="module")
def redis_auth_port():
    server = start_redis_server("--requirepass", "pw")
    yield server.port
    server.stop()


def _expected_from_parser(data: bytes, authenticated: bool):
    """(number of commands, error reply or None) according to the parser."""
    out = events(data, authenticated=authenticated)
    commands = [e for e in out if type(e) is list]
    error = out[-1][1] if out and type(out[-1]) is tuple else None
    return len(commands), error


def _exchange_many(port: int, cases: list[bytes], expectations) -> list:
    """Send each case on its own connection, all at once; collect (replies, closed).

    Waits until each connection has what the parser predicts (a reply line per
    command, then the error and EOF), or until a deadline, so that a passing
    run is fast and a failing one still sees whatever Redis sent.
    """
    conns = []
    for data in cases:
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(data)
        conns.append(conn)
    received = [b""] * len(cases)
    closed = [False] * len(cases)

    def satisfied(i):
        ncommands, error = expectations[i]
        lines = received[i].count(b"\r\n")
        if error is None:
            return lines >= ncommands
        return closed[i]

    deadline = time.monotonic() + 5
    selector = selectors.DefaultSelector()  # not select(): more than 1024 fds
    for i, conn in enumerate(conns):
        selector.register(conn, selectors.EVENT_READ, i)
    try:
        while time.monotonic() < deadline:
            if all(closed[i] or satisfied(i) for i in range(len(cases))):
                break
            for key, _ in selector.select(0.1):
                i = key.data
                try:
                    chunk = conns[i].recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    received[i] += chunk
                else:
                    closed[i] = True
                    selector.unregister(conns[i])
        # Connections expected to stay open: make sure nothing else comes.
        time.sleep(0.2)
        for i, conn in enumerate(conns):
            if closed[i]:
                continue
            conn.setblocking(False)
            try:
                while True:
                    chunk = conn.recv(65536)
                    if not chunk:
                        closed[i] = True
                        break
                    received[i] += chunk
            except (BlockingIOError, ConnectionResetError):
                pass
    finally:
        selector.close()
        for conn in conns:
            conn.close()
    return list(zip(received, closed))


def _compare(port, cases, authenticated):
    expectations = [_expected_from_parser(data, authenticated) for data in cases]
    results = _exchange_many(port, cases, expectations)
    mismatches = []
    for data, (ncommands, error), (reply, closed) in zip(cases, expectations, results):
        lines = reply.split(b"\r\n")[:-1]
        if error is None:
            ok = not closed and len(lines) == ncommands and not any(
                line.startswith(b"-ERR Protocol error") for line in lines
            )
        else:
            ok = closed and len(lines) == ncommands + 1 and reply.endswith(error)
        if not ok:
            mismatches.append((data[:80], ncommands, error, reply[-200:], closed))
    assert mismatches == []


def test_table_against_redis(redis_port):
    cases = []
    for _, data, _, _ in TABLE:
        cases.append(data)
        if len(data) < 1000:  # (trailers after huge lines could reach Redis in other read splits)
            cases.append(data + TRAILER)
    cases += [data for data, _ in QUIRKS]
    _compare(redis_port, cases, authenticated=True)


def test_table_rows_exact_reply_bytes(redis_port):
    # For rows without commands, the whole reply must be just the error.
    rows = [(data, error) for _, data, commands, error in TABLE if error and not commands]
    results = _exchange_many(redis_port, [d for d, _ in rows], [(0, e[1]) for _, e in rows])
    for (data, error), (reply, closed) in zip(rows, results):
        assert (reply, closed) == (error[1], True), data[:40]


def test_auth_limits_against_redis(redis_auth_port):
    eleven = enc([b"DEL", *[b"k%d" % i for i in range(10)]])
    cases = [
        b"*11\r\n",
        b"*10\r\n",
        b"*-11\r\n",
        b"*1\r\n$16385\r\n",
        b"*1\r\n$16384\r\n",
        eleven,
        enc([b"SET", b"k", b"v" * 16385]),
        b"*3000000000\r\n",
        b"*1\r\n$-1\r\n",
    ]
    _compare(redis_auth_port, cases, authenticated=False)
    # After AUTH in the same pipeline the limits are gone (the parser is told by the caller).
    auth = enc([b"AUTH", b"pw"])
    results = _exchange_many(redis_auth_port, [auth + eleven], [(2, None)])
    assert results == [(b"+OK\r\n:0\r\n", False)]


def _random_stream(rng: random.Random) -> bytes:
    tokens = [
        b"*", b"*1", b"*2", b"*0", b"*-1", b"$", b"$0", b"$1", b"$2", b"$3", b"$-1", b"$01",
        b"\r\n", b"\r\n", b"\r\n", b"\r", b"\n", b" ", b"\t", b"\x0b", b"\x00", b"0", b"1",
        b"x", b"zz", b'"', b"'", b"\\", b"\\x41", b"\\n", b"+", b"-", b":", b"\xff",
    ]
    parts = []
    for _ in range(rng.randrange(1, 30)):
        roll = rng.random()
        if roll < 0.15:
            args = [rng.choice([b"x", b"zz", b"", b"x\r\ny", b"\x00"]) for _ in range(rng.randrange(1, 4))]
            parts.append(enc(args))
        else:
            parts.append(rng.choice(tokens))
    return b"".join(parts)


def test_random_streams_against_redis(redis_port):
    # Command names are made of x/z/digits/punctuation: never a real command,
    # so Redis answers each with one "unknown command" error line.
    rng = random.Random(1234)
    cases = [_random_stream(rng) for _ in range(600)]
    _compare(redis_port, cases, authenticated=True)


@pytest.mark.parametrize(
    "first,second",
    [
        (b"*" + b"1" * (64 * KIB - 1), b"\r\n"),  # '\r' is byte 64 Ki + 1: still seen
        (b"*" + b"1" * (64 * KIB), b"\r\n"),  # one more: too big
        (b"*1\r\n$" + b"1" * (64 * KIB - 1), b"\r\n"),
        (b"*1\r\n$" + b"1" * (64 * KIB), b"\r\n"),
        (b"ECHO " + b"a" * (64 * KIB - 5), b"\n"),
        (b"ECHO " + b"a" * (64 * KIB - 4), b"\n"),
    ],
)
def test_line_limit_boundary_against_redis(redis_port, first, second):
    # Sent in two steps, so that Redis has looked at the first part before
    # the line end arrives, as the parser sees it whatever the chunking.
    expected = events(first + second)
    with socket.create_connection(("127.0.0.1", redis_port)) as conn:
        conn.sendall(first)
        time.sleep(0.1)
        try:
            conn.sendall(second)
        except OSError:
            pass  # already closed by Redis
        conn.settimeout(0.5)
        reply = b""
        closed = False
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    closed = True
                    break
                reply += chunk
        except TimeoutError:
            pass
        except ConnectionResetError:
            closed = True
    if type(expected[-1]) is tuple:
        assert (reply, closed) == (expected[-1][1], True)
    else:
        [[command, arg]] = expected
        assert command == b"ECHO"
        assert (reply, closed) == (b"$%d\r\n%s\r\n" % (len(arg), arg), False)
