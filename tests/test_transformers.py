"""pfxcache.client.hf: a real transformers causal LM served through a real pfxcached.

The model is a tiny Llama built locally from a config with seeded random
weights (no downloads), float32, eval mode, one torch thread. The daemon runs
as its own process with the page size and block size the model needs
(``block_bytes_for``), and the worker talks to it through the real client,
both through the mapped shared-memory arena and over RESP (``attach=False``).

What is proved:

* greedy generation that reuses cached K/V gives the same tokens as
  generation without the cache (and as ``model.generate``), and the logits of
  every step agree within 1e-4;
* a second run of a prompt reuses every full page before its last token (the
  last-token rule: a prompt of n tokens reuses (n - 1) // page pages, i.e. all
  its full pages unless n is a multiple of the page size, then all but one);
* two namespaces (two tenants, or two models) never see each other's pages;
* pages_from_cache -> cache_from_pages is exact, the bytes are in the
  documented layout, and block_bytes_for is the size actually produced.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pfxcache.client import PrefixCache  # noqa: E402
from pfxcache.client import hf  # noqa: E402
from pfxcache.testing import start_daemon  # noqa: E402

PAGE = 4
STEPS = 6
ATOL = 1e-4
_names = itertools.count()


def config(**overrides):
    values = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    values.update(overrides)
    return transformers.LlamaConfig(**values)


def build(seed: int, **overrides):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config(**overrides)).eval()


def prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 512, n).tolist()


def ns(tag: str) -> str:
    return f"tiny-llama:{tag}-{next(_names)}"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model():
    return build(0)


@pytest.fixture(scope="module")
def hf_daemon(model):
    block = hf.block_bytes_for(model.config, PAGE, torch.float32)
    instance = start_daemon("--page-size", str(PAGE), "--block-bytes", str(block), "--maxmemory", "8mb",
                            "--evict-low-watermark", "0")
    yield instance
    assert instance.stop() == 0, instance.log_text()


@pytest.fixture(scope="module", params=["shm", "resp"])
def cache(request, hf_daemon):
    """The real client, mapping the arena (shm) or moving the bytes over RESP."""
    url = f"redis://{hf_daemon.host}:{hf_daemon.port}/0"
    instance = PrefixCache.from_url(url, attach=request.param == "shm")
    assert instance.attached == (request.param == "shm") and instance.via == request.param
    yield instance
    instance.close()


def assert_same(result, reference):
    assert result.tokens == reference.tokens
    assert result.logits.shape == reference.logits.shape == (STEPS, 512)
    torch.testing.assert_close(result.logits, reference.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(result.prefill_logits, reference.prefill_logits, atol=ATOL, rtol=0)


# -- layout ---------------------------------------------------------------------------------------------


def test_block_bytes_for():
    # layers x 2 x kv_heads x page x head_dim x dtype size
    assert hf.block_bytes_for(config(), 4) == 2 * 2 * 2 * 4 * 16 * 4
    assert hf.block_bytes_for(config(), 16, torch.bfloat16) == 2 * 2 * 2 * 16 * 16 * 2
    assert hf.block_bytes_for(config(), 16, "float16") == hf.block_bytes_for(config(), 16, torch.bfloat16)
    # No num_key_value_heads: as many as attention heads; an explicit head_dim wins over hidden / heads.
    assert hf.block_bytes_for(config(num_key_value_heads=None), 1) == 2 * 2 * 4 * 1 * 16 * 4
    assert hf.block_bytes_for(config(head_dim=8), 1) == 2 * 2 * 2 * 1 * 8 * 4
    # A Llama-3-8B geometry in bfloat16 with 16-token pages: 2 MiB per block.
    llama3 = config(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8)
    assert hf.block_bytes_for(llama3, 16, torch.bfloat16) == 2 * 1024 * 1024
    with pytest.raises(ValueError):
        hf.block_bytes_for(config(), 0)
    with pytest.raises(ValueError, match="sliding_attention"):
        hf.block_bytes_for(config(layer_types=["full_attention", "sliding_attention"]), 4)


def prefilled(model, ids):
    past = hf._empty_cache(model)
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), use_cache=True, **{hf._cache_kwarg(model)[0]: past})
    return past


def test_page_layout_round_trip(model):
    ids = prompt(1, 14)                       # 3 full pages and a tail of 2
    past = prefilled(model, ids)
    layout = hf.kv_layout(model.config, PAGE, torch.float32)
    pages = hf.pages_from_cache(past, 0, 12, PAGE)
    assert pages.dtype == torch.uint8 and pages.is_contiguous()
    assert pages.shape == (3, layout.block_bytes) == (3, hf.block_bytes_for(model.config, PAGE))

    # The documented layout: per page [layers, 2 (K, V), kv_heads, page, head_dim].
    blocks = pages.view(torch.float32).reshape(3, *layout.shape)
    for layer in range(2):
        keys, values = hf._layer_kv(past, layer)
        for page in range(3):
            span = slice(page * PAGE, (page + 1) * PAGE)
            assert torch.equal(blocks[page, layer, 0], keys[0, :, span])
            assert torch.equal(blocks[page, layer, 1], values[0, :, span])

    # Round trip, from a torch tensor and from the numpy rows the arena holds: bit-exact.
    for source in (pages, pages.numpy().copy()):
        rebuilt = hf.cache_from_pages(source, model.config, PAGE, torch.float32)
        assert rebuilt.get_seq_length() == 12
        for layer in range(2):
            keys, values = hf._layer_kv(past, layer)
            new_keys, new_values = hf._layer_kv(rebuilt, layer)
            assert torch.equal(new_keys, keys[:, :, :12]) and torch.equal(new_values, values[:, :, :12])
        assert torch.equal(hf.pages_from_cache(rebuilt, 0, 12, PAGE), pages)

    # A range in the middle is the matching rows.
    assert torch.equal(hf.pages_from_cache(past, 4, 12, PAGE), pages[1:])
    with pytest.raises(ValueError, match="whole pages"):
        hf.pages_from_cache(past, 2, 12, PAGE)
    with pytest.raises(ValueError, match="tokens up to 16"):
        hf.pages_from_cache(past, 0, 16, PAGE)
    with pytest.raises(ValueError, match="whole blocks"):
        hf.cache_from_pages(pages.reshape(-1)[:-1], model.config, PAGE, torch.float32)


def test_page_layout_bfloat16_round_trip():
    cfg = config()
    past = hf.cache_from_pages(np.zeros((0, 8), np.uint8), cfg, 2, torch.bfloat16)
    generator = torch.Generator().manual_seed(3)
    for layer in range(2):
        k = torch.randn(1, 2, 6, 16, generator=generator).to(torch.bfloat16)
        past.update(k, k * 2, layer)
    pages = hf.pages_from_cache(past, 0, 6, 2)
    assert pages.shape == (3, hf.block_bytes_for(cfg, 2, torch.bfloat16))
    rebuilt = hf.cache_from_pages(pages, cfg, 2, torch.bfloat16)
    for layer in range(2):
        assert all(torch.equal(a, b) for a, b in zip(hf._layer_kv(rebuilt, layer), hf._layer_kv(past, layer)))


# -- generation --------------------------------------------------------------------------------------------


def test_reference_is_greedy_generate(model):
    """generate_without_cache is the standard greedy decoding: model.generate(do_sample=False)."""
    ids = prompt(2, 23)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    assert hf.greedy_generate(model, ids, STEPS) == out[0, len(ids):].tolist()


def test_cached_generation_equals_uncached(model, cache):
    space = ns("tenant-a")
    system = prompt(10, 5 * PAGE)                        # a shared system prompt, 5 pages
    first = system + prompt(11, 7)                       # 27 tokens: 6 full pages
    reference = hf.generate_without_cache(model, first, STEPS, keep_logits=True)

    cold = hf.generate_with_cache(model, cache, space, first, STEPS, keep_logits=True)
    assert (cold.reused_tokens, cold.computed_tokens, cold.stored_pages) == (0, 27, 6)
    assert cold.via == cache.via
    assert_same(cold, reference)

    warm = hf.generate_with_cache(model, cache, space, first, STEPS, keep_logits=True)
    assert (warm.reused_tokens, warm.computed_tokens, warm.stored_pages) == (24, 3, 0)
    assert warm.hit_rate == pytest.approx(24 / 27)
    assert_same(warm, reference)

    # Another user with the same system prompt: the system pages (and no more) come from the cache.
    second = system + prompt(12, 10)                     # 30 tokens: 7 full pages
    other = hf.generate_with_cache(model, cache, space, second, STEPS, keep_logits=True)
    assert (other.reused_tokens, other.stored_pages) == (5 * PAGE, 2)
    assert_same(other, hf.generate_without_cache(model, second, STEPS, keep_logits=True))

    # The next turn of that chat: prompt + answer + new message reuses the whole previous prompt's pages.
    turn = second + other.tokens + prompt(13, 5)
    again = hf.generate_with_cache(model, cache, space, turn, STEPS, keep_logits=True)
    assert again.reused_tokens == 7 * PAGE
    assert_same(again, hf.generate_without_cache(model, turn, STEPS, keep_logits=True))
    # Nothing stays pinned: every lease was released.
    stats = cache.info().stats
    assert (stats["leases"], stats["blocks_leased"], stats["pinned_pages"]) == (0, 0, 0)


@pytest.mark.parametrize("length, reused", [
    (26, 24),      # 6 full pages and a tail: all 6 are reused
    (24, 20),      # exactly 6 pages: the last token's page is computed again (the last-token rule)
    (5, 4),
    (4, 0),        # one page holding the last token: nothing to reuse
    (3, 0),        # shorter than a page: nothing is cached at all
])
def test_second_run_reuses_every_full_page(model, cache, length, reused):
    space = ns("rerun")
    ids = prompt(20 + length, length)
    reference = hf.generate_without_cache(model, ids, STEPS, keep_logits=True)
    first = hf.generate_with_cache(model, cache, space, ids, STEPS, keep_logits=True)
    assert first.reused_tokens == 0 and first.stored_pages == length // PAGE  # every full page is stored
    second = hf.generate_with_cache(model, cache, space, ids, STEPS, keep_logits=True)
    assert second.reused_tokens == reused == (length - 1) // PAGE * PAGE
    assert second.stored_pages == 0
    assert_same(first, reference)
    assert_same(second, reference)


def test_namespaces_never_share_pages(model, cache):
    """Two tenants of one model, and a second model, on one daemon: no namespace sees another's pages."""
    ids = prompt(30, 18)
    a, b, other_model = ns("tenant-a"), ns("tenant-b"), ns("other-model")
    assert hf.generate_with_cache(model, cache, a, ids, STEPS).stored_pages == 4
    assert cache.lookup(b, ids, lease=False).matched_tokens == 0
    first_b = hf.generate_with_cache(model, cache, b, ids, STEPS)
    assert (first_b.reused_tokens, first_b.stored_pages) == (0, 4)   # tenant a's pages are not tenant b's

    # A different model (other weights) with the same prompt under its own namespace: had it been
    # served model 0's pages, its tokens would not be its own.
    model2 = build(1)
    reference = hf.generate_without_cache(model2, ids, STEPS, keep_logits=True)
    assert reference.tokens != hf.greedy_generate(model, ids, STEPS)
    cold = hf.generate_with_cache(model2, cache, other_model, ids, STEPS, keep_logits=True)
    warm = hf.generate_with_cache(model2, cache, other_model, ids, STEPS, keep_logits=True)
    assert (cold.reused_tokens, warm.reused_tokens) == (0, 16)
    assert_same(cold, reference)
    assert_same(warm, reference)

    # Evicting one tenant leaves the other's pages alone.
    assert cache.evict(a, all=True).evicted == 4
    assert hf.generate_with_cache(model, cache, a, ids, STEPS).reused_tokens == 0
    assert hf.generate_with_cache(model, cache, b, ids, STEPS).reused_tokens == 16


