"""Check the cuda arena on a machine with an NVIDIA GPU, in one invocation (well under a minute).

Installs nothing: it expects ``scripts/setup cuda12`` (or ``cuda13``; outside the
checkout ``pip install 'pfxcache[cuda12,client]'``) done, and exits 2 with that command
when CuPy or redis-py is missing, or when no CUDA device is visible.

    scripts/gpu-check                     # 256 MiB of 256 KiB blocks on device 0
    scripts/gpu-check --json              # the figures as one JSON object
    scripts/gpu-check --mib 64 --device 1
    scripts/gpu-check --vllm              # then vLLM's CUDA build through the CUDA arena (gpu_check_vllm.py)

What it does:

1. starts pfxcached with ``--arena cuda --port 0`` (pfxcache.testing.start_daemon)
   and checks PFXINFO's arena map: backend cuda, a 64-byte IPC handle, the
   daemon's pid, the size;
2. worker 1 (its own process): PFXALLOC, opens the IPC handle
   (``attach_cuda``), writes a known pattern into its blocks on the device,
   PFXSET ... BLOCKS;
3. worker 2 (another process): PFXGET, opens the handle, reads the blocks on
   the device (into a torch CUDA tensor when torch with CUDA is installed, else
   a CuPy array), verifies every byte, then times ``read_into`` of all the
   blocks (in order: one cudaMemcpyAsync per run; shuffled: one gather kernel)
   against a plain device-to-device copy of the same size;
4. the daemon's own host copy (PFXGET WITHDATA) of some pages is verified too,
   and the daemon must exit 0 on SIGTERM (the arena is freed cleanly).

Printed: attach time (cudaIpcOpenMemHandle) per worker, bandwidths in GB/s and
the ratios read_into / plain copy. Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

from pfxcache.testing import start_daemon
from pfxcache.tools.common import tool_parser

INSTALL = "scripts/setup cuda12   (CUDA 13: scripts/setup cuda13)"
NAMESPACE = "gpu-check"
PAGE_SIZE = 16


def progress(step: str, quiet: bool) -> None:
    if not quiet:
        print(f"[gpu-check] {step}", file=sys.stderr, flush=True)


def expected_pages(xp, first: int, count: int, block_bytes: int):
    """Page i holds (7*j + 13*i + 1) mod 256 at byte j: built in uint8 without a big temporary."""
    column = ((xp.arange(block_bytes, dtype=xp.int64) * 7) % 256).astype(xp.uint8)
    row = ((xp.arange(first, first + count, dtype=xp.int64) * 13 + 1) % 256).astype(xp.uint8)
    return column[None, :] + row[:, None]  # uint8 + uint8 wraps mod 256


def tokens_for(npages: int) -> bytes:
    from pfxcache.client.commands import pack_tokens  # the client needs redis-py: checked before this runs

    return pack_tokens(range(1, npages * PAGE_SIZE + 1))


def connect(port: int):
    import redis

    return redis.Redis(host="127.0.0.1", port=port, protocol=3)


def arena_map(client) -> dict:
    info = client.execute_command("PFXINFO")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in info[b"arena"].items()}


# ---------------------------------------------------------------------------
# The workers (run as `gpu-check --worker write|read ...` in their own processes)
# ---------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> dict:
    import cupy
    import numpy as np
    from pfxcache.client.cuda import attach_cuda

    client = connect(args.port)
    info = arena_map(client)
    with cupy.cuda.Device(args.device):
        cupy.zeros(1, dtype=cupy.uint8)  # create the CUDA context first: attach time is the IPC open alone
        cupy.cuda.get_current_stream().synchronize()
        start = time.perf_counter()
        arena = attach_cuda(info)
        attach_total = time.perf_counter() - start
        bb = arena.block_bytes
        expected = expected_pages(cupy, 0, args.pages, bb)
        result = {"role": args.worker, "pid": os.getpid(), "attach_ms": arena.attach_seconds * 1e3,
                  "attach_total_ms": attach_total * 1e3}
        tokens = tokens_for(args.pages)
        if args.worker == "write":
            alloc = client.execute_command("PFXALLOC", NAMESPACE, args.pages)
            blocks = alloc[b"blocks"]
            arena.write_from(blocks, expected)
            stored = client.execute_command("PFXSET", NAMESPACE, "PACKED", tokens, "BLOCKS", *blocks)
            result.update(ok=stored[b"stored"] == args.pages, stored=stored[b"stored"], blocks=blocks)
        else:
            hit = client.execute_command("PFXGET", NAMESPACE, "PACKED", tokens)
            blocks = hit[b"blocks"]
            nbytes = len(blocks) * bb
            try:
                import torch

                use_torch = torch.cuda.is_available()
            except ImportError:
                use_torch = False
            if use_torch:
                out = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{args.device}")
                torch.cuda.synchronize()
                out_cupy = cupy.from_dlpack(out)
            else:
                out = out_cupy = cupy.empty(nbytes, dtype=cupy.uint8)
            arena.read_into(blocks, out)
            matched = hit[b"matched"] == args.pages * PAGE_SIZE
            same = bool((out_cupy.reshape(len(blocks), bb) == expected).all())
            del expected
            result.update(ok=matched and same, matched=hit[b"matched"], verified_bytes=nbytes,
                          out="torch" if use_torch else "cupy", blocks=blocks)

            # bandwidth: read_into of all the blocks vs a plain device-to-device copy of the same size
            stream = cupy.cuda.get_current_stream()

            def rate(copy) -> float:
                copy()
                stream.synchronize()
                begin = time.perf_counter()
                for _ in range(args.repeat):
                    copy()
                stream.synchronize()
                return nbytes * args.repeat / (time.perf_counter() - begin) / 1e9

            shuffled = np.random.default_rng(0).permutation(np.asarray(blocks))
            src = cupy.empty(nbytes, dtype=cupy.uint8)
            dst = cupy.empty(nbytes, dtype=cupy.uint8)
            plain = rate(lambda: dst.data.copy_from_device_async(src.data, nbytes))
            ordered = rate(lambda: arena.read_into(blocks, out, sync=False))
            gathered = rate(lambda: arena.read_into(shuffled, out, sync=False))
            arena.read_into(shuffled, out)  # row k now holds block shuffled[k]: check those bytes too
            positions = cupy.asarray(_positions(blocks, shuffled))
            same_shuffled = bool((out_cupy.reshape(len(blocks), bb)
                                  == expected_pages(cupy, 0, args.pages, bb)[positions]).all())
            result.update(
                ok=result["ok"] and same_shuffled,
                bench_mib=nbytes / 2**20,
                repeat=args.repeat,
                plain_copy_gbs=plain,
                read_into_gbs=ordered,
                read_into_shuffled_gbs=gathered,
                ratio=ordered / plain,
                ratio_shuffled=gathered / plain,
                runs=_runs(blocks),
            )
            client.execute_command("PFXRELEASE", hit[b"lease"])
        arena.close()
    return result


def _positions(blocks, shuffled) -> list[int]:
    """For each id of ``shuffled``, the page it holds (its position in ``blocks``)."""
    where = {block: i for i, block in enumerate(blocks)}
    return [where[int(block)] for block in shuffled]


def _runs(blocks) -> int:
    import numpy as np
    from pfxcache.cuda_ipc import count_runs

    return count_runs(np.asarray(blocks))


def run_worker(role: str, args: argparse.Namespace, port: int) -> dict:
    command = [sys.executable, "-m", "pfxcache.tools.gpu_check", "--worker", role, "--port", str(port), "--device", str(args.device),
               "--pages", str(args.pages), "--repeat", str(args.repeat)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"worker {role} failed (exit {done.returncode}):\n{done.stderr}{done.stdout}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------


def check(args: argparse.Namespace) -> int:
    quiet = args.json
    missing = [name for name in ("cupy", "redis") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"gpu-check: {', '.join(missing)} missing; run: {INSTALL}", file=sys.stderr)
        return 2
    import cupy
    import numpy as np

    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device
        print(f"gpu-check: no usable CUDA device: {exc}", file=sys.stderr)
        return 2
    if not 0 <= args.device < count:
        print(f"gpu-check: device {args.device} does not exist ({count} visible)", file=sys.stderr)
        return 2
    name = cupy.cuda.runtime.getDeviceProperties(args.device)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)

    block_bytes = args.block_kib * 1024
    args.pages = max(1, args.mib * 2**20 // block_bytes)
    maxmemory_mib = 2 * args.mib + 64
    report: dict = {"device": args.device, "device_name": name, "block_bytes": block_bytes, "pages": args.pages,
                    "checks": {}}
    checks = report["checks"]

    progress(f"1/5 starting pfxcached --arena cuda on device {args.device} ({name})", quiet)
    started = time.perf_counter()
    daemon = start_daemon("--arena", "cuda", "--arena-device", str(args.device), "--port", "0",
                          "--maxmemory", f"{maxmemory_mib}mb", "--block-bytes", f"{args.block_kib}kb",
                          "--page-size", str(PAGE_SIZE), ready_timeout=120)
    report["daemon_start_s"] = time.perf_counter() - started
    try:
        client = connect(daemon.port)
        info = arena_map(client)
        checks["pfxinfo"] = (
            info.get("backend") == b"cuda" and isinstance(info.get("handle"), bytes) and len(info["handle"]) == 64
            and info.get("pid") == daemon.proc.pid and info.get("device") == args.device
            and info.get("size") == info.get("block_bytes") * info.get("nblocks")
        )
        progress(f"2/5 worker 1: PFXALLOC {args.pages} blocks, attach, write the pattern on the device, "
                 "PFXSET BLOCKS", quiet)
        writer = run_worker("write", args, daemon.port)
        checks["writer"] = bool(writer["ok"])
        progress(f"3/5 worker 2: PFXGET, attach, read and verify {args.mib} MiB on the device, "
                 f"time read_into x{args.repeat}", quiet)
        reader = run_worker("read", args, daemon.port)
        checks["reader"] = bool(reader["ok"]) and reader["blocks"] == writer["blocks"]
        progress("4/5 the daemon's host copy: PFXGET WITHDATA", quiet)
        sample = min(args.pages, 8)
        reply = client.execute_command("PFXGET", NAMESPACE, "PACKED", tokens_for(sample), "NOLEASE", "WITHDATA")
        checks["daemon_host_copy"] = reply[b"data"] == expected_pages(np, 0, sample, block_bytes).tobytes()
        client.close()
    finally:
        progress("5/5 stopping the daemon", quiet)
        code = daemon.stop()
    checks["daemon_exit_0"] = code == 0
    if code != 0:
        print(daemon.log_text(), file=sys.stderr)
    for worker_report in (writer, reader):
        worker_report.pop("blocks", None)
    report.update(writer=writer, reader=reader, ok=all(checks.values()))
    if args.vllm:
        from pfxcache.tools.gpu_check_vllm import vllm_step

        report["vllm"] = vllm_step(args.device, quiet)
        report["ok"] = report["ok"] and report["vllm"].get("ok", False)

    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"device {args.device}: {name}")
        print(f"blocks: {args.pages} x {args.block_kib} KiB = {args.mib} MiB ({reader['runs']} runs of ids); "
              f"read into a {reader['out']} tensor")
        print(f"attach (cudaIpcOpenMemHandle): writer {writer['attach_ms']:.2f} ms, "
              f"reader {reader['attach_ms']:.2f} ms")
        print(f"plain device-to-device copy   {reader['plain_copy_gbs']:8.1f} GB/s")
        print(f"read_into, blocks in order    {reader['read_into_gbs']:8.1f} GB/s  ratio {reader['ratio']:.2f}")
        print(f"read_into, blocks shuffled    {reader['read_into_shuffled_gbs']:8.1f} GB/s  "
              f"ratio {reader['ratio_shuffled']:.2f}")
        for name_, passed in {**checks, **{f"vllm {k}": v for k, v in report.get("vllm", {}).get("checks", {}).items()}}.items():
            print(f"{'ok  ' if passed else 'FAIL'} {name_}")
        if "skipped" in report.get("vllm", {}):
            print(f"FAIL vllm: {report['vllm']['skipped']}")
        print("PASS" if report["ok"] else "FAIL")
    return 0 if report["ok"] else 1


def main() -> int:
    parser = tool_parser("gpu-check", __doc__)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--device", type=int, default=0, help="CUDA device of the arena (default 0)")
    parser.add_argument("--mib", type=int, default=256, help="MiB of blocks exchanged and timed (default 256)")
    parser.add_argument("--block-kib", type=int, default=256, help="block size in KiB (default 256)")
    parser.add_argument("--repeat", type=int, default=50, help="timed copies per figure (default 50)")
    parser.add_argument("--vllm", action="store_true", help="also run vLLM (CUDA build) with the connector "
                        "through the CUDA arena: three engines, minutes")
    parser.add_argument("--worker", choices=("write", "read"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--pages", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    def too_long(_signum, _frame):
        raise TimeoutError("gave up after 280 s")

    signal.signal(signal.SIGALRM, too_long)  # raised where it hangs: the daemon is still stopped
    signal.alarm(1500 if args.vllm else 280)
    try:
        return check(args)
    except Exception as exc:  # a failed start or worker: say why, exit 1
        print(f"gpu-check: FAIL: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
