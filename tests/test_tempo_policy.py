"""The tempo eviction policy: conversations kept by their own pace; pins, leaf first, and replays agree."""

from __future__ import annotations

import itertools

import pytest
from pfxcache.daemon.store import MemoryArena, PrefixStore
from pfxcache.daemon.store.registry import POLICIES
from pfxcache.daemon.store.tempo import TempoPolicy

from test_replay import B, replay
from policy_support import NS, PAGE, chatty_trace, replay_under_leases, switched_to, ticking_store, tokens, turn


def test_registered_and_selectable():
    assert POLICIES["tempo"] is TempoPolicy
    store = switched_to("tempo")
    assert store.policy == "tempo" and store.check() == []
    assert set(store.policy_state()) == {"tempo_new_content_pace_ticks", "tempo_ghost_entries",
                                         "tempo_dead_tail_pages"}


def test_untrained_it_is_lru():
    """Nothing came back yet: every leaf has the same pace and the order is LRU's."""
    for policy in ("lru", "tempo"):
        store = ticking_store(6, policy)
        for k in range(1, 7):
            store.insert(NS, tokens(100 + k))
        store.insert(NS, tokens(200))  # one page too many: the oldest goes
        assert store.cached_tokens(NS, tokens(101)) == 0 and store.cached_tokens(NS, tokens(102)) == 4


def conversations(policy: str) -> tuple[PrefixStore, list[int], list[int]]:
    """A conversation back every 4 requests and one back every 40 (lookups that miss in between),
    ending with a turn of the fast one, then one of the slow one: the fast one is the less recent."""
    store = ticking_store(64, policy)
    fast, slow = [1], [2]
    page = itertools.count(1000)
    for i in range(1, 121):
        if i % 4 == 0:
            fast.append(next(page))
            turn(store, tokens(*fast))
        if i % 40 == 0:
            slow.append(next(page))
            turn(store, tokens(*slow))
        if i % 4:
            store.match(NS, tokens(next(page)), lease=False)  # a one-off lookup: time passes
    return store, fast, slow


@pytest.mark.parametrize("policy", ["lru", "tempo"])
def test_the_fast_conversation_outlives_the_slow_one(policy):
    store, fast, slow = conversations(policy)
    assert store.evict_pages(NS, 1).evicted == 1 and store.check() == []
    kept_fast = store.cached_tokens(NS, tokens(*fast)) == len(fast) * PAGE
    kept_slow = store.cached_tokens(NS, tokens(*slow)) == len(slow) * PAGE
    # LRU takes the fast one's latest page (it was used less recently); tempo the slow one's
    assert (kept_fast, kept_slow) == ((True, False) if policy == "tempo" else (False, True))


def test_keeps_conversations_that_come_back_where_lru_loses_them(chatty):
    lru = replay.replay_store(chatty, "lru", 64, B, quiet=True)["hit_tokens"]
    tempo = replay.replay_store(chatty, "tempo", 64, B, quiet=True)["hit_tokens"]
    assert tempo > 1.3 * lru


@pytest.fixture(scope="module")
def chatty():
    return chatty_trace()


@pytest.mark.parametrize("seed", range(3))
def test_never_evicts_pinned_pages_and_stays_consistent(seed):
    store = replay_under_leases("tempo", seed)
    assert store._index.all.model.returns > 0  # paces were in play


def test_evicts_leaves_first():
    """A shared prefix outlives its continuations, however paced."""
    store = ticking_store(12)
    base = [1, 2, 3, 4]
    for k in range(20):
        turn(store, tokens(*base, 100 + 2 * k, 101 + 2 * k))
        if k % 3 == 0:
            turn(store, tokens(*base, 100 + 2 * k, 101 + 2 * k, 500 + k))  # a quick next turn now and then
        assert store.cached_tokens(NS, tokens(*base)) == 4 * PAGE
        assert store.check() == []


def test_namespace_eviction_orders_by_the_global_paces(chatty):
    tick = itertools.count(1)
    store = PrefixStore(MemoryArena(1, 64), page_size=B, shards=1, policy="tempo",
                        clock=lambda: float(next(tick)), lease_ttl_ms=0)
    other = b"other"
    for i, req in enumerate(chatty.requests[:800]):
        packed = replay.whole_pages(chatty, req, B, 64)[0].tobytes()
        ns = NS if i % 5 else other  # a second namespace: each gets its own index
        m = store.match(ns, packed, lease=False)
        store.insert(ns, packed, offset=m.matched_tokens)
    before = store.stats(NS)["pages"]
    assert store.evict_pages(NS, 6).evicted == 6 and store.stats(NS)["pages"] == before - 6
    assert store.check() == []


def test_store_and_daemon_modes_agree(chatty):
    trace = replay.Trace("chatty", chatty.requests[:1200], B)
    store = replay.replay_store(trace, "tempo", 64, B, quiet=True)
    daemon = replay.DaemonRunner(None, 16).run(trace, "tempo", 64, B, 16, quiet=True)
    assert store["hit_tokens"] == daemon["hit_tokens"]


