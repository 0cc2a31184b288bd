"""The shared tier's writes: a bounded queue of page copies and the task that sends it to the cluster.

Rules:

* **PFXSET never waits.** The store's listeners copy the pages on the loop into the queue
  (``remote-tier-queue`` bytes; beyond it, or while the tier is not connected, pages are dropped
  and counted); :meth:`WriteQueue.run` sends them in batches of ``BATCH_PAGES`` (one pipeline of
  ``SET``, ``EX remote-tier-ttl`` when not 0) from a worker thread. Pages written recently are
  remembered (``WRITTEN_MEMORY`` idents) and not sent again when they are evicted.
* **Idents.** A token page's key is its chained ident (store/idents.py); a key page's (HASHES) is
  :func:`~pfxcache.daemon.store.idents.key_page_ident`, with the namespace's seed as parent and the header's
  ``KEY_PAGE`` flag, so that a run of key pages is found from any of its keys.
* **Writing the queue out on demand** (``PFXTIER FLUSH``, :meth:`WriteQueue.drain`): the caller
  waits until the queue is empty and no batch is in flight, or its deadline; the reply says what
  was written, dropped, and is still queued.
* **At shutdown** (:meth:`WriteQueue.flush_at_shutdown`, from the tier's ``close``, after the
  clients drained): what the queue holds, with the batch the cancelled task was sending, is sent
  by one worker thread for at most ``remote-tier-shutdown-flush`` ms; what did not land by then
  is dropped and counted, and the log says both figures. A kill -9 loses the queue: the tier is a
  cache, and the pages are still in the other daemons' RAM or in no one's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from typing import Any

import trio

from pfxcache.daemon.service.remote_nodes import node_of
from pfxcache.daemon.store.idents import IDENT_BYTES, ident_before, key_page_ident, namespace_ident, node_idents
from pfxcache.daemon.tier import remote_format

log = logging.getLogger("pfxcached")

BATCH_PAGES = 64
WRITTEN_MEMORY = 65536
#: How often PFXTIER FLUSH looks whether the queue is out.
DRAIN_POLL_S = 0.005


class _Pending:
    """A page waiting for the writer: its identity and a copy of its bytes."""

    __slots__ = ("data", "flags", "ident", "namespace", "parent")

    def __init__(self, namespace: bytes, parent: bytes, ident: bytes, data: memoryview, flags: int) -> None:
        self.namespace = namespace
        self.parent = parent
        self.ident = ident
        self.data = data
        self.flags = flags


def remember(memory: OrderedDict, key: bytes, value: Any, bound: int) -> None:
    """``key`` into a bounded LRU memory (the oldest goes first)."""
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > bound:
        memory.popitem(last=False)


class WriteQueue:
    """The queue and writer of one shared tier (module docstring). ``tier`` is the
    RemoteTierService: its ``state``, ``writer``, ``up`` event, ``note_error``, ``note_success``
    and ``nodes``."""

    def __init__(self, tier: Any, config: Any, *, ttl_s: int, fingerprint: bytes) -> None:
        self.tier = tier
        self.config = config
        self.arena = tier.arena
        self.block_bytes = tier.arena.block_bytes
        self.ttl_s = ttl_s
        self.fingerprint = fingerprint
        self.pages: deque[_Pending] = deque()
        self.queued: dict[bytes, _Pending] = {}
        self.nbytes = 0
        self.sending = 0  # pages of the batch in flight (still in ``queued``)
        self.written: OrderedDict[bytes, None] = OrderedDict()
        self._wake: trio.Event | None = None
        self.writes = self.write_bytes = self.write_batches = 0
        self.write_seconds = 0.0
        self.drops = 0

    # -- filling (store listeners, on the loop) --------------------------------------------------

    def enqueue(self, namespace: bytes, node: Any, lo: int, hi: int) -> None:
        """Copy pages ``lo`` to ``hi`` of radix ``node`` into the queue, or drop them (counted)."""
        if self.tier.state != "ok":
            self.drops += hi - lo
            return
        pages = [p for p in self._idents(namespace, node, lo, hi)
                 if p[2] not in self.queued and p[2] not in self.written]
        if not pages:
            return
        need = len(pages) * self.block_bytes
        if self.nbytes + need > self.config["remote-tier-queue"]:  # CONFIG SET may change it
            self.drops += len(pages)
            return
        data = memoryview(self.arena.read([node.blocks[page] for page, _, _, _ in pages]))
        bb = self.block_bytes
        for i, (_, parent, ident, flags) in enumerate(pages):
            entry = _Pending(namespace, parent, ident, data[i * bb : (i + 1) * bb], flags)
            self.pages.append(entry)
            self.queued[ident] = entry
        self.nbytes += need
        if self._wake is not None:
            self._wake.set()

    @staticmethod
    def _idents(namespace: bytes, node: Any, lo: int, hi: int) -> list[tuple[int, bytes, bytes, int]]:
        """(page, parent ident, ident, flags) of pages ``lo`` to ``hi`` of ``node`` in the shared tier."""
        if node.tree.keys is not None:  # key pages: each its own start (module docstring)
            seed = namespace_ident(namespace)
            P = node.tree.page_bytes
            return [(page, seed, key_page_ident(namespace, node.key[page * P : (page + 1) * P]),
                     remote_format.KEY_PAGE) for page in range(lo, hi)]
        idents = node_idents(node)
        parent = ident_before(node, lo)
        out = []
        for page in range(lo, hi):
            ident = idents[page * IDENT_BYTES : (page + 1) * IDENT_BYTES]
            out.append((page, parent, ident, 0))
            parent = ident
        return out

    # -- sending -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Send what the queue receives, batch by batch, while the tier is connected; until cancelled.
        A batch in flight when cancelled goes back to the queue's head (the shutdown flush sends it)."""
        while True:
            if not self.pages:
                self._wake = trio.Event()
                await self._wake.wait()
            await self.tier.up.wait()
            batch = [self.pages.popleft() for _ in range(min(BATCH_PAGES, len(self.pages)))]
            writer, landed, nbytes, blamed = self.tier.writer, [], 0, []
            self.sending = len(batch)
            start = time.monotonic()
            try:
                if writer is not None:
                    landed, nbytes, blamed = await trio.to_thread.run_sync(self._send, writer, batch,
                                                                           abandon_on_cancel=True)
            except trio.Cancelled:
                self.pages.extendleft(reversed(batch))
                batch = []
                raise
            except Exception as exc:
                self.tier.note_error(exc)
            finally:
                self.sending = 0
                self.write_seconds += time.monotonic() - start
                self.write_batches += 1
                self._settle(batch, landed, nbytes)
            self.tier.nodes.blame(blamed)
            if landed:
                self.tier.note_success()

    def _settle(self, batch: list[_Pending], landed: list[bytes], nbytes: int) -> None:
        """A batch is done: what landed is written (and remembered), the rest dropped."""
        self.writes += len(landed)
        self.write_bytes += nbytes
        for ident in landed:
            remember(self.written, ident, None, WRITTEN_MEMORY)
        for q in batch:
            if self.queued.get(q.ident) is q:
                del self.queued[q.ident]
            self.nbytes -= len(q.data)
        self.drops += len(batch) - len(landed)

    def _send(self, client: Any, batch: list[_Pending]) -> tuple[list[bytes], int, list[str]]:
        """Worker thread: encode and SET a batch in one pipeline; the idents that landed, their
        bytes, and the nodes of the keys that failed."""
        pipe = client.pipeline(transaction=False)
        sizes, keys = [], []
        for q in batch:
            value = remote_format.encode(q.namespace, q.ident, q.parent, self.fingerprint, q.data, flags=q.flags)
            sizes.append(len(value))
            keys.append(remote_format.key_of(q.namespace, q.ident))
            pipe.set(keys[-1], value, ex=self.ttl_s or None)
        replies = pipe.execute(raise_on_error=False)
        landed, nbytes, blamed = [], 0, []
        for q, key, size, reply in zip(batch, keys, sizes, replies):
            if reply is True:
                landed.append(q.ident)
                nbytes += size
            elif isinstance(reply, Exception):
                addr = node_of(client, key)
                if addr is not None:
                    blamed.append(addr)
        return landed, nbytes, blamed

    # -- writing it out now ----------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> dict:
        """PFXTIER FLUSH: wait until the queue is out (or ``timeout_s``); what happened meanwhile."""
        writes, drops = self.writes, self.drops
        with trio.move_on_after(timeout_s):
            while self.pages or self.sending:
                await trio.sleep(DRAIN_POLL_S)
        return {"written": self.writes - writes, "dropped": self.drops - drops,
                "queued": len(self.pages) + self.sending}

    def flush_at_shutdown(self, writer: Any, deadline_s: float) -> tuple[int, int]:
        """Send what the queue holds for at most ``deadline_s`` (blocking; module docstring).
        Returns (pages written, pages dropped); the queue is empty afterwards."""
        pending = list(self.pages)
        self.pages.clear()
        self.queued.clear()
        self.nbytes = 0
        if not pending:
            return 0, 0
        done = [0, 0]  # pages written, their bytes: read at the deadline, a lower bound after it

        def send_all() -> None:
            for start in range(0, len(pending), BATCH_PAGES):
                try:
                    landed, nbytes, _ = self._send(writer, pending[start : start + BATCH_PAGES])
                except Exception as exc:  # the cluster went away: what is left is dropped
                    log.warning("Shared tier: the shutdown flush stopped: %s",
                                self.tier.target.scrub(f"{type(exc).__name__}: {exc}"))
                    return
                done[0] += len(landed)
                done[1] += nbytes

        if writer is not None and deadline_s > 0:
            sender = threading.Thread(target=send_all, name="pfxcached-remote-flush", daemon=True)
            sender.start()
            sender.join(deadline_s)
        written = done[0]
        self.writes += written
        self.write_bytes += done[1]
        self.drops += len(pending) - written
        return written, len(pending) - written

    # -- forgetting (local only) ---------------------------------------------------------------

    def drop_queued(self, keep: Any) -> int:
        """Drop the queued pages ``keep`` rejects (FLUSHALL, PFXEVICT, DEL); how many went."""
        before = len(self.pages)
        kept = deque(q for q in self.pages if keep(q))
        for q in self.pages:
            if not keep(q):
                self.queued.pop(q.ident, None)
                self.nbytes -= len(q.data)
        self.pages = kept
        return before - len(kept)

    def check(self) -> list[str]:
        """PFXCHECK: the queue's accounting."""
        problems = []
        if self.nbytes != sum(len(q.data) for q in self.queued.values()):
            problems.append(f"shared tier: queue bytes {self.nbytes} do not add up")
        if len(self.queued) != len(self.pages) + self.sending:
            problems.append(f"shared tier: {len(self.queued)} queued idents for {len(self.pages)} pages "
                            f"and {self.sending} in flight")
        return problems
