"""The disk tier's files: fixed-slot segment files under ``<path>/pfxtier/``, read and written in runs.

Blocking calls, made from worker threads: at most one thread writes (``write``, ``clear``,
``set_flush_seq``, ``sync``, ``drop_cache``) while at most one other reads (``read``,
``scan``); the properties and :meth:`TierFiles.stats` may be read from any thread, and
:meth:`TierFiles.close` is called when no other call is in flight. ``format.py`` says what the
bytes are; this module says when they are written and what is believed when they are read.

Rules:

* ``LOCK`` is flocked for the life of the object: two processes never share a tier. A path
  that is missing, not a directory, not writable or locked is a :class:`TierPathError` from
  the constructor, with a one-line reason naming the path. After the constructor nothing
  raises for I/O: an OSError fails the pages it touched (False), is counted in ``io_errors``
  and remembered as ``last_error``.
* ``tier.meta`` holds the tier's uuid, the caller's geometry fingerprint and ``flush_seq``; it
  is replaced whole (temporary file, fsync, rename, fsync of the directory). When it is missing,
  damaged or carries another fingerprint, the tier takes a new uuid and ``flush_seq`` 0, and
  every record written before is foreign from then on: it never verifies.
* A segment file is created on the first write into it: preallocated (``posix_fallocate``, so
  a full disk fails that write rather than a later one), its header written, fsynced, and the
  directory fsynced. A segment whose header does not verify, or says another tier, segment or
  geometry, yields no records and is reinitialised on its first write: table zeroed, then the
  new header.
* A write puts a run's payloads down before its record headers, and with ``fsync`` "batch" or
  "always" ``fdatasync``\\s before returning: True means durable. A rewritten slot can be left
  with its old header and a new payload by a crash; the payload checksum then fails on read.
* A read trusts nothing it has not verified: the header's CRC, magic and version, the tier
  uuid, the slot it was read from, the record the caller expects (ident, parent, namespace,
  seq), and the payload checksum over the bytes that landed in the caller's buffer. A failure
  is counted in ``verify_failures`` (a missing or foreign segment, a short read and a checksum
  mismatch included); an OSError in ``io_errors``. Either way the page is False, and its target
  holds undefined bytes.
* ``clear`` zeroes record headers (synced like a write), so a dropped record never returns,
  and ``set_flush_seq`` hides every record with ``seq <= flush_seq`` (FLUSHALL) through the meta.
* :meth:`TierFiles.scan` counts the non-empty headers it cannot accept (torn, foreign,
  misplaced, unverifiable) in ``scan_rejected`` and the segments whose header does not verify
  in ``segments_rejected``. Segment files stay open until :meth:`TierFiles.close`; ``segments``
  in :meth:`TierFiles.stats` counts them.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from . import format as fmt
from .faults import Faults
from .format import HEADER_BYTES, Layout, RecordHeader

__all__ = ["RecordHeader", "TierFiles", "TierPathError"]

FSYNC_MODES = ("batch", "always", "no")
IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024
_ZERO_CHUNK = bytes(1 << 20)
_COUNTERS = ("reads", "read_pages", "read_bytes", "read_seconds", "writes", "write_pages",
             "write_bytes", "write_seconds", "io_errors", "verify_failures", "scan_rejected",
             "segments_rejected")


class TierPathError(Exception):
    """The disk-tier path cannot be used; the message is one line naming the path."""


class _Segment:
    """One open segment file: its fd, whether its header is this tier's, whether it is short."""

    __slots__ = ("fd", "valid", "short")

    def __init__(self, fd: int, valid: bool, short: bool) -> None:
        self.fd = fd
        self.valid = valid
        self.short = short


