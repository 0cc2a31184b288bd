"""A real Redis Cluster on loopback: redis-server processes and ``redis-cli --cluster create``.

Tests, benchmarks and tools (scripts/fleet --shared-tier, scripts/bench-remote-tier) all need one,
so it lives in the package beside :mod:`pfxcache.testing`. :func:`redis_cluster` starts ``masters``
masters (and ``replicas`` replicas of each) on free ports, each in its own directory under
``base`` (a temporary directory, removed afterwards, when none is given), creates the cluster,
waits until every node reports ``cluster_state:ok`` and every replica has caught up, and always
stops every process it started (by pid, after a SIGCONT for a paused one) on the way out.

Nodes run with ``cluster-require-full-coverage no``, so a master lost without a replica costs its
slots only, and a short ``cluster-node-timeout`` (``NODE_TIMEOUT_MS``) so that a failover takes
seconds. The DEBUG command is enabled from loopback (a test may make a node slow).

Without redis-server or redis-cli it raises :class:`pfxcache.testing.RedisServerMissing`, whose
message says how to install them (``scripts/setup redis``): the tests' conftest turns that into a
skip, or a failure where ``PFXCACHE_REQUIRE_REDIS_SERVER=1``; a tool prints it and exits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

from pfxcache.testing import INSTALL_REDIS, REDIS_SERVER, RedisServerMissing

NODE_TIMEOUT_MS = 2000
BUS_OFFSET = 10000  # Redis Cluster's bus port is port + 10000
REDIS_CLI = os.environ.get("PFXCACHE_REDIS_CLI") or shutil.which("redis-cli") or "/usr/bin/redis-cli"


def cluster_installed() -> bool:
    """Both redis-server and redis-cli are there (redis-cli creates the cluster)."""
    return all(shutil.which(path) is not None for path in (REDIS_SERVER, REDIS_CLI))


def require_cluster_binaries() -> None:
    if not cluster_installed():
        raise RedisServerMissing(f"redis-server is not installed (a Redis Cluster needs redis-server and "
                                 f"redis-cli): {INSTALL_REDIS}")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_ports(count: int, start: int = 21000) -> list[int]:
    """``count`` ports whose bus ports (port + 10000) are free too (below 55536)."""
    ports: list[int] = []
    port = start + (os.getpid() % 200) * 50
    while len(ports) < count:
        if port + BUS_OFFSET > 65535:
            port = start
        if _free(port) and _free(port + BUS_OFFSET):
            ports.append(port)
        port += 1
    return ports


def cli(port: int, *args: str, check: bool = True) -> str:
    """One redis-cli command to the node on ``port``; its output, stripped."""
    result = subprocess.run([REDIS_CLI, "-p", str(port), *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise AssertionError(f"redis-cli -p {port} {' '.join(args)}: {result.stderr or result.stdout}")
    return result.stdout.strip()


def wait_for(predicate: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Poll ``predicate`` (an exception counts as false) until true; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if predicate():
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Node:
    """One redis-server of the cluster."""

    __slots__ = ("dir", "port", "proc")

    def __init__(self, port: int, directory: str) -> None:
        self.port = port
        self.dir = directory
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, *extra: str) -> None:
        os.makedirs(self.dir, exist_ok=True)
        log = open(os.path.join(self.dir, "redis.log"), "ab")
        try:
            self.proc = subprocess.Popen(
                [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", f"nodes-{self.port}.conf", "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                 "--cluster-require-full-coverage", "no", "--save", "", "--appendonly", "no", "--dir", self.dir,
                 "--enable-debug-command", "local", *extra],
                stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        wait_for(lambda: cli(self.port, "PING", check=False) == "PONG", f"redis-server on {self.port}")

    def role(self) -> list[str]:
        """ROLE's answer, one field a line: ``master``, offset, then (host, port, offset) per replica;
        or ``slave``, master host, master port, link state, offset."""
        return cli(self.port, "ROLE").split("\n")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive:
            self.proc.send_signal(sig)
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the node holds its connections and answers nothing (a hung node)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


class Cluster:
    """The nodes of a running cluster; ``url`` is the pfxcache ``remote-tier`` URL of its seeds."""

    def __init__(self, nodes: list[Node], masters: int) -> None:
        self.nodes = nodes
        self.masters = masters

    def url(self, userinfo: str = "") -> str:
        hosts = ",".join(n.address for n in self.nodes[: self.masters])
        return f"redis-cluster://{userinfo + '@' if userinfo else ''}{hosts}"

    def cli(self, *args: str, node: int = 0) -> str:
        return cli(self.nodes[node].port, *args)

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.alive]

    def on_all(self, *args: str) -> None:
        """A command sent to every live node (ACL SETUSER, CONFIG SET: per node in a cluster)."""
        for node in self.live():
            cli(node.port, *args)

    def client(self, **options):
        """A redis-py cluster client (what the daemons wrote, seen from outside)."""
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", n.port) for n in self.live()],
                            require_full_coverage=False, **options)

    def master_nodes(self) -> list[Node]:
        """The live nodes that are masters now."""
        return [n for n in self.live() if n.role()[0] == "master"]

    def replicas_of(self, master: Node) -> list[Node]:
        fields = master.role()
        ports = {int(fields[i]) for i in range(3, len(fields), 3)}
        return [n for n in self.nodes if n.port in ports]

    def replicated(self, master: Node) -> bool:
        """Every replica of ``master`` has acknowledged all it was sent (ROLE's offsets agree)."""
        fields = master.role()
        offset, acked = fields[1], fields[4::3]
        return bool(acked) and all(a == offset for a in acked)

    def owner_of(self, key: bytes) -> Node:
        """The node serving ``key``'s slot now (as that node itself says)."""
        slot = int(cli(self.live()[0].port, "CLUSTER", "KEYSLOT", key.decode()))
        for node in self.live():
            for line in cli(node.port, "CLUSTER", "NODES").splitlines():
                fields = line.split()
                if "myself" in fields[2] and "master" in fields[2]:
                    for span in fields[8:]:
                        lo, _, hi = span.partition("-")
                        if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                            return node
        raise AssertionError(f"no live master serves slot {slot}")

    def wait_ok(self, timeout: float = 30.0) -> None:
        wait_for(lambda: all("cluster_state:ok" in cli(n.port, "CLUSTER", "INFO", check=False) for n in self.live()),
                 "cluster_state:ok", timeout)


@contextlib.contextmanager
def redis_cluster(base: str | os.PathLike | None = None, masters: int = 3, replicas: int = 0,
                  options: Sequence[str] = ()) -> Iterator[Cluster]:
    """A running cluster of ``masters`` masters with ``replicas`` replicas each (module docstring);
    ``options`` are redis-server options for every node (``--maxmemory``, ...)."""
    if masters < 3:
        raise ValueError("redis-cli --cluster create needs at least 3 masters")
    require_cluster_binaries()
    scratch = tempfile.mkdtemp(prefix="pfxcache-cluster-") if base is None else None
    root = str(base) if base is not None else scratch
    count = masters * (1 + replicas)
    nodes = [Node(port, os.path.join(root, f"redis-{port}")) for port in free_cluster_ports(count)]
    try:
        for node in nodes:
            node.start(*options)
        subprocess.run([REDIS_CLI, "--cluster", "create", *(n.address for n in nodes),
                        "--cluster-replicas", str(replicas), "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        cluster = Cluster(nodes, masters)
        cluster.wait_ok()
        if replicas:
            wait_for(lambda: all(n.role()[0] == "master" or n.role()[3] == "connected" for n in nodes),
                     "replicas connected")
        yield cluster
    finally:
        for node in nodes:
            with contextlib.suppress(Exception):
                if node.alive:
                    node.proc.send_signal(signal.SIGCONT)
                node.kill()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
