"""Tests of pfxcache.protocol.replies: RESP2 / RESP3 encoding of reply values."""

from __future__ import annotations

import math
import os
import socket

import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pfxcache.protocol.replies import (
    NULL_ARRAY,
    OK,
    PONG,
    SCATTER_THRESHOLD,
    Error,
    Push,
    ReplyBuffer,
    Set,
    ShortestDouble,
    SimpleString,
    Verbatim,
    encode,
    encode_into,
    encode_many,
)
from pfxcache.testing import start_redis_server

INCOMPLETE = object()


def new_reader() -> hiredis.Reader:
    # A sentinel for "incomplete": by default hiredis returns False, which is
    # also how it decodes the RESP3 boolean "#f".
    return hiredis.Reader(notEnoughData=INCOMPLETE)


def decode(data: bytes):
    """Decode one reply with hiredis, checking that it is exactly one reply."""
    reader = new_reader()
    reader.feed(data)
    value = reader.gets()
    assert value is not INCOMPLETE, data
    assert reader.gets() is INCOMPLETE, data  # nothing left over
    return value


# (value, RESP2 bytes, RESP3 bytes)
CASES = [
    (OK, b"+OK\r\n", b"+OK\r\n"),
    (PONG, b"+PONG\r\n", b"+PONG\r\n"),
    (SimpleString("QUEUED"), b"+QUEUED\r\n", b"+QUEUED\r\n"),
    (Error("ERR syntax error"), b"-ERR syntax error\r\n", b"-ERR syntax error\r\n"),
    (Error("ERR bad\r\nnews"), b"-ERR bad  news\r\n", b"-ERR bad  news\r\n"),
    (True, b":1\r\n", b"#t\r\n"),
    (False, b":0\r\n", b"#f\r\n"),
    (0, b":0\r\n", b":0\r\n"),
    (-42, b":-42\r\n", b":-42\r\n"),
    (2**63 - 1, b":9223372036854775807\r\n", b":9223372036854775807\r\n"),
    (-(2**63), b":-9223372036854775808\r\n", b":-9223372036854775808\r\n"),
    # Plain floats as redis-server 7.0.15 writes doubles: "%.17g".
    (1.5, b"$3\r\n1.5\r\n", b",1.5\r\n"),
    (3.0, b"$1\r\n3\r\n", b",3\r\n"),
    (0.1, b"$19\r\n0.10000000000000001\r\n", b",0.10000000000000001\r\n"),
    (0.8, b"$19\r\n0.80000000000000004\r\n", b",0.80000000000000004\r\n"),
    (-0.0, b"$2\r\n-0\r\n", b",-0\r\n"),
    (1e20, b"$5\r\n1e+20\r\n", b",1e+20\r\n"),
    (1.5e-7, b"$22\r\n1.4999999999999999e-07\r\n", b",1.4999999999999999e-07\r\n"),
    # pfxcached's own doubles (ShortestDouble) as Redis 7.2's d2string writes them: the shortest text that reads back as the same double.
    (ShortestDouble(1.5), b"$3\r\n1.5\r\n", b",1.5\r\n"),
    (ShortestDouble(3.0), b"$1\r\n3\r\n", b",3\r\n"),
    (ShortestDouble(0.1), b"$3\r\n0.1\r\n", b",0.1\r\n"),
    (ShortestDouble(0.8), b"$3\r\n0.8\r\n", b",0.8\r\n"),
    (ShortestDouble(0.1 + 0.2), b"$19\r\n0.30000000000000004\r\n", b",0.30000000000000004\r\n"),
    (ShortestDouble(-2.25), b"$5\r\n-2.25\r\n", b",-2.25\r\n"),
    (ShortestDouble(-0.0), b"$2\r\n-0\r\n", b",-0\r\n"),
    (ShortestDouble(0.0), b"$1\r\n0\r\n", b",0\r\n"),
    (ShortestDouble(1e16), b"$17\r\n10000000000000000\r\n", b",10000000000000000\r\n"),
    (ShortestDouble(2.0**62), b"$19\r\n4611686018427387904\r\n", b",4611686018427387904\r\n"),
    (ShortestDouble(5e18), b"$5\r\n5e+18\r\n", b",5e+18\r\n"),
    (ShortestDouble(1.2345678901234567e19), b"$20\r\n12345678901234567000\r\n", b",12345678901234567000\r\n"),
    (ShortestDouble(1e20), b"$5\r\n1e+20\r\n", b",1e+20\r\n"),
    (ShortestDouble(1e300), b"$6\r\n1e+300\r\n", b",1e+300\r\n"),
    (ShortestDouble(1e-5), b"$7\r\n0.00001\r\n", b",0.00001\r\n"),
    (ShortestDouble(1.5e-7), b"$6\r\n1.5e-7\r\n", b",1.5e-7\r\n"),
    (ShortestDouble(-1e-300), b"$7\r\n-1e-300\r\n", b",-1e-300\r\n"),
    (math.inf, b"$3\r\ninf\r\n", b",inf\r\n"),
    (-math.inf, b"$4\r\n-inf\r\n", b",-inf\r\n"),
    (b"", b"$0\r\n\r\n", b"$0\r\n\r\n"),
    (b"a\r\nb", b"$4\r\na\r\nb\r\n", b"$4\r\na\r\nb\r\n"),
    ("caf\u00e9", b"$5\r\ncaf\xc3\xa9\r\n", b"$5\r\ncaf\xc3\xa9\r\n"),
    (bytearray(b"xy"), b"$2\r\nxy\r\n", b"$2\r\nxy\r\n"),
    (memoryview(b"xyz")[1:], b"$2\r\nyz\r\n", b"$2\r\nyz\r\n"),
    (None, b"$-1\r\n", b"_\r\n"),
    (NULL_ARRAY, b"*-1\r\n", b"_\r\n"),
    ([], b"*0\r\n", b"*0\r\n"),
    ((), b"*0\r\n", b"*0\r\n"),
    ([1, [b"a", None]], b"*2\r\n:1\r\n*2\r\n$1\r\na\r\n$-1\r\n", b"*2\r\n:1\r\n*2\r\n$1\r\na\r\n_\r\n"),
    ({}, b"*0\r\n", b"%0\r\n"),
    (
        {b"k": 1, b"f": 2.5},
        b"*4\r\n$1\r\nk\r\n:1\r\n$1\r\nf\r\n$3\r\n2.5\r\n",
        b"%2\r\n$1\r\nk\r\n:1\r\n$1\r\nf\r\n,2.5\r\n",
    ),
    ({b"b", b"a"}, b"*2\r\n$1\r\na\r\n$1\r\nb\r\n", b"~2\r\n$1\r\na\r\n$1\r\nb\r\n"),
    (frozenset(), b"*0\r\n", b"~0\r\n"),
    (Set([b"z", b"a"]), b"*2\r\n$1\r\nz\r\n$1\r\na\r\n", b"~2\r\n$1\r\nz\r\n$1\r\na\r\n"),
    (Verbatim("hello"), b"$5\r\nhello\r\n", b"=9\r\ntxt:hello\r\n"),
    (Verbatim(b"# x", "mkd"), b"$3\r\n# x\r\n", b"=7\r\nmkd:# x\r\n"),
    (
        Push([b"message", b"ch", b"hi"]),
        b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n",
        b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n",
    ),
    (
        {b"nested": {b"set": Set([True]), b"null": None}},
        b"*2\r\n$6\r\nnested\r\n*4\r\n$3\r\nset\r\n*1\r\n:1\r\n$4\r\nnull\r\n$-1\r\n",
        b"%1\r\n$6\r\nnested\r\n%2\r\n$3\r\nset\r\n~1\r\n#t\r\n$4\r\nnull\r\n_\r\n",
    ),
]


