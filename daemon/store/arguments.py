"""Validation of the store's arguments: every public store method checks them before changing anything.

Each check returns the value in the store's own form (bytes names, packed
token bytes, ints) or raises BadRequest with a reason a client can read.
"""

from __future__ import annotations

from array import array

from .errors import BadRequest

TOKEN_BYTES = 4  # tokens are packed little-endian uint32s


def namespace_name(ns) -> bytes:
    """A namespace as bytes (the store's key type)."""
    if isinstance(ns, bytes):
        return ns
    if isinstance(ns, (bytearray, memoryview)):
        return bytes(ns)
    raise BadRequest("the namespace must be bytes")


def packed_tokens(tokens) -> bytes:
    """Tokens as packed little-endian uint32 bytes (bytes-like or a 4-byte ``array``)."""
    if isinstance(tokens, bytes):
        data = tokens
    elif isinstance(tokens, array):
        if tokens.itemsize != TOKEN_BYTES:
            raise BadRequest("token arrays must hold 4-byte unsigned ints")
        data = tokens.tobytes()
    elif isinstance(tokens, (bytearray, memoryview)):
        data = bytes(tokens)
    else:
        raise BadRequest("tokens must be packed little-endian uint32 bytes")
    if len(data) % TOKEN_BYTES:
        raise BadRequest(f"token data of {len(data)} bytes is not a whole number of uint32 tokens")
    return data


def integer(value, what: str, lo: int, hi: int | None = None) -> int:
    """``value`` when it is an int (not a bool) in lo..hi (hi None: no upper bound)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise BadRequest(f"{what} must be an integer {bound}, got {value!r}")
    return value


def page_span(tokens: bytes, offset, page_size: int) -> tuple[int, int]:
    """(whole pages in ``tokens``, pages before ``offset``); the offset must fall on a page boundary."""
    page_bytes = page_size * TOKEN_BYTES
    npages = len(tokens) // page_bytes
    offset = integer(offset, "the offset", 0)
    if offset % page_size:
        raise BadRequest(f"offset {offset} is not a multiple of the page size {page_size}")
    if offset > npages * page_size:
        raise BadRequest(f"offset {offset} is beyond the {npages * page_size} tokens of whole pages")
    return npages, offset // page_size
