"""Snapshots of the store: every cached page's bytes and the trees, written to one file and read back.

Synchronous and free of the event loop and the protocol: the daemon (service/persistence.py)
decides when to save and on which thread; this module only captures, writes and loads.

Rules:

* What a snapshot holds is what the store caches at the moment of :func:`capture`: per
  namespace, every radix tree's edges in pre-order (token run, page count, parent) and each
  page's bytes. Leases, insert plans, expiries and what the eviction policy learned are not
  kept: a lease's holder is a connection, and connections do not survive the process.
* Capture runs on the store's thread and pins every captured leaf (``RadixTree.pin``, as a
  READ lease does), so every captured page stays in its block, and a cached page's block is
  never rewritten while it is in the tree: the bytes a worker thread then reads are the bytes
  captured. Eviction skips the pinned pages as it skips leased ones; :meth:`Capture.release`
  unpins them, on the store's thread again.
* The file is written under a temporary name, fsynced, renamed over the target and the
  directory fsynced (:func:`write_file`): a reader sees the old file or the new one, whole.
* Nothing read is trusted before it is verified: the header's geometry fingerprint (page size,
  token width, block bytes) must be this store's, every record carries a CRC-32 of itself, and
  every page record carries its ident, a BLAKE2b hash chained from its namespace through every
  page of its token prefix (:func:`page_ident`), which the loader recomputes from the tree it has
  rebuilt. A page that fails is dropped with every
  page after it on its edge and every edge below it (the prefix property: a page is only
  findable with the pages before it); a record whose framing cannot be trusted ends the load
  there. A torn, truncated, corrupted or foreign file therefore costs misses, never a wrong
  byte, and never an exception out of :func:`load_file`.

File format (little-endian)::

    header   "PFXDUMP1" | version u16 | flags u16 | page_size u32 | token_bytes u32
             | block_bytes u64 | fingerprint 16 | created_unix u64 | crc32 u32
    records  tag u8 | length u32 | payload | crc32 u32 (of tag, length and payload)
      N      namespace name: starts a namespace; edges are numbered from 1 within it, 0 the root
      E      parent u32 | npages u32 | tokens (npages pages)
      P      edge u32 | page u32 | ident 16 | the page's block (block_bytes): one per page
             of the edge before it, in order
      T      namespaces u64 | edges u64 | pages u64 | crc32 u32 of every byte before the trailer
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
import zlib
from dataclasses import dataclass, field

from .arguments import TOKEN_BYTES
from .errors import StoreError
from .idents import namespace_ident, page_ident

MAGIC = b"PFXDUMP1"
VERSION = 1
HEADER = struct.Struct("<8sHHIIQ16sQ")
RECORD = struct.Struct("<cI")
EDGE = struct.Struct("<II")
PAGE = struct.Struct("<II16s")
TRAILER = struct.Struct("<QQQI")
CRC = struct.Struct("<I")
#: Pages read from the arena at once by the writer.
CHUNK_PAGES = 256


def fingerprint(page_size: int, block_bytes: int) -> bytes:
    """What a file's pages must agree with to be loaded: the geometry, hashed."""
    text = f"pfxcache-snapshot page_size={page_size} token_bytes={TOKEN_BYTES} block_bytes={block_bytes}"
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


@dataclass
class CapturedNamespace:
    name: bytes
    #: (parent edge number, 0 for the root; tokens; block ids), in pre-order
    edges: list[tuple[int, bytes, list[int]]] = field(default_factory=list)


@dataclass
class Capture:
    """The trees as :func:`capture` found them, and the pins that keep their pages in place."""

    store: object
    namespaces: list[CapturedNamespace]
    pinned: list
    pages: int = 0
    edges: int = 0

    def release(self) -> None:
        """Unpin what capture pinned (idempotent); on the store's thread."""
        store, pinned, self.pinned = self.store, self.pinned, []
        pins = store.snapshot_pins
        scopes = set()
        for node in pinned:
            node.tree.unpin(node)
            scopes.add(node.tree.scope)
        if pinned:
            drop = {id(n) for n in pinned}
            store.snapshot_pins[:] = [n for n in pins if id(n) not in drop]
        names = store._names
        for scope in scopes:  # a namespace deleted while pinned goes now, as after its last lease
            rec = names.records.get(scope)
            if rec is not None:
                if rec.deleted:
                    store._evictor.sweep_deleted(rec)
                names.retire_if_empty(rec)


