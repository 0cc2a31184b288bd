"""Request parsing: bytes from a client in, one command (``list[bytes]``) out.

:class:`RequestParser` reproduces the request parsing of redis-server 7.0
(``src/networking.c``: ``processInlineBuffer``, ``processMultibulkBuffer``
and the limits in ``readQueryFromClient``), including the exact error replies
and the quirks that clients can observe:

* A request starting with ``*`` is a multibulk request; anything else is an
  inline request (one line split with ``sdssplitargs`` rules).
* Count lines (``*N`` and ``$N``) are found by searching for ``\\r``; the byte
  after it is skipped without being checked, and so are the two bytes after
  each bulk payload.  Numbers use Redis's strict ``string2ll`` (no ``+``, no
  leading zeros, no spaces, ``-0`` is invalid, at most 64 bits).
* Redis looks for line ends with ``strchr``, which stops at a NUL byte: a line
  with a NUL before its terminator never ends and eventually trips the
  64 KiB "too big" limit.
* ``*0`` and negative counts, empty inline lines and lines of blanks are
  consumed silently.

One deliberate refinement: Redis checks the 64 KiB line limit after each
16 KiB ``read()``, so whether a line that ends between 64 KiB and 80 KiB is
accepted depends on how the bytes were split into reads.  This parser only
looks for a line end within the first ``inline_max + 1`` bytes of the line,
which is exactly what Redis does when the bytes arrive in small reads, and
makes the outcome independent of how the caller chunks its ``feed()`` calls.

The module is sans-IO: the connection feeds received bytes with
:meth:`RequestParser.feed` and pulls commands one at a time with
:meth:`RequestParser.next_command`, executing each before asking for the next
(``AUTH`` changes the limits that apply to the following command).

Fast path: complete multibulk requests of up to a few KiB are decoded by
``hiredis.Reader`` (C) and accepted only after checking that they are plain
arrays of bulk strings within the current limits, laid out byte for byte as a
canonical encoding; everything else (inline requests, partial requests,
errors, RESP3 types, limits, big requests) goes through the exact hand-written
parser, which alone defines the behaviour.  ``use_hiredis=False`` disables
the fast path (tests compare both).

Which parser a request gets is picked at its start, from its first bulk
headers (see ``_exact_is_cheaper``): one announcing a payload of 1,000 bytes
or more (a PACKED prompt, a page of DATA) sends the request to the exact
parser, which copies such a payload once and never scans it, where hiredis
would copy it twice and the guard below scan it; small requests go to hiredis. The exact parser reads a
request that is all buffered in one tight pass, and bytes received while
nothing is buffered are parsed where they are, not copied into the buffer.

hiredis-py allocates a Python list of the announced size as soon as it reads
an aggregate header (``*``, ``~``, ``>``, ``|``, ``%``), and freeing a list
announced as ``*4000000000`` takes seconds of CPU.  Redis itself would wait
for such a request (or reject it as "expected '$'" when nested), so bytes in
which an aggregate type byte is followed by 6 or more digits are never shown
to hiredis (see ``_GUARD``).
"""

from __future__ import annotations

try:  # hiredis is a hard dependency of pfxcache, but the exact parser does not need it.
    import hiredis
except ImportError:  # pragma: no cover
    hiredis = None

import re

from pfxcache.protocol.redis_strings import splitargs, string2ll

__all__ = ["NEED_DATA", "ProtocolError", "RequestParser", "splitargs"]


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"

    def __bool__(self) -> bool:
        return False


#: Returned by :meth:`RequestParser.next_command` when no complete command is buffered.
NEED_DATA = _NeedData()

# Redis constants (server.h).
PROTO_IOBUF_LEN = 16 * 1024  # readQueryFromClient's normal read size
PROTO_INLINE_MAX_SIZE = 64 * 1024  # max inline request / count line
PROTO_MBULK_BIG_ARG = 32 * 1024  # bulks at least this big get sized reads
INT_MAX = 2**31 - 1
_UNAUTH_MAX_MULTIBULK = 10
_UNAUTH_MAX_BULK = 16384

#: The fast path gives a request back to the exact parser once hiredis holds
#: this many bytes of it without completing it, and is not tried again until
#: the exact parser sees a request smaller than this: for big payloads the
#: guard scan below costs more than the exact parser's per-request overhead.
_FAST_LIMIT = 8 * 1024
#: Bytes handed to hiredis at a time.
_FAST_CHUNK = 16 * 1024

