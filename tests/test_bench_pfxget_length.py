"""bench_pfxget_length does the work it claims: every prompt stored whole, every PFXGET a full hit of its length."""

from __future__ import annotations

import json

import numpy as np
import pytest
import redis

from pfxcache.testing import start_daemon
from pfxcache.tools import bench_pfxget_length as tool


def test_each_prompt_is_its_own_path_of_whole_pages():
    a, b = tool.prompt(64, 0), tool.prompt(64, 1)
    assert len(a) == len(b) == 64 * 4 and a[:4] != b[:4] and a[4:] != b[4:]
    assert tool.prompt(256, 0)[:4] != a[:4]  # another length: another first page too


@pytest.mark.parametrize("page", [1, 16])
def test_a_round_reads_full_hits_and_counts_the_daemon_s_cpu(page):
    daemon = start_daemon("--page-size", str(page), "--block-bytes", str(tool.BLOCK_BYTES), "--maxmemory", "4mb",
                          "--arena", "memory", "--maxmemory-policy", "lru")
    try:
        with tool.RespConnection(daemon.address) as conn:
            prompts = [tool.prompt(256, s) for s in range(3)]
            for tokens in prompts:
                tool.store(conn, tokens, 256 // page)
            requests = [tool.encode_command(b"PFXGET", tool.NS, b"PACKED", t, b"NOLEASE") for t in prompts]
            row = tool.read_round(conn, daemon.proc.pid, requests, 256, 0.05)
            assert row["requests"] >= 1 and row["cpu_us"] > 0
            with pytest.raises(RuntimeError, match="did not hit in full"):  # a shorter hit is refused
                tool.read_round(conn, daemon.proc.pid, requests, 512, 0.05)
        r = redis.Redis(*daemon.address)
        stats = r.execute_command("PFXINFO", tool.NS)[b"stats"]
        assert stats[b"pages"] == 3 * 256 // page and stats[b"leases"] == 0  # NOLEASE: nothing pinned
        r.close()
    finally:
        daemon.stop()


def test_the_report_compares_cost_per_token_with_the_shortest_prompt(capsys):
    assert tool.main(["--pages", "16", "--lengths", "64,256", "--prompts", "2", "--repeat", "1",
                      "--duration", "0.05", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["page_size"], r["tokens"], r["pages"]) for r in rows] == [(16, 64, 4), (16, 256, 16)]
    assert rows[0]["cpu_growth"] == 1.0 and all(r["requests"] >= 1 for r in rows)
    assert np.isclose(rows[1]["cpu_growth"], rows[1]["cpu_us_per_1k_tokens"] / rows[0]["cpu_us_per_1k_tokens"])