@pytest.mark.parametrize("value,resp2,resp3", CASES, ids=[repr(c[0])[:40] for c in CASES])
def test_encode_bytes(value, resp2, resp3):
    assert encode(value, 2) == resp2
    assert encode(value, 3) == resp3
    assert encode(value) == resp2  # RESP2 is the default


def _expected_decoded(value, resp: int):
    """What hiredis should decode from the encoding of ``value``."""
    if isinstance(value, SimpleString):
        return value.text.encode()
    if isinstance(value, Error):
        return ("error", value.message.replace("\r", " ").replace("\n", " "))
    if isinstance(value, bool):
        return value if resp == 3 else int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if resp == 3:
            return value
        if isinstance(value, ShortestDouble):
            return _ShortestText(value)
        return (b"%.17g" % value) if math.isfinite(value) else (b"inf" if value > 0 else b"-inf")
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if value is None or value is NULL_ARRAY:
        return None
    if isinstance(value, (list, tuple)):
        return [_expected_decoded(v, resp) for v in value]
    if isinstance(value, dict):
        if resp == 3:
            return {_expected_decoded(k, resp): _expected_decoded(v, resp) for k, v in value.items()}
        return [x for k, v in value.items() for x in (_expected_decoded(k, resp), _expected_decoded(v, resp))]
    if isinstance(value, (set, frozenset)):
        return [_expected_decoded(v, resp) for v in sorted(value)]
    if isinstance(value, (Set, Push)):
        return [_expected_decoded(v, resp) for v in value.items]
    if isinstance(value, Verbatim):
        text = value.text.encode() if isinstance(value.text, str) else value.text
        return text
    raise AssertionError(value)


def _digits(text: str) -> int:
    """The significant digits of a decimal number's text (``-1.50e-7``: 2)."""
    return len(text.lower().split("e")[0].lstrip("-").replace(".", "").strip("0"))