# The guard: a translation that maps digits to "D", aggregate type bytes to
# "T" and everything else to "x", and the pattern of an aggregate header
# announcing 100000 elements or more.  (Redis's and hiredis's string2ll allow
# no sign or blank before the digits, so this is the only spelling.)
_GUARD = bytes(
    ord("D") if c in b"0123456789" else ord("T") if c in b"*~>|%" else ord("x")
    for c in range(256)
)
_GUARD_PATTERN = b"TDDDDDD"
_GUARD_BACK = len(_GUARD_PATTERN) - 1
#: The parser choice: a bulk header of 4+ digits (a payload of 1,000 bytes or
#: more) among the first bytes of a request sends it to the exact parser.
#: Only a choice of speed: both parsers give the same result for any bytes.
_BIG_BULK_HEADER = re.compile(rb"\$[1-9][0-9]{3}")
_BIG_BULK_WINDOW = 64


def _exact_is_cheaper(buf, pos: int) -> bool:
    """The parser choice at the start of a request (a matter of speed only).

    hiredis pays off for small requests, above all pipelined ones: fed once,
    it returns them for a fraction of a microsecond each. A request with a big
    bulk costs it two copies of the payload and a guard scan of it, where the
    exact parser makes one copy and scans nothing: the exact parser takes a
    request whose first headers announce a payload of 1,000 bytes or more.
    """
    return len(buf) - pos > 1000 and _BIG_BULK_HEADER.search(buf, pos, pos + _BIG_BULK_WINDOW) is not None
#: A buffer this big is freed as soon as it is all consumed.
_RELEASE_NOW = 1024 * 1024
#: Upper bound of :meth:`RequestParser.wanted` while a big bulk is arriving.
_BIG_READ_MAX = 16 * 1024 * 1024

_TOO_BIG_MBULK = b"Protocol error: too big mbulk count string"
_TOO_BIG_BULK = b"Protocol error: too big bulk count string"

_CR = 13
_LF = 10
_STAR = 42
_DOLLAR = 36


# ----------------------------------------------------------------------------
# The parser.
# ----------------------------------------------------------------------------


class ProtocolError(Exception):
    """The client broke the protocol; the connection must be closed.

    ``reply`` is the exact error reply to send first (after the replies of the
    commands already parsed), or None to close silently (query buffer limit).
    ``message`` is the text without ``-ERR`` and line end, for logs.
    """

    def __init__(self, message: str, reply: bytes | None) -> None:
        super().__init__(message)
        self.message = message
        self.reply = reply


def _protocol_error(text: bytes) -> ProtocolError:
    return ProtocolError(text.decode("latin-1"), b"-ERR " + text + b"\r\n")


#: Canonical decimal spellings of small counts and lengths (no sign, no leading zero), for
#: the one-pass parser: one dict lookup instead of isdigit, a leading-zero test and int().
_CANONICAL = {b"%d" % n: n for n in range(10_000)}

#: len(b"*%d\r\n" % n) for small n.
_COUNT_HEADER = tuple(len(b"*%d\r\n" % n) for n in range(1000))


