"""Stock Redis tools against pfxcached: redis-cli (one-shot, -3, --pipe, --stat,
interactive through a pty) and redis-benchmark."""

from __future__ import annotations

import subprocess

import pexpect
import pytest


def cli(daemon, *args: str, input: bytes | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["redis-cli", "-h", daemon.host, "-p", str(daemon.port), *args],
        input=input,
        capture_output=True,
        timeout=timeout,
    )


def test_one_shot_commands(daemon):
    assert cli(daemon, "PING").stdout == b"PONG\n"
    assert cli(daemon, "ECHO", "hello world").stdout == b"hello world\n"
    assert cli(daemon, "DBSIZE").stdout == b"0\n"  # not a terminal: redis-cli prints the bare integer
    result = cli(daemon, "NOSUCHCOMMAND", "x")
    assert b"unknown command 'NOSUCHCOMMAND', with args beginning with: 'x'" in result.stdout
    config = cli(daemon, "CONFIG", "GET", "bind").stdout.split()
    assert config == [b"bind", b"127.0.0.1"]


def test_resp3_mode(daemon):
    result = cli(daemon, "-3", "HELLO")
    assert result.returncode == 0
    assert b"\nproto 3\n" in result.stdout  # the map's "proto" entry, one "key value" line
    # A RESP3 map comes back formatted as a map, a verbatim INFO as text.
    info = cli(daemon, "-3", "INFO", "server").stdout
    assert b"# Server" in info and b"redis_version:" in info


def test_pipe_mass_insert(daemon):
    lines = b"".join(b"ECHO item-%d\r\n" % i for i in range(5000)) + b"*1\r\n$4\r\nPING\r\n" * 1000
    result = cli(daemon, "--pipe", input=lines)
    assert result.returncode == 0, result.stderr
    assert b"errors: 0, replies: 6000" in result.stdout


def test_pipe_counts_errors(daemon):
    result = cli(daemon, "--pipe", input=b"PING\r\nNOPE\r\nSELECT 3\r\n")
    assert b"errors: 2, replies: 3" in result.stdout


def test_stat_mode_reads_info(daemon):
    # Through a pty: redis-cli only line-buffers its output on a terminal.
    child = pexpect.spawn("redis-cli", ["-h", daemon.host, "-p", str(daemon.port), "--stat", "-i", "0.2"],
                          timeout=10, env={"TERM": "xterm", "PATH": "/usr/bin:/bin"})
    try:
        child.expect(r"keys\s+mem\s+clients\s+blocked\s+requests\s+connections")
        # A data row: keys, memory (human), clients, blocked, requests (+delta), connections.
        child.expect(r"\r\n(\d+)\s+(\S+[BKMG])\s+(\d+)\s+0\s+(\d+) \(\+\d+\)\s+(\d+)")
        keys, memory, clients, requests, connections = child.match.groups()
        assert (int(keys), int(clients)) == (0, 1)  # no keys stored in this module; the --stat connection alone
        child.expect(r"\(\+\d+\)")  # it keeps polling
    finally:
        child.close(force=True)
    # The connections column is total_connections_received: every one so far, the --stat one last before this.
    stats = dict(line.split(":", 1) for line in cli(daemon, "INFO", "stats").stdout.decode().splitlines()
                 if ":" in line)
    assert int(connections) == int(stats["total_connections_received"]) - 1


def test_interactive_mode_hints(daemon):
    child = pexpect.spawn("redis-cli", ["-h", daemon.host, "-p", str(daemon.port)], timeout=10, env={"TERM": "xterm", "PATH": "/usr/bin:/bin"})
    try:
        prompt = f"{daemon.host}:{daemon.port}>"
        child.expect_exact(prompt)
        # Typing a command name shows its argument hint, built from COMMAND DOCS.
        child.send("CLIENT SETNAME ")
        child.expect("connection-name")
        child.send("\x15")  # clear the line
        # linenoise takes Enter as a carriage return.
        child.send("PING\r")
        child.expect_exact("PONG")
        child.send("HELP CONFIG SET\r")
        child.expect("Set configuration parameters")  # the summary from COMMAND DOCS
        child.expect_exact(prompt)
        child.send("ECHO still-alive\r")
        child.expect_exact('"still-alive"')
        child.send("QUIT\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus in (0, None) and child.signalstatus is None


@pytest.mark.parametrize("pipeline", ["1", "16"])
def test_benchmark_ping(daemon, pipeline):
    result = subprocess.run(
        ["redis-benchmark", "-h", daemon.host, "-p", str(daemon.port), "-t", "ping", "-n", "20000", "-c", "20",
         "-P", pipeline, "-q"],
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout.decode()
    assert "PING_INLINE:" in text and "PING_MBULK:" in text and "requests per second" in text


def test_benchmark_custom_command(daemon):
    result = subprocess.run(
        ["redis-benchmark", "-h", daemon.host, "-p", str(daemon.port), "-n", "10000", "-c", "10", "-r", "1000",
         "-q", "ECHO", "key:__rand_int__"],
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert b"requests per second" in result.stdout


def test_benchmark_stops_on_error_reply(daemon):
    result = subprocess.run(
        ["redis-benchmark", "-h", daemon.host, "-p", str(daemon.port), "-n", "1000", "-c", "2", "-q", "SELECT", "5"],
        capture_output=True,
        timeout=60,
    )
    # redis-benchmark ends the run on an error reply, as it does against redis-server.
    assert result.returncode == 1
    assert result.stderr == b"Error from server: ERR DB index is out of range\n"
