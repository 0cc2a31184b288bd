"""Tests of pfxcache.protocol.redis_strings: Redis's util.c/sds.c string rules
(``string2ll``, ``sdssplitargs``, ``stringmatchlen``) that the request parser,
the config and the commands share.

The expected values were checked against redis-server 7.0.15 (splitargs and
stringmatchlen cases; the NUL ones follow from the C string) or come from a
literal transcription of util.c (string2ll).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pfxcache.protocol.redis_strings import splitargs, string2ll, stringmatchlen

# ---------------------------------------------------------------------------
# string2ll
# ---------------------------------------------------------------------------


def _reference_string2ll(text: bytes):
    # A literal transcription of util.c string2ll.
    if not text or len(text) >= 21:
        return None
    if text == b"0":
        return 0
    i, negative = 0, False
    if text[0:1] == b"-":
        negative, i = True, 1
        if i == len(text):
            return None
    if not 0x31 <= text[i] <= 0x39:
        return None
    value = 0
    for c in text[i:]:
        if not 0x30 <= c <= 0x39:
            return None
        value = value * 10 + c - 0x30
    if negative:
        return -value if value <= 2**63 else None
    return value if value <= 2**63 - 1 else None


@given(
    st.one_of(
        st.lists(st.sampled_from(b"0123456789-+ _\t\x00a"), max_size=22).map(bytes),
        st.integers(-(2**64), 2**64).map(lambda n: b"%d" % n),
    )
)
@settings(max_examples=500, deadline=None)
def test_string2ll_matches_redis(text):
    expected = _reference_string2ll(text)
    assert string2ll(text) == expected
    assert string2ll(bytearray(text)) == expected
    assert string2ll(text.decode("ascii")) == expected  # the config's str values


def test_string2ll_is_strict():
    assert string2ll("0") == 0 and string2ll("-5") == -5 and string2ll("9223372036854775807") == 2**63 - 1
    for bad in ["", "007", "+5", " 5", "5 ", "-0", "1.5", "9223372036854775808", "٣"]:
        assert string2ll(bad) is None, bad
    for bad in [b"1_0", b"-1_0", "\udcb3", b"\xd9\xa3"]:  # int() would take "1_0"
        assert string2ll(bad) is None, bad


# ---------------------------------------------------------------------------
# sdssplitargs
# ---------------------------------------------------------------------------

# sdssplitargs cases, each checked against redis-server 7.0.15.
SPLITARGS = [
    (b"", []),
    (b"   ", []),
    (b"set a b", [b"set", b"a", b"b"]),
    (b'"a\\x4"', [b"ax4"]),
    (b'"a\\"', None),
    (b'"a\\', None),
    (b"'a\\'' b", [b"a'", b"b"]),
    (b"'a'b", None),
    (b'"a"\x0bb', [b"a", b"b"]),
    (b'a"b c"d', None),
    (b'a"b c"', [b"ab c"]),
    (b'"\\q\\n"', [b"q\n"]),
    (b'"\\n\\r\\t\\b\\a\\\\\\""', [b"\n\r\t\b\a\\\""]),
    (b"x\x0c\x0by", [b"x\x0c\x0by"]),  # \v and \f do not end a token...
    (b"\x0c\x0bx", [b"x"]),  # ...but are skipped before one
    (b"x 'a\\nb'", [b"x", b"a\\nb"]),
    (b'x "\\xZZ"', [b"x", b"xZZ"]),
    (b'x "\\x4A\\x4a\\xff"', [b"x", b"JJ\xff"]),
    (b'x ""', [b"x", b""]),
    (b"x ''", [b"x", b""]),
    (b'x """"', None),
    (b'"unterminated', None),
    (b"'unterminated", None),
    (b"caf\xc3\xa9 \xff", [b"caf\xc3\xa9", b"\xff"]),
    # Config lines.
    (b"port 6390", [b"port", b"6390"]),
    (b"  bind   127.0.0.1\t::1  ", [b"bind", b"127.0.0.1", b"::1"]),
    (b'requirepass "a b"', [b"requirepass", b"a b"]),
    (b'requirepass ""', [b"requirepass", b""]),
    (b"requirepass 'it\\'s'", [b"requirepass", b"it's"]),
    (b"requirepass 'a\\nb'", [b"requirepass", b"a\\nb"]),
    (b'requirepass "a\\nb\\t\\"\\\\"', [b"requirepass", b'a\nb\t"\\']),
    (b'requirepass "\\xff\\x41"', [b"requirepass", b"\xffA"]),
    (b'requirepass "\\xzz"', [b"requirepass", b"xzz"]),
    (b'requirepass a"b c"', [b"requirepass", b"ab c"]),
    (b'requirepass a"b c"d', None),
    (b'requirepass "abc', None),
    (b'requirepass "abc"d', None),
    (b"requirepass 'abc", None),
    # A NUL byte ends the line, as for the C string (config files may hold
    # one; the request parser never passes one).
    (b"a\x00b c", [b"a"]),
    (b"\x00x", []),
    (b'"a"\x00b', [b"a"]),
    (b'"a\x00b"', None),
    (b"'a\x00'", None),
]


