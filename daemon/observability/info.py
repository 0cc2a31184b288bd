"""INFO: sections in Redis's names, order and formats.

Each section is a function returning ``(field, value)`` pairs, registered in
:data:`SECTIONS` in the order INFO prints them. Field names and value formats
follow Redis 7.0 so ``redis-cli --stat``, redis_exporter and other tools read
them unchanged: ``# Section`` headers, ``field:value`` lines ending in CRLF, a
blank line between sections, ``used_memory:`` before the other ``used_memory_*``
lines.

Which sections a request shows follows Redis: no argument or ``default`` ->
the default set; ``all`` adds commandstats and latencystats; ``everything``
adds the module-style sections too; any other word names one section.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pfxcache.daemon.observability.stats import LATENCY_BOUNDS_USEC

if TYPE_CHECKING:
    from pfxcache.daemon.commands.context import ServerState

Fields = Iterable[tuple[str, Any]]


def human_bytes(n: int) -> str:
    """Redis's bytesToHuman: 1.50K, 2.00M ... (``B`` below 1 KiB)."""
    value = float(n)
    for unit in ("B", "K", "M", "G", "T", "P"):
        if value < 1024 or unit == "P":
            return f"{int(value)}B" if unit == "B" else f"{value:.2f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _server(server: ServerState) -> Fields:
    now = time.time()
    uptime = int(server.uptime)
    return [
        ("redis_version", server.redis_version),
        ("redis_git_sha1", "00000000"),
        ("redis_git_dirty", 0),
        ("redis_build_id", "0"),
        ("redis_mode", "standalone"),
        ("pfxcache_version", server.version),
        ("os", f"{platform.system()} {platform.release()} {platform.machine()}"),
        ("arch_bits", 64 if sys.maxsize > 2**32 else 32),
        ("monotonic_clock", "POSIX clock_gettime"),
        ("multiplexing_api", "epoll" if sys.platform.startswith("linux") else "kqueue"),
        ("atomicvar_api", "python"),
        ("python_version", platform.python_version()),
        ("process_id", os.getpid()),
        ("process_supervised", "no"),
        ("run_id", server.run_id),
        ("tcp_port", server.tcp_port),
        ("server_time_usec", int(now * 1_000_000)),
        ("uptime_in_seconds", uptime),
        ("uptime_in_days", uptime // 86400),
        ("hz", server.config["hz"]),
        ("configured_hz", server.config["hz"]),
        ("lru_clock", int(now) & ((1 << 24) - 1)),
        ("executable", os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""),
        ("config_file", server.config.config_file or ""),
        ("io_threads_active", 0),
    ]


def _clients(server: ServerState) -> Fields:
    largest_input = max((client.query_buffered for client in server.clients), default=0)
    return [
        ("connected_clients", len(server.clients)),
        ("cluster_connections", 0),
        ("maxclients", server.config["maxclients"]),
        ("client_recent_max_input_buffer", largest_input),
        ("client_recent_max_output_buffer", 0),
        ("blocked_clients", 0),
        ("tracking_clients", 0),
        ("clients_in_timeout_table", 0),
    ]


def _memory(server: ServerState) -> Fields:
    # The arena, the metadata indexing it and the process, separately (see daemon/observability/memory.py):
    # maxmemory sizes the arena only, and the rest is shown, not folded into one RSS figure.
    server.memory.sample()  # the process's RSS peak, kept by its owner for the cron
    figures = server.prefix.memory_figures()
    used, rss, peak = figures.used_bytes, figures.rss_bytes, figures.peak_bytes
    overhead = figures.heap_bytes
    maxmemory = server.config["maxmemory"]
    system = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    net = used - figures.startup_heap_bytes
    return [
        ("used_memory", used),
        ("used_memory_human", human_bytes(used)),
        ("used_memory_rss", rss),
        ("used_memory_rss_human", human_bytes(rss)),
        ("used_memory_peak", peak),
        ("used_memory_peak_human", human_bytes(peak)),
        ("used_memory_peak_perc", f"{100.0 * used / peak if peak else 100:.2f}%"),
        ("used_memory_overhead", overhead),
        ("used_memory_startup", figures.startup_heap_bytes),
        ("used_memory_dataset", figures.dataset_bytes),
        ("used_memory_dataset_perc", f"{100.0 * figures.dataset_bytes / net if net > 0 else 0:.2f}%"),
        ("used_memory_arena", figures.arena_bytes),
        ("used_memory_arena_human", human_bytes(figures.arena_bytes)),
        ("used_memory_arena_rss", figures.arena_resident_bytes),
        ("used_memory_metadata", figures.metadata_bytes),
        ("used_memory_metadata_human", human_bytes(figures.metadata_bytes)),
        ("used_memory_metadata_per_page", f"{figures.metadata_per_page:.1f}"),
        # the eviction policy's share of the metadata (an estimate from its structures' counts)
        ("used_memory_policy", policy := server.prefix.store.policy_memory()),
        ("used_memory_policy_human", human_bytes(policy)),
        ("total_system_memory", system),
        ("total_system_memory_human", human_bytes(system)),
        ("maxmemory", maxmemory),
        ("maxmemory_human", human_bytes(maxmemory)),
        ("maxmemory_policy", server.config["maxmemory-policy"]),
        ("mem_fragmentation_ratio", f"{rss / used if used else 1:.2f}"),
        ("mem_fragmentation_bytes", rss - used),
        ("mem_allocator", "libc"),
    ]


def _persistence(server: ServerState) -> Fields:
    # Snapshots of the RAM arena (service/persistence.py); no AOF: its fields stay at their idle values.
    return server.persistence.info_fields()


def _stats(server: ServerState) -> Fields:
    stats = server.stats
    keyspace = server.prefix.keyspace_stats()
    return [
        ("total_connections_received", stats.total_connections_received),
        ("total_commands_processed", stats.total_commands_processed),
        ("instantaneous_ops_per_sec", stats.instantaneous_ops_per_sec),
        ("total_net_input_bytes", stats.total_net_input_bytes),
        ("total_net_output_bytes", stats.total_net_output_bytes),
        ("rejected_connections", stats.rejected_connections),
        ("expired_keys", keyspace["expired_keys"]),
        ("evicted_keys", keyspace["evicted_keys"]),
        ("keyspace_hits", keyspace["keyspace_hits"]),
        ("keyspace_misses", keyspace["keyspace_misses"]),
        ("pubsub_channels", len(server.pubsub.channels)),
        ("pubsub_patterns", server.pubsub.numpat),
        ("pubsubshard_channels", len(server.pubsub.shard_channels)),
        ("total_error_replies", stats.total_error_replies),
        ("total_reads_processed", stats.total_reads_processed),
        ("total_writes_processed", stats.total_writes_processed),
        ("client_query_buffer_limit_disconnections", stats.client_query_buffer_limit_disconnections),
        ("client_output_buffer_limit_disconnections", stats.client_output_buffer_limit_disconnections),
    ]


def _replication(server: ServerState) -> Fields:
    return [
        ("role", "master"),
        ("connected_slaves", 0),
        ("master_failover_state", "no-failover"),
        ("master_replid", server.run_id),
        ("master_replid2", "0" * 40),
        ("master_repl_offset", 0),
        ("second_repl_offset", -1),
        ("repl_backlog_active", 0),
    ]


def _cpu(server: ServerState) -> Fields:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return [
        ("used_cpu_sys", f"{own.ru_stime:.6f}"),
        ("used_cpu_user", f"{own.ru_utime:.6f}"),
        ("used_cpu_sys_children", f"{children.ru_stime:.6f}"),
        ("used_cpu_user_children", f"{children.ru_utime:.6f}"),
    ]


def _modules(server: ServerState) -> Fields:
    return []


def _commandstats(server: ServerState) -> Iterable[str]:
    return [stat.info_line(name) for name, stat in server.stats.commands.items() if stat.calls or stat.rejected_calls or stat.failed_calls]


def _errorstats(server: ServerState) -> Iterable[str]:
    return [f"errorstat_{code}:count={count}" for code, count in server.stats.errors.items()]


def _latencystats(server: ServerState) -> Iterable[str]:
    """Redis 7's ``latency_percentiles_usec_<command>`` lines (``latency-tracking``,
    ``latency-tracking-info-percentiles``). The percentiles come from each command's latency
    histogram (the metrics endpoint's buckets), interpolated log-linearly inside a bucket: exact
    to the bucket, not to the microsecond as Redis's HDR histogram is."""
    config = server.config
    if not config["latency-tracking"]:
        return []
    wanted = config["latency-tracking-info-percentiles"]
    lines = []
    for name, stat in server.stats.commands.items():
        if not stat.calls:
            continue
        shown = ",".join(f"p{_percentile_label(p)}={percentile_usec(stat.latency, p):.3f}" for p in wanted)
        lines.append(f"latency_percentiles_usec_{name}:{shown}")
    return lines


def _percentile_label(value: float) -> str:
    return f"{value:.6f}".rstrip("0").rstrip(".")


def percentile_usec(buckets: list[int], percentile: float) -> float:
    """The ``percentile`` (0-100) of calls counted per bucket of LATENCY_BOUNDS_USEC."""
    total = sum(buckets)
    if not total:
        return 0.0
    rank = max(1.0, percentile / 100 * total)
    seen = 0
    bounds = (1.0, *map(float, LATENCY_BOUNDS_USEC))
    for i, count in enumerate(buckets):
        if count and seen + count >= rank:
            low = bounds[i] if i < len(bounds) else bounds[-1]
            high = bounds[i + 1] if i + 1 < len(bounds) else bounds[-1] * 4
            fraction = (rank - seen) / count
            return low * (high / low) ** fraction
        seen += count
    return float(LATENCY_BOUNDS_USEC[-1])


def _cluster(server: ServerState) -> Fields:
    return [("cluster_enabled", 0)]


def _keyspace(server: ServerState) -> Iterable[str]:
    keys = server.prefix.namespace_count()
    if not keys:
        return []
    expires, avg_ttl = server.prefix.store.keys.volatile()
    return [f"db0:keys={keys},expires={expires},avg_ttl={avg_ttl}"]


#: name -> (title, builder, in the default set). Builders return pairs or ready lines.
SECTIONS: dict[str, tuple[str, Callable[[ServerState], Iterable[Any]], bool]] = {
    "server": ("Server", _server, True),
    "clients": ("Clients", _clients, True),
    "memory": ("Memory", _memory, True),
    "persistence": ("Persistence", _persistence, True),
    "stats": ("Stats", _stats, True),
    "replication": ("Replication", _replication, True),
    "cpu": ("CPU", _cpu, True),
    "modules": ("Modules", _modules, True),
    "commandstats": ("Commandstats", _commandstats, False),
    "errorstats": ("Errorstats", _errorstats, True),
    "latencystats": ("Latencystats", _latencystats, False),
    "cluster": ("Cluster", _cluster, True),
    "keyspace": ("Keyspace", _keyspace, True),
}

#: Module-style sections (``# pfxcache`` ...) added by later parts of the daemon:
#: name -> (title, builder). Shown for ``everything``, ``modules`` or by name.
MODULE_SECTIONS: dict[str, tuple[str, Callable[[ServerState], Iterable[Any]]]] = {
    "pfxcache": ("pfxcache", lambda server: server.prefix.info_section()),
    "kvevents": ("kvevents", lambda server: server.kv_events.info_fields()),
    "tiers": ("tiers", lambda server: server.prefix.tier.info() if server.prefix.tier is not None
              else [("tier_disk_enabled", 0)]),
}


def select_sections(args: list[str]) -> list[str]:
    """The section names, in print order, that ``INFO args...`` shows."""
    words = {arg.lower() for arg in args} or {"default"}
    chosen: list[str] = []
    everything = "everything" in words
    for name, (_title, _builder, default) in SECTIONS.items():
        if (
            name in words
            or everything
            or "all" in words
            or ("default" in words and default)
        ):
            chosen.append(name)
    for name in MODULE_SECTIONS:
        if name in words or everything or "modules" in words:
            chosen.append(name)
    return chosen


def render(server: ServerState, args: list[str]) -> str:
    """The INFO text for ``args`` (section names, ``all``, ``everything``, ``default``)."""
    blocks = []
    for name in select_sections(args):
        if name in SECTIONS:
            title, builder, _default = SECTIONS[name]
        else:
            title, builder = MODULE_SECTIONS[name]
        lines = [f"# {title}"]
        for item in builder(server):
            lines.append(item if isinstance(item, str) else f"{item[0]}:{item[1]}")
        blocks.append("\r\n".join(lines) + "\r\n")
    return "\r\n".join(blocks)
