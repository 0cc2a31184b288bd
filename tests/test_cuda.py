"""The cuda arena: pure helpers, a CPU stand-in for CuPy, the startup error, and real GPU tests.

Three layers, so that most of the logic is checked on any machine:

* pure helpers (runs of ids, handle checks, PFXINFO parsing, word sizes) and
  the startup error of ``arena cuda`` without CuPy run everywhere;
* ``FAKE_CUPY``: a few dozen lines that implement the slice of CuPy's API the
  arena and the client use (``cuda.Memory``, ``MemoryPointer``,
  ``UnownedMemory``, ``runtime.memcpy``/``ipcGetMemHandle``/..., ``ndarray(memptr=)``,
  ``take``) over host memory, with CuPy's documented signatures. It runs
  ``CudaArena`` and ``CudaArenaView`` -- in this process, and a whole daemon
  with ``--arena cuda`` through PYTHONPATH -- everywhere; it checks our logic
  (ids, runs, shapes, synchronisation, describe, PFXINFO), not CUDA;
* ``@pytest.mark.gpu`` tests use the real CuPy on an NVIDIA GPU, with a daemon
  and worker processes exchanging blocks through the IPC handle; they skip
  without CuPy or a device (``scripts/gpu-check`` is the fuller check).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
from pfxcache.client.cuda import (
    CudaArenaInfo,
    attach_cuda,
    block_index,
    parse_arena_info,
    word_bytes,
)
from pfxcache.daemon.store.cuda_arena import (
    IPC_HANDLE_BYTES,
    CudaArena,
    CudaUnavailable,
    check_handle,
    contiguous_runs,
    count_runs,
    unavailable,
)
from pfxcache.daemon.store.errors import BadRequest
from pfxcache.testing import encode_command, start_daemon
from support import RawClient


# ---------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ids", "runs"),
    [
        ([], []),
        ([7], [(7, 1, 0)]),
        ([0, 1, 2, 3], [(0, 4, 0)]),
        ([4, 5, 6, 9, 2, 3], [(4, 3, 0), (9, 1, 3), (2, 2, 4)]),
        ([3, 2, 1], [(3, 1, 0), (2, 1, 1), (1, 1, 2)]),
        ([5, 5], [(5, 1, 0), (5, 1, 1)]),
    ],
)
def test_contiguous_runs(ids, runs):
    idx = np.array(ids, dtype=np.int64)
    assert contiguous_runs(idx) == runs
    assert count_runs(idx) == len(runs)
    # the runs cover the ids, in order
    assert [first + k for first, count, _ in runs for k in range(count)] == ids


def test_check_handle():
    handle = bytes(range(64))
    assert check_handle(handle) == handle
    assert type(check_handle(bytearray(handle))) is bytes  # CuPy's ipcOpenMemHandle takes bytes only
    assert check_handle(memoryview(handle)) == handle
    with pytest.raises(ValueError, match="64 bytes, got 63"):
        check_handle(handle[:63])
    with pytest.raises(TypeError, match="decode_responses"):
        check_handle(handle.decode("latin-1"))
    with pytest.raises(TypeError):
        check_handle(1234)


def test_unavailable_message():
    exc = unavailable("no CUDA device is visible")
    assert isinstance(exc, ValueError)  # the server turns ValueError into a startup error
    assert str(exc) == (
        "arena cuda needs CuPy (pip install pfxcache[cuda12] or [cuda13]) and an NVIDIA GPU: "
        "no CUDA device is visible"
    )


def _arena_map(**changes):
    info = {"backend": "cuda", "name": "", "size": 4 * 256, "block_bytes": 256, "nblocks": 4,
            "device": 0, "handle": bytes(range(64)), "pid": 1, "blocks-total": 4, "blocks-free": 4}
    info.update(changes)
    return info


def test_parse_arena_info():
    parsed = parse_arena_info(_arena_map())
    assert parsed == CudaArenaInfo(device=0, handle=bytes(range(64)), size=1024, block_bytes=256, nblocks=4, pid=1)
    # what redis-py gives without decode_responses: bytes keys and values
    raw = {k.encode(): (v.encode() if isinstance(v, str) else v) for k, v in _arena_map(device=1).items()}
    assert parse_arena_info(raw).device == 1
    assert parse_arena_info(_arena_map(nblocks=b"4")).nblocks == 4  # a RESP2 integer read as a string
    # a decoder that turned an all-ASCII handle into text: encoded back exactly
    assert parse_arena_info(_arena_map(handle="h" * 64)).handle == b"h" * 64
    assert parse_arena_info(_arena_map(handle=bytes(range(64)).decode())).handle == bytes(range(64))


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"backend": "shm"}, ValueError, "not 'cuda'"),
        ({"backend": b"memory"}, ValueError, "'memory', not 'cuda'"),
        ({"handle": b"short"}, ValueError, "64 bytes"),
        ({"handle": "x" * 63}, ValueError, "64 bytes, got 63"),
        ({"handle": 64}, TypeError, "bytes"),
        ({"size": 1000}, ValueError, "size 1000 != nblocks 4 x block_bytes 256"),
        ({"nblocks": 0}, ValueError, "nblocks"),
        ({"device": -1}, ValueError, "device"),
        ({"device": "gpu"}, ValueError, "integer"),
    ],
)
def test_parse_arena_info_refuses(changes, error, match):
    with pytest.raises(error, match=match):
        parse_arena_info(_arena_map(**changes))


def test_parse_arena_info_missing_field():
    info = _arena_map()
    del info["handle"]
    with pytest.raises(ValueError, match="no 'handle'"):
        parse_arena_info(info)
    with pytest.raises(TypeError):
        parse_arena_info([("backend", "cuda")])


def test_attach_refuses_the_exporting_process():
    # CUDA IPC cannot open a handle in the process that exported it: refused before CuPy is touched.
    with pytest.raises(ValueError, match="process that exported it"):
        attach_cuda(_arena_map(pid=os.getpid()))


def test_block_index():
    assert block_index([3, 0, 2], 4).tolist() == [3, 0, 2]
    assert block_index(iter([1, 2]), 4).dtype == np.int64
    assert block_index([], 4).size == 0
    assert block_index(np.array([1, 2], dtype=np.uint32), 4).tolist() == [1, 2]
    for bad in ([4], [-1], [0, 7]):
        with pytest.raises(ValueError, match="out of range 0..3"):
            block_index(bad, 4)
    with pytest.raises(ValueError, match="flat"):
        block_index([[1, 2]], 4)
    with pytest.raises(ValueError, match="integers"):
        block_index([1.5], 4)
    with pytest.raises(TypeError):
        block_index(3, 4)


@pytest.mark.parametrize(
    ("block_bytes", "pointers", "size"),
    [
        (16384, (0x7F0000000000, 0x7F0000001000), 8),
        (16384, (0x7F0000000004,), 4),
        (6, (0,), 2),
        (12, (8,), 4),
        (7, (0,), 1),
        (16, (0x1001,), 1),
    ],
)
def test_word_bytes(block_bytes, pointers, size):
    assert word_bytes(block_bytes, *pointers) == size


# ---------------------------------------------------------------------------
# A CPU stand-in for the slice of CuPy we use (same names and signatures)
# ---------------------------------------------------------------------------

FAKE_CUPY = textwrap.dedent(
    '''
    """A CPU stand-in for the part of CuPy pfxcache uses: "device memory" is host memory."""
    import ctypes
    import struct
    import threading
    import types

    import numpy as np

    uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
    calls = {"sync": 0, "memcpy": 0, "open": 0, "close": 0, "free": 0}
    _local = threading.local()
    _allocations = {}


    class _Runtime:
        memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice, memcpyDefault = range(5)
        cudaIpcMemLazyEnablePeerAccess = 1

        @staticmethod
        def getDeviceCount():
            return 1

        @staticmethod
        def memcpy(dst, src, size, kind):
            assert all(isinstance(v, int) for v in (dst, src, size, kind)), "memcpy takes ints"
            calls["memcpy"] += 1
            ctypes.memmove(dst, src, size)

        @staticmethod
        def memcpyAsync(dst, src, size, kind, stream):
            assert all(isinstance(v, int) for v in (dst, src, size, kind, stream)), "memcpyAsync takes ints"
            calls["memcpy"] += 1
            ctypes.memmove(dst, src, size)

        @staticmethod
        def memset(ptr, value, size):
            ctypes.memset(ptr, value, size)

        @staticmethod
        def memsetAsync(ptr, value, size, stream):
            assert all(isinstance(v, int) for v in (ptr, value, size, stream)), "memsetAsync takes ints"
            ctypes.memset(ptr, value, size)

        @staticmethod
        def deviceSynchronize():
            calls["sync"] += 1

        @staticmethod
        def ipcGetMemHandle(devPtr):
            assert devPtr in _allocations, "ipcGetMemHandle needs the base of a cudaMalloc allocation"
            return struct.pack("<QQ", devPtr, _allocations[devPtr]) + bytes(48)

        @staticmethod
        def ipcOpenMemHandle(handle, flags=1):
            if type(handle) is not bytes:  # a Cython `bytes handle` argument
                raise TypeError("Argument 'handle' has incorrect type (expected bytes)")
            calls["open"] += 1
            return struct.unpack("<Q", handle[:8])[0]

        @staticmethod
        def ipcCloseMemHandle(devPtr):
            calls["close"] += 1


    class Device:
        def __init__(self, device=None):
            self.id = 0 if device is None else int(device)
            assert self.id == 0, "the stand-in has one device"

        def __enter__(self):
            self._previous = getattr(_local, "device", None)
            _local.device = self.id
            return self

        def __exit__(self, *exc):
            _local.device = self._previous

        def synchronize(self):
            calls["sync"] += 1


    class Memory:
        def __init__(self, size):
            assert getattr(_local, "device", None) is not None, "allocate inside `with Device(...)`"
            self._buffer = ctypes.create_string_buffer(size)
            self.ptr, self.size, self.device_id = ctypes.addressof(self._buffer), size, _local.device
            _allocations[self.ptr] = size

        def __del__(self):
            _allocations.pop(self.ptr, None)
            calls["free"] += 1


    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id=-1):
            self.ptr, self.size, self._owner, self.device_id = ptr, size, owner, device_id


    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr, self.device_id = mem, mem.ptr + offset, mem.device_id


    class _Stream:
        ptr = 0

        def synchronize(self):
            calls["sync"] += 1


    class ndarray(np.ndarray):
        def __new__(cls, shape, dtype=float, memptr=None, strides=None, order="C"):
            assert memptr is not None and strides is None and order == "C"
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            raw = (ctypes.c_uint8 * nbytes).from_address(memptr.ptr)
            obj = np.frombuffer(raw, dtype=dtype).reshape(shape).view(cls)
            obj._keep = memptr
            return obj

        @property
        def data(self):
            return types.SimpleNamespace(ptr=self.ctypes.data)

        @property
        def device(self):
            return Device(0)


    def _wrap(array):
        return np.asarray(array).view(ndarray)


    def asarray(obj):
        return _wrap(np.array(obj, copy=True))


    def empty(shape, dtype=float):
        return _wrap(np.empty(shape, dtype))


    def take(a, indices, axis=None, out=None):
        result = np.take(np.asarray(a), np.asarray(indices), axis=axis, out=None if out is None else np.asarray(out))
        return _wrap(result) if out is None else out


    def from_dlpack(obj):
        return _wrap(np.from_dlpack(obj))


    cuda = types.SimpleNamespace(
        runtime=_Runtime, Device=Device, Memory=Memory, UnownedMemory=UnownedMemory,
        MemoryPointer=MemoryPointer, get_current_stream=lambda: _Stream(),
    )
    '''
)


@pytest.fixture
def fake_cupy():
    module = types.ModuleType("fake_cupy")
    exec(compile(FAKE_CUPY, "fake_cupy", "exec"), module.__dict__)
    return module


def pattern(ids, block_bytes):
    """A different byte pattern per block id."""
    return np.concatenate([(np.arange(block_bytes) * 7 + b * 13 + 1) % 251 for b in ids]).astype(np.uint8)


def test_cuda_arena_on_the_stand_in(fake_cupy):
    arena = CudaArena(64, 40, device=0, cupy=fake_cupy)
    info = arena.describe()
    assert info["backend"] == "cuda" and info["device"] == 0 and info["pid"] == os.getpid()
    assert (info["size"], info["block_bytes"], info["nblocks"]) == (64 * 40, 64, 40)
    assert isinstance(info["handle"], bytes) and len(info["handle"]) == IPC_HANDLE_BYTES
    assert arena.read([0, 39]) == bytes(128)  # zeroed at creation

    # few runs: one cudaMemcpy per run; many runs: one staged scatter/gather
    for ids in ([3, 4, 5, 10], list(range(39, 9, -1))):
        before = fake_cupy.calls["sync"]
        data = pattern(ids, 64).tobytes()
        arena.write(ids, memoryview(data))
        assert fake_cupy.calls["sync"] > before  # on the device for everyone before PFXSET replies
        assert arena.read(ids) == data
        out = bytearray(len(data))
        arena.read_into(ids, out)
        assert out == data
    assert arena.read([]) == b""
    arena.write([], b"")

    with pytest.raises(BadRequest, match="out of range"):
        arena.read([40])
    with pytest.raises(BadRequest, match="out of range"):
        arena.write([-1], bytes(64))
    with pytest.raises(BadRequest, match="expected 128"):
        arena.write([1, 2], bytes(64))
    with pytest.raises(BadRequest, match="expected 64"):
        arena.read_into([1], bytearray(10))
    with pytest.raises(NotImplementedError):
        arena.view(0)
    arena.close()
    arena.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        arena.read([0])


def test_cuda_arena_zero_on_the_stand_in(fake_cupy):
    # Fresh blocks never show their last owner's bytes: one memset per run, or one scatter of zeros.
    arena = CudaArena(16, 64, cupy=fake_cupy)
    everything = list(range(64))
    arena.write(everything, pattern(everything, 16).tobytes())
    for ids in ([3, 4, 5, 9], list(range(63, 20, -2))):
        arena.zero(ids)
        assert arena.read(ids) == bytes(16 * len(ids))
    untouched = [b for b in everything if b not in {3, 4, 5, 9} and not (b > 20 and b % 2)]
    assert arena.read(untouched) == pattern(untouched, 16).tobytes()
    arena.close()


def test_cuda_arena_in_a_thread(fake_cupy):
    # PrefixService copies large data in a worker thread: each call selects the device itself.
    import threading

    arena = CudaArena(32, 8, cupy=fake_cupy)
    data = pattern([1, 6], 32).tobytes()
    thread = threading.Thread(target=arena.write, args=([1, 6], data))
    thread.start()
    thread.join()
    assert arena.read([1, 6]) == data
    arena.close()


def test_load_cupy_errors(monkeypatch, fake_cupy):
    from pfxcache.daemon.store import cuda_arena

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    with pytest.raises(CudaUnavailable, match="arena-device 3 does not exist \\(devices 0..0 are visible\\)"):
        cuda_arena.load_cupy(3)
    assert cuda_arena.load_cupy(0) is fake_cupy

    def broken():
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    monkeypatch.setattr(fake_cupy.cuda.runtime, "getDeviceCount", staticmethod(broken))
    with pytest.raises(CudaUnavailable, match="no usable CUDA device \\(RuntimeError: cudaErrorNoDevice"):
        cuda_arena.load_cupy(0)


def test_client_view_on_the_stand_in(fake_cupy):
    bb = 64
    arena = CudaArena(bb, 80, cupy=fake_cupy)
    info = dict(arena.describe(), pid=os.getpid() + 1)  # as a worker process sees it
    view = attach_cuda(info, cupy=fake_cupy)
    assert fake_cupy.calls["open"] == 1 and view.attach_seconds >= 0
    assert view.array.shape == (80, bb) and view.ptr == arena.ptr

    # write_from/read_into: a few runs (memcpyAsync per run) and many runs (one scatter/gather
    # kernel over uint64 words)
    for ids in ([7, 8, 9, 20], [79 - 2 * k for k in range(36)]):
        src = fake_cupy.asarray(pattern(ids, bb).reshape(len(ids), bb))
        syncs = fake_cupy.calls["sync"]
        view.write_from(ids, src)
        assert fake_cupy.calls["sync"] == syncs + 1  # ready to hand over with PFXSET BLOCKS
        assert arena.read(ids) == pattern(ids, bb).tobytes()  # the daemon sees it
        out = fake_cupy.empty((len(ids) * bb // 4,), np.float32)  # any dtype, same bytes
        view.read_into(ids, out)
        assert np.asarray(out).view(np.uint8).tobytes() == pattern(ids, bb).tobytes()
        assert np.asarray(view.blocks(ids)).tobytes() == pattern(ids, bb).tobytes()

    # blocks(): a view for one run (writes land in the arena), a copy otherwise
    run = view.blocks([7, 8])
    run[0, 0] = 222
    assert arena.read([7])[0] == 222
    scattered = view.blocks([7, 20])
    scattered[0, 0] = 111
    assert arena.read([7])[0] == 222
    assert np.asarray(view.block(9)).tobytes() == pattern([9], bb).tobytes()

    with pytest.raises(ValueError, match="out of range"):
        view.read_into([80], fake_cupy.empty((bb,), np.uint8))
    with pytest.raises(ValueError, match="src is 64 bytes, 2 blocks x 64 bytes take 128"):
        view.write_from([1, 2], fake_cupy.empty((bb,), np.uint8))
    with pytest.raises(ValueError, match="C-contiguous"):
        view.read_into([1, 2], fake_cupy.empty((bb, 4), np.uint8)[:, ::2].copy().T)
    with pytest.raises(ValueError, match="repeat"):
        view.write_from([1] * 20 + list(range(2, 40, 2)),
                        fake_cupy.empty((39 * bb,), np.uint8))
    with pytest.raises(TypeError, match="host buffer, not int"):
        view.write_from([1], 12)

    # host buffers: device to host / host to device, into the start of a larger output
    ids = [30, 31, 3]
    assert view.write_from(ids, pattern(ids, bb).tobytes()) == 3 * bb
    host = np.zeros(5 * bb, np.uint8)
    assert view.read_into(ids, host) == 3 * bb
    assert host[: 3 * bb].tobytes() == pattern(ids, bb).tobytes() and not host[3 * bb:].any()
    many = list(range(79, 39, -1))  # 40 runs: staged gather/scatter for host buffers too
    view.write_from(many, bytearray(pattern(many, bb).tobytes()))
    out = bytearray(len(many) * bb)
    view.read_into(many, out)
    assert bytes(out) == pattern(many, bb).tobytes() == arena.read(many)
    with pytest.raises(ValueError, match="read-only"):
        view.read_into(ids, bytes(3 * bb))
    with pytest.raises(ValueError, match="out holds 64 bytes, 3 blocks need 192"):
        view.read_into(ids, bytearray(bb))
    assert view.read_into([], bytearray()) == 0

    view.close()
    view.close()
    assert fake_cupy.calls["close"] == 1 and view.closed
    with pytest.raises(ValueError, match="closed"):
        view.blocks([1])
    arena.close()


def test_client_torch_paths_on_the_stand_in(fake_cupy):
    torch = pytest.importorskip("torch")
    arena = CudaArena(16, 8, cupy=fake_cupy)
    view = attach_cuda(dict(arena.describe(), pid=os.getpid() + 1), cupy=fake_cupy)
    arena.write([2, 3], pattern([2, 3], 16).tobytes())
    tensor = view.torch_blocks([2, 3])  # through DLPack (a CPU tensor with the stand-in)
    assert isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == (2, 16)
    assert tensor.numpy().tobytes() == pattern([2, 3], 16).tobytes()
    out = torch.zeros(4, 8, dtype=torch.float16)  # a CPU tensor: a host buffer, any dtype, 64 bytes
    assert view.read_into([2, 3], out) == 32
    assert out.numpy().tobytes() == pattern([2, 3], 16).tobytes() + bytes(32)
    view.write_from([5], torch.full((16,), 9, dtype=torch.uint8))
    assert arena.read([5]) == bytes([9]) * 16
    view.close()
    arena.close()


def test_prefix_service_describe_carries_the_handle(monkeypatch, fake_cupy):
    from pfxcache.daemon.config.engine import Config
    from pfxcache.daemon.service.prefix import PrefixService
    from pfxcache.daemon.store import cuda_arena
    from pfxcache.protocol.replies import encode

    monkeypatch.setattr(cuda_arena, "load_cupy", lambda device: fake_cupy)
    config = Config()
    config.apply_args(["--arena", "cuda", "--arena-device", "0", "--maxmemory", "1mb", "--block-bytes", "4096"])
    service = PrefixService(config, tcp_port=0)
    try:
        info = service.describe()
        handle = info["arena"]["handle"]
        assert info["arena"]["backend"] == "cuda" and len(handle) == 64
        for resp in (2, 3):
            assert b"$6\r\nhandle\r\n$64\r\n" + handle + b"\r\n" in encode(info, resp)
        assert dict(service.info_section())["pfxcache_arena"] == "cuda"
    finally:
        service.close()


def test_daemon_with_the_stand_in(tmp_path):
    """A whole daemon on ``--arena cuda``, CuPy replaced by the stand-in: the commands, PFXINFO, big copies."""
    (tmp_path / "cupy.py").write_text(FAKE_CUPY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    script = textwrap.dedent(
        """
        import sys
        from pfxcache.testing import start_daemon
        daemon = start_daemon("--arena", "cuda", "--page-size", "4", "--block-bytes", "256kb",
                              "--maxmemory", "16mb")
        print(daemon.port, flush=True)
        sys.stdin.readline()
        sys.exit(daemon.stop())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        tokens = list(range(1, 4 * 8 + 1))  # 8 pages x 256 KiB = 2 MiB: copied in a worker thread
        data = pattern(range(8), 256 * 1024).tobytes()
        with RawClient(("127.0.0.1", port)) as client:
            reply = client.call_raw("PFXSET", "ns", "TOKENS", *map(str, tokens), "DATA", data, settle=1.0)
            assert b"stored" in reply and b":8\r\n" in reply
            client.send(encode_command("PFXGET", "ns", "TOKENS", *map(str, tokens), "NOLEASE", "WITHDATA"))
            reply = b""
            while data not in reply:
                chunk = client.read_raw(settle=1.0)
                assert chunk, reply[:200]
                reply += chunk
            info = client.call_raw("PFXINFO")
            assert b"cuda" in info and b"$6\r\nhandle\r\n$64\r\n" in info and b"pid" in info
    finally:
        proc.stdin.write("\n")
        proc.stdin.close()
        assert proc.wait(30) == 0


