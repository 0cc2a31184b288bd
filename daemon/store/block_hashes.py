"""Stable block hashes: one 64-bit id per cached page, chained over the namespace and the tokens.

The definition (documented in the README, stable across releases and hosts,
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

Hashes are cached on radix nodes (``Node.block_hash``: the hash of the node's
last page, ``None`` until first needed); the hashes of a node's other pages
are recomputed from its parent's, which costs one blake2b call (~0.5 us) per
page. Nothing here runs unless KV events are on.
"""

from __future__ import annotations

from hashlib import blake2b

NAMESPACE_PREFIX = b"pfxcache-namespace\0"


def namespace_seed(namespace: bytes) -> int:
    """The chain's starting value for ``namespace`` (the 'hash' of the empty prefix)."""
    return int.from_bytes(blake2b(NAMESPACE_PREFIX + namespace, digest_size=8).digest(), "big")


def chain(parent: int, pages: bytes, page_bytes: int) -> list[int]:
    """Hashes of consecutive whole pages of packed tokens following a page whose hash is ``parent``."""
    out = []
    for pos in range(0, len(pages), page_bytes):
        parent = int.from_bytes(
            blake2b(parent.to_bytes(8, "big") + pages[pos : pos + page_bytes], digest_size=8).digest(), "big"
        )
        out.append(parent)
    return out


def prompt_hashes(namespace: bytes, tokens: bytes, page_bytes: int) -> list[int]:
    """The hash of every whole page of ``tokens`` (packed uint32) in ``namespace``, from the first page."""
    whole = len(tokens) - len(tokens) % page_bytes
    return chain(namespace_seed(namespace), tokens[:whole], page_bytes)


def end_hash(node) -> int:
    """The hash of the last page of radix ``node`` (the namespace seed for a root), cached on the nodes."""
    pending = []
    while node.parent is not None and node.block_hash is None:
        pending.append(node)
        node = node.parent
    value = node.block_hash if node.parent is not None else namespace_seed(node.tree.scope)
    page_bytes = node.tree.page_bytes
    for below in reversed(pending):
        value = chain(value, below.key, page_bytes)[-1]
        below.block_hash = value
    return value


def parent_hash(node) -> int:
    """The hash of the page before ``node``'s first page (the namespace seed below the root)."""
    return end_hash(node.parent)


def node_hashes(node) -> list[int]:
    """The hash of every page of radix ``node``, in order (and caches the last one)."""
    hashes = chain(parent_hash(node), node.key, node.tree.page_bytes)
    if hashes:
        node.block_hash = hashes[-1]
    return hashes
