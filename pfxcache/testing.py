"""Real processes on real sockets: start pfxcached or redis-server on a free loopback port, wait, stop.

Tests, benchmarks and tools all need these, so they live in the package rather
than under tests/. Nothing here mocks what a user touches: the daemon runs as
its own process (``python -m pfxcache.daemon``), redis-server is Debian's binary.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

READY = re.compile(r"Ready to accept connections tcp on (\S+):(\d+)")
# PFXCACHE_REDIS_SERVER picks another build (a newer Redis, or none: a path that does not exist).
REDIS_SERVER = os.environ.get("PFXCACHE_REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"
INSTALL_REDIS = "scripts/setup redis installs it (Debian's redis-server and redis-tools; scripts/test does too)"


class RedisServerMissing(RuntimeError):
    """redis-server is not installed: the reference for Redis behaviour cannot start."""


def redis_server_installed() -> bool:
    return shutil.which(REDIS_SERVER) is not None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Daemon:
    """A running pfxcached process."""

    proc: subprocess.Popen
    host: str
    port: int
    log: list[str] = field(default_factory=list)
    scratch: str | None = None  # the working directory start_daemon made for it, removed by stop()

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                    raise AssertionError("pfxcached did not exit in time after %s" % sig)
            return self.proc.returncode
        finally:
            if self.scratch is not None and self.proc.poll() is not None:
                shutil.rmtree(self.scratch, ignore_errors=True)

    def log_text(self) -> str:
        return "\n".join(self.log)


def start_daemon(*args: str, cwd: str | None = None, ready_timeout: float = 20.0,
                 env: dict[str, str] | None = None) -> Daemon:
    """Start ``python -m pfxcache.daemon --port 0 ARGS...`` and wait for its address line.
    ``env``: variables added to this process's environment for the daemon."""
    command = [sys.executable, "-m", "pfxcache.daemon", *args]
    if not any(arg == "--port" for arg in args):
        command += ["--port", "0"]
    scratch = None
    if cwd is None and "--dir" not in args and not (args and not args[0].startswith("--")):
        # Its own working directory (``dir``): a SAVE, SHUTDOWN SAVE or BGSAVE it runs writes there, never
        # into the caller's, where every later daemon would load it. Removed when the daemon stops.
        scratch = tempfile.mkdtemp(prefix="pfxcached-")
        command += ["--dir", scratch]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="backslashreplace",  # the log echoes client bytes (a bad bind address) as they came
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
    )
    lines: list[str] = []
    found: list[tuple[str, int]] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            match = READY.search(line)
            if match and not found:
                found.append((match.group(1), int(match.group(2))))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(ready_timeout) or not found:
        proc.kill()
        proc.wait()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeError("pfxcached did not start:\n" + "\n".join(lines))
    host, port = found[0]
    return Daemon(proc, host, port, lines, scratch)


@dataclass
class RedisServer:
    proc: subprocess.Popen
    port: int
    host: str = "127.0.0.1"

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_redis_server(*args: str) -> RedisServer:
    """Start Debian's redis-server 7 on a free loopback port, no persistence."""
    if not redis_server_installed():
        raise RedisServerMissing(f"redis-server is not installed: {INSTALL_REDIS}")
    for _attempt in range(5):
        port = free_port()
        proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--logfile", "", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                        return RedisServer(proc, port)
            except OSError:
                time.sleep(0.05)
        proc.kill()
        proc.wait()
    raise RuntimeError("redis-server did not start")


def encode_command(*args: bytes | str | int) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, int):
            arg = str(arg)
        if isinstance(arg, str):
            arg = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)
