"""The SGLang comparison of scripts/bench-store checks what it claims: on the same workload SGLang 0.5.23's
RadixCache and the store agree on every insert's prefix length and every match length, at page 16 and 1.

SGLang's code comes from its PyPI wheel (pfxcache.tools.sglang_peer); without torch or the wheel the test is
skipped (it says why). Speed is not asserted."""

from __future__ import annotations

import pytest

from pfxcache.tools import sglang_peer, store_vs_sglang


@pytest.fixture(scope="module")
def sglang():
    pytest.importorskip("torch")
    try:
        return sglang_peer.load()
    except sglang_peer.PeerUnavailable as exc:
        pytest.skip(f"SGLang's RadixCache is not available here: {exc}")


@pytest.mark.parametrize("page", [16, 1])
def test_same_lengths_on_the_same_workload(sglang, page):
    # compare() raises on the first insert or match length that differs, and on trees of different sizes.
    row = store_vs_sglang.compare(sglang, page_size=page, tokens=4096, prompt_tokens=128, new_pages=max(1, 32 // page),
                                  repeat=1, min_time=1e-6, seed=3)
    assert row["tokens"] >= 4096 and row["matched_tokens"] > 0
    ours, theirs = row["evicted_tokens"]
    assert ours > 0 and theirs >= ours - page  # both evicted about a tenth; SGLang whole leaves


def test_a_disagreement_is_caught(sglang, monkeypatch):
    # A store that under-reports its matches must make the comparison fail, not pass silently.
    real = store_vs_sglang.PrefixStore.match

    def short(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        return result._replace(matched_tokens=max(0, result.matched_tokens - self.page_size))

    monkeypatch.setattr(store_vs_sglang.PrefixStore, "match", short)
    with pytest.raises(RuntimeError, match="match lengths differ"):
        store_vs_sglang.compare(sglang, page_size=16, tokens=2048, prompt_tokens=128, new_pages=2, repeat=1,
                                min_time=1e-6, seed=3)


def test_a_missing_peer_names_the_setup_that_installs_it(tmp_path, monkeypatch):
    """The peers are installed by scripts/setup (sglang, mooncake), never by the modules: absent, they say so."""
    from pfxcache.tools import mooncake_peer

    monkeypatch.setattr(sglang_peer, "peer_dir", lambda: tmp_path / "sglang")
    with pytest.raises(sglang_peer.PeerUnavailable, match="run scripts/setup sglang"):
        sglang_peer.locate()
    monkeypatch.setattr(mooncake_peer, "venv_dir", lambda: tmp_path / "mooncake-venv")
    with pytest.raises(mooncake_peer.PeerUnavailable, match="run scripts/setup mooncake"):
        mooncake_peer.locate()
    assert not (tmp_path / "sglang").exists() and not (tmp_path / "mooncake-venv").exists()  # nothing fetched
