"""Adversarial workloads: loops, phases and drifts the suite's shapes do not have, in three sets.

Made in the round that gave ``guard`` its fifth expert (``lhd``) and its budget, to look
for what breaks it, each set judged before the next was written (scripts/research/README.md,
"Loops and phases"):

  ``FIRST``   written to look for shapes where the guard falls below LRU or gains nothing;
              it showed loops (lhd joined on it)
  ``SECOND``  written once lhd had joined, held out for it; one point fell below 0.99x,
              for the guard with or without lhd: the budget was made on it
  ``THIRD``   written once the budget was frozen, judged once

Each generator returns a ``replay.Trace`` of Mooncake hash ids in 512-token blocks, whole
blocks only, one namespace, deterministic (its seed is fixed; the suite's ``--seed`` does not
move it). Hash ids are numbered from 1 in order of first use; a repeated list of ids is a
prompt read again, a list that extends another continues it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import numpy as np

from pfxcache.tools.replay import DEFAULT_NS, MOONCAKE_BLOCK, Request, Trace


class _Ids:
    """Fresh hash ids, numbered from 1."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def new(self, n: int) -> list[int]:
        return [next(self._next) for _ in range(n)]


def _zipf(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


# -- the first set ---------------------------------------------------------------------------


def loop(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """40 documents of 20 pages behind a 4-page prompt, read round-robin: a loop of 804 pages."""
    prompt = ids.new(4)
    docs = [prompt + ids.new(20) for _ in range(40)]
    return [docs[i % 40] for i in range(6000)]


def drift(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """2,000 prompts in 40 groups, Zipf(1.1) popular, the ranking shuffled every 1,000 requests."""
    groups = [ids.new(rng.randint(2, 8)) for _ in range(40)]
    prompts = [groups[i // 50] + ids.new(rng.randint(1, 20)) for i in range(2000)]
    weights = _zipf(2000, 1.1)
    out = []
    for phase in range(6):
        perm = np.random.default_rng(phase).permutation(2000)
        picks = np.random.default_rng(100 + phase).choice(2000, 1000, p=weights)
        out += [prompts[perm[p]] for p in picks]
    return out


def tot(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """Tree of thought: problems whose branches grow and are revisited, six problems open at a time."""
    out: list[list[int]] = []
    active: list[list[list[int]]] = []
    for _ in range(300):
        nodes = [ids.new(8)]
        active.append(nodes)
        if len(active) > 6:
            active.pop(0)
        for _ in range(20):
            tree = rng.choice(active)
            base = rng.choice(tree)
            if rng.random() < 0.6 and len(base) < 20:
                child = base + ids.new(rng.randint(1, 4))
                tree.append(child)
                out.append(child)
            else:
                out.append(base)
    return out


def abandon(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """Chat sessions at a regular pace, round-robin, each dropped after exactly 6 turns."""
    out = []
    sessions: list[dict] = []
    prompt = ids.new(2)
    for step in range(6000):
        if len(sessions) < 40 or rng.random() < 0.05:
            sessions.append({"ctx": prompt + ids.new(rng.randint(2, 6)), "turns": 0})
        s = sessions[step % len(sessions)]
        s["ctx"] = s["ctx"] + ids.new(rng.randint(1, 3))
        s["turns"] += 1
        out.append(list(s["ctx"]))
        if s["turns"] >= 6:
            sessions.remove(s)
    return out


SIZESKEW_SHORT = 0.7  # the share of sizeskew's requests that are short prompts


def _sizeskew_prompts(rng: random.Random, ids: _Ids) -> tuple[list[list[int]], list[list[int]], np.ndarray]:
    short = [ids.new(rng.randint(1, 3)) for _ in range(500)]
    long = [ids.new(rng.randint(60, 120)) for _ in range(300)]
    return short, long, _zipf(500, 1.0)


def sizeskew(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """Short Zipf-popular prompts (70 %) between long documents of 60-120 pages read uniformly."""
    short, long, weights = _sizeskew_prompts(rng, ids)
    picks = np.random.default_rng(7)
    return [short[picks.choice(500, p=weights)] if rng.random() < SIZESKEW_SHORT else long[rng.randrange(300)]
            for _ in range(6000)]


def bimodal(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """Every prompt comes back once, half after 5-20 requests, half after 1,500-3,000."""
    out = []
    pending: dict[int, list[int]] = {}
    for i in range(6000):
        if i in pending:
            out.append(pending.pop(i))
            continue
        prompt = ids.new(rng.randint(2, 10))
        out.append(prompt)
        due = i + (rng.randint(5, 20) if rng.random() < 0.5 else rng.randint(1500, 3000))
        while due in pending:
            due += 1
        pending[due] = prompt
    return out


def loop_hot(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """A hot set of 100 short prompts (Zipf 0.9) interleaved with a loop of 150 documents of 10 pages."""
    hot = [ids.new(rng.randint(1, 4)) for _ in range(100)]
    docs = [ids.new(10) for _ in range(150)]
    weights = _zipf(100, 0.9)
    picks = np.random.default_rng(3)
    out, in_turn = [], itertools.cycle(docs)
    for _ in range(8000):
        if rng.random() < 0.5:
            out.append(hot[picks.choice(100, p=weights)])
        else:
            out.append(next(in_turn))
    return out


def repo_agents(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """Agents over six repositories of 200 pages, growing contexts, sessions of 3 to 80 turns."""
    repos = [ids.new(200) for _ in range(6)]
    out = []
    sessions: list[dict] = []
    for _ in range(3000):
        if len(sessions) < 8 or rng.random() < 0.03:
            sessions.append({"ctx": list(rng.choice(repos)) + ids.new(2), "left": rng.choice([3, 5, 10, 30, 80])})
        s = rng.choice(sessions)
        s["ctx"] += ids.new(rng.randint(1, 6))
        out.append(list(s["ctx"]))
        s["left"] -= 1
        if s["left"] <= 0:
            sessions.remove(s)
    return out


# -- the second set ---------------------------------------------------------------------------


def loop_noise(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """A loop of 60 documents of 8-16 pages, 30 % of the requests one-off prompts between."""
    docs = [ids.new(rng.randint(8, 16)) for _ in range(60)]
    out, in_turn = [], itertools.cycle(docs)
    for _ in range(7000):
        if rng.random() < 0.3:
            out.append(ids.new(rng.randint(2, 12)))
        else:
            out.append(next(in_turn))
    return out


def eval_rerun(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """An evaluation rerun over 300 few-shot prompts in order, half the requests, between chat sessions."""
    fewshot = ids.new(10)
    data = [fewshot + ids.new(rng.randint(2, 6)) for _ in range(300)]
    sessions: list[list[int]] = []
    out, in_turn = [], itertools.cycle(data)
    for _ in range(8000):
        if rng.random() < 0.5:
            out.append(next(in_turn))
        else:
            if len(sessions) < 30 or rng.random() < 0.05:
                sessions.append(ids.new(rng.randint(2, 5)))
            i = rng.randrange(len(sessions))
            sessions[i] = sessions[i] + ids.new(rng.randint(1, 2))
            out.append(list(sessions[i]))
            if len(sessions[i]) > 25:
                sessions.pop(i)
    return out


def growing_loop(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """A loop that grows by one document every 50 requests: it fits the cache, then it does not."""
    docs = [ids.new(rng.randint(5, 15)) for _ in range(20)]
    out, k = [], 0
    for step in range(7000):
        if step % 50 == 0:
            docs.append(ids.new(rng.randint(5, 15)))
        out.append(docs[k % len(docs)])
        k += 1
    return out


def shuffled_epochs(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """400 prompts behind one shared prompt, read in a new random order each of 15 epochs."""
    prompt = ids.new(3)
    data = [prompt + ids.new(rng.randint(3, 10)) for _ in range(400)]
    out = []
    for _ in range(15):
        order = list(range(400))
        rng.shuffle(order)
        out += [data[i] for i in order]
    return out


def zipf_loop_mix(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """Phases of 1,000 requests, in turn: Zipf(0.8)-popular short prompts, a loop of 80 documents."""
    pool = [ids.new(rng.randint(1, 6)) for _ in range(1500)]
    weights = _zipf(1500, 0.8)
    picks = np.random.default_rng(11)
    docs = [ids.new(rng.randint(4, 8)) for _ in range(80)]
    out, in_turn = [], itertools.cycle(docs)
    for step in range(8000):
        if (step // 1000) % 2 == 0:
            out.append(pool[picks.choice(1500, p=weights)])
        else:
            out.append(next(in_turn))
    return out


def long_docs_loop(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """25 documents of 40-80 pages, 70 % read in turn and 30 % at random, each with a fresh question."""
    docs = [ids.new(rng.randint(40, 80)) for _ in range(25)]
    out = []
    for step in range(4000):
        doc = docs[step % 25] if rng.random() < 0.7 else docs[rng.randrange(25)]
        out.append(doc + ids.new(rng.randint(1, 2)))
    return out


# -- the third set ----------------------------------------------------------------------------


class _Chat:
    """Chat sessions behind one system prompt: a random open session gets a turn."""

    def __init__(self, rng: random.Random, ids: _Ids, open_sessions: int = 30) -> None:
        self.rng, self.ids, self.open = rng, ids, open_sessions
        self.sessions: list[list[int]] = []
        self.prompt = ids.new(2)

    def next(self) -> list[int]:
        rng = self.rng
        if len(self.sessions) < self.open or rng.random() < 0.03:
            self.sessions.append(self.prompt + self.ids.new(rng.randint(1, 4)))
        i = rng.randrange(len(self.sessions))
        self.sessions[i] = self.sessions[i] + self.ids.new(rng.randint(1, 3))
        out = list(self.sessions[i])
        if len(out) > rng.randint(12, 40):
            self.sessions.pop(i)
        return out


def phases_chat_loop(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """Phases of 500 requests, in turn: chat, a loop of 70 documents."""
    chat = _Chat(rng, ids)
    docs = [ids.new(rng.randint(3, 9)) for _ in range(70)]
    out, in_turn = [], itertools.cycle(docs)
    for step in range(7000):
        if (step // 500) % 2:
            out.append(next(in_turn))
        else:
            out.append(chat.next())
    return out


def loop_two_sizes(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """Two loops interleaved: 15 documents of 4 pages (40 %), 120 of 5-12 pages (60 %)."""
    short = [ids.new(4) for _ in range(15)]
    long = [ids.new(rng.randint(5, 12)) for _ in range(120)]
    out, shorts, longs = [], itertools.cycle(short), itertools.cycle(long)
    for _ in range(7000):
        out.append(next(shorts) if rng.random() < 0.4 else next(longs))
    return out


def zipf_drift_fast(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """1,200 prompts in 30 groups, Zipf(1.0) popular, the ranking shuffled every 300 requests."""
    groups = [ids.new(rng.randint(1, 5)) for _ in range(30)]
    prompts = [groups[i % 30] + ids.new(rng.randint(1, 8)) for i in range(1200)]
    weights = _zipf(1200, 1.0)
    out = []
    for phase in range(25):
        perm = np.random.default_rng(50 + phase).permutation(1200)
        picks = np.random.default_rng(500 + phase).choice(1200, 300, p=weights)
        out += [prompts[perm[p]] for p in picks]
    return out


def agents_plus_eval(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """Agents over one repository of 30 pages, and every 1,500 requests a sweep of 300 evaluation prompts."""
    repo = ids.new(30)
    data = [ids.new(3) + ids.new(rng.randint(1, 4)) for _ in range(300)]
    sessions: list[list[int]] = []
    out, in_turn = [], itertools.cycle(data)
    for step in range(7000):
        if step % 1500 < 300:
            out.append(next(in_turn))
            continue
        if len(sessions) < 6 or rng.random() < 0.02:
            sessions.append(list(repo) + ids.new(2))
        i = rng.randrange(len(sessions))
        sessions[i] += ids.new(rng.randint(1, 4))
        out.append(list(sessions[i]))
        if len(sessions[i]) > rng.randint(60, 160):
            sessions.pop(i)
    return out


def random_mix(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """Stretches of 200-2,000 requests of one of chat, a loop, a small hot set or one-off prompts."""
    chat = _Chat(rng, ids, open_sessions=20)
    docs = [ids.new(rng.randint(2, 8)) for _ in range(100)]
    hot = [ids.new(rng.randint(1, 3)) for _ in range(50)]
    out, in_turn, mode, left = [], itertools.cycle(docs), 0, 0
    for _ in range(8000):
        if left <= 0:
            mode, left = rng.randrange(4), rng.randint(200, 2000)
        left -= 1
        if mode == 0:
            out.append(chat.next())
        elif mode == 1:
            out.append(next(in_turn))
        elif mode == 2:
            out.append(hot[min(int(rng.expovariate(0.2)), 49)])
        else:
            out.append(ids.new(rng.randint(2, 10)))
    return out


def hot_shift_loop(rng: random.Random, ids: _Ids) -> list[list[int]]:
    """A loop of 60 documents, each replaced by a new one with probability 0.1 as it comes round."""
    docs = [ids.new(rng.randint(4, 10)) for _ in range(60)]
    out = []
    for _ in range(100):
        for i in range(60):
            if rng.random() < 0.1:
                docs[i] = ids.new(rng.randint(4, 10))
            out.append(docs[i])
    return out


def _trace(name: str, make: Callable[[random.Random, _Ids], list[list[int]]], seed: int) -> Callable[..., Trace]:
    def build(_seed: int = 1) -> Trace:
        prompts = make(random.Random(seed), _Ids())
        requests = [Request(DEFAULT_NS, MOONCAKE_BLOCK * len(ids), hash_ids=list(ids), timestamp=0.1 * i, serial=i)
                    for i, ids in enumerate(prompts)]
        return Trace(name, requests, MOONCAKE_BLOCK)
    build.__doc__ = make.__doc__
    return build


# name -> (generator, its fixed seed)
_SETS = {
    "FIRST": {"loop": (loop, 904), "drift": (drift, 499), "tot": (tot, 351), "abandon": (abandon, 943),
              "sizeskew": (sizeskew, 956), "bimodal": (bimodal, 937), "loop-hot": (loop_hot, 533),
              "repo-agents": (repo_agents, 972)},
    "SECOND": {"loop-noise": (loop_noise, 79195), "eval-rerun": (eval_rerun, 79195),
               "growing-loop": (growing_loop, 95033), "shuffled-epochs": (shuffled_epochs, 118790),
               "zipf-loop-mix": (zipf_loop_mix, 102952), "long-docs-loop": (long_docs_loop, 110871)},
    "THIRD": {"phases-chat-loop": (phases_chat_loop, 1675681), "loop-two-sizes": (loop_two_sizes, 1466223),
              "zipf-drift-fast": (zipf_drift_fast, 1570952), "agents-plus-eval": (agents_plus_eval, 1675681),
              "random-mix": (random_mix, 1047307), "hot-shift-loop": (hot_shift_loop, 1466223)},
}
FIRST, SECOND, THIRD = (tuple(_SETS[s]) for s in ("FIRST", "SECOND", "THIRD"))


def sizeskew_odds() -> dict[int, float]:
    """Each hash id of ``sizeskew`` -> the chance that a request holds it.

    ``sizeskew`` draws every request independently of the ones before, from fixed odds (70 % a short
    prompt by Zipf, 30 % one of the documents, uniformly), so these odds are all a policy could
    ever learn about it (research.hindsight's ``a0`` bound).
    """
    short, long, weights = _sizeskew_prompts(random.Random(_SETS["FIRST"]["sizeskew"][1]), _Ids())
    odds = {page: SIZESKEW_SHORT * float(w) for prompt, w in zip(short, weights) for page in prompt}
    odds.update({page: (1 - SIZESKEW_SHORT) / len(long) for doc in long for page in doc})
    return odds


# workload -> its pages' odds, for workloads whose requests are independent draws from fixed odds
ODDS: dict[str, Callable[[], dict[int, float]]] = {"sizeskew": sizeskew_odds}
ADVERSARIAL: dict[str, Callable[..., Trace]] = {
    name: _trace(name, make, seed) for group in _SETS.values() for name, (make, seed) in group.items()}