class RequestParser:
    """Incremental parser of client requests, byte-compatible with redis-server 7.0.

    Usage::

        parser.feed(data)
        while (cmd := parser.next_command()) is not NEED_DATA:
            execute(cmd)          # may flip parser.authenticated

    ``next_command`` raises :class:`ProtocolError` for malformed input, and
    keeps raising the same error afterwards.  The limits are plain attributes
    that may change between calls (``CONFIG SET``, ``AUTH``):

    * ``proto_max_bulk_len``: larger bulks are "invalid bulk length";
    * ``query_buffer_limit``: when :meth:`buffered` would exceed it the client
      is closed without a reply;
    * ``authenticated``: when False, Redis's pre-AUTH limits apply (at most 10
      arguments, bulks of at most 16384 bytes);
    * ``inline_max``: the longest inline request or count line (64 KiB).
    """

    __slots__ = (
        "_argbytes",
        "_args",
        "_buf",
        "_bulklen",
        "_error",
        "_fast_ok",
        "_mbulk",
        "_pos",
        "_reader",
        "_rend",
        "_scanned",
        "authenticated",
        "inline_max",
        "proto_max_bulk_len",
        "query_buffer_limit",
        "use_hiredis",
    )

    def __init__(
        self,
        *,
        proto_max_bulk_len: int = 512 * 1024 * 1024,
        query_buffer_limit: int = 1024**3,
        inline_max: int = PROTO_INLINE_MAX_SIZE,
        authenticated: bool = True,
        use_hiredis: bool = True,
    ) -> None:
        self.proto_max_bulk_len = proto_max_bulk_len
        self.query_buffer_limit = query_buffer_limit
        self.inline_max = inline_max
        self.authenticated = authenticated
        #: Whether the hiredis fast path may be used (a constructor choice).
        #: hiredis knows no line limit, so it needs one longer than any valid
        #: count line; Redis's is 64 KiB, smaller ones are for tests.
        self.use_hiredis = use_hiredis and hiredis is not None and inline_max >= 32
        # Received bytes; everything before _pos is consumed.  The prefix is
        # dropped on the next feed() (``del buf[:pos]`` is O(1) in CPython:
        # it moves the bytearray's start), so commands never pay for it.
        self._buf = bytearray()
        self._pos = 0
        self._error: ProtocolError | None = None
        # Exact parser state, as Redis's client struct: arguments still
        # expected (0: not inside a multibulk), length of the bulk being read
        # (-1: its $ line is not read yet), the arguments read so far.
        self._mbulk = 0
        self._bulklen = -1
        self._args: list[bytes] = []
        self._argbytes = 0
        # How many bytes after _pos were already searched for the end of the
        # current line without finding it, so that a line arriving byte by
        # byte is not rescanned; inline_max + 1 once the line can never end.
        self._scanned = 0
        # Fast path: a hiredis.Reader that has been fed buf[.. _rend] and has
        # consumed, as accepted commands, everything up to _pos.  _fast_ok is
        # False while requests are big (see _FAST_LIMIT).
        self._reader = None
        self._rend = 0
        self._fast_ok = self.use_hiredis

    # -- input ---------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes (copied; the caller may reuse its buffer).

        Over ``query_buffer_limit`` the parser fails: the next
        :meth:`next_command` raises a ProtocolError with ``reply=None``.
        Data fed after an error is ignored.
        """
        if self._error is not None:
            return
        size = len(data) if data.__class__ is not memoryview else data.nbytes  # (no subclasses)
        if not size:
            return
        buf = self._buf
        pos = self._pos
        if len(buf) - pos + self._argbytes + size > self.query_buffer_limit:  # buffered() + size
            # Redis checks the query buffer right after read() and closes the
            # client without a reply; drop the data instead of holding it.
            self._fail(
                ProtocolError("Closing client that reached max query buffer length", None)
            )
            return
        if pos >= len(buf):
            # Everything buffered was consumed (the usual case between requests):
            # parse the received bytes where they are instead of copying them.
            self._buf = data if data.__class__ is bytes else bytearray(data)
            self._pos = 0
            self._rend -= pos
            return
        if buf.__class__ is not bytearray:  # received bytes, partly consumed: keep the rest, now growable
            buf = self._buf = bytearray(memoryview(buf)[pos:])
            self._pos = 0
            self._rend -= pos
        elif pos:
            del buf[:pos]
            self._pos = 0
            self._rend -= pos
        buf += data

    def buffered(self) -> int:
        """Bytes held: unparsed input plus the arguments of a partial command."""
        return len(self._buf) - self._pos + self._argbytes

    def wanted(self) -> int:
        """How many bytes the connection should try to read next.

        16 KiB normally, like Redis.  While a big bulk (32 KiB or more) is
        arriving, the rest of it, so that the read does not run into the next
        command; but never more than twice what has arrived of it (and at most
        16 MiB), so a client that declares a huge bulk and sends nothing does
        not make the connection allocate a huge read buffer.
        """
        if self._mbulk and self._bulklen >= PROTO_MBULK_BIG_ARG:
            have = len(self._buf) - self._pos
            remaining = self._bulklen + 2 - have
            if remaining > 0:
                return min(remaining, max(PROTO_IOBUF_LEN, min(have, _BIG_READ_MAX)))
        return PROTO_IOBUF_LEN

    # -- output --------------------------------------------------------------

    def next_command(self) -> list[bytes] | _NeedData:
        """Parse and return the next command, or NEED_DATA.

        Raises :class:`ProtocolError` where Redis would reply with a protocol
        error and close the connection; every later call raises it again.
        """
        error = self._error
        if error is not None:
            # A fresh exception each time: one stored with a traceback would
            # keep the frames (and their buffers) alive in a reference cycle.
            raise ProtocolError(error.message, error.reply)
        if self._pos >= len(self._buf):
            # Everything received is consumed (after the last request of a batch): no parser
            # has anything to look at, and a partial request's state waits for more bytes.
            return NEED_DATA
        if self._reader is None:
            # Start the fast path only at the beginning of a multibulk request
            # that the exact parser has not started on.
            if not self._fast_ok or self._mbulk or self._scanned:
                return self._exact()
            pos = self._pos
            buf = self._buf
            if pos >= len(buf) or buf[pos] != _STAR or _exact_is_cheaper(buf, pos):
                return self._exact()
            self._reader = hiredis.Reader()
            self._rend = pos
        result = self._fast()
        if result is None:
            self._reader = None
            return self._exact()
        return result

    # -- fast path -----------------------------------------------------------

    def _fast(self):
        """Next command from hiredis, NEED_DATA, or None to use the exact parser."""
        reader = self._reader
        buf = self._buf
        # The reader holds nothing unconsumed when it was fed just up to the last accepted
        # request (rend == pos): asking it first would only answer False.
        res = False
        while True:
            if self._rend != self._pos:
                try:
                    res = reader.gets()
                except hiredis.HiredisError:  # ProtocolError: let the exact parser say it
                    return None
                if res is not False:
                    break
            end = len(buf)
            pos = self._pos
            rend = self._rend
            if rend - pos >= _FAST_LIMIT:
                self._fast_ok = False  # a big request: the exact parser is cheaper
                return None
            if rend == pos and end - pos > 1000 and _exact_is_cheaper(buf, pos):
                return None  # at a request boundary: the exact parser takes the next one
            if rend < end:
                stop = rend + _FAST_CHUNK
                if stop > end:
                    stop = end
                # Never let hiredis see a big aggregate header (its list would
                # be allocated and later freed slot by slot): feed it only up
                # to such a header; the request there goes to the exact parser.
                # The scan starts a little back to catch headers cut in two.
                scan_from = rend - _GUARD_BACK
                if scan_from < pos:
                    scan_from = pos
                hit = buf[scan_from:stop].translate(_GUARD).find(_GUARD_PATTERN)
                if hit >= 0:
                    stop = scan_from + hit
                if stop > rend:
                    reader.feed(buf, rend, stop - rend)
                    self._rend = stop
                    continue
            # Nothing buffered: keep the reader for the next feed.  A partial
            # (or guarded) request goes to the exact parser, which reads it
            # incrementally.
            return NEED_DATA if pos == end else None

        # hiredis accepts more than Redis does (RESP3 types, "+" items, null
        # bulks ...).  Accept only an array of bulk strings, within limits,
        # whose bytes are laid out canonically: hiredis's number parsing is
        # as strict as Redis's, so with '*' and each '$' at the canonical
        # offsets the request is exactly what Redis would have parsed, and
        # its length tells how far to advance.
        if type(res) is not list:
            return None
        pos = self._pos
        count = len(res)
        if not count or buf[pos] != _STAR:
            return None
        if self.authenticated:
            limit = self.proto_max_bulk_len
        else:
            if count > _UNAUTH_MAX_MULTIBULK:
                return None
            limit = min(self.proto_max_bulk_len, _UNAUTH_MAX_BULK)
        p = pos + (_COUNT_HEADER[count] if count < 1000 else len(b"*%d\r\n" % count))
        # Each item takes "$<len>\r\n" + payload + 2 bytes.  (Hot loop:
        # literals rather than _DOLLAR and a helper function.)
        for arg in res:
            if type(arg) is not bytes or buf[p] != 36:
                return None
            n = len(arg)
            if n > limit:
                return None
            p += n + (
                6 if n < 10 else 7 if n < 100 else 8 if n < 1000 else 9 if n < 10000 else len(str(n)) + 5
            )
        self._pos = p
        return res

    # -- exact parser --------------------------------------------------------

    def _fail(self, error: ProtocolError) -> ProtocolError:
        """Enter the failed state (dropping all buffered data); return ``error`` to raise."""
        self._error = ProtocolError(error.message, error.reply)
        self._reader = None
        self._buf = bytearray()
        self._pos = self._rend = self._scanned = self._mbulk = 0
        self._bulklen = -1
        self._args = []
        self._argbytes = 0
        return error

    def _find_line(self, pos: int, sep: int, too_big: bytes) -> int:
        """Index of the ``sep`` byte ending the line at ``pos``, or -1 (need data).

        Like Redis's ``strchr`` search: a NUL byte before ``sep`` hides it.
        Raises ProtocolError(too_big) when more than inline_max bytes are
        pending and the line cannot end within them.
        """
        buf = self._buf
        end = len(buf)
        limit = self.inline_max
        stop = min(end, pos + limit + 1)
        start = pos + self._scanned
        if start < stop:
            r = buf.find(sep, start, stop)
            if r >= 0:
                if buf.find(0, pos, r) < 0:
                    return r
                self._scanned = limit + 1  # a NUL comes first: never ends
            else:
                self._scanned = stop - pos
        if end - pos > limit:
            raise self._fail(_protocol_error(too_big))
        return -1

    def _count_line(self, pos: int, end: int, too_big: bytes) -> int:
        """Index of the '\r' ending the count line at ``pos`` once the byte
        after it has arrived too (Redis skips that byte unchecked), else -1."""
        if not self._scanned:
            # Common case, no bookkeeping: a short line, all there, no NUL.
            r = self._buf.find(_CR, pos, pos + 24)
            if 0 <= r - pos <= self.inline_max and r + 1 < end and self._buf.find(0, pos, r) < 0:
                return r
        r = self._find_line(pos, _CR, too_big)
        if r >= 0 and r + 1 >= end:
            self._scanned = r - pos  # found; the next search starts there
            return -1
        return r

    def _exact(self):
        """The exact parser: next command, NEED_DATA, or raise ProtocolError.

        Works like processMultibulkBuffer: the state of a partial request
        (_mbulk, _bulklen, _args) survives between calls, so a request that
        arrives in many pieces is never rescanned.
        """
        buf = self._buf
        end = len(buf)
        while True:
            pos = self._pos
            if not self._mbulk:
                if pos >= end:
                    return NEED_DATA
                if buf[pos] == _STAR and not self._scanned and self.inline_max >= 24:
                    args = self._whole(buf, pos, end)
                    if args is not None:
                        return args
                if buf[pos] != _STAR:
                    cmd = self._inline(pos)
                    if cmd:  # NEED_DATA and [] (blank line) are both falsy
                        return cmd
                    if cmd is NEED_DATA:
                        return NEED_DATA
                    continue
                r = self._count_line(pos, end, _TOO_BIG_MBULK)
                if r < 0:
                    return NEED_DATA
                count = string2ll(buf[pos + 1 : r])
                if count is None or count > INT_MAX:
                    raise self._fail(_protocol_error(b"Protocol error: invalid multibulk length"))
                if count > _UNAUTH_MAX_MULTIBULK and not self.authenticated:
                    raise self._fail(
                        _protocol_error(b"Protocol error: unauthenticated multibulk length")
                    )
                self._pos = pos = r + 2
                self._scanned = 0
                if count <= 0:
                    continue  # "*0" and "*-1" are consumed silently
                self._mbulk = count

            # Arguments.  State lives in locals here and is stored back
            # before returning or calling a helper that reads it.
            mbulk = self._mbulk
            bulklen = self._bulklen
            args = self._args
            while mbulk:
                if bulklen < 0:
                    r = self._count_line(pos, end, _TOO_BIG_BULK)
                    if r < 0:
                        break
                    first = buf[pos]
                    if first != _DOLLAR:
                        # addReplyErrorFormat turns CR and LF into spaces.
                        shown = b" " if first in (_CR, _LF) else bytes((first,))
                        raise self._fail(
                            _protocol_error(b"Protocol error: expected '$', got '" + shown + b"'")
                        )
                    bulklen = string2ll(buf[pos + 1 : r])
                    if bulklen is None or bulklen < 0 or bulklen > self.proto_max_bulk_len:
                        raise self._fail(_protocol_error(b"Protocol error: invalid bulk length"))
                    if bulklen > _UNAUTH_MAX_BULK and not self.authenticated:
                        raise self._fail(
                            _protocol_error(b"Protocol error: unauthenticated bulk length")
                        )
                    pos = r + 2
                    self._scanned = 0
                # The payload plus two bytes that Redis skips without checking.
                if end - pos < bulklen + 2:
                    break
                if bulklen < 4096:
                    args.append(bytes(buf[pos : pos + bulklen]))
                else:  # one copy instead of two
                    with memoryview(buf) as view:
                        args.append(view[pos : pos + bulklen].tobytes())
                self._argbytes += bulklen
                pos += bulklen + 2
                bulklen = -1
                mbulk -= 1
            self._pos = pos
            self._mbulk = mbulk
            self._bulklen = bulklen
            if mbulk:
                return NEED_DATA

            # Back to the fast path after this request, unless requests are big.
            self._fast_ok = self.use_hiredis and self._argbytes < _FAST_LIMIT
            if pos == end and end >= _RELEASE_NOW:
                # A big request used the whole buffer: free it now rather than
                # at the next feed(), while the command holds a copy.
                self._buf = bytearray()
                self._pos = 0
            self._args = []
            self._argbytes = 0
            return args

    def _whole(self, buf, pos: int, end: int):
        """A request at ``pos`` that is all buffered and plainly valid, parsed in one pass; else None.

        None (nothing consumed) leaves every other case to the incremental code
        below: a partial request, a count or length that is not canonical
        digits, a non-positive count, a limit reached, a NUL or a line of 24
        bytes or more (so the caller requires ``inline_max >= 24``).
        Every check here is one the incremental code makes too, so both give
        the same result; this pass only makes fewer calls per argument.
        """
        r = buf.find(b"\r", pos, pos + 12)
        if r < 0 or r + 1 >= end:
            return None
        raw = buf[pos + 1 : r]
        received = buf.__class__ is bytes  # (a bytearray's slices are no dict keys)
        count = _CANONICAL.get(raw) if received else None
        if count is None:
            if not raw.isdigit() or raw[0] == 48:  # canonical positive count (isdigit: ASCII only)
                return None
            count = int(raw)
        elif not count:
            return None
        if self.authenticated:
            if count > INT_MAX:
                return None
            limit = self.proto_max_bulk_len
        else:
            if count > _UNAUTH_MAX_MULTIBULK:
                return None
            limit = min(self.proto_max_bulk_len, _UNAUTH_MAX_BULK)
        p = r + 2
        args = []
        total = 0
        while count:
            if p >= end or buf[p] != 36:  # "$"
                return None
            r = buf.find(b"\r", p, p + 24)
            if r < 0:
                return None
            raw = buf[p + 1 : r]
            n = _CANONICAL.get(raw) if received else None
            if n is None:  # b"0" is in the table: a leading zero here is not canonical
                if not raw.isdigit() or raw[0] == 48 or len(raw) > 18:
                    return None
                n = int(raw)
            start = r + 2
            stop = start + n
            if n > limit or stop + 2 > end:
                return None
            if received:  # slicing bytes copies once, whatever the size
                args.append(buf[start:stop])
            elif n < 4096:
                args.append(bytes(buf[start:stop]))
            else:  # one copy instead of two
                with memoryview(buf) as view:
                    args.append(view[start:stop].tobytes())
            total += n
            p = stop + 2
            count -= 1
        self._pos = p
        self._scanned = 0
        self._fast_ok = self.use_hiredis and total < _FAST_LIMIT
        if p == end and end >= _RELEASE_NOW:
            self._buf = bytearray()  # a big request used the whole buffer: free it now
            self._pos = 0
        return args

    def _inline(self, pos: int):
        """Parse one inline request: its arguments ([] for a blank line) or NEED_DATA."""
        r = self._find_line(pos, _LF, b"Protocol error: too big inline request")
        if r < 0:
            return NEED_DATA
        buf = self._buf
        e = r - 1 if r > pos and buf[r - 1] == _CR else r
        args = splitargs(bytes(buf[pos:e]))
        if args is None:
            raise self._fail(_protocol_error(b"Protocol error: unbalanced quotes in request"))
        self._pos = r + 1
        self._scanned = 0
        return args
