"""Workers' side of the ``cuda`` arena: open the daemon's CUDA IPC handle, move blocks on the device.

A daemon started with ``arena cuda`` keeps every block in one ``cudaMalloc``
allocation on GPU ``arena-device`` and publishes its IPC handle in
``PFXINFO``'s ``arena`` map (``backend`` ``cuda``, ``device``, ``handle`` -- 64
bytes, ``size``, ``block_bytes``, ``nblocks``, ``pid``). :func:`attach_cuda`
opens it in this process with ``cudaIpcOpenMemHandle`` and wraps it as a CuPy
``uint8`` array of shape ``(nblocks, block_bytes)``; KV data then moves between
the arena and the worker's own tensors with device-to-device copies only::

    arena = attach_cuda(info)      # info: PFXINFO's arena map, str keys, handle as raw bytes
    # a writer: PFXALLOC key 4 -> lease, blocks (fresh, pinned for it)
    arena.write_from(blocks, kv_pages)            # a torch CUDA tensor or a CuPy array
    # PFXSET key PACKED tokens BLOCKS *blocks     -> the pages are cached
    # a reader: PFXGET key PACKED tokens          -> matched, lease, blocks
    arena.read_into(blocks, kv_out)               # device to device, zero host copies
    # PFXRELEASE lease
    arena.close()

Rules of CUDA IPC that apply:

* A handle cannot be opened in the process that exported it: the daemon
  itself never attaches (it copies host bytes for ``PFXGET WITHDATA`` and
  ``PFXSET DATA``), and :func:`attach_cuda` refuses when ``pid`` is this
  process.
* A process opens a given handle once per device context; close the view
  before the daemon exits -- memory freed by the exporter while still mapped
  here is undefined behaviour.
* The mapping is opened on the arena's device unless ``device`` says
  otherwise (``cudaIpcMemLazyEnablePeerAccess`` lets another device of the
  host map it when peer access is possible).

``read_into``/``write_from`` also take host buffers (numpy arrays, CPU
tensors, bytes-like): then they copy device to host or host to device, like
the shm view's do for GPU tensors, so the two views are interchangeable.

Copies run on CuPy's current stream. ``write_from`` and ``read_into``
synchronise it before returning unless ``sync=False``, so that once
``write_from`` returns the blocks may be handed over with ``PFXSET ...
BLOCKS``: the daemon and other workers see the bytes. When the tensors come
from torch work on a non-default torch stream, make that stream CuPy's current
one (``cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)``) or
synchronise it first.

Copies are one ``cudaMemcpyAsync`` per run of consecutive block ids when the
ids form few runs (the allocator hands out runs), else one gather or scatter
kernel over the blocks seen as the widest unsigned words their size and
alignment allow.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pfxcache.cuda_ipc import blocks_from_host, blocks_to_host, check_handle, contiguous_runs, count_runs

__all__ = ["CudaArenaInfo", "CudaArenaView", "attach_cuda", "parse_arena_info", "word_bytes"]

#: At most this many runs of consecutive ids are copied device to device one cudaMemcpyAsync each.
MAX_DIRECT_RUNS = 32

#: DLPack's device type of CUDA memory (kDLCUDA).
DLPACK_CUDA = 2


@dataclass(frozen=True)
class CudaArenaInfo:
    """What a worker needs to open the arena, checked (see :func:`parse_arena_info`)."""

    device: int
    handle: bytes
    size: int
    block_bytes: int
    nblocks: int
    pid: int


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _field(info: Mapping, name: str) -> Any:
    for key in (name, name.encode(), name.replace("_", "-"), name.replace("_", "-").encode()):
        if key in info:
            return info[key]
    raise ValueError(f"the arena map has no '{name}' (is this PFXINFO's arena map?)")


def _int_field(info: Mapping, name: str, low: int) -> int:
    raw = _field(info, name)
    try:
        value = int(raw)  # ints, or b"123" from a RESP2 reply read as strings
    except (TypeError, ValueError):
        raise ValueError(f"arena '{name}' must be an integer, got {raw!r}") from None
    if value < low:
        raise ValueError(f"arena '{name}' must be >= {low}, got {value}")
    return value


def _handle_bytes(handle: Any) -> Any:
    # A reply decoder may have turned the handle into text when its bytes happened to be valid
    # UTF-8 (all ASCII, say): encoding it back gives exactly the same bytes.
    return handle.encode("utf-8", "surrogateescape") if isinstance(handle, str) else handle


def parse_arena_info(info: Mapping) -> CudaArenaInfo:
    """Check PFXINFO's ``arena`` map of a ``cuda`` arena and return its fields.

    Keys may be ``str`` or ``bytes``; ``handle`` must be the raw 64 bytes (read
    PFXINFO without ``decode_responses``; a ``str`` that a decoder made of valid
    UTF-8 is encoded back). Raises ValueError or TypeError.
    """
    if not isinstance(info, Mapping):
        raise TypeError(f"the arena map must be a mapping, not {type(info).__name__}")
    backend = _text(_field(info, "backend"))
    if backend != "cuda":
        raise ValueError(f"the arena is '{backend}', not 'cuda'")
    parsed = CudaArenaInfo(
        device=_int_field(info, "device", 0),
        handle=check_handle(_handle_bytes(_field(info, "handle"))),
        size=_int_field(info, "size", 1),
        block_bytes=_int_field(info, "block_bytes", 1),
        nblocks=_int_field(info, "nblocks", 1),
        pid=_int_field(info, "pid", 0),
    )
    if parsed.size != parsed.block_bytes * parsed.nblocks:
        raise ValueError(
            f"arena size {parsed.size} != nblocks {parsed.nblocks} x block_bytes {parsed.block_bytes}"
        )
    return parsed


def block_index(ids: Iterable[int], nblocks: int) -> np.ndarray:
    """Block ids as a flat int64 array, each in 0..nblocks-1 (CuPy would wrap bad ids around)."""
    if isinstance(ids, (int, np.integer)):
        raise TypeError("block ids must be a sequence of ints, not one int")
    idx = np.asarray(ids if isinstance(ids, (list, tuple, np.ndarray)) else list(ids))
    if idx.size == 0:
        return np.empty(0, np.int64)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise ValueError("block ids must be a flat sequence of integers")
    idx = idx.astype(np.int64, copy=False)
    if int(idx.min()) < 0 or int(idx.max()) >= nblocks:
        raise ValueError(f"block id out of range 0..{nblocks - 1}")
    return idx


def word_bytes(block_bytes: int, *pointers: int) -> int:
    """The widest word (8, 4, 2 or 1 bytes) dividing ``block_bytes`` and every pointer.

    Gather/scatter kernels then move one word per thread instead of one byte.
    """
    for size in (8, 4, 2):
        if block_bytes % size == 0 and all(ptr % size == 0 for ptr in pointers):
            return size
    return 1


def _import_cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise ImportError(
            "the cuda arena needs CuPy in the worker: pip install pfxcache[cuda12] or [cuda13]"
        ) from exc
    return cupy


class CudaArenaView:
    """The daemon's cuda arena opened in this process (use :func:`attach_cuda`)."""

    backend = "cuda"

    def __init__(self, info: CudaArenaInfo, *, device: int | None = None, cupy: Any = None) -> None:
        if info.pid == os.getpid():
            raise ValueError(
                "CUDA IPC cannot open a memory handle in the process that exported it "
                f"(pid {info.pid}): attach from a worker process"
            )
        cp = cupy if cupy is not None else _import_cupy()
        self._cp = cp
        self.info = info
        self.block_bytes = info.block_bytes
        self.nblocks = info.nblocks
        self.size = info.size
        self.device = info.device if device is None else device
        self._ptr = None
        with cp.cuda.Device(self.device):
            start = time.perf_counter()
            # Returns the device pointer (an int) of the mapping in this process.
            ptr = int(cp.cuda.runtime.ipcOpenMemHandle(info.handle))
            self.attach_seconds = time.perf_counter() - start
        self._ptr = ptr
        # owner=None: the mapping's lifetime is this view's (close()), not the arrays'.
        mem = cp.cuda.UnownedMemory(ptr, info.size, None, self.device)
        self.array = cp.ndarray((info.nblocks, info.block_bytes), dtype=cp.uint8,
                                memptr=cp.cuda.MemoryPointer(mem, 0))

    # --- views ------------------------------------------------------------

    @property
    def ptr(self) -> int:
        """The device address of block 0 in this process."""
        self._check_open()
        return self._ptr

    def _check_open(self) -> None:
        if self._ptr is None:
            raise ValueError("the cuda arena view is closed")

    def _index(self, ids: Iterable[int]) -> np.ndarray:
        self._check_open()
        return block_index(ids, self.nblocks)

    def block(self, block_id: int):
        """A writable CuPy view ``(block_bytes,)`` of one block."""
        self._check_open()
        if not 0 <= int(block_id) < self.nblocks:
            raise ValueError(f"block id {block_id} out of range 0..{self.nblocks - 1}")
        return self.array[int(block_id)]

    def blocks(self, ids: Iterable[int] | int):
        """The blocks ``ids`` as a CuPy ``(len(ids), block_bytes)`` uint8 array (an int: one 1-D block).

        A writable zero-copy view of the arena when the ids are one run of
        consecutive ids, else a gathered copy (writing to it does not change the
        arena: use :meth:`write_from`).
        """
        if isinstance(ids, (int, np.integer)):
            return self.block(ids)
        idx = self._index(ids)
        cp = self._cp
        with cp.cuda.Device(self.device):
            if count_runs(idx) <= 1:
                first = int(idx[0]) if idx.size else 0
                return self.array[first:first + idx.size]
            return cp.take(self.array, cp.asarray(idx), axis=0)

    def torch_blocks(self, ids: Iterable[int] | int):
        """:meth:`blocks` as a torch CUDA tensor, through DLPack (no copy of its own)."""
        import torch.utils.dlpack

        return torch.utils.dlpack.from_dlpack(self.blocks(ids))

    # --- copies -----------------------------------------------------------

    def _on_device(self, tensor: Any) -> bool:
        """True for CuPy arrays and CUDA tensors (DLPack), False for host buffers; checks the device."""
        cp = self._cp
        if isinstance(tensor, cp.ndarray):
            device_id = int(tensor.device.id)
        elif hasattr(tensor, "__dlpack_device__"):
            device_type, device_id = tensor.__dlpack_device__()
            if int(device_type) != DLPACK_CUDA:
                return False  # kDLCPU (numpy, CPU torch tensors): a host buffer
        else:
            return False
        if int(device_id) != self.device:
            raise ValueError(f"the tensor is on device {int(device_id)}, the arena on device {self.device}")
        return True

    def _device_bytes(self, tensor: Any, what: str):
        """A device tensor (any dtype, C-contiguous) as a flat uint8 CuPy view."""
        cp = self._cp
        array = tensor if isinstance(tensor, cp.ndarray) else cp.from_dlpack(tensor)
        if not array.flags.c_contiguous:
            raise ValueError(f"{what} must be C-contiguous")
        return array.reshape(-1).view(cp.uint8)

    @staticmethod
    def _host_bytes(buffer: Any, what: str, writable: bool) -> np.ndarray:
        """A host buffer (numpy array, CPU torch tensor, bytes-like) as a flat uint8 numpy view."""
        if hasattr(buffer, "numpy") and hasattr(buffer, "is_contiguous"):  # a CPU torch tensor
            if not buffer.is_contiguous():
                raise ValueError(f"{what} must be contiguous")
            buffer = buffer.detach().numpy()
        if isinstance(buffer, np.ndarray):
            if not buffer.flags.c_contiguous:
                raise ValueError(f"{what} must be C-contiguous")
            flat = buffer.reshape(-1).view(np.uint8)
        else:
            try:
                flat = np.frombuffer(memoryview(buffer).cast("B"), dtype=np.uint8)
            except TypeError:
                raise TypeError(
                    f"{what} must be a CuPy array, a tensor with __dlpack__ or a host buffer, "
                    f"not {type(buffer).__name__}"
                ) from None
        if writable and not flat.flags.writeable:
            raise ValueError(f"{what} is read-only")
        return flat

    def _words(self, matrix):
        """The arena and ``matrix`` seen as the widest words both allow (same row count)."""
        size = word_bytes(self.block_bytes, self._ptr, int(matrix.data.ptr))
        dtype = {8: self._cp.uint64, 4: self._cp.uint32, 2: self._cp.uint16, 1: self._cp.uint8}[size]
        return self.array.view(dtype), matrix.view(dtype)

    def read_into(self, ids: Iterable[int], out: Any, *, sync: bool = True) -> int:
        """Copy blocks ``ids``, in order, into the start of ``out``; returns the bytes copied.

        ``out``: a C-contiguous CuPy array or torch CUDA tensor on the arena's
        device (device to device, zero host copies), or a host buffer (numpy
        array, CPU tensor, bytearray: one device-to-host copy), of any dtype,
        holding at least ``len(ids) * block_bytes`` bytes. Device copies are
        asynchronous on CuPy's current stream when ``sync=False``.
        """
        idx = self._index(ids)
        n = idx.size * self.block_bytes
        cp = self._cp
        with cp.cuda.Device(self.device):
            on_device = self._on_device(out)
            dest = self._device_bytes(out, "out") if on_device else self._host_bytes(out, "out", True)
            if dest.size < n:
                raise ValueError(f"out holds {dest.size} bytes, {idx.size} blocks need {n}")
            if n == 0:
                return 0
            if not on_device:
                blocks_to_host(cp, self.array, self._ptr, idx, dest[:n])
                return n
            dest = dest[:n].reshape(idx.size, self.block_bytes)
            stream = cp.cuda.get_current_stream()
            if count_runs(idx) <= MAX_DIRECT_RUNS:
                runtime, bb, base = cp.cuda.runtime, self.block_bytes, int(dest.data.ptr)
                for first, count, pos in contiguous_runs(idx):
                    runtime.memcpyAsync(base + pos * bb, self._ptr + first * bb, count * bb,
                                        runtime.memcpyDefault, stream.ptr)
            else:
                arena, dest_words = self._words(dest)
                cp.take(arena, cp.asarray(idx), axis=0, out=dest_words)
            if sync:
                stream.synchronize()
        return n

    def write_from(self, ids: Iterable[int], src: Any, *, sync: bool = True) -> int:
        """Copy ``src`` (exactly ``len(ids) * block_bytes`` bytes) into blocks ``ids``, in order;
        returns the bytes copied.

        ``src``: a C-contiguous CuPy array or torch CUDA tensor on the arena's
        device, or a host buffer (numpy array, CPU tensor, bytes-like), any
        dtype. Synchronises before returning unless ``sync=False`` (device
        sources only): then the blocks can be handed over with ``PFXSET ... BLOCKS``.
        """
        idx = self._index(ids)
        n = idx.size * self.block_bytes
        cp = self._cp
        with cp.cuda.Device(self.device):
            on_device = self._on_device(src)
            source = self._device_bytes(src, "src") if on_device else self._host_bytes(src, "src", False)
            if source.size != n:
                raise ValueError(f"src is {source.size} bytes, {idx.size} blocks x {self.block_bytes} bytes take {n}")
            if n == 0:
                return 0
            if count_runs(idx) > MAX_DIRECT_RUNS and np.unique(idx).size != idx.size:
                raise ValueError("block ids repeat: which copy lands would be undefined")
            if not on_device:
                blocks_from_host(cp, self.array, self._ptr, idx, source)
                return n
            source = source.reshape(idx.size, self.block_bytes)
            stream = cp.cuda.get_current_stream()
            if count_runs(idx) <= MAX_DIRECT_RUNS:
                runtime, bb, base = cp.cuda.runtime, self.block_bytes, int(source.data.ptr)
                for first, count, pos in contiguous_runs(idx):
                    runtime.memcpyAsync(self._ptr + first * bb, base + pos * bb, count * bb,
                                        runtime.memcpyDefault, stream.ptr)
            else:
                arena, source_words = self._words(source)
                arena[cp.asarray(idx)] = source_words
            if sync:
                stream.synchronize()
        return n

    # --- lifetime ---------------------------------------------------------

    def close(self) -> None:
        """Unmap the arena (``cudaIpcCloseMemHandle``); arrays from this view become invalid."""
        if self._ptr is None:
            return
        ptr, self._ptr = self._ptr, None
        self.array = None
        cp = self._cp
        with cp.cuda.Device(self.device):
            cp.cuda.runtime.deviceSynchronize()  # nothing in flight still reads or writes the mapping
            cp.cuda.runtime.ipcCloseMemHandle(ptr)

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def __enter__(self) -> CudaArenaView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else f"0x{self._ptr:x}"
        return (f"<CudaArenaView device={self.device} {self.nblocks} x {self.block_bytes} bytes "
                f"at {state} (daemon pid {self.info.pid})>")


def attach_cuda(arena_info: Mapping, *, device: int | None = None, cupy: Any = None) -> CudaArenaView:
    """Open the daemon's cuda arena (PFXINFO's ``arena`` map) in this process.

    ``device`` defaults to the arena's own device. Raises ValueError for a map
    that is not a usable cuda arena (or when called in the daemon's own
    process), ImportError without CuPy, and CuPy's CUDARuntimeError when the
    driver refuses the handle.
    """
    return CudaArenaView(parse_arena_info(arena_info), device=device, cupy=cupy)

