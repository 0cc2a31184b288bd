"""One Mooncake Store client, run by scripts/bench under the Mooncake peer's own venv (see mooncake_peer).

Imports only mooncake and numpy (pfxcache is not installed there). Two roles:

    python mooncake_worker.py holder MASTER METADATA HOST:PORT CHUNKS CHUNK_BYTES
        mounts a global segment, puts CHUNKS objects of CHUNK_BYTES under the chunk keys
        of the benchmark prompt, prints "ready", and holds them until stdin closes;
    python mooncake_worker.py reader MASTER METADATA HOST:PORT CHUNKS CHUNK_BYTES SECONDS [CALLS]
        repeats a worker's lookup for SECONDS (and at least CALLS times, default 5): batch_is_exist over the prompt's chunk keys
        (the cached prefix is the leading run of keys that exist), then batch_get_into of
        those chunks into a registered page-aligned buffer; prints one JSON line with every
        call's seconds and what was fetched.

The chunk keys are the hash chain vLLM-style connectors use (key i = sha256 of key i-1 and
chunk i's token ids), computed once before timing: an engine has its block hashes already.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import numpy as np
from mooncake.store import MooncakeDistributedStore

PAGE_TOKENS = 16


def chunk_keys(chunks: int) -> list[str]:
    tokens = np.arange(1000, 1000 + chunks * PAGE_TOKENS, dtype="<u4")
    keys, parent = [], b""
    for i in range(chunks):
        parent = hashlib.sha256(parent + tokens[i * PAGE_TOKENS : (i + 1) * PAGE_TOKENS].tobytes()).digest()
        keys.append("pfxbench-" + parent.hex()[:32])
    return keys


def payload(total: int) -> np.ndarray:
    """The bytes the holder stores (the reader checks what it fetched against them)."""
    return np.random.default_rng(1).integers(0, 256, total, dtype=np.uint8)


def connect(master: str, metadata: str, local: str, segment_bytes: int, buffer_bytes: int) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    rc = store.setup(local, metadata, segment_bytes, buffer_bytes, "tcp", "", master)
    if rc != 0:
        raise SystemExit(f"mooncake setup failed with {rc}")
    return store


def main() -> None:
    role, master, metadata, local = sys.argv[1:5]
    chunks, chunk_bytes = int(sys.argv[5]), int(sys.argv[6])
    keys = chunk_keys(chunks)
    total = chunks * chunk_bytes
    if role == "holder":
        store = connect(master, metadata, local, 2 * total + (64 << 20), 64 << 20)
        data = payload(total)
        for i, key in enumerate(keys):
            rc = store.put(key, data[i * chunk_bytes : (i + 1) * chunk_bytes].tobytes())
            if rc != 0:
                raise SystemExit(f"mooncake put failed with {rc}")
        print("ready", flush=True)
        sys.stdin.read()  # hold the objects until the benchmark closes our stdin
        store.close()
        return
    seconds = float(sys.argv[7])
    calls = int(sys.argv[8]) if len(sys.argv) > 8 else 5
    store = connect(master, metadata, local, 0, total + (16 << 20))
    raw = np.zeros(total + 4096, np.uint8)
    buf = raw[-raw.ctypes.data % 4096 :][:total]
    if store.register_buffer(buf.ctypes.data, total) != 0:
        raise SystemExit("mooncake register_buffer failed")
    ptrs = [buf.ctypes.data + i * chunk_bytes for i in range(chunks)]
    sizes = [chunk_bytes] * chunks
    times, fetched = [], 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < calls:
        start = time.perf_counter()
        exists = store.batch_is_exist(keys)
        n = next((i for i, e in enumerate(exists) if e != 1), len(exists))
        got = store.batch_get_into(keys[:n], ptrs[:n], sizes[:n])
        times.append(time.perf_counter() - start)
        fetched = sum(g for g in got if g > 0)
    intact = bool(np.array_equal(buf[:fetched], payload(total)[:fetched]))
    print(json.dumps({"times": times, "chunks": n, "bytes": fetched, "intact": intact}), flush=True)
    store.close()


if __name__ == "__main__":
    main()
