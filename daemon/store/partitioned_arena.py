"""The shm arena cut into partitions: one sealed memfd per partition, mapped back to back.

Each arena partition (partitions.py) is a memfd of its own, so the daemon can hand a
tenant's worker exactly its partition's memory (over the unix socket, SCM_RIGHTS) and
nothing else. The daemon maps the memfds one after another into one reserved address
range (``MAP_FIXED`` over an anonymous reservation): block ``b`` is at ``b * block_bytes``
as in an unpartitioned arena, so every copy of :class:`~.arena.Arena` works unchanged.

Each memfd is sealed against shrinking and growing (no worker can make the daemon die of
SIGBUS) and has mode 0600: a worker holding a read-only descriptor cannot reopen it writable
through ``/proc/self/fd/<n>``, which checks the inode's mode and owner (the daemon's user).
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os

from .arena import Arena

PROT_READ, PROT_WRITE = mmap.PROT_READ, mmap.PROT_WRITE
MAP_SHARED, MAP_FIXED = mmap.MAP_SHARED, 0x10
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
MAP_FAILED = ctypes.c_void_p(-1).value


def page_round(nbytes: int) -> int:
    return -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE


def reserve(nbytes: int) -> tuple[mmap.mmap, int]:
    """An anonymous private mapping of ``nbytes`` (nothing committed until touched) and its address."""
    region = mmap.mmap(-1, page_round(nbytes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    probe = ctypes.c_char.from_buffer(region)
    address = ctypes.addressof(probe)
    del probe  # the export would keep the region from ever closing
    return region, address


def map_fixed(address: int, nbytes: int, fd: int, writable: bool) -> None:
    """Map ``nbytes`` of ``fd`` shared at ``address`` (page aligned), replacing what was there."""
    prot = PROT_READ | (PROT_WRITE if writable else 0)
    got = _libc.mmap(address, page_round(nbytes), prot, MAP_SHARED | MAP_FIXED, fd, 0)
    if got == MAP_FAILED or got != address:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of a partition at {address:#x}: {os.strerror(err)}")


def sealed_memfd(name: str, nbytes: int) -> int:
    """A memfd of ``nbytes`` (really reserved, so a write never meets a hole), sealed, mode 0600."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, page_round(nbytes))
        os.posix_fallocate(fd, 0, page_round(nbytes))
        os.fchmod(fd, 0o600)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


class PartitionedMemfdArena(Arena):
    """Shared memory in one sealed memfd per partition (backend ``shm``); see the module docstring.

    ``layout``: ``[(label, first_block, nblocks)]`` in block order, covering ``0..nblocks-1``
    with no gap; every ``first_block * block_bytes`` must be a multiple of the memory page.
    """

    backend = "shm"

    def __init__(self, block_bytes: int, layout: list[tuple[str, int, int]], *, name: str = "pfxcache") -> None:
        nblocks = sum(count for _, _, count in layout)
        region, address = reserve(block_bytes * nblocks)
        self.fds: list[int] = []
        self.inodes: list[int] = []
        self.ranges: list[tuple[int, int]] = []
        try:
            expected = 0
            for label, first, count in layout:
                if first != expected or (first * block_bytes) % mmap.PAGESIZE:
                    raise ValueError(f"partition {label!r} at block {first} is not page aligned or leaves a gap")
                fd = sealed_memfd(f"{name}-{label}", count * block_bytes)
                self.fds.append(fd)
                self.inodes.append(os.fstat(fd).st_ino)
                self.ranges.append((first, count))
                map_fixed(address + first * block_bytes, count * block_bytes, fd, writable=True)
                expected = first + count
        except BaseException:
            region.close()
            for fd in self.fds:
                os.close(fd)
            raise
        self.path = ""  # no single file maps the whole arena: workers attach partition by partition
        super().__init__(region, block_bytes, nblocks, name=name)

    def fd_path(self, number: int) -> str:
        """``/proc/<pid>/fd/<n>`` of partition ``number``'s memfd (opens for the daemon's user only)."""
        return f"/proc/{os.getpid()}/fd/{self.fds[number]}"

    def open_partition(self, number: int, writable: bool) -> int:
        """A new descriptor of partition ``number``'s memfd, opened read-write or read-only (the kernel
        then refuses a writable shared mapping of it); the caller sends it, then closes it."""
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        if writable:
            return os.dup(self.fds[number])
        return os.open(f"/proc/self/fd/{self.fds[number]}", flags)

    def describe(self) -> dict:
        info = super().describe()
        info["path"] = ""
        info["partitions"] = len(self.fds)
        return info

    def close(self) -> None:
        """Unmap the whole range and close the memfds (workers' mappings keep their memory)."""
        if self._buffer is None:
            return
        super().close()
        for fd in self.fds:
            os.close(fd)
        self.fds = []
