"""Argument building for the PFX* commands: everything a request needs, nothing sent.

Tokens always travel ``PACKED`` (one bulk string of little-endian uint32s):
one argument instead of thousands of decimal strings. They are validated here,
before anything is sent, so a bad id never reaches the daemon half-encoded.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

import numpy as np

UINT32_MAX = 2**32 - 1
_LE_U32 = np.dtype("<u4")


def _torch_tensor(value: Any) -> bool:
    # Checked through sys.modules so that torch is never imported by us: if the
    # caller has a tensor, torch is already loaded.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def pack_tokens(tokens: Any) -> bytes:
    """Token ids as the PACKED blob: little-endian uint32s.

    Accepts a sequence of ints (list, tuple, range), ``array.array`` of an
    integer type, a 1-D numpy integer array or a 1-D torch integer tensor (any
    device). Raises ValueError for ids outside 0..2**32-1 or a non-flat input,
    TypeError for non-integer input (floats, bools, bytes).
    """
    if isinstance(tokens, (bytes, bytearray, memoryview, str)):
        raise TypeError(
            "tokens must be a sequence of integer ids, not bytes or str "
            "(for an already packed blob pass numpy.frombuffer(blob, '<u4'))"
        )
    if _torch_tensor(tokens):
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or str(tokens.dtype) == "torch.bool":
            raise TypeError(f"token ids must be integers, got a tensor of {tokens.dtype}")
        tokens = tokens.detach().cpu().numpy()
    elif isinstance(tokens, array):
        if tokens.typecode in "fdu":
            raise TypeError(f"token ids must be integers, got array('{tokens.typecode}')")
        tokens = np.frombuffer(tokens, dtype=tokens.typecode) if len(tokens) else np.empty(0, np.uint32)
    if isinstance(tokens, np.ndarray):
        values = tokens
    else:
        if not isinstance(tokens, (list, tuple, range)):
            try:
                tokens = list(tokens)
            except TypeError:
                raise TypeError(f"tokens must be a sequence of integer ids, got {type(tokens).__name__}") from None
        if len(tokens) == 0:
            return b""
        try:
            values = np.asarray(tokens)
        except (OverflowError, ValueError):
            values = np.asarray(tokens, dtype=object)
    if values.ndim != 1:
        raise ValueError(f"tokens must be one-dimensional, got shape {values.shape}")
    if values.size == 0:
        return b""
    kind = values.dtype.kind
    if kind == "O":
        # Python ints beyond int64/uint64, or mixed types: check one by one (rare path).
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"token ids must be integers, got {type(value).__name__}")
            if not 0 <= int(value) <= UINT32_MAX:
                raise ValueError(f"token id {int(value)} is not an unsigned 32-bit integer (0..{UINT32_MAX})")
        values = values.astype(np.uint64)
    elif kind not in "iu":
        raise TypeError(f"token ids must be integers, got {values.dtype}")
    if not (kind == "u" and values.dtype.itemsize <= 4):
        low, high = int(values.min()), int(values.max())
        if low < 0 or high > UINT32_MAX:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} is not an unsigned 32-bit integer (0..{UINT32_MAX})")
    return values.astype(_LE_U32, copy=False).tobytes()


def as_data(data: Any) -> bytes | memoryview:
    """A DATA blob from bytes-like objects, numpy arrays or torch tensors (their raw bytes, C order)."""
    if isinstance(data, (bytes, bytearray)):
        return data
    if _torch_tensor(data):
        flat = data.detach().contiguous().reshape(-1)
        return flat.view(sys.modules["torch"].uint8).cpu().numpy().tobytes()
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).tobytes()
    try:
        return memoryview(data).cast("B")
    except TypeError:
        raise TypeError(f"data must be bytes-like, a numpy array or a torch tensor, got {type(data).__name__}") from None


def _int(value: Any, what: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}")
    value = int(value)
    if value < low:
        raise ValueError(f"{what} must be >= {low}, got {value}")
    return value


def _block_ids(blocks: Any) -> list[int]:
    if isinstance(blocks, np.ndarray) or _torch_tensor(blocks):
        blocks = blocks.tolist()
    return [_int(b, "a block id") for b in blocks]


def pfxget(key: Any, packed: bytes, *, lease: bool = True, ttl_ms: int | None = None,
           with_data: bool = False) -> tuple:
    """``PFXGET key PACKED blob [NOLEASE] [TTL ms] [WITHDATA]``."""
    args: list[Any] = ["PFXGET", key, "PACKED", packed]
    if not lease:
        args.append("NOLEASE")
    if ttl_ms is not None:
        args += ["TTL", _int(ttl_ms, "ttl_ms", 1)]
    if with_data:
        args.append("WITHDATA")
    return tuple(args)


def pfxset_data(key: Any, packed: bytes, data: Any, offset: int = 0) -> tuple:
    """``PFXSET key PACKED blob [OFFSET n] DATA blob``."""
    args: list[Any] = ["PFXSET", key, "PACKED", packed]
    if offset:
        args += ["OFFSET", _int(offset, "offset")]
    return (*args, "DATA", as_data(data))


def pfxset_blocks(key: Any, packed: bytes, blocks: Any, offset: int = 0) -> tuple:
    """``PFXSET key PACKED blob [OFFSET n] BLOCKS id ...`` (blocks from this connection's PFXALLOC)."""
    args: list[Any] = ["PFXSET", key, "PACKED", packed]
    if offset:
        args += ["OFFSET", _int(offset, "offset")]
    return (*args, "BLOCKS", *_block_ids(blocks))


def page_keys(keys: Any) -> list[bytes]:
    """Page keys as HASHES sends them: a non-empty sequence of non-empty byte strings (str is UTF-8)."""
    if isinstance(keys, (bytes, bytearray, memoryview, str)):
        raise TypeError("keys must be a sequence of page keys (bytes), not one bytes or str")
    out = []
    for key in keys:
        if isinstance(key, str):
            key = key.encode()
        if not isinstance(key, (bytes, bytearray, memoryview)) or not len(key):
            raise TypeError(f"a page key must be non-empty bytes or str, got {type(key).__name__}")
        out.append(bytes(key))
    if not out:
        raise ValueError("at least one page key is needed")
    return out


def hashes_prompt(keys: list[bytes]) -> tuple:
    """``HASHES n k1 .. kn``: the prompt of a key-page command (keys from :func:`page_keys`)."""
    return ("HASHES", len(keys), *keys)


def pfxget_keys(key: Any, keys: list[bytes], *, lease: bool = True, ttl_ms: int | None = None,
                with_data: bool = False) -> tuple:
    """``PFXGET key HASHES n k1 .. kn [NOLEASE] [TTL ms] [WITHDATA]``."""
    args = list(pfxget(key, b"", lease=lease, ttl_ms=ttl_ms, with_data=with_data))
    return (*args[:2], *hashes_prompt(keys), *args[4:])


def pfxset_keys(key: Any, keys: list[bytes], *, data: Any = None, blocks: Any = None, offset: int = 0) -> tuple:
    """``PFXSET key HASHES n k1 .. kn [OFFSET m] (DATA blob | BLOCKS id ...)``; ``offset`` in keys."""
    args: list[Any] = ["PFXSET", key, *hashes_prompt(keys)]
    if offset:
        args += ["OFFSET", _int(offset, "offset")]
    if blocks is not None:
        return (*args, "BLOCKS", *_block_ids(blocks))
    return (*args, "DATA", as_data(data))


def pfxevict_keys(key: Any, keys: list[bytes]) -> tuple:
    """``PFXEVICT key HASHES n k1 .. kn``: the last key's page and every page linked below it."""
    return ("PFXEVICT", key, *hashes_prompt(keys))


def pfxalloc(key: Any, n: int, ttl_ms: int | None = None) -> tuple:
    """``PFXALLOC key n [TTL ms]``."""
    args: list[Any] = ["PFXALLOC", key, _int(n, "the number of blocks", 1)]
    if ttl_ms is not None:
        args += ["TTL", _int(ttl_ms, "ttl_ms", 1)]
    return tuple(args)


def pfxrelease(leases: list[int]) -> tuple:
    """``PFXRELEASE lease ...``."""
    return ("PFXRELEASE", *[_int(lease, "a lease id", 1) for lease in leases])


def pfxrenew(lease: int, ttl_ms: int | None = None) -> tuple:
    """``PFXRENEW lease [TTL ms]``."""
    args: list[Any] = ["PFXRENEW", _int(lease, "a lease id", 1)]
    if ttl_ms is not None:
        args += ["TTL", _int(ttl_ms, "ttl_ms", 1)]
    return tuple(args)


def pfxevict(key: Any, *, packed: bytes | None = None, pages: int | None = None, nbytes: int | None = None,
             all_: bool = False) -> tuple:
    """``PFXEVICT key (PACKED blob|PAGES n|BYTES n|ALL)``: exactly one mode."""
    modes = [packed is not None, pages is not None, nbytes is not None, bool(all_)]
    if sum(modes) != 1:
        raise ValueError("evict() needs exactly one of tokens=, pages=, bytes= or all=True")
    if packed is not None:
        return ("PFXEVICT", key, "PACKED", packed)
    if pages is not None:
        return ("PFXEVICT", key, "PAGES", _int(pages, "pages"))
    if nbytes is not None:
        return ("PFXEVICT", key, "BYTES", _int(nbytes, "bytes"))
    return ("PFXEVICT", key, "ALL")


def pfxinfo(key: Any = None) -> tuple:
    """``PFXINFO [key]``."""
    return ("PFXINFO",) if key is None else ("PFXINFO", key)
