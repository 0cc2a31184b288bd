"""What both ends of a CUDA arena share: block ids in runs, the IPC handle, host <-> device copies.

The daemon (``pfxcache.daemon.store.cuda_arena``) and a worker (``pfxcache.client.cuda``) copy blocks
between host memory and the arena's one device allocation the same way, so the routines live here,
below both: nothing here imports the daemon, the client or CuPy (the caller passes its ``cupy``
module in).

Copies go per contiguous run of block ids (one ``cudaMemcpyAsync`` each) when the ids form a few
runs -- the common case, as the allocator hands out runs -- and otherwise through one staging buffer
on the device and one gather or scatter kernel, on CuPy's current stream, which is synchronised
before returning. The caller makes the blocks' device current.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Bytes of a ``cudaIpcMemHandle_t``.
IPC_HANDLE_BYTES = 64

#: At most this many contiguous runs are copied one ``cudaMemcpy`` each; more go
#: through a staging buffer and one gather/scatter kernel.
MAX_DIRECT_RUNS = 16


def contiguous_runs(idx: np.ndarray) -> list[tuple[int, int, int]]:
    """Split block ids into runs of consecutive ids: ``(first_id, count, position in idx)``.

    ``[4, 5, 6, 9, 2, 3]`` -> ``[(4, 3, 0), (9, 1, 3), (2, 2, 4)]``. Vectorised:
    one ``np.diff``, no Python loop over the ids.
    """
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size == 0:
        return []
    starts = np.flatnonzero(np.diff(idx) != 1) + 1
    starts = np.concatenate(([0], starts))
    ends = np.concatenate((starts[1:], [idx.size]))
    return [(int(idx[s]), int(e - s), int(s)) for s, e in zip(starts.tolist(), ends.tolist())]


def count_runs(idx: np.ndarray) -> int:
    """How many runs :func:`contiguous_runs` would return, without building them."""
    idx = np.asarray(idx, dtype=np.int64)
    return 0 if idx.size == 0 else int(np.count_nonzero(np.diff(idx) != 1)) + 1


def check_handle(handle: Any) -> bytes:
    """A CUDA IPC memory handle as the exact 64 ``bytes`` CuPy's runtime calls take."""
    if isinstance(handle, str):
        raise TypeError("the IPC handle is binary: read PFXINFO without decode_responses")
    if not isinstance(handle, (bytes, bytearray, memoryview)):
        raise TypeError(f"the IPC handle must be bytes, not {type(handle).__name__}")
    handle = bytes(handle)
    if len(handle) != IPC_HANDLE_BYTES:
        raise ValueError(f"a CUDA IPC handle is {IPC_HANDLE_BYTES} bytes, got {len(handle)}")
    return handle


def blocks_to_host(cp: Any, blocks: Any, base_ptr: int, idx: np.ndarray, dest: np.ndarray) -> None:
    """Copy device blocks ``idx`` of ``blocks`` (an (nblocks, block_bytes) uint8 CuPy array at
    ``base_ptr``) into the C-contiguous host uint8 array ``dest`` (exactly len(idx) blocks), in order.

    One ``cudaMemcpyAsync`` per run of consecutive ids when they are few, else one gather into a
    device staging buffer and one copy; on CuPy's current stream, which is synchronised before
    returning (the host bytes are complete). Call it with the blocks' device current.
    """
    runtime, stream = cp.cuda.runtime, cp.cuda.get_current_stream()
    bb = blocks.shape[1]
    if count_runs(idx) <= MAX_DIRECT_RUNS:
        base = dest.ctypes.data
        for first, count, pos in contiguous_runs(idx):
            runtime.memcpyAsync(base + pos * bb, base_ptr + first * bb, count * bb,
                                runtime.memcpyDeviceToHost, stream.ptr)
    else:
        staged = cp.take(blocks, cp.asarray(idx), axis=0)
        runtime.memcpyAsync(dest.ctypes.data, int(staged.data.ptr), idx.size * bb,
                            runtime.memcpyDeviceToHost, stream.ptr)
    stream.synchronize()  # also keeps `staged` alive until the copy is done


def blocks_from_host(cp: Any, blocks: Any, base_ptr: int, idx: np.ndarray, src: np.ndarray) -> None:
    """Copy the C-contiguous host uint8 array ``src`` (exactly len(idx) blocks) into device blocks
    ``idx``, in order; the counterpart of :func:`blocks_to_host`. Ids that repeat are refused
    (ValueError) where they would go through the scatter. Synchronises before returning:
    a copy from pageable memory may return before the DMA lands, and other processes read the
    blocks as soon as they are handed over."""
    runtime, stream = cp.cuda.runtime, cp.cuda.get_current_stream()
    bb = blocks.shape[1]
    if count_runs(idx) <= MAX_DIRECT_RUNS:
        base = src.ctypes.data
        for first, count, pos in contiguous_runs(idx):
            runtime.memcpyAsync(base_ptr + first * bb, base + pos * bb, count * bb,
                                runtime.memcpyHostToDevice, stream.ptr)
    else:
        if np.unique(idx).size != idx.size:
            raise ValueError("block ids repeat: which copy lands would be undefined")
        staged = cp.empty((idx.size, bb), dtype=cp.uint8)
        runtime.memcpyAsync(int(staged.data.ptr), src.ctypes.data, idx.size * bb,
                            runtime.memcpyHostToDevice, stream.ptr)
        blocks[cp.asarray(idx)] = staged
    stream.synchronize()
