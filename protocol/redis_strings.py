"""Redis's util.c string rules shared by the protocol, the config and the commands.

One implementation each of the string routines whose exact behaviour clients
and operators can observe, ported from redis-server 7.0.15:

* :func:`string2ll` -- ``util.c`` ``string2ll``, the strict integer parser
  (request counts, config integers, command arguments);
* :func:`splitargs` -- ``sds.c`` ``sdssplitargs``, the line splitter for inline
  requests and config lines (quotes and escapes);
* :func:`stringmatchlen` -- ``util.c`` ``stringmatchlen``, the glob matcher
  (``COMMAND LIST FILTERBY PATTERN``, ``CONFIG GET``).

The module is pure: no I/O, no state, nothing but the standard library.
Callers that keep text as ``str`` (the config, with ``surrogateescape`` for
non-UTF-8 bytes) encode it back to bytes for :func:`splitargs` and
:func:`stringmatchlen`; :func:`string2ll` takes either.
"""

from __future__ import annotations

import re

__all__ = ["splitargs", "string2ll", "stringmatchlen"]

_LLONG_MIN = -(2**63)
_LLONG_MAX = 2**63 - 1


# ----------------------------------------------------------------------------
# string2ll (util.c)
# ----------------------------------------------------------------------------


def string2ll(data: bytes | bytearray | str) -> int | None:
    """Redis's strict ``string2ll``: the integer, or None where Redis rejects it.

    Only an optional '-' and ASCII digits, no leading zeros, no '+', no
    blanks, "-0" is invalid, and the value must fit a signed 64-bit integer.

    ``int()`` also accepts blanks, '+', '_' and leading zeros; each of those
    makes the text longer than the canonical spelling of its value, which
    string2ll requires ("-0" is rejected the same way). For ``str`` it also
    accepts non-ASCII digits ("٣"), which the ASCII check rejects. This is on
    the request parser's hot path: keep it to these few C-level calls.
    """
    if not 0 < len(data) < 21:  # LONG_STR_SIZE
        return None
    try:
        value = int(data)
    except ValueError:
        return None
    if len(data) != len(str(value)) or not _LLONG_MIN <= value <= _LLONG_MAX:
        return None
    if data.__class__ is str and not data.isascii():
        return None
    return value


# ----------------------------------------------------------------------------
# sdssplitargs (sds.c)
# ----------------------------------------------------------------------------

_ISSPACE = frozenset(b" \t\n\v\f\r")  # C isspace() in the "C" locale
_TOKEN_END = frozenset(b" \n\r\t")  # what ends an unquoted token (not \v, \f)
_HEXDIGITS = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("b"): b"\b", ord("a"): b"\a"}
# Lines without quotes, \v, \f or NUL split exactly like bytes.split().
_NEEDS_SLOW_SPLIT = re.compile(rb"[\"'\v\f\0]")


def splitargs(line: bytes) -> list[bytes] | None:
    """Split a line like Redis's ``sdssplitargs``.

    Handles ``"double quotes"`` (with ``\\n``, ``\\xHH``... escapes) and
    ``'single quotes'`` (only ``\\'`` escaped). Returns the arguments, or None
    for unbalanced quotes (including a closing quote followed by something
    other than a space). ``\\v`` and ``\\f`` are skipped between arguments
    but do not end one. A NUL byte ends the line, as it does for the C code
    (the request parser never passes one: Redis's line search stops there).
    """
    if _NEEDS_SLOW_SPLIT.search(line) is None:
        return line.split()
    nul = line.find(b"\0")
    if nul >= 0:
        line = line[:nul]
    n = len(line)
    i = 0
    out: list[bytes] = []
    while True:
        while i < n and line[i] in _ISSPACE:
            i += 1
        if i >= n:
            return out
        current = bytearray()
        inq = insq = False
        while True:
            c = line[i] if i < n else 0
            if inq:
                if (
                    c == 0x5C  # backslash
                    and i + 3 < n
                    and line[i + 1] == 0x78  # 'x'
                    and line[i + 2] in _HEXDIGITS
                    and line[i + 3] in _HEXDIGITS
                ):
                    current.append(int(line[i + 2 : i + 4], 16))
                    i += 3
                elif c == 0x5C and i + 1 < n:
                    i += 1
                    esc = line[i]
                    current += _ESCAPES.get(esc) or bytes((esc,))
                elif c == 0x22:  # closing '"' must be followed by a space or the end
                    if i + 1 < n and line[i + 1] not in _ISSPACE:
                        return None
                    i += 1
                    break
                elif i >= n:  # unterminated quotes
                    return None
                else:
                    current.append(c)
            elif insq:
                if c == 0x5C and i + 1 < n and line[i + 1] == 0x27:
                    i += 1
                    current.append(0x27)
                elif c == 0x27:
                    if i + 1 < n and line[i + 1] not in _ISSPACE:
                        return None
                    i += 1
                    break
                elif i >= n:
                    return None
                else:
                    current.append(c)
            else:
                if i >= n:
                    break
                if c in _TOKEN_END:
                    i += 1
                    break
                if c == 0x22:
                    inq = True
                elif c == 0x27:
                    insq = True
                else:
                    current.append(c)
            i += 1
        out.append(bytes(current))