def capture(store) -> Capture:
    """The trees of ``store`` in pre-order with every leaf pinned: O(edges), on the store's thread."""
    out: list[CapturedNamespace] = []
    pinned = []
    pages = edges = 0
    for rec in list(store._names.records.values()):
        if rec.deleted:  # DEL'd, waiting only for its leases: not part of the dataset
            continue
        cap = CapturedNamespace(rec.name)
        for shard in sorted(rec.trees):
            tree = rec.trees[shard]
            stack = [(child, 0) for child in reversed(list(tree.root.children.values()))]
            while stack:
                node, parent = stack.pop()
                cap.edges.append((parent, node.key, list(node.blocks)))
                number = len(cap.edges)
                pages += len(node.blocks)
                if node.children:
                    stack.extend((child, number) for child in reversed(list(node.children.values())))
                else:
                    tree.pin(node)
                    pinned.append(node)
        if cap.edges:
            edges += len(cap.edges)
            out.append(cap)
    store.snapshot_pins.extend(pinned)
    return Capture(store, out, pinned, pages, edges)


class _Out:
    """A file being written with the running CRC of everything in it."""

    def __init__(self, file) -> None:
        self.file = file
        self.crc = 0

    def raw(self, data: bytes) -> None:
        self.file.write(data)
        self.crc = zlib.crc32(data, self.crc)

    def record(self, tag: bytes, *parts) -> None:
        length = sum(len(p) for p in parts)
        head = RECORD.pack(tag, length)
        crc = zlib.crc32(head)
        for p in parts:
            crc = zlib.crc32(p, crc)
        self.raw(head)
        for p in parts:
            self.raw(p)
        self.raw(CRC.pack(crc))


class Aborted(Exception):
    """The write was called off (``cancelled()`` turned true); the temporary file is gone."""


def write_file(cap: Capture, arena, page_size: int, directory: str, filename: str, cancelled=None) -> int:
    """Write ``cap`` (its pages read from ``arena``) to ``directory/filename`` atomically; returns
    the bytes written. May run on any thread while the capture's pins hold. Raises OSError, or
    Aborted when ``cancelled()`` (asked between chunks of pages) turns true."""
    block_bytes = arena.block_bytes
    page_bytes = page_size * TOKEN_BYTES
    temp = os.path.join(directory, f"temp-{os.getpid()}.pfx")
    target = os.path.join(directory, filename)
    try:
        with open(temp, "wb", buffering=1 << 20) as file:
            out = _Out(file)
            header = HEADER.pack(MAGIC, VERSION, 0, page_size, TOKEN_BYTES, block_bytes,
                                 fingerprint(page_size, block_bytes), int(time.time()))
            out.raw(header + CRC.pack(zlib.crc32(header)))
            for ns in cap.namespaces:
                out.record(b"N", ns.name)
                idents = {0: namespace_ident(ns.name)}
                for number, (parent, key, blocks) in enumerate(ns.edges, start=1):
                    out.record(b"E", EDGE.pack(parent, len(blocks)), key)
                    ident = idents[parent]
                    for first in range(0, len(blocks), CHUNK_PAGES):
                        if cancelled is not None and cancelled():
                            raise Aborted
                        ids = blocks[first:first + CHUNK_PAGES]
                        data = memoryview(arena.read(ids)).cast("B")
                        for j in range(len(ids)):
                            page = first + j
                            ident = page_ident(ident, key[page * page_bytes:(page + 1) * page_bytes])
                            out.record(b"P", PAGE.pack(number, page, ident),
                                       data[j * block_bytes:(j + 1) * block_bytes])
                    idents[number] = ident
            whole = out.crc
            out.record(b"T", TRAILER.pack(len(cap.namespaces), cap.edges, cap.pages, whole))
            file.flush()
            os.fsync(file.fileno())
            size = file.tell()
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return size


