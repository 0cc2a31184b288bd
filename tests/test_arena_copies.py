"""Worker-side arena copies: aligned KV buffers, read_into / write_from over runs and scattered ids.

The arena is a real shared-memory file mapped by ``ShmArenaView`` (what a
worker maps from the daemon); numpy's fancy indexing is the oracle for every
id pattern: one run, runs of various lengths, fully scattered, repeated ids.
"""

from __future__ import annotations

import numpy as np
import pytest

from pfxcache.client import ShmArenaView, kv_buffer
from pfxcache.client.arena import BUFFER_ALIGN

BB = 512
NBLOCKS = 256


@pytest.fixture
def arena(tmp_path):
    path = tmp_path / "arena"
    path.write_bytes(np.random.default_rng(3).integers(0, 256, BB * NBLOCKS, dtype=np.uint8).tobytes())
    view = ShmArenaView(str(path), BB, NBLOCKS)
    yield view
    view.close()


def _patterns():
    rng = np.random.default_rng(5)
    return {
        "one run": np.arange(40, 72),
        "runs": np.concatenate([np.arange(10, 30), np.arange(100, 120), np.arange(5, 9), [200]]),
        "scattered": rng.permutation(NBLOCKS)[:64],
        "descending": np.arange(80, 60, -1),
        "repeated": np.array([7, 8, 9, 7, 8, 9, 7, 8, 9, 10, 11, 12]),
        "single": np.array([3]),
        "empty": np.array([], dtype=np.int64),
    }


@pytest.mark.parametrize("name", list(_patterns()))
def test_read_into_matches_fancy_indexing(arena, name):
    ids = _patterns()[name]
    expected = arena.array[ids].tobytes()
    out = kv_buffer((len(ids), BB))
    assert arena.read_into(ids, out) == len(ids) * BB
    assert out.tobytes() == expected
    unaligned = np.zeros(len(ids) * BB + 1, np.uint8)[1:]  # any C-contiguous buffer still works
    arena.read_into(list(ids), unaligned)
    assert unaligned.tobytes() == expected


@pytest.mark.parametrize("name", [n for n in _patterns() if n != "repeated"])
def test_write_from_matches_fancy_indexing(arena, name):
    ids = _patterns()[name]
    src = np.random.default_rng(len(ids)).integers(0, 256, (len(ids), BB), dtype=np.uint8)
    expected = arena.array.copy()
    expected[ids] = src
    assert arena.write_from(ids, src) == len(ids) * BB
    assert np.array_equal(arena.array, expected)


def test_kv_buffer_is_aligned_zeroed_and_typed():
    buf = kv_buffer((5, BB))
    assert buf.shape == (5, BB) and buf.dtype == np.uint8 and buf.flags.c_contiguous and buf.flags.writeable
    assert buf.ctypes.data % BUFFER_ALIGN == 0 and not buf.any()
    halves = kv_buffer((3, 7), np.float16, align=64)
    assert halves.dtype == np.float16 and halves.shape == (3, 7) and halves.ctypes.data % 64 == 0
    assert kv_buffer(10).shape == (10,) and kv_buffer((0, BB)).size == 0
    with pytest.raises(ValueError, match="power of two"):
        kv_buffer(4, align=48)


def test_kv_buffer_torch():
    torch = pytest.importorskip("torch")
    t = kv_buffer((4, 8), torch.bfloat16)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 and t.shape == (4, 8)
    assert t.data_ptr() % BUFFER_ALIGN == 0 and not t.any()
    u = kv_buffer((2, BB), torch=True)
    assert u.dtype == torch.uint8 and u.data_ptr() % BUFFER_ALIGN == 0


def test_read_into_torch_kv_buffer(arena):
    torch = pytest.importorskip("torch")
    ids = _patterns()["runs"]
    out = kv_buffer((len(ids), BB // 2), torch.float16)
    arena.read_into(ids, out)
    assert out.view(torch.uint8).numpy().tobytes() == arena.array[ids].tobytes()
