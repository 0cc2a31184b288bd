"""Page idents: the 128-bit name of a cached page that the disk tier and the snapshots key pages by.

Definition (stable across releases and hosts)::

    seed(namespace)      = blake2b(b"pfxcache-namespace\\0" + namespace, digest_size=16)
    ident(page 0)        = blake2b(seed(namespace) + page 0 tokens, digest_size=16, person=b"pfx-tier-v1")
    ident(page i), i > 0 = blake2b(ident(page i - 1) + page i tokens, digest_size=16, person=b"pfx-tier-v1")

where a page's tokens are its packed uint32 ids (the store's format). An ident therefore names
the namespace and every token up to the end of its page: a record found under an ident is that
page of that prompt in that namespace, and a lookup that walks idents from the end of its RAM match
can never step over a page that is not there (the prefix property across tiers). 128 bits, not the
64 of the KV events' block hashes (block_hashes.py): a durable tier keys millions of pages for
years, and a collision there would serve a wrong byte.

Each radix node caches its pages' idents (``Node.idents``, 16 bytes per page, None until first
needed), computed from its parent's last ident; ``RadixTree.split`` and ``trim`` keep the cache
in step. Only pages that reach a tier, or a lookup that goes past the RAM match, compute them:
with the tier off nothing here runs.
"""

from __future__ import annotations

import functools
from hashlib import blake2b

IDENT_BYTES = 16
PERSON = b"pfx-tier-v1"
NAMESPACE_PREFIX = b"pfxcache-namespace\0"


@functools.lru_cache(maxsize=4096)
def namespace_ident(namespace: bytes) -> bytes:
    """The ident the first page of a namespace chains from."""
    return blake2b(NAMESPACE_PREFIX + namespace, digest_size=IDENT_BYTES).digest()


def page_ident(parent: bytes, tokens: bytes) -> bytes:
    """A page's ident from its parent's and its own packed tokens."""
    return blake2b(parent + tokens, digest_size=IDENT_BYTES, person=PERSON).digest()


def chain(parent: bytes, pages: bytes, page_bytes: int) -> bytes:
    """Packed idents of consecutive whole pages of packed tokens following the page ``parent`` names."""
    out = []
    append = out.append
    for pos in range(0, len(pages), page_bytes):
        parent = blake2b(parent + pages[pos : pos + page_bytes], digest_size=IDENT_BYTES, person=PERSON).digest()
        append(parent)
    return b"".join(out)


def node_idents(node) -> bytes:
    """The packed idents of radix ``node``'s pages, computed from its ancestors' when not cached."""
    pending = []
    while node.parent is not None and node.idents is None:
        pending.append(node)
        node = node.parent
    value = node.idents[-IDENT_BYTES:] if node.parent is not None else namespace_ident(node.tree.scope)
    for below in reversed(pending):
        below.idents = chain(value, below.key, below.tree.page_bytes)
        value = below.idents[-IDENT_BYTES:]
    return pending[0].idents if pending else node.idents


def ident_before(node, page: int) -> bytes:
    """The ident of the page before ``node``'s page number ``page`` (a namespace's seed before its
    first page)."""
    if page > 0:
        return node_idents(node)[(page - 1) * IDENT_BYTES : page * IDENT_BYTES]
    parent = node.parent
    if parent.parent is None:
        return namespace_ident(node.tree.scope)
    return node_idents(parent)[-IDENT_BYTES:]


def split_idents(packed: bytes) -> list[bytes]:
    """Packed idents as a list of 16-byte strings."""
    return [packed[i : i + IDENT_BYTES] for i in range(0, len(packed), IDENT_BYTES)]


def key_page_ident(namespace: bytes, page: bytes) -> bytes:
    """The ident of a key page (one page of packed key digest) in the shared tier: the one it would
    have as its namespace's first page, wherever it sits in a run. Its parent is the namespace's seed."""
    return page_ident(namespace_ident(namespace), page)
