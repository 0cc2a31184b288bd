"""``pfxcached [path/to/pfxcached.conf] [--directive value ...]``, like redis-server.

The first argument, unless it starts with ``--``, is a config file; every
``--name value ...`` pair after it overrides a directive, exactly as
``redis-server /etc/redis.conf --port 7000`` does. ``--port 0`` asks the kernel
for a free port; the log line ``Ready to accept connections tcp on HOST:PORT``
reports the address actually bound.
"""

from __future__ import annotations

import os
import sys

import trio

from pfxcache import __version__

from pfxcache.daemon.observability import logs
from pfxcache.daemon.config.engine import Config, ConfigError
from pfxcache.daemon.server.server import REDIS_COMPAT_VERSION, Server, StartupError

USAGE = """\
Usage: pfxcached [/path/to/pfxcached.conf] [options]
       pfxcached -v or --version
       pfxcached -h or --help

Examples:
       pfxcached (run with the embedded defaults: 127.0.0.1:6390)
       pfxcached --port 0 (pick a free port and print it)
       pfxcached conf/pfxcached.conf --loglevel verbose
"""


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
        print(USAGE, end="")
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
        server = Server(config)
        trio.run(server.serve)
    except StartupError as exc:
        logs.log.warning("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
