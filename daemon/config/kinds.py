"""The value kinds of pfxcached's configuration, and the row that uses them.

A :class:`Directive` (one row of :data:`pfxcache.daemon.config.directives.DIRECTIVES`)
names a ``kind``: a small type object (:class:`Int`, :class:`Memory`,
:class:`Bool`, :class:`Enum`, :class:`String`, :class:`Float`, or a special kind
such as :class:`Save`) that knows how to parse a directive's arguments, show a
value for CONFIG GET, write it back to a file and say what it accepts.

Parsing rules and error texts follow Redis 7.0.15's ``config.c`` and
``util.c`` (``memtoull``, ``sdscatrepr`` here; ``string2ll`` from
:mod:`pfxcache.protocol.redis_strings`) so that operators and client libraries
see the same replies.

Strings: values are ``str``; bytes that are not UTF-8 are kept with the
``surrogateescape`` error handler (:func:`arg_text` / :func:`arg_bytes`).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pfxcache.protocol.redis_strings import string2ll

__all__ = [
    "Kind",
    "Int",
    "Memory",
    "Bool",
    "Enum",
    "String",
    "Float",
    "AddressList",
    "Save",
    "Directory",
    "OutputBufferLimits",
    "OUTPUT_BUFFER_CLASSES",
    "Computed",
    "Directive",
    "quote",
    "memtoull",
    "format_memory",
    "ascii_lower",
    "arg_text",
    "arg_bytes",
    "display_line",
]

INT_MAX = 2**31 - 1
UINT_MAX = 2**32 - 1
LLONG_MAX = 2**63 - 1
LLONG_MIN = -(2**63)
ULLONG_MAX = 2**64 - 1
LONG_MAX = LLONG_MAX  # LP64


# ---------------------------------------------------------------------------
# Redis's string helpers, ported byte for byte where it matters.
# ---------------------------------------------------------------------------

_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def ascii_lower(text: str) -> str:
    """ASCII-only lowercase, like C's tolower/strcasecmp (str.lower would also
    fold e.g. the Kelvin sign into "k")."""
    return text.translate(_ASCII_LOWER)


def arg_text(value: bytes | str) -> str:
    """A protocol argument as str, keeping non-UTF-8 bytes (surrogateescape)."""
    if isinstance(value, str):
        return value
    return bytes(value).decode("utf-8", "surrogateescape")


def arg_bytes(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


def display_line(raw: bytes) -> str:
    """A config line as shown in an error message (never raises on output)."""
    return raw.decode("utf-8", "backslashreplace")


_REPR_ESCAPES = {0x5C: "\\\\", 0x22: '\\"', 10: "\\n", 13: "\\r", 9: "\\t", 7: "\\a", 8: "\\b"}


def quote(value: str) -> str:
    """Redis's ``sdscatrepr``: a double-quoted form ``splitargs`` reads back."""
    out = ['"']
    for byte in arg_bytes(value):
        if byte in _REPR_ESCAPES:
            out.append(_REPR_ESCAPES[byte])
        elif 0x20 <= byte <= 0x7E:
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02x}")
    out.append('"')
    return "".join(out)


def _strtoll(text: str, base: int) -> tuple[int, bool, bool]:
    """C's ``strtoll``: returns (value, rest_is_empty, overflowed).

    Leading C whitespace and a sign are accepted; with no digits at all the
    end pointer stays at the start of the string (so only "" counts as fully
    consumed), and out-of-range values clamp as ERANGE does.
    """
    m = re.match(r"[ \t\n\v\f\r]*([+-]?)([0-9a-zA-Z]*)", text)
    sign, digits = m.group(1), m.group(2)
    valid = ""
    for ch in digits:
        if ch.isascii() and ch.isalnum() and int(ch, 36) < base:
            valid += ch
        else:
            break
    if not valid:
        return 0, text == "", False
    value = int(valid, base) * (-1 if sign == "-" else 1)
    consumed = m.start(2) + len(valid) == len(text)
    if value > LLONG_MAX:
        return LLONG_MAX, consumed, True
    if value < LLONG_MIN:
        return LLONG_MIN, consumed, True
    return value, consumed, False


_MEMORY_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2, "g": 1000**3, "gb": 1024**3}


