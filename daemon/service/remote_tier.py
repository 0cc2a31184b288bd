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

* **Reads.** :meth:`promote` computes the idents of the pages after the local match (one batch of
  at most ``MAX_FETCH_PAGES`` pages, ``MAX_FETCH_BYTES`` bytes) and fetches them in one pipeline
  of GETs (redis-py groups it by node, so one round trip per node, all nodes at once). Each value
  is verified in the thread (namespace, ident, parent ident, geometry, checksum); the leading run
  of verified pages is planned, copied and committed into fresh arena blocks under the shard's
  write lock, with no await between plan and commit. The request waits at most
  ``remote-tier-timeout`` ms: later, those pages are a miss for it, and the fetch still lands for
  the next request. Two requests for the same continuation share one fetch. At most
  ``READ_THREADS`` fetches run at once; a request that finds them all busy is a miss at once.
* **below() is not a network call.** The store's fast path asks :meth:`below` whether a lower tier
  continues a match; the shared tier answers "maybe" (True) while connected, unless the page was
  looked up and found absent within ``ABSENT_TTL_S``, so a prompt whose continuation is nowhere
  pays one round trip, not one per request. The price: a page another daemon writes just after
  this one missed it is found up to ``ABSENT_TTL_S`` later.
* **Writes** never slow PFXSET: the listeners copy the pages on the loop into a bounded queue
  (``remote-tier-queue`` bytes; beyond it, or while the cluster is down, pages are dropped and
  counted), and one writer task sends them in batches (pipelined SET, ``EX remote-tier-ttl``
  when not 0). Pages written recently are remembered (``WRITTEN_MEMORY`` idents) and not sent
  again when they are evicted. What the queue holds at shutdown is dropped: the tier is a cache.
* **Failures cost misses, never errors.** A failed call is counted; ``FAILURES_TO_RECONNECT`` in a
  row close the clients and the tier reconnects in the background (every ``RECONNECT_S``) while
  reads are misses at once. A cluster user without the rights a probe needs (SET, GET, DEL) is
  logged at start as an error, not left to silent misses. The URL's password is never logged.
* **Local operations stay local.** FLUSHALL, PFXEVICT and DEL drop this daemon's queued writes and
  what it remembers, never the fleet's pages (another daemon may be serving them).
  :func:`drop_namespace_keys` (``PFXTIER DROP`` in the wiring) removes a namespace's keys from the
  shared tier, node by node (``SCAN MATCH`` + ``UNLINK``), an explicit operator's act.
* **Tenants.** The namespace is in the key's ident chain and in the value's header, compared
  before use: a namespace's pages are reachable through it alone.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections import OrderedDict, deque
from typing import Any

import trio

from pfxcache.daemon.store.arguments import namespace_name, packed_tokens
from pfxcache.daemon.store.errors import StoreError
from pfxcache.daemon.store.idents import IDENT_BYTES, chain, ident_before, namespace_ident, node_idents
from pfxcache.daemon.store.snapshot import fingerprint
from pfxcache.daemon.tier import remote_format

log = logging.getLogger("pfxcached")

MAX_FETCH_PAGES = 256
MAX_FETCH_BYTES = 64 << 20
READ_THREADS = 4
BATCH_PAGES = 64
ABSENT_TTL_S = 1.0
ABSENT_MEMORY = 65536
WRITTEN_MEMORY = 65536
FAILURES_TO_RECONNECT = 3
RECONNECT_S = 1.0
PROBE_KEY = b"pfx:v1:probe"
#: redis-py's retries of a cluster call after a connection error: each one refreshes the topology and
#: picks another default node (the one COMMAND goes to when a client is built may be the dead one).
#: The loop never waits for them: a request waits remote-tier-timeout at most.
CLUSTER_RETRIES = 3


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
                       socket_connect_timeout=timeout_s, client_name="pfxcached-remote-tier")
        if not self.cluster:
            host, port = self.nodes[0]
            return redis.Redis(host=host, port=port, retry=Retry(NoBackoff(), 0), **options)
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in self.nodes], require_full_coverage=False,
                            retry=Retry(NoBackoff(), CLUSTER_RETRIES), **options)


def drop_namespace_keys(client: Any, namespace: bytes) -> int:
    """Remove every key of ``namespace`` from the shared tier, each primary scanned; blocking.
    Returns the keys unlinked. Safe while daemons run: a page gone is a miss for them."""
    pattern = remote_format.namespace_pattern(namespace)
    removed = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 500:
            removed += client.unlink(*batch)
            batch.clear()
    if batch:
        removed += client.unlink(*batch)
    return removed


