"""Attaching over the daemon's unix socket: the arena partitions this worker's user may map.

``PFXATTACH`` (on a connection of its own, after AUTH with the cache's credentials) answers
with the layout of what it sends and passes one descriptor per partition as SCM_RIGHTS. Each
partition is mapped at its block offset inside one reserved address range, so block ids
index the view as they index the daemon's arena; blocks of partitions not sent stay private
zero pages here and are refused by every method. Partitions the daemon sent read-only are
mapped read-only (the kernel refuses anything else): their views are read-only arrays and
writes into them raise.

The command channel stays redis-py; this connection lives only for the exchange. The request
is encoded with :mod:`pfxcache.protocol` and the replies parsed with hiredis.
"""

from __future__ import annotations

import array
import ctypes
import mmap
import os
import socket
from typing import Any

import hiredis
import numpy as np

from pfxcache.protocol.redis_strings import stringmatchlen
from pfxcache.protocol.replies import encode

from .arena import ShmArenaView
from .errors import AttachError

#: Most descriptors one PFXATTACH reply carries (the daemon's limit per connection).
MAX_FDS = 128
MAP_FIXED = 0x10

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_MAP_FAILED = ctypes.c_void_p(-1).value


def _pairs(flat: Any) -> dict:
    """A RESP2 flat map reply as a dict with str keys."""
    if isinstance(flat, dict):
        return {k.decode() if isinstance(k, bytes) else k: v for k, v in flat.items()}
    return {flat[i].decode(): flat[i + 1] for i in range(0, len(flat), 2)}


def exchange(path: str, username: str | None, password: str | None, timeout: float = 10.0) -> tuple[dict, list[int]]:
    """AUTH (when there is a password) and PFXATTACH on a new unix socket connection to ``path``:
    the PFXATTACH reply (a dict) and the descriptors that came with it. AttachError on any refusal."""
    commands = []
    if password is not None:
        commands.append([b"AUTH", *([username.encode()] if username else []), password.encode()])
    commands.append([b"PFXATTACH"])
    fds: list[int] = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(path)
                sock.sendall(b"".join(encode(command) for command in commands))
            except OSError as exc:
                raise AttachError(f"cannot reach the daemon's unix socket {path}: {exc.strerror or exc}") from None
            reader = hiredis.Reader()
            replies: list[Any] = []
            while len(replies) < len(commands):
                data, ancillary, flags, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(MAX_FDS * 4),
                                                          socket.MSG_CMSG_CLOEXEC)
                for level, kind, payload in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        got = array.array("i")
                        got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                        fds += got
                if flags & socket.MSG_CTRUNC:
                    raise AttachError("the daemon sent more partitions than this worker can receive")
                if not data:
                    raise AttachError("the daemon closed the unix socket during PFXATTACH")
                reader.feed(data)
                while (reply := reader.gets()) is not False:
                    replies.append(reply)
        for reply in replies:
            if isinstance(reply, hiredis.ReplyError):
                raise AttachError(f"PFXATTACH refused: {reply}")
        return _pairs(replies[-1]), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def unix_target(url: str) -> tuple[str, str | None, str | None] | None:
    """(socket path, username, password) of a ``unix://`` redis URL, or None for any other URL."""
    if not url.startswith("unix://"):
        return None
    from redis.connection import parse_url  # redis-py's own parsing: the URL means what it means to the client

    parts = parse_url(url)
    return parts["path"], parts.get("username"), parts.get("password")


def layout_of(url: str) -> list[tuple[int, int, bool, bytes]]:
    """What PFXATTACH over ``url``'s unix socket would map, without mapping it: (first block, end block,
    writable, pattern) per partition. AttachError on any refusal (or for a URL that is not unix://)."""
    target = unix_target(url)
    if target is None:
        raise AttachError(f"PFXATTACH needs the daemon's unix socket: {url.split('@')[-1]} is not a unix:// URL")
    layout, fds = exchange(*target)
    for fd in fds:
        os.close(fd)
    return [(int(p["first-block"]), int(p["first-block"]) + int(p["nblocks"]), p["access"] == b"rw", p["pattern"])
            for p in map(_pairs, layout["partitions"])]