# ---------------------------------------------------------------------------
# `arena cuda` without CuPy: a clear startup error (runs everywhere CuPy is absent)
# ---------------------------------------------------------------------------


def _gpu_count() -> int:
    try:
        import cupy
    except Exception:
        return 0
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def _start_failing_daemon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pfxcache.daemon", "--port", "0", *args],
                          check=False, capture_output=True, text=True, timeout=60)


def test_arena_cuda_without_cupy_is_a_startup_error():
    if _gpu_count():
        pytest.skip("CuPy and a GPU are here: the daemon would start (see the gpu tests)")
    done = _start_failing_daemon("--arena", "cuda")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Cannot create the block arena: arena cuda needs CuPy (pip install pfxcache[cuda12] or [cuda13]) " \
           "and an NVIDIA GPU: " in output
    assert "Ready to accept" not in output and "Traceback" not in output


def test_arena_device_is_a_directive():
    done = _start_failing_daemon("--arena-device", "-1")
    assert done.returncode == 1 and "arena-device" in done.stdout + done.stderr


# ---------------------------------------------------------------------------
# Real GPU: CuPy, a device, a daemon and worker processes (skipped elsewhere)
# ---------------------------------------------------------------------------

gpu = pytest.mark.gpu

WORKER = textwrap.dedent(
    """
    import json, sys
    import cupy, numpy as np, redis
    from pfxcache.client.cuda import attach_cuda

    port, role, npages = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    r = redis.Redis(port=port, protocol=3)
    info = r.execute_command("PFXINFO")
    page = info[b"page-size"]
    arena = attach_cuda({k.decode(): v for k, v in info[b"arena"].items()})
    bb = arena.block_bytes
    tokens = np.arange(1, npages * page + 1, dtype="<u4").tobytes()
    # page i holds this pattern, whichever block the daemon gave it
    expected = cupy.asarray(np.concatenate([(np.arange(bb) * 7 + i * 13 + 1) % 251
                                            for i in range(npages)]).astype(np.uint8))
    if role == "write":
        alloc = r.execute_command("PFXALLOC", "ns", npages)
        blocks = alloc[b"blocks"]
        arena.write_from(blocks, expected)
        stored = r.execute_command("PFXSET", "ns", "PACKED", tokens, "BLOCKS", *blocks)
        result = {"ok": stored[b"stored"] == npages, "blocks": blocks}
    else:
        hit = r.execute_command("PFXGET", "ns", "PACKED", tokens)
        out = cupy.zeros(npages * bb, dtype=cupy.uint8)
        arena.read_into(hit[b"blocks"], out)
        r.execute_command("PFXRELEASE", hit[b"lease"])
        result = {"ok": hit[b"matched"] == npages * page and bool((out == expected).all()),
                  "blocks": hit[b"blocks"]}
    arena.close()
    print(json.dumps(result))
    """
)


