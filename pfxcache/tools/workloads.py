"""Generated workloads of six shapes, for judging eviction policies beyond the one shared trace.

Each generator returns a ``replay.Trace`` in the Mooncake form (hash ids of
``block_tokens``-token blocks; a request ends with a partial block of fresh
tokens that nothing reuses), deterministic for its seed:

  chat        multi-turn chat: shared system prompts, sessions of a geometric
              number of turns, think times from seconds to many minutes
  agentic     coding agents: a shared tool prompt of thousands of tokens, a
              task context, then turn after turn of tool output appended, to
              tens of thousands of tokens (64-token pages); session lengths
              from 5 to hundreds of turns (Pareto); compaction restarts a
              context that outgrows 64k tokens
  rag         retrieval: a few system prompts, then 4 chunks of a shared
              document set (Zipf popularity), then the question; one in five
              is a follow-up of an earlier request
  sysprompts  thousands of system prompts of very different lengths (Zipf
              popularity), each with a one-shot question
  scans       a hot set of prompts under bursts of one-off long documents
              (batch summarisation) that never come back
  tenants     four namespaces of different sizes sharing the arena: a big chat
              tenant, a RAG tenant, a small system-prompt tenant, a few agents

``SUITE`` lists them with the shared trace and replay's ``sessions``;
``TUNING`` is the half designs and constants were chosen on, ``HELD_OUT``
the half they are reported on (pfxcache.tools.suite runs them).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import numpy as np

from .replay import DEFAULT_NS, DEFAULT_TRACE, MOONCAKE_BLOCK, Request, Trace, generate_sessions, read_trace


class _Builder:
    """Fresh hash ids and requests in time order."""

    def __init__(self, seed: int, block_tokens: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.block_tokens = block_tokens
        self._ids = itertools.count(1)
        self.requests: list[Request] = []

    def fresh(self, n: int) -> list[int]:
        return [next(self._ids) for _ in range(int(n))]

    def request(self, hash_ids: list[int], at: float, namespace: str = DEFAULT_NS) -> None:
        """A prompt of ``hash_ids`` then a partial block of fresh tokens."""
        tail = int(self.rng.integers(1, self.block_tokens))
        self.requests.append(Request(namespace, self.block_tokens * len(hash_ids) + tail,
                                     hash_ids=[*hash_ids, next(self._ids)], timestamp=float(at)))

    def zipf(self, n: int, s: float) -> np.ndarray:
        weights = 1.0 / np.arange(1, n + 1) ** s
        return weights / weights.sum()

    def trace(self, name: str) -> Trace:
        self.requests.sort(key=lambda r: r.timestamp)
        return Trace(name, self.requests, self.block_tokens)


def _sessions(b: _Builder, requests: int, arrivals_per_s: float, start: Callable[[], dict],
              turn: Callable[[dict], tuple[list[int], float] | None]) -> None:
    """Event loop of sessions: ``start()`` makes one, ``turn(s)`` gives (prompt, think time) or None when done."""
    events: list[tuple[float, int, dict]] = []
    seq = itertools.count()
    t = 0.0
    while len(b.requests) < requests:
        t += float(b.rng.exponential(1.0 / arrivals_per_s))
        while events and events[0][0] <= t and len(b.requests) < requests:
            at, _, s = heapq.heappop(events)
            step = turn(s)
            if step is not None:
                b.request(step[0], at, s.get("ns", DEFAULT_NS))
                heapq.heappush(events, (at + step[1], next(seq), s))
        heapq.heappush(events, (t, next(seq), start()))


def chat(seed: int = 1, requests: int = 8000, block_tokens: int = 128, namespace: str = DEFAULT_NS) -> Trace:
    b = _Builder(seed, block_tokens)
    prompts = [b.fresh(b.rng.integers(1, 9)) for _ in range(30)]
    popularity = b.zipf(len(prompts), 1.0)
    thinks = (10.0, 60.0, 600.0)  # median seconds between turns: fast, normal and slow users

    def start() -> dict:
        kind = int(b.rng.choice(3, p=(0.4, 0.4, 0.2)))
        return {"ns": namespace, "history": list(prompts[int(b.rng.choice(len(prompts), p=popularity))]),
                "turns": int(min(50, b.rng.geometric(1 / 6))), "think": thinks[kind]}

    def turn(s: dict):
        if s["turns"] <= 0:
            return None
        s["turns"] -= 1
        s["history"] += b.fresh(b.rng.integers(1, 3))  # the user's message
        prompt = list(s["history"])
        s["history"] += b.fresh(b.rng.integers(1, 5))  # the answer, part of the next prompt
        return prompt, float(s["think"] * b.rng.lognormal(0.0, 1.0))

    _sessions(b, requests, 0.25, start, turn)
    return b.trace(f"chat-seed{seed}")


def agentic(seed: int = 1, requests: int = 3000, block_tokens: int = 64, namespace: str = DEFAULT_NS) -> Trace:
    b = _Builder(seed, block_tokens)
    max_pages = 65536 // block_tokens
    tools = [b.fresh(b.rng.integers(60, 130)) for _ in range(4)]  # agent types: system + tool prompts

    def start() -> dict:
        turns = int(min(400, 5 * (1.0 + b.rng.pareto(1.1))))
        ctx = list(tools[int(b.rng.integers(len(tools)))]) + b.fresh(b.rng.integers(20, 200))  # the task, files
        return {"ns": namespace, "history": ctx, "turns": turns}

    def turn(s: dict):
        if s["turns"] <= 0:
            return None
        s["turns"] -= 1
        if len(s["history"]) > max_pages:  # compaction: the tool prompt, a summary, go on
            s["history"] = s["history"][:60] + b.fresh(b.rng.integers(20, 60))
        prompt = list(s["history"])
        s["history"] += b.fresh(min(200, max(2, int(b.rng.lognormal(2.3, 0.9)))))  # action + tool output
        return prompt, float(b.rng.uniform(2.0, 30.0))

    _sessions(b, requests, 0.06, start, turn)
    return b.trace(f"agentic-seed{seed}")


def rag(seed: int = 1, requests: int = 8000, block_tokens: int = 256, namespace: str = DEFAULT_NS) -> Trace:
    b = _Builder(seed, block_tokens)
    systems = [b.fresh(b.rng.integers(4, 9)) for _ in range(3)]
    docs = [b.fresh(2) for _ in range(5000)]
    popularity = b.zipf(len(docs), 0.8)
    earlier: list[list[int]] = []
    for i in range(requests):
        if earlier and b.rng.random() < 0.2:  # a follow-up: the same context, the answer, a new question
            k = int(b.rng.integers(max(0, len(earlier) - 200), len(earlier)))
            prompt = earlier[k] + b.fresh(b.rng.integers(1, 3))
        else:
            chunks = b.rng.choice(len(docs), size=4, replace=False, p=popularity)
            prompt = list(systems[int(b.rng.choice(3, p=(0.6, 0.3, 0.1)))])
            for c in chunks:
                prompt += docs[int(c)]
            prompt += b.fresh(1)
        earlier.append(prompt + b.fresh(b.rng.integers(1, 3)))
        b.request(prompt, i, namespace)
    return b.trace(f"rag-seed{seed}")


def sysprompts(seed: int = 1, requests: int = 10000, block_tokens: int = 128, namespace: str = DEFAULT_NS) -> Trace:
    b = _Builder(seed, block_tokens)
    lengths = np.clip(b.rng.lognormal(2.0, 0.8, 3000).astype(int), 1, 60)
    prompts = [b.fresh(n) for n in lengths]
    popularity = b.zipf(len(prompts), 0.9)
    for i, k in enumerate(b.rng.choice(len(prompts), size=requests, p=popularity)):
        b.request(prompts[int(k)] + b.fresh(b.rng.integers(1, 5)), i, namespace)
    return b.trace(f"sysprompts-seed{seed}")


def scans(seed: int = 1, requests: int = 10000, block_tokens: int = 256, namespace: str = DEFAULT_NS) -> Trace:
    b = _Builder(seed, block_tokens)
    hot = [b.fresh(b.rng.integers(4, 17)) for _ in range(200)]
    popularity = b.zipf(len(hot), 1.1)
    i = 0
    next_burst = int(b.rng.integers(300, 1500))
    while i < requests:
        if i >= next_burst:  # a batch job: hundreds of one-off documents back to back
            for _ in range(int(b.rng.integers(200, 600))):
                b.request(b.fresh(b.rng.integers(10, 41)), i, namespace)
                i += 1
            next_burst = i + int(b.rng.integers(300, 1500))
        else:
            b.request(hot[int(b.rng.choice(len(hot), p=popularity))] + b.fresh(b.rng.integers(1, 3)), i, namespace)
            i += 1
    b.requests = b.requests[:requests]
    return b.trace(f"scans-seed{seed}")


def tenants(seed: int = 1, requests: int = 10000, block_tokens: int = 128) -> Trace:
    """Four tenants (namespaces) of different sizes, interleaved in proportion to their traffic."""
    parts = [chat(seed, int(requests * 0.6), block_tokens, "chat"),
             rag(seed + 1, int(requests * 0.25), block_tokens, "docs"),
             sysprompts(seed + 2, int(requests * 0.1), block_tokens, "support"),
             agentic(seed + 3, int(requests * 0.05), block_tokens, "agents")]
    merged = []
    for part in parts:  # each tenant's requests spread evenly over [0, 1): shares follow the counts
        n = len(part.requests)
        for k, r in enumerate(part.requests):
            r.timestamp = (k + 0.5) / n
            merged.append(r)
    merged.sort(key=lambda r: r.timestamp)
    return Trace(f"tenants-seed{seed}", merged, block_tokens)


def shared_trace(seed: int = 1) -> Trace:
    """The one real trace (/work/shared/traces), as replay reads it; the seed is ignored."""
    return read_trace([DEFAULT_TRACE], "mooncake", False, MOONCAKE_BLOCK)


def sessions(seed: int = 1) -> Trace:
    """replay's --generate sessions workload."""
    return generate_sessions(seed)


SUITE: dict[str, Callable[..., Trace]] = {
    "trace": shared_trace, "sessions": sessions, "chat": chat, "rag": rag,
    "agentic": agentic, "sysprompts": sysprompts, "scans": scans, "tenants": tenants,
}
TUNING = ("trace", "sessions", "chat", "rag")  # designs and constants were chosen on these
HELD_OUT = ("agentic", "sysprompts", "scans", "tenants")  # ... and are reported on these, untouched


def generator(name: str) -> Callable[..., Trace] | None:
    """The generator of suite workload ``name`` (None: no such workload)."""
    return SUITE.get(name)
