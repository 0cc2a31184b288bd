"""What an eviction policy costs per request, against ``lru`` in the same invocation.

Two measures:

* **hot PFXGET**: one redis-py client looping ``PFXGET bench PACKED <4,096 tokens> NOLEASE`` (a
  full hit of 256 pages) against a ``--maxmemory 64mb --arena memory`` daemon (4,096 blocks: the
  guard's sampling rate is 1 there, its worst case) under each policy, rounds interleaved; prints
  requests/s, the daemon's CPU time per request (``/proc/PID/stat``) and each policy's rate
  relative to ``lru``'s. A daemon offers the shipped policies only, so a research policy
  (research.policies) is measured with ``--rounds 0``: the trace alone;
* **trace**: the shared Mooncake trace replayed in process (``replay.replay_store``) at each
  ``--capacities``; CPU time per request and relative to ``lru``.

    scripts/research/run policy_cost [--policies lru,guard] [--seconds 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from pfxcache.tools.common import progress_bar

TOKENS = np.arange(1, 4097, dtype="<u4").tobytes()  # 256 pages of 16 tokens
BLOCK_BYTES = 16 * 1024


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hot_pfxget(policy: str, seconds: float) -> tuple[float, float]:
    """(requests/s, daemon CPU µs per request) of hot PFXGET NOLEASE under ``policy``."""
    import redis

    from pfxcache.testing import start_daemon

    daemon = start_daemon("--maxmemory", "64mb", "--arena", "memory", "--maxmemory-policy", policy)
    try:
        client = redis.Redis(*daemon.address)
        client.execute_command("PFXSET", "bench", "PACKED", TOKENS, "DATA", b"d" * (256 * BLOCK_BYTES))
        command = ("PFXGET", "bench", "PACKED", TOKENS, "NOLEASE")
        for _ in range(100):
            client.execute_command(*command)
        cpu = _cpu_seconds(daemon.proc.pid)
        n = 0
        start = time.perf_counter()
        while time.perf_counter() < start + seconds:
            for _ in range(50):
                client.execute_command(*command)
            n += 50
        rate = n / (time.perf_counter() - start)
        cpu_us = (_cpu_seconds(daemon.proc.pid) - cpu) / n * 1e6
        if client.execute_command(*command)[b"matched"] != 4096:
            raise RuntimeError("the hot prompt is not a full hit")
        client.close()
        return rate, cpu_us
    finally:
        daemon.stop()


def trace_cpu(policy: str, capacity: int) -> tuple[float, int]:
    """(CPU µs per request, hit tokens) of the shared trace in process at ``capacity`` pages."""
    from pfxcache.tools import replay, workloads

    trace = workloads.SUITE["trace"](1)
    start = time.process_time()
    hits = replay.replay_store(trace, policy, capacity, trace.block_tokens, quiet=True)["hit_tokens"]
    return (time.process_time() - start) / len(trace.requests) * 1e6, hits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/research/run policy_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="lru,guard", help="policies, lru first (default lru,guard)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per hot PFXGET run (default 3)")
    parser.add_argument("--rounds", type=int, default=2, help="hot PFXGET rounds, interleaved (default 2)")
    parser.add_argument("--capacities", default="854,34180", help="trace capacities in pages ('' skips)")
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    if policies[0] != "lru":
        policies.insert(0, "lru")
    capacities = [int(c) for c in args.capacities.split(",") if c.strip()]
    from research.policies import RESEARCH

    unserved = [p for p in policies if p in RESEARCH]
    if unserved and args.rounds:
        parser.error(f"a daemon does not offer {', '.join(unserved)} (research policies): give --rounds 0 "
                     "to measure the trace only")
    bar = progress_bar(args.rounds * len(policies) + len(capacities) * len(policies), "policy cost", "run")
    rates: dict[str, list[float]] = {p: [] for p in policies}
    cpus: dict[str, list[float]] = {p: [] for p in policies}
    for _ in range(args.rounds):
        for policy in policies:
            rate, cpu = hot_pfxget(policy, args.seconds)
            rates[policy].append(rate)
            cpus[policy].append(cpu)
            bar.update(1)
    traces = {}
    for capacity in capacities:
        for policy in policies:
            traces[capacity, policy] = trace_cpu(policy, capacity)
            bar.update(1)
    bar.close()
    if args.rounds:
        print("hot PFXGET bench PACKED <4,096 tokens> NOLEASE, one redis-py client, --maxmemory 64mb --arena memory")
        print(f"{'policy':8}{'requests/s per round':>28}{'daemon CPU us/req':>20}{'rate vs lru':>13}")
        lru_rate = sum(rates["lru"])
        for policy in policies:
            shown = " / ".join(f"{r:,.0f}" for r in rates[policy])
            cpu = " / ".join(f"{c:.0f}" for c in cpus[policy])
            print(f"{policy:8}{shown:>28}{cpu:>20}{sum(rates[policy]) / lru_rate:>12.2f}x")
    if capacities:
        print("shared trace in process (replay_store), CPU time per request")
        print(f"{'pages':>7}  " + "".join(f"{p:>18}" for p in policies))
        for capacity in capacities:
            base = traces[capacity, "lru"][0]
            cells = "".join(f"{traces[capacity, p][0]:>9.0f} us {traces[capacity, p][0] / base:>4.2f}x"
                            for p in policies)
            print(f"{capacity:>7,}  {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
