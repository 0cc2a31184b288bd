"""Views of the daemon's arena mapped into a worker process (zero-copy).

The daemon describes its arena in PFXINFO (``backend``, ``path``, ``size``,
``block_bytes``, ``nblocks``, ``inode``). For ``backend == "shm"`` the worker maps
the daemon's sealed memfd through its ``/proc/<pid>/fd/<n>`` path (checking the
inode, so a stale or foreign file is refused): every block is then plain memory shared with the
daemon and every other worker, seen here as a ``(nblocks, block_bytes)``
uint8 numpy array (and CPU torch tensors over it, without a copy). For
``backend == "cuda"`` the view comes from :mod:`pfxcache.client.cuda`
(imported only then, so nothing here needs CuPy).

A mapped block is only stable while a lease pins it: read blocks under the
lease of a lookup, write blocks under the lease of an allocation.
"""

from __future__ import annotations

import mmap
import os
import sys
from typing import Any, Self

import numpy as np

from .errors import AttachError


def _torch() -> Any:
    import torch  # imported on use only: numpy views do not need it

    return torch


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


#: The alignment of the buffers :func:`kv_buffer` hands out: a memory page, which also covers
#: every cache line and SIMD width. ``np.zeros`` buffers start 16 bytes past a 64-byte boundary,
#: and a copy into those runs at well under half the speed of a copy into aligned ones.
BUFFER_ALIGN = mmap.PAGESIZE


def kv_buffer(shape: Any, dtype: Any = np.uint8, *, torch: bool = False, align: int = BUFFER_ALIGN) -> Any:
    """A zeroed, C-contiguous array of ``shape`` and ``dtype`` whose data starts on an ``align`` boundary.

    The buffer to give :meth:`ShmArenaView.read_into` and ``write_from``
    (``kv_buffer((pages, block_bytes))``: one row per page): copies between it
    and the arena then run at memcpy speed. ``torch=True``, or a torch
    ``dtype`` (``torch.bfloat16`` ...), gives a CPU tensor over such memory.
    """
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
    if align < 1 or align & (align - 1):
        raise ValueError(f"the alignment must be a power of two, got {align}")
    count = int(np.prod(shape, dtype=np.int64))
    if _is_torch_dtype(dtype) or torch:
        th = _torch()
        tdtype = dtype if _is_torch_dtype(dtype) else th.from_numpy(np.empty(0, dtype)).dtype
        raw = _aligned_bytes(count * th.empty((), dtype=tdtype).element_size(), align)
        return th.from_numpy(raw).view(tdtype).reshape(shape)
    np_dtype = np.dtype(dtype)
    return _aligned_bytes(count * np_dtype.itemsize, align).view(np_dtype).reshape(shape)


def _aligned_bytes(nbytes: int, align: int) -> np.ndarray:
    raw = np.zeros(nbytes + align, np.uint8)  # calloc: pages are zeroed lazily, as np.zeros does
    start = -raw.ctypes.data % align
    return raw[start : start + nbytes]


def _is_torch_dtype(dtype: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(dtype, torch.dtype)


def writable_bytes(out: Any) -> np.ndarray:
    """A flat writable uint8 numpy view of ``out``'s memory (numpy array, CPU tensor, bytearray, memoryview)."""
    if _is_tensor(out):
        if out.device.type != "cpu":
            raise TypeError(f"a tensor on {out.device} has no host memory to view")
        if not out.is_contiguous():
            raise ValueError("the output tensor must be contiguous")
        return out.detach().reshape(-1).view(_torch().uint8).numpy()
    if isinstance(out, np.ndarray):
        if not out.flags.c_contiguous:
            raise ValueError("the output array must be C-contiguous")
        if not out.flags.writeable:
            raise ValueError("the output array is read-only")
        return out.reshape(-1).view(np.uint8)
    try:
        view = np.frombuffer(out, dtype=np.uint8)
    except TypeError:
        raise TypeError(f"cannot write into a {type(out).__name__}: pass a numpy array, torch tensor or bytearray") from None
    if not view.flags.writeable:
        raise ValueError(f"the output {type(out).__name__} is read-only")
    return view


def readable_bytes(src: Any) -> np.ndarray:
    """A flat uint8 numpy view (or, for device tensors, host copy) of ``src``'s bytes."""
    if _is_tensor(src):
        flat = src.detach().contiguous().reshape(-1).view(_torch().uint8)
        return flat.cpu().numpy()  # a view for CPU tensors, one device-to-host copy otherwise
    if isinstance(src, np.ndarray):
        return np.ascontiguousarray(src).reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(src, dtype=np.uint8)
    except TypeError:
        raise TypeError(f"cannot read bytes from a {type(src).__name__}") from None


def nbytes_of(buffer: Any) -> int:
    """Size in bytes of an array, tensor or bytes-like object."""
    if _is_tensor(buffer):
        return buffer.numel() * buffer.element_size()
    if isinstance(buffer, np.ndarray):
        return buffer.nbytes
    return memoryview(buffer).nbytes


def copy_to_output(out: Any, data: Any) -> None:
    """Copy ``data`` (bytes-like) into the start of ``out`` (array, tensor on any device, bytearray)."""
    src = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)
    if _is_tensor(out) and out.device.type != "cpu":
        if not out.is_contiguous():
            raise ValueError("the output tensor must be contiguous")
        dest = out.detach().reshape(-1).view(_torch().uint8)
        # torch.from_numpy wants a writable array; the reply's bytes are read-only, so one host copy.
        dest[: src.size].copy_(_torch().from_numpy(src.copy()))
        return
    dest = writable_bytes(out)
    if src.size > dest.size:
        raise ValueError(f"the output holds {dest.size} bytes, {src.size} are needed")
    dest[: src.size] = src


