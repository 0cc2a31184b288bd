"""PrefixCacheConnector in real vLLM engines (the CPU build), sharing prefix KV through a real pfxcached.

One daemon and four engine processes of a tiny Llama (seeded real weights,
bfloat16, 32-token blocks = daemon pages):

* ``ref``: no connector, vLLM's prefix caching off: the tokens to match;
* ``a``: the connector, vLLM's prefix caching on (its default);
* ``b``: the connector, prefix caching off, so every cached token it reports
  (``num_cached_tokens``) came through pfxcache;
* ``other``: the connector, another model (other weights, same geometry).

What is proved: a fresh engine gets every full page of a shared system prompt
that another engine computed, and its greedy tokens equal the reference's; the
daemon's INFO shows the hits and afterwards no lease is left and PFXCHECK is
OK; vLLM's local hits and pfxcache's combine; cache salts and models never
share pages; pages written by vLLM are read back by ``pfxcache.client.hf``.
"""

from __future__ import annotations

import numpy as np
import pytest
import redis
from pfxcache.client.vllm import base_namespace, request_namespace
from support import wait_for
from vllm_support import (
    PAGE,
    check,
    daemon_for,
    info,
    start_engines,
    tiny_model,
    url_of,
    usable_tokens,
)

pytestmark = pytest.mark.timeout(1800)

SYSTEM = np.random.default_rng(7).integers(3, 500, 4 * PAGE).tolist()    # 4 pages


def tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model = tiny_model(tmp_path_factory)
    other_model = tiny_model(tmp_path_factory, "other-llama", seed=1)
    daemon = daemon_for(model)
    url = url_of(daemon)
    try:
        ref, a, b, other = start_engines(
            dict(model=model),
            dict(model=model, url=url, prefix_caching=True),
            dict(model=model, url=url),
            dict(model=other_model, url=url),
        )
    except Exception:
        daemon.stop()
        raise
    yield {"model": model, "daemon": daemon, "url": url, "ref": ref, "a": a, "b": b, "other": other}
    for engine in (ref, a, b, other):
        engine.stop()
    daemon.stop()


def outputs(engine, prompts, **kwargs):
    return engine.generate(prompts, **kwargs)["outputs"]


def no_lease_left(daemon):
    wait_for(lambda: info(daemon)["pfxcache_active_leases"] == 0, 30, "every lease to end")
    assert check(daemon) == b"OK"


def test_a_fresh_engine_gets_every_full_page_from_another(setup):
    daemon, ref, a, b = setup["daemon"], setup["ref"], setup["a"], setup["b"]
    prompts = [SYSTEM + tokens(1, 20), SYSTEM + tokens(2, 45), SYSTEM + tokens(3, PAGE)]  # the last: 5 full pages
    expected = [out["tokens"] for out in outputs(ref, prompts)]
    stored = outputs(a, prompts[:1])          # A computes the system prompt and stores its pages
    assert stored[0]["tokens"] == expected[0]
    hits_before = info(daemon)["pfxcache_hits_tokens"]

    got = outputs(b, prompts)
    # Every full page before the last token came from pfxcache (B's own prefix cache is off): the
    # system prompt for the first two, and for the third (160 tokens) 4 of its 5 full pages.
    assert [out["cached"] for out in got] == [4 * PAGE] * 3
    assert [out["tokens"] for out in got] == expected
    assert [out["pfxcache"]["loaded_tokens"] for out in got] == [out["cached"] for out in got]
    assert info(daemon)["pfxcache_hits_tokens"] >= hits_before + 3 * 4 * PAGE
    no_lease_left(daemon)

    # B stored the pages A had not: the first prompt's tail page is now cached too, for anyone.
    again = outputs(b, [prompts[1]])
    assert again[0]["cached"] == usable_tokens(prompts[1]) and again[0]["tokens"] == expected[1]
    no_lease_left(daemon)