def memtoull(text: str) -> int | None:
    """Redis's ``memtoull``: "100", "1k" (1000), "1kb" (1024), ... "2gb".

    Units are case-insensitive; no sign, spaces or fractions. As in C, an
    empty number counts as 0, a number too large saturates at 2**64-1 and the
    multiplication wraps modulo 2**64. Returns None when it is not a memory
    value.
    """
    if text.startswith("-"):
        return None
    m = re.match(r"[0-9]*", text)
    digits = m.group()
    mul = _MEMORY_UNITS.get(ascii_lower(text[len(digits) :]))
    if mul is None or len(digits) >= 128:
        return None
    value = min(int(digits) if digits else 0, ULLONG_MAX)
    return (value * mul) & ULLONG_MAX


def format_memory(value: int) -> str:
    """How CONFIG REWRITE writes a byte count: "1gb", "512mb", "3kb" or "1000"."""
    for unit, size in (("gb", 1024**3), ("mb", 1024**2), ("kb", 1024)):
        if value and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


# ---------------------------------------------------------------------------
# Kinds: how one type of directive is parsed, shown and written back.
# ---------------------------------------------------------------------------


class Kind:
    """Base of the per-type objects in :attr:`Directive.kind`.

    ``parse`` turns the arguments of a config line (or a CONFIG SET value) into
    the typed value, raising ``ValueError(reason)`` with Redis's wording;
    ``show`` renders a value for CONFIG GET; ``conf`` renders it for a config
    file line; ``describe`` says what is accepted, for the documented file.
    """

    #: Takes a variable number of arguments in the file; CONFIG SET splits its
    #: value on single spaces, as Redis does for MULTI_ARG configs.
    multi_arg = False

    def parse(self, args: Sequence[str], d: Directive) -> Any:
        raise NotImplementedError

    def parse_over(self, old: Any, args: Sequence[str], d: Directive) -> Any:
        """Parse a new value given the current one (kinds that change only part of it use ``old``)."""
        return self.parse(args, d)

    def show(self, value: Any) -> str:
        return str(value)

    def conf(self, value: Any) -> str:
        return self.show(value)

    def describe(self, d: Directive) -> str:
        raise NotImplementedError


def _check_bounds(value: int | float, d: Directive, fmt: Callable[[Any], str] = str) -> None:
    lo, hi = d.minimum, d.maximum
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"argument must be between {fmt(lo)} and {fmt(hi)} inclusive")


def _range_text(d: Directive, fmt: Callable[[Any], str] = str) -> str:
    return f"from {fmt(d.minimum)} to {fmt(d.maximum)}"


@dataclass(frozen=True, slots=True)
class Int(Kind):
    """An integer. ``base=8`` reads and shows it in octal (unixsocketperm);
    ``clamp=(lo, hi)`` silently caps accepted values, as Redis does for hz."""

    base: int = 10
    clamp: tuple[int, int] | None = None

    def parse(self, args: Sequence[str], d: Directive) -> int:
        text = args[0]
        if self.base == 10:
            value = string2ll(text)
            if value is None:
                raise ValueError("argument couldn't be parsed into an integer")
        else:
            value, consumed, overflow = _strtoll(text, self.base)
            if not consumed or overflow:
                raise ValueError("argument couldn't be parsed as an octal number")
        _check_bounds(value, d, self._fmt)
        if self.clamp is not None:
            value = min(max(value, self.clamp[0]), self.clamp[1])
        return value

    def _fmt(self, value: int) -> str:
        return format(value, "o") if self.base == 8 else str(value)

    def show(self, value: int) -> str:
        return self._fmt(value)

    def describe(self, d: Directive) -> str:
        text = f"{'an octal number' if self.base == 8 else 'an integer'} {_range_text(d, self._fmt)}"
        if self.clamp is not None:
            text += f" (values outside {self.clamp[0]} to {self.clamp[1]} are capped to that range)"
        return text


@dataclass(frozen=True, slots=True)
class Memory(Kind):
    """A byte count, written with optional k/kb/m/mb/g/gb units (Redis's
    memtoull); shown in bytes by CONFIG GET, with the largest exact unit by
    CONFIG REWRITE."""

    def parse(self, args: Sequence[str], d: Directive) -> int:
        value = memtoull(args[0])
        if value is None:
            raise ValueError("argument must be a memory value")
        # Redis stores most memory configs in signed 64-bit fields: a value
        # past 2**63 wraps negative there and fails the bounds check.
        if value > LLONG_MAX and (d.maximum is None or d.maximum <= LLONG_MAX):
            value -= 2**64
        _check_bounds(value, d)
        return value

    def conf(self, value: int) -> str:
        return format_memory(value)

    def describe(self, d: Directive) -> str:
        return f"a byte count {_range_text(d, format_memory)}; units k, kb, m, mb, g, gb are accepted"


