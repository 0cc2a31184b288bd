"""The daemon as a process: startup, config file, signals, SHUTDOWN, limits, clients, INFO."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import redis

from pfxcache.testing import encode_command, free_port, start_daemon
from support import RawClient, exchange


def run_daemon(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pfxcache.daemon", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_version_and_help():
    assert "pfxcached v=" in run_daemon("--version").stdout
    assert "Usage: pfxcached" in run_daemon("--help").stdout


def test_console_script_reports_bound_port(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "pfxcached")
    proc = subprocess.Popen([script, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 20
        while "Ready to accept connections" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        port = int(line.rsplit(":", 1)[1])
        assert port > 0
        assert exchange(("127.0.0.1", port), b"PING\r\n")[0] == b"+PONG\r\n"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_shut_down_cleanly(tmp_path, sig):
    pidfile = tmp_path / "pfxcached.pid"
    daemon = start_daemon("--pidfile", str(pidfile))
    assert pidfile.read_text().strip() == str(daemon.proc.pid)
    idle = socket.create_connection(daemon.address)
    started = time.monotonic()
    assert daemon.stop(sig) == 0
    assert time.monotonic() - started < 5
    assert not pidfile.exists()
    assert idle.recv(10) == b""  # the idle client was closed, not left hanging
    assert "bye bye" in daemon.log_text()


def test_shutdown_command(tmp_path):
    daemon = start_daemon()
    reply, closed = exchange(daemon.address, b"SHUTDOWN NOSAVE\r\n")
    assert (reply, closed) == (b"", True)
    assert daemon.proc.wait(15) == 0


def test_unix_socket(tmp_path):
    path = tmp_path / "pfx.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # a stale socket file, as a killed daemon leaves behind
    stale.close()
    daemon = start_daemon("--unixsocket", str(path), "--unixsocketperm", "700")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        sock.sendall(b"PING\r\nCLIENT INFO\r\n")
        time.sleep(0.2)
        data = sock.recv(4096)
    assert data.startswith(b"+PONG\r\n") and b"flags=U" in data
    assert oct(path.stat().st_mode & 0o777) == "0o700"
    assert daemon.stop() == 0
    assert not path.exists()


def test_config_file_and_errors(tmp_path):
    good = tmp_path / "good.conf"
    good.write_text("# comment\nport 0\nmaxclients 77\nloglevel verbose\n")
    daemon = start_daemon(str(good))
    try:
        client = redis.Redis(host=daemon.host, port=daemon.port)
        assert client.config_get("maxclients") == {"maxclients": "77"}
        assert client.info("server")["config_file"] == str(good)
        client.close()
    finally:
        daemon.stop()
    bad = tmp_path / "bad.conf"
    bad.write_text("port 0\nnosuchdirective 1\n")
    result = run_daemon(str(bad))
    assert result.returncode == 1
    assert "bad.conf" in result.stderr and "2" in result.stderr and "nosuchdirective" in result.stderr
    result = run_daemon("--maxclients", "lots")
    assert result.returncode == 1 and "maxclients" in result.stderr


def test_config_rewrite_keeps_comments(tmp_path):
    conf = tmp_path / "pfx.conf"
    conf.write_text("# my precious comment\nport 0\ntimeout 0\n")
    daemon = start_daemon(str(conf))
    try:
        client = redis.Redis(host=daemon.host, port=daemon.port)
        client.config_set("timeout", 42)
        client.config_set("maxclients", 500)
        assert client.config_rewrite()
        client.close()
    finally:
        daemon.stop()
    text = conf.read_text()
    assert "# my precious comment" in text
    assert "timeout 42" in text and "maxclients 500" in text
    # The rewritten file starts a daemon with the same values.
    again = start_daemon(str(conf))
    try:
        client = redis.Redis(host=again.host, port=again.port)
        assert client.config_get("timeout") == {"timeout": "42"}
        client.close()
    finally:
        again.stop()


def test_config_rewrite_without_file(daemon):
    client = redis.Redis(host=daemon.host, port=daemon.port)
    with pytest.raises(redis.ResponseError, match="without a config file"):
        client.config_rewrite()
    client.close()


def test_port_in_use_is_a_startup_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_daemon("--port", str(port))
    assert result.returncode == 1
    assert "Address already in use" in result.stdout + result.stderr


def test_config_set_port_rebinds(fresh_daemon):
    daemon = fresh_daemon()
    new_port = free_port()
    client = redis.Redis(host=daemon.host, port=daemon.port)
    assert client.config_set("port", new_port)
    client.close()
    assert exchange(("127.0.0.1", new_port), b"PING\r\n")[0] == b"+PONG\r\n"
    with pytest.raises(OSError):
        socket.create_connection(daemon.address, timeout=1).close()


def test_maxclients(fresh_daemon):
    daemon = fresh_daemon("--maxclients", "3")
    held = [RawClient(daemon.address) for _ in range(3)]
    for client in held:
        assert client.call_raw("PING") == b"+PONG\r\n"
    reply, closed = exchange(daemon.address, b"PING\r\n")
    assert (reply, closed) == (b"-ERR max number of clients reached\r\n", True)
    held.pop().close()
    time.sleep(0.2)
    assert exchange(daemon.address, b"PING\r\n")[0] == b"+PONG\r\n"
    # Ask through a held connection: a new one could race the close above.
    stats = held[0].call_raw("INFO", "stats").decode()
    assert "rejected_connections:1\r\n" in stats
    for client in held:
        client.close()


def test_idle_timeout(fresh_daemon):
    daemon = fresh_daemon("--timeout", "1")
    with socket.create_connection(daemon.address) as idle:
        idle.settimeout(5)
        started = time.monotonic()
        assert idle.recv(10) == b""
        assert 1 <= time.monotonic() - started < 4


def test_query_buffer_limit_closes_without_reply(fresh_daemon):
    daemon = fresh_daemon("--client-query-buffer-limit", "1mb")
    with socket.create_connection(daemon.address) as sock:
        sock.sendall(b"*2\r\n$4\r\nECHO\r\n$3000000\r\n")
        sent = 0
        closed = False
        try:
            while sent < 3_000_000:
                sock.sendall(b"x" * 65536)
                sent += 65536
        except OSError:
            closed = True
        sock.settimeout(3)
        try:
            assert sock.recv(100) == b""
        except ConnectionResetError:
            pass
        assert closed or sent >= 3_000_000
    assert exchange(daemon.address, b"PING\r\n")[0] == b"+PONG\r\n"


def test_client_list_kill_and_info(daemon):
    admin = redis.Redis(host=daemon.host, port=daemon.port, decode_responses=True)
    victim = RawClient(daemon.address)
    victim.call_raw("CLIENT", "SETNAME", "victim")
    listing = admin.client_list()
    victim_row = next(row for row in listing if row["name"] == "victim")
    assert int(victim_row["id"]) > 0 and victim_row["cmd"] == "client|setname"
    assert admin.client_kill_filter(_id=int(victim_row["id"])) == 1
    assert victim.read_raw(settle=1) == b""
    assert all(row["name"] != "victim" for row in admin.client_list())
    admin.close()


def test_info_format_and_stats(daemon):
    raw = RawClient(daemon.address)
    raw.call_raw("PING")
    raw.call_raw("NOSUCH")
    reply = raw.call_raw("INFO", "all")
    raw.close()
    header, _, body = reply.partition(b"\r\n")
    assert header.startswith(b"$")
    text = body[: int(header[1:])].decode()
    sections = [line for line in text.split("\r\n") if line.startswith("# ")]
    assert sections[:3] == ["# Server", "# Clients", "# Memory"]
    assert "# Commandstats" in sections and "# Errorstats" in sections and "# Keyspace" in sections
    assert "\r\n\r\n# Clients\r\n" in text
    memory_lines = [line for line in text.split("\r\n") if line.startswith("used_memory")]
    assert memory_lines[0].startswith("used_memory:")
    assert "cmdstat_ping:calls=" in text
    assert "errorstat_ERR:count=" in text
    client = redis.Redis(host=daemon.host, port=daemon.port)
    default = client.execute_command("INFO")
    assert b"# Commandstats" not in default
    client.config_resetstat()
    stats = client.info("commandstats")
    assert "cmdstat_ping" not in stats
    client.close()


def test_sigterm_lets_a_running_batch_finish(fresh_daemon):
    """A pipeline in flight when SIGTERM arrives gets every reply before the close."""
    daemon = fresh_daemon()
    with socket.create_connection(daemon.address) as sock:
        payload = encode_command("ECHO", "x" * 100) * 20000
        sock.sendall(payload)
        time.sleep(0.05)
        daemon.proc.send_signal(signal.SIGTERM)
        sock.settimeout(10)
        received = bytearray()
        while True:
            try:
                chunk = sock.recv(1 << 20)
            except ConnectionResetError:  # closing with unread requests queued sends a RST
                break
            if not chunk:
                break
            received += chunk
    assert daemon.proc.wait(15) == 0
    # Every reply that was started was completed: the stream ends on a reply boundary.
    reply = b"$100\r\n" + b"x" * 100 + b"\r\n"
    assert len(received) % len(reply) == 0 and len(received) > 0