# ----------------------------------------------------------------------------
# stringmatchlen (util.c)
# ----------------------------------------------------------------------------


def stringmatchlen(pattern: bytes, string: bytes, nocase: bool = False) -> bool:
    """Redis's glob matcher (util.c ``stringmatchlen``), byte for byte.

    Supports ``*``, ``?``, ``[...]`` with ``^`` and ranges, and backslash
    escapes, with Redis's quirks: an unterminated ``[`` is a set running to
    the end of the pattern (it matches what it holds so far), bytes in ranges
    compare as signed chars, and an empty string matches no pattern, not even
    ``*`` (KEYS special-cases ``*``).
    """
    try:
        return _match(pattern, 0, string, 0, nocase, [False], 0)
    except RecursionError:
        # Only patterns with hundreds of '*' get here; Redis stops at 1000 levels
        # of nesting, Python's stack may stop earlier. Either way: no match.
        return False


def _signed(b: int) -> int:
    return b - 256 if b >= 128 else b


def _lower(b: int) -> int:
    return b + 32 if 65 <= b <= 90 else b


def _match(pat: bytes, p: int, s: bytes, i: int, nocase: bool, skip_longer: list, nesting: int) -> bool:
    # A direct transliteration of stringmatchlen_impl(); p/i index pattern/string.
    if nesting > 1000:
        return False
    plen = len(pat) - p
    slen = len(s) - i

    def pc(k: int) -> int:
        # Reading past the end sees the sds NUL terminator.
        return pat[k] if k < len(pat) else 0

    while plen and slen:
        c = pat[p]
        if c == 0x2A:  # '*'
            while plen and pc(p + 1) == 0x2A:
                p += 1
                plen -= 1
            if plen == 1:
                return True
            while slen:
                if _match(pat, p + 1, s, i, nocase, skip_longer, nesting + 1):
                    return True
                if skip_longer[0]:
                    return False
                i += 1
                slen -= 1
            # No match for the rest of the pattern from anywhere here: a
            # longer match for an earlier '*' cannot help either.
            skip_longer[0] = True
            return False
        elif c == 0x3F:  # '?'
            i += 1
            slen -= 1
        elif c == 0x5B:  # '['
            p += 1
            plen -= 1
            negate = pc(p) == 0x5E
            if negate:
                p += 1
                plen -= 1
            matched = False
            while True:
                if pc(p) == 0x5C and plen >= 2:
                    p += 1
                    plen -= 1
                    if pc(p) == s[i]:
                        matched = True
                elif pc(p) == 0x5D:
                    break
                elif plen == 0:
                    p -= 1
                    plen += 1
                    break
                elif plen >= 3 and pc(p + 1) == 0x2D:
                    start, end, ch = _signed(pc(p)), _signed(pc(p + 2)), _signed(s[i])
                    if start > end:
                        start, end = end, start
                    if nocase:
                        start, end, ch = _lower(start), _lower(end), _lower(ch)
                    p += 2
                    plen -= 2
                    if start <= ch <= end:
                        matched = True
                elif nocase:
                    if _lower(pc(p)) == _lower(s[i]):
                        matched = True
                elif pc(p) == s[i]:
                    matched = True
                p += 1
                plen -= 1
            if negate:
                matched = not matched
            if not matched:
                return False
            i += 1
            slen -= 1
        else:
            if c == 0x5C and plen >= 2:  # '\\' escapes the next byte
                p += 1
                plen -= 1
            if nocase:
                if _lower(pc(p)) != _lower(s[i]):
                    return False
            elif pc(p) != s[i]:
                return False
            i += 1
            slen -= 1
        p += 1
        plen -= 1
        if slen == 0:
            while pc(p) == 0x2A and plen > 0:
                p += 1
                plen -= 1
            break
    return plen == 0 and slen == 0
