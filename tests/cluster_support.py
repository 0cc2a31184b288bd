"""The tests' Redis Cluster: :mod:`pfxcache.testing_cluster` (tools start the same one), re-exported."""

from pfxcache.testing_cluster import (BUS_OFFSET, NODE_TIMEOUT_MS, Cluster, Node, cli, free_cluster_ports,
                                      redis_cluster, wait_for)

__all__ = ["BUS_OFFSET", "NODE_TIMEOUT_MS", "Cluster", "Node", "cli", "free_cluster_ports", "redis_cluster",
           "wait_for"]
