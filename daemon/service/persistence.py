"""Redis's persistence surface over the store's snapshots: SAVE, BGSAVE, LASTSAVE, the ``save``
schedule, the save on shutdown, the load at startup, the lock on the directory, INFO persistence.

Rules, with Redis's meanings:

* A save makes durable every page cached when it starts, and the trees (store/snapshot.py).
  SAVE writes on the event loop, so no client is served meanwhile, as Redis's SAVE blocks.
  BGSAVE captures the trees and pins their pages on the event loop (O(edges)), then writes from
  a worker thread: clients are served throughout, evictions skip the pinned pages, and the pins
  go when the file is renamed into place (or the write failed).
* ``rdb_changes_since_last_save`` counts pages stored and pages evicted since the start of the
  last successful save (what a new save would change); the ``save`` schedule starts a BGSAVE
  when, for one of its pairs, that many changes happened and that many seconds passed since the
  last successful save; after a failed one it waits 5 seconds before trying again, as Redis does.
* Shutdown (SHUTDOWN, SIGTERM, SIGINT) saves when the schedule is not empty, SHUTDOWN SAVE
  always, SHUTDOWN NOSAVE never.
* The file is locked (``flock`` on ``<dbfilename>.lock``) by a daemon that will write it: one
  with a ``save`` schedule, from its start, and any other from its first SAVE or BGSAVE on. A
  second daemon with a schedule on the same file refuses to start, any other refuses to save.
  Reading the file at startup takes no lock: the rename makes every read see one whole file.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from typing import Any

import trio

from pfxcache.daemon.store import snapshot

log = logging.getLogger("pfxcached")

#: Seconds after a failed background save before the schedule tries again (Redis's CONFIG_BGSAVE_RETRY_DELAY).
RETRY_DELAY = 5


class PersistenceError(Exception):
    """A save that could not be made; the message is for the client and the log."""


class Persistence:
    """The daemon's snapshots; one per server, used from the event loop."""

    def __init__(self, config: Any, prefix: Any) -> None:
        self.config = config
        self.prefix = prefix
        self.store = prefix.store
        self.loading = 0
        self.last_save_time = int(time.time())
        self.last_bgsave_ok = True
        self.last_bgsave_time_sec = -1
        self.bgsave_started: float | None = None
        self.last_try = 0.0
        self.saves = 0
        self.keys_loaded = 0
        self.load_report: snapshot.LoadReport | None = None
        self.load_failures = 0  # pages dropped or records failed while loading
        self._baseline = self._changes_counter()
        self._lock_fd: int | None = None
        self._abort = False

    # -- paths and the lock -----------------------------------------------------------------

    @property
    def directory(self) -> str:
        return self.config["dir"]

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self.config["dbfilename"])

    def lock(self) -> None:
        """Take the directory's lock (idempotent); PersistenceError when another process holds it."""
        if self._lock_fd is not None:
            return
        lock_path = self.path + ".lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise PersistenceError(f"can't open the lock file {lock_path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise PersistenceError(f"{self.path} is in use by another pfxcached (the lock {lock_path} "
                                       f"is held): give each daemon its own dir or dbfilename") from None
            raise PersistenceError(f"can't lock {lock_path}: {exc.strerror}") from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def close(self) -> None:
        """Let go of the lock (the lock file stays: removing it would race a starting daemon)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- startup ------------------------------------------------------------------------------

    def open(self) -> None:
        """At startup, before clients: lock the directory when persistence is in use there and load
        the snapshot. A bad file is logged and counted, never fatal; a held lock is
        (PersistenceError)."""
        if os.sep in self.config["dbfilename"]:
            raise PersistenceError("dbfilename can't be a path, just a filename")
        if self.config["save"]:
            self.lock()  # it will write here: a second daemon that would too refuses to start
        elif not os.path.exists(self.path):
            return
        self.loading = 1
        started = time.monotonic()
        try:
            report = snapshot.load_file(self.store, self.path)
        finally:
            self.loading = 0
        self.load_report = report
        self.keys_loaded = len(self.store.namespaces())
        self.load_failures = report.pages_dropped + report.records_failed
        if report.status == "missing":
            return
        took = time.monotonic() - started
        if report.status == "ok":
            log.info("DB loaded from disk: %.3f seconds, %d pages in %d namespaces", took,
                     report.pages_loaded, report.namespaces)
        else:
            log.warning("Snapshot %s is %s (%s): loaded %d verified pages, dropped %d, %d records failed "
                        "verification", self.path, report.status, report.detail, report.pages_loaded,
                        report.pages_dropped, report.records_failed)
        self._baseline = self._changes_counter()

    # -- saving -------------------------------------------------------------------------------

    def _changes_counter(self) -> int:
        return self.store.stored + self.store.evictions

    @property
    def changes(self) -> int:
        return self._changes_counter() - self._baseline

    @property
    def bgsave_in_progress(self) -> bool:
        return self.bgsave_started is not None

    def save(self) -> None:
        """SAVE: write a snapshot now, on this thread. PersistenceError when it fails."""
        if self.bgsave_in_progress:
            raise PersistenceError("ERR Background save already in progress")
        try:
            self.lock()
        except PersistenceError as exc:
            log.warning("Failed saving the DB: %s", exc)
            raise PersistenceError("ERR") from exc
        mark = self._changes_counter()
        cap = snapshot.capture(self.store)
        try:
            snapshot.write_file(cap, self.prefix.arena, self.store.page_size, self.directory,
                                self.config["dbfilename"])
        except OSError as exc:
            log.warning("Failed saving the DB: %s", exc.strerror or exc)
            raise PersistenceError("ERR") from exc
        finally:
            cap.release()
        self._saved(mark)
        log.info("DB saved on disk")

    def _saved(self, mark: int) -> None:
        self._baseline = mark
        self.last_save_time = int(time.time())
        self.saves += 1

    def start_bgsave(self, nursery: trio.Nursery) -> None:
        """BGSAVE: capture and pin now, write in a worker thread. PersistenceError when one runs."""
        if self.bgsave_in_progress:
            raise PersistenceError("ERR Background save already in progress")
        try:
            self.lock()
        except PersistenceError as exc:
            log.warning("Background saving can't start: %s", exc)
            self.last_bgsave_ok = False
            raise PersistenceError("ERR") from exc
        mark = self._changes_counter()
        cap = snapshot.capture(self.store)
        self._abort = False
        self.bgsave_started = time.monotonic()
        self.last_try = time.time()
        log.info("Background saving started (%d pages)", cap.pages)
        nursery.start_soon(self._bgsave, cap, mark)

    async def _bgsave(self, cap: snapshot.Capture, mark: int) -> None:
        ok = False
        try:
            await trio.to_thread.run_sync(snapshot.write_file, cap, self.prefix.arena, self.store.page_size,
                                          self.directory, self.config["dbfilename"], lambda: self._abort,
                                          abandon_on_cancel=False)
            ok = True
        except snapshot.Aborted:
            log.warning("Background saving terminated by FLUSHALL")
            ok = None
        except OSError as exc:
            log.warning("Background saving error: %s", exc.strerror or exc)
        finally:
            cap.release()
            started, self.bgsave_started = self.bgsave_started, None
            self.last_bgsave_time_sec = int(time.monotonic() - (started or time.monotonic()))
            if ok is not None:  # an abort leaves the status as it was, as Redis's killed child does
                self.last_bgsave_ok = ok
        if ok:
            self._saved(mark)
            log.info("Background saving terminated with success")

    async def abort_bgsave(self) -> None:
        """Call off a background save and wait until its pins are gone (FLUSHALL: as Redis kills
        its saving child, so that the flush is not held back by the snapshot's pins)."""
        if self.bgsave_in_progress:
            self._abort = True
            await self.wait_bgsave()

    async def wait_bgsave(self) -> None:
        """Until no background save runs."""
        while self.bgsave_in_progress:
            await trio.sleep(0.01)

    def cron(self, nursery: trio.Nursery) -> None:
        """Once a second: start a BGSAVE when a pair of the ``save`` schedule is due."""
        if self.bgsave_in_progress or not self.config["save"]:
            return
        now = time.time()
        if not self.last_bgsave_ok and now - self.last_try <= RETRY_DELAY:
            return
        numbers = [int(x) for x in self.config["save"].split()]
        changes = self.changes
        for seconds, wanted in zip(numbers[::2], numbers[1::2]):
            if changes >= wanted and now - self.last_save_time > seconds:
                log.info("%d changes in %d seconds. Saving...", wanted, seconds)
                try:
                    self.start_bgsave(nursery)
                except PersistenceError:
                    self.last_try = now
                return

    def save_on_shutdown(self, save: bool | None) -> bool:
        """The save a shutdown makes (``save``: True SHUTDOWN SAVE, False NOSAVE, None by the
        schedule); False when it was due and failed (logged)."""
        if save is False or (save is None and not self.config["save"]):
            return True
        log.warning("Saving the final snapshot before exiting.")
        try:
            self.save()
        except PersistenceError:
            log.warning("Error trying to save the DB, can't exit.")
            return False
        return True

    # -- INFO --------------------------------------------------------------------------------

    def info_fields(self) -> list[tuple[str, object]]:
        """INFO persistence, redis-server 7.0's fields in its order, with their meanings here."""
        current = self.bgsave_started
        report = self.load_report
        return [
            ("loading", self.loading),
            ("async_loading", 0),
            ("current_cow_peak", 0),
            ("current_cow_size", 0),
            ("current_cow_size_age", 0),
            ("current_fork_perc", "0.00"),
            ("current_save_keys_processed", 0),
            ("current_save_keys_total", 0),
            ("rdb_changes_since_last_save", self.changes),
            ("rdb_bgsave_in_progress", int(current is not None)),
            ("rdb_last_save_time", self.last_save_time),
            ("rdb_last_bgsave_status", "ok" if self.last_bgsave_ok else "err"),
            ("rdb_last_bgsave_time_sec", self.last_bgsave_time_sec),
            ("rdb_current_bgsave_time_sec", int(time.monotonic() - current) if current is not None else -1),
            ("rdb_saves", self.saves),
            ("rdb_last_cow_size", 0),
            ("rdb_last_load_keys_expired", 0),
            ("rdb_last_load_keys_loaded", self.keys_loaded),
            ("aof_enabled", 0),
            ("aof_rewrite_in_progress", 0),
            ("aof_rewrite_scheduled", 0),
            ("aof_last_rewrite_time_sec", -1),
            ("aof_current_rewrite_time_sec", -1),
            ("aof_last_bgrewrite_status", "ok"),
            ("aof_rewrites", 0),
            ("aof_rewrites_consecutive_failures", 0),
            ("aof_last_write_status", "ok"),
            ("aof_last_cow_size", 0),
            ("module_fork_in_progress", 0),
            ("module_fork_last_cow_size", 0),
            # pfxcache's own, after Redis's: what the last load found
            ("pfx_snapshot_load_status", report.status if report is not None else "none"),
            ("pfx_snapshot_pages_loaded", report.pages_loaded if report is not None else 0),
            ("pfx_snapshot_pages_dropped", report.pages_dropped if report is not None else 0),
            ("pfx_snapshot_records_failed", report.records_failed if report is not None else 0),
        ]
