"""The shared tier: pages kept in a Redis Cluster (or one Redis) that every daemon of a fleet reads.

A daemon with ``remote-tier <url>`` copies the pages it stores (write-through) and the pages it
evicts (write-back) to the cluster, one key per page, and when a PFXGET's local match (RAM, then
disk) ends before the prompt does, it looks the continuation up there and brings what it finds
into fresh arena blocks before it answers. Pages are content addressed (tier/remote_format.py):
every daemon computes the same key for the same page of the same prompt in the same namespace,
so a prefix prefilled behind daemon A is a hit behind daemon B.

The client is redis-py's ``RedisCluster`` (or ``Redis`` for ``redis://``), synchronous, called
from worker threads: it follows MOVED/ASK and refreshes the topology itself, and a blocking call
in a thread is bounded by its socket timeout and abandoned by the loop at ``remote-tier-timeout``
whatever it does, so no request and no other client ever waits longer on the cluster.

Rules:

* **Reads** (service/remote_reads.py): when the local match ends, the continuation is fetched in
  one pipelined batch, verified, and committed into fresh arena blocks; a request waits at most
  ``remote-tier-timeout`` ms, and the fast path never touches the network.
* **Writes** never slow PFXSET: the store's listeners copy pages into a bounded queue that one
  task sends in batches (service/remote_writes.py, which also writes it out on ``PFXTIER FLUSH``
  and at shutdown, for at most ``remote-tier-shutdown-flush`` ms).
* **Key pages** (HASHES) are each their own start in the shared tier (tier/remote_format.py), so a
  run of them is found from any of its keys, behind any daemon.
* **Failures cost misses, never errors.** A failed call is counted; ``FAILURES_TO_RECONNECT`` in a
  row close the clients and the tier reconnects in the background (every ``RECONNECT_S``) while
  reads are misses at once. A cluster user without the rights a probe needs (SET, GET, DEL) is
  logged at start as an error, not left to silent misses. The URL's password is never logged.
  Each node's state is probed on its own (service/remote_nodes.py).
* **Local operations stay local.** FLUSHALL, PFXEVICT and DEL drop this daemon's queued writes and
  what it remembers, never the fleet's pages (another daemon may be serving them). ``PFXTIER
  DROP`` (:meth:`RemoteTierService.drop_shared`) removes a namespace's keys from the shared tier,
  node by node, an explicit operator's act, on a client of its own in a worker thread.
* **Tenants.** The namespace is in the key's ident chain and in the value's header, compared
  before use: a namespace's pages are reachable through it alone.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from pfxcache.daemon.service.remote_nodes import NODE_CHECK_S, ClusterNodes, drop_namespace_keys, probe_nodes
from pfxcache.daemon.service.remote_reads import ReadPath
from pfxcache.daemon.service.remote_target import RemoteTarget
from pfxcache.daemon.service.remote_writes import WriteQueue
from pfxcache.daemon.store.snapshot import fingerprint

__all__ = ["RemoteTarget", "RemoteTierService", "drop_namespace_keys"]

log = logging.getLogger("pfxcached")

FAILURES_TO_RECONNECT = 3
RECONNECT_S = 1.0
PROBE_KEY = b"pfx:v1:probe"


class RemoteTierService:
    """The shared tier of one daemon (module docstring); built after the prefix service (and the
    disk tier, whose store listeners it chains), closed before them."""

    def __init__(self, config: Any, prefix: Any) -> None:
        self.config = config
        self.target = RemoteTarget(config["remote-tier"])
        if "remote-tier-password" in config and config["remote-tier-password"]:
            self.target.password = config["remote-tier-password"]
        self.timeout_s = config["remote-tier-timeout"] / 1000
        self.write_mode = config["remote-tier-write"] if "remote-tier-write" in config else "through"
        self.prefix = prefix
        self.store = store = prefix.store
        self.arena = prefix.arena
        self.block_bytes = self.arena.block_bytes
        self.page_bytes = store.page_bytes
        self.page_size = store.page_size
        self.fingerprint = fingerprint(store.page_size, self.block_bytes)
        self.state = "connecting"  # connecting | ok | down | refused
        self.reader: Any = None  # redis-py clients: reads (remote-tier-timeout), writes (longer)
        self.writer: Any = None
        self.up = trio.Event()
        self.nodes = ClusterNodes(self.target.nodes)
        self.queue = WriteQueue(self, config, ttl_s=config["remote-tier-ttl"], fingerprint=self.fingerprint)
        self.reads = ReadPath(self)
        self._failures = 0
        self._probed = False
        self._down = trio.Event()
        self.nursery: trio.Nursery | None = None
        # Counters (INFO # tiers, metrics, PFXINFO); the writes' are the queue's.
        self.errors = 0
        self.reconnects = 0
        self.dropped_keys = 0  # PFXTIER DROP
        self.last_error = ""
        listeners = store.listeners
        self._chained = (listeners.demote, listeners.stored, listeners.forget)
        listeners.demote = self._fan_out(listeners.demote, self.demote)
        listeners.forget = self._fan_out(listeners.forget, self.drop_namespace)
        if self.write_mode == "through":
            listeners.stored = self._fan_out(listeners.stored, self.stored)

    @staticmethod
    def _fan_out(first: Any, second: Any) -> Any:
        """One store listener slot for two tiers: the one already there (the disk tier's), then ours."""
        if first is None:
            return second

        def both(*args: Any) -> None:
            first(*args)
            second(*args)

        return both

    # -- life ---------------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Connect (and reconnect whenever the clients fail), write what the queue receives, and
        probe the nodes while connected."""
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            task_status.started()
            try:
                nursery.start_soon(self.queue.run)
                nursery.start_soon(self._watch_nodes)
                await self._connect_loop()
            finally:
                self.nursery = None

    async def _connect_loop(self) -> None:
        while True:
            try:
                clients = await trio.to_thread.run_sync(self._open_and_probe, abandon_on_cancel=True)
            except Exception as exc:  # anything redis-py raises: the cluster is not there (yet)
                self.note_error(exc, connecting=True)
                await trio.sleep(RECONNECT_S)
                continue
            self.reader, self.writer = clients
            self._failures = 0
            self.state = "ok"
            self._down = trio.Event()
            self.up.set()
            log.info("Shared tier %s: connected (%s)", self.target, self._node_text())
            await self._down.wait()
            self.up = trio.Event()
            self.reconnects += 1
            self._close_clients()
            await trio.sleep(RECONNECT_S)

    async def _watch_nodes(self) -> None:
        while True:
            await self.up.wait()
            client = self.reader
            if client is not None:
                probed = await trio.to_thread.run_sync(probe_nodes, client, self.target, abandon_on_cancel=True)
                self.nodes.apply(probed)
            await trio.sleep(NODE_CHECK_S)

    def _open_and_probe(self) -> tuple[Any, Any]:
        """Worker thread: both clients (each reads the topology), and, until it passed once, a probe
        of the rights the tier needs (later a probe key on a hung node would keep the tier down)."""
        reader = self.target.open(self.timeout_s)
        writer = None
        try:
            writer = self.target.open(self._writer_timeout())
            if not self.target.cluster:
                reader.ping()  # RedisCluster read the topology when built; a lone Redis connects lazily
            if self._probed:
                return reader, writer
            value = b"pfxcache probe"
            writer.set(PROBE_KEY, value, px=10_000)
            if writer.get(PROBE_KEY) != value:
                raise RuntimeError("the probe key read back different bytes")
            writer.delete(PROBE_KEY)
            self._probed = True
            return reader, writer
        except BaseException:
            reader.close()
            if writer is not None:
                writer.close()
            raise

    @property
    def shutdown_flush_s(self) -> float:
        """remote-tier-shutdown-flush in seconds (CONFIG SET may change it)."""
        return self.config["remote-tier-shutdown-flush"] / 1000

    def _writer_timeout(self) -> float:
        return max(1.0, 10 * self.timeout_s)

    def note_error(self, exc: BaseException, *, connecting: bool = False) -> None:
        """A failed call: counted, logged once per distinct error, and after FAILURES_TO_RECONNECT
        in a row the tier goes down and reconnects."""
        text = self.target.scrub(f"{type(exc).__name__}: {exc}")
        self.errors += 1
        rights = type(exc).__name__ in ("NoPermissionError", "AuthenticationError", "AuthenticationWrongNumberOfArgsError")
        if text != self.last_error:  # once per distinct error, not once per request
            level = logging.ERROR if rights else logging.WARNING
            log.log(level, "Shared tier %s: %s%s", self.target, text,
                    " (the cluster user lacks rights the tier needs: SET, GET, DEL, SCAN, UNLINK on pfx:*)"
                    if rights else "")
        self.last_error = text
        if connecting:
            self.state = "refused" if rights else "down"
            return
        self._failures += 1
        if self._failures >= FAILURES_TO_RECONNECT and self.state == "ok":
            self.state = "down"
            self._down.set()

    def note_success(self) -> None:
        self._failures = 0

    def _close_clients(self) -> None:
        for client in (self.reader, self.writer):
            if client is not None:
                try:
                    client.close()
                except Exception:  # closing a broken connection: nothing to save
                    pass
        self.reader = self.writer = None

    def close(self) -> None:
        """Restore the store's listeners, write the queue out for at most remote-tier-shutdown-flush
        (what is left is dropped, counted), close the clients."""
        listeners = self.store.listeners
        listeners.demote, listeners.stored, listeners.forget = self._chained
        queued = len(self.queue.pages)
        if queued:
            start = time.monotonic()
            writer = self.writer if self.state == "ok" else None
            written, dropped = self.queue.flush_at_shutdown(writer, self.shutdown_flush_s)
            log.log(logging.WARNING if dropped else logging.INFO,
                    "Shared tier %s: %d queued pages written at shutdown, %d dropped (%.3f s, at most %.3f s)",
                    self.target, written, dropped, time.monotonic() - start, self.shutdown_flush_s)
        self._close_clients()

    # -- writes (service/remote_writes.py) ------------------------------------------------------

    def demote(self, namespace: bytes, node: Any, k: int) -> None:
        """Write-back: the last ``k`` pages of ``node`` leave RAM (store listener, on the loop)."""
        n = len(node.blocks)
        self.queue.enqueue(namespace, node, n - k, n)

    def stored(self, namespace: bytes, node: Any, k: int) -> None:
        """Write-through: the last ``k`` pages of ``node`` were just stored (store listener)."""
        n = len(node.blocks)
        self.queue.enqueue(namespace, node, n - k, n)

    async def write_out(self, timeout_s: float | None = None) -> dict:
        """PFXTIER FLUSH: wait until the queue is written out (at most ``timeout_s``, default
        remote-tier-shutdown-flush); written, dropped and still queued pages."""
        return await self.queue.drain(self.shutdown_flush_s if timeout_s is None else timeout_s)

    # -- reads (service/remote_reads.py) -----------------------------------------------------

    def below(self, ident: bytes) -> bool:
        return self.reads.below(ident)

    async def promote(self, namespace: bytes, tokens: bytes, lock: Any) -> None:
        await self.reads.promote(namespace, tokens, lock)

    # -- forgetting ----------------------------------------------------------------------------

    def flush(self) -> int:
        """FLUSHALL/FLUSHDB: this daemon's queued writes and memories go; the fleet's pages stay."""
        dropped = self.queue.drop_queued(lambda q: False)
        self.reads.forget()
        self.queue.written.clear()
        return dropped

    def drop_namespace(self, namespace: bytes) -> int:
        """PFXEVICT ALL, DEL, an expiry: the namespace's queued writes go (local only)."""
        return self.queue.drop_queued(lambda q: q.namespace != namespace)

    def drop_prefix(self, namespace: bytes, tokens: bytes) -> int:
        """PFXEVICT TOKENS: the namespace's queued writes go (local only)."""
        return self.drop_namespace(namespace)

    async def drop_shared(self, namespace: bytes) -> int:
        """PFXTIER DROP: every key of ``namespace`` removed from the shared tier, primary by primary,
        on a client of its own in a worker thread (the loop and the other clients go on). Pages
        queued here for it go too, and what this daemon remembers as written is forgotten (its
        pages are written again when evicted). RuntimeError when the tier is not connected; what
        redis-py raises when a primary cannot be scanned."""
        if self.state != "ok":
            raise RuntimeError(f"the shared tier is {self.state}")
        self.drop_namespace(namespace)
        self.queue.written.clear()

        def drop() -> int:
            client = self.target.open(self._writer_timeout())
            try:
                return drop_namespace_keys(client, namespace)
            finally:
                client.close()

        removed = await trio.to_thread.run_sync(drop)
        self.dropped_keys += removed
        log.warning("Shared tier %s: PFXTIER DROP removed %d keys of namespace %r", self.target, removed,
                    namespace.decode(errors="backslashreplace"))
        return removed

    # -- figures ------------------------------------------------------------------------------

    def _node_text(self) -> str:
        client = self.reader
        if client is None or not hasattr(client, "get_nodes"):
            return "1 node"
        nodes = list(client.get_nodes())
        primaries = sum(1 for n in nodes if n.server_type == "primary")
        return f"{len(nodes)} nodes, {primaries} primaries"

    def info(self) -> list[tuple[str, object]]:
        """INFO's ``# tiers`` fields of the shared tier, a line per node last."""
        q, r = self.queue, self.reads
        fields: list[tuple[str, object]] = [
            ("tier_remote_enabled", 1),
            ("tier_remote_state", self.state),
            ("tier_remote_url", str(self.target).replace(",", ";")),  # INFO parsers split values on ","
            ("tier_remote_write", self.write_mode),
            ("tier_remote_timeout_ms", int(self.timeout_s * 1000)),
            ("tier_remote_hits", r.hits),
            ("tier_remote_misses", r.misses),
            ("tier_remote_fetches", r.fetches),
            ("tier_remote_fetches_late", r.fetches_late),
            ("tier_remote_fetches_busy", r.fetches_busy),
            ("tier_remote_fetch_bytes", r.fetch_bytes),
            ("tier_remote_fetch_latency_avg_us", int(r.fetch_seconds * 1e6 / r.fetches) if r.fetches else 0),
            ("tier_remote_verify_failures", r.verify_failures),
            ("tier_remote_writes", q.writes),
            ("tier_remote_write_bytes", q.write_bytes),
            ("tier_remote_write_latency_avg_us", int(q.write_seconds * 1e6 / q.write_batches) if q.write_batches else 0),
            ("tier_remote_queue_pages", len(q.pages) + q.sending),
            ("tier_remote_queue_bytes", q.nbytes),
            ("tier_remote_drops", q.drops),
            ("tier_remote_errors", self.errors),
            ("tier_remote_reconnects", self.reconnects),
            ("tier_remote_dropped_keys", self.dropped_keys),
        ]
        return fields + self.nodes.info()

    def describe(self, namespace: bytes | None = None) -> dict:
        """PFXINFO's ``tiers`` map entry of the shared tier (no node lines: PFXTIER INFO has them)."""
        fields = {name.removeprefix("tier_remote_").replace("_", "-"): value for name, value in self.info()
                  if name != "tier_remote_enabled" and not name.startswith("tier_remote_node")}
        return {"remote": fields}

    def check(self) -> list[str]:
        """PFXCHECK: the queue's accounting."""
        return self.queue.check()