class _ShortestText:
    """Equal to the RESP2 text of a double: a whole number up to 2**62 as an integer
    (Redis's double2ll), else text that reads back as that double with no more
    significant digits than Python's shortest round-trip ``repr``."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, bytes):
            return NotImplemented
        if not math.isfinite(self.value):
            return other == (b"inf" if self.value > 0 else b"-inf")
        if self.value == int(self.value) and abs(self.value) <= 2.0**62:
            return other == b"%d" % int(self.value) if self.value or str(self.value)[0] != "-" else other == b"-0"
        return float(other) == self.value and _digits(other.decode()) <= _digits(repr(self.value))

    def __repr__(self) -> str:
        return f"shortest text of {self.value!r}"


def _normalise(decoded):
    if isinstance(decoded, hiredis.ReplyError):
        return ("error", str(decoded))
    if isinstance(decoded, list):  # hiredis.PushNotification is a list too
        return [_normalise(v) for v in decoded]
    if isinstance(decoded, dict):
        return {k: _normalise(v) for k, v in decoded.items()}
    return decoded


@pytest.mark.parametrize("value,resp2,resp3", CASES, ids=[repr(c[0])[:40] for c in CASES])
@pytest.mark.parametrize("resp", [2, 3])
def test_hiredis_decodes_encoding(value, resp2, resp3, resp):
    decoded = _normalise(decode(encode(value, resp)))
    expected = _expected_decoded(value, resp)
    if isinstance(value, bool) and resp == 3:
        assert decoded is value
    assert decoded == expected


def test_nan():
    assert encode(math.nan, 3) == b",nan\r\n"
    assert encode(math.nan, 2) == b"$3\r\nnan\r\n"
    assert math.isnan(decode(encode(math.nan, 3)))


def test_bool_is_not_an_int_here():
    assert encode([True, 1, False, 0], 3) == b"*4\r\n#t\r\n:1\r\n#f\r\n:0\r\n"


def test_unencodable_value():
    with pytest.raises(TypeError):
        encode(object())


def test_encode_many():
    data = encode_many([OK, 1, None, [b"a"]], resp=3)
    assert data == b"+OK\r\n:1\r\n_\r\n*1\r\n$1\r\na\r\n"
    reader = new_reader()
    reader.feed(data)
    assert [reader.gets() for _ in range(4)] == [b"OK", 1, None, [b"a"]]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.binary(max_size=40)
    | st.floats(allow_nan=False) | st.floats(allow_nan=False).map(ShortestDouble),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.binary(max_size=8), children, max_size=4),
    max_leaves=25,
)


@given(_json, st.sampled_from([2, 3]))
@settings(max_examples=300, deadline=None)
def test_random_values_roundtrip_through_hiredis(value, resp):
    # (Floats: the shortest round-trip text is enough digits for hiredis to get the same double back.)
    assert _normalise(decode(encode(value, resp))) == _expected_decoded(value, resp)


# ---------------------------------------------------------------------------
# ReplyBuffer: large bulks as separate, uncopied chunks.
# ---------------------------------------------------------------------------


def test_small_replies_are_one_chunk():
    buf = ReplyBuffer()
    for value in (OK, b"x" * 100, [1, 2, 3], {b"a": b"b"}):
        encode_into(buf, value, 2)
    assert len(buf) == sum(len(encode(v)) for v in (OK, b"x" * 100, [1, 2, 3], {b"a": b"b"}))
    chunks = buf.take()
    assert len(chunks) == 1
    assert len(buf) == 0 and buf.take() == []


@pytest.mark.parametrize("make", [bytes, bytearray, lambda b: memoryview(b)], ids=["bytes", "bytearray", "memoryview"])
def test_large_bulk_is_a_separate_memoryview(make):
    payload = make(os.urandom(SCATTER_THRESHOLD))
    buf = ReplyBuffer()
    encode_into(buf, OK, 2)
    encode_into(buf, payload, 2)
    encode_into(buf, 7, 2)
    total = len(buf)
    chunks = buf.take()
    assert [type(c) for c in chunks] == [bytearray, memoryview, bytearray]
    assert bytes(chunks[0]) == b"+OK\r\n$%d\r\n" % SCATTER_THRESHOLD
    big = chunks[1]
    assert big.nbytes == SCATTER_THRESHOLD and big.format == "B"
    # Not copied: the view is over the caller's object.
    assert big.obj is (payload.obj if isinstance(payload, memoryview) else payload)
    assert bytes(chunks[2]) == b"\r\n:7\r\n"
    data = b"".join(bytes(c) for c in chunks)
    assert len(data) == total
    assert decode(data[5 : -len(b":7\r\n")]) == bytes(payload)


def test_bulk_just_below_threshold_is_copied():
    buf = ReplyBuffer()
    encode_into(buf, b"x" * (SCATTER_THRESHOLD - 1), 2)
    chunks = buf.take()
    assert len(chunks) == 1 and not isinstance(chunks[0], memoryview)


def test_large_bulks_inside_arrays_and_resp3_verbatim():
    big = os.urandom(SCATTER_THRESHOLD * 2)
    buf = ReplyBuffer()
    encode_into(buf, [b"k", big, b"v", big], 3)
    encode_into(buf, Verbatim(big), 3)
    chunks = buf.take()
    views = [c for c in chunks if isinstance(c, memoryview)]
    assert len(views) == 3 and all(v.obj is big for v in views)
    data = b"".join(bytes(c) for c in chunks)
    reader = new_reader()
    reader.feed(data)
    assert reader.gets() == [b"k", big, b"v", big]
    assert reader.gets() == big  # hiredis strips the "txt:" of verbatim strings
    assert reader.gets() is INCOMPLETE


def test_large_str_and_float_formatting_in_big_arrays():
    values = [1.5] * 3 + ["x" * SCATTER_THRESHOLD]
    assert decode(encode(values, 2)) == [b"1.5"] * 3 + [b"x" * SCATTER_THRESHOLD]
    assert decode(encode(values, 3)) == [1.5] * 3 + [b"x" * SCATTER_THRESHOLD]


# ---------------------------------------------------------------------------
# The downgrade rules, checked against a real redis-server.
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def redis_conn_factory():
    server = start_redis_server()
    port = server.port

    def connect(resp: int):
        conn = socket.create_connection(("127.0.0.1", port), timeout=2)
        if resp == 3:
            conn.sendall(b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n")
            reader = new_reader()
            while reader.gets() is INCOMPLETE:
                reader.feed(conn.recv(65536))
        return conn

    yield connect
    server.stop()


def _call(conn, *args: bytes) -> bytes:
    conn.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
    data = b""
    reader = new_reader()
    while True:
        chunk = conn.recv(65536)
        data += chunk
        reader.feed(chunk)
        if reader.gets() is not INCOMPLETE:
            return data


@pytest.mark.parametrize("resp", [2, 3])
def test_matches_redis_server(redis_conn_factory, resp):
    conn = redis_conn_factory(resp)
    try:
        _call(conn, b"DEL", b"z", b"h", b"s", b"l")
        _call(conn, b"ZADD", b"z", b"1.5", b"m")
        _call(conn, b"HSET", b"h", b"f", b"v")
        _call(conn, b"SADD", b"s", b"only")
        checks = [
            ((b"PING",), PONG),
            ((b"SET", b"k", b"v"), OK),
            ((b"GET", b"k"), b"v"),
            ((b"GET", b"missing"), None),
            ((b"ZSCORE", b"z", b"m"), 1.5),
            ((b"ZINCRBY", b"z", b"inf", b"m"), math.inf),
            ((b"HGETALL", b"h"), {b"f": b"v"}),
            ((b"SMEMBERS", b"s"), Set([b"only"])),
            ((b"BLPOP", b"l", b"0.01"), NULL_ARRAY),
            ((b"EXISTS", b"k"), 1),
            ((b"EVAL", b"return redis.setresp(3) or true", b"0"), True),
            ((b"EVAL", b"redis.setresp(3); return false", b"0"), False),
            ((b"LPUSH",), Error("ERR wrong number of arguments for 'lpush' command")),
        ]
        for command, value in checks:
            assert _call(conn, *command) == encode(value, resp), command
    finally:
        conn.close()


def test_integer_array_is_an_array_of_integers_in_both_protocols():
    from array import array

    import hiredis

    ids = array("q", [0, 7, -3, 2**40])
    for resp in (2, 3):
        wire = encode(ids, resp)
        assert wire == b"*4\r\n:0\r\n:7\r\n:-3\r\n:1099511627776\r\n"
        reader = hiredis.Reader()
        reader.feed(wire)
        assert reader.gets() == [0, 7, -3, 2**40]
    assert encode(array("I"), 3) == b"*0\r\n"
    with pytest.raises(TypeError):
        encode(array("d", [1.0]), 3)


def test_text_with_escaped_client_bytes_encodes_back_to_those_bytes():
    # Found by tests/test_fuzz.py: an error quoting a non-UTF-8 argument (kept with surrogateescape)
    # must not raise UnicodeEncodeError (which cost the client its connection).
    from pfxcache.protocol.replies import Error, SimpleString

    quoted = b"\x80".decode("utf-8", "surrogateescape")
    assert encode(Error(f"ERR Unknown category '{quoted}'")) == b"-ERR Unknown category '\x80'\r\n"
    assert encode(SimpleString(quoted)) == b"+\x80\r\n"
    assert encode(quoted) == b"$1\r\n\x80\r\n"