@pytest.fixture
def gpu_daemon():
    pytest.importorskip("cupy")
    if _gpu_count() < 1:
        pytest.skip("no CUDA device")
    daemon = start_daemon("--arena", "cuda", "--maxmemory", "64mb", "--block-bytes", "64kb", "--page-size", "4")
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def _worker(port: int, role: str, npages: int) -> dict:
    done = subprocess.run([sys.executable, "-c", WORKER, str(port), role, str(npages)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@gpu
def test_gpu_arena_in_process():
    cupy = pytest.importorskip("cupy")
    if _gpu_count() < 1:
        pytest.skip("no CUDA device")
    arena = CudaArena(4096, 64, device=0)
    try:
        info = arena.describe()
        assert len(info["handle"]) == 64 and info["pid"] == os.getpid()
        # plain device memory (cudaMemoryTypeDevice = 2), not managed memory (3)
        assert cupy.cuda.runtime.pointerGetAttributes(arena.ptr).type == 2
        for ids in ([1, 2, 3], list(range(63, 0, -3))):
            data = pattern(ids, 4096).tobytes()
            arena.write(ids, data)
            assert arena.read(ids) == data
    finally:
        arena.close()


@gpu
def test_gpu_workers_exchange_blocks(gpu_daemon):
    import redis

    r = redis.Redis(port=gpu_daemon.port, protocol=3)
    info = r.execute_command("PFXINFO")[b"arena"]
    assert info[b"backend"] == b"cuda" and len(info[b"handle"]) == 64 and info[b"pid"] == gpu_daemon.proc.pid
    npages = 24
    written = _worker(gpu_daemon.port, "write", npages)
    assert written["ok"]
    read = _worker(gpu_daemon.port, "read", npages)
    assert read == {"ok": True, "blocks": written["blocks"]}
    # the daemon's host copy of the same blocks agrees (PFXGET WITHDATA)
    tokens = np.arange(1, npages * 4 + 1, dtype="<u4").tobytes()
    reply = r.execute_command("PFXGET", "ns", "PACKED", tokens, "NOLEASE", "WITHDATA")
    assert reply[b"data"] == pattern(range(npages), 64 * 1024).tobytes()


@gpu
def test_gpu_bad_device_is_a_startup_error():
    pytest.importorskip("cupy")
    count = _gpu_count()
    if count < 1:
        pytest.skip("no CUDA device")
    done = _start_failing_daemon("--arena", "cuda", "--arena-device", str(count))
    assert done.returncode == 1
    assert f"arena-device {count} does not exist" in done.stdout + done.stderr