@pytest.mark.parametrize("line,expected", SPLITARGS)
def test_splitargs(line, expected):
    assert splitargs(line) == expected


@given(st.lists(st.sampled_from(b" \t\r\nab\v\f\"'\\x4\x00"), max_size=16).map(bytes))
@settings(max_examples=300, deadline=None)
def test_splitargs_fast_path_agrees_with_the_slow_one(line):
    # Lines without quotes, \v, \f or NUL take bytes.split(); a trailing
    # '"x"' token forces the byte-by-byte loop on the same line.
    forced = splitargs(line + b' "x"')
    plain = splitargs(line)
    if plain is None:
        assert forced is None
    elif forced is not None:
        assert forced == plain + [b"x"] or b"\x00" in line


# ---------------------------------------------------------------------------
# stringmatchlen
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("pattern, string, nocase, expected", [
    (b"*", b"", False, False),  # sic: Redis needs a non-empty string (KEYS special-cases "*")
    (b"**", b"", False, False),
    (b"", b"", False, True),
    (b"*", b"port", False, True),
    (b"c*", b"client|id", False, True),
    (b"C*", b"client|id", False, False),
    (b"C*", b"client|id", True, True),
    (b"PORT", b"port", True, True),
    (b"PORT", b"port", False, False),
    (b"h?llo", b"hello", False, True),
    (b"p?rt", b"port", False, True),
    (b"p?rt", b"prt", False, False),
    (b"h[ae]llo", b"hallo", False, True),
    (b"[pt]ort", b"tort", False, True),
    (b"h[^e]llo", b"hello", False, False),
    (b"[^pt]ort", b"port", False, False),
    (b"h[a-b]llo", b"hbllo", False, True),
    (b"h[b-a]llo", b"hallo", False, True),  # reversed ranges work
    (b"[a-c]x", b"bx", False, True),
    (b"[c-a]x", b"bx", False, True),
    (b"[A-Z]ort", b"port", True, True),
    (b"h\\*llo", b"h*llo", False, True),
    (b"h\\*llo", b"hello", False, False),
    (b"\\*", b"*", False, True),
    (b"\\*", b"x", False, False),
    (b"[\\]]", b"]", False, True),
    (b"a[", b"a", False, False),
    (b"a[bc", b"ab", False, True),  # unclosed class: what it holds so far
    (b"po[", b"po", False, False),
    (b"po[rt", b"por", False, True),
    (b"*a*b*", b"xxaxxbxx", False, True),
    (b"*a*b", b"xxaxxbxx", False, False),
    (b"*max*len*", b"proto-max-bulk-len", False, True),
    (b"a*b*c", b"aXbYc", False, True),
    (b"a*b*c", b"aXbY", False, False),
    (b"a**", b"a", False, True),
    # Range ends compare as signed chars: [a-\xff] is [-1, 97].
    (b"[a-\xff]", b"\xff", False, True),
    (b"[a-\xff]", b"`", False, True),
    (b"[a-\xff]", b"\x80", False, False),
    (b"[a-\xff]", b"b", False, False),
])
def test_stringmatchlen(pattern: bytes, string: bytes, nocase: bool, expected: bool) -> None:
    assert stringmatchlen(pattern, string, nocase) is expected


def test_stringmatchlen_nesting_limit() -> None:
    # Redis gives up (no match) past 1000 levels of '*' nesting.
    assert stringmatchlen(b"a*" * 1100, b"a" * 1100) is False
    assert stringmatchlen(b"a*" * 500, b"a" * 1100) is True