def test_local_and_external_hits_combine(setup):
    daemon, ref, a, b = setup["daemon"], setup["ref"], setup["a"], setup["b"]
    middle = tokens(11, 2 * PAGE)
    outputs(b, [SYSTEM + middle + tokens(12, 5)])        # B stores the system prompt + 2 more pages
    prompt = SYSTEM + middle + tokens(13, PAGE + 7)      # A has the system prompt locally, not `middle`
    expected = outputs(ref, [prompt])[0]["tokens"]
    got = outputs(a, [prompt])[0]
    assert got["cached"] == 6 * PAGE                     # 4 pages from A's own cache, 2 from pfxcache
    assert got["pfxcache"]["loaded_tokens"] == 2 * PAGE
    assert got["tokens"] == expected
    no_lease_left(daemon)


def test_cache_salts_and_models_never_share_pages(setup):
    daemon, ref, b, other = setup["daemon"], setup["ref"], setup["b"], setup["other"]
    prompt = tokens(21, 3 * PAGE + 9)
    expected = outputs(ref, [prompt])[0]["tokens"]
    first = outputs(b, [prompt], salts=["tenant-a"])[0]
    assert first["cached"] == 0 and first["tokens"] == expected
    same, other_salt, unsalted = outputs(b, [prompt, prompt, prompt], salts=["tenant-a", "tenant-b", None])
    assert same["cached"] == 3 * PAGE and same["tokens"] == expected
    assert other_salt["cached"] == 0 and unsalted["cached"] == 0
    assert same["pfxcache"]["namespace"] != other_salt["pfxcache"]["namespace"]
    assert "tenant-a" not in same["pfxcache"]["namespace"]       # the salt is hashed, never shown

    # Another model (other weights, same geometry) finds none of this model's pages.
    from_other = outputs(other, [SYSTEM + tokens(1, 20), prompt])
    assert [out["cached"] for out in from_other] == [0, 0]
    assert from_other[0]["pfxcache"]["namespace"] != same["pfxcache"]["namespace"]
    keys = {key.decode() for key in redis.Redis(host=daemon.host, port=daemon.port).keys("vllm:*")}
    base = base_namespace(setup["model"], "bfloat16", PAGE)
    assert {base, request_namespace(base, "tenant-a"), request_namespace(base, "tenant-b")} <= keys
    no_lease_left(daemon)


def test_pages_written_by_vllm_are_read_by_the_transformers_integration(setup):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from pfxcache.client import PrefixCache, hf

    prompt = SYSTEM + tokens(31, 40)
    outputs(setup["b"], [prompt])                              # stored by vLLM (the system prompt already was)
    model = transformers.AutoModelForCausalLM.from_pretrained(setup["model"], dtype=torch.bfloat16).eval()
    namespace = base_namespace(setup["model"], "bfloat16", PAGE)
    with PrefixCache.from_url(setup["url"]) as cache:
        cached = hf.generate_with_cache(model, cache, namespace, prompt, 8, store=False, keep_logits=True)
        plain = hf.generate_without_cache(model, prompt, 8, keep_logits=True)
        assert cached.reused_tokens == usable_tokens(prompt)
        # vLLM's K/V is transformers' up to the bfloat16 rounding of two implementations, so each step's
        # logits agree up to that rounding; greedy tokens agree until a step where that rounding flips a
        # near tie of this random tiny model (a CI run did, at step 5), and after it the contexts differ.
        for step, (mine, ref) in enumerate(zip(cached.logits, plain.logits)):
            assert (mine - ref).abs().max() <= 0.1 * ref.abs().max(), step
            if cached.tokens[step] != plain.tokens[step]:
                break
        # The bytes are transformers' own K/V up to bfloat16 rounding of two implementations.
        match = cache.lookup(namespace, prompt[:4 * PAGE], lease=False, with_data=True)
        with torch.no_grad():
            past = model(torch.tensor([prompt[:4 * PAGE]]), use_cache=True).past_key_values
        mine = hf.pages_from_cache(past, 0, 4 * PAGE, PAGE).view(torch.bfloat16).float()
        theirs = torch.frombuffer(bytearray(match.data), dtype=torch.uint8).view(4, -1).view(torch.bfloat16).float()
        assert (mine - theirs).abs().max() <= 0.1 * mine.abs().max()
    no_lease_left(setup["daemon"])