class PartitionedArenaView(ShmArenaView):
    """The partitions PFXATTACH sent, mapped where their blocks are (see the module docstring)."""

    def __init__(self, layout: dict, fds: list[int]) -> None:
        parts = [_pairs(part) for part in layout["partitions"]]
        if len(parts) != len(fds):
            raise AttachError(f"PFXATTACH described {len(parts)} partitions but sent {len(fds)} descriptors")
        if not parts:
            raise AttachError("PFXATTACH sent no partition: this user's key patterns cover none")
        self.path = "unix socket (PFXATTACH)"
        self.block_bytes = int(layout["block-bytes"])
        self.nblocks = int(layout["nblocks"])
        self.arena_id = layout["arena-id"].decode() if isinstance(layout["arena-id"], bytes) else layout["arena-id"]
        size = self.block_bytes * self.nblocks
        # Private zero pages everywhere first: the partitions then replace their own ranges.
        self._mmap = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        probe = ctypes.c_char.from_buffer(self._mmap)
        base = ctypes.addressof(probe)
        del probe
        #: (first block, end block, writable, pattern) of each mapped partition
        self.ranges: list[tuple[int, int, bool, bytes]] = []
        try:
            for part, fd in zip(parts, fds):
                first, count = int(part["first-block"]), int(part["nblocks"])
                writable = part["access"] == b"rw"
                if first < 0 or count < 1 or first + count > self.nblocks:
                    raise AttachError(f"partition {part['pattern']!r} lies outside the arena")
                nbytes = count * self.block_bytes
                if os.fstat(fd).st_size < nbytes:
                    raise AttachError(f"the descriptor of partition {part['pattern']!r} is smaller than it")
                prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
                at = base + first * self.block_bytes
                got = _libc.mmap(at, nbytes, prot, mmap.MAP_SHARED | MAP_FIXED, fd, 0)
                if got == _MAP_FAILED or got != at:
                    err = ctypes.get_errno()
                    raise AttachError(f"cannot map partition {part['pattern']!r}: {os.strerror(err)}")
                self.ranges.append((first, first + count, writable, part["pattern"]))
        except BaseException:
            self._mmap.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)  # the mappings keep the memory
        self.array = np.frombuffer(self._mmap, dtype=np.uint8).reshape(self.nblocks, self.block_bytes)

    @classmethod
    def attach_url(cls, url: str) -> PartitionedArenaView:
        """:meth:`attach` through a ``unix://[user:password@]/path`` redis URL."""
        target = unix_target(url)
        if target is None:
            raise AttachError(f"PFXATTACH needs the daemon's unix socket: {url.split('@')[-1]} is not a unix:// URL")
        return cls.attach(*target)

    @classmethod
    def attach(cls, path: str, username: str | None = None, password: str | None = None) -> PartitionedArenaView:
        layout, fds = exchange(path, username, password)
        try:
            return cls(layout, fds)
        except BaseException:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            raise

    # -- what is mapped ----------------------------------------------------------------------------

    def serves(self, key: Any, write: bool = False) -> bool:
        """Whether namespace ``key`` matches a partition mapped here (writable, with ``write``).
        A hint for choosing zero-copy: block ids are checked again on every use."""
        name = key.encode() if isinstance(key, str) else bytes(key)
        return any(stringmatchlen(pattern, name) and (writable or not write)
                   for _, _, writable, pattern in self.ranges)

    def maps(self, ids: Any, write: bool = False) -> bool:
        """Whether every block of ``ids`` lies in one mapped partition (a writable one, with ``write``)."""
        idx = np.asarray(ids, dtype=np.int64)
        if not idx.size:
            return True
        lo, hi = int(idx.min()), int(idx.max())
        return any(first <= lo and hi < end and (writable or not write) for first, end, writable, _ in self.ranges)

    def _checked(self, ids: Any, write: bool) -> np.ndarray:
        idx = self._ids(ids)
        if not self.maps(idx, write):
            raise IndexError(f"block ids outside the {'writable ' if write else ''}partitions mapped here")
        return idx

    def blocks(self, ids: Any) -> np.ndarray:
        single = isinstance(ids, (int, np.integer))
        idx = self._checked([ids] if single else ids, write=False)
        view = super().blocks(int(idx[0]) if single else idx)
        if not self.maps(idx, write=True) and view.flags.writeable:
            view = view.view()
            view.flags.writeable = False  # a store into a read-only mapping would kill this process
        return view

    def read_into(self, ids: Any, out: Any) -> int:
        return super().read_into(self._checked(ids, write=False), out)

    def write_from(self, ids: Any, src: Any) -> int:
        return super().write_from(self._checked(ids, write=True), src)

    def __repr__(self) -> str:
        spans = ", ".join(f"{first}..{end - 1}{'' if w else ' ro'}" for first, end, w, _ in self.ranges)
        return f"<PartitionedArenaView {spans} of {self.nblocks} x {self.block_bytes} B{' closed' if self.closed else ''}>"