@dataclass
class LoadReport:
    """What :func:`load_file` found: ``status`` is ok, missing, foreign, corrupt or truncated."""

    status: str = "ok"
    detail: str = ""
    namespaces: int = 0
    pages_loaded: int = 0
    pages_dropped: int = 0
    records_failed: int = 0


def load_file(store, path: str) -> LoadReport:
    """Insert every verified page of the snapshot at ``path`` into ``store``; never raises for the
    file's contents (see the module docstring). On the store's thread, before clients are served.
    Reads the file once, front to back, one record at a time."""
    report = LoadReport()
    try:
        file = open(path, "rb")
    except FileNotFoundError:
        report.status = "missing"
        return report
    except OSError as exc:
        report.status, report.detail = "corrupt", f"cannot open: {exc.strerror or exc}"
        return report
    try:
        with file:
            _load(store, file, os.fstat(file.fileno()).st_size, report)
    except OSError as exc:
        report.status, report.detail = "corrupt", f"cannot read: {exc.strerror or exc}"
    if report.records_failed and report.status == "ok":
        report.status = "corrupt"
        report.detail = f"{report.records_failed} page records failed verification"
    return report


def _load(store, file, size: int, report: LoadReport) -> None:
    page_size, block_bytes = store.page_size, store.block_bytes
    page_bytes = page_size * TOKEN_BYTES
    head = file.read(HEADER.size + CRC.size)
    if len(head) < HEADER.size + CRC.size:
        report.status, report.detail = "truncated", "shorter than the header"
        return
    header = head[:HEADER.size]
    (crc,) = CRC.unpack_from(head, HEADER.size)
    if zlib.crc32(header) != crc:
        report.status, report.detail = "corrupt", "header checksum mismatch"
        return
    magic, version, _flags, f_page, f_token, f_block, f_print, _created = HEADER.unpack(header)
    if magic != MAGIC or version != VERSION:
        report.status, report.detail = "foreign", f"not a version {VERSION} pfxcache snapshot"
        return
    if (f_page, f_token, f_block) != (page_size, TOKEN_BYTES, block_bytes) or \
            f_print != fingerprint(page_size, block_bytes):
        report.status = "foreign"
        report.detail = (f"geometry page-size {f_page} block-bytes {f_block}, this daemon's page-size "
                         f"{page_size} block-bytes {block_bytes}")
        return
    loader = _Loader(store, page_bytes, block_bytes, report)
    whole = zlib.crc32(head)  # of every byte before the trailer
    pos = len(head)
    page_length = PAGE.size + block_bytes
    try:
        while True:
            if pos == size:
                report.status, report.detail = "truncated", "no trailer"
                return
            frame = file.read(RECORD.size)
            if len(frame) < RECORD.size:
                report.status, report.detail = "truncated", "a record is cut short"
                return
            tag, length = RECORD.unpack(frame)
            if tag not in (b"N", b"E", b"P", b"T") or (tag == b"P" and length != page_length) \
                    or (tag == b"T" and length != TRAILER.size):
                report.status, report.detail = "corrupt", f"bad record framing at byte {pos}"
                report.records_failed += 1
                return
            if pos + RECORD.size + length + CRC.size > size:  # never asks read() for more than is there
                report.status, report.detail = "truncated", "a record is cut short"
                return
            body = file.read(length)
            tail = file.read(CRC.size)
            if len(body) < length or len(tail) < CRC.size:
                report.status, report.detail = "truncated", "a record is cut short"
                return
            (crc,) = CRC.unpack(tail)
            good = zlib.crc32(body, zlib.crc32(frame)) == crc
            if tag != b"T":
                whole = zlib.crc32(tail, zlib.crc32(body, zlib.crc32(frame, whole)))
            pos += RECORD.size + length + CRC.size
            if not good:
                report.records_failed += 1
                if tag != b"P":  # its length may be what is wrong: nothing after it can be framed
                    report.status, report.detail = "corrupt", f"record checksum mismatch before byte {pos}"
                    return
                loader.bad_page()
            elif tag == b"N":
                loader.namespace(bytes(body))
            elif tag == b"E":
                parent, npages = EDGE.unpack_from(body)
                if len(body) != EDGE.size + npages * page_bytes:
                    report.status, report.detail = "corrupt", f"edge length mismatch before byte {pos}"
                    return
                loader.edge(parent, npages, body[EDGE.size:])
            elif tag == b"P":
                number, page, ident = PAGE.unpack_from(body)
                loader.page(number, page, ident, memoryview(body)[PAGE.size:])
            else:
                _ns, _edges, pages, crc_all = TRAILER.unpack(body)
                if crc_all != whole:
                    report.status, report.detail = "corrupt", "whole-file checksum mismatch"
                elif pages != loader.seen_pages:
                    report.status, report.detail = "corrupt", f"trailer counts {pages} pages, found {loader.seen_pages}"
                elif pos != size:
                    report.status, report.detail = "corrupt", "bytes after the trailer"
                return
    finally:
        loader.finish()


