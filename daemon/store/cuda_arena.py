"""The ``cuda`` arena: one plain device allocation on a GPU, shared through CUDA IPC.

The daemon allocates ``nblocks * block_bytes`` bytes with ``cudaMalloc`` (a
:class:`cupy.cuda.Memory`: device memory, never managed memory, never carved
out of CuPy's memory pool, so the pointer is the base of its own allocation as
``cudaIpcGetMemHandle`` requires) and exports it with
``cupy.cuda.runtime.ipcGetMemHandle``: a 64-byte handle that ``describe()``
(and so ``PFXINFO``'s ``arena`` map, as a bulk string) carries along with the
device, the size, the geometry and the pid of the exporting process. Any CUDA
process on the host -- CuPy (:func:`pfxcache.client.cuda.attach_cuda`), torch,
C++ with ``cudaIpcOpenMemHandle`` -- opens it and reads or writes blocks on the
device, zero-copy. CUDA IPC cannot open a handle in the process that exported
it, so the daemon itself goes through ``read``/``write`` (host bytes, for
``PFXGET WITHDATA`` and ``PFXSET DATA``).

Nothing here imports CuPy at module level: importing the daemon or running the
tests never needs it. :func:`load_cupy` imports it when an arena is created and
turns every reason it cannot work (no CuPy, no driver, no such device) into a
:class:`CudaUnavailable` -- a ``ValueError``, which the server reports as a
startup error.

Copies and visibility. Host <-> device copies go per contiguous run of block
ids (one ``cudaMemcpyAsync`` each) when the ids form a few runs -- the common
case, as the allocator hands out runs -- and otherwise through one staging
buffer on the device and one gather or scatter kernel, on CuPy's current stream,
which is synchronised before returning: when ``PFXSET`` replies the bytes are
on the device for every other process (a copy from pageable memory may return
before the DMA lands). Each call selects the arena's device itself: CUDA's
current device is per thread and large copies run in a worker thread
(``PrefixService.copy_in``/``copy_out``), off the event loop.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from pfxcache.cuda_ipc import (
    IPC_HANDLE_BYTES, MAX_DIRECT_RUNS, blocks_from_host, blocks_to_host, check_handle, contiguous_runs, count_runs,
)

from .arena import Arena, new_arena_id
from .errors import BadRequest

INSTALL_HINT = "pip install pfxcache[cuda12] or [cuda13]"


class CudaUnavailable(ValueError):
    """``arena cuda`` cannot work here (no CuPy, no GPU, bad device): a startup error."""


def unavailable(reason: str) -> CudaUnavailable:
    """The startup error for ``arena cuda``, with ``reason`` (what actually failed)."""
    return CudaUnavailable(f"arena cuda needs CuPy ({INSTALL_HINT}) and an NVIDIA GPU: {reason}")


def load_cupy(device: int) -> Any:
    """Import CuPy and check that ``device`` exists; :class:`CudaUnavailable` otherwise."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken install failing to load its libraries
        raise unavailable(f"cannot import cupy ({type(exc).__name__}: {exc})") from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError: no driver, no device, driver too old
        raise unavailable(f"no usable CUDA device ({type(exc).__name__}: {exc})") from exc
    if count < 1:
        raise unavailable("no CUDA device is visible")
    if not 0 <= device < count:
        raise unavailable(f"arena-device {device} does not exist (devices 0..{count - 1} are visible)")
    return cupy


def host_array(data: Any, nbytes: int, what: str) -> np.ndarray:
    """``data`` (any buffer) as a flat uint8 array of exactly ``nbytes`` bytes, C-contiguous."""
    src = np.frombuffer(data, dtype=np.uint8) if len(data) else np.empty(0, np.uint8)
    if src.size != nbytes:
        raise BadRequest(f"{what} is {src.size} bytes, expected {nbytes}")
    return src