def test_store_and_daemon_modes_agree_where_a_dead_tail_is_learned():
    """Conversations four blocks longer a turn, in half-block pages: every prompt ends in a dead page."""
    trace = chatty_trace(requests=1200, growth=4)
    tick = itertools.count(1)
    store = PrefixStore(MemoryArena(1, 256), page_size=B // 2, shards=16, policy="tempo",
                        clock=lambda: float(next(tick)), lease_ttl_ms=0)
    hit = replay.replay_requests(store, trace, B // 2, 256, None, 0)
    assert store._index.all.model.tail == 1
    daemon = replay.DaemonRunner(None, 16).run(trace, "tempo", 256, B // 2, 16, quiet=True)
    assert hit == daemon["hit_tokens"]


def test_a_conversation_back_after_eviction_keeps_its_pace_and_its_prompt_is_not_its_own():
    """The ghost knows a conversation by the end of its evicted leaf, not by its first page: one that
    comes back is not new content; another one starting on the same system prompt is."""
    store = ticking_store(64)
    model = store._index.all.model
    system = [1, 2]
    talk = [*system, 10]
    for k in range(4):  # a conversation of four turns on the system prompt
        talk.append(20 + k)
        turn(store, tokens(*talk))
    store.evict_pages(NS, store.stats(NS)["pages"])  # everything goes, system prompt included
    assert store.stats(NS)["pages"] == 0
    news = model.news
    talk.append(30)
    assert turn(store, tokens(*talk)) == 0  # back: a miss, but through the ghost
    assert model.news == news and store.check() == []
    store.evict_pages(NS, store.stats(NS)["pages"])
    turn(store, tokens(*system, 40, 41))  # someone else on the same system prompt: new content
    assert model.news == news + 1


def paced_with_dead_tails(store: PrefixStore, fast: list[int], slow: list[int], requests: int,
                          first_page: int = 10_000) -> None:
    """A conversation back every 4 requests and one back every 40, three pages longer each time, each
    prompt ending with a page unique to it (a dead tail: the next turn goes on from the page before it),
    one-off lookups in between."""
    page = itertools.count(first_page)
    for i in range(1, requests + 1):
        for talk, every in ((fast, 4), (slow, 40)):
            if i % every == 0:
                talk += (next(page), next(page), next(page))
                turn(store, tokens(*talk, next(page)))
        if i % 4:
            store.match(NS, tokens(next(page)), lease=False)


def test_a_next_turn_that_leaves_a_dead_tail_behind_keeps_its_pace():
    """Every prompt ends in a page the next turn does not share (tokens unique to the request, or a block's
    partial end in smaller pages). Its next turn forks off one page before the end: tempo learns that
    (model.tail: what those forks leave, learned from 64 next turns on) and from then on knows it for the
    conversation's next turn, not new content: the fast conversation's pace is the fast one's."""
    store = ticking_store(4096)
    model = store._index.all.model
    fast, slow = [1], [2]
    paced_with_dead_tails(store, fast, slow, 400)
    assert model.tail == 1
    news = model.news  # first turns, and next turns before the tail was learned
    paced_with_dead_tails(store, fast, slow, 400, first_page=20_000)
    assert model.news == news  # every turn since was known as a next turn
    tree = next(iter(store._ns[NS].trees.values()))

    def pace(talk: list[int]) -> float:
        node, _, child, _ = tree.walk(tokens(*talk), len(talk))
        return (child or node).policy_data[0]  # the leaf of its latest turn, dead tail and all

    assert 5 * pace(fast) < pace(slow)  # (with every turn new content, both had the same pace)
    assert store.check() == []


def test_the_ghost_knows_a_conversation_by_the_page_before_its_dead_tail():
    """Evicted whole, a leaf ending in a dead tail is remembered by its last page and by the page
    model.tail before it: the conversation back without that tail is not new content."""
    store = ticking_store(4096)
    model = store._index.all.model
    fast, slow = [1], [2]
    paced_with_dead_tails(store, fast, slow, 400)
    store.evict_pages(NS, store.stats(NS)["pages"])
    news = model.news
    fast += (90_000, 90_001, 90_002)
    assert turn(store, tokens(*fast, 90_003)) == 0  # back: a miss, but through the ghost
    assert model.news == news and store.check() == []


def test_where_next_turns_go_on_from_the_end_no_tail_is_learned():
    """Prompts ending in a partial block (not a page): every next turn goes on from the end, tail 0."""
    store = replay_under_leases("tempo", 0)
    assert store._index.all.model.tail == 0 and store._index.all.model.returns > 0


def test_a_question_forking_off_a_shared_prompt_is_not_a_next_turn():
    """Two one-shot questions on each of 200 system prompts: the second forks off the first one's leaf,
    leaving its question behind and adding about as much. No next turn there (TAIL_SHARE): no tail is
    learned and every question is new content (counted as next turns, the first ones' paces would have
    kept one-shots that never come back)."""
    store = ticking_store(4096)
    model = store._index.all.model
    page = itertools.count(50_000)
    prompts = [[1000 + 3 * k, 1001 + 3 * k, 1002 + 3 * k] for k in range(200)]
    for k in range(len(prompts) + 1):
        if k < len(prompts):
            turn(store, tokens(*prompts[k], next(page), next(page)))
        if k:
            turn(store, tokens(*prompts[k - 1], next(page), next(page)))
    assert model.tail == 0 and sum(model.tails) == 0
    assert model.news == 2 * len(prompts) and store.check() == []