@dataclass(frozen=True, slots=True)
class Bool(Kind):
    """yes or no (any case)."""

    def parse(self, args: Sequence[str], d: Directive) -> bool:
        word = ascii_lower(args[0])
        if word not in ("yes", "no"):
            raise ValueError("argument must be 'yes' or 'no'")
        return word == "yes"

    def show(self, value: bool) -> str:
        return "yes" if value else "no"

    def describe(self, d: Directive) -> str:
        return "yes or no"


@dataclass(frozen=True, slots=True)
class Enum(Kind):
    """One of a fixed set of lowercase words (accepted in any case)."""

    choices: tuple[str, ...]
    #: Other accepted words and the choice each stands for (Redis's maxmemory-policy names).
    synonyms: tuple[tuple[str, str], ...] = ()

    def parse(self, args: Sequence[str], d: Directive) -> str:
        word = ascii_lower(args[0])
        word = dict(self.synonyms).get(word, word)
        if word not in self.choices:
            # Redis builds this in a 256-byte buffer, hence the cut.
            raise ValueError(("argument(s) must be one of the following: " + ", ".join(self.choices))[:255])
        return word

    def describe(self, d: Directive) -> str:
        text = "one of " + ", ".join(self.choices)
        if self.synonyms:
            text += " (also " + ", ".join(f"{word} for {choice}" for word, choice in self.synonyms) + ")"
        return text


@dataclass(frozen=True, slots=True)
class Inapplicable(Kind):
    """A redis-server directive pfxcached has no use for: any value is accepted and kept, for
    CONFIG GET and tools that read it, and has no effect (the daemon says so once at startup)."""

    multi_arg = True

    def parse(self, args: Sequence[str], d: Directive) -> str:
        return " ".join(args)

    def conf(self, value: str) -> str:
        return value if value else '""'

    def describe(self, d: Directive) -> str:
        return "anything (no effect)"


@dataclass(frozen=True, slots=True)
class String(Kind):
    """Any single argument; "" is allowed and written back as ``""``."""

    def parse(self, args: Sequence[str], d: Directive) -> str:
        return args[0]

    def conf(self, value: str) -> str:
        return quote(value)

    def describe(self, d: Directive) -> str:
        return "a string"


_FLOAT_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _format_float(value: float) -> str:
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True, slots=True)
class Float(Kind):
    """A finite decimal number (Redis 7.0 has no plain float configs; the
    wording follows its integer ones)."""

    def parse(self, args: Sequence[str], d: Directive) -> float:
        if not _FLOAT_RE.fullmatch(args[0]):
            raise ValueError("argument couldn't be parsed into a float")
        value = float(args[0])
        _check_bounds(value, d, _format_float)
        return value

    def show(self, value: float) -> str:
        return _format_float(value)

    def describe(self, d: Directive) -> str:
        return f"a number {_range_text(d, _format_float)}"


@dataclass(frozen=True, slots=True)
class Percentiles(Kind):
    """latency-tracking-info-percentiles: numbers from 0 to 100 separated by spaces ("" for
    none), shown as Redis shows them ("%f" without trailing zeros)."""

    multi_arg = True

    def parse(self, args: Sequence[str], d: Directive) -> tuple[float, ...]:
        if len(args) == 1 and args[0] == "":
            return ()
        values = []
        for arg in args:
            if not _FLOAT_RE.fullmatch(arg):
                raise ValueError(f"Invalid {d.name} parameters")
            value = float(arg)
            if not 0.0 <= value <= 100.0:
                raise ValueError(f"{d.name} parameters should sit between [0.0,100.0]")
            values.append(value)
        return tuple(values)

    def show(self, value: Sequence[float]) -> str:
        return " ".join(f"{v:f}".rstrip("0").rstrip(".") for v in value)

    def conf(self, value: Sequence[float]) -> str:
        return self.show(value) if value else '""'

    def describe(self, d: Directive) -> str:
        return 'percentiles from 0 to 100 separated by spaces, or "" for none'


@dataclass(frozen=True, slots=True)
class AddressList(Kind):
    """bind: up to ``limit`` addresses; a single "" means none. The typed
    value is a list of str (a tuple inside the Config)."""

    limit: int = 16
    multi_arg = True

    def parse(self, args: Sequence[str], d: Directive) -> tuple[str, ...]:
        if len(args) > self.limit:
            raise ValueError("Too many bind addresses specified.")
        if len(args) == 1 and args[0] == "":
            return ()
        return tuple(args)

    def show(self, value: Sequence[str]) -> str:
        return " ".join(value)

    def conf(self, value: Sequence[str]) -> str:
        return " ".join(value) if value else '""'

    def describe(self, d: Directive) -> str:
        return f'up to {self.limit} addresses separated by spaces, or "" for none'


