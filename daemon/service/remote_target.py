"""The shared tier's ``remote-tier`` URL: what it names, its redacted form, and redis-py clients of it.

Rules:

* ``redis://[user:password@]host:port`` names one Redis or Valkey; ``redis-cluster://...`` names
  seed nodes of a Redis Cluster (the topology comes from them). Anything else is a ValueError.
* The password is never logged: ``str(target)`` is the redacted form, and :meth:`RemoteTarget.scrub`
  removes it from any text (redis-py's errors may quote what they were given).
* Clients are built in worker threads (no I/O until used) with the caller's socket timeout, so a
  blocking call is bounded; a cluster client retries a connection error ``CLUSTER_RETRIES`` times,
  each retry refreshing the topology (the node a client first asked may be the dead one).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

#: redis-py's retries of a cluster call after a connection error: each one refreshes the topology and
#: picks another default node (the one COMMAND goes to when a client is built may be the dead one).
#: The loop never waits for them: a request waits remote-tier-timeout at most.
CLUSTER_RETRIES = 3
CLIENT_NAME = "pfxcached-remote-tier"


class RemoteTarget:
    """A parsed ``remote-tier`` URL; ``str()`` is its redacted form (no password), the only one logged."""

    __slots__ = ("cluster", "nodes", "password", "username")

    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("redis", "redis-cluster"):
            raise ValueError("remote-tier must be redis://[user:password@]host:port or "
                             "redis-cluster://[user:password@]host:port[,host:port...]")
        self.cluster = parsed.scheme == "redis-cluster"
        userinfo, _, hosts = parsed.netloc.rpartition("@")
        user, colon, password = userinfo.partition(":")
        self.username = urllib.parse.unquote(user) or None
        self.password = urllib.parse.unquote(password) or None if colon else None
        self.nodes: list[tuple[str, int]] = []
        for item in hosts.split(","):
            host, _, port = item.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"remote-tier: {item.strip()!r} is not host:port")
            self.nodes.append((host.strip("[]"), int(port)))
        if not self.cluster and len(self.nodes) != 1:
            raise ValueError("remote-tier: redis:// names one server; use redis-cluster:// for seed nodes")

    def __str__(self) -> str:
        who = (self.username or "") + (":***" if self.password else "")
        hosts = ",".join(f"{h}:{p}" for h, p in self.nodes)
        return f"{'redis-cluster' if self.cluster else 'redis'}://{who + '@' if who else ''}{hosts}"

    def scrub(self, text: str) -> str:
        """``text`` with the password replaced (redis-py's errors may quote what they were given)."""
        return text.replace(self.password, "***") if self.password else text

    def open(self, timeout_s: float) -> Any:
        """A redis-py client of the target (no I/O until used). Called in a worker thread."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        options = dict(username=self.username, password=self.password, socket_timeout=timeout_s,
                       socket_connect_timeout=timeout_s, client_name=CLIENT_NAME)
        if not self.cluster:
            host, port = self.nodes[0]
            return redis.Redis(host=host, port=port, retry=Retry(NoBackoff(), 0), **options)
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in self.nodes], require_full_coverage=False,
                            retry=Retry(NoBackoff(), CLUSTER_RETRIES), **options)