class _Pending:
    """A page waiting for the writer: its identity and a copy of its bytes."""

    __slots__ = ("data", "ident", "namespace", "parent")

    def __init__(self, namespace: bytes, parent: bytes, ident: bytes, data: memoryview) -> None:
        self.namespace = namespace
        self.parent = parent
        self.ident = ident
        self.data = data


class RemoteTierService:
    """The shared tier of one daemon (module docstring); built after the prefix service (and the
    disk tier, whose store listeners it chains), closed before them."""

    def __init__(self, config: Any, prefix: Any) -> None:
        self.config = config
        self.target = RemoteTarget(config["remote-tier"])
        if "remote-tier-password" in config and config["remote-tier-password"]:
            self.target.password = config["remote-tier-password"]
        self.timeout_s = config["remote-tier-timeout"] / 1000
        self.queue_limit = config["remote-tier-queue"]
        self.ttl_s = config["remote-tier-ttl"]
        self.write_mode = config["remote-tier-write"] if "remote-tier-write" in config else "through"
        self.prefix = prefix
        self.store = store = prefix.store
        self.arena = prefix.arena
        self.block_bytes = self.arena.block_bytes
        self.page_bytes = store.page_bytes
        self.page_size = store.page_size
        self.fingerprint = fingerprint(store.page_size, self.block_bytes)
        self.state = "connecting"  # connecting | ok | down | refused
        self._reader: Any = None  # redis-py clients: reads (remote-tier-timeout), writes (longer)
        self._writer: Any = None
        self._failures = 0
        self._probed = False
        self._down = trio.Event()
        self._up = trio.Event()
        self._queue: deque[_Pending] = deque()
        self._queued: dict[bytes, _Pending] = {}
        self._queue_bytes = 0
        self._written: OrderedDict[bytes, None] = OrderedDict()
        self._absent: OrderedDict[bytes, float] = OrderedDict()
        self._inflight: dict[bytes, trio.Event] = {}
        self._read_limiter = trio.CapacityLimiter(READ_THREADS)
        self._wake: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        # Counters (INFO # tiers, metrics, PFXINFO).
        self.hits = 0  # pages brought in
        self.misses = 0  # fetches that brought no page
        self.fetches = self.fetches_late = self.fetches_busy = 0
        self.fetch_bytes = 0
        self.fetch_seconds = 0.0
        self.verify_failures = 0
        self.errors = 0
        self.reconnects = 0
        self.writes = self.write_bytes = 0
        self.write_seconds = 0.0
        self.write_batches = 0
        self.drops = 0
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
        """Connect (and reconnect whenever the clients fail), and write what the queue receives."""
        self._wake = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                nursery.start_soon(self._write_loop)
                await self._connect_loop()
            finally:
                self._nursery = None

    async def _connect_loop(self) -> None:
        while True:
            try:
                clients = await trio.to_thread.run_sync(self._open_and_probe, abandon_on_cancel=True)
            except Exception as exc:  # anything redis-py raises: the cluster is not there (yet)
                self._note_error(exc, connecting=True)
                await trio.sleep(RECONNECT_S)
                continue
            self._reader, self._writer = clients
            self._failures = 0
            self.state = "ok"
            self._down = trio.Event()
            self._up.set()
            log.info("Shared tier %s: connected (%s)", self.target, self._node_text())
            await self._down.wait()
            self._up = trio.Event()
            self.reconnects += 1
            self._close_clients()
            await trio.sleep(RECONNECT_S)

    def _open_and_probe(self) -> tuple[Any, Any]:
        """Worker thread: both clients (each reads the topology), and, until it passed once, a probe
        of the rights the tier needs (later a probe key on a hung node would keep the tier down)."""
        reader = self.target.open(self.timeout_s)
        writer = None
        try:
            writer = self.target.open(max(1.0, 10 * self.timeout_s))
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

    def _note_error(self, exc: BaseException, *, connecting: bool = False) -> None:
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

    def _close_clients(self) -> None:
        for client in (self._reader, self._writer):
            if client is not None:
                try:
                    client.close()
                except Exception:  # closing a broken connection: nothing to save
                    pass
        self._reader = self._writer = None

    def close(self) -> None:
        """Restore the store's listeners, drop what the queue holds (counted), close the clients."""
        listeners = self.store.listeners
        listeners.demote, listeners.stored, listeners.forget = self._chained
        self.drops += len(self._queue)
        self._drop_queued(lambda q: False)
        self._close_clients()

    # -- writes -------------------------------------------------------------------------------

    def demote(self, namespace: bytes, node: Any, k: int) -> None:
        """Write-back: the last ``k`` pages of ``node`` leave RAM (store listener, on the loop)."""
        n = len(node.blocks)
        self._enqueue(namespace, node, n - k, n)

    def stored(self, namespace: bytes, node: Any, k: int) -> None:
        """Write-through: the last ``k`` pages of ``node`` were just stored (store listener)."""
        n = len(node.blocks)
        self._enqueue(namespace, node, n - k, n)

    def _enqueue(self, namespace: bytes, node: Any, lo: int, hi: int) -> None:
        if self.state != "ok":
            self.drops += hi - lo
            return
        idents = node_idents(node)
        parent = ident_before(node, lo)
        pages: list[tuple[int, bytes, bytes]] = []
        for page in range(lo, hi):
            ident = idents[page * IDENT_BYTES : (page + 1) * IDENT_BYTES]
            if ident not in self._queued and ident not in self._written:
                pages.append((page, parent, ident))
            parent = ident
        if not pages:
            return
        need = len(pages) * self.block_bytes
        if self._queue_bytes + need > self.queue_limit:
            self.drops += len(pages)
            return
        data = memoryview(self.arena.read([node.blocks[page] for page, _, _ in pages]))
        bb = self.block_bytes
        for i, (_, parent, ident) in enumerate(pages):
            entry = _Pending(namespace, parent, ident, data[i * bb : (i + 1) * bb])
            self._queue.append(entry)
            self._queued[ident] = entry
        self._queue_bytes += need
        if self._wake is not None:
            self._wake.set()

    async def _write_loop(self) -> None:
        while True:
            if not self._queue:
                self._wake = trio.Event()
                await self._wake.wait()
            await self._up.wait()
            batch = [self._queue.popleft() for _ in range(min(BATCH_PAGES, len(self._queue)))]
            writer, ok = self._writer, 0
            start = time.monotonic()
            try:
                if writer is not None:
                    landed, nbytes = await trio.to_thread.run_sync(self._send, writer, batch, abandon_on_cancel=True)
                    ok = len(landed)
                    self.writes += ok
                    self.write_bytes += nbytes
                    for ident in landed:
                        self._remember(self._written, ident, None, WRITTEN_MEMORY)
            except Exception as exc:
                self._note_error(exc)
            finally:
                self.write_seconds += time.monotonic() - start
                self.write_batches += 1
                for q in batch:
                    if self._queued.get(q.ident) is q:
                        del self._queued[q.ident]
                    self._queue_bytes -= len(q.data)
                self.drops += len(batch) - ok
            if ok:
                self._failures = 0

    def _send(self, client: Any, batch: list[_Pending]) -> tuple[list[bytes], int]:
        """Worker thread: encode and SET a batch in one pipeline; the idents that landed, their bytes."""
        pipe = client.pipeline(transaction=False)
        sizes = []
        for q in batch:
            value = remote_format.encode(q.namespace, q.ident, q.parent, self.fingerprint, q.data)
            sizes.append(len(value))
            pipe.set(remote_format.key_of(q.namespace, q.ident), value, ex=self.ttl_s or None)
        replies = pipe.execute(raise_on_error=False)
        landed, nbytes = [], 0
        for q, size, reply in zip(batch, sizes, replies):
            if reply is True:
                landed.append(q.ident)
                nbytes += size
        return landed, nbytes

    @staticmethod
    def _remember(memory: OrderedDict, key: bytes, value: Any, bound: int) -> None:
        memory[key] = value
        memory.move_to_end(key)
        while len(memory) > bound:
            memory.popitem(last=False)

    # -- reads --------------------------------------------------------------------------------

    def below(self, ident: bytes) -> bool:
        """Whether the shared tier may continue a match at page ``ident`` (module docstring: "maybe"
        while connected, unless found absent within ABSENT_TTL_S). No I/O."""
        if self.state != "ok":
            return False
        if ident in self._queued:
            return True
        until = self._absent.get(ident)
        return until is None or until < time.monotonic()

    async def promote(self, namespace: bytes, tokens: bytes, lock: Any) -> None:
        """Bring the pages that continue the local match of ``tokens`` in from the shared tier; returns
        when they are in or after ``remote-tier-timeout``. Never raises."""
        if self.state != "ok" or self._nursery is None:
            return
        try:
            name = namespace_name(namespace)
            tokens = packed_tokens(tokens)
            ram, _ = self.store.tier_probe(name, tokens, lambda _ident: False)
        except StoreError:
            return
        P = self.page_bytes
        npages = min(len(tokens) // P, ram + MAX_FETCH_PAGES, ram + max(1, MAX_FETCH_BYTES // self.block_bytes))
        if ram >= npages:
            return
        idents = chain(namespace_ident(name), tokens[: npages * P], P)
        parent = idents[(ram - 1) * IDENT_BYTES : ram * IDENT_BYTES] if ram else namespace_ident(name)
        wanted = [idents[i * IDENT_BYTES : (i + 1) * IDENT_BYTES] for i in range(ram, npages)]
        if not self.below(wanted[0]):
            return
        done = self._inflight.get(wanted[0])
        if done is None:
            if self._read_limiter.borrowed_tokens >= self._read_limiter.total_tokens:
                self.fetches_busy += 1
                return
            done = trio.Event()
            self._inflight[wanted[0]] = done
            self._nursery.start_soon(self._fetch, name, tokens, ram, parent, wanted, lock, done)
        with trio.move_on_after(self.timeout_s) as scope:
            await done.wait()
        if scope.cancelled_caught:
            self.fetches_late += 1

    async def _fetch(self, name: bytes, tokens: bytes, ram: int, parent: bytes, wanted: list[bytes],
                     lock: Any, done: trio.Event) -> None:
        payloads: list = []
        start = time.monotonic()
        try:
            reader = self._reader
            if reader is not None:
                payloads, nbytes, bad = await trio.to_thread.run_sync(
                    self._get, reader, name, parent, wanted, limiter=self._read_limiter, abandon_on_cancel=True)
                self.fetch_bytes += nbytes
                self.verify_failures += bad
                self._failures = 0
        except Exception as exc:
            self._note_error(exc)
        finally:
            self.fetch_seconds += time.monotonic() - start
            self.fetches += 1
            try:
                if len(payloads) < len(wanted):  # the first page not found here: remember it a while
                    self._remember(self._absent, wanted[len(payloads)], time.monotonic() + ABSENT_TTL_S,
                                   ABSENT_MEMORY)
                if payloads:
                    for ident in wanted[: len(payloads)]:  # not written back when evicted here
                        self._remember(self._written, ident, None, WRITTEN_MEMORY)
                    async with lock.write():
                        self.hits += self._insert(name, tokens, ram, payloads)
                else:
                    self.misses += 1
            finally:
                del self._inflight[wanted[0]]
                done.set()

    def _get(self, client: Any, name: bytes, parent: bytes, wanted: list[bytes]) -> tuple[list[memoryview], int, int]:
        """Worker thread: one pipeline of GETs; the verified payloads of the leading run, the bytes
        fetched, and 1 when the run ended at a value that did not verify."""
        pipe = client.pipeline(transaction=False)
        for ident in wanted:
            pipe.get(remote_format.key_of(name, ident))
        values = pipe.execute(raise_on_error=False)
        payloads: list[memoryview] = []
        nbytes = 0
        for ident, value in zip(wanted, values):
            if not isinstance(value, bytes):
                break  # absent (None) or an error for this key's node: the run ends here
            nbytes += len(value)
            payload = remote_format.verify(value, name, ident, parent, self.fingerprint, self.block_bytes)
            if payload is None:
                return payloads, nbytes, 1
            payloads.append(payload)
            parent = ident
        return payloads, nbytes, 0

    def _insert(self, name: bytes, tokens: bytes, ram: int, payloads: list[memoryview]) -> int:
        """On the loop, under the write lock: the fetched pages that still continue the RAM match
        into fresh blocks, committed (plan, copy, commit with no await between). Pages held now."""
        try:
            now, _ = self.store.tier_probe(name, tokens, lambda _ident: False)
        except StoreError:
            return 0
        skip = now - ram  # pages another request brought in or stored meanwhile
        if skip < 0 or skip >= len(payloads):
            return 0
        payloads = payloads[skip:]
        end = now + len(payloads)
        try:
            plan = self.store.begin_insert(name, tokens[: end * self.page_bytes], offset=now * self.page_size,
                                           promotion=True)
        except StoreError:  # no room (noeviction, quota, partition): the pages stay a miss
            return 0
        if plan.start != now or len(plan.new_blocks) != len(payloads):  # cannot happen: same loop step
            self.store.abort_insert(plan)
            return 0
        try:
            for block, payload in zip(plan.new_blocks, payloads):
                self.arena.write([block], payload)
        except BaseException:
            self.store.abort_insert(plan)
            raise
        self.store.commit_insert(plan)
        return len(payloads)

    # -- forgetting (local only) ---------------------------------------------------------------

    def _drop_queued(self, keep: Any) -> None:
        kept = deque(q for q in self._queue if keep(q))
        for q in self._queue:
            if not keep(q):
                self._queued.pop(q.ident, None)
                self._queue_bytes -= len(q.data)
        self._queue = kept

    def flush(self) -> int:
        """FLUSHALL/FLUSHDB: this daemon's queued writes and memories go; the fleet's pages stay."""
        dropped = len(self._queue)
        self._drop_queued(lambda q: False)
        self._absent.clear()
        self._written.clear()
        return dropped

    def drop_namespace(self, namespace: bytes) -> int:
        """PFXEVICT ALL, DEL, an expiry: the namespace's queued writes go (local only)."""
        before = len(self._queue)
        self._drop_queued(lambda q: q.namespace != namespace)
        return before - len(self._queue)

    def drop_prefix(self, namespace: bytes, tokens: bytes) -> int:
        """PFXEVICT TOKENS: the namespace's queued writes go (local only)."""
        return self.drop_namespace(namespace)

    async def drop_shared(self, namespace: bytes) -> int:
        """The explicit operation: every key of ``namespace`` removed from the shared tier."""
        self.drop_namespace(namespace)
        if self._writer is None:
            raise RuntimeError(f"the shared tier is {self.state}")
        return await trio.to_thread.run_sync(drop_namespace_keys, self._writer, namespace)

    # -- figures ------------------------------------------------------------------------------

    def _nodes(self) -> list[tuple[str, str]]:
        client = self._reader
        if client is None or not hasattr(client, "get_nodes"):
            return [(f"{h}:{p}", "primary") for h, p in self.target.nodes] if client is not None else []
        return [(f"{n.host}:{n.port}", n.server_type or "unknown") for n in list(client.get_nodes())]

    def _node_text(self) -> str:
        nodes = self._nodes()
        primaries = sum(1 for _, role in nodes if role == "primary")
        return f"{len(nodes)} nodes, {primaries} primaries"

    def info(self) -> list[tuple[str, object]]:
        """INFO's ``# tiers`` fields of the shared tier."""
        fields: list[tuple[str, object]] = [
            ("tier_remote_enabled", 1),
            ("tier_remote_state", self.state),
            ("tier_remote_url", str(self.target).replace(",", ";")),  # INFO parsers split values on ","
            ("tier_remote_write", self.write_mode),
            ("tier_remote_timeout_ms", int(self.timeout_s * 1000)),
            ("tier_remote_hits", self.hits),
            ("tier_remote_misses", self.misses),
            ("tier_remote_fetches", self.fetches),
            ("tier_remote_fetches_late", self.fetches_late),
            ("tier_remote_fetches_busy", self.fetches_busy),
            ("tier_remote_fetch_bytes", self.fetch_bytes),
            ("tier_remote_fetch_latency_avg_us", int(self.fetch_seconds * 1e6 / self.fetches) if self.fetches else 0),
            ("tier_remote_verify_failures", self.verify_failures),
            ("tier_remote_writes", self.writes),
            ("tier_remote_write_bytes", self.write_bytes),
            ("tier_remote_write_latency_avg_us",
             int(self.write_seconds * 1e6 / self.write_batches) if self.write_batches else 0),
            ("tier_remote_queue_pages", len(self._queue)),
            ("tier_remote_queue_bytes", self._queue_bytes),
            ("tier_remote_drops", self.drops),
            ("tier_remote_errors", self.errors),
            ("tier_remote_reconnects", self.reconnects),
        ]
        nodes = self._nodes()
        fields.append(("tier_remote_nodes", len(nodes)))
        fields += [(f"tier_remote_node{i}", f"addr={addr},role={role},state={self.state}")
                   for i, (addr, role) in enumerate(nodes)]
        return fields

    def describe(self, namespace: bytes | None = None) -> dict:
        """PFXINFO's ``tiers`` map entry of the shared tier."""
        fields = {name.removeprefix("tier_remote_").replace("_", "-"): value for name, value in self.info()
                  if name != "tier_remote_enabled" and not name.startswith("tier_remote_node")}
        return {"remote": fields}

    def check(self) -> list[str]:
        """PFXCHECK: the queue's accounting."""
        problems = []
        if self._queue_bytes != sum(len(q.data) for q in self._queue):
            problems.append(f"shared tier: queue bytes {self._queue_bytes} do not add up")
        if len(self._queued) != len(self._queue):
            problems.append(f"shared tier: {len(self._queued)} queued idents for {len(self._queue)} pages")
        return problems