@dataclass(frozen=True, slots=True)
class Save(Kind):
    """Redis's ``save <seconds> <changes> [...]`` snapshot schedule, validated
    as Redis does; the typed value is the schedule as CONFIG GET shows it
    ("" for none)."""

    multi_arg = True

    def parse(self, args: Sequence[str], d: Directive) -> str:
        if len(args) == 1 and args[0] == "":
            args = ()
        elif len(args) == 1:  # one quoted argument ("3600 1"), as Redis splits a multi-arg config's
            args = args[0].split(" ")
        if len(args) % 2:
            raise ValueError("Invalid save parameters")
        numbers = []
        for j, arg in enumerate(args):
            value, consumed, _ = _strtoll(arg, 10)
            if not consumed or value < (1 if j % 2 == 0 else 0):
                raise ValueError("Invalid save parameters")
            numbers.append(value)
        return " ".join(map(str, numbers))

    def conf(self, value: str) -> str:
        return value or '""'

    def describe(self, d: Directive) -> str:
        return '<seconds> <changes> pairs, or "" for no schedule'


@dataclass(frozen=True, slots=True)
class Directory(Kind):
    """dir: an existing, searchable directory, kept as an absolute path.

    Redis chdir()s while parsing; we only check and record it, and leave the
    chdir to the daemon (so loading a file has no side effects)."""

    def parse(self, args: Sequence[str], d: Directive) -> str:
        path = args[0]
        try:
            mode = os.stat(path).st_mode
        except OSError as e:
            raise ValueError(os.strerror(e.errno)) from None
        if not stat.S_ISDIR(mode):
            raise ValueError(os.strerror(errno.ENOTDIR))
        if not os.access(path, os.X_OK):
            raise ValueError(os.strerror(errno.EACCES))
        return os.path.abspath(path)

    def conf(self, value: str) -> str:
        return quote(value)

    def describe(self, d: Directive) -> str:
        return "a directory path"


#: The client classes of client-output-buffer-limit, in CONFIG GET order; "replica" is "slave".
OUTPUT_BUFFER_CLASSES = ("normal", "slave", "pubsub")


@dataclass(frozen=True, slots=True)
class OutputBufferLimits(Kind):
    """Redis's ``client-output-buffer-limit <class> <hard> <soft> <soft-seconds> [...]``.

    The typed value is one ``(hard, soft, soft_seconds)`` triple per class of
    :data:`OUTPUT_BUFFER_CLASSES` (normal, slave, pubsub); 0 means no limit.
    As in Redis, a line or a CONFIG SET value changes only the classes it
    names (``replica`` is ``slave``; ``master`` is refused), sizes take memory
    units (``1mb``), and the whole value is refused on any error.
    pfxcached enforces the normal class (it has no replicas or subscribers).
    """

    multi_arg = True

    def parse(self, args: Sequence[str], d: Directive) -> tuple[tuple[int, int, int], ...]:
        return self.parse_over(d.initial(), args, d)

    def parse_over(self, old: Any, args: Sequence[str], d: Directive) -> tuple[tuple[int, int, int], ...]:
        if len(args) == 1 and args[0] == "":
            args = ()
        if len(args) % 4:
            raise ValueError("Wrong number of arguments in buffer limit configuration.")
        limits = list(old)
        for j in range(0, len(args), 4):
            name = ascii_lower(args[j])
            name = "slave" if name == "replica" else name
            if name not in OUTPUT_BUFFER_CLASSES:
                raise ValueError("Invalid client class specified in buffer limit configuration.")
            hard, soft = memtoull(args[j + 1]), memtoull(args[j + 2])
            seconds, consumed, _ = _strtoll(args[j + 3], 10)
            if hard is None or soft is None or seconds < 0 or not consumed:
                raise ValueError("Error in hard, soft or soft_seconds setting in buffer limit configuration.")
            limits[OUTPUT_BUFFER_CLASSES.index(name)] = (hard, soft, seconds)
        return tuple(limits)

    def show(self, value: Sequence[Sequence[int]]) -> str:
        return " ".join(
            f"{name} {hard} {soft} {seconds}" for name, (hard, soft, seconds) in zip(OUTPUT_BUFFER_CLASSES, value)
        )

    def conf(self, value: Sequence[Sequence[int]]) -> str:
        return " ".join(
            f"{name} {format_memory(hard)} {format_memory(soft)} {seconds}"
            for name, (hard, soft, seconds) in zip(OUTPUT_BUFFER_CLASSES, value)
        )

    def describe(self, d: Directive) -> str:
        return ("groups of <class> <hard limit> <soft limit> <soft seconds>, class normal, replica (slave) "
                "or pubsub, limits in bytes with optional units (0: no limit)")


