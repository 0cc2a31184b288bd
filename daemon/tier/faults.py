"""Injected disk faults, for tests and drills of the disk tier (env ``PFXCACHE_TIER_FAULTS``).

Rules:

* A spec is a comma-separated list of ``KIND:OP:VALUE`` items; each KIND:OP pair at most once:

  - ``eio:read:P``, ``eio:write:P``: raise ``OSError(EIO)`` with probability P (0 to 1);
  - ``enospc:write:P``, ``efbig:write:P``: raise ``OSError(ENOSPC)`` / ``OSError(EFBIG)``;
  - ``delay:read:D``, ``delay:write:D``: sleep D before each read or write, D a number with the
    unit ``us``, ``ms`` or ``s`` (``200ms``).

  An empty spec or None means no faults (:meth:`Faults.parse` returns None); anything else
  that does not parse is a ValueError saying why.
* The draws come from one ``random.Random(0)``: a given sequence of calls fails the same way
  on every run.
* TierFiles calls :meth:`Faults.before_read` / :meth:`Faults.before_write` inside the try block
  of each run of pages it reads or writes, so an injected error takes the path a real one takes.
  The delay comes first, then the errors, each drawn in the order the spec gave them.
"""

from __future__ import annotations

import errno
import os
import random
import re
import threading
import time

_ERRORS = {"eio": errno.EIO, "enospc": errno.ENOSPC, "efbig": errno.EFBIG}
_OPERATIONS_OF = {"eio": ("read", "write"), "enospc": ("write",), "efbig": ("write",),
                  "delay": ("read", "write")}
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?)(us|ms|s)")


class Faults:
    """The faults one spec asks for; thread-safe."""

    __slots__ = ("spec", "_delays", "_errors", "_random", "_lock")

    def __init__(self, spec: str, delays: dict[str, float],
                 errors: dict[str, list[tuple[int, float]]]) -> None:
        self.spec = spec
        self._delays = delays
        self._errors = errors
        self._random = random.Random(0)
        self._lock = threading.Lock()  # keeps the draws one sequence whichever thread asks

    @classmethod
    def parse(cls, spec: str | None) -> Faults | None:
        if spec is None or not spec.strip():
            return None
        delays: dict[str, float] = {}
        errors: dict[str, list[tuple[int, float]]] = {"read": [], "write": []}
        seen: set[tuple[str, str]] = set()
        for item in spec.split(","):
            parts = [part.strip().lower() for part in item.split(":")]
            if len(parts) != 3:
                raise ValueError(f"fault {item.strip()!r} is not KIND:OP:VALUE")
            kind, operation, value = parts
            if kind not in _OPERATIONS_OF:
                raise ValueError(f"fault {item.strip()!r}: unknown kind {kind!r} "
                                 f"(one of {', '.join(_OPERATIONS_OF)})")
            if operation not in _OPERATIONS_OF[kind]:
                raise ValueError(f"fault {item.strip()!r}: {kind} applies to "
                                 f"{' and '.join(_OPERATIONS_OF[kind])} only")
            if (kind, operation) in seen:
                raise ValueError(f"fault {kind}:{operation} is given twice")
            seen.add((kind, operation))
            if kind == "delay":
                delays[operation] = _parse_duration(item.strip(), value)
            else:
                errors[operation].append((_ERRORS[kind], _parse_probability(item.strip(), value)))
        return cls(spec, delays, errors)

    def before_read(self) -> None:
        self._before("read")

    def before_write(self) -> None:
        self._before("write")

    def _before(self, operation: str) -> None:
        delay = self._delays.get(operation)
        if delay:
            time.sleep(delay)
        for code, probability in self._errors[operation]:
            with self._lock:
                draw = self._random.random()
            if draw < probability:
                raise OSError(code, f"{os.strerror(code)} (injected by PFXCACHE_TIER_FAULTS)")

    def __repr__(self) -> str:
        return f"Faults({self.spec!r})"


def _parse_probability(item: str, value: str) -> float:
    try:
        probability = float(value)
    except ValueError:
        raise ValueError(f"fault {item!r}: {value!r} is not a probability") from None
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"fault {item!r}: probability {value} is not between 0 and 1")
    return probability


def _parse_duration(item: str, value: str) -> float:
    match = _DURATION.fullmatch(value)
    if match is None:
        raise ValueError(f"fault {item!r}: {value!r} is not a duration such as 200ms, 50us or 1s")
    return float(match.group(1)) * _UNITS[match.group(2)]
