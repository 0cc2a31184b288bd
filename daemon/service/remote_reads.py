"""The shared tier's reads: the pages that continue a PFXGET's local match, fetched, verified and
committed into fresh arena blocks before the request answers.

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
* **Key pages** (HASHES) are each their own start in the shared tier (tier/remote_format.py), so a
  run of them is found from any of its keys. A reader that does not know a namespace's kind yet
  (it holds nothing here) asks for the chained idents, whose first is also the key page's; when
  that value says it is a key page, the rest of the run is asked for by key page idents in the
  same worker thread, and the namespace becomes a key namespace here as a HASHES PFXSET makes it.
  A run of key pages that starts below the root of this daemon's tree is served from RAM alone.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import trio

from pfxcache.daemon.service.remote_nodes import node_of
from pfxcache.daemon.service.remote_writes import WRITTEN_MEMORY, remember
from pfxcache.daemon.store.arguments import namespace_name, packed_tokens
from pfxcache.daemon.store.errors import StoreError
from pfxcache.daemon.store.idents import IDENT_BYTES, chain, key_page_ident, namespace_ident
from pfxcache.daemon.tier import remote_format

MAX_FETCH_PAGES = 256
MAX_FETCH_BYTES = 64 << 20
READ_THREADS = 4
ABSENT_TTL_S = 1.0
ABSENT_MEMORY = 65536


class _Fetched:
    """What one fetch brought: the verified leading run, under which idents, and what it cost."""

    __slots__ = ("blamed", "bad", "idents", "keyed", "nbytes", "payloads")

    def __init__(self, idents: list[bytes], keyed: bool | None) -> None:
        self.idents = idents  # the idents asked for (key page idents once the run said it is one)
        self.keyed = keyed
        self.payloads: list[memoryview] = []
        self.nbytes = 0
        self.bad = 0  # 1 when the run ended at a value that did not verify
        self.blamed: list[str] = []


class ReadPath:
    """The reads of one shared tier (module docstring). ``tier`` is the RemoteTierService: its
    ``state``, ``reader``, ``nursery``, ``queue`` (what is queued and was written), ``nodes``,
    ``note_error`` and ``note_success``."""

    def __init__(self, tier: Any) -> None:
        self.tier = tier
        self.store = tier.store
        self.arena = tier.arena
        self.block_bytes = tier.arena.block_bytes
        self.page_bytes = tier.store.page_bytes
        self.page_size = tier.store.page_size
        self.fingerprint = tier.fingerprint
        self.timeout_s = tier.timeout_s
        self._absent: OrderedDict[bytes, float] = OrderedDict()
        self._inflight: dict[bytes, trio.Event] = {}
        self._read_limiter = trio.CapacityLimiter(READ_THREADS)
        self.hits = 0  # pages brought in
        self.misses = 0  # fetches that brought no page
        self.fetches = self.fetches_late = self.fetches_busy = 0
        self.fetch_bytes = 0
        self.fetch_seconds = 0.0
        self.verify_failures = 0

    def forget(self) -> None:
        """FLUSHALL: what was found absent is asked again."""
        self._absent.clear()

    def below(self, ident: bytes) -> bool:
        """Whether the shared tier may continue a match at page ``ident`` (module docstring: "maybe"
        while connected, unless found absent within ABSENT_TTL_S). No I/O."""
        if self.tier.state != "ok":
            return False
        if ident in self.tier.queue.queued:
            return True
        until = self._absent.get(ident)
        return until is None or until < time.monotonic()

    def _keyed(self, name: bytes, ram: int) -> bool | None:
        """Whether ``name`` holds key pages here: True, False, or None when it holds nothing to say."""
        if self.store.holds_keys(name):
            return True
        return False if ram else None

    async def promote(self, namespace: bytes, tokens: bytes, lock: Any) -> None:
        """Bring the pages that continue the local match of ``tokens`` in from the shared tier; returns
        when they are in or after ``remote-tier-timeout``. Never raises."""
        if self.tier.state != "ok" or self.tier.nursery is None:
            return
        try:
            name = namespace_name(namespace)
            tokens = packed_tokens(tokens)
            asked = [True]  # tier_probe asks about the page after RAM once; (0, []) then means a key
            ram, first = self.store.tier_probe(name, tokens, lambda _ident: bool(asked and asked.pop()))
        except StoreError:
            return
        P = self.page_bytes
        npages = min(len(tokens) // P, ram + MAX_FETCH_PAGES, ram + max(1, MAX_FETCH_BYTES // self.block_bytes))
        if ram >= npages or not first:  # all in RAM, or a run of key pages held below the root
            return
        keyed = self._keyed(name, ram)
        if keyed:
            parent = namespace_ident(name)
            wanted = [key_page_ident(name, tokens[i * P : (i + 1) * P]) for i in range(ram, npages)]
        else:
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
            self.tier.nursery.start_soon(self._fetch, name, tokens, ram, parent, wanted, keyed, lock, done)
        with trio.move_on_after(self.timeout_s) as scope:
            await done.wait()
        if scope.cancelled_caught:
            self.fetches_late += 1

    async def _fetch(self, name: bytes, tokens: bytes, ram: int, parent: bytes, wanted: list[bytes],
                     keyed: bool | None, lock: Any, done: trio.Event) -> None:
        got = _Fetched(wanted, keyed)
        start = time.monotonic()
        try:
            reader = self.tier.reader
            if reader is not None:
                got = await trio.to_thread.run_sync(self._get, reader, name, tokens[ram * self.page_bytes :],
                                                    parent, wanted, keyed, limiter=self._read_limiter,
                                                    abandon_on_cancel=True)
                self.fetch_bytes += got.nbytes
                self.verify_failures += got.bad
                self.tier.nodes.blame(got.blamed)
                self.tier.note_success()
        except Exception as exc:
            self.tier.note_error(exc)
        finally:
            self.fetch_seconds += time.monotonic() - start
            self.fetches += 1
            try:
                payloads, idents = got.payloads, got.idents
                if len(payloads) < len(idents):  # the first page not found here: remember it a while
                    remember(self._absent, idents[len(payloads)], time.monotonic() + ABSENT_TTL_S, ABSENT_MEMORY)
                if payloads:
                    for ident in idents[: len(payloads)]:  # not written back when evicted here
                        remember(self.tier.queue.written, ident, None, WRITTEN_MEMORY)
                    async with lock.write():
                        self.hits += self._insert(name, tokens, ram, payloads, bool(got.keyed))
                else:
                    self.misses += 1
            finally:
                del self._inflight[wanted[0]]
                done.set()

    def _get(self, client: Any, name: bytes, pages: bytes, parent: bytes, wanted: list[bytes],
             keyed: bool | None) -> _Fetched:
        """Worker thread: one pipeline of GETs and the verified leading run (module docstring: a
        namespace of unknown kind whose first value is a key page asks again by key page idents)."""
        got = _Fetched(wanted, keyed)
        values = self._get_values(client, name, wanted, got)
        if keyed is None and values and isinstance(values[0], bytes) and len(wanted) > 1:
            first = remote_format.verify(values[0], name, wanted[0], parent, self.fingerprint, self.block_bytes)
            if first is not None and remote_format.is_key_page(values[0]):
                P = self.page_bytes
                got.idents = wanted = [wanted[0]] + [key_page_ident(name, pages[i * P : (i + 1) * P])
                                                     for i in range(1, len(wanted))]
                values = [values[0]] + self._get_values(client, name, wanted[1:], got)
        for ident, value in zip(wanted, values):
            if not isinstance(value, bytes):
                break  # absent (None) or an error for this key's node: the run ends here
            got.nbytes += len(value)
            payload = remote_format.verify(value, name, ident, parent, self.fingerprint, self.block_bytes)
            if payload is not None:
                kind = remote_format.is_key_page(value)
                if got.keyed is None:
                    got.keyed = kind
                elif kind != got.keyed:
                    payload = None  # the other kind of page than this namespace holds
            if payload is None:
                got.bad = 1
                break
            got.payloads.append(payload)
            parent = namespace_ident(name) if got.keyed else ident
        return got

    @staticmethod
    def _get_values(client: Any, name: bytes, idents: list[bytes], got: _Fetched) -> list:
        pipe = client.pipeline(transaction=False)
        keys = [remote_format.key_of(name, ident) for ident in idents]
        for key in keys:
            pipe.get(key)
        values = pipe.execute(raise_on_error=False)
        for key, value in zip(keys, values):
            if isinstance(value, Exception):
                addr = node_of(client, key)
                if addr is not None:
                    got.blamed.append(addr)
        return values

    def _insert(self, name: bytes, tokens: bytes, ram: int, payloads: list[memoryview], keyed: bool) -> int:
        """On the loop, under the write lock: the fetched pages that still continue the RAM match
        into fresh blocks, committed (plan, copy, commit with no await between). Pages held now.
        Key pages make the namespace a key namespace, as a HASHES PFXSET does."""
        try:
            if keyed:
                self.store.use_keys(name, True, writing=True)
            now, _ = self.store.tier_probe(name, tokens, lambda _ident: False)
        except StoreError:  # a namespace of token pages here: key pages are not for it
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
