"""research.hindsight and fifo_family (scripts/research): the page-granular LRU is the store's LRU, Belady bounds every rule."""

from __future__ import annotations

import itertools
import random

import pytest

from pfxcache.tools import replay

import research_support  # noqa: F401 - scripts/ on sys.path: the research package
from research import adversarial, fifo_family, hindsight

from test_replay import B
from policy_support import chatty_trace


def test_page_lru_is_the_store_lru_and_belady_bounds_the_told_rules():
    trace = chatty_trace(requests=1500)
    chains = replay.page_chains(trace, B)
    nxt = hindsight.next_uses(chains)
    for capacity in (32, 64):
        lru = hindsight.simulate(chains, nxt, capacity, lambda i, d, nu: (i, -d))
        belady = hindsight.simulate(chains, nxt, capacity, lambda i, d, nu: (-nu, -d))
        told = hindsight.simulate(chains, nxt, capacity, lambda i, d, nu: (nu - i <= 200, i, -d))
        store = replay.replay_store(trace, "lru", capacity, B, quiet=True)["hit_tokens"]
        assert sum(lru) * B == store  # request by request the same rule as the store's lru
        assert sum(belady) * B == replay.belady(trace, chains, capacity, B, quiet=True)["hit_tokens"]
        assert sum(lru) < sum(told) <= sum(belady)


def test_study_reports_what_belady_keeps():
    r = hindsight.study("chat", 0.005, [256], weights=(500,))
    assert r["hit_pages"]["belady"] >= r["hit_pages"]["told 256"] >= r["hit_pages"]["lru"]
    assert r["hit_pages"]["belady"] >= r["hit_pages"]["shares 500"]
    assert sum(r["gaps"].values()) == sum(r["kinds"].values()) > 0


def test_study_runs_the_page_classes_and_the_fifo_family_under_belady():
    r = hindsight.study("chat", 0.005, [256], weights=(500,))
    for rule in ("pages 500", "online 500", *fifo_family.RULES):
        assert r["hit_pages"]["belady"] >= r["hit_pages"][rule] > 0


@pytest.mark.parametrize("rule, last", [("s3-fifo", 4), ("sieve-prefix", 4), ("sieve", 0)])
def test_who_keeps_a_prompt_hit_once_through_a_flood_that_lru_forgets(rule, last):
    # Prompt A (pages 1-4) twice, then 40 one-off requests of 5 pages (200 pages through a 20-page
    # cache), then A again: LRU has forgotten A; S3-FIFO's main FIFO keeps it, and SIEVE's visited bit
    # does once the one-offs' prefixes go with their last pages. Plain SIEVE passes those prefixes as it
    # passes visited pages, wraps, and finds A unvisited: it forgets A as LRU does.
    a = [1, 2, 3, 4]
    ids = itertools.count(100)
    chains = [a, a, *[[next(ids) for _ in range(5)] for _ in range(40)], a]
    nxt = hindsight.next_uses(chains)
    assert hindsight.simulate(chains, nxt, 20, lambda i, d, nu: (i, -d))[-1] == 0
    hits = fifo_family.simulate(chains, 20, rule)
    assert hits[1] == 4 and hits[-1] == last
    assert sum(hits) == 4 + last  # the one-offs never hit


@pytest.mark.parametrize("rule", ["sieve", "sieve-prefix"])
def test_sieve_spares_a_visited_prefix_after_the_page_below_it_goes(rule):
    # Page 0 is hit (visited), then passed by the hand; page 1 below it goes first. Page 0, a leaf now,
    # keeps its reprieve: the never-hit pages 2 and 3 go before it, and its last request hits.
    assert fifo_family.simulate([[0], [0, 1], [2], [3], [4], [0]], 3, rule) == [0, 1, 0, 0, 0, 1]