def test_geometry_mismatch_is_refused(cache):
    wider = build(2, num_hidden_layers=3)
    with pytest.raises(ValueError, match=r"--block-bytes %d" % hf.block_bytes_for(wider.config, PAGE)):
        hf.generate_with_cache(wider, cache, ns("wider"), prompt(40, 9), 2)
    with pytest.raises(ValueError, match="page-size"):
        hf.generate_with_cache(wider, cache, ns("wider"), prompt(40, 9), 2, page_size=PAGE * 2)


def test_full_cache_still_generates(model):
    """Every block pinned by another worker: the store is skipped (cache_full), generation goes on."""
    block = hf.block_bytes_for(model.config, PAGE)
    daemon = start_daemon("--page-size", str(PAGE), "--block-bytes", str(block), "--maxmemory", str(4 * block))
    url = f"redis://{daemon.host}:{daemon.port}/0"
    try:
        with PrefixCache.from_url(url) as other, other.alloc("someone-else", 4):
            ids = prompt(50, 17)
            for attach in (True, False):
                with PrefixCache.from_url(url, attach=attach) as cache:
                    result = hf.generate_with_cache(model, cache, ns("small"), ids, STEPS)
                    assert result.cache_full and result.stored_pages == 0
                    assert result.tokens == hf.greedy_generate(model, ids, STEPS)
    finally:
        assert daemon.stop() == 0
