"""Stable block hashes: one 64-bit id per cached page, chained over the namespace and the tokens.

The definition (documented in docs/integrations.md#kv-events-for-routers, stable across releases and hosts,
independent of PYTHONHASHSEED)::

    seed(namespace)        = blake2b(b"pfxcache-namespace\\0" + namespace, digest_size=8)
    hash(page 0)           = blake2b(seed(namespace)  + page 0 tokens, digest_size=8)
    hash(page i), i > 0    = blake2b(hash(page i - 1) + page i tokens, digest_size=8)

read as big-endian unsigned 64-bit integers, where a page's tokens are its
``page-size`` token ids packed as little-endian uint32 (the store's format)
and a hash is appended as its 8 big-endian bytes. A page's hash therefore
names the namespace and every token up to the end of that page: two
namespaces holding the same tokens never share a hash, and anyone who knows
the namespace can compute the hashes of a prompt without asking the daemon.

Inside the store a run of hashes is packed bytes, 8 per page (``chain``), and
each radix node caches its pages' hashes (``Node.page_hashes``; None until
first needed): a new page costs one blake2b call (~0.4 us), a removed one
nothing. Publishers turn them into integers (``to_ints``) off the event loop.
Nothing here runs unless KV events are on.
"""

from __future__ import annotations

import functools
import struct
from hashlib import blake2b

NAMESPACE_PREFIX = b"pfxcache-namespace\0"
HASH_BYTES = 8


@functools.lru_cache(maxsize=4096)
def namespace_seed(namespace: bytes) -> bytes:
    """The chain's starting value for ``namespace`` (the 'hash' of the empty prefix), 8 bytes."""
    return blake2b(NAMESPACE_PREFIX + namespace, digest_size=8).digest()


def chain(parent: bytes, pages: bytes, page_bytes: int) -> bytes:
    """Packed hashes of consecutive whole pages of packed tokens following a page whose hash is ``parent``."""
    out = []
    append = out.append
    for pos in range(0, len(pages), page_bytes):
        parent = blake2b(parent + pages[pos : pos + page_bytes], digest_size=8).digest()
        append(parent)
    return b"".join(out)


@functools.lru_cache(maxsize=256)
def _layout(count: int) -> struct.Struct:
    return struct.Struct(f">{count}Q")


def to_ints(packed: bytes) -> list[int]:
    """Packed hashes as the unsigned integers the wire carries."""
    return list(_layout(len(packed) // HASH_BYTES).unpack(packed))


def prompt_hashes(namespace: bytes, tokens: bytes, page_bytes: int) -> list[int]:
    """The hash of every whole page of ``tokens`` (packed uint32) in ``namespace``, from the first page."""
    whole = len(tokens) - len(tokens) % page_bytes
    return to_ints(chain(namespace_seed(namespace), tokens[:whole], page_bytes))


def node_hashes(node) -> bytes:
    """The packed hashes of radix ``node``'s pages, computed from its ancestors' when not cached."""
    pending = []
    while node.parent is not None and node.page_hashes is None:
        pending.append(node)
        node = node.parent
    value = node.page_hashes[-HASH_BYTES:] if node.parent is not None else namespace_seed(node.tree.scope)
    for below in reversed(pending):
        below.page_hashes = chain(value, below.key, below.tree.page_bytes)
        value = below.page_hashes[-HASH_BYTES:]
    return pending[0].page_hashes if pending else node.page_hashes


def parent_hash(node) -> bytes | None:
    """The hash of the page before ``node``'s first page; None when it starts a prompt."""
    parent = node.parent
    return None if parent.parent is None else node_hashes(parent)[-HASH_BYTES:]
