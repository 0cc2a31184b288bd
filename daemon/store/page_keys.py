"""Key pages: a namespace whose pages are named by the engines' own page keys instead of token ids.

Engines and cache layers that hash their pages themselves (SGLang HiCache's SHA-256 chain, LMCache's
chunk hashes, vLLM's block hashes) send opaque, binary-safe keys in prefix order, each standing for
its page's whole prefix. The store keeps them in the same radix trees as token pages, so leases,
WITHDATA, BLOCKS, leaf-first eviction, quotas, partitions, the disk tier and KV events need nothing
new:

* Each key becomes one page: a 128-bit BLAKE2b digest of the key, zero-padded to the page's width
  (``page-size`` x 4 bytes, so page-size must be at least 4). Two different keys share a page only
  by a 2**-128 draw. The digest, not the key, is what the tree compares and the disk tier chains.
* A namespace holds token pages or key pages, never both (``Namespaces.key_names`` marks the key
  ones from their first insert until they are empty): the other kind is refused with an error.
* A batch of keys links its pages parent to child, so eviction stays leaf first. A key namespace
  keeps one tree (its shard is the name's) with an index of which node holds each page
  (``RadixTree.keys``): a lookup whose first key is not a first page starts wherever the
  namespace holds it, and an insert whose first key is held hangs its new pages below it. A lookup
  answers the run of keys linked one below the other from its first key: never a run with a hole.
"""

from __future__ import annotations

from hashlib import blake2b

from .errors import BadRequest

#: Bytes of a key page's digest; the rest of the page is zeros.
DIGEST_BYTES = 16
#: The longest key accepted, in bytes.
MAX_KEY_BYTES = 1024
PERSON = b"pfx-key-v1"


def key_pages(keys, page_bytes: int) -> bytes:
    """The packed pages standing for ``keys`` (bytes each, in prefix order); BadRequest for bad ones."""
    if page_bytes < DIGEST_BYTES:
        raise BadRequest(f"HASHES needs page-size >= {DIGEST_BYTES // 4} (a key page holds a "
                         f"{DIGEST_BYTES * 8}-bit digest; this daemon's page-size is {page_bytes // 4})")
    pad = bytes(page_bytes - DIGEST_BYTES)
    out = []
    for number, key in enumerate(keys):
        if not isinstance(key, (bytes, bytearray, memoryview)):
            raise BadRequest(f"key {number + 1} is not a byte string")
        if not 0 < len(key) <= MAX_KEY_BYTES:
            raise BadRequest(f"key {number + 1} is {len(key)} bytes: a page key is 1 to {MAX_KEY_BYTES} bytes")
        out.append(blake2b(key, digest_size=DIGEST_BYTES, person=PERSON).digest() + pad)
    return b"".join(out)
