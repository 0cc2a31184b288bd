"""SGLang HiCache's L3 through pfxcache vs SGLang's own file backend and vs memcpy: 64 pages at a time.

Everything is SGLang 0.5.23's own code: its ``StorageBackendFactory`` creates both backends
(``dynamic`` for ``pfxcache.client.sglang.PrefixCacheStorage``, ``file`` for ``HiCacheFile``) and its
``MHATokenToKVPoolHost`` (``page_first``, CPU) is the host pool they copy from and into. Each round
stores --pages fresh pages (a new prompt's SHA-256 chain) and reads them back, every byte checked:

* ``file``: ``HiCacheFile.batch_set`` / ``batch_get`` of flat page tensors (a file per page, in a
  temporary folder on this machine's disk: SGLang's ``file`` backend as shipped). Its get is timed
  twice: ``(disk)`` after the files were written out and dropped from the page cache (``fsync`` +
  ``POSIX_FADV_DONTNEED``), ``(cached)`` right after, with every file in the page cache;
* ``pfxcache``: ``PrefixCacheStorage.batch_set`` / ``batch_get`` of the same tensors (SGLang's
  generic path), and ``batch_set_v1`` / ``batch_get_v1`` between the host pool and the daemon's
  arena (``interface_v1``: zero-copy when the daemon is on this host; ``v1-resp``: the same over RESP);
* ``memcpy``: ``np.copyto`` of the same bytes between two page-aligned buffers (the floor), and
  ``memcpy pieces``: the same in the pieces the host pool's pages are made of (a page-wise copy's floor);
* ``mooncake get`` (``--mooncake``): what a user would pick instead, Mooncake Store's CPU build over TCP on
  loopback (``pfxcache.tools.mooncake_peer``, its own venv from ``scripts/setup mooncake``): a master, a
  client holding the same number of pages of the same size, and a reader doing SGLang's Mooncake
  backend's get, ``batch_is_exist`` then ``batch_get_into`` a registered buffer, every byte checked.

Reported: the median time of each call over --rounds (after --warmup rounds, which touch every page
of the arena once: first-touch page faults are not what a running server pays), its GB/s,
pfxcache's speedup over the file backend (target >= 2x), the v1 copies against memcpy (target
>= 0.8x) and, side by side with no target, the gets against Mooncake's. The daemons are started here
with --block-bytes of one page (the layout's flat page) and evict older rounds as they fill: one for
the arena path, one for the RESP path (another host's daemon).

    scripts/bench-sglang-backend
    scripts/bench-sglang-backend --layers 32 --heads 8 --head-dim 128 --page-size 16 --pages 64 --json
    scripts/setup mooncake && scripts/bench-sglang-backend --mooncake
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import types
from typing import Any

import numpy as np

from pfxcache.testing import start_daemon
from pfxcache.tools.common import command_line, machine, progress_bar, tool_parser

SGLANG_SETUP = "pip install --no-deps sglang==0.5.23 plus its storage code's imports (see scripts/setup test)"


@contextlib.contextmanager
def _vision_stand_in():
    """SGLang's config package imports ``torchvision.transforms`` at module level for its vision models,
    and PyPI has no CPU build of torchvision for this torch: while SGLang's host pool module is
    imported, an empty module answers for it (nothing of it runs), and it is gone again afterwards."""
    try:
        import torchvision  # noqa: F401  (a real one: nothing to stand in for)
        yield
        return
    except ImportError:
        pass
    import transformers  # its own torchvision check must run before the stand-in exists

    transformers.AutoProcessor  # noqa: B018  (resolves transformers' lazy vision imports now)

    class Anything(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {})

    names = ["torchvision", "torchvision.transforms", "torchvision.transforms.functional",
             "torchvision.transforms.v2", "torchvision.io", "torchvision.ops"]
    added = [name for name in names if name not in sys.modules]
    for name in added:
        module = Anything(name)
        module.__path__ = []
        sys.modules[name] = module
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


def host_pool(pages: int, *, layers: int = 2, heads: int = 2, head_dim: int = 8, page_size: int = 4,
              dtype: Any = None, layout: str = "page_first") -> Any:
    """SGLang's own ``MHATokenToKVPoolHost`` on the CPU: ``pages`` pages (plus SGLang's padding page)."""
    import torch

    with _vision_stand_in():
        from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    dtype = dtype or torch.bfloat16
    tokens = page_size
    k = tuple(torch.zeros(tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
    v = tuple(torch.zeros(tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
    buffers = KVBuffers(k=k, v=v, k_data_ptrs=torch.tensor([t.data_ptr() for t in k]),
                        v_data_ptrs=torch.tensor([t.data_ptr() for t in v]), layout=KVBufferLayout.NHD)
    info = MHABufferInfo(buffers=buffers, page_size=page_size, head_num=heads, head_dim=head_dim,
                         v_head_dim=head_dim, dtype=dtype, device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, pages, 0, page_size, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=layers)


def storage_config(extra: dict | None = None, *, tp_rank: int = 0, tp_size: int = 1, mla: bool = False,
                   model: str = "org/model") -> Any:
    """SGLang's ``HiCacheStorageConfig`` of one rank, with ``extra`` as its extra config."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
                                is_page_first_layout=True, model_name=model, extra_config=dict(extra or {}))