class CudaArena(Arena):
    """Blocks in one ``cudaMalloc`` allocation on ``device``, exported with CUDA IPC.

    ``cupy`` may be passed in (tests inject a stand-in module); by default it is
    imported and checked by :func:`load_cupy`.
    """

    backend = "cuda"

    def __init__(self, block_bytes: int, nblocks: int, *, device: int = 0, cupy: Any = None) -> None:
        if block_bytes < 1 or nblocks < 1:
            raise ValueError("an arena needs block_bytes >= 1 and nblocks >= 1")
        cp = cupy if cupy is not None else load_cupy(device)
        self.block_bytes = block_bytes
        self.nblocks = nblocks
        self.name = ""
        self.id = new_arena_id()
        self.device_id = device
        self.pid = os.getpid()
        self._cp = cp
        self._runtime = cp.cuda.runtime
        self._buffer = None  # the base class's host buffer: there is none
        self._mv = None
        self._blocks = None
        size = block_bytes * nblocks
        try:
            with cp.cuda.Device(device):
                # cupy.cuda.Memory is cudaMalloc, freed when the object goes: plain device
                # memory at the base of its own allocation (the pool could hand out a piece
                # of a larger one, whose IPC handle would open at the wrong address).
                self._mem = cp.cuda.Memory(size)
                self.ptr = int(self._mem.ptr)
                self._runtime.memset(self.ptr, 0, size)
                self._runtime.deviceSynchronize()
                self._blocks = cp.ndarray((nblocks, block_bytes), dtype=cp.uint8,
                                          memptr=cp.cuda.MemoryPointer(self._mem, 0))
                self.handle = check_handle(self._runtime.ipcGetMemHandle(self.ptr))
        except CudaUnavailable:
            raise
        except Exception as exc:  # out of memory, IPC unsupported, ...: a startup error, not a crash
            self._blocks = None
            self._mem = None
            raise unavailable(
                f"cannot allocate and export {size} bytes on device {device} ({type(exc).__name__}: {exc})"
            ) from exc

    # --- host <-> device -------------------------------------------------

    def _device(self):
        if self._mem is None:
            raise ValueError("the arena is closed")
        return self._cp.cuda.Device(self.device_id)

    def read(self, ids: Sequence[int]) -> bytes:
        """The concatenated contents of ``ids``, copied to the host, in order."""
        idx = self._index(ids)
        out = np.empty(idx.size * self.block_bytes, dtype=np.uint8)
        if idx.size:
            self._to_host(idx, out)
        return out.tobytes()

    def read_into(self, ids: Sequence[int], out) -> None:
        """Copy the contents of ``ids`` into the writable host buffer ``out`` (exactly len(ids) blocks)."""
        idx = self._index(ids)
        dest = np.frombuffer(out, dtype=np.uint8)
        if dest.size != idx.size * self.block_bytes:
            raise BadRequest(f"output buffer holds {dest.size} bytes, expected {idx.size * self.block_bytes}")
        if idx.size:
            self._to_host(idx, dest)

    def write(self, ids: Sequence[int], data) -> None:
        """Store host ``data`` (exactly len(ids) * block_bytes bytes) into ``ids`` on the device."""
        idx = self._index(ids)
        src = host_array(data, idx.size * self.block_bytes, f"data for {idx.size} blocks x {self.block_bytes} bytes")
        if idx.size:
            self._from_host(idx, src)

    def _to_host(self, idx: np.ndarray, dest: np.ndarray) -> None:
        with self._device():
            blocks_to_host(self._cp, self._blocks, self.ptr, idx, dest)

    def _from_host(self, idx: np.ndarray, src: np.ndarray) -> None:
        with self._device():
            if count_runs(idx) > MAX_DIRECT_RUNS and np.unique(idx).size != idx.size:
                raise BadRequest("block ids repeat")  # a scatter would land one of the copies, undefined which
            # Before PFXSET replies, the bytes must be on the device for every other process.
            blocks_from_host(self._cp, self._blocks, self.ptr, idx, src)

    def zero(self, ids: Sequence[int]) -> None:
        """Fill ``ids`` with zeros on the device (one memset per run), synchronised before returning."""
        idx = self._index(ids)
        if not idx.size:
            return
        with self._device():
            runtime, stream = self._runtime, self._cp.cuda.get_current_stream()
            bb = self.block_bytes
            if count_runs(idx) <= MAX_DIRECT_RUNS:
                for first, count, _ in contiguous_runs(idx):
                    runtime.memsetAsync(self.ptr + first * bb, 0, count * bb, stream.ptr)
            else:
                self._blocks[self._cp.asarray(idx)] = 0
            stream.synchronize()

    # --- the rest of the Arena interface -----------------------------------

    def view(self, block_id: int) -> memoryview:
        """There is no host view of device memory: workers open the IPC handle instead."""
        raise NotImplementedError("the cuda arena has no host view; open its IPC handle (pfxcache.client.cuda)")

    def describe(self) -> dict:
        """Backend, device, IPC handle (64 bytes), size, geometry and the exporting pid."""
        info = super().describe()
        info.update({"device": self.device_id, "handle": self.handle, "pid": self.pid})
        return info

    def close(self) -> None:
        """Free the allocation (idempotent). Workers must have closed their IPC mappings first."""
        if self._mem is None:
            return
        self._blocks = None
        mem, self._mem = self._mem, None
        try:
            with self._cp.cuda.Device(self.device_id):
                self._runtime.deviceSynchronize()  # no copy still reads or writes it
        except Exception:  # a dying context: freeing below is all that is left to do
            pass
        del mem  # cupy.cuda.Memory frees (cudaFree) when its last reference goes
