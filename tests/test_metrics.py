"""The Prometheus endpoint (metrics-port): what it exports agrees with INFO, per-namespace labels are
capped, bad HTTP costs nothing, it is off unless asked for, the Grafana dashboard queries only what it
exports, and Debian's prometheus-redis-exporter still reads the daemon (when it is installed).

Everything runs against real daemons over real sockets; the scrapes are parsed with prometheus-client's
own parser, as Prometheus would read them.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import redis
from pfxcache.testing import free_port, start_daemon
from support import wait_for

pytest.importorskip("prometheus_client", reason="the metrics endpoint needs prometheus-client (scripts/setup)")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "conf" / "grafana-pfxcache.json"
PS, BB, NBLOCKS = 4, 512, 32


def start_with_metrics(*args: str):
    """A daemon with its metrics endpoint on a free port (another free one if that was taken meanwhile)."""
    for _ in range(5):
        port = free_port()
        try:
            daemon = start_daemon("--metrics-port", str(port), *args)
        except RuntimeError as exc:
            if "metrics endpoint" in str(exc):
                continue
            raise
        daemon.metrics_port = port
        return daemon
    raise RuntimeError("no free port for the metrics endpoint")


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(found: dict, name: str, **labels) -> float:
    return found[(name, frozenset(labels.items()))]


def packed(*ids: int) -> bytes:
    return np.asarray(ids, "<u4").tobytes()


def seq(seed: int, pages: int) -> bytes:
    return packed(*range(seed, seed + pages * PS))


@pytest.fixture
def daemons():
    started = []

    def start(*args, metrics=True):
        daemon = start_with_metrics(*args) if metrics else start_daemon(*args)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        assert daemon.stop() == 0, daemon.log_text()


def small(*extra: str) -> tuple[str, ...]:
    return ("--maxmemory", str(NBLOCKS * BB), "--page-size", str(PS), "--block-bytes", str(BB),
            "--evict-low-watermark", "0", *extra)


def workload(r: redis.Redis) -> None:
    """Hits, misses, WITHDATA, a pressure eviction, an -OOM, PFXEVICT and FLUSHALL."""
    r.execute_command("PFXSET", "a", "PACKED", seq(100, 3), "DATA", bytes(3 * BB))
    hit = r.execute_command("PFXGET", "a", "PACKED", seq(100, 3) + packed(1, 2))
    r.execute_command("PFXRELEASE", hit[b"lease"])
    r.execute_command("PFXGET", "a", "PACKED", seq(100, 2), "NOLEASE", "WITHDATA")
    r.execute_command("PFXGET", "a", "PACKED", seq(900, 2), "NOLEASE")  # a miss
    r.execute_command("PFXGET", "nobody", "PACKED", seq(900, 1), "NOLEASE")  # a miss, no namespace
    for name, seed in (("b", 200), ("c", 300), ("d", 400)):
        r.execute_command("PFXSET", name, "PACKED", seq(seed, 2), "DATA", bytes(2 * BB))
        r.execute_command("PFXGET", name, "PACKED", seq(seed, 2), "NOLEASE")
    r.execute_command("PFXEVICT", "b", "ALL")  # 2 pages, cause command
    stats = r.execute_command("PFXINFO")
    room = int(stats[b"arena"][b"blocks-free"]) + int(stats[b"stats"][b"pages"])
    grab = r.execute_command("PFXALLOC", "x", room)  # evicts every cached page for room: cause pressure
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.execute_command("PFXALLOC", "x", 1)
    r.execute_command("PFXRELEASE", grab[b"lease"])
    r.execute_command("PFXSET", "e", "PACKED", seq(500, 1), "DATA", bytes(BB))
    r.execute_command("FLUSHALL")
    r.execute_command("PFXSET", "a", "PACKED", seq(100, 1), "DATA", bytes(BB))


def test_counters_agree_with_info(daemons):
    daemon = daemons(*small())
    r = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    try:
        workload(r)
        found = samples(scrape(daemon.metrics_port))
        info = r.info("everything")
        cmd = r.info("commandstats")
    finally:
        r.close()
    pairs = {
        "pfxcache_hit_tokens_total": info["pfxcache_hits_tokens"],
        "pfxcache_miss_tokens_total": info["pfxcache_misses_tokens"],
        "pfxcache_pages": info["pfxcache_pages"],
        "pfxcache_pinned_pages": info["pfxcache_pinned_pages"],
        "pfxcache_namespaces": info["pfxcache_namespaces"],
        "pfxcache_arena_blocks": info["pfxcache_blocks_total"],
        "pfxcache_blocks_used": info["pfxcache_blocks_used"],
        "pfxcache_blocks_free": info["pfxcache_blocks_free"],
        "pfxcache_blocks_leased": info["pfxcache_blocks_leased"],
        "pfxcache_blocks_pinned": info["pfxcache_pinned_pages"],
        "pfxcache_leases": info["pfxcache_active_leases"],
        "pfxcache_oom_refusals_total": info["pfxcache_oom_refusals"],
        "pfxcache_copied_in_bytes_total": info["pfxcache_copied_in_bytes"],
        "pfxcache_copied_out_bytes_total": info["pfxcache_copied_out_bytes"],
        "pfxcache_inserts_total": info["pfxcache_inserts"],
        "pfxcache_commands_processed_total": info["total_commands_processed"],
    }
    for name, expected in pairs.items():
        assert value(found, name) == expected, name
    # The workload really moved each of them.
    assert info["pfxcache_hits_tokens"] == 3 * PS + 2 * PS + 3 * 2 * PS
    assert info["pfxcache_misses_tokens"] == 2 + 2 * PS + PS
    assert info["pfxcache_oom_refusals"] == 1 and info["pfxcache_copied_out_bytes"] == 2 * BB
    assert info["pfxcache_copied_in_bytes"] == (3 + 3 * 2 + 1 + 1) * BB
    for cause in ("pressure", "watermark", "command", "flush"):
        assert value(found, "pfxcache_evicted_pages_total", cause=cause) == info[f"pfxcache_evictions_{cause}"]
    assert info["pfxcache_evictions_pressure"] == 3 + 2 * 2 and info["pfxcache_evictions_command"] == 2
    assert info["pfxcache_evictions_flush"] == 1
    assert sum(info[f"pfxcache_evictions_{c}"] for c in ("pressure", "watermark", "command", "flush")) == \
        info["pfxcache_evictions"]
    assert value(found, "pfxcache_error_replies_total", code="OOM") == info["errorstat_OOM"]["count"]
    # Memory: the parts INFO memory shows.
    assert value(found, "pfxcache_memory_bytes", part="arena") == info["used_memory_arena"] == NBLOCKS * BB
    assert value(found, "pfxcache_memory_bytes", part="dataset") == info["used_memory_dataset"]
    assert value(found, "pfxcache_memory_bytes", part="startup") == info["used_memory_startup"]
    # Latency histograms: one per command, counting what commandstats counts.
    for command in ("pfxget", "pfxset", "pfxalloc", "flushall"):
        stat = cmd[f"cmdstat_{command}"]
        assert value(found, "pfxcache_command_duration_seconds_count", command=command) == stat["calls"]
        assert value(found, "pfxcache_command_duration_seconds_sum", command=command) == \
            pytest.approx(stat["usec"] / 1e6)
        assert value(found, "pfxcache_command_duration_seconds_bucket", command=command, le="+Inf") == stat["calls"]
        buckets = sorted((float(dict(labels)["le"]), v) for (name, labels), v in found.items()
                         if name == "pfxcache_command_duration_seconds_bucket" and ("command", command) in labels)
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))  # cumulative
    assert value(found, "pfxcache_info", version=info["pfxcache_version"], redis_version="7.0.15",
                 policy=info["pfxcache_policy"], arena="shm", page_size=str(PS), block_bytes=str(BB)) == 1
    assert value(found, "process_resident_memory_bytes") > 0  # the standard process collector


def test_namespace_labels_are_capped_and_add_up(daemons):
    daemon = daemons(*small("--metrics-namespaces", "2"))
    r = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)

    def labelled() -> tuple[dict, dict]:
        found = samples(scrape(daemon.metrics_port))
        hits = {dict(labels)["namespace"]: v for (name, labels), v in found.items()
                if name == "pfxcache_namespace_hit_tokens_total"}
        pages = {dict(labels)["namespace"]: v for (name, labels), v in found.items()
                 if name == "pfxcache_namespace_pages"}
        assert sum(hits.values()) == value(found, "pfxcache_hit_tokens_total")
        assert sum(pages.values()) == value(found, "pfxcache_pages")
        assert len(hits) <= 3 and "_other" in hits
        return hits, pages

    try:
        for name, seed in (("t1", 10), ("t2", 20)):
            r.execute_command("PFXSET", name, "PACKED", seq(seed, 1), "DATA", bytes(BB))
            r.execute_command("PFXGET", name, "PACKED", seq(seed, 1), "NOLEASE")
        hits, _ = labelled()
        assert set(hits) == {"t1", "t2", "_other"} and hits["t1"] == PS and hits["_other"] == 0
        for name, seed in (("t0", 30), ("t3", 40)):  # t0 sorts first, but the slots are taken
            r.execute_command("PFXSET", name, "PACKED", seq(seed, 1), "DATA", bytes(BB))
            r.execute_command("PFXGET", name, "PACKED", seq(seed, 2), "NOLEASE")
        hits, pages = labelled()
        assert set(hits) == {"t1", "t2", "_other"} and hits["_other"] == 2 * PS and pages["_other"] == 2
        r.execute_command("PFXEVICT", "t1", "ALL")  # t1 is gone: its slot goes to the first one waiting
        hits, _ = labelled()
        assert set(hits) == {"t0", "t2", "_other"}
        assert hits["_other"] == PS + PS  # t3's hits and the retired t1's
    finally:
        r.close()


def test_bad_http_is_answered_and_costs_nothing(daemons):
    daemon = daemons(*small())
    port = daemon.metrics_port

    def raw(payload: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(payload)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            return data

    idle = socket.create_connection(("127.0.0.1", port), timeout=10)  # says nothing: must block nobody
    try:
        assert raw(b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        assert raw(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 40_000 + b"\r\n\r\n").startswith(b"HTTP/1.1 4")
        with pytest.raises(urllib.error.HTTPError) as err:
            scrape(port, "/nothing")
        assert err.value.code == 404
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == 405 and err.value.headers["allow"] == "GET, HEAD"
        head = raw(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")
        # Two requests on one keep-alive connection, as Prometheus scrapes.
        both = raw(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert both.count(b"HTTP/1.1 200 OK") == 2 and b"pfxcache_pages" in both
        openmetrics = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                             headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        with urllib.request.urlopen(openmetrics, timeout=10) as response:
            assert response.headers["content-type"].startswith("application/openmetrics-text")
            assert response.read().decode().rstrip().endswith("# EOF")
        assert "pfxcache_pages" in scrape(port)
        r = redis.Redis(host=daemon.host, port=daemon.port)
        assert r.ping() is True
        r.close()
    finally:
        idle.close()


def test_off_by_default_and_loopback_by_default(daemons):
    daemon = daemons(*small(), metrics=False)
    r = redis.Redis(host=daemon.host, port=daemon.port, decode_responses=True)
    try:
        assert r.config_get("metrics-*") == {"metrics-port": "0", "metrics-bind": "127.0.0.1",
                                             "metrics-namespaces": "100"}
        with pytest.raises(redis.ResponseError, match="immutable"):
            r.config_set("metrics-port", "9999")
        r.config_set("metrics-namespaces", "5")
        assert r.config_get("metrics-namespaces") == {"metrics-namespaces": "5"}
    finally:
        r.close()
    assert "Metrics endpoint" not in daemon.log_text()
    on = daemons(*small())
    assert f"Metrics endpoint on http://127.0.0.1:{on.metrics_port}/metrics" in on.log_text()


def test_a_taken_port_is_a_startup_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="Cannot open the metrics endpoint on port"):
            start_daemon(*small("--metrics-port", str(port)))


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries = [var["query"]["query"] for var in board["templating"]["list"] if var["type"] == "query"]
    for panel in board["panels"]:
        refs = [target["refId"] for target in panel["targets"]]
        assert len(set(refs)) == len(refs) and panel["datasource"]["uid"] == "${datasource}", panel["title"]
        queries += [target["expr"] for target in panel["targets"]]
    return queries


def test_grafana_dashboard_queries_what_the_endpoint_exports(daemons):
    daemon = daemons(*small())
    r = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    try:
        workload(r)
        exported = {name for name, _labels in samples(scrape(daemon.metrics_port))}
    finally:
        r.close()
    used = set()
    for query in dashboard_queries():
        assert query.count("(") == query.count(")"), query
        used |= set(re.findall(r"\bpfxcache_[a-z_]+", query))
    assert used, "the dashboard queries nothing"
    assert used <= exported, f"queried but not exported: {sorted(used - exported)}"
    # And every family the endpoint exports has a panel.
    from pfxcache.daemon.observability.metrics import NAMES

    shown = {re.sub(r"_(total|bucket|count|sum)$", "", name) for name in used}
    assert set(NAMES) <= shown, f"exported but on no panel: {sorted(set(NAMES) - shown)}"


EXPORTER = shutil.which("prometheus-redis-exporter")


@pytest.mark.skipif(EXPORTER is None, reason="Debian's prometheus-redis-exporter is not installed "
                                             "(apt-get install prometheus-redis-exporter)")
def test_prometheus_redis_exporter_reads_the_daemon(daemons):
    daemon = daemons(*small(), metrics=False)
    r = redis.Redis(host=daemon.host, port=daemon.port)
    r.execute_command("PFXSET", "a", "PACKED", seq(100, 2), "DATA", bytes(2 * BB))
    r.execute_command("PFXGET", "a", "PACKED", seq(100, 2), "NOLEASE")
    r.execute_command("PFXGET", "a", "PACKED", seq(700, 1), "NOLEASE")
    port = free_port()
    exporter = subprocess.Popen([EXPORTER, "-redis.addr", f"redis://{daemon.host}:{daemon.port}",
                                 "-web.listen-address", f"127.0.0.1:{port}"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def ready():
            try:
                return scrape(port)
            except OSError:
                return None

        text = wait_for(ready, 20, "the exporter to listen")
        found = samples(text)
        info = r.info("everything")
        assert value(found, "redis_up") == 1
        assert value(found, "redis_exporter_last_scrape_error", err="") == 0
        assert value(found, "redis_keyspace_hits_total") == info["keyspace_hits"] == 2 * PS
        assert value(found, "redis_keyspace_misses_total") == info["keyspace_misses"] == PS
        assert value(found, "redis_memory_max_bytes") == info["maxmemory"]
        # The honest memory figures reach it under Redis's names (the gauges move, the arena does not).
        assert value(found, "redis_memory_used_dataset_bytes") == info["used_memory_dataset"] == 2 * BB
        assert value(found, "redis_memory_used_startup_bytes") == info["used_memory_startup"]
        assert value(found, "redis_memory_used_overhead_bytes") > 0 and value(found, "redis_memory_used_bytes") > 0
        assert value(found, "redis_db_keys", db="db0") == 1
        assert value(found, "redis_commands_total", cmd="pfxget") == 2
    finally:
        exporter.terminate()
        exporter.wait(10)
        r.close()


def test_kv_event_counters_agree_with_info(daemons):
    pytest.importorskip("zmq", reason="KV events need pyzmq (scripts/setup)")
    daemon = daemons(*small("--kv-events-endpoint", f"tcp://127.0.0.1:{free_port()}"))
    r = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    try:
        workload(r)
        wait_for(lambda: r.info("everything")["kv_events_queue_length"] == 0, 20, "the publisher to drain")
        found = samples(scrape(daemon.metrics_port))
        info = r.info("everything")
    finally:
        r.close()
    assert info["kv_events_published"] > 0
    assert value(found, "pfxcache_kv_events_published_total") == info["kv_events_published"]
    assert value(found, "pfxcache_kv_events_dropped_total") == info["kv_events_dropped"]
    assert value(found, "pfxcache_kv_events_queue_length") == info["kv_events_queue_length"] == 0