def _runs(idx: np.ndarray) -> list[tuple[int, int, int]] | None:
    """``(start, stop, first_block)`` of each run of consecutive ids, or None when runs are short.

    A run is copied with one memcpy; ids in runs of fewer than 4 blocks on
    average go to numpy's gather/scatter instead, whose per-block cost is
    lower than a Python call per run.
    """
    if idx.size <= 1:
        return [(0, idx.size, int(idx[0]))] if idx.size else []
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    if len(breaks) + 1 > idx.size // 4:
        return None
    starts = [0, *breaks.tolist()]
    stops = [*breaks.tolist(), idx.size]
    firsts = idx[starts].tolist()
    return list(zip(starts, stops, firsts))


class ShmArenaView:
    """The daemon's shared-memory arena mapped here: ``array`` is ``(nblocks, block_bytes)`` uint8.

    Methods take block ids as a list / numpy array of ints. A run of
    consecutive ids (``[5, 6, 7]``) maps to a slice of the arena, so
    :meth:`blocks` returns a view that shares memory with the daemon; any
    other set of ids goes through numpy fancy indexing, which COPIES.
    :meth:`read_into` and :meth:`write_from` are one vectorised copy each,
    whatever the ids.
    """

    backend = "shm"

    def __init__(self, path: str, block_bytes: int, nblocks: int, inode: int | None = None) -> None:
        self.path = path
        self.block_bytes = int(block_bytes)
        self.nblocks = int(nblocks)
        size = self.block_bytes * self.nblocks
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise AttachError(f"cannot open the arena {path}: {exc.strerror}") from None
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                # Not the daemon's arena (another host's file of the same name, or a stale one).
                raise AttachError(f"{path} is {actual} bytes, the daemon's arena is {size}")
            if inode is not None and os.fstat(fd).st_ino != inode:
                # A file of the same name and size that is not the daemon's arena (a stale one).
                raise AttachError(f"{path} is not the daemon's arena (inode {os.fstat(fd).st_ino}, not {inode})")
            # mmap rather than multiprocessing.shared_memory: its resource tracker would
            # unlink the daemon's file when this worker exits.
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.array: np.ndarray | None = np.frombuffer(self._mmap, dtype=np.uint8).reshape(self.nblocks, self.block_bytes)

    @classmethod
    def from_info(cls, arena: dict) -> ShmArenaView:
        """Map the arena PFXINFO describes (its ``arena`` map)."""
        return cls(arena["path"], arena["block_bytes"], arena["nblocks"], arena.get("inode"))

    # -- ids ---------------------------------------------------------------------------------------

    def _ids(self, ids: Any) -> np.ndarray:
        if _is_tensor(ids):
            ids = ids.detach().cpu().numpy()
        idx = np.asarray(ids, dtype=np.int64)
        if idx.ndim != 1:
            raise ValueError("block ids must be a flat sequence")
        # numpy would wrap negative ids around silently: refuse them here.
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.nblocks):
            raise IndexError(f"block id out of range 0..{self.nblocks - 1}")
        return idx

    @staticmethod
    def _run(idx: np.ndarray) -> slice | None:
        """The slice for consecutive ascending ids, else None."""
        if idx.size == 0:
            return slice(0, 0)
        start = int(idx[0])
        if idx.size == 1 or np.array_equal(idx, np.arange(start, start + idx.size)):
            return slice(start, start + idx.size)
        return None

    def _arena(self) -> np.ndarray:
        if self.array is None:
            raise ValueError("the arena view is closed")
        return self.array

    # -- views -------------------------------------------------------------------------------------

    def blocks(self, ids: Any) -> np.ndarray:
        """The blocks' bytes as a ``(len(ids), block_bytes)`` uint8 array (an int id: one 1-D block).

        Consecutive ids give a zero-copy view (writes go to the arena);
        other ids give a fancy-indexed COPY (writes to it do not).
        """
        arena = self._arena()
        if isinstance(ids, (int, np.integer)):
            return arena[int(self._ids([ids])[0])]
        idx = self._ids(ids)
        run = self._run(idx)
        return arena[run] if run is not None else arena[idx]

    def torch_blocks(self, ids: Any):
        """:meth:`blocks` as a CPU ``torch.uint8`` tensor (``torch.from_numpy``: shares the same memory)."""
        return _torch().from_numpy(self.blocks(ids))

    # -- copies ------------------------------------------------------------------------------------

    def read_into(self, ids: Any, out: Any) -> int:
        """Copy the blocks, in order, into the start of ``out``; returns the bytes copied.

        ``out``: a C-contiguous numpy array or torch tensor of any dtype (or a
        bytearray) holding at least ``len(ids) * block_bytes`` bytes. One
        vectorised copy (``np.take``), never a loop per block; a tensor on a
        GPU gets one host-to-device copy.
        """
        arena = self._arena()
        idx = self._ids(ids)
        n = idx.size * self.block_bytes
        if _is_tensor(out) and out.device.type != "cpu":
            copy_to_output(out, self.blocks(idx).reshape(-1))
            return n
        dest = writable_bytes(out)
        if dest.size < n:
            raise ValueError(f"the output holds {dest.size} bytes, {len(idx)} blocks need {n}")
        dest2d = dest[:n].reshape(idx.size, self.block_bytes)
        runs = _runs(idx)
        if runs is None:
            # mode="clip": ids are already checked, and mode="raise" would buffer the output.
            np.take(arena, idx, axis=0, out=dest2d, mode="clip")
        else:
            for start, stop, first in runs:  # one memcpy per run of consecutive blocks
                np.copyto(dest2d[start:stop], arena[first : first + stop - start])
        return n

    def write_from(self, ids: Any, src: Any) -> int:
        """Copy ``src`` (exactly ``len(ids) * block_bytes`` bytes) into the blocks, in order; returns the bytes.

        ``src``: a numpy array, torch tensor (any device) or bytes-like object.
        One vectorised scatter (``arena[ids] = src``), never a loop per block.
        """
        arena = self._arena()
        idx = self._ids(ids)
        data = readable_bytes(src)
        n = idx.size * self.block_bytes
        if data.size != n:
            raise ValueError(f"the source is {data.size} bytes, {len(idx)} blocks take {n}")
        if n:
            data2d = data.reshape(idx.size, self.block_bytes)
            runs = _runs(idx)
            if runs is None:
                arena[idx] = data2d
            else:
                for start, stop, first in runs:
                    np.copyto(arena[first : first + stop - start], data2d[start:stop])
        return n

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap (idempotent). Views handed out keep the mapping alive until they are collected."""
        if self.array is None:
            return
        self.array = None
        try:
            self._mmap.close()
        except BufferError:  # a blocks() view is still alive; the mapping goes with it
            pass

    @property
    def closed(self) -> bool:
        return self.array is None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ShmArenaView {self.path} {self.nblocks} x {self.block_bytes} B{' closed' if self.closed else ''}>"


def open_arena(arena: dict) -> Any:
    """An arena view for the ``arena`` map of PFXINFO: shm here, cuda from ``pfxcache.client.cuda``."""
    backend = arena.get("backend")
    if backend == "shm":
        if not arena.get("path"):
            # A partitioned arena, or a tenant's view of PFXINFO: nothing to open by path.
            raise AttachError("the daemon gives no arena path to this user (arena partitions, or a tenant): "
                              "attach over its unix socket with a unix:// URL (PFXATTACH), or use RESP")
        return ShmArenaView.from_info(arena)
    if backend == "cuda":
        try:
            from .cuda import attach_cuda  # lazily: only CUDA arenas need CuPy

            return attach_cuda(arena)
        except Exception as exc:
            # No CuPy, no GPU, or a driver that refuses the IPC handle (another host, the
            # daemon's own process): all mean "cannot map", so callers can fall back to RESP.
            raise AttachError(f"cannot open the daemon's CUDA arena here: {type(exc).__name__}: {exc}") from exc
    raise AttachError(f"arena backend {backend!r} cannot be mapped by a worker")
