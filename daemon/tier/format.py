"""The disk tier's on-disk format: the meta file, segment headers, record headers, and where a slot lives.

Pure encoding, decoding and arithmetic; no I/O (files.py reads and writes what this module
describes).

Rules:

* Little-endian throughout. Every structure starts with a magic and a version and ends with a
  CRC-32 (zlib) of every byte before it. A structure whose magic, version or CRC is wrong
  decodes to ``None``, never to an exception: bad bytes on disk are a miss, not an error.
* A record's payload checksum is computed with the algorithm its header names:
  :data:`ZLIB_CRC32` or :data:`CRC32C` (the ``crc32c`` package, preferred when importable
  because it is faster). A record whose algorithm this process cannot compute never verifies.
* An all-zero record header is an empty slot.
* Geometry: every slot is ``slot_stride`` bytes, ``block_bytes`` rounded up to 4 KiB, so payloads
  stay page-aligned. Segments hold ``slots_per_segment`` slots each (the last may hold fewer);
  global slot ``s`` lives in segment ``s // slots_per_segment`` at index ``s % slots_per_segment``.
  A segment header records its own geometry, so a file renamed, copied from another tier or
  left by another geometry is recognised as foreign.

Layouts (sizes in bytes)::

    tier.meta   "PFXMETA1" | version u16 | 0 u16 | uuid 16 | fingerprint 16 | flush_seq u64 | crc32 u32
    segment     header, 4096 bytes: "PFXSEG01" | version u16 | 0 u16 | uuid 16 | segment u64
                    | first_slot u64 | slots u64 | block_bytes u64 | slot_stride u64 | crc32 u32 | zeros
                table: slots record headers of HEADER_BYTES, zero-padded to a multiple of 4096
                payloads: slots * slot_stride, each payload at the start of its slot
    record      HEADER_BYTES: "PFXREC01" | version u16 | algorithm u8 | 0 u8 | namespace length u16
                    | 0 u16 | seq u64 | slot u64 | uuid 16 | ident 16 | parent 16
                    | payload length u64 | payload checksum u32 | namespace 255 (zero-padded)
                    | crc32 u32 | zeros
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import NamedTuple

try:
    import crc32c as _crc32c_package
except ImportError:  # optional: zlib's CRC-32 is the fallback
    _crc32c_package = None

PAGE_ALIGN = 4096
HEADER_BYTES = 512
MAX_NAMESPACE = 255
ID_BYTES = 16
MAX_U64 = (1 << 64) - 1

ZLIB_CRC32 = 0
CRC32C = 1
#: The algorithm new records are written with.
PREFERRED_ALGORITHM = CRC32C if _crc32c_package is not None else ZLIB_CRC32

META_MAGIC = b"PFXMETA1"
SEGMENT_MAGIC = b"PFXSEG01"
RECORD_MAGIC = b"PFXREC01"
VERSION = 1

_CRC = struct.Struct("<I")
_META = struct.Struct("<8sHH16s16sQ")
_SEGMENT = struct.Struct("<8sHH16sQQQQQ")
_RECORD = struct.Struct("<8sHBBHHQQ16s16s16sQI255s")
SEGMENT_HEADER_BYTES = PAGE_ALIGN
META_BYTES = _META.size + _CRC.size
EMPTY_HEADER = bytes(HEADER_BYTES)
assert _RECORD.size + _CRC.size <= HEADER_BYTES


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def checksum_function(algorithm: int) -> Callable[..., int] | None:
    """The payload checksum for ``algorithm``, or None when this process cannot compute it."""
    if algorithm == ZLIB_CRC32:
        return zlib.crc32
    if algorithm == CRC32C and _crc32c_package is not None:
        return _crc32c_package.crc32c
    return None


def _sealed(body: bytes) -> bytes:
    return body + _CRC.pack(zlib.crc32(body))


def _unsealed(data: bytes | memoryview, body_size: int) -> bool:
    """Whether ``data`` holds ``body_size`` bytes followed by their CRC-32."""
    if len(data) < body_size + _CRC.size:
        return False
    (stored,) = _CRC.unpack_from(data, body_size)
    return zlib.crc32(memoryview(data)[:body_size]) == stored


# -- tier.meta ----------------------------------------------------------------------------------

class Meta(NamedTuple):
    uuid: bytes
    fingerprint: bytes
    flush_seq: int


def encode_meta(meta: Meta) -> bytes:
    return _sealed(_META.pack(META_MAGIC, VERSION, 0, meta.uuid, meta.fingerprint, meta.flush_seq))


def decode_meta(data: bytes) -> Meta | None:
    if len(data) != META_BYTES or not _unsealed(data, _META.size):
        return None
    magic, version, _, uuid, fingerprint, flush_seq = _META.unpack_from(data)
    if magic != META_MAGIC or version != VERSION:
        return None
    return Meta(uuid, fingerprint, flush_seq)


# -- segment headers ----------------------------------------------------------------------------

class SegmentHeader(NamedTuple):
    uuid: bytes
    segment: int
    first_slot: int
    slots: int
    block_bytes: int
    slot_stride: int


def encode_segment_header(header: SegmentHeader) -> bytes:
    body = _SEGMENT.pack(SEGMENT_MAGIC, VERSION, 0, *header)
    return _sealed(body).ljust(SEGMENT_HEADER_BYTES, b"\0")


def decode_segment_header(data: bytes) -> SegmentHeader | None:
    if not _unsealed(data, _SEGMENT.size):
        return None
    magic, version, _, *fields = _SEGMENT.unpack_from(data)
    if magic != SEGMENT_MAGIC or version != VERSION:
        return None
    return SegmentHeader(*fields)


# -- record headers -----------------------------------------------------------------------------

class RecordHeader(NamedTuple):
    """What identifies a record on disk; the catalog keeps these."""
    ident: bytes
    parent: bytes
    namespace: bytes
    seq: int
    slot: int


class StoredRecord(NamedTuple):
    """A record header as decoded from disk, before it is checked against where it was read."""
    header: RecordHeader
    uuid: bytes
    algorithm: int
    payload_length: int
    payload_checksum: int


def check_record(header: RecordHeader) -> None:
    """ValueError when ``header`` cannot be encoded (a caller's mistake, never bad data)."""
    if len(header.ident) != ID_BYTES or len(header.parent) != ID_BYTES:
        raise ValueError(f"ident and parent must be {ID_BYTES} bytes")
    if len(header.namespace) > MAX_NAMESPACE:
        raise ValueError(f"namespace longer than {MAX_NAMESPACE} bytes")
    if not 0 <= header.seq <= MAX_U64:
        raise ValueError(f"seq {header.seq} is not a u64")


def encode_record(header: RecordHeader, uuid: bytes, algorithm: int,
                  payload_length: int, payload_checksum: int) -> bytes:
    body = _RECORD.pack(RECORD_MAGIC, VERSION, algorithm, 0, len(header.namespace), 0,
                        header.seq, header.slot, uuid, header.ident, header.parent,
                        payload_length, payload_checksum, header.namespace)
    return _sealed(body).ljust(HEADER_BYTES, b"\0")


def decode_record(data: bytes | memoryview, offset: int = 0) -> StoredRecord | None:
    """The record header at ``data[offset:]``; None when it is empty, torn or not a record."""
    entry = memoryview(data)[offset:offset + HEADER_BYTES]
    if len(entry) < HEADER_BYTES or entry[:8] != RECORD_MAGIC or not _unsealed(entry, _RECORD.size):
        return None
    (_, version, algorithm, _, namespace_length, _, seq, slot, uuid, ident, parent,
     payload_length, payload_checksum, namespace) = _RECORD.unpack_from(entry)
    if version != VERSION or namespace_length > MAX_NAMESPACE:
        return None
    header = RecordHeader(ident, parent, namespace[:namespace_length], seq, slot)
    return StoredRecord(header, uuid, algorithm, payload_length, payload_checksum)


def belongs(stored: StoredRecord, uuid: bytes, slot: int, block_bytes: int) -> bool:
    """Whether a decoded header is tier ``uuid``'s record for ``slot``, one this process can verify."""
    return (stored.uuid == uuid and stored.header.slot == slot and stored.payload_length == block_bytes
            and checksum_function(stored.algorithm) is not None)


def verify(entries: bytes, offset: int, expected: RecordHeader, uuid: bytes, payload: memoryview) -> bool:
    """Whether the header at ``entries[offset:]`` is ``expected``'s, in tier ``uuid``, and
    ``payload`` (one slot's bytes as read) is the payload it describes."""
    stored = decode_record(entries, offset)
    if stored is None or stored.header != expected or not belongs(stored, uuid, expected.slot, payload.nbytes):
        return False
    checksum = checksum_function(stored.algorithm)
    return checksum is not None and checksum(payload) == stored.payload_checksum


# -- geometry -----------------------------------------------------------------------------------

class Layout:
    """Where each slot's header and payload live, for one tier geometry."""

    __slots__ = ("nslots", "block_bytes", "slot_stride", "slots_per_segment", "nsegments")

    def __init__(self, nslots: int, block_bytes: int, segment_bytes: int) -> None:
        if nslots < 1 or block_bytes < 1 or segment_bytes < 1:
            raise ValueError("nslots, block_bytes and segment_bytes must be positive")
        self.nslots = nslots
        self.block_bytes = block_bytes
        self.slot_stride = round_up(block_bytes, PAGE_ALIGN)
        self.slots_per_segment = max(1, min(nslots, segment_bytes // self.slot_stride))
        self.nsegments = -(-nslots // self.slots_per_segment)

    def locate(self, slot: int) -> tuple[int, int]:
        """(segment, index in it) of a global slot."""
        return divmod(slot, self.slots_per_segment)

    def first_slot(self, segment: int) -> int:
        return segment * self.slots_per_segment

    def slots_in(self, segment: int) -> int:
        return min(self.slots_per_segment, self.nslots - self.first_slot(segment))

    def table_bytes(self, segment: int) -> int:
        return round_up(self.slots_in(segment) * HEADER_BYTES, PAGE_ALIGN)

    @staticmethod
    def header_offset(index: int) -> int:
        return SEGMENT_HEADER_BYTES + index * HEADER_BYTES

    def payload_offset(self, segment: int, index: int) -> int:
        return SEGMENT_HEADER_BYTES + self.table_bytes(segment) + index * self.slot_stride

    def segment_bytes(self, segment: int) -> int:
        return self.payload_offset(segment, self.slots_in(segment))

    def segment_header(self, uuid: bytes, segment: int) -> SegmentHeader:
        """The header segment ``segment`` of tier ``uuid`` must carry in this geometry."""
        return SegmentHeader(uuid, segment, self.first_slot(segment), self.slots_in(segment),
                             self.block_bytes, self.slot_stride)