class _Loader:
    """Rebuilds the trees edge by edge through the store's own insert path."""

    def __init__(self, store, page_bytes: int, block_bytes: int, report: LoadReport) -> None:
        self.store = store
        self.page_bytes = page_bytes
        self.page_size = page_bytes // TOKEN_BYTES
        self.report = report
        self.ns: bytes | None = None
        self.seen_pages = 0
        # per edge number: (its whole token prefix, the ident of its last page) or None: dropped
        self.edges: dict[int, tuple[bytes, bytes] | None] = {}
        self.current = None  # [number, tokens of the edge, npages, parent prefix, last ident, pages: list, ok]

    def namespace(self, name: bytes) -> None:
        self.finish()
        self.ns = name
        self.report.namespaces += 1
        self.edges = {0: (b"", namespace_ident(name))}

    def edge(self, parent: int, npages: int, tokens: bytes) -> None:
        self.finish()
        number = len(self.edges)
        base = self.edges.get(parent) if parent < number else None
        if self.ns is None or base is None:
            self.edges[number] = None
            self.current = [number, tokens, npages, b"", None, [], False]
            return
        self.current = [number, tokens, npages, base[0], base[1], [], True]

    def bad_page(self) -> None:
        self.seen_pages += 1
        if self.current is not None:
            self.current[6] = False

    def page(self, number: int, page: int, digest: bytes, body) -> None:
        self.seen_pages += 1
        cur = self.current
        if cur is None or not cur[6]:
            return
        edge_number, tokens, npages, _prefix, ident, pages, _ok = cur
        if number != edge_number or page != len(pages) or page >= npages:
            cur[6] = False
            self.report.records_failed += 1
            return
        ident = cur[4] = page_ident(ident, tokens[page * self.page_bytes:(page + 1) * self.page_bytes])
        if ident != digest:
            cur[6] = False
            self.report.records_failed += 1
            return
        pages.append(bytes(body))

    def finish(self) -> None:
        """Insert the verified pages of the edge being read; drop the rest and, when any is
        dropped, every edge below it."""
        cur, self.current = self.current, None
        if cur is None:
            return
        number, tokens, npages, prefix, ident, pages, ok = cur
        good = len(pages)
        if good:
            whole = prefix + tokens[:good * self.page_bytes]
            try:
                self.store.insert(self.ns, whole, offset=len(prefix) // TOKEN_BYTES, data=b"".join(pages))
            except StoreError:
                good = 0
        self.report.pages_loaded += good
        self.report.pages_dropped += npages - good
        if good == npages and ok:
            self.edges[number] = (prefix + tokens, ident)
        else:
            self.edges[number] = None