class ListAndHandSIEVE(fifo_family.SIEVE):
    """SIEVE as the paper states it, a list and a hand (O(n) a step), only leaves going."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.queue: list[int] = []  # oldest first
        self.hand = None  # the page the hand points at (None: the oldest)

    def insert(self, page: int, up: int) -> None:
        self.add(page, up)
        self.queue.append(page)
        self.visited[page] = False

    def evict(self, pinned: set[int]) -> None:
        q = self.queue
        i = q.index(self.hand) if self.hand is not None else 0
        while self.visited[q[i]] or not self.evictable(q[i], pinned):
            self.visited[q[i]] = False
            i = (i + 1) % len(q)
        page = q.pop(i)
        self.hand = q[i] if i < len(q) else None  # past the newest page: back to the oldest
        self.remove(page)
        del self.visited[page]


def random_chains(rng: random.Random) -> list[list[int]]:
    """Requests over a few shared prefixes of a small alphabet, as page ids of a prefix tree."""
    ids: dict[tuple[int, int], int] = {}
    bases = [[rng.randrange(3) for _ in range(8)] for _ in range(rng.randint(1, 4))]
    chains = []
    for _ in range(rng.randint(1, 60)):
        base = rng.choice(bases)
        tokens = base[: rng.randint(0, len(base))] + [rng.randrange(3) for _ in range(rng.randint(0, 3))]
        parent, chain = -1, []
        for token in tokens:
            parent = ids.setdefault((parent, token), len(ids))
            chain.append(parent)
        chains.append(chain)
    return chains


def test_sieve_is_the_papers_list_and_hand():
    rng = random.Random(3)
    fifo_family.RULES["list-and-hand"] = ListAndHandSIEVE
    try:
        for _ in range(1500):
            chains, capacity = random_chains(rng), rng.randint(1, 6)
            assert fifo_family.simulate(chains, capacity, "sieve") == \
                fifo_family.simulate(chains, capacity, "list-and-hand"), (chains, capacity)
    finally:
        del fifo_family.RULES["list-and-hand"]


@pytest.mark.parametrize("rule", sorted(fifo_family.RULES))
def test_the_fifo_family_holds_its_capacity_and_evicts_leaves_only(rule):
    trace = chatty_trace(requests=1500)
    chains = replay.page_chains(trace, B)
    capacity = 32
    cache = fifo_family.RULES[rule](capacity)
    for chain in chains:  # fifo_family.simulate's steps, checking the cache after each request
        k = 0
        while k < len(chain) and chain[k] in cache:
            k += 1
        for page in chain[:k]:
            cache.hit(page)
        for _ in range(len(cache) + len(chain) - k - capacity):
            cache.evict(set(chain))
        assert all(page in cache for page in chain[:k])  # the request's own pages stay
        for d in range(k, len(chain)):
            cache.insert(chain[d], chain[d - 1] if d else -1)
        assert len(cache) <= capacity
        assert all(up < 0 or up in cache for up in cache.parent.values())  # every cached page's prefix is cached
    belady = replay.belady(trace, chains, capacity, B, quiet=True)["hit_tokens"]
    assert 0 < sum(fifo_family.simulate(chains, capacity, rule)) * B <= belady


def test_hindsight_reads_a_trace_of_yours(tmp_path, capsys):
    f = tmp_path / "theirs.jsonl"
    f.write_text("".join(f'{{"timestamp": {i}, "input_length": {3 * 512}, "hash_ids": [0, 1, {2 + i % 5}]}}\n'
                         for i in range(60)))
    assert hindsight.main(["--trace", str(f), "--fraction", "0.5", "--horizons", "4,16",
                           "--share-weights", "10"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert out.startswith("theirs: 60 requests, 7 distinct pages, capacity 16 pages")
    assert "12/12" in captured.err  # the progress bar: one step a rule, each rule once
    assert "s3-fifo" in out and "sieve" in out and "pages 10" in out


def test_online_shares_use_only_what_was_seen_before_each_request():
    chains = replay.page_chains(chatty_trace(requests=800), B)
    cut = chains[:500]
    whole = hindsight.online_page_shares(chains, hindsight.next_uses(chains), hindsight.page_classes(chains), 64)
    early = hindsight.online_page_shares(cut, hindsight.next_uses(cut), hindsight.page_classes(cut), 64)
    assert whole[:500] == early  # the requests after 500 change nothing before them
    assert len({s for row in whole for s in row}) > 2  # and the shares do move as they are learned


def test_sizeskew_odds_are_the_odds_its_requests_are_drawn_from():
    # The a0 bound is only as good as these odds: one per hash id of the prompts drawn from (a few
    # never come up in 6,000 draws), and a request holds as many pages on average as they add up to
    # (within 3 %).
    trace = adversarial.ADVERSARIAL["sizeskew"]()
    odds = adversarial.sizeskew_odds()
    assert set(odds) > {page for r in trace.requests for page in r.hash_ids}
    mean_pages = sum(len(r.hash_ids) for r in trace.requests) / len(trace.requests)
    assert sum(odds.values()) == pytest.approx(mean_pages, rel=0.03)
    popular = trace.requests[0].hash_ids[0]
    assert max(odds.values()) == odds[1] and odds[popular] > 0.3 / 300


def test_the_a0_bound_is_the_capacity_most_likely_pages():
    odds = adversarial.ODDS["sizeskew"]()
    r = hindsight.study("sizeskew", 0.005, [256], quiet=True)
    top = sorted(odds.values(), reverse=True)[: r["capacity"]]
    assert r["hit_pages"]["a0"] == round(r["requests"] * sum(top))
    assert r["hit_pages"]["lru"] < r["hit_pages"]["counted"] <= r["hit_pages"]["belady"]
    assert "a0" not in hindsight.study("chat", 0.005, [256], quiet=True)["hit_pages"]  # no odds: no bound
