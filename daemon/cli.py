"""``pfxcached [path/to/pfxcached.conf] [--directive value ...]``, like redis-server.

The first argument, unless it starts with ``--``, is a config file; every
``--name value ...`` pair after it overrides a directive, exactly as
``redis-server /etc/redis.conf --port 7000`` does. ``--port 0`` asks the kernel
for a free port; the log line ``Ready to accept connections tcp on HOST:PORT``
reports the address actually bound. ``--help`` lists every directive, from the
directive table.
"""

from __future__ import annotations

import os
import re
import sys

import trio

from pfxcache import __version__

from pfxcache.daemon.config.directives import DIRECTIVES
from pfxcache.daemon.config.engine import Config, ConfigError
from pfxcache.daemon.config.kinds import Computed, Enum, Inapplicable
from pfxcache.daemon.observability import logs
from pfxcache.daemon.server.assembly import run_daemon
from pfxcache.daemon.server.errors import StartupError
from pfxcache.daemon.server.server import REDIS_COMPAT_VERSION

USAGE = """\
Usage: pfxcached [/path/to/pfxcached.conf] [options]
       pfxcached -v or --version
       pfxcached -h or --help

Examples:
       pfxcached (run with the embedded defaults: 127.0.0.1:6390)
       pfxcached --port 0 (pick a free port and print it)
       pfxcached conf/pfxcached.conf --loglevel verbose
"""


#: Where a directive's doc ends its first sentence (not after "e.g." or "i.e.").
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.\s+(?=[A-Za-z\"(])")
#: A first sentence longer than this is cut at its first "; " (else ": ") for the one-line summary.
_SUMMARY_WIDTH = 100


def _summary(doc: str) -> str:
    """A directive's doc in a line: its first sentence, or that sentence's first clause when long."""
    sentence = _SENTENCE_END.split(doc, maxsplit=1)[0].rstrip(".")
    for cut in ("; ", ": "):
        head = sentence.split(cut, 1)[0]
        if len(sentence) > _SUMMARY_WIDTH and head != sentence and head.count("(") == head.count(")"):
            sentence = head
    return sentence + "."


def directives_help() -> str:
    """One line per directive of the table: name, default, what it does (its doc's first sentence)."""
    rows = []
    for d in DIRECTIVES:
        if isinstance(d.kind, Inapplicable):
            continue
        default = d.default.conf if isinstance(d.default, Computed) else d.kind.conf(d.default)
        what = _summary(d.doc)
        if isinstance(d.kind, Enum) and not all(choice in what for choice in d.kind.choices):
            what += " One of " + ", ".join(d.kind.choices) + "."
        rows.append((d.name, default if default != "" else '""', what))
    name_width = min(max(len(name) for name, _, _ in rows), 26)
    default_width = min(max(len(default) for _, default, _ in rows), 12)
    lines = ["Directives (in the config file, or on the command line as --name value; "
             "conf/pfxcached.conf documents each):"]
    for name, default, what in rows:
        lines.append(f"  {name:<{name_width}}  {default:<{default_width}}  {what}")
    return "\n".join(lines) + "\n"


def build_config(argv: list[str]) -> Config:
    """Defaults, then the config file (if any), then command-line directives."""
    config = Config()
    args = list(argv)
    if args and not args[0].startswith("--"):
        config.load_file(args.pop(0))
    config.apply_args(args)
    return config


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pfxcached`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-v", "--version"):
        print(f"pfxcached v={__version__} redis-compat={REDIS_COMPAT_VERSION} python={sys.version.split()[0]}")
        return 0
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        print(directives_help(), end="")
        return 0
    try:
        config = build_config(argv)
    except ConfigError as exc:
        print(exc.message, file=sys.stderr)
        return 1
    try:
        os.chdir(config["dir"])
    except OSError as exc:
        print(f"Can't chdir to '{config['dir']}': {exc.strerror}", file=sys.stderr)
        return 1
    logs.configure(config["loglevel"], config["logfile"])
    logs.log.info("pfxcached %s starting (Redis %s compatible), pid=%d", __version__, REDIS_COMPAT_VERSION, os.getpid())
    if config.ignored:
        logs.log.warning("These directives have no effect in pfxcached and were ignored: %s",
                         ", ".join(config.ignored))
    try:
        trio.run(run_daemon, config)
    except StartupError as exc:
        logs.log.warning("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
