"""An inference engine's link to the daemon: ``EngineLink``, the connection the SGLang and LMCache tiers share.

Rules:

* **One connection, connected lazily.** :meth:`EngineLink.connect` returns the live
  :class:`~pfxcache.client.PrefixCache`, or connects when there is none and the retry delay has passed;
  None while the daemon is away. Leases belong to the connection, so what an engine's tier keeps about
  them goes with it: ``on_drop`` runs after every close.
* **Geometry first.** A daemon whose ``page-size`` is under 4 cannot hold page keys (a key page holds a
  128-bit digest), and one whose ``block-bytes`` the engine's ``check_block_bytes`` refuses cannot hold
  its pages: either is logged and served without, and tried again after ``retry_seconds``.
* **The arena when it can be had.** Transfer ``"resp"`` never maps it; ``"auto"`` maps a shared-memory
  arena when the daemon is on this host and moves bytes over RESP otherwise (logged once); ``"arena"``
  refuses a daemon whose arena it cannot map.
* **Failures never reach the engine.** A lost or hung daemon drops the connection and is retried after
  ``retry_seconds``; a refusal, a full arena or a bug costs the one call. Each cause is logged once
  (:meth:`EngineLink.warn`), and a connection made after a loss is logged with a reconnect counted.

Theory of operation: the engine's tier makes one link and runs each command through
:meth:`~EngineLink.guard`: it connects when needed (under :attr:`EngineLink.lock`, reentrant, which a tier
may hold around the whole command or only around the connection), runs the command on the cache, and
hands whatever it raises to :meth:`~EngineLink.absorb`, which tells a lost connection from a refused
command. ``stats`` counts ``errors`` and ``reconnects`` in the tier's
own dict.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from .cache import PrefixCache
from .errors import AttachError, CacheFullError, PrefixCacheError

TRANSFERS = ("auto", "arena", "resp")
#: What a lost or hung daemon raises (anything else is the command's own failure).
FAILURES = (redis.ConnectionError, redis.TimeoutError, OSError)


class EngineLink:
    """The connection of one engine's tier to a pfxcache daemon (see the module docstring).

    ``check_block_bytes(block_bytes)`` says what is wrong with the daemon's pages for the tier (None:
    nothing). ``engine`` and ``unit`` name the engine and what it stores (``"SGLang"``, ``"pages"``) and
    ``role`` what plugs it in (``"backend"``), for the log; ``connect_options`` go to
    ``PrefixCache.from_url``.
    """

    def __init__(self, url: str, transfer: str, check_block_bytes: Callable[[int], str | None], *,
                 logger: logging.Logger, engine: str, role: str, unit: str, retry_seconds: float = 5.0,
                 timeout_seconds: float = 5.0, stats: dict[str, int] | None = None,
                 on_drop: Callable[[], None] | None = None, **connect_options: Any) -> None:
        if transfer not in TRANSFERS:
            raise ValueError(f"pfxcache_transfer must be auto, arena or resp, not {transfer!r}")
        self.url = url
        self.transfer = transfer
        self.retry_seconds = retry_seconds
        self.timeout_seconds = timeout_seconds
        self.stats = stats if stats is not None else {}
        self.stats.setdefault("errors", 0)
        self.stats.setdefault("reconnects", 0)
        self.lock = threading.RLock()  # the connection (and whatever the tier keeps of it)
        self.cache: PrefixCache | None = None
        self.info: Any = None  # the daemon's PFXINFO, from the last connection made
        self.log = logger
        self._engine, self._role, self._unit = engine, role, unit
        self._check_block_bytes = check_block_bytes
        self._on_drop = on_drop
        self._connect_options = connect_options
        self._retry_at = 0.0
        self._seen: set[str] = set()  # causes already logged

    def warn(self, cause: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        """Log ``message`` the first time ``cause`` happens, never again."""
        if cause not in self._seen:
            self._seen.add(cause)
            self.log.log(level, message, *args)

    def connect(self) -> PrefixCache | None:
        """The cache, connecting first when there is none and the retry delay has passed; None: no daemon."""
        with self.lock:
            if self.cache is not None or time.monotonic() < self._retry_at:
                return self.cache
            cache = None
            try:
                cache = PrefixCache.from_url(self.url, attach=False if self.transfer == "resp" else None,
                                             socket_timeout=self.timeout_seconds,
                                             socket_connect_timeout=self.timeout_seconds, **self._connect_options)
                info = cache.info()
                problem = self.geometry_problem(info.page_size) or self._check_block_bytes(info.block_bytes)
                if problem is not None:
                    cache.close()
                    self._retry_at = time.monotonic() + self.retry_seconds
                    self.warn(f"geometry:{info.page_size}:{info.block_bytes}", "%s; serving without it", problem,
                              level=logging.ERROR)
                    return None
                if self.transfer != "resp":
                    self._attach(cache)
            except FAILURES as exc:
                if cache is not None:
                    cache.close()
                self.lost(exc)
                return None
            except (PrefixCacheError, AttachError) as exc:
                if cache is not None:
                    cache.close()
                self._retry_at = time.monotonic() + self.retry_seconds
                self.warn(f"connect:{exc}", "pfxcache at %s refused the %s (%s: %s): serving without it",
                          self.url, self._role, type(exc).__name__, exc, level=logging.ERROR)
                return None
            self.cache, self.info = cache, info
            if "down" in self._seen:
                self._seen.discard("down")
                self.stats["reconnects"] += 1
                self.log.warning("pfxcache: connected again to %s", self.url)
            return cache

    def geometry_problem(self, page_size: int) -> str | None:
        """What is wrong with a daemon of this page-size for page keys (None: nothing)."""
        if page_size < 4:
            return (f"pfxcache at {self.url} has page-size {page_size}: page keys need --page-size 4 or more "
                    "(a key page holds a 128-bit digest)")
        return None

    def _attach(self, cache: PrefixCache) -> None:
        """Map the daemon's shared-memory arena; over RESP when it cannot be (AttachError with "arena")."""
        try:
            arena = cache.attach()
            if getattr(arena, "backend", None) != "shm":
                raise AttachError(f"its arena is {arena.backend}, and {self._engine}'s {self._unit} are in "
                                  "host memory")
        except AttachError as exc:
            if self.transfer == "arena":
                raise
            self.warn(f"attach:{exc}", "pfxcache: moving %s over RESP: %s", self._unit, exc, level=logging.INFO)

    def drop(self) -> None:
        """Close the connection (its leases end with it), then let the tier forget what it kept of them."""
        with self.lock:
            cache, self.cache = self.cache, None
            if cache is not None:
                try:
                    cache.close()
                except Exception:
                    pass
            if self._on_drop is not None:
                self._on_drop()  # after the close: a closed cache's dropped Matches send nothing

    def lost(self, exc: BaseException) -> None:
        """The daemon is gone or hung: drop the connection, retry after the delay."""
        with self.lock:
            self.stats["errors"] += 1
            self.warn("down", "pfxcache at %s is unreachable (%s: %s): %s goes on without it, retrying every %.0f s",
                      self.url, type(exc).__name__, exc, self._engine, self.retry_seconds)
            self.drop()
            self._retry_at = time.monotonic() + self.retry_seconds

    def guard(self, what: str, miss: Any, fn: Callable[[PrefixCache], Any], *, hold_lock: bool = False) -> Any:
        """``fn(cache)``, or ``miss`` when there is no daemon or anything fails (see :meth:`absorb`);
        ``hold_lock``: under :attr:`lock` throughout, else only while connecting."""
        with self.lock if hold_lock else contextlib.nullcontext():
            cache = self.connect()
            if cache is None:
                return miss
            try:
                return fn(cache)
            except Exception as exc:  # never into the engine: failures are misses
                self.absorb(what, exc, cache)
            return miss

    def absorb(self, what: str, exc: Exception, cache: PrefixCache) -> None:
        """Take in what ``what`` raised on ``cache``: a lost connection is dropped (unless another has
        replaced it meanwhile), anything else costs this one call; each cause logged once."""
        if isinstance(exc, FAILURES):
            with self.lock:
                if self.cache is cache:
                    self.lost(exc)
        elif isinstance(exc, CacheFullError):
            self.warn(f"{what}:oom", "pfxcache: %s skipped: the daemon's arena is full of pinned pages", what)
        elif isinstance(exc, PrefixCacheError):
            self.stats["errors"] += 1
            self.warn(f"{what}:{exc}", "pfxcache: %s refused: %s (logged once)", what, exc)
        else:  # never into the engine: a bug here must cost misses, not requests
            self.stats["errors"] += 1
            self.warn(f"{what}:bug:{type(exc).__name__}", "pfxcache: %s failed (%s: %s)", what,
                      type(exc).__name__, exc, level=logging.ERROR)

    def close(self) -> None:
        """Close the connection for good (the daemon ends its leases)."""
        with self.lock:
            self.drop()
            self._retry_at = math.inf