class TierFiles:
    """The segment files of one disk tier, with its lock and meta; see the module docstring."""

    def __init__(self, path: str, *, nslots: int, block_bytes: int, fingerprint: bytes,
                 fsync: str = "batch", segment_bytes: int = 256 << 20,
                 faults: Faults | None = None) -> None:
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_MODES)}, not {fsync!r}")
        if len(fingerprint) != fmt.ID_BYTES:
            raise ValueError(f"fingerprint must be {fmt.ID_BYTES} bytes")
        self.layout = Layout(nslots, block_bytes, segment_bytes)
        self.nslots = nslots
        self.block_bytes = block_bytes
        self.slot_stride = self.layout.slot_stride
        self.directory = os.path.join(path, "pfxtier")
        self._fingerprint = bytes(fingerprint)
        self._fsync = fsync
        self._faults = faults
        self._algorithm = fmt.PREFERRED_ALGORITHM
        self._checksum = fmt.checksum_function(self._algorithm)
        self._padding = bytes(self.slot_stride - block_bytes)  # written between payloads in a run
        self._segments: dict[int, _Segment] = {}
        self._segments_lock = threading.Lock()  # opening, creating and closing segment files
        self._counters_lock = threading.Lock()
        self._counters: dict[str, float] = dict.fromkeys(_COUNTERS, 0)
        self._last_error = ""
        self._closed = False
        self._lock_fd = _lock_directory(path, self.directory)
        try:
            self.uuid, self.flush_seq = self._load_meta()
        except BaseException:
            os.close(self._lock_fd)
            raise

    # -- writing ------------------------------------------------------------------------------

    def write(self, headers: list[RecordHeader], payloads: list) -> list[bool]:
        """Write each record into its slot; per page, True once it is durable (see ``fsync``)."""
        self._check_open()
        if len(headers) != len(payloads):
            raise ValueError("one payload per header")
        pages = sorted(zip(range(len(headers)), headers, map(self._payload_view, payloads)),
                       key=lambda page: page[1].slot)
        for position, (_, header, _) in enumerate(pages):
            self._check_slot(header.slot)
            fmt.check_record(header)
            if position and pages[position - 1][1].slot == header.slot:
                raise ValueError(f"slot {header.slot} written twice in one call")
        ok = [False] * len(headers)
        started = time.perf_counter()
        pending: dict[int, tuple[_Segment, list]] = {}  # segment -> (file, pages not yet synced)
        for segment_number, index, run in self._runs(pages, lambda page: page[1].slot):
            try:
                if self._faults is not None:
                    self._faults.before_write()
                segment = self._segment(segment_number, for_write=True)
                buffers: list = []
                entries = []
                for _, header, view in run:
                    if buffers and self._padding:
                        buffers.append(self._padding)
                    buffers.append(view)
                    entries.append(fmt.encode_record(header, self.uuid, self._algorithm,
                                                     self.block_bytes, self._checksum(view)))
                _pwritev_all(segment.fd, buffers, self.layout.payload_offset(segment_number, index))
                _pwrite_all(segment.fd, b"".join(entries), Layout.header_offset(index))
                if self._fsync == "always":
                    os.fdatasync(segment.fd)
            except OSError as error:
                self._io_error(error)
                continue
            pending.setdefault(segment_number, (segment, []))[1].extend(run)
        written = 0
        for segment, run in pending.values():
            try:
                if self._fsync == "batch":
                    os.fdatasync(segment.fd)
            except OSError as error:
                self._io_error(error)
                continue
            for position, _, _ in run:
                ok[position] = True
            written += len(run)
        self._count(writes=1, write_pages=written, write_bytes=written * self.block_bytes,
                    write_seconds=time.perf_counter() - started)
        return ok

    def clear(self, slots: list[int]) -> None:
        """Zero the record headers of ``slots``, durably unless fsync is "no"."""
        self._check_open()
        for slot in slots:
            self._check_slot(slot)
        touched: dict[int, _Segment] = {}
        for segment_number, index, run in self._runs(sorted(set(slots)), lambda slot: slot):
            try:
                segment = self._segment(segment_number, for_write=False)
                if segment is None or not segment.valid:
                    continue  # nothing there verifies, and a reinitialisation zeroes it
                _pwrite_all(segment.fd, bytes(len(run) * HEADER_BYTES), Layout.header_offset(index))
                touched[segment_number] = segment
            except OSError as error:
                self._io_error(error)
        if self._fsync != "no":
            for segment in touched.values():
                self._sync_segment(segment)

    def set_flush_seq(self, seq: int) -> None:
        """Hide every record with ``seq <= flush_seq`` from :meth:`scan`, now and after a restart."""
        self._check_open()
        if not 0 <= seq <= fmt.MAX_U64:
            raise ValueError(f"flush seq {seq} is not a u64")
        self.flush_seq = seq
        try:
            self._write_meta()
        except OSError as error:
            self._io_error(error)

    def sync(self) -> None:
        """fdatasync every open segment."""
        self._check_open()
        for segment in self._open_segments():
            self._sync_segment(segment)

    # -- reading ------------------------------------------------------------------------------

    def read(self, expected: list[RecordHeader], targets: list) -> list[bool]:
        """Read each expected record's payload into its target; per page, True when it verified."""
        self._check_open()
        if len(expected) != len(targets):
            raise ValueError("one target per expected record")
        pages = sorted(zip(range(len(expected)), expected, map(self._target_view, targets)),
                       key=lambda page: page[1].slot)
        for _, header, _ in pages:
            self._check_slot(header.slot)
        ok = [False] * len(expected)
        started = time.perf_counter()
        scratch = bytearray(len(self._padding))  # receives the padding between payloads
        verified = 0
        for segment_number, index, run in self._runs(pages, lambda page: page[1].slot):
            try:
                if self._faults is not None:
                    self._faults.before_read()
                segment = self._segment(segment_number, for_write=False)
                if segment is None or not segment.valid:
                    self._count(verify_failures=len(run))
                    continue
                buffers: list = []
                for _, _, view in run:
                    if buffers and scratch:
                        buffers.append(scratch)
                    buffers.append(view)
                landed = _preadv_all(segment.fd, buffers,
                                     self.layout.payload_offset(segment_number, index))
                entries = os.pread(segment.fd, len(run) * HEADER_BYTES, Layout.header_offset(index))
            except OSError as error:
                self._io_error(error)
                continue
            for offset, (position, header, view) in enumerate(run):
                whole = offset * self.slot_stride + self.block_bytes <= landed
                if whole and fmt.verify(entries, offset * HEADER_BYTES, header, self.uuid, view):
                    ok[position] = True
                    verified += 1
                else:
                    self._count(verify_failures=1)
        self._count(reads=1, read_pages=verified, read_bytes=verified * self.block_bytes,
                    read_seconds=time.perf_counter() - started)
        return ok

    def scan(self) -> list[RecordHeader]:
        """Every record whose header verifies and whose seq is above ``flush_seq``, by slot."""
        self._check_open()
        records = []
        for segment_number in range(self.layout.nsegments):
            try:
                segment = self._segment(segment_number, for_write=False)
                if segment is None:
                    continue
                if not segment.valid:
                    self._count(segments_rejected=1)
                    continue
                table = os.pread(segment.fd, self.layout.slots_in(segment_number) * HEADER_BYTES,
                                 Layout.header_offset(0))
            except OSError as error:
                self._io_error(error)
                continue
            first_slot = self.layout.first_slot(segment_number)
            rejected = 0
            for index in range(len(table) // HEADER_BYTES):
                offset = index * HEADER_BYTES
                stored = fmt.decode_record(table, offset)
                if stored is None:
                    if table[offset:offset + HEADER_BYTES] != fmt.EMPTY_HEADER:
                        rejected += 1
                    continue
                if not fmt.belongs(stored, self.uuid, first_slot + index, self.block_bytes):
                    rejected += 1
                elif stored.header.seq > self.flush_seq:
                    records.append(stored.header)
            self._count(scan_rejected=rejected)
        return records

    def drop_cache(self) -> None:
        """Sync every segment and drop it from the page cache, so the next reads go to the disk."""
        self._check_open()
        for segment_number in range(self.layout.nsegments):
            try:
                segment = self._segment(segment_number, for_write=False)
                if segment is not None:
                    os.fdatasync(segment.fd)
                    os.posix_fadvise(segment.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError as error:
                self._io_error(error)

    # -- figures and life ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._counters_lock:
            figures: dict[str, Any] = dict(self._counters)
            figures["last_error"] = self._last_error
        with self._segments_lock:
            figures["segments"] = len(self._segments)
        return figures

    def close(self) -> None:
        """Close every segment and release the lock; idempotent."""
        with self._segments_lock:
            if self._closed:
                return
            self._closed = True
            segments, self._segments = list(self._segments.values()), {}
        try:
            for segment in segments:
                os.close(segment.fd)
        finally:
            os.close(self._lock_fd)

    def __enter__(self) -> TierFiles:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- segments -----------------------------------------------------------------------------

    def _segment_path(self, segment_number: int) -> str:
        return os.path.join(self.directory, f"seg-{segment_number:06d}.pfx")

    def _segment(self, segment_number: int, *, for_write: bool) -> _Segment | None:
        """The open segment (opened now if it exists); created or repaired first for a write."""
        with self._segments_lock:
            segment = self._segments.get(segment_number)
            if segment is None:
                segment = self._open_segment(segment_number)
                if segment is None:
                    if not for_write:
                        return None
                    segment = self._create_segment(segment_number)
                self._segments[segment_number] = segment
            if for_write and not segment.valid:
                self._initialise(segment.fd, segment_number, fresh=False)
                segment.valid, segment.short = True, False
            elif for_write and segment.short:
                os.posix_fallocate(segment.fd, 0, self.layout.segment_bytes(segment_number))
                segment.short = False
            return segment

    def _open_segment(self, segment_number: int) -> _Segment | None:
        try:
            fd = os.open(self._segment_path(segment_number), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            header = fmt.decode_segment_header(os.pread(fd, fmt.SEGMENT_HEADER_BYTES, 0))
            valid = header == self.layout.segment_header(self.uuid, segment_number)
            short = os.fstat(fd).st_size < self.layout.segment_bytes(segment_number)
        except BaseException:
            os.close(fd)
            raise
        return _Segment(fd, valid, short)

    def _create_segment(self, segment_number: int) -> _Segment:
        path = self._segment_path(segment_number)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            self._initialise(fd, segment_number, fresh=True)
            _fsync_directory(self.directory)
        except BaseException:
            os.close(fd)
            _unlink_quietly(path)  # a half-made segment would only be reinitialised later
            raise
        return _Segment(fd, valid=True, short=False)

    def _initialise(self, fd: int, segment_number: int, *, fresh: bool) -> None:
        """Allocate the whole segment, empty its table, then write its header, durably."""
        os.posix_fallocate(fd, 0, self.layout.segment_bytes(segment_number))
        if not fresh:  # the old records go before the new header makes them this tier's
            table_bytes = self.layout.table_bytes(segment_number)
            for start in range(0, table_bytes, len(_ZERO_CHUNK)):
                _pwrite_all(fd, memoryview(_ZERO_CHUNK)[:table_bytes - start], Layout.header_offset(0) + start)
            os.fdatasync(fd)
        header = self.layout.segment_header(self.uuid, segment_number)
        _pwrite_all(fd, fmt.encode_segment_header(header), 0)
        os.fsync(fd)

    def _open_segments(self) -> list[_Segment]:
        with self._segments_lock:
            return [segment for segment in self._segments.values() if segment.valid]

    def _sync_segment(self, segment: _Segment) -> None:
        try:
            os.fdatasync(segment.fd)
        except OSError as error:
            self._io_error(error)

    def _runs(self, items: Sequence, slot_of: Any) -> Iterator[tuple[int, int, list]]:
        """(segment, index of the first, items) per run of consecutive slots in one segment."""
        run: list = []
        for item in items:
            slot = slot_of(item)
            if run and (slot != slot_of(run[-1]) + 1 or slot % self.layout.slots_per_segment == 0):
                yield (*self.layout.locate(slot_of(run[0])), run)
                run = []
            run.append(item)
        if run:
            yield (*self.layout.locate(slot_of(run[0])), run)

    # -- meta ---------------------------------------------------------------------------------

    def _load_meta(self) -> tuple[bytes, int]:
        path = os.path.join(self.directory, "tier.meta")
        try:
            with open(path, "rb") as meta_file:
                meta = fmt.decode_meta(meta_file.read(fmt.META_BYTES + 1))
        except OSError:
            meta = None  # unreadable is as good as missing: the rewrite below says if it matters
        if meta is not None and meta.fingerprint == self._fingerprint:
            return meta.uuid, meta.flush_seq
        self.uuid, self.flush_seq = os.urandom(fmt.ID_BYTES), 0
        try:
            self._write_meta()
        except OSError as error:
            raise TierPathError(f"disk-tier-path {os.path.dirname(self.directory)}: cannot write "
                                f"{path}: {error.strerror}") from None
        return self.uuid, self.flush_seq

    def _write_meta(self) -> None:
        path = os.path.join(self.directory, "tier.meta")
        temporary = f"{path}.tmp"
        data = fmt.encode_meta(fmt.Meta(self.uuid, self._fingerprint, self.flush_seq))
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                _pwrite_all(fd, data, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, path)
        except BaseException:
            _unlink_quietly(temporary)
            raise
        _fsync_directory(self.directory)

    # -- small helpers ------------------------------------------------------------------------

    def _payload_view(self, payload: Any) -> memoryview:
        view = _byte_view(payload)
        if view.nbytes != self.block_bytes:
            raise ValueError(f"a payload is {view.nbytes} bytes, not block_bytes {self.block_bytes}")
        return view

    def _target_view(self, target: Any) -> memoryview:
        view = self._payload_view(target)
        if view.readonly:
            raise ValueError("a read target is not writable")
        return view

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.nslots:
            raise ValueError(f"slot {slot} is outside 0..{self.nslots - 1}")

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the disk tier's files are closed")

    def _count(self, **amounts: float) -> None:
        with self._counters_lock:
            for name, amount in amounts.items():
                self._counters[name] += amount

    def _io_error(self, error: OSError) -> None:
        name = errno.errorcode.get(error.errno or 0, type(error).__name__)
        with self._counters_lock:
            self._counters["io_errors"] += 1
            self._last_error = name


def _lock_directory(path: str, directory: str) -> int:
    """Check ``path``, make ``directory`` in it and flock its LOCK; the locked fd."""
    if not os.path.exists(path):
        raise TierPathError(f"disk-tier-path {path} does not exist")
    if not os.path.isdir(path):
        raise TierPathError(f"disk-tier-path {path} is not a directory")
    probe = os.path.join(path, f".pfxtier-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        os.unlink(probe)
        if os.path.lexists(directory) and not os.path.isdir(directory):
            raise TierPathError(f"disk-tier-path {path}: {directory} is not a directory")
        os.makedirs(directory, exist_ok=True)
        fd = os.open(os.path.join(directory, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise TierPathError(f"disk-tier-path {path} is not writable: {error.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise TierPathError(f"disk-tier-path {path} is in use by pid {holder}") from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        _pwrite_all(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as error:
        os.close(fd)
        raise TierPathError(f"disk-tier-path {path} is not writable: {error.strerror}") from None
    return fd


def _byte_view(buffer: Any) -> memoryview:
    view = memoryview(buffer)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _chunks(buffers: list, offset: int) -> Iterator[tuple[list, int]]:
    """The buffers in groups of at most IOV_MAX, each with the file offset it starts at."""
    for start in range(0, len(buffers), IOV_MAX):
        chunk = buffers[start:start + IOV_MAX]
        yield chunk, offset
        offset += sum(len(buffer) for buffer in chunk)


def _remaining(buffers: list, done: int) -> list:
    """What is left of ``buffers`` after their first ``done`` bytes."""
    rest = []
    for buffer in buffers:
        if done >= len(buffer):
            done -= len(buffer)
            continue
        rest.append(memoryview(buffer)[done:] if done else buffer)
        done = 0
    return rest


def _pwritev_all(fd: int, buffers: list, offset: int) -> None:
    for chunk, position in _chunks(buffers, offset):
        while chunk:
            written = os.pwritev(fd, chunk, position)
            if written == 0:
                raise OSError(errno.EIO, "pwritev wrote nothing")
            position += written
            chunk = _remaining(chunk, written)


def _preadv_all(fd: int, buffers: list, offset: int) -> int:
    """Fill ``buffers`` from ``offset`` on; the bytes read, fewer only at the end of the file."""
    total = 0
    for chunk, position in _chunks(buffers, offset):
        while chunk:
            read = os.preadv(fd, chunk, position)
            if read == 0:
                return total
            total += read
            position += read
            chunk = _remaining(chunk, read)
    return total


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written == 0:
            raise OSError(errno.EIO, "pwrite wrote nothing")
        offset += written
        view = view[written:]


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
