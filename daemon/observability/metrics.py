"""What the Prometheus endpoint exports: the daemon's figures as metric families, read at scrape time.

Nothing is counted twice: every value is read, when Prometheus scrapes, from
the owner INFO reads it from (the store's counters and gauges, the prefix
service's copy counters, the server's command stats, the memory figures), so
the endpoint and INFO always agree. The endpoint itself (HTTP) is
:mod:`.metrics_http`.

Per-namespace series are capped (``metrics-namespaces``): a namespace takes a
label when it first appears with a slot free and keeps it while it exists;
the rest are summed under ``namespace="_other"`` (the global total minus the
labelled ones), so the sum over labels is the global counter.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pfxcache.daemon.observability.stats import LATENCY_BOUNDS_USEC

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from pfxcache.daemon.commands.context import ServerState

OTHER = "_other"  # the label of the namespaces beyond the cap

#: (metric, help, field of PrefixStore.stats()) of the counters and gauges read straight from the store.
STORE_COUNTERS = (
    ("pfxcache_hit_tokens", "Prompt tokens found cached by PFXGET.", "hits_tokens"),
    ("pfxcache_miss_tokens", "Prompt tokens PFXGET did not find cached.", "misses_tokens"),
    ("pfxcache_inserts", "Committed inserts (PFXSET).", "inserts"),
    ("pfxcache_stored_pages", "Pages newly cached by inserts.", "stored_pages"),
)
STORE_GAUGES = (
    ("pfxcache_pages", "Cached pages.", "pages"),
    ("pfxcache_pinned_pages", "Cached pages pinned by a lease or an insert.", "pinned_pages"),
    ("pfxcache_namespaces", "Namespaces (keys) holding pages or leases.", "namespaces"),
    ("pfxcache_arena_blocks", "Blocks of the arena.", "blocks_total"),
    ("pfxcache_blocks_used", "Blocks holding a cached page or leased.", "blocks_used"),
    ("pfxcache_blocks_free", "Free blocks.", "blocks_free"),
    ("pfxcache_blocks_leased", "Blocks held by allocations and inserts in flight.", "blocks_leased"),
    ("pfxcache_blocks_pinned", "Blocks of cached pages a lease pins (not evictable).", "pinned_pages"),
    ("pfxcache_leases", "Active leases.", "leases"),
)

# Every family this module exports (without the _total/_bucket suffixes): the Grafana
# dashboard's queries are checked against these names.
NAMES = (
    "pfxcache_info", *(name for name, _, _ in STORE_COUNTERS + STORE_GAUGES),
    "pfxcache_namespace_hit_tokens", "pfxcache_namespace_miss_tokens", "pfxcache_namespace_pages",
    "pfxcache_evicted_pages", "pfxcache_oom_refusals", "pfxcache_copied_in_bytes", "pfxcache_copied_out_bytes",
    "pfxcache_memory_bytes", "pfxcache_metadata_bytes_per_page", "pfxcache_connected_clients",
    "pfxcache_commands_processed", "pfxcache_error_replies", "pfxcache_command_duration_seconds",
    "pfxcache_kv_events_published", "pfxcache_kv_events_dropped", "pfxcache_kv_events_queue_length",
)


def _prometheus() -> ModuleType:
    # Imported when the endpoint is used: a daemon without metrics-port needs no prometheus-client.
    from prometheus_client import core

    return core


def _label(name: bytes) -> str:
    return name.decode("utf-8", "backslashreplace")


class NamespaceSlots:
    """Which namespaces have a label of their own: at most ``cap``, sticky while they exist."""

    def __init__(self) -> None:
        self._labelled: dict[bytes, None] = {}  # ordered: first come, first labelled

    def choose(self, present: list[bytes], cap: int) -> list[bytes]:
        """The labelled namespaces among ``present`` (sorted, as the store lists them)."""
        alive = set(present)
        for name in [name for name in self._labelled if name not in alive]:
            del self._labelled[name]  # gone: its slot is free again
        while len(self._labelled) > cap:  # the cap was lowered: the newest give their slots back
            self._labelled.pop(next(reversed(self._labelled)))
        for name in present:
            if len(self._labelled) >= cap:
                break
            self._labelled.setdefault(name, None)
        return list(self._labelled)


class DaemonCollector:
    """A prometheus_client collector over one server (see the module docstring)."""

    def __init__(self, server: ServerState) -> None:
        self.server = server
        self.slots = NamespaceSlots()

    def describe(self) -> list[Any]:
        return []  # no fixed description: families are built at scrape time

    def collect(self) -> Iterator[Any]:
        m = _prometheus()
        server = self.server
        prefix = server.prefix
        store = prefix.store
        stats = store.stats()
        yield m.InfoMetricFamily("pfxcache", "The daemon's version, geometry and policy.", value={
            "version": server.version, "redis_version": server.redis_version, "policy": stats["policy"],
            "arena": str(prefix.arena.describe().get("backend")), "page_size": str(stats["page_size"]),
            "block_bytes": str(stats["block_bytes"])})
        for name, doc, field in STORE_COUNTERS:
            yield m.CounterMetricFamily(name, doc, stats[field])
        for name, doc, field in STORE_GAUGES:
            yield m.GaugeMetricFamily(name, doc, stats[field])
        yield from self._namespaces(stats)
        evicted = m.CounterMetricFamily("pfxcache_evicted_pages", "Pages evicted, by cause: pressure (room "
                                        "for a write), watermark (background), command (PFXEVICT, DEL), flush.",
                                        labels=["cause"])
        for cause, pages in store.evictions_by_cause.items():
            evicted.add_metric([cause], pages)
        yield evicted
        yield m.CounterMetricFamily("pfxcache_oom_refusals", "Inserts and allocations refused with -OOM.",
                                    store.oom_refusals)
        yield m.CounterMetricFamily("pfxcache_copied_in_bytes", "KV bytes copied into the arena from PFXSET "
                                    "DATA.", prefix.copied_in_bytes)
        yield m.CounterMetricFamily("pfxcache_copied_out_bytes", "KV bytes copied out of the arena for "
                                    "WITHDATA.", prefix.copied_out_bytes)
        yield from self._memory()
        yield m.GaugeMetricFamily("pfxcache_connected_clients", "Client connections.", len(server.clients))
        yield from self._commands()
        yield from self._kv_events()
        yield from self._tiers()

    def _namespaces(self, stats: dict) -> Iterator[Any]:
        m = _prometheus()
        store = self.server.prefix.store
        labelled = self.slots.choose(store.namespaces(), self.server.config["metrics-namespaces"])
        hits = m.CounterMetricFamily("pfxcache_namespace_hit_tokens", "Prompt tokens found cached, by namespace.",
                                     labels=["namespace"])
        misses = m.CounterMetricFamily("pfxcache_namespace_miss_tokens", "Prompt tokens not found cached, by "
                                       "namespace.", labels=["namespace"])
        pages = m.GaugeMetricFamily("pfxcache_namespace_pages", "Cached pages, by namespace.", labels=["namespace"])
        seen = [0, 0, 0]
        for name in labelled:
            ns = store.stats(name)
            figures = (ns["hits_tokens"], ns["misses_tokens"], ns["pages"])
            for family, value in zip((hits, misses, pages), figures):
                family.add_metric([_label(name)], value)
            seen = [a + b for a, b in zip(seen, figures)]
        # Everything else, retired namespaces' counts included: the labels then add up to the totals.
        rest = (stats["hits_tokens"] - seen[0], stats["misses_tokens"] - seen[1], stats["pages"] - seen[2])
        for family, value in zip((hits, misses, pages), rest):
            family.add_metric([OTHER], value)
        yield from (hits, misses, pages)

    def _memory(self) -> Iterator[Any]:
        m = _prometheus()
        figures = self.server.prefix.memory_figures()
        memory = m.GaugeMetricFamily("pfxcache_memory_bytes", "Memory by part: arena (reserved by maxmemory), "
                                     "dataset (blocks holding data), heap (the process's private memory), "
                                     "startup (the heap of the empty daemon), metadata (heap added by the cached "
                                     "pages), rss (all resident), arena_resident (arena pages resident here).",
                                     labels=["part"])
        for part, value in (("arena", figures.arena_bytes), ("dataset", figures.dataset_bytes),
                            ("heap", figures.heap_bytes), ("startup", figures.startup_heap_bytes),
                            ("metadata", figures.metadata_bytes), ("rss", figures.rss_bytes),
                            ("arena_resident", figures.arena_resident_bytes)):
            memory.add_metric([part], value)
        yield memory
        yield m.GaugeMetricFamily("pfxcache_metadata_bytes_per_page", "Metadata bytes per cached page.",
                                  figures.metadata_per_page)

    def _commands(self) -> Iterator[Any]:
        m = _prometheus()
        stats = self.server.stats
        yield m.CounterMetricFamily("pfxcache_commands_processed", "Commands processed (INFO's "
                                    "total_commands_processed).", stats.total_commands_processed)
        errors = m.CounterMetricFamily("pfxcache_error_replies", "Error replies, by error code (INFO errorstats).",
                                       labels=["code"])
        for code, count in stats.errors.items():
            errors.add_metric([code], count)
        yield errors
        duration = m.HistogramMetricFamily("pfxcache_command_duration_seconds", "Time commands took to run, "
                                           "by command (INFO commandstats' usec, as a histogram).",
                                           labels=["command"])
        for name, stat in stats.commands.items():
            if not stat.calls:
                continue
            buckets, cumulative = [], 0
            for bound, count in zip((*LATENCY_BOUNDS_USEC, None), stat.latency):
                cumulative += count
                buckets.append(("+Inf" if bound is None else repr(bound / 1e6), cumulative))
            duration.add_metric([name], buckets, stat.usec / 1e6)
        yield duration

    def _kv_events(self) -> Iterator[Any]:
        m = _prometheus()
        service = getattr(self.server, "kv_events", None)
        publisher = service.publisher if service is not None else None
        fields = dict(publisher.describe()) if publisher is not None else {}
        yield m.CounterMetricFamily("pfxcache_kv_events_published", "KV events published on kv-events-endpoint.",
                                    fields.get("kv_events_published", 0))
        yield m.CounterMetricFamily("pfxcache_kv_events_dropped", "KV events dropped (queue full, or unsent).",
                                    fields.get("kv_events_dropped", 0))
        yield m.GaugeMetricFamily("pfxcache_kv_events_queue_length", "KV events waiting for the publisher.",
                                  fields.get("kv_events_queue_length", 0))

    #: INFO tiers fields exported per tier (label tier="disk"): name -> (kind, help).
    TIER_FIELDS = {
        "pages": ("gauge", "Pages the tier holds."),
        "bytes": ("gauge", "Bytes of pages the tier holds."),
        "hits": ("counter", "Pages served from the tier (read back into RAM for a PFXGET)."),
        "promotions": ("counter", "Pages read back into RAM."),
        "demotions": ("counter", "Pages written to the tier when evicted from RAM (or stored, write-through)."),
        "demotions_skipped": ("counter", "Evicted pages not written (queue full, a failed write)."),
        "evictions": ("counter", "Pages the tier evicted to make room."),
        "verify_failures": ("counter", "Pages read from the tier that did not verify (a miss each)."),
        "io_errors": ("counter", "I/O errors of the tier's files."),
        "read_bytes": ("counter", "Bytes read from the tier."),
        "write_bytes": ("counter", "Bytes written to the tier."),
        "queue_pages": ("gauge", "Pages waiting to be written to the tier."),
    }

    #: INFO tiers fields of the shared tier alone (no label): name -> (kind, help).
    REMOTE_TIER_FIELDS = {
        "misses": ("counter", "Shared-tier fetches that brought no page."),
        "fetches": ("counter", "Batched fetches from the shared tier."),
        "fetches_late": ("counter", "Fetches a PFXGET stopped waiting for (remote-tier-timeout)."),
        "fetch_bytes": ("counter", "Bytes fetched from the shared tier."),
        "fetch_latency_avg_us": ("gauge", "Mean time of a shared-tier fetch, microseconds."),
        "write_latency_avg_us": ("gauge", "Mean time of a shared-tier write batch, microseconds."),
        "writes": ("counter", "Pages written to the shared tier."),
        "drops": ("counter", "Pages not written to the shared tier (queue full, cluster down, failed)."),
        "errors": ("counter", "Failed calls to the shared tier."),
        "reconnects": ("counter", "Times the shared tier's clients were rebuilt."),
        "nodes": ("gauge", "Nodes of the shared tier's cluster the client knows."),
        "dropped_keys": ("counter", "Keys PFXTIER DROP removed from the shared tier."),
    }

    def _tiers(self) -> Iterator[Any]:
        m = _prometheus()
        tier = getattr(self.server.prefix, "tier", None)
        if tier is None:
            return
        fields = dict(tier.info())
        for field, (kind, doc) in self.TIER_FIELDS.items():
            family = (m.GaugeMetricFamily if kind == "gauge" else m.CounterMetricFamily)(
                f"pfxcache_tier_{field}", doc, labels=["tier"])
            for name in ("disk", "remote"):
                if f"tier_{name}_{field}" in fields:
                    family.add_metric([name], fields[f"tier_{name}_{field}"])
            yield family
        for field, (kind, doc) in self.REMOTE_TIER_FIELDS.items():
            if f"tier_remote_{field}" in fields:
                family = m.GaugeMetricFamily if kind == "gauge" else m.CounterMetricFamily
                yield family(f"pfxcache_tier_remote_{field}", doc, fields[f"tier_remote_{field}"])
        nodes = [dict(part.split("=", 1) for part in str(value).split(","))
                 for name, value in fields.items() if name.startswith("tier_remote_node") and name[16:].isdigit()]
        if nodes:  # a line per cluster node: host:port only, never a credential
            up = m.GaugeMetricFamily("pfxcache_tier_remote_node_up", "1 when the shared tier's node answers.",
                                     labels=["node", "role"])
            errors = m.CounterMetricFamily("pfxcache_tier_remote_node_errors", "Failed calls to the node.",
                                           labels=["node"])
            for node in nodes:
                up.add_metric([node["addr"], node["role"]], 1 if node["state"] == "up" else 0)
                errors.add_metric([node["addr"]], int(node["errors"]))
            yield up
            yield errors


def build_registry(server: ServerState) -> CollectorRegistry:
    """A registry of the daemon's metrics and the standard process_* ones (no global state).

    ImportError when prometheus-client is not installed.
    """
    from prometheus_client import CollectorRegistry, ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(server))
    ProcessCollector(registry=registry)
    return registry
