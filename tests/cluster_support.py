"""A real Redis Cluster on loopback for tests: redis-server processes and ``redis-cli --cluster create``.

:func:`redis_cluster` starts ``masters`` masters (and ``replicas`` replicas of each) on free ports,
each in its own directory under ``base``, creates the cluster, waits until every node reports
``cluster_state:ok``, and always stops every process it started (by pid) on the way out. Nodes run
with ``cluster-require-full-coverage no``, so a master lost without a replica costs its slots only,
and a short ``cluster-node-timeout`` so that failover tests take seconds.

Skips (pytest.skip) when redis-server or redis-cli is not installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

NODE_TIMEOUT_MS = 2000
BUS_OFFSET = 10000  # Redis Cluster's bus port is port + 10000


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

    def start(self, *extra: str) -> None:
        os.makedirs(self.dir, exist_ok=True)
        log = open(os.path.join(self.dir, "redis.log"), "ab")
        try:
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", f"nodes-{self.port}.conf", "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                 "--cluster-require-full-coverage", "no", "--save", "", "--appendonly", "no", "--dir", self.dir,
                 "--enable-debug-command", "local", *extra],
                stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        wait_for(lambda: cli(self.port, "PING", check=False) == "PONG", f"redis-server on {self.port}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
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

    def on_all(self, *args: str) -> None:
        """A command sent to every live node (ACL SETUSER, CONFIG SET: per node in a cluster)."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                cli(node.port, *args)

    def client(self, **options):
        """A redis-py cluster client (the tests' view of what the daemons wrote)."""
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", n.port) for n in self.nodes[: self.masters]],
                            require_full_coverage=False, **options)

    def owner_of(self, key: bytes) -> Node:
        """The node serving ``key``'s slot now."""
        slot = int(self.cli("CLUSTER", "KEYSLOT", key.decode()))
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            for line in cli(node.port, "CLUSTER", "NODES").splitlines():
                fields = line.split()
                if "myself" in fields[2] and "master" in fields[2]:
                    for span in fields[8:]:
                        lo, _, hi = span.partition("-")
                        if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                            return node
        raise AssertionError(f"no live master serves slot {slot}")

    def wait_ok(self, timeout: float = 30.0) -> None:
        live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        wait_for(lambda: all("cluster_state:ok" in cli(n.port, "CLUSTER", "INFO", check=False) for n in live),
                 "cluster_state:ok", timeout)


def cli(port: int, *args: str, check: bool = True) -> str:
    result = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise AssertionError(f"redis-cli -p {port} {' '.join(args)}: {result.stderr or result.stdout}")
    return result.stdout.strip()


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if predicate():
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def redis_cluster(base: str, masters: int = 3, replicas: int = 0) -> Iterator[Cluster]:
    """A running cluster of ``masters`` masters with ``replicas`` replicas each (module docstring)."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server and redis-cli are needed (scripts/setup redis)")
    count = masters * (1 + replicas)
    nodes = [Node(port, os.path.join(str(base), f"redis-{port}")) for port in free_cluster_ports(count)]
    try:
        for node in nodes:
            node.start()
        subprocess.run(["redis-cli", "--cluster", "create", *(n.address for n in nodes),
                        "--cluster-replicas", str(replicas), "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        cluster = Cluster(nodes, masters)
        cluster.wait_ok()
        if replicas:
            wait_for(lambda: all(cli(n.port, "ROLE").startswith("slave") is False or
                                 "connected" in cli(n.port, "ROLE") for n in nodes), "replicas in sync")
        yield cluster
    finally:
        for node in nodes:
            with contextlib.suppress(Exception):
                if node.proc is not None and node.proc.poll() is None:
                    node.proc.send_signal(signal.SIGCONT)
                node.kill()
