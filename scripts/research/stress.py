"""The stress set: what the suite's shapes do not vary, made after the designs were chosen, never tuned on.

  phase changes   one shape, then another (``phases``): the expert that led
                  in the first phase may lose in the second
  co-located      two or three applications interleaved behind one arena, in
                  one namespace (``colocated``)
  page sizes      the shapes in 16-, 32- and 64-token pages (vLLM's blocks are
                  16 tokens by default), the shared trace in 64- and 128-token
                  pages instead of 512 (``repaged``)

``STRESS`` maps each workload's name to its generator (a seed -> a ``replay.Trace``),
built from the suite's generators (pfxcache.tools.workloads.SUITE);
``scripts/research/run suite --half stress`` judges it.
"""

from __future__ import annotations

from collections.abc import Callable

from pfxcache.tools.replay import Request, Trace
from pfxcache.tools.workloads import SUITE


def _renumbered(trace: Trace, first_id: int) -> tuple[list[Request], int]:
    """``trace``'s requests with hash ids moved up to start at ``first_id`` (no sharing with another part),
    and the next free id."""
    top = first_id
    out = []
    for r in trace.requests:
        ids = [h + first_id for h in r.hash_ids]
        top = max(top, max(ids, default=top - 1) + 1)
        out.append(Request(r.namespace, r.input_tokens, hash_ids=ids, timestamp=r.timestamp))
    return out, top


def _block_tokens(parts: tuple[Trace, ...]) -> int:
    sizes = {part.block_tokens for part in parts}
    if len(sizes) != 1:
        raise ValueError(f"parts of {sorted(sizes)}-token blocks: combine parts of one block size")
    return sizes.pop()


def phases(name: str, *parts: Trace) -> Trace:
    """The parts one after another, sharing nothing: a workload that changes shape (same block size)."""
    block_tokens = _block_tokens(parts)
    requests: list[Request] = []
    next_id, start = 1, 0.0
    for part in parts:
        reqs, next_id = _renumbered(part, next_id)
        end = start
        for r in reqs:
            r.timestamp = start + float(r.timestamp)
            end = max(end, r.timestamp)
        requests += reqs
        start = end + 1.0
    for serial, r in enumerate(requests):
        r.serial = serial
    return Trace(name, requests, block_tokens)


def colocated(name: str, *parts: Trace) -> Trace:
    """The parts interleaved, each spread evenly over the same time, in the namespaces they have."""
    block_tokens = _block_tokens(parts)
    requests: list[Request] = []
    next_id = 1
    for part in parts:
        reqs, next_id = _renumbered(part, next_id)
        for k, r in enumerate(reqs):
            r.timestamp = (k + 0.5) / len(reqs)
        requests += reqs
    requests.sort(key=lambda r: r.timestamp)
    for serial, r in enumerate(requests):
        r.serial = serial
    return Trace(name, requests, block_tokens)


def repaged(trace: Trace, page_tokens: int) -> Trace:
    """``trace`` replayed in pages of ``page_tokens`` tokens (its blocks' tokens, cut anew)."""
    return Trace(f"{trace.name}-p{page_tokens}", trace.requests, trace.block_tokens, page_tokens)


def _then(first: str, second: str) -> Callable[[int], Trace]:
    return lambda seed: phases(f"{first}-then-{second}-seed{seed}", SUITE[first](seed + 2, block_tokens=128),
                               SUITE[second](seed + 9, block_tokens=128))


def _with(*names: str) -> Callable[[int], Trace]:
    return lambda seed: colocated("-and-".join(names) + f"-seed{seed}",
                                  *(SUITE[n](seed + 3 + i, block_tokens=128) for i, n in enumerate(names)))


def _paged(name: str, page_tokens: int) -> Callable[[int], Trace]:
    # Cut anew, not generated with smaller blocks: a generator's workload is the same page for page
    # whatever its block size. In smaller pages a block is several pages that come and go together,
    # and a request's partial last block leaves whole pages of its own.
    return lambda seed: repaged(SUITE[name](seed), page_tokens)


STRESS: dict[str, Callable[..., Trace]] = {
    **{f"{a}-then-{b}": _then(a, b) for a, b in (
        ("rag", "scans"), ("scans", "rag"), ("sysprompts", "chat"), ("chat", "sysprompts"), ("agentic", "rag"),
        ("rag", "agentic"), ("chat", "scans"), ("sysprompts", "scans"), ("scans", "sysprompts"))},
    **{"-and-".join(m): _with(*m) for m in (
        ("chat", "scans"), ("rag", "sysprompts"), ("agentic", "scans"), ("chat", "rag", "scans"),
        ("sysprompts", "agentic"))},
    **{f"{n}-p{p}": _paged(n, p) for n, p in (
        ("chat", 32), ("rag", 64), ("sysprompts", 32), ("scans", 64), ("tenants", 64), ("trace", 128), ("trace", 64),
        ("chat", 16), ("sysprompts", 16))},
}
