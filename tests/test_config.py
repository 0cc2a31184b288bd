"""Tests for pfxcache.daemon.config.engine: the directive table and everything
derived from it (defaults, config file, command line, CONFIG GET/SET/REWRITE,
the documented conf file).

Where pfxcached and redis-server 7.0.15 share a directive, error texts are
compared with a real redis-server (skipped only when /usr/bin/redis-server is
missing). It listens on a Unix socket only, so it never competes for a port.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from pfxcache.daemon.config.engine import (
    ALL_DIRECTIVES,
    DIRECTIVES,
    REDIS_ONLY,
    REWRITE_SIGNATURE,
    Bool,
    Computed,
    Config,
    ConfigError,
    Directive,
    Enum,
    Float,
    Int,
    Memory,
    String,
    conf_text,
    memtoull,
    quote,
)
from pfxcache.protocol.redis_strings import splitargs

REPO = Path(__file__).resolve().parent.parent
SHIPPED_CONF = REPO / "conf" / "pfxcached.conf"
REDIS_SERVER = "/usr/bin/redis-server"

needs_redis = pytest.mark.skipif(not os.path.exists(REDIS_SERVER), reason="redis-server is not installed")


# ---------------------------------------------------------------------------
# A real redis-server to compare with.
# ---------------------------------------------------------------------------


class RedisRaw:
    """A minimal RESP client over a Unix socket that returns replies
    verbatim, so error texts are compared exactly as sent (with "ERR ")."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self.sock.settimeout(5)
        self.buf = b""

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "redis-server closed the connection"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(65536)
            assert chunk
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b"-"):
            return kind.decode(), rest.decode("utf-8", "surrogateescape")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            return [self._reply() for _ in range(int(rest))]
        raise AssertionError(f"unexpected reply {line!r}")

    def call(self, *args: bytes | str):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a.encode() if isinstance(a, str) else a
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self._reply()

    def config_get(self, *patterns: str) -> dict[str, str]:
        flat = self.call("CONFIG", "GET", *patterns)
        return {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed")
    work = tmp_path_factory.mktemp("redis")
    path = str(work / "redis.sock")
    proc = subprocess.Popen(
        [REDIS_SERVER, "--port", "0", "--unixsocket", path, "--save", "", "--dir", str(work)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            # The socket file appears at bind(), a moment before listen(): connect until it answers.
            try:
                client = RedisRaw(path)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("redis-server did not start")
                time.sleep(0.01)
        yield client
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def redis_config_error(tmp_path: Path, text: str, *args: str) -> tuple[int, str, str]:
    """Run redis-server on a config file (or none) and return the (line number,
    line, reason) of its FATAL CONFIG FILE ERROR block."""
    argv = [REDIS_SERVER]
    if text is not None:
        conf = tmp_path / "redis.conf"
        conf.write_text(text)
        argv.append(str(conf))
    proc = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=10, cwd=tmp_path)
    lines = proc.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if "FATAL CONFIG FILE ERROR" in line)
    where, shown, reason = lines[start + 1 : start + 4]
    assert where.startswith("Reading the configuration file, at line ")
    assert shown.startswith(">>> '") and shown.endswith("'")
    return int(where.rsplit(" ", 1)[1]), shown[5:-1], reason


def our_error(call, *args) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        call(*args)
    return info.value


# ---------------------------------------------------------------------------
# The table and its defaults.
# ---------------------------------------------------------------------------

EXPECTED_DEFAULTS = {
    "bind": ["127.0.0.1"],
    "port": 6390,
    "maxclients": 10000,
    "timeout": 0,
    "tcp-keepalive": 300,
    "tcp-backlog": 511,
    "loglevel": "notice",
    "logfile": "",
    "pidfile": "",
    "unixsocket": "",
    "unixsocketperm": 0,
    "proto-max-bulk-len": 512 * 1024 * 1024,
    "client-query-buffer-limit": 1024**3,
    "client-output-buffer-limit": [(0, 0, 0), (256 * 1024**2, 64 * 1024**2, 60), (32 * 1024**2, 8 * 1024**2, 60)],
    "requirepass": "",
    "aclfile": "",
    "protected-mode": True,
    "shutdown-timeout": 10,
    "databases": 1,
    "save": "",
    "dbfilename": "dump.pfx",
    "disk-tier-size": 0,
    "disk-tier-path": "",
    "disk-tier-write": "back",
    "disk-tier-fsync": "batch",
    "disk-tier-read-timeout": 500,
    "disk-tier-queue": 64 * 1024**2,
    "remote-tier": "",
    "remote-tier-password": "",
    "remote-tier-timeout": 50,
    "remote-tier-queue": 64 * 1024**2,
    "remote-tier-ttl": 0,
    "remote-tier-shutdown-flush": 2000,
    "remote-tier-write": "through",
    "appendonly": False,
    "daemonize": False,
    "hz": 10,
    # the prefix store
    "maxmemory": 256 * 1024**2,
    "maxmemory-policy": "guard",
    "lfu-log-factor": 10,
    "lfu-decay-time": 1,
    "page-size": 16,
    "block-bytes": 16384,
    "shards": 16,
    "lease-ttl": 30000,
    "client-lease-limit": 100000,
    "tenant-quota": [],
    "evict-low-watermark": 5,
    "prompt-max-tokens": 1 << 20,
    "arena": "shm",
    "arena-name": "pfxcache",
    "arena-partition": [],
    "metrics-port": 0,
    "metrics-bind": ["127.0.0.1"],
    "metrics-namespaces": 100,
    "arena-device": 0,
    # KV events
    "kv-events-endpoint": "",
    "kv-events-replay-endpoint": "",
    "kv-events-topic": "",
    "kv-events-replay-buffer": 10000,
    "kv-events-queue-size": 100000,
    "kv-events-hwm": 100000,
    "kv-events-pubsub": False,
    # operating it (issue 17)
    "slowlog-log-slower-than": 10000, "slowlog-max-len": 128, "latency-monitor-threshold": 0,
    "acllog-max-len": 128, "latency-tracking": True, "latency-tracking-info-percentiles": [50.0, 99.0, 99.9],
    "enable-debug-command": "no",
}


def test_defaults():
    config = Config()
    values = config.as_dict()
    assert values.pop("dir") == os.getcwd()
    redis_only = {d.name: values.pop(d.name) for d in REDIS_ONLY}
    assert values == EXPECTED_DEFAULTS
    # The redis-server-only directives show what a stock redis-server 7.0.15 shows.
    assert redis_only["appendfsync"] == "everysec" and redis_only["maxmemory-samples"] == "5"
    assert len(redis_only) > 100
    assert config["port"] == 6390 and isinstance(config["port"], int)
    assert config["protected-mode"] is True
    assert config["PORT"] == 6390  # names are case-insensitive
    assert "Port" in config and "nosuch" not in config
    with pytest.raises(KeyError):
        config["nosuch"]


def test_mutability_matches_redis():
    immutable = {d.name for d in DIRECTIVES if not d.mutable}
    assert immutable == {
        "tcp-backlog", "unixsocket", "unixsocketperm", "logfile", "pidfile", "databases", "daemonize", "aclfile",
        # ours: the arena and the tree's geometry are fixed for the life of the process
        "maxmemory", "page-size", "block-bytes", "shards", "arena", "arena-name",
        "arena-device", "arena-partition",
        # ours: the metrics endpoint is opened once, at start-up
        "metrics-port", "metrics-bind",
        # ours: the disk tier's files are opened once, at start-up
        "disk-tier-size", "disk-tier-path", "disk-tier-write", "disk-tier-fsync",
        # ours: the shared tier's connection is made once, at start-up
        "remote-tier", "remote-tier-password", "remote-tier-timeout", "remote-tier-ttl", "remote-tier-write",
        # immutable in redis-server too
        "enable-debug-command",
    }
    assert {d.name for d in DIRECTIVES if d.protected} == {"dir", "dbfilename"}


def test_list_values_are_copies():
    config = Config()
    config["bind"].append("0.0.0.0")
    assert config["bind"] == ["127.0.0.1"]


@pytest.mark.parametrize("d", DIRECTIVES, ids=lambda d: d.name)
def test_row_is_consistent(d: Directive):
    """Every row is documented, and its default survives the trip through
    the conf-file form and CONFIG GET's form."""
    assert d.name == d.name.lower() and d.doc.strip()
    if isinstance(d.default, Computed):
        return
    args = [a.decode() for a in splitargs(d.kind.conf(d.default).encode())]
    assert Config()._parse(d, args) == d.default
    shown = d.kind.show(d.default)
    set_args = (shown.split(" ") if shown else []) if d.kind.multi_arg else [shown]
    assert Config()._parse(d, set_args) == d.default


# ---------------------------------------------------------------------------
# The shipped, documented conf file.
# ---------------------------------------------------------------------------


def test_shipped_conf_is_generated_from_the_table():
    """Fails when a row is added or changed without regenerating the file:
    python -m pfxcache.daemon.config > conf/pfxcached.conf"""
    assert SHIPPED_CONF.read_text() == conf_text()


def test_shipped_conf_documents_every_directive():
    text = SHIPPED_CONF.read_text()
    blocks = text.split("#" * 78 + "\n")[1:]
    assert len(blocks) == len(DIRECTIVES)
    for d, block in zip(DIRECTIVES, blocks):
        lines = block.rstrip("\n").split("\n")
        assert lines[0] == f"# {d.name}"
        assert lines[-1].split()[:1] == [d.name] or lines[-1].split()[:2] == ["#", d.name]
        comment = " ".join(line[2:] for line in lines[:-1])
        assert "Default:" in comment and "CONFIG SET:" in comment and "Accepts:" in comment


def test_shipped_conf_loads_to_the_defaults():
    config = Config()
    config.load_file(str(SHIPPED_CONF))
    assert config.as_dict() == Config().as_dict()
    assert config.config_file == str(SHIPPED_CONF)


def test_conf_text_names_new_rows():
    extra = Directive(name="page-size", kind=Memory(), default=4096, minimum=1, maximum=2**40, doc="Bytes per page.")
    text = conf_text((*DIRECTIVES, extra))
    assert "# page-size\n#\n# Bytes per page.\n#\n# Default: 4kb." in text
    assert text.endswith("page-size 4kb\n")


# ---------------------------------------------------------------------------
# Redis's parsing helpers.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "plain", 'a "quoted" \\ value', "tab\tnew\nline", "\udcff\x01é"])
def test_quote_round_trips(value):
    text = quote(value)
    assert text.isascii()
    [raw] = splitargs(text.encode())
    assert raw.decode("utf-8", "surrogateescape") == value


def test_memtoull():
    assert memtoull("100") == 100
    assert memtoull("1k") == 1000 and memtoull("1K") == 1000 and memtoull("1kb") == 1024
    assert memtoull("2mb") == 2 * 1024**2 and memtoull("3g") == 3 * 10**9 and memtoull("1GB") == 1024**3
    assert memtoull("7b") == 7 and memtoull("") == 0 and memtoull("k") == 0
    assert memtoull("18446744073709551616") == 2**64 - 1  # strtoull saturates
    assert memtoull("20000000000gb") == (20000000000 * 1024**3) % 2**64  # and C wraps
    for bad in ["-1", "+1", " 1", "1.5mb", "1tb", "0x10", "1kB "]:
        assert memtoull(bad) is None, bad


# ---------------------------------------------------------------------------
# The config file.
# ---------------------------------------------------------------------------


def write(tmp_path: Path, text: str | bytes, name: str = "test.conf") -> str:
    path = tmp_path / name
    if isinstance(text, str):
        path.write_text(text)
    else:
        path.write_bytes(text)
    return str(path)


def test_load_file(tmp_path):
    path = write(
        tmp_path,
        "# comment\n\n   # indented comment\nPORT 7000\nbind 127.0.0.1 ::1\n"
        "maxclients 10\nmaxclients 20\r\nproto-max-bulk-len 2MB\nloglevel WARNING\n"
        "requirepass \"se cret\"\nprotected-mode No\nhz 1000\nsave \"\"\nsave\n"
        f"unixsocketperm 0770\ndir {tmp_path}\n",
    )
    config = Config()
    config.load_file(path)
    assert config["port"] == 7000
    assert config["bind"] == ["127.0.0.1", "::1"]
    assert config["maxclients"] == 20  # the later line wins
    assert config["proto-max-bulk-len"] == 2 * 1024**2
    assert config["loglevel"] == "warning"
    assert config["requirepass"] == "se cret"
    assert config["protected-mode"] is False
    assert config["hz"] == 500  # clamped, as Redis does
    assert config["unixsocketperm"] == 0o770
    assert config["dir"] == str(tmp_path)
    assert config.config_file == path


def test_load_file_keeps_non_utf8_bytes(tmp_path):
    config = Config()
    config.load_file(write(tmp_path, b'requirepass "\\xff\\xfe"\nlogfile "caf\xc3\xa9.log"\n'))
    assert config["requirepass"].encode("utf-8", "surrogateescape") == b"\xff\xfe"
    assert config["logfile"] == "café.log"


FILE_ERRORS = [
    ("maxclients abc", "argument couldn't be parsed into an integer"),
    ("nosuch 1", "Bad directive or wrong number of arguments"),
    ("port", "wrong number of arguments"),
    ("port 1 2", "wrong number of arguments"),
    ('bind "127.0.0.1', "Unbalanced quotes in configuration line"),
    ('requirepass "a"b', "Unbalanced quotes in configuration line"),
    ("port 70000", "argument must be between 0 and 65535 inclusive"),
    ("port 6390 # a comment", "wrong number of arguments"),
    ("timeout 007", "argument couldn't be parsed into an integer"),
    ("maxclients 0", "argument must be between 1 and 4294967295 inclusive"),
    ("tcp-backlog -1", "argument must be between 0 and 2147483647 inclusive"),
    ("hz abc", "argument couldn't be parsed into an integer"),
    ("protected-mode maybe", "argument must be 'yes' or 'no'"),
    ("proto-max-bulk-len 1k", "argument must be between 1048576 and 9223372036854775807 inclusive"),
    ("proto-max-bulk-len lots", "argument must be a memory value"),
    ("client-query-buffer-limit 99999999999999999999", "argument must be between 1048576 and 9223372036854775807 inclusive"),
    ("unixsocketperm 1000", "argument must be between 0 and 777 inclusive"),
    ("unixsocketperm abc", "argument couldn't be parsed as an octal number"),
    ("save 1", "Invalid save parameters"),
    ("save 0 1", "Invalid save parameters"),
    ("dir /nonexistent-dir", "No such file or directory"),
    ("dir /etc/hostname", "Not a directory"),
    ("bind " + " ".join(["127.0.0.1"] * 17), "Too many bind addresses specified."),
]

# Directives whose values redis-server accepts but pfxcached refuses.
FILE_REFUSALS = [
    ("appendonly yes", "persistence is not supported"),
    ("loglevel foo", "argument(s) must be one of the following: debug, verbose, notice, warning, nothing"),
]


def test_a_stock_redis_conf_is_accepted_and_what_does_not_apply_is_listed(tmp_path):
    path = write(tmp_path, "daemonize yes\ndatabases 16\nappendfsync always\nport 7000\n"
                           "lazyfree-lazy-eviction yes\nsave \"\"\nappendfsync no\n")
    config = Config()
    config.load_file(path)
    config.apply_args(["--maxmemory-samples", "10"])
    assert config["port"] == 7000
    # Values pfxcached cannot honour stay at what it does; the others are kept for CONFIG GET.
    assert config["daemonize"] is False and config["databases"] == 1
    assert config.get([b"appendfsync", b"maxmemory-samples"]) == {"appendfsync": "no", "maxmemory-samples": "10"}
    assert config.ignored == [
        "daemonize yes (pfxcached always runs in the foreground (use systemd, a container or nohup))",
        "databases 16 (only one database (db 0) is supported)",
        "appendfsync", "lazyfree-lazy-eviction", "maxmemory-samples",
    ]
    # At runtime they are refused, not silently dropped.
    assert our_error(config.set, [(b"appendfsync", b"always")]).message.endswith("can't set immutable config")
    assert our_error(config.set, [(b"databases", b"16")]).message.endswith("can't set immutable config")


@pytest.mark.parametrize("line, reason", FILE_ERRORS + FILE_REFUSALS)
def test_file_errors_name_file_line_and_reason(tmp_path, line, reason):
    path = write(tmp_path, f"# first\nport 7000\n\n{line}\ntimeout 5\n")
    config = Config()
    error = our_error(config.load_file, path)
    assert (error.source, error.lineno, error.line, error.reason) == (path, 4, line, reason)
    assert error.message == (
        f"*** FATAL CONFIG FILE ERROR (pfxcache 0.1.0) ***\n"
        f"Reading the configuration file '{path}', at line 4\n>>> '{line}'\n{reason}"
    )
    # All or nothing: the lines before the bad one were not applied.
    assert config["port"] == 6390 and config.config_file is None


@needs_redis
@pytest.mark.parametrize("line, reason", FILE_ERRORS)
def test_file_errors_match_redis(tmp_path, line, reason):
    text = f"# first\nport 0\n\n{line}\n"
    assert redis_config_error(tmp_path, text) == (4, line, reason)
    error = our_error(Config().load_file, write(tmp_path, text, "ours.conf"))
    assert (error.lineno, error.line, error.reason) == (4, line, reason)


def test_missing_file(tmp_path):
    error = our_error(Config().load_file, str(tmp_path / "nope.conf"))
    assert error.message == f"Fatal error, can't open config file '{tmp_path / 'nope.conf'}': No such file or directory"


def test_include(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as in Redis, include paths are relative to the working directory
    (tmp_path / "conf.d").mkdir()
    write(tmp_path, "maxclients 5\ntimeout 9\n", "conf.d/b.conf")
    write(tmp_path, "maxclients 4\nhz 20\n", "conf.d/a.conf")
    write(tmp_path, "port 7001\n", "extra.conf")
    main = write(tmp_path, "port 7000\ninclude extra.conf\ninclude conf.d/*.conf\ninclude empty.d/*.conf\ntimeout 1\n")
    config = Config()
    config.load_file(main)
    assert (config["port"], config["maxclients"], config["hz"], config["timeout"]) == (7001, 5, 20, 1)

    write(tmp_path, "maxclients 1\nport nope\n", "conf.d/c.conf")
    error = our_error(Config().load_file, main)
    assert (error.source, error.lineno, error.line) == ("conf.d/c.conf", 2, "port nope")

    error = our_error(Config().load_file, write(tmp_path, "include missing.conf\n", "m.conf"))
    assert error.message == "Fatal error, can't open config file 'missing.conf': No such file or directory"

    loop = write(tmp_path, "include loop.conf\n", "loop.conf")
    assert "include nested more than" in our_error(Config().load_file, loop).reason


# ---------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------


def test_command_line_overrides_the_file(tmp_path):
    config = Config()
    config.load_file(write(tmp_path, "port 7000\nbind 10.0.0.1\nmaxclients 7\n"))
    config.apply_args(["--port", "0", "--bind", "127.0.0.1", "::1", "--loglevel", "verbose"])
    assert config["port"] == 0
    assert config["bind"] == ["127.0.0.1", "::1"]
    assert config["maxclients"] == 7
    assert config["loglevel"] == "verbose"


def test_command_line_forms():
    config = Config()
    config.apply_args(["--port 7002", "--requirepass", "--not-an-option", "--save", "--timeout", "3"])
    assert config["port"] == 7002  # "--name value" as one argument
    assert config["requirepass"] == "--not-an-option"  # a bare --name takes the next argument
    assert config["save"] == "" and config["timeout"] == 3
    config.apply_args(["--bind", "", "--requirepass", 'quo"te \\ and space', "--save"])
    assert config["bind"] == [] and config["requirepass"] == 'quo"te \\ and space'
    config.apply_args(["port", "7003"])  # bare words before any --option form a line, as in Redis
    assert config["port"] == 7003
    config.apply_args([])
    assert config["port"] == 7003


COMMAND_LINE_ERRORS = [
    (["--port", "0", "--maxclients", "abc"], 2, 'maxclients "abc"', "argument couldn't be parsed into an integer"),
    (["--port", "0", "--nosuch", "1"], 2, 'nosuch "1"', "Bad directive or wrong number of arguments"),
    (["--port"], 1, "port", "wrong number of arguments"),
    (["--port", "1", "2"], 1, 'port "1" "2"', "wrong number of arguments"),
    (["--bind", "127.0.0.1", "--port", "70000"], 2, 'port "70000"', "argument must be between 0 and 65535 inclusive"),
    (["--port", "0", "--protected-mode", "maybe"], 2, 'protected-mode "maybe"', "argument must be 'yes' or 'no'"),
]


@pytest.mark.parametrize("args, lineno, line, reason", COMMAND_LINE_ERRORS)
def test_command_line_errors(args, lineno, line, reason):
    config = Config()
    error = our_error(config.apply_args, args)
    assert (error.source, error.lineno, error.line, error.reason) == ("command line", lineno, line, reason)
    assert error.message.splitlines()[1:] == [f"Reading the command line, at option {lineno}", f">>> '{line}'", reason]
    assert config.as_dict() == Config().as_dict()  # all or nothing


@needs_redis
@pytest.mark.parametrize("args, lineno, line, reason", COMMAND_LINE_ERRORS)
def test_command_line_errors_match_redis(tmp_path, args, lineno, line, reason):
    # redis-server appends the options to the (here absent) file after a
    # newline, so its line numbers are our option numbers plus one.
    assert redis_config_error(tmp_path, None, *args) == (lineno + 1, line, reason)


# ---------------------------------------------------------------------------
# CONFIG GET.
# ---------------------------------------------------------------------------


def test_get():
    config = Config()
    assert config.get([b"port"]) == {"port": "6390"}
    assert config.get([b"PORT", b"port", b"p?rt"]) == {"PORT": "6390"}  # exact names answer as written
    assert config.get([b"save"]) == {"save": ""}  # what redis-benchmark asks
    assert config.get([b"bind", b"protected-mode", b"loglevel"]) == {
        "bind": "127.0.0.1", "protected-mode": "yes", "loglevel": "notice",
    }
    assert config.get([b"proto-max-bulk-len"]) == {"proto-max-bulk-len": "536870912"}
    assert {k: v for k, v in config.get([b"*max*"]).items() if config.lookup(k) in DIRECTIVES} == {
        "maxclients": "10000", "proto-max-bulk-len": "536870912", "maxmemory": "268435456",
        "maxmemory-policy": "guard", "prompt-max-tokens": "1048576",
        "slowlog-max-len": "128", "acllog-max-len": "128",
    }
    assert config.get([b"TCP-*", b"*backlog"]) == {"tcp-backlog": "511", "tcp-keepalive": "300"}
    assert config.get([b"nosuch", b"no*such", b""]) == {}
    assert config.get([]) == {}
    assert set(config.get([b"*"])) == {d.name for d in ALL_DIRECTIVES}
    config.set([(b"bind", b"127.0.0.1 ::1")])
    assert config.get(["bind"]) == {"bind": "127.0.0.1 ::1"}


@needs_redis
@pytest.mark.parametrize(
    "pattern", ["*", "p?rt", "[pt]ort", "PORT", "*max*", "*-*-*", "[^a-z]*", "\\port", "po[", "t*", "*E*T", "[a-d]*"]
)
def test_get_globs_match_redis(redis, pattern):
    names = {d.name for d in ALL_DIRECTIVES}
    redis_names = set(redis.config_get("*"))
    theirs = {k for k in redis.config_get(pattern) if k.lower() in names}
    # Our own directives (page-size, shards ...) have no Redis counterpart to compare with.
    ours = {k for k in Config().get([pattern]) if k.lower() in redis_names}
    assert ours == theirs


@needs_redis
def test_get_values_match_redis(redis):
    # (not maxclients: redis-server lowers it at startup when the file limit is low)
    shared = [
        "timeout", "tcp-keepalive", "tcp-backlog", "proto-max-bulk-len",
        "client-query-buffer-limit", "protected-mode", "loglevel", "unixsocketperm", "shutdown-timeout",
        "requirepass", "appendonly", "daemonize", "save", "logfile", "pidfile", "hz",
        "client-output-buffer-limit",
    ]
    assert Config().get(shared) == redis.config_get(*shared)


def test_aliases_behave_like_redis():
    table = (
        Directive(name="hash-max-listpack-entries", kind=Int(), default=512, minimum=0, maximum=2**63 - 1,
                  aliases=("hash-max-ziplist-entries",), doc="x"),
        Directive(name="port", kind=Int(), default=1, minimum=0, maximum=65535, doc="x"),
    )
    config = Config(table)
    assert config["hash-max-ziplist-entries"] == 512
    # Globs match aliases too, each spelling answered once.
    assert config.get([b"hash-max-*"]) == {"hash-max-listpack-entries": "512", "hash-max-ziplist-entries": "512"}
    assert config.get([b"*ziplist*"]) == {"hash-max-ziplist-entries": "512"}
    assert config.get([b"HASH-MAX-ZIPLIST-ENTRIES"]) == {"HASH-MAX-ZIPLIST-ENTRIES": "512"}
    # A name and its alias are different entries (not a duplicate); the later one wins.
    config.set([(b"hash-max-ziplist-entries", b"1"), (b"hash-max-listpack-entries", b"2")])
    assert config["hash-max-listpack-entries"] == 2
    error = our_error(config.set, [(b"hash-max-ziplist-entries", b"1"), (b"HASH-max-ziplist-entries", b"2")])
    assert error.message.endswith("argument 'HASH-max-ziplist-entries') - duplicate parameter")
    # Value errors name the config as the table spells it.
    error = our_error(config.set, [(b"HASH-MAX-ZIPLIST-ENTRIES", b"x")])
    assert error.message == ("ERR CONFIG SET failed (possibly related to argument 'hash-max-ziplist-entries') "
                             "- argument couldn't be parsed into an integer")


# ---------------------------------------------------------------------------
# CONFIG SET.
# ---------------------------------------------------------------------------

# Error cases for directives redis-server has too; each leaves both unchanged.
SET_ERRORS = [
    ["maxclients", "abc"],
    ["MAXCLIENTS", "abc"],
    ["maxclients", "1.5"],
    ["maxclients", ""],
    ["maxclients", "0"],
    ["maxclients", "-1"],
    ["maxclients", "4294967296"],
    ["maxclients", "99999999999999999999"],
    ["port", "70000"],
    ["port", "1", "port", "2"],
    ["port", "1", "PORT", "2"],
    ["port", "1", "maxclients", "5", "port", "2"],
    ["daemonize", "yes"],
    ["DAEMONIZE", "no"],
    ["nosuch", "1"],
    ["maxclients", "abc", "nosuch", "1"],
    ["daemonize", "yes", "nosuch", "1"],
    ["nosuch", "1", "daemonize", "yes"],
    ["maxclients", "abc", "daemonize", "yes"],
    ["timeout", "5", "maxclients", "abc"],
    ["protected-mode", "maybe"],
    ["protected-mode", ""],
    ["appendonly", "maybe"],
    ["proto-max-bulk-len", "1"],
    ["proto-max-bulk-len", "abc"],
    ["proto-max-bulk-len", "-1"],
    ["proto-max-bulk-len", "1.5mb"],
    ["proto-max-bulk-len", "99999999999999999999"],
    ["proto-max-bulk-len", "9223372036854775808"],
    ["client-query-buffer-limit", "1k"],
    ["timeout", "-1"],
    ["timeout", "007"],
    ["timeout", "+5"],
    ["timeout", " 5"],
    ["timeout", "2147483648"],
    ["tcp-keepalive", "-1"],
    ["tcp-backlog", "5"],
    ["databases", "3"],
    ["unixsocket", "/x"],
    ["unixsocketperm", "1"],
    ["logfile", "x"],
    ["pidfile", "x"],
    ["dir", "/tmp"],
    ["save", "foo"],
    ["save", "1"],
    ["save", "3600  1"],
    ["save", " 3600 1"],
    ["save", '"3600" 1'],
    ["save", "1 -1"],
    ["hz", "abc"],
    ["client-output-buffer-limit", "normal 1 2"],
    ["client-output-buffer-limit", "master 1 2 3"],
    ["client-output-buffer-limit", "foo 1 2 3"],
    ["client-output-buffer-limit", "normal x 2 3"],
    ["client-output-buffer-limit", "normal 1 -2 3"],
    ["client-output-buffer-limit", "normal 1 2 -3"],
    ["client-output-buffer-limit", "normal 1 2 3s"],
    ["client-output-buffer-limit", "normal 1mb 1mb 1 pubsub 1 2"],
    ["shutdown-timeout", "-1"],
    ["bind", " ".join(["127.0.0.1"] * 17)],
]


@needs_redis
@pytest.mark.parametrize("args", SET_ERRORS, ids=" ".join)
def test_set_errors_match_redis(redis, args):
    before = redis.config_get("*")
    kind, theirs = redis.call("CONFIG", "SET", *args)
    assert kind == "-"
    assert redis.config_get("*") == before
    config = Config()
    pairs = [(args[i].encode(), args[i + 1].encode()) for i in range(0, len(args), 2)]
    assert our_error(config.set, pairs).message == theirs
    assert config.as_dict() == Config().as_dict()


@needs_redis
def test_loglevel_error_differs_from_redis_only_by_nothing(redis):
    kind, theirs = redis.call("CONFIG", "SET", "loglevel", "foo")
    ours = our_error(Config().set, [(b"loglevel", b"foo")]).message
    assert ours == theirs + ", nothing"  # pfxcached adds Redis 7.2's "nothing" level


@needs_redis
@pytest.mark.parametrize(
    "name, value",
    [
        ("hz", "1000"), ("hz", "0"), ("timeout", "5"), ("tcp-keepalive", "60"), ("maxclients", "100"),
        ("proto-max-bulk-len", "2mb"), ("proto-max-bulk-len", "1073741824"), ("client-query-buffer-limit", "1GB"),
        ("client-query-buffer-limit", "3000000k"), ("loglevel", "WARNING"), ("protected-mode", "NO"),
        ("shutdown-timeout", "3"), ("save", ""), ("appendonly", "no"),
        ("client-output-buffer-limit", "normal 1mb 512kb 10"), ("client-output-buffer-limit", "replica 1 2 3"),
        ("client-output-buffer-limit", "NORMAL 1 2 3 pubsub 4k 5kb 0 slave 0 0 0"),
        ("client-output-buffer-limit", ""),
    ],
)
def test_accepted_values_read_back_like_redis(redis, name, value):
    original = redis.config_get(name)
    try:
        assert redis.call("CONFIG", "SET", name, value) == ("+", "OK")
        config = Config()
        config.set([(name.encode(), value.encode())])
        assert config.get([name]) == redis.config_get(name)
    finally:
        redis.call("CONFIG", "SET", name, original[name])


def test_set_refusals():
    config = Config()
    for name, value, reason in [
        ("appendonly", "yes", "persistence is not supported"),
        ("loglevel", "foo", "argument(s) must be one of the following: debug, verbose, notice, warning, nothing"),
    ]:
        error = our_error(config.set, [(name.encode(), value.encode())])
        assert error.message == f"ERR CONFIG SET failed (possibly related to argument '{name}') - {reason}"
    assert our_error(config.set, []).message == "ERR wrong number of arguments for 'config|set' command"
    config.set([(b"loglevel", b"nothing"), (b"save", b""), (b"appendonly", b"no")])
    assert config["loglevel"] == "nothing"


def test_set_values():
    config = Config()
    config.set([(b"port", b"0"), (b"bind", b"127.0.0.1 ::1"), (b"requirepass", b"\xff pw"), (b"hz", b"0")])
    assert config["port"] == 0 and config["bind"] == ["127.0.0.1", "::1"] and config["hz"] == 1
    assert config["requirepass"].encode("utf-8", "surrogateescape") == b"\xff pw"
    config.set([(b"bind", b"")])
    assert config["bind"] == []
    config.set([(b"bind", b"127.0.0.1  ::1")])  # split on single spaces, as Redis does
    assert config["bind"] == ["127.0.0.1", "", "::1"]


def test_set_is_all_or_nothing_with_a_vetoing_hook():
    config = Config()
    calls = []
    config.on_change("port", lambda old, new: calls.append(("port", old, new)))
    config.on_change("timeout", lambda old, new: calls.append(("timeout", old, new)))

    def veto(old, new):
        calls.append(("maxclients", old, new))
        raise ValueError("The operating system is not able to handle the specified number of clients, try with 4")

    config.on_change("MAXCLIENTS", veto)
    with pytest.raises(ConfigError) as info:
        config.set([(b"port", b"7000"), (b"maxclients", b"5"), (b"timeout", b"9")])
    assert info.value.message == (
        "ERR CONFIG SET failed (possibly related to argument 'maxclients') - "
        "The operating system is not able to handle the specified number of clients, try with 4"
    )
    assert config.as_dict() == Config().as_dict()
    # The port hook ran, then was called again to undo; the timeout hook never ran.
    assert calls == [("port", 6390, 7000), ("maxclients", 10000, 5), ("port", 7000, 6390)]


def test_hooks():
    config = Config()
    calls = []
    config.on_change("bind", lambda old, new: calls.append((old, new)))
    config.set([(b"bind", b"127.0.0.1")])  # unchanged: no hook, as Redis skips apply
    assert calls == []
    config.set([(b"bind", b"127.0.0.1 ::1")])
    assert calls == [(["127.0.0.1"], ["127.0.0.1", "::1"])]
    config.load_file(str(SHIPPED_CONF))  # files and the command line do not call hooks
    config.apply_args(["--bind", "0.0.0.0"])
    assert len(calls) == 1

    # A value error anywhere means no value changes and no hook runs.
    with pytest.raises(ConfigError):
        config.set([(b"bind", b"::1"), (b"port", b"x")])
    assert config["bind"] == ["0.0.0.0"] and len(calls) == 1

    # A veto without a reason gives Redis's bare message.
    config.on_change("timeout", lambda old, new: (_ for _ in ()).throw(ValueError()))
    assert our_error(config.set, [(b"timeout", b"3")]).message == (
        "ERR CONFIG SET failed (possibly related to argument 'timeout')"
    )

    # A hook that crashes is a bug: values are rolled back and the exception propagates.
    config.on_change("hz", lambda old, new: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        config.set([(b"hz", b"20")])
    assert config["hz"] == 10

    with pytest.raises(KeyError):
        config.on_change("nosuch", lambda old, new: None)


# ---------------------------------------------------------------------------
# CONFIG REWRITE.
# ---------------------------------------------------------------------------


def test_rewrite_without_a_file():
    assert our_error(Config().rewrite).message == "ERR The server is running without a config file"


def test_rewrite_shipped_conf_in_place(tmp_path):
    path = tmp_path / "pfxcached.conf"
    shutil.copy(SHIPPED_CONF, path)
    config = Config()
    config.load_file(str(path))
    config.set([
        (b"port", b"7100"), (b"maxclients", b"77"), (b"bind", b"127.0.0.1 ::1"), (b"loglevel", b"debug"),
        (b"proto-max-bulk-len", b"100mb"), (b"client-query-buffer-limit", b"1048577"),
        (b"requirepass", b'a "b" \\ c\n\xff'), (b"protected-mode", b"no"), (b"hz", b"50"),
    ])
    config.rewrite()

    old, new = SHIPPED_CONF.read_text().split("\n"), path.read_text().split("\n")
    assert len(old) == len(new)  # every line updated in place, nothing appended
    changed = {(a, b) for a, b in zip(old, new) if a != b}
    assert changed == {
        ("port 6390", "port 7100"),
        ("maxclients 10000", "maxclients 77"),
        ("bind 127.0.0.1", "bind 127.0.0.1 ::1"),
        ("loglevel notice", "loglevel debug"),
        ("proto-max-bulk-len 512mb", "proto-max-bulk-len 100mb"),
        ("client-query-buffer-limit 1gb", "client-query-buffer-limit 1048577"),
        ('requirepass ""', 'requirepass "a \\"b\\" \\\\ c\\n\\xff"'),
        ("protected-mode yes", "protected-mode no"),
        ("hz 10", "hz 50"),
    }
    assert REWRITE_SIGNATURE not in new

    reloaded = Config()
    reloaded.load_file(str(path))
    assert reloaded.as_dict() == config.as_dict()
    # Rewriting again changes nothing.
    config.rewrite()
    assert path.read_text().split("\n") == new


def test_rewrite_appends_and_cleans_up_like_redis(tmp_path):
    # The layout redis-server 7.0.15 was seen to produce from this input.
    path = write(
        tmp_path,
        "# Top comment\n   # indented comment\n\ninclude {inc}\nport 7412\n\n\nmaxclients 100\n"
        "maxclients 200\n  timeout 5   \nsave \"\"\nbind 127.0.0.1\n# maxmemory 100mb\n".format(
            inc=write(tmp_path, "port 7412\n", "inc.conf")
        ),
    )
    config = Config()
    config.load_file(path)
    config.set([(b"timeout", b"7"), (b"loglevel", b"warning"), (b"tcp-keepalive", b"60")])
    config.rewrite()
    assert Path(path).read_text() == (
        "# Top comment\n# indented comment\n\ninclude {inc}\nport 7412\n\nmaxclients 200\n\n"
        "timeout 7\nsave \"\"\nbind 127.0.0.1\n# maxmemory 100mb\n\n"
        "# Generated by CONFIG REWRITE\ntcp-keepalive 60\nloglevel warning\n"
    ).format(inc=tmp_path / "inc.conf")
    first = Path(path).read_text()
    config.set([(b"hz", b"20")])
    config.rewrite()  # the generated section is reused
    assert Path(path).read_text() == first + "hz 20\n"


def test_rewrite_comments_out_unknown_lines(tmp_path):
    path = write(tmp_path, "port 7000\n")
    config = Config()
    config.load_file(path)
    Path(path).write_text("port 7000\nno-such-directive yes\nbind \"oops\n")  # edited while running
    config.rewrite()
    assert Path(path).read_text() == "port 7000\n# ??? no-such-directive yes\n# ??? bind \"oops\n"


def test_rewrite_to_a_new_path_and_aliases(tmp_path):
    table = (
        Directive(name="hash-max-listpack-entries", kind=Int(), default=512, minimum=0, maximum=2**63 - 1,
                  aliases=("hash-max-ziplist-entries",), doc="x"),
        Directive(name="ratio", kind=Float(), default=0.5, minimum=0.0, maximum=1.0, doc="x"),
        Directive(name="mode", kind=Enum(("a", "b")), default="a", doc="x"),
        Directive(name="flag", kind=Bool(), default=False, doc="x"),
        Directive(name="name", kind=String(), default="x", doc="x"),
    )
    path = write(tmp_path, "# keep\nhash-max-ziplist-entries 100\n")
    config = Config(table)
    config.load_file(path)
    config.set([(b"ratio", b"0.25"), (b"name", b"")])
    config.rewrite()  # an alias line is rewritten in place under the name
    assert Path(path).read_text() == (
        "# keep\nhash-max-listpack-entries 100\n\n# Generated by CONFIG REWRITE\nratio 0.25\nname \"\"\n"
    )
    fresh = str(tmp_path / "new.conf")
    config.rewrite(fresh)
    assert Path(fresh).read_text() == (
        "# Generated by CONFIG REWRITE\nhash-max-listpack-entries 100\nratio 0.25\nname \"\"\n"
    )
    again = Config(table)
    again.load_file(fresh)
    assert again.as_dict() == config.as_dict()
    assert our_error(config.set, [(b"ratio", b"2")]).message.endswith("argument must be between 0 and 1 inclusive")
    assert our_error(config.set, [(b"ratio", b"nan")]).message.endswith("argument couldn't be parsed into a float")


def test_rewrite_reports_write_errors(tmp_path):
    config = Config()
    error = our_error(config.rewrite, str(tmp_path / "missing-dir" / "x.conf"))
    assert error.message == "ERR Rewriting config file: No such file or directory"


def test_client_output_buffer_limit_changes_only_the_classes_named():
    config = Config()
    assert config.get(["client-output-buffer-limit"]) == {
        "client-output-buffer-limit": "normal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60"
    }
    config.set([(b"client-output-buffer-limit", b"normal 1mb 512kb 10")])
    config.set([(b"client-output-buffer-limit", b"replica 1 2 3")])
    assert config["client-output-buffer-limit"] == [(1024**2, 512 * 1024, 10), (1, 2, 3), (32 * 1024**2, 8 * 1024**2, 60)]
    # A file line or command-line option merges the same way, and CONFIG REWRITE's form reads back.
    other = Config()
    other.apply_args(["--client-output-buffer-limit", "normal", "1mb", "512kb", "10", "slave", "1", "2", "3"])
    assert other.as_dict() == config.as_dict()
    d = config.lookup("client-output-buffer-limit")
    assert d.kind.conf(config._values[d.name]) == "normal 1mb 512kb 10 slave 1 2 3 pubsub 32mb 8mb 60"
