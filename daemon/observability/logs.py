"""Logging in redis-server's format: ``pid:M dd Mon yyyy hh:mm:ss.mmm * message``.

``loglevel`` and ``logfile`` are the Redis directives: levels debug, verbose,
notice, warning, nothing; an empty logfile means standard output.
"""

from __future__ import annotations

import logging
import os
import sys
import time

VERBOSE = 15
logging.addLevelName(VERBOSE, "VERBOSE")
#: For the few lines a supervisor or test needs whatever the loglevel (the
#: address bound with --port 0): shown at every level but "nothing", marked '*'.
ANNOUNCE = logging.WARNING + 5
logging.addLevelName(ANNOUNCE, "ANNOUNCE")

#: Redis level name -> (logging level, the mark Redis prints for it).
LEVELS = {
    "debug": logging.DEBUG,
    "verbose": VERBOSE,
    "notice": logging.INFO,
    "warning": logging.WARNING,
    "nothing": logging.CRITICAL + 10,
}
_MARKS = {logging.DEBUG: ".", VERBOSE: "-", logging.INFO: "*", logging.WARNING: "#", ANNOUNCE: "*"}

log = logging.getLogger("pfxcached")


class RedisFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%d %b %Y %H:%M:%S", time.localtime(record.created))
        mark = _MARKS.get(record.levelno, "#")
        text = f"{os.getpid()}:M {stamp}.{int(record.msecs):03d} {mark} {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(loglevel: str, logfile: str) -> None:
    """(Re)configure the daemon's logger; safe to call again at runtime."""
    for handler in list(log.handlers):
        log.removeHandler(handler)
        if handler.stream not in (sys.stdout, sys.stderr):  # type: ignore[attr-defined]
            handler.close()
    handler = logging.FileHandler(logfile) if logfile else logging.StreamHandler(sys.stdout)
    handler.setFormatter(RedisFormatter())
    log.addHandler(handler)
    log.setLevel(LEVELS[loglevel])
    log.propagate = False


def set_level(loglevel: str) -> None:
    log.setLevel(LEVELS[loglevel])
