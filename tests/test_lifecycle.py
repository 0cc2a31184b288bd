"""The daemon as a process: startup, config file, signals, SHUTDOWN, limits, clients, INFO."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest
import redis

from pfxcache.daemon.config.directives import DIRECTIVES
from pfxcache.daemon.config.engine import Config
from pfxcache.daemon.config.kinds import Computed, Inapplicable
from pfxcache.daemon.server.assembly import check_host_memory
from pfxcache.daemon.server.errors import StartupError
from pfxcache.daemon.server.host_memory import HostLimit, host_limits, shortfall
from pfxcache.testing import encode_command, free_port, start_daemon
from support import RawClient, exchange


def run_daemon(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pfxcache.daemon", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_version_and_help():
    assert "pfxcached v=" in run_daemon("--version").stdout
    assert "Usage: pfxcached" in run_daemon("--help").stdout


def test_help_lists_every_directive_with_its_default():
    lines = run_daemon("--help").stdout.splitlines()
    rows = {line.split()[0]: line for line in lines if line.startswith("  ") and not line.startswith("   ")}
    listed = [d for d in DIRECTIVES if not isinstance(d.kind, Inapplicable)]
    assert sorted(rows) == sorted(d.name for d in listed)
    for d in listed:
        default = d.default.conf if isinstance(d.default, Computed) else d.kind.conf(d.default)
        assert rows[d.name].split()[1] == (default.split()[0] if default else '""'), d.name
    assert "256mb" in rows["maxmemory"] and "guard" in rows["maxmemory-policy"].split()
    assert all(policy in rows["maxmemory-policy"] for policy in ("lru", "lfu", "noeviction"))


def test_startup_log_states_the_geometry():
    daemon = start_daemon("--arena", "memory", "--maxmemory", "1mb", "--page-size", "4", "--block-bytes", "8",
                          "--maxmemory-policy", "lru", "--shards", "2")
    try:
        assert ("Arena memory of 1.00M: 131072 blocks of 8 bytes, page-size 4 tokens, maxmemory 1.00M, "
                "maxmemory-policy lru, 2 shards") in daemon.log_text()
    finally:
        assert daemon.stop() == 0


def _no_big_files() -> None:
    # Should the check ever be skipped, the arena's ftruncate past this limit kills the daemon
    # with SIGXFSZ instead of the host's OOM killer ending a neighbour.
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))


@pytest.mark.parametrize("arena", ["shm", "memory"])
def test_a_maxmemory_the_host_cannot_back_is_a_startup_error(tmp_path, arena):
    """Asked for far more than the machine and its cgroup have, the daemon refuses before
    allocating anything, says why, exits 1; a daemon already running is untouched."""
    neighbour = start_daemon("--arena", "memory")
    try:
        total = sum(limit.available for limit in host_limits())
        asked = max(total * 16, 1 << 40)
        pidfile = tmp_path / "p.pid"
        result = subprocess.run(
            [sys.executable, "-m", "pfxcache.daemon", "--port", "0", "--arena", arena, "--maxmemory", str(asked),
             "--pidfile", str(pidfile)],
            capture_output=True, text=True, timeout=30, preexec_fn=_no_big_files)
        out = result.stdout + result.stderr
        assert result.returncode == 1, out
        assert "# Can't reserve the block arena: maxmemory" in out and "more than this host can give" in out
        assert "Traceback" not in out and "Ready to accept" not in out
        assert not pidfile.exists()
        assert exchange(neighbour.address, b"PING\r\n")[0] == b"+PONG\r\n"
    finally:
        assert neighbour.stop() == 0


def _machine(root, meminfo: str, cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    proc, fs = root / "proc", root / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(meminfo)
    (proc / "self" / "cgroup").write_text(cgroup)
    for path, text in files.items():
        (fs / path).parent.mkdir(parents=True, exist_ok=True)
        (fs / path).write_text(text)
    return str(proc), str(fs)


def test_host_limits_read_meminfo_and_cgroup_v2(tmp_path):
    proc, fs = _machine(
        tmp_path, "MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\nSwapFree: 1000 kB\n", "0::/pod/app\n",
        {"cgroup.controllers": "memory", "pod/memory.max": "3000000000\n", "pod/memory.current": "1000000000\n",
         "pod/memory.stat": "anon 1\ninactive_file 400000000\n", "pod/app/memory.max": "max\n",
         "pod/app/memory.current": "5\n"})
    limits = host_limits(proc, fs)
    assert [limit.available for limit in limits] == [4001000 * 1024, 3000000000 - 600000000]
    assert "pod" in limits[1].source
    assert shortfall(2_400_000_000, limits) is None
    assert shortfall(2_400_000_001, limits) == limits[1]


def test_host_limits_read_cgroup_v1_and_skip_no_limit(tmp_path):
    proc, fs = _machine(
        tmp_path, "MemAvailable: 4000000 kB\n", "4:memory:/job\n3:cpu:/\n",
        {"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "9\n",
         "memory/job/memory.limit_in_bytes": "2000000000\n", "memory/job/memory.usage_in_bytes": "1500000000\n",
         "memory/job/memory.stat": "inactive_file 7\ntotal_inactive_file 500000000\n"})
    assert [limit.available for limit in host_limits(proc, fs)] == [4000000 * 1024, 1000000000]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert host_limits(str(empty), str(empty)) == []  # nothing readable: nothing refused


def test_the_check_covers_host_arenas_only():
    tight = [HostLimit("MemAvailable + SwapFree", 1 << 20)]
    config = Config()
    config.apply_args(["--maxmemory", "2mb"])
    with pytest.raises(StartupError, match=r"maxmemory 2.00M \(2097152 bytes, arena shm\) is more than this "
                                           r"host can give: 1.00M \(MemAvailable \+ SwapFree\)"):
        check_host_memory(config, limits=tight)
    config.apply_args(["--maxmemory", "1mb"])
    check_host_memory(config, limits=tight)  # exactly what there is
    config.apply_args(["--maxmemory", "2mb", "--arena", "cuda"])
    check_host_memory(config, limits=tight)  # the GPU's memory, not the host's


def test_a_failed_startup_closes_what_it_opened(tmp_path):
    """The metrics port is the last thing opened: failing there unwinds every step before it
    (the unix socket file and the pidfile are removed, the port is free again)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        metrics_port = taken.getsockname()[1]
        port = free_port()
        sock, pidfile = tmp_path / "pfx.sock", tmp_path / "pfx.pid"
        result = run_daemon("--port", str(port), "--unixsocket", str(sock), "--pidfile", str(pidfile),
                            "--metrics-port", str(metrics_port), "--arena", "memory")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Cannot open the metrics endpoint" in out and "Traceback" not in out
    assert not sock.exists() and not pidfile.exists()
    with socket.socket() as again:  # the daemon's listener was closed
        again.bind(("127.0.0.1", port))


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
