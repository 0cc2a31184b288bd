"""The shared (remote) tier's keys and values: one Redis key per page, its value a verified record.

Pure encoding, decoding and arithmetic; no I/O and no trio (service/remote_tier.py moves the bytes).

Rules:

* **Keys are content addressed.** A page's key is ``pfx:v1:<namespace tag>:<ident>`` in hex, where
  the ident is the page's 128-bit chain over its namespace and whole token prefix
  (store/idents.py) and the namespace tag is 64 bits of a hash of the namespace. Every daemon
  computes the same key for the same page of the same prompt; the key holds no ``{hash tag}``,
  so a namespace's pages spread over every slot of a cluster. The tag is there only so that a
  namespace's keys can be found again (``SCAN MATCH``, :func:`namespace_pattern`) to drop them
  from the shared tier; it proves nothing: the header does.
* **A value is verified before a byte of it is used.** It is a header and the page's bytes.
  :func:`verify` accepts it only when the magic, the version and the header's CRC-32 are right,
  the namespace, ident, parent ident and geometry fingerprint are the ones the reader asked for,
  the payload has the length the reader's arena expects and its checksum matches. Anything else
  (garbage, a truncated value, a page of another namespace copied under this key, another
  geometry) is a miss, never an exception: the shared tier is written by other processes.
* The namespace is in the key's ident *and* in the header, compared byte for byte: a tenant's
  pages are reachable only through its own namespace, whoever wrote them.
* **Key pages** (HASHES, store/page_keys.py) stand for their whole prefix by themselves, so their
  ident does not chain: :func:`~pfxcache.daemon.store.idents.key_page_ident` is the ident the page would have as the first page
  of its namespace, and its parent is the namespace's seed. A run of key pages can then be found
  from any of its keys, as a daemon's own store finds it. The header's flags say which kind a
  value is (``KEY_PAGE``); :func:`is_key_page` reads it once the value verified, and a reader
  that expects one kind treats the other as a value that does not verify.
* Little-endian. The payload checksum is CRC-32C (the ``crc32c`` package) when importable, else
  zlib's CRC-32; the header names which, and a value whose algorithm this process cannot compute
  never verifies.

Layout (sizes in bytes)::

    header  "PFXRV001" 8 | version u16 | algorithm u8 | flags u8 | namespace length u16 | 0 u16
            | fingerprint 16 | ident 16 | parent 16 | payload length u64 | payload checksum u32
            | header crc32 u32 (zlib, of every header byte before it)
    then    namespace (namespace length bytes), payload (payload length bytes)
"""

from __future__ import annotations

import struct
import zlib
from hashlib import blake2b

from pfxcache.daemon.tier.format import CRC32C, PREFERRED_ALGORITHM, ZLIB_CRC32, checksum_function

MAGIC = b"PFXRV001"
VERSION = 1
KEY_PREFIX = b"pfx:v1:"
IDENT_BYTES = 16
MAX_NAMESPACE = 65535
#: Header flag: the value is a key page (HASHES), whose ident is :func:`~pfxcache.daemon.store.idents.key_page_ident`.
KEY_PAGE = 1

_HEADER = struct.Struct("<8sHBBHH16s16s16sQI")
_CRC = struct.Struct("<I")
HEADER_BYTES = _HEADER.size + _CRC.size

__all__ = ["CRC32C", "HEADER_BYTES", "KEY_PAGE", "KEY_PREFIX", "ZLIB_CRC32", "encode", "is_key_page", "key_of",
           "namespace_pattern", "namespace_tag", "verify"]


def namespace_tag(namespace: bytes) -> bytes:
    """The 16 hex digits of a namespace that its keys carry (so that they can be found to drop)."""
    return blake2b(b"pfxcache-remote-namespace\0" + namespace, digest_size=8).hexdigest().encode()


def key_of(namespace: bytes, ident: bytes) -> bytes:
    """The Redis key of the page ``ident`` of ``namespace`` (no hash tag: spread over slots)."""
    return KEY_PREFIX + namespace_tag(namespace) + b":" + ident.hex().encode()


def namespace_pattern(namespace: bytes) -> bytes:
    """A ``SCAN MATCH`` pattern of every key of ``namespace`` (glob-safe: hex digits only)."""
    return KEY_PREFIX + namespace_tag(namespace) + b":*"


def encode(namespace: bytes, ident: bytes, parent: bytes, fingerprint: bytes, payload: bytes | memoryview,
           *, algorithm: int = PREFERRED_ALGORITHM, flags: int = 0) -> bytes:
    """The value of one page: header, namespace, payload (one copy of the payload); ``flags``
    ``KEY_PAGE`` for a key page."""
    if len(namespace) > MAX_NAMESPACE:
        raise ValueError(f"a namespace of {len(namespace)} bytes is longer than {MAX_NAMESPACE}")
    compute = checksum_function(algorithm)
    if compute is None:
        raise ValueError(f"checksum algorithm {algorithm} is not available")
    head = _HEADER.pack(MAGIC, VERSION, algorithm, flags, len(namespace), 0, fingerprint, ident, parent,
                        len(payload), compute(payload) & 0xFFFFFFFF)
    return b"".join((head, _CRC.pack(zlib.crc32(head)), namespace, payload))


def verify(value: bytes | None, namespace: bytes, ident: bytes, parent: bytes, fingerprint: bytes,
           payload_bytes: int) -> memoryview | None:
    """The payload of ``value`` when it is exactly the page asked for (see the module docstring),
    else None. ``value`` None (no such key) is None too; the caller tells the two apart."""
    if value is None or len(value) < HEADER_BYTES:
        return None
    view = memoryview(value)
    (stored_crc,) = _CRC.unpack_from(view, _HEADER.size)
    if zlib.crc32(view[: _HEADER.size]) != stored_crc:
        return None
    magic, version, algorithm, _, ns_len, _, fp, got_ident, got_parent, length, checksum = _HEADER.unpack_from(view)
    if magic != MAGIC or version != VERSION or fp != fingerprint:
        return None
    if got_ident != ident or got_parent != parent or length != payload_bytes:
        return None
    if len(view) != HEADER_BYTES + ns_len + length or view[HEADER_BYTES : HEADER_BYTES + ns_len] != namespace:
        return None
    compute = checksum_function(algorithm)
    if compute is None:
        return None
    payload = view[HEADER_BYTES + ns_len :]
    if compute(payload) & 0xFFFFFFFF != checksum:
        return None
    return payload


def is_key_page(value: bytes) -> bool:
    """Whether a value (one that :func:`verify` accepted) is a key page."""
    return bool(value[11] & KEY_PAGE)