def pfxcache_extra(url: str, **options: Any) -> dict:
    """The extra config that makes SGLang's ``dynamic`` backend load PrefixCacheStorage."""
    return {"backend_name": "pfxcache", "module_path": "pfxcache.client.sglang", "class_name": "PrefixCacheStorage",
            "pfxcache_url": url, "interface_v1": 1, **options}


def create(name: str, config: Any, pool: Any = None) -> Any:
    """A backend made by SGLang's own factory, the host pool registered as SGLang does."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    backend = StorageBackendFactory.create_backend(name, config, pool)
    if pool is not None:
        backend.register_mem_pool_host(pool)
    return backend


def drop_page_cache(folder: str) -> None:
    """Write the folder's files out and drop them from the page cache, so the next read comes from disk."""
    for name in os.listdir(folder):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("bench-sglang-backend", __doc__)
    parser.add_argument("--pages", type=int, default=64, help="pages per call (default 64)")
    parser.add_argument("--layers", type=int, default=32, help="layers (default 32: Llama-3-8B)")
    parser.add_argument("--heads", type=int, default=8, help="KV heads of this rank (default 8)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim (default 128)")
    parser.add_argument("--page-size", type=int, default=16, help="tokens a page (default 16)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="rounds run first, not counted (default 2)")
    parser.add_argument("--mooncake", action="store_true",
                        help="also time Mooncake Store's get of the same pages (needs scripts/setup mooncake)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        import torch
        from pfxcache.client.sglang import page_keys
        from pfxcache.client.sglang_host_pool import HostPages
        from sglang.srt.mem_cache.hicache_storage import HiCacheFile  # noqa: F401  (the file backend)
    except ImportError as exc:
        print(f"bench-sglang-backend needs SGLang 0.5.23 ({SGLANG_SETUP}): {exc}", file=sys.stderr)
        return 2
    if args.mooncake:
        from pfxcache.tools import mooncake_peer

        try:
            mooncake_peer.locate()
        except mooncake_peer.PeerUnavailable as exc:
            print(f"bench-sglang-backend --mooncake: {exc}", file=sys.stderr)
            return 2
    import logging

    logging.getLogger("sglang").setLevel(logging.ERROR)
    n = args.pages
    pool = host_pool(3 * n, layers=args.layers, heads=args.heads, head_dim=args.head_dim,
                     page_size=args.page_size)
    page_bytes = pool.get_dummy_flat_data_page().numel() * pool.dtype.itemsize
    nbytes = n * page_bytes
    geometry = ("--page-size", str(max(4, args.page_size)), "--block-bytes", str(page_bytes),
                "--maxmemory", str(4 * nbytes), "--lease-ttl", "60000")
    # The RESP path (a daemon on another host) gets a daemon of its own: in one daemon, its pages would
    # take turns with the arena path's for the same blocks, which a rank's one namespace never does.
    daemon, remote = start_daemon(*geometry), start_daemon(*geometry)
    folder = tempfile.mkdtemp(prefix="pfx-bench-sglang-file-")
    url = f"redis://{daemon.host}:{daemon.port}/0"
    rng = random.Random(0)
    times: dict[str, list[float]] = {}
    way_of: dict[str, str] = {}
    try:
        shm = create("dynamic", storage_config(pfxcache_extra(url)), pool)
        resp = create("dynamic", storage_config(pfxcache_extra(f"redis://{remote.host}:{remote.port}/0",
                                                               pfxcache_transfer="resp")), pool)
        way_of["pfxcache"] = shm._cache.via if shm._cache is not None else "down"
        way_of["v1-resp"] = "resp"
        files = create("file", storage_config({"file_storage_path": folder}))
        # Pool pages 1..n hold what is stored, n+1..2n receive what is read (page 0 is SGLang's padding).
        src = torch.arange(0, n * args.page_size, dtype=torch.int64) + args.page_size
        dst = src + n * args.page_size
        pool.kv_buffer.view(torch.uint8).copy_(torch.randint(0, 256, pool.kv_buffer.view(torch.uint8).shape,
                                                             dtype=torch.uint8))
        values = [pool.get_data_page(int(src[i * args.page_size]), flat=True).clone() for i in range(n)]
        memcpy_src = torch.cat(values).view(torch.uint8).numpy()
        memcpy_dst = np.empty_like(memcpy_src)

        # The same bytes copied in the pieces a page_first page is made of (its K and V halves): the floor of
        # any page-wise copy, which glibc may run with other stores than one large copy (docs/benchmarks.md).
        plan = HostPages(pool, page_bytes).plan
        pieces = [(i * page_bytes + offset, size) for i in range(n) for _, offset, size in plan]

        def copy_pieces() -> None:
            for start, size in pieces:
                np.copyto(memcpy_dst[start:start + size], memcpy_src[start:start + size])

        def record(name: str, seconds: float) -> None:
            times.setdefault(name, []).append(seconds)

        def check(name: str, got: list) -> None:
            if any(g is None or not torch.equal(g.view(torch.uint8), v.view(torch.uint8))
                   for g, v in zip(got, values)):
                raise AssertionError(f"{name}: wrong bytes")

        def check_pool(name: str, ok: list[bool]) -> None:
            if not all(ok):
                raise AssertionError(f"{name}: {ok.count(False)} pages missing")
            for i in range(n):
                got = pool.get_data_page(int(dst[i * args.page_size]), flat=True)
                if not torch.equal(got.view(torch.uint8), values[i].view(torch.uint8)):  # bytes: NaN != NaN
                    raise AssertionError(f"{name}: wrong bytes in page {i}")
            pool.kv_buffer[:, int(dst[0]):int(dst[-1]) + 1].zero_()

        bar = progress_bar(args.warmup + args.rounds, "bench-sglang-backend", "round", quiet=args.quiet)
        for round_number in range(args.warmup + args.rounds):
            if round_number == args.warmup:
                times.clear()  # the warm-up rounds touched the arena's pages: faults are not measured

            def fresh() -> list[str]:
                return page_keys([rng.randrange(1 << 31) for _ in range(n * args.page_size)], args.page_size)

            record("memcpy", timed(lambda: np.copyto(memcpy_dst, memcpy_src))[0])
            record("memcpy pieces", timed(copy_pieces)[0])
            keys = fresh()
            seconds, ok = timed(lambda: files.batch_set(keys, values))
            if not ok:
                raise AssertionError("file: batch_set failed")
            record("file set", seconds)
            drop_page_cache(folder)
            targets = [pool.get_dummy_flat_data_page() for _ in range(n)]
            seconds, got = timed(lambda: files.batch_get(keys, targets))
            record("file get (disk)", seconds)
            check("file", got)
            seconds, got = timed(lambda: files.batch_get(keys, targets))
            record("file get (cached)", seconds)
            check("file", got)
            keys = fresh()
            seconds, ok = timed(lambda: shm.batch_set(keys, values))
            if not ok:
                raise AssertionError("pfxcache: batch_set failed (is the daemon's log clean?)")
            record("pfxcache set", seconds)
            targets = [pool.get_dummy_flat_data_page() for _ in range(n)]
            seconds, got = timed(lambda: shm.batch_get(keys, targets))
            record("pfxcache get", seconds)
            check("pfxcache", got)
            for name, backend in (("pfxcache v1", shm), ("v1-resp", resp)):
                keys = fresh()
                seconds, ok = timed(lambda: backend.batch_set_v1(keys, src))
                if not all(ok):
                    raise AssertionError(f"{name}: batch_set_v1 failed")
                record(f"{name} set", seconds)
                seconds, ok = timed(lambda: backend.batch_get_v1(keys, dst))
                record(f"{name} get", seconds)
                check_pool(name, ok)
            bar.update(1)
        bar.close()
        for backend in (shm, resp):
            backend.close()
    finally:
        daemon.stop()
        remote.stop()
        shutil.rmtree(folder, ignore_errors=True)
    if args.mooncake:
        peer = mooncake_peer.run_mooncake(0.0, n, page_bytes, calls=args.rounds, times=True)
        times["mooncake get"] = peer["times"]
    median = {name: statistics.median(values) for name, values in times.items()}
    rows = {name: {"ms": round(seconds * 1e3, 2), "gb_s": round(nbytes / seconds / 1e9, 2)}
            for name, seconds in median.items()}
    ratios = {
        "pfxcache get / file get (cached)": median["file get (cached)"] / median["pfxcache get"],
        "pfxcache get / file get (disk)": median["file get (disk)"] / median["pfxcache get"],
        "pfxcache set / file set": median["file set"] / median["pfxcache set"],
        "pfxcache v1 get / file get (cached)": median["file get (cached)"] / median["pfxcache v1 get"],
        "pfxcache v1 get / file get (disk)": median["file get (disk)"] / median["pfxcache v1 get"],
        "pfxcache v1 set / file set": median["file set"] / median["pfxcache v1 set"],
        "pfxcache v1 get / memcpy": median["memcpy"] / median["pfxcache v1 get"],
        "pfxcache v1 set / memcpy": median["memcpy"] / median["pfxcache v1 set"],
        "pfxcache v1 get / memcpy pieces": median["memcpy pieces"] / median["pfxcache v1 get"],
        "pfxcache v1 set / memcpy pieces": median["memcpy pieces"] / median["pfxcache v1 set"],
    }
    if args.mooncake:
        ratios["pfxcache get / mooncake get"] = median["mooncake get"] / median["pfxcache get"]
        ratios["pfxcache v1 get / mooncake get"] = median["mooncake get"] / median["pfxcache v1 get"]
    targets = {name: (None if "mooncake" in name else 2.0 if "file" in name else 0.8) for name in ratios}
    doc = {"command": command_line("bench-sglang-backend", argv), "machine": machine(), "pages": n,
           "page_bytes": page_bytes, "batch_bytes": nbytes, "rounds": args.rounds, "via": way_of,
           "geometry": {"layers": args.layers, "kv_heads": args.heads, "head_dim": args.head_dim,
                        "page_size": args.page_size, "dtype": "bfloat16", "layout": "page_first"},
           "results": rows, "ratios": {k: round(v, 2) for k, v in ratios.items()},
           "targets_met": {k: ratios[k] >= targets[k] for k in ratios if targets[k] is not None}}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(doc["command"])
    print(f"{n} pages x {page_bytes} B = {nbytes / 2**20:.0f} MiB a call ({args.layers} layers, {args.heads} KV "
          f"heads x {args.head_dim}, {args.page_size}-token pages, bfloat16, page_first); median of "
          f"{args.rounds} rounds; pfxcache via {way_of['pfxcache']}")
    print(f"{'call':<22} {'ms':>9} {'GB/s':>7}")
    for name, row in rows.items():
        print(f"{name:<22} {row['ms']:>9} {row['gb_s']:>7}")
    for name, ratio in ratios.items():
        if targets[name] is None:
            print(f"{name:<37} {ratio:6.2f}x  (side by side)")
            continue
        verdict = "met" if ratio >= targets[name] else "NOT met"
        print(f"{name:<37} {ratio:6.2f}x  (target >= {targets[name]}x: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
