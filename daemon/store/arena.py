"""Block storage: a flat buffer cut into ``nblocks`` blocks of ``block_bytes``.

The arena knows nothing about pages, trees or leases; the store hands out
block ids and the daemon (or a worker process mapping the same shared memory)
copies KV data in and out of them. Reads and writes of many blocks are one
vectorised numpy copy over a ``(nblocks, block_bytes)`` view, never a Python
loop per block.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
import stat
import time
from collections.abc import Iterable, Sequence

from array import array

import numpy as np

from .errors import BadRequest

SHM_DIR = "/dev/shm"
#: Seconds during which a new arena file of a live pid may not be locked yet by its creator.
CREATION_GRACE_S = 10.0
#: Past this many runs of consecutive ids, zero() does one fancy-indexed store instead of a memset per run.
MAX_ZERO_RUNS = 32


def new_arena_id() -> str:
    """A random id for one arena's life: a worker whose connection comes back compares it with the
    one it mapped, and re-attaches when the daemon (or its arena) is a new one, even one with the
    same pid, port and file name (a restarted container)."""
    return secrets.token_hex(8)


class Arena:
    """Fixed-size block storage over a writable buffer (base of the backends)."""

    backend = "abstract"

    def __init__(self, buffer, block_bytes: int, nblocks: int, name: str = "") -> None:
        if block_bytes < 1 or nblocks < 1:
            raise ValueError("an arena needs block_bytes >= 1 and nblocks >= 1")
        self.block_bytes = block_bytes
        self.nblocks = nblocks
        self.name = name
        self.id = new_arena_id()
        self._buffer = buffer
        self._mv = memoryview(buffer)
        self._blocks = np.frombuffer(buffer, dtype=np.uint8, count=block_bytes * nblocks).reshape(nblocks, block_bytes)

    @property
    def size(self) -> int:
        """Bytes of block storage."""
        return self.block_bytes * self.nblocks

    def _index(self, ids: Iterable[int]) -> np.ndarray:
        if isinstance(ids, array) and ids.typecode == "q":  # the store's block ids: no int per page
            idx = np.frombuffer(ids, dtype=np.int64) if len(ids) else np.empty(0, np.int64)
        else:
            idx = np.asarray(ids if isinstance(ids, (list, tuple, np.ndarray)) else list(ids), dtype=np.int64)
        if idx.ndim != 1:
            raise BadRequest("block ids must be a flat sequence")
        # numpy would wrap negative ids around silently: refuse them here.
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.nblocks):
            raise BadRequest(f"block id out of range 0..{self.nblocks - 1}")
        return idx

    def read(self, ids: Sequence[int]) -> bytes:
        """The concatenated contents of ``ids``, in order (one fancy-indexing copy)."""
        idx = self._index(ids)
        return self._blocks[idx].tobytes()

    def read_into(self, ids: Sequence[int], out) -> None:
        """Copy the contents of ``ids`` into the writable buffer ``out`` (exactly len(ids) blocks)."""
        idx = self._index(ids)
        dest = np.frombuffer(out, dtype=np.uint8)
        if dest.size != idx.size * self.block_bytes:
            raise BadRequest(f"output buffer holds {dest.size} bytes, expected {idx.size * self.block_bytes}")
        np.take(self._blocks, idx, axis=0, out=dest.reshape(idx.size, self.block_bytes))

    def write(self, ids: Sequence[int], data) -> None:
        """Store ``data`` (exactly len(ids) * block_bytes bytes) into ``ids``, in order."""
        if len(ids) == 1 and ids[0].__class__ is int and 0 <= ids[0] < self.nblocks:
            # One block (a PFXSET of one new page): a plain row copy, 1 us instead of 3.5 for
            # the index array and the fancy-indexed store.
            src = np.frombuffer(data, dtype=np.uint8)
            if src.size != self.block_bytes:
                raise BadRequest(f"data is {src.size} bytes, expected 1 blocks x {self.block_bytes} bytes")
            self._blocks[ids[0]] = src
            return
        idx = self._index(ids)
        src = np.frombuffer(data, dtype=np.uint8) if len(data) else np.empty(0, np.uint8)
        if src.size != idx.size * self.block_bytes:
            raise BadRequest(f"data is {src.size} bytes, expected {idx.size} blocks x {self.block_bytes} bytes")
        if idx.size:
            self._blocks[idx] = src.reshape(idx.size, self.block_bytes)

    def zero(self, ids: Sequence[int]) -> None:
        """Fill ``ids`` with zeros: a block handed to a new writer never shows what it held before.

        One memset per run of consecutive ids (fresh allocations mostly are a few runs), or one
        fancy-indexed store when the ids are scattered; never a Python loop per block.
        """
        idx = self._index(ids)
        if not idx.size:
            return
        starts = np.flatnonzero(np.diff(idx) != 1) + 1
        if starts.size >= MAX_ZERO_RUNS:
            self._blocks[idx] = 0
            return
        bounds = np.concatenate(([0], starts, [idx.size])).tolist()
        for lo, hi in zip(bounds, bounds[1:]):
            first = int(idx[lo])
            self._blocks[first : first + hi - lo] = 0

    def view(self, block_id: int) -> memoryview:
        """A writable zero-copy view of one block (release it before close())."""
        if not 0 <= block_id < self.nblocks:
            raise BadRequest(f"block id {block_id} out of range 0..{self.nblocks - 1}")
        start = block_id * self.block_bytes
        return self._mv[start : start + self.block_bytes]

    def describe(self) -> dict:
        """Backend, name and size, for INFO and for workers that map the arena."""
        return {
            "backend": self.backend,
            "id": self.id,
            "name": self.name,
            "size": self.size,
            "block_bytes": self.block_bytes,
            "nblocks": self.nblocks,
        }

    def _drop_views(self) -> None:
        self._blocks = None
        if self._mv is not None:
            try:
                self._mv.release()
            except BufferError:  # something still exports it; it goes when collected
                pass
            self._mv = None

    def close(self) -> None:
        """Unmap the storage; the arena is unusable afterwards (idempotent)."""
        if self._buffer is None:
            return
        self._drop_views()
        try:
            self._buffer.close()
        except BufferError:  # a caller still holds a view(); the mapping goes when it is collected
            pass
        self._buffer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class MemoryArena(Arena):
    """Anonymous private memory (tests, in-process benchmarks)."""

    backend = "memory"

    def __init__(self, block_bytes: int, nblocks: int) -> None:
        # An anonymous mapping is zero-filled lazily by the kernel: large arenas cost nothing until used.
        super().__init__(mmap.mmap(-1, block_bytes * nblocks), block_bytes, nblocks, name="")


class MemfdArena(Arena):
    """Shared memory in a sealed ``memfd``: the daemon's arena (backend ``shm``).

    Sealed against shrinking and growing (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``): no
    process, whatever it can open, can truncate the memory under the daemon's mapping, so no
    worker can make the daemon die of SIGBUS. There is no file in /dev/shm: nothing to leave
    behind when the daemon is killed (the memory goes with its last mapping), no name anyone
    else can take, squat or plant a fifo under. Workers open it by ``path``,
    ``/proc/<daemon pid>/fd/<fd>``, which the kernel lets only processes open that may also
    ptrace the daemon (its own user, or root): a tenant's worker running as another user
    cannot map it at all (docs/operating.md#isolation).
    """

    backend = "shm"

    def __init__(self, block_bytes: int, nblocks: int, *, name: str = "pfxcache") -> None:
        size = block_bytes * nblocks
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            # Really reserve the memory now: a write into a hole of an overcommitted tmpfs would
            # otherwise die of SIGBUS later.
            os.posix_fallocate(fd, 0, size)
            os.fchmod(fd, 0o600)  # a read-only descriptor PFXATTACH sent cannot be reopened writable
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            mapping = mmap.mmap(fd, size)
            self._inode = os.fstat(fd).st_ino
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.path = f"/proc/{os.getpid()}/fd/{fd}"
        super().__init__(mapping, block_bytes, nblocks, name=name)

    def describe(self) -> dict:
        info = super().describe()
        info["path"] = self.path
        info["inode"] = self._inode  # a worker checks that what it opened is this memory
        return info

    @property
    def fds(self) -> list[int]:
        """The memfd of each partition (an unpartitioned arena is one): what PFXATTACH hands out."""
        return [self._fd]

    def open_partition(self, number: int, writable: bool) -> int:
        """A new descriptor of the memfd, read-write or read-only (partitioned_arena.py says why)."""
        if writable:
            return os.dup(self._fd)
        return os.open(f"/proc/self/fd/{self._fd}", os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        """Unmap and close the memfd (workers' mappings keep their memory until they unmap)."""
        if self._buffer is None:
            return
        super().close()
        os.close(self._fd)


class ShmArena(Arena):
    """POSIX shared memory ``/dev/shm/<name>`` that worker processes map by name.

    Implemented with os.open + mmap rather than multiprocessing.shared_memory,
    whose resource tracker unlinks segments behind our back when any process
    that attached to them exits.
    """

    backend = "shm"

    def __init__(self, block_bytes: int, nblocks: int, *, name: str | None = None, port: int = 0,
                 create: bool = True, directory: str = SHM_DIR) -> None:
        name = name or self.default_name(port)
        if "/" in name or name in (".", ".."):
            raise ValueError(f"bad shared memory name {name!r}")
        self.path = os.path.join(directory, name)
        self._owner = create
        size = block_bytes * nblocks
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if create:
                # Locked first: cleanup_stale() in another daemon then leaves it alone.
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.ftruncate(fd, size)
                # Really reserve the memory now: a sparse file on a tmpfs smaller than
                # maxmemory would make a later write into the mapping die of SIGBUS.
                os.posix_fallocate(fd, 0, size)
            elif os.fstat(fd).st_size < size:
                raise ValueError(f"{self.path} is smaller than {size} bytes")
            mapping = mmap.mmap(fd, size)
            self._inode = os.fstat(fd).st_ino
        except BaseException:
            os.close(fd)
            if create:
                os.unlink(self.path)
            raise
        if create:
            self._lock_fd = fd
        else:
            self._lock_fd = None
            os.close(fd)  # the mapping keeps the memory; the descriptor is not needed
        super().__init__(mapping, block_bytes, nblocks, name=name)

    @classmethod
    def attach(cls, name: str, block_bytes: int, *, directory: str = SHM_DIR) -> ShmArena:
        """Map an existing arena created by another process (close() will not unlink it)."""
        size = os.stat(os.path.join(directory, name)).st_size
        return cls(block_bytes, size // block_bytes, name=name, create=False, directory=directory)

    @staticmethod
    def default_name(port: int) -> str:
        """``pfxcache-<pid>-<port>``: the pid lets cleanup_stale() find leftovers of dead daemons."""
        return f"pfxcache-{os.getpid()}-{port}"

    def describe(self) -> dict:
        info = super().describe()
        info["path"] = self.path
        # The file's identity: a worker checks that the file it opened by path is this one.
        info["inode"] = self._inode
        return info

    def close(self) -> None:
        """Unmap, and unlink the file when this process created it."""
        if self._buffer is None:
            return
        super().close()
        if self._owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @staticmethod
    def cleanup_stale(prefix: str = "pfxcache-", directory: str = SHM_DIR) -> list[str]:
        """Remove ``<prefix><pid>-*`` arena files nobody holds any more; returns their names.

        The lock is the truth, not the pid: a live arena's creator holds it locked for its whole
        life (even from another PID namespace sharing /dev/shm), while the pid in a name may have
        been reused by an unrelated process (or be this daemon's own: PID 1 in a restarted
        container). Anything but a regular file (a fifo, whose open would block forever, a
        directory, a link) is never opened nor removed: it only takes its name. A file of a
        live pid is spared while it may still be in its creator's first moments (empty or just
        written), before the lock is taken.
        """
        removed = []
        try:
            names = os.listdir(directory)
        except OSError:
            return removed
        now = time.time()
        for name in names:
            if not name.startswith(prefix):
                continue
            pid_text = name[len(prefix):].split("-", 1)[0]
            if not pid_text.isdigit():
                continue
            path = os.path.join(directory, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            young = info.st_size == 0 or now - info.st_mtime < CREATION_GRACE_S
            if young and int(pid_text) != os.getpid() and _pid_alive(int(pid_text)):
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_ino == os.lstat(path).st_ino:  # still the file we locked
                    os.unlink(path)
                    removed.append(name)
            except OSError:  # locked by its live owner, gone meanwhile, or not ours to remove
                pass
            finally:
                os.close(fd)
        return removed


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
