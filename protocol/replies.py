"""Reply values and their RESP2 / RESP3 encoding.

Command handlers return plain Python values; :func:`encode` turns them into
bytes for the connection's protocol version, applying Redis's downgrade of
RESP3 types for RESP2 clients:

==================  ========================  ===========================
Python value         RESP3                     RESP2
==================  ========================  ===========================
``SimpleString``     ``+text``                 same
``Error``            ``-CODE message``         same
``bool``             ``#t`` / ``#f``           ``:1`` / ``:0``
``int``              ``:n``                    same
``float``            ``,%.17g`` (``inf``)      bulk string of the same text
``ShortestDouble``   ``,0.8`` (shortest)       bulk string of the same text
``bytes``/``str``    ``$len`` bulk string      same
``None``             ``_`` null                ``$-1`` (null bulk)
``NULL_ARRAY``       ``_`` null                ``*-1`` (null array)
``list``/``tuple``   ``*n`` array              same
``array.array``      ``*n`` of integers         same
``IntArray``         ``*n`` of pre-encoded      same
                     integers
``dict``             ``%n`` map                flat ``*2n`` array
``set``/``Set``      ``~n`` set                ``*n`` array
``Verbatim``         ``=len`` ``txt:...``      bulk string
``Push``             ``>n`` push               ``*n`` array
``Replies``          each item, back to back   same
==================  ========================  ===========================

Attribute frames (``|``) are never produced: redis-py mishandles them.

Large bulk strings are not copied into the output: :func:`encode_into`
appends them to the chunk list as ``memoryview`` objects so the I/O layer can
hand them to ``sendmsg`` as scatter buffers.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from math import copysign, inf as _INF
from typing import Any, Iterable

__all__ = [
    "SimpleString",
    "Error",
    "Verbatim",
    "Push",
    "Replies",
    "Set",
    "IntArray",
    "encode_int_elements",
    "NULL_ARRAY",
    "OK",
    "PONG",
    "encode",
    "encode_into",
    "ReplyBuffer",
    "quoted",
    "ShortestDouble",
]

_NEG_INF = -_INF
_INT_TYPECODES = frozenset("bBhHiIlLqQ")

#: Bulk payloads at least this large are sent as their own scatter buffer
#: instead of being copied into the reply byte string.
SCATTER_THRESHOLD = 16 * 1024


@dataclass(frozen=True, slots=True)
class SimpleString:
    """A status reply such as ``+OK``; must not contain CR or LF."""

    text: str


def quoted(data: bytes) -> str:
    """A client's bytes as reply text (an error quoting an argument), echoed as sent.

    Bytes that are not UTF-8 become lone surrogates (``surrogateescape``),
    which the encoder turns back into the same bytes: redis-server quotes
    arguments byte for byte, never as U+FFFD.
    """
    return data.decode("utf-8", "surrogateescape")


@dataclass(frozen=True, slots=True)
class Error:
    """An error reply. ``message`` starts with its code: ``"ERR syntax error"``."""

    message: str

    @property
    def code(self) -> str:
        """The first word (``ERR``, ``WRONGTYPE``, ``NOAUTH`` ...), as INFO errorstats counts it."""
        return self.message.split(" ", 1)[0]


@dataclass(frozen=True, slots=True)
class Verbatim:
    """A RESP3 verbatim string (``INFO`` uses it); a bulk string for RESP2."""

    text: bytes | str
    format: str = "txt"


@dataclass(frozen=True, slots=True)
class Push:
    """An out-of-band RESP3 push message; an array for RESP2."""

    items: list


@dataclass(frozen=True, slots=True)
class Replies:
    """Several top-level replies to one command, in order (SUBSCRIBE a b answers once per channel)."""

    items: list


@dataclass(frozen=True, slots=True)
class ArrayHeader:
    """An array's header alone (``*count``), its elements sent as the replies after it.

    EXEC under CLIENT REPLY: Redis writes the header, then each element as its
    command runs, muted or not at that moment, so the count can exceed the
    elements that follow.
    """

    count: int


@dataclass(frozen=True, slots=True)
class Set:
    """A RESP3 set with a fixed order (Python sets have none)."""

    items: list


class IntArray:
    """An array of ``count`` integers whose elements are already encoded (:func:`encode_int_elements`).

    Integers encode the same in RESP2 and RESP3, so a long list of ids that
    recurs across replies (the block ids of a cached path) can be encoded in
    pieces once, kept, and joined per reply.
    """

    __slots__ = ("count", "body")

    def __init__(self, count: int, body: bytes) -> None:
        self.count = count
        self.body = body

    def __repr__(self) -> str:
        return f"IntArray({self.count} items)"


def encode_int_elements(values: Iterable[int]) -> bytes:
    """The RESP elements ``:v\r\n`` of the integers ``values``, back to back (one C-level join)."""
    text = "\r\n:".join(map(str, values))
    return b":%s\r\n" % text.encode() if text else b""


class _NullArray:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NULL_ARRAY"


#: The null that RESP2 encodes as ``*-1`` rather than ``$-1``.
NULL_ARRAY = _NullArray()

OK = SimpleString("OK")
PONG = SimpleString("PONG")

_CONSTANTS = {
    "OK": b"+OK\r\n",
    "PONG": b"+PONG\r\n",
}


#: Doubles within this magnitude that hold an integer are written as that integer (Redis's double2ll).
_INTEGRAL_DOUBLE_LIMIT = float((2**63 - 1) // 2)


def _format_double(value: float) -> bytes:
    # Redis 7.0 formats doubles with "%.17g" and spells infinities "inf"/"-inf".
    if value != value:
        return b"nan"
    if value in (_INF, _NEG_INF):
        return b"inf" if value > 0 else b"-inf"
    return (b"%.17g" % value)


class ShortestDouble(float):
    """A double written as redis-server 7.2 and later write doubles (``d2string``): the shortest text that
    reads back as it, so 0.8 is ``0.8`` where 7.0's ``%.17g`` writes ``0.80000000000000004``.

    Replies that redis-server 7.0.15 defines keep its ``%.17g`` (a plain ``float``); pfxcached's own
    commands use this, for people reading them in redis-cli. A client parses the same double either way.
    """

    __slots__ = ()


def _format_shortest(value: float) -> bytes:
    """``nan``, ``inf``/``-inf``, ``0``/``-0``; a whole number within :data:`_INTEGRAL_DOUBLE_LIMIT` as
    an integer; anything else as the shortest round-trip digits, laid out as ``fpconv_dtoa`` lays them
    out (:func:`_layout_digits`)."""
    if value != value or value in (_INF, _NEG_INF):
        return _format_double(value)
    if value == 0:
        return b"-0" if copysign(1.0, value) < 0 else b"0"
    if -_INTEGRAL_DOUBLE_LIMIT <= value <= _INTEGRAL_DOUBLE_LIMIT and value == int(value):
        return b"%d" % int(value)
    return _layout_digits(value)


def _layout_digits(value: float) -> bytes:
    # repr() gives the shortest digits that round-trip; value == int(digits) * 10**exponent.
    mantissa, _, exp_text = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    exponent = int(exp_text or 0) - len(fraction)
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    digits = stripped
    sign = "-" if value < 0 else ""
    ndigits = len(digits)
    magnitude = abs(exponent + ndigits - 1)  # the decimal exponent of the first digit
    if exponent >= 0 and magnitude < ndigits + 7:  # a plain integer
        return f"{sign}{digits}{'0' * exponent}".encode()
    if exponent < 0 and (exponent > -7 or magnitude < 4):  # a plain decimal
        point = ndigits + exponent
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}".encode()
        return f"{sign}{digits[:point]}.{digits[point:]}".encode()
    fraction = f".{digits[1:]}" if ndigits > 1 else ""  # scientific: 1.5e-7, 1e+300 (no padded exponent)
    return f"{sign}{digits[0]}{fraction}e{'-' if exponent + ndigits - 1 < 0 else '+'}{magnitude}".encode()


class ReplyBuffer:
    """Accumulates encoded replies as a short list of send-ready buffers.

    Small pieces are concatenated into one ``bytearray``; a large bulk payload
    is appended as a ``memoryview`` of the caller's object, uncopied.
    """

    __slots__ = ("chunks", "_tail", "nbytes")

    def __init__(self) -> None:
        self.chunks: list[bytes | bytearray | memoryview] = []
        self._tail = bytearray()
        self.nbytes = 0

    def write(self, data: bytes) -> None:
        """Append small bytes (copied into the current tail)."""
        self._tail += data
        self.nbytes += len(data)

    def write_large(self, data: Any) -> None:
        """Append a large buffer without copying it."""
        if self._tail:
            self.chunks.append(self._tail)
            self._tail = bytearray()
        self.chunks.append(memoryview(data).cast("B"))
        self.nbytes += memoryview(data).nbytes

    def take(self) -> list[bytes | bytearray | memoryview]:
        """Return the buffers written so far and start empty again."""
        if self._tail:
            self.chunks.append(self._tail)
            self._tail = bytearray()
        chunks, self.chunks = self.chunks, []
        self.nbytes = 0
        return chunks

    def __len__(self) -> int:
        return self.nbytes


def _write_bulk(buf: ReplyBuffer, payload: Any) -> None:
    if isinstance(payload, str):
        payload = payload.encode("utf-8", "surrogateescape")
    size = memoryview(payload).nbytes if not isinstance(payload, (bytes, bytearray)) else len(payload)
    if size >= SCATTER_THRESHOLD:
        buf.write(b"$%d\r\n" % size)
        buf.write_large(payload)
        buf.write(b"\r\n")
    else:
        buf.write(b"$%d\r\n%s\r\n" % (size, bytes(payload)))


def _encode_simple(buf: ReplyBuffer, value: SimpleString, resp: int) -> None:
    constant = _CONSTANTS.get(value.text)
    if constant is None:
        constant = b"+%s\r\n" % _one_line(value.text).encode("utf-8", "surrogateescape")
    buf.write(constant)


def _encode_error(buf: ReplyBuffer, value: Error, resp: int) -> None:
    # Text decoded with surrogateescape (a client's non-UTF-8 bytes quoted in an error) goes back as those bytes.
    buf.write(b"-%s\r\n" % _one_line(value.message).encode("utf-8", "surrogateescape"))


def _encode_bulk(buf: ReplyBuffer, value: Any, resp: int) -> None:
    _write_bulk(buf, value)


#: Encoded short strings (map keys such as "matched", "blocks": the same few in every reply).
_SHORT_STRINGS: dict[str, bytes] = {}


def _encode_str(buf: ReplyBuffer, value: str, resp: int) -> None:
    encoded = _SHORT_STRINGS.get(value)
    if encoded is None:
        data = value.encode("utf-8", "surrogateescape")
        if len(data) >= SCATTER_THRESHOLD:
            _write_bulk(buf, data)
            return
        encoded = b"$%d\r\n%s\r\n" % (len(data), data)
        if len(value) <= 32 and len(_SHORT_STRINGS) < 4096:
            _SHORT_STRINGS[value] = encoded
    buf.write(encoded)


def _encode_bytes(buf: ReplyBuffer, value: bytes, resp: int) -> None:
    if len(value) >= SCATTER_THRESHOLD:
        _write_bulk(buf, value)
    else:
        buf.write(b"$%d\r\n%s\r\n" % (len(value), value))


def _encode_bool(buf: ReplyBuffer, value: bool, resp: int) -> None:
    if resp == 3:
        buf.write(b"#t\r\n" if value else b"#f\r\n")
    else:
        buf.write(b":1\r\n" if value else b":0\r\n")


def _encode_int(buf: ReplyBuffer, value: int, resp: int) -> None:
    buf.write(b":%d\r\n" % value)


def _encode_none(buf: ReplyBuffer, value: None, resp: int) -> None:
    buf.write(b"_\r\n" if resp == 3 else b"$-1\r\n")


def _encode_null_array(buf: ReplyBuffer, value: Any, resp: int) -> None:
    buf.write(b"_\r\n" if resp == 3 else b"*-1\r\n")


def _encode_array(buf: ReplyBuffer, value: list | tuple, resp: int) -> None:
    buf.write(b"*%d\r\n" % len(value))
    for item in value:
        encode_into(buf, item, resp)


def _encode_int_array(buf: ReplyBuffer, value: array, resp: int) -> None:
    # An array.array of integers (block ids ...): one C-level join instead of
    # one encoder call per element, the difference between 70 and 10 us for 256 ids.
    if value.typecode not in _INT_TYPECODES:
        raise TypeError(f"cannot encode array.array of typecode {value.typecode!r}")
    if not value:
        buf.write(b"*0\r\n")
        return
    buf.write(b"*%d\r\n:%s\r\n" % (len(value), "\r\n:".join(map(str, value)).encode()))


def _encode_encoded_ints(buf: ReplyBuffer, value: IntArray, resp: int) -> None:
    buf.write(b"*%d\r\n" % value.count)
    buf.write(value.body)


def _encode_map(buf: ReplyBuffer, value: dict, resp: int) -> None:
    # len(value), not len(items()): a dict subclass may hold repeated keys.
    count = len(value)
    buf.write(b"%%%d\r\n" % count if resp == 3 else b"*%d\r\n" % (2 * count))
    # The common pieces written directly (the encoders' own output: a cached short key, an
    # integer): a PFX* reply is a map of a few such pairs, encoded once per request.
    for key, item in value.items():
        encoded = _SHORT_STRINGS.get(key) if key.__class__ is str else None
        if encoded is not None:
            buf.write(encoded)
        else:
            encode_into(buf, key, resp)
        if item.__class__ is int:
            buf.write(b":%d\r\n" % item)
        else:
            encode_into(buf, item, resp)


def _encode_double(buf: ReplyBuffer, value: float, resp: int) -> None:
    text = _format_shortest(value) if value.__class__ is ShortestDouble else _format_double(value)
    if resp == 3:
        buf.write(b",%s\r\n" % text)
    else:
        _write_bulk(buf, text)


def _encode_set(buf: ReplyBuffer, value: Any, resp: int) -> None:
    items = value.items if isinstance(value, Set) else sorted(value)
    buf.write((b"~%d\r\n" if resp == 3 else b"*%d\r\n") % len(items))
    for item in items:
        encode_into(buf, item, resp)


def _encode_verbatim(buf: ReplyBuffer, value: Verbatim, resp: int) -> None:
    text = value.text.encode("utf-8", "surrogateescape") if isinstance(value.text, str) else value.text
    if resp != 3:
        _write_bulk(buf, text)
        return
    fmt = value.format.encode()
    buf.write(b"=%d\r\n%s:" % (len(text) + len(fmt) + 1, fmt))
    if len(text) >= SCATTER_THRESHOLD:
        buf.write_large(text)
    else:
        buf.write(text)
    buf.write(b"\r\n")


def _encode_push(buf: ReplyBuffer, value: Push, resp: int) -> None:
    buf.write((b">%d\r\n" if resp == 3 else b"*%d\r\n") % len(value.items))
    for item in value.items:
        encode_into(buf, item, resp)


def _encode_array_header(buf: ReplyBuffer, value: ArrayHeader, resp: int) -> None:
    buf.write(b"*%d\r\n" % value.count)


def _encode_replies(buf: ReplyBuffer, value: Replies, resp: int) -> None:
    for item in value.items:
        encode_into(buf, item, resp)


#: Exact type -> encoder: one dict lookup per value on the hot path. Subclasses
#: (a dict subclass, an IntEnum ...) are found by the isinstance walk below.
_ENCODERS: dict[type, Any] = {
    SimpleString: _encode_simple,
    Error: _encode_error,
    bytes: _encode_bytes,
    bytearray: _encode_bulk,
    memoryview: _encode_bulk,
    str: _encode_str,
    bool: _encode_bool,
    int: _encode_int,
    type(None): _encode_none,
    _NullArray: _encode_null_array,
    list: _encode_array,
    tuple: _encode_array,
    array: _encode_int_array,
    IntArray: _encode_encoded_ints,
    dict: _encode_map,
    float: _encode_double,
    ShortestDouble: _encode_double,
    set: _encode_set,
    frozenset: _encode_set,
    Set: _encode_set,
    Verbatim: _encode_verbatim,
    Push: _encode_push,
    Replies: _encode_replies,
    ArrayHeader: _encode_array_header,
}


def encode_into(buf: ReplyBuffer, value: Any, resp: int) -> None:
    """Encode ``value`` for protocol version ``resp`` (2 or 3) into ``buf``."""
    encoder = _ENCODERS.get(type(value))
    if encoder is None:
        for kind, candidate in _ENCODERS.items():
            if isinstance(value, kind):
                encoder = candidate
                break
        else:
            raise TypeError(f"cannot encode reply value of type {type(value).__name__}")
    encoder(buf, value, resp)


def _one_line(message: str) -> str:
    # Redis replaces newlines in error and status replies so the protocol stays intact.
    return message.replace("\r", " ").replace("\n", " ")


def encode(value: Any, resp: int = 2) -> bytes:
    """Encode one reply value to a single ``bytes`` object (convenient for tests)."""
    buf = ReplyBuffer()
    encode_into(buf, value, resp)
    return b"".join(bytes(chunk) for chunk in buf.take())


def encode_many(values: Iterable[Any], resp: int = 2) -> bytes:
    """Encode several replies back to back."""
    buf = ReplyBuffer()
    for value in values:
        encode_into(buf, value, resp)
    return b"".join(bytes(chunk) for chunk in buf.take())