# ---------------------------------------------------------------------------
# The row: one directive.
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Computed:
    """A default worked out when a :class:`Config` is created (dir's is the
    working directory). ``conf`` is the value the documented file shows."""

    compute: Callable[[], Any]
    doc: str
    conf: str


@dataclass(frozen=True, slots=True)
class Directive:
    """One configuration setting: a row of :data:`DIRECTIVES`.

    ``minimum``/``maximum`` bound numeric kinds (inclusive). ``mutable``:
    CONFIG SET may change it (else "can't set immutable config").
    ``protected``: CONFIG SET refuses it as Redis 7 refuses its protected
    configs (enable-protected-configs defaults to no). ``allowed``: when set,
    parsed values outside it are refused with ``refusal`` as the reason --
    how compatibility-only settings (save, appendonly, ...) accept only the
    value that matches what pfxcached does. ``aliases`` are other names that
    work everywhere a name does, as Redis 7's aliases do.
    """

    name: str
    kind: Kind
    default: Any
    minimum: int | float | None = None
    maximum: int | float | None = None
    mutable: bool = True
    doc: str = ""
    aliases: tuple[str, ...] = ()
    protected: bool = False
    allowed: tuple[Any, ...] | None = None
    refusal: str = ""
    #: With ``allowed``: a value outside it in a config file or on the command line is accepted,
    #: kept at the default and reported in the startup warning instead of being fatal (a stock
    #: redis.conf says ``daemonize yes`` and ``databases 16``); CONFIG SET still refuses it.
    lenient: bool = False

    def initial(self) -> Any:
        """The default value (computing it when it is :class:`Computed`)."""
        return self.default.compute() if isinstance(self.default, Computed) else self.default


@dataclass(frozen=True, slots=True)
class TenantQuotas(Kind):
    """``tenant-quota <pattern> <max-pages> <max-leased-blocks> <max-leases> [...]``.

    The typed value is a tuple of ``(pattern, max_pages, max_leased, max_leases)`` rules, in
    the order given (a namespace falls under the first pattern matching it; 0: no limit on
    that one). As client-output-buffer-limit does for its classes, a line or a CONFIG SET
    value changes only the patterns it names: a rule of three zeros removes its pattern, and
    CONFIG SET tenant-quota "" removes every rule. The whole value is refused on any error.
    """

    multi_arg = True

    def parse(self, args: Sequence[str], d: Directive) -> tuple[tuple[str, int, int, int], ...]:
        return self.parse_over(d.initial(), args, d)

    def parse_over(self, old: Any, args: Sequence[str], d: Directive) -> tuple[tuple[str, int, int, int], ...]:
        if len(args) == 1 and args[0] == "":
            return ()
        if len(args) == 1:  # one quoted argument ("a:* 100 10 5"), as the command line gives it
            args = args[0].split(" ")
        if len(args) % 4:
            raise ValueError("Wrong number of arguments in tenant-quota: groups of <pattern> <max-pages> "
                             "<max-leased-blocks> <max-leases>")
        rules = {pattern: limits for pattern, *limits in old}
        for j in range(0, len(args), 4):
            pattern = args[j]
            if not pattern:
                raise ValueError("tenant-quota patterns must not be empty")
            limits = []
            for text in args[j + 1 : j + 4]:
                if not (text.isascii() and text.isdigit() and len(text) <= 18):
                    raise ValueError(f"tenant-quota limits must be integers >= 0, got '{text}'")
                limits.append(int(text))
            if any(limits):
                rules[pattern] = limits
            else:
                rules.pop(pattern, None)
        return tuple((pattern, *limits) for pattern, limits in rules.items())

    def show(self, value: Sequence[Sequence[Any]]) -> str:
        return " ".join(f"{pattern} {pages} {leased} {leases}" for pattern, pages, leased, leases in value)

    def describe(self, d: Directive) -> str:
        return ("groups of <namespace pattern> <max cached pages> <max leased blocks> <max leases> "
                "(0: no limit on that one)")

