"""End to end: the PFX* commands of a real pfxcached, driven by redis-py, redis-cli and raw sockets.

Every test talks to a daemon process over loopback and checks what the daemon
did: the replies it sent, what PFXINFO / INFO / DBSIZE report afterwards, and
the bytes in its shared-memory arena (mapped here, as an inference worker maps
it). Geometry is kept tiny (pages of 4 tokens, blocks of a few bytes or KiB)
so that every page and every block can be counted.
"""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
import uuid

import hiredis

from pfxcache.daemon.config.engine import DIRECTIVES
from pfxcache.daemon.store.registry import SHIPPED
import numpy as np
import pytest
import redis
from pfxcache.daemon.store import MemoryArena, PrefixStore
from pfxcache.testing import encode_command, start_daemon
from support import RawClient, wait_for

PS = 4  # tokens per page in most daemons here
BB = 1024  # bytes per block in most daemons here
SMALL = ("--page-size", str(PS), "--block-bytes", str(BB), "--evict-low-watermark", "0")


# -- helpers ---------------------------------------------------------------------------------------


def packed(tokens) -> bytes:
    """Little-endian uint32 token ids, as PACKED carries them."""
    return np.asarray(list(tokens), dtype="<u4").tobytes()


def page_tokens(seed: int, pages: int, tail: int = 0) -> list[int]:
    """``pages`` whole pages of distinct token ids starting at ``seed``, then ``tail`` more tokens."""
    return list(range(seed, seed + pages * PS + tail))


def pattern(nbytes: int, seed: int) -> bytes:
    """Deterministic, position-dependent bytes (every block of it is different)."""
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()


def _key(k) -> str:
    return k.decode() if isinstance(k, bytes) else k


def as_map(reply) -> dict:
    """A RESP3 map (dict) or a RESP2 flat name/value array, as a dict with str keys."""
    if isinstance(reply, dict):
        return {_key(k): v for k, v in reply.items()}
    assert isinstance(reply, list) and len(reply) % 2 == 0, reply
    return {_key(reply[i]): reply[i + 1] for i in range(0, len(reply), 2)}


def client(daemon, protocol: int = 3) -> redis.Redis:
    return redis.Redis(host=daemon.host, port=daemon.port, protocol=protocol, socket_timeout=30)


def cmd(r: redis.Redis, *args) -> dict:
    """Run a PFX* command whose reply is a map."""
    return as_map(r.execute_command(*args))


def pfxinfo(r: redis.Redis, namespace: bytes | str | None = None) -> dict:
    """PFXINFO with its nested maps normalised (arena, stats); ints stay ints."""
    reply = as_map(r.execute_command("PFXINFO", *([namespace] if namespace is not None else [])))
    reply["arena"] = as_map(reply["arena"])
    reply["stats"] = as_map(reply["stats"])
    reply["stats"].pop("hit_rate")  # a double: RESP2 sends it as text
    return reply


def stats(r: redis.Redis, namespace=None) -> dict:
    return pfxinfo(r, namespace)["stats"]


def get(r, ns, tokens, *options) -> dict:
    return cmd(r, "PFXGET", ns, "PACKED", packed(tokens), *options)


def put(r, ns, tokens, data=None, *, offset=None, blocks=None) -> dict:
    args = ["PFXSET", ns, "PACKED", packed(tokens)]
    if offset is not None:
        args += ["OFFSET", offset]
    args += ["DATA", data] if blocks is None else ["BLOCKS", *blocks]
    return cmd(r, *args)


def arena_map(r: redis.Redis) -> np.memmap:
    """Map the daemon's shared-memory arena here, as a worker does: (nblocks, block_bytes) uint8."""
    info = pfxinfo(r)
    arena = info["arena"]
    assert _key(arena["backend"]) == "shm"
    path = _key(arena["path"])
    assert os.stat(path).st_ino == arena["inode"]  # the daemon's sealed memfd (issue 12)
    nblocks, block_bytes = arena["blocks-total"], info["block-bytes"]
    assert os.stat(path).st_size == nblocks * block_bytes == arena["size"]
    return np.memmap(path, dtype=np.uint8, mode="r+", shape=(nblocks, block_bytes))


class Raw:
    """A raw RESP2 connection that reads exactly one reply per command (errors come back as values)."""

    def __init__(self, address) -> None:
        self.sock = socket.create_connection(address, timeout=30)
        self.reader = hiredis.Reader()

    def call(self, *args):
        self.sock.sendall(encode_command(*args))
        while True:
            reply = self.reader.gets()
            if reply is not False:
                return reply
            chunk = self.sock.recv(1 << 16)
            assert chunk, "the daemon closed the connection"
            self.reader.feed(chunk)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def small(fresh_daemon):
    """A fresh daemon: pages of 4 tokens, 1 KiB blocks, 64 blocks, no background eviction."""
    return fresh_daemon("--maxmemory", "64kb", *SMALL)


# -- 1. round trip with redis-py, RESP3 and RESP2 ----------------------------------------------------


@pytest.mark.parametrize("protocol", [3, 2])
def test_round_trip_packed(small, protocol):
    r = client(small, protocol)
    ns = f"rt{protocol}"
    reply_type = dict if protocol == 3 else list
    assert isinstance(r.execute_command("PFXGET", ns, "TOKENS", 1, 2, 3, 4), reply_type)

    prompt = page_tokens(1000, 2, tail=2)  # 2 full pages and a partial one
    data = pattern(2 * BB, 1)

    # Nothing cached yet: a miss, no lease, no blocks.
    assert get(r, ns, prompt) == {"matched": 0, "lease": 0, "blocks": []}

    stored = put(r, ns, prompt, data)
    assert stored["stored"] == 2 and stored["existing"] == 0
    blocks = stored["blocks"]
    assert len(blocks) == 2 and len(set(blocks)) == 2
    info = stats(r, ns)
    assert (info["pages"], info["inserts"], info["stored_pages"]) == (2, 1, 2)

    # Lookup: whole pages only, one block per page, a lease that pins them.
    before = stats(r, ns)
    hit = get(r, ns, prompt)
    assert hit["matched"] == 8 and hit["blocks"] == blocks and hit["lease"] > 0
    after = stats(r, ns)
    assert after["hits_tokens"] - before["hits_tokens"] == 8  # counted in tokens
    assert after["misses_tokens"] - before["misses_tokens"] == 2
    assert after["leases"] == 1 and after["pinned_pages"] == 2

    # WITHDATA gives back exactly the stored bytes; NOLEASE takes no lease (and keeps none).
    full = get(r, ns, prompt, "NOLEASE", "WITHDATA")
    assert full["data"] == data and full["lease"] == 0 and full["blocks"] == blocks
    assert stats(r, ns)["leases"] == 1

    # The partial tail was not cached: a prompt ending inside page 1 matches page 0 only.
    assert get(r, ns, prompt[:7], "NOLEASE") == {"matched": 4, "lease": 0, "blocks": blocks[:1]}
    assert stats(r, ns)["pages"] == 2

    # A longer prompt that shares the first page and a half matches the shared whole page only.
    diverging = prompt[:6] + [9, 9, 9, 9, 9]
    assert get(r, ns, diverging, "NOLEASE")["blocks"] == blocks[:1]
    # One that shares both pages and goes on matches both, and nothing beyond.
    longer = prompt[:8] + page_tokens(5000, 2, tail=3)
    got = get(r, ns, longer, "NOLEASE", "WITHDATA")
    assert (got["matched"], got["blocks"], got["data"]) == (8, blocks, data)

    # OFFSET: add pages 2 and 3 after the cached 8 tokens, with only their data.
    more = pattern(2 * BB, 2)
    ext = put(r, ns, longer, more, offset=8)
    assert ext["stored"] == 2 and ext["existing"] == 0
    assert ext["blocks"][:2] == blocks and len(ext["blocks"]) == 4
    got = get(r, ns, longer, "NOLEASE", "WITHDATA")
    assert got["matched"] == 16 and got["blocks"] == ext["blocks"] and got["data"] == data + more

    # The same pages again from offset 0: all existing, nothing stored, the cached bytes stay.
    again = put(r, ns, longer, pattern(4 * BB, 3))
    assert (again["stored"], again["existing"], again["blocks"]) == (0, 4, ext["blocks"])
    assert get(r, ns, longer, "NOLEASE", "WITHDATA")["data"] == data + more
    # Offset 4 with one page more than cached: 3 existing from the offset, 1 stored.
    longest = longer[:16] + page_tokens(7000, 1)
    last = pattern(4 * BB, 4)
    mixed = put(r, ns, longest, last, offset=4)
    assert (mixed["stored"], mixed["existing"]) == (1, 3)
    assert mixed["blocks"][:4] == ext["blocks"] and len(mixed["blocks"]) == 5
    assert get(r, ns, longest, "NOLEASE", "WITHDATA")["data"] == data + more + last[3 * BB :]
    # And once more: stores 0.
    assert put(r, ns, longest, last, offset=4)["stored"] == 0
    info = stats(r, ns)
    assert info["pages"] == 5 and info["stored_pages"] == 5

    # The lease from the first lookup is ours to end, once.
    assert r.execute_command("PFXRELEASE", hit["lease"]) == 1
    assert r.execute_command("PFXRELEASE", hit["lease"]) == 0
    assert stats(r, ns)["pinned_pages"] == 0
    r.close()


# -- 2. redis-cli -------------------------------------------------------------------------------------


def test_redis_cli_tokens_and_pipe(fresh_daemon):
    d = fresh_daemon("--maxmemory", "1mb", "--page-size", "4", "--block-bytes", "8", "--evict-low-watermark", "0")

    def cli(*args, stdin=None, text=True):
        proc = subprocess.run(["redis-cli", "-h", d.host, "-p", str(d.port), *args], input=stdin,
                              capture_output=True, text=text, timeout=30, check=False)
        assert proc.returncode == 0, proc
        return proc.stdout

    toks = [str(t) for t in range(1, 10)]  # 2 pages and a tail
    out = cli("PFXSET", "cli", "TOKENS", *toks, "DATA", "aaaaaaaabbbbbbbb")
    assert out.split("\n")[:6] == ["stored", "2", "existing", "0", "blocks", out.split("\n")[5]]
    blocks = out.split("\n")[5:7]

    out = cli("-3", "PFXGET", "cli", "TOKENS", *toks, "NOLEASE", "WITHDATA")
    assert out.splitlines() == ["matched 8", "lease 0", f"blocks {blocks[0]}", blocks[1], "data aaaaaaaabbbbbbbb"]
    out = cli("--no-raw", "-3", "PFXGET", "cli", "TOKENS", *toks, "NOLEASE")
    assert '1# "matched" => (integer) 8' in out and '2# "lease" => (integer) 0' in out
    out = cli("--no-raw", "PFXGET", "cli", "TOKENS", *toks[:4], "NOLEASE", "WITHDATA")
    assert out.splitlines()[:2] == ['1) "matched"', "2) (integer) 4"] and '"aaaaaaaa"' in out

    out = cli("-3", "PFXINFO", "cli")
    lines = out.splitlines()
    assert "page-size 4" in lines and "block-bytes 8" in lines and "pages 2" in lines
    out = cli("--no-raw", "PFXINFO")
    assert '"page-size"' in out and '"blocks-free"' in out

    assert cli("PFXEVICT", "cli", "TOKENS", *toks[:4]).splitlines() == ["evicted", "2", "freed", "16", "pinned", "0"]
    assert cli("-3", "PFXGET", "cli", "TOKENS", *toks, "NOLEASE").splitlines()[0] == "matched 0"
    assert cli("-3", "PFXEVICT", "cli", "ALL").splitlines() == ["evicted 0", "freed 0", "pinned 0"]
    assert cli("PFXGET", "cli", "TOKENS", "1", "x").startswith("ERR ")

    # Mass insert: redis-cli --pipe of many PFXSET TOKENS ... DATA commands.
    n = 2000
    payload = b"".join(
        encode_command("PFXSET", "bulk", "TOKENS", *[str(i * 100 + j) for j in range(8)], "DATA", bytes([i % 251]) * 16)
        for i in range(n)
    )
    out = cli("--pipe", stdin=payload, text=False).decode()
    assert f"errors: 0, replies: {n}" in out, out
    out = cli("-3", "PFXINFO", "bulk").splitlines()
    assert f"inserts {n}" in out and f"pages {2 * n}" in out
    out = cli("-3", "PFXGET", "bulk", "TOKENS", *[str(1234 * 100 + j) for j in range(8)], "NOLEASE", "WITHDATA",
              text=False)
    assert out.splitlines()[0] == b"matched 8" and out.splitlines()[-1] == b"data " + bytes([1234 % 251]) * 16


# -- 3. the zero-copy path through the shared-memory arena ------------------------------------------


def test_zero_copy_arena(small):
    r, other = client(small), client(small)
    arena = arena_map(r)
    ns = "zc"

    # DATA lands in the blocks PFXSET names.
    prompt = page_tokens(10, 3, tail=1)
    data = pattern(3 * BB, 10)
    blocks = put(r, ns, prompt, data)["blocks"]
    assert arena[blocks].tobytes() == data

    # A worker allocates, writes into the mapping, hands the blocks over; another client reads them.
    lease = cmd(r, "PFXALLOC", ns, 2)
    ids = lease["blocks"]
    assert lease["lease"] > 0 and len(ids) == 2 and not set(ids) & set(blocks)
    assert stats(r)["blocks_leased"] == 2
    mine = pattern(2 * BB, 11)
    arena[ids] = np.frombuffer(mine, dtype=np.uint8).reshape(2, BB)
    arena.flush()
    prompt2 = page_tokens(50, 2, tail=3)
    res = put(r, ns, prompt2, blocks=ids)
    assert (res["stored"], res["existing"], res["blocks"]) == (2, 0, ids)
    got = get(other, ns, prompt2, "WITHDATA")
    assert (got["matched"], got["blocks"], got["data"]) == (8, ids, mine)
    assert other.execute_command("PFXRELEASE", got["lease"]) == 1
    # Ownership moved to the tree: the allocation lease no longer holds them, ending it frees nothing.
    info = stats(r)
    assert info["blocks_leased"] == 0 and info["pages"] == 5
    assert r.execute_command("PFXRELEASE", lease["lease"]) == 1
    assert stats(r)["blocks_free"] == info["blocks_free"]
    assert get(other, ns, prompt2, "NOLEASE", "WITHDATA")["data"] == mine

    # BLOCKS for pages that are cached already: nothing stored, the tree keeps its blocks, ours are freed.
    dup = cmd(r, "PFXALLOC", ns, 2)
    free_before = stats(r)["blocks_free"]
    res = put(r, ns, prompt2, blocks=dup["blocks"])
    assert (res["stored"], res["existing"], res["blocks"]) == (0, 2, ids)
    s = stats(r)
    assert (s["blocks_free"], s["blocks_leased"], s["pages"]) == (free_before + 2, 0, 5)
    assert r.execute_command("PFXRELEASE", dup["lease"]) == 1

    # BLOCKS that are not the caller's: another connection's lease, random ids, cached ids.
    theirs = cmd(other, "PFXALLOC", ns, 1)["blocks"]
    own = cmd(r, "PFXALLOC", ns, 1)
    free_id = next(b for b in range(arena.shape[0]) if b not in set(blocks + ids + theirs + own["blocks"]))
    prompt3 = page_tokens(90, 1)
    before_all, before_ns = pfxinfo(r), pfxinfo(r, ns)
    for bad in ([theirs[0]], [free_id], [blocks[0]], [10**6], [own["blocks"][0], own["blocks"][0]]):
        with pytest.raises(redis.ResponseError) as err:
            put(r, ns, prompt3, blocks=bad)
        assert "block" in str(err.value)
    with pytest.raises(redis.ResponseError):  # two ids for one page
        put(r, ns, prompt3, blocks=[own["blocks"][0], theirs[0]])
    assert (pfxinfo(r), pfxinfo(r, ns)) == (before_all, before_ns)
    assert get(r, ns, prompt3, "NOLEASE")["matched"] == 0
    # Still usable by their owners.
    arena[theirs[0]] = 7
    assert put(other, ns, prompt3, blocks=theirs)["blocks"] == theirs
    assert get(r, ns, prompt3, "NOLEASE", "WITHDATA")["data"] == b"\x07" * BB
    del arena
    r.close(), other.close()


# -- 4. leases ----------------------------------------------------------------------------------------


def test_leases_release_and_ownership(small):
    r, other = client(small), client(small, 2)
    ns = "lease"
    prompt = page_tokens(1, 2)
    put(r, ns, prompt, pattern(2 * BB, 1))
    free0 = stats(r)["blocks_free"]
    l1 = get(r, ns, prompt)["lease"]
    l2 = get(r, ns, prompt[:4])["lease"]
    alloc = cmd(r, "PFXALLOC", ns, 3)
    assert len({l1, l2, alloc["lease"]}) == 3 and 0 not in (l1, l2, alloc["lease"])
    s = stats(r)
    assert (s["leases"], s["pinned_pages"], s["blocks_leased"], s["blocks_free"]) == (3, 2, 3, free0 - 3)

    # Another connection cannot end them.
    assert other.execute_command("PFXRELEASE", l1, l2, alloc["lease"]) == 0
    assert stats(r)["leases"] == 3
    # Releasing with junk among the ids is an error and releases nothing.
    with pytest.raises(redis.ResponseError):
        r.execute_command("PFXRELEASE", l1, "junk")
    assert stats(r)["leases"] == 3
    # The owner can; unknown ids and repeats count 0.
    assert r.execute_command("PFXRELEASE", l1, l2, 987654, l1) == 2
    s = stats(r)
    assert (s["leases"], s["pinned_pages"]) == (1, 0)
    assert r.execute_command("PFXRELEASE", alloc["lease"]) == 1
    s = stats(r)
    assert (s["leases"], s["blocks_leased"], s["blocks_free"]) == (0, 0, free0)
    r.close(), other.close()


def test_lease_ttl_expiry(small):
    r = client(small)
    ns = "ttl"
    prompt = page_tokens(1, 2)
    put(r, ns, prompt, pattern(2 * BB, 1))
    free0 = stats(r)["blocks_free"]
    lease = get(r, ns, prompt, "TTL", 1000)["lease"]
    alloc = cmd(r, "PFXALLOC", ns, 3, "TTL", 1000)
    s = stats(r)
    assert (s["leases"], s["pinned_pages"], s["blocks_leased"]) == (2, 2, 3)
    # While the lease lives its pages cannot be evicted (and the eviction says why).
    assert cmd(r, "PFXEVICT", ns, "ALL") == {"evicted": 0, "freed": 0, "pinned": 2}

    start = time.monotonic()
    watcher = client(small)  # the owner stays silent: a command from it would end its fenced leases
    wait_for(lambda: stats(watcher)["leases"] == 0, 5, "the TTL'd leases to expire")
    assert time.monotonic() - start < 1.5
    # Expired leases of a live connection are fenced (issue 12): their ids are dead, but their
    # blocks stay out of circulation until the owner speaks again, releases them or disconnects.
    s = stats(watcher)
    assert (s["fenced_leases"], s["pinned_pages"], s["blocks_leased"], s["pages"]) == (2, 2, 3, 2)
    assert r.execute_command("PFXRELEASE", lease, alloc["lease"]) == 0  # already gone
    watcher.close()
    s = stats(r)
    assert (s["pinned_pages"], s["blocks_leased"], s["blocks_free"], s["pages"]) == (0, 0, free0, 2)
    assert cmd(r, "PFXEVICT", ns, "ALL") == {"evicted": 2, "freed": 2 * BB, "pinned": 0}
    r.close()


WORKER = r"""
import json, sys
from array import array
import redis
r = redis.Redis(host=sys.argv[1], port=int(sys.argv[2]), protocol=3)
tokens = array("I", range(1, 9)).tobytes()
got = r.execute_command("PFXGET", "kill", "PACKED", tokens)
alloc = r.execute_command("PFXALLOC", "kill", 5)
print(json.dumps({"lease": got[b"lease"], "matched": got[b"matched"], "alloc": alloc[b"lease"],
                  "blocks": alloc[b"blocks"]}), flush=True)
sys.stdin.read()
"""


def test_killed_worker_process_releases_its_leases(small):
    r = client(small)
    put(r, "kill", range(1, 9), pattern(2 * BB, 1))
    base = stats(r)
    worker = subprocess.Popen([sys.executable, "-c", WORKER, small.host, str(small.port)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = worker.stdout.readline()
        assert line, "the worker process printed nothing (its stderr is in the captured output)"
        held = json.loads(line)
        assert held["matched"] == 8 and held["lease"] and held["alloc"] and len(held["blocks"]) == 5
        s = stats(r)
        assert (s["leases"], s["pinned_pages"], s["blocks_leased"]) == (2, 2, 5)
        assert s["blocks_free"] == base["blocks_free"] - 5
        # Not ours: we cannot release them.
        assert r.execute_command("PFXRELEASE", held["lease"], held["alloc"]) == 0
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    start = time.monotonic()
    wait_for(lambda: stats(r)["leases"] == 0, 3, "the killed worker's leases to be released")
    s = stats(r)
    assert (s["pinned_pages"], s["blocks_leased"], s["blocks_free"]) == (0, 0, base["blocks_free"])
    assert time.monotonic() - start < 3
    r.close()


# -- 5. eviction, OOM, policies ----------------------------------------------------------------------


def test_eviction_oom_and_pins(fresh_daemon):
    d = fresh_daemon("--maxmemory", "16kb", *SMALL)  # 16 blocks
    r, pins = client(d), client(d, 2)
    ns = "ev"
    p1, p2, p3, p4 = (page_tokens(seed, pages) for seed, pages in ((100, 8), (200, 8), (300, 4), (400, 1)))
    d1, d2, d3 = pattern(8 * BB, 1), pattern(8 * BB, 2), pattern(4 * BB, 3)
    assert put(r, ns, p1, d1)["stored"] == 8
    assert put(r, ns, p2, d2)["stored"] == 8
    assert stats(r)["blocks_free"] == 0
    assert get(r, ns, p2, "NOLEASE")["matched"] == 32  # p2 is now the most recently used

    # Past capacity: the least recently used unpinned pages (p1's tail) make room.
    assert put(r, ns, p3, d3)["stored"] == 4
    s = stats(r)
    assert s["evictions"] == 4 and s["pages"] == 16
    got = get(r, ns, p1, "NOLEASE", "WITHDATA")
    assert got["matched"] == 16 and got["data"] == d1[: 4 * BB]  # no longer fully matched; the rest intact
    assert get(r, ns, p2, "NOLEASE", "WITHDATA")["data"] == d2

    # Everything pinned: OOM, and nothing changes.
    leases = [as_map(pins.execute_command("PFXGET", ns, "PACKED", packed(p)))["lease"] for p in (p1, p2, p3)]
    s = stats(r)
    assert (s["pinned_pages"], s["evictable_pages"], s["leases"]) == (16, 0, 3)
    before = (pfxinfo(r), pfxinfo(r, ns))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        put(r, ns, p4, pattern(BB, 4))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        cmd(r, "PFXALLOC", ns, 1)
    raw = Raw(d.address)
    err = raw.call("PFXALLOC", ns, 1)
    assert isinstance(err, hiredis.ReplyError) and str(err).startswith("OOM cannot allocate 1 blocks")
    err = raw.call("PFXSET", ns, "PACKED", packed(p4), "DATA", pattern(BB, 4))
    assert isinstance(err, hiredis.ReplyError) and str(err).startswith("OOM ")
    raw.close()
    assert (pfxinfo(r), pfxinfo(r, ns)) == before
    assert get(r, ns, p4, "NOLEASE")["matched"] == 0

    # PFXEVICT of pinned pages evicts nothing and counts them; FLUSHALL keeps them.
    assert cmd(r, "PFXEVICT", ns, "PACKED", packed(p2[:4])) == {"evicted": 0, "freed": 0, "pinned": 8}
    assert cmd(r, "PFXEVICT", ns, "PAGES", 3) == {"evicted": 0, "freed": 0, "pinned": 16}
    assert cmd(r, "PFXEVICT", ns, "BYTES", 5000) == {"evicted": 0, "freed": 0, "pinned": 16}
    assert cmd(r, "PFXEVICT", ns, "ALL") == {"evicted": 0, "freed": 0, "pinned": 16}
    assert r.flushall() is True and r.execute_command("FLUSHDB") in (True, b"OK")
    assert stats(r)["pages"] == 16
    for p, data in ((p1, d1[: 4 * BB]), (p2, d2), (p3, d3)):
        assert get(r, ns, p, "NOLEASE", "WITHDATA")["data"] == data
    assert stats(r)["evictions"] == 4

    # Unpinned, the same commands evict.
    assert pins.execute_command("PFXRELEASE", leases[2]) == 1
    assert cmd(r, "PFXEVICT", ns, "TOKENS", *p3[:4]) == {"evicted": 4, "freed": 4 * BB, "pinned": 0}
    assert get(r, ns, p3, "NOLEASE")["matched"] == 0
    assert pins.execute_command("PFXRELEASE", leases[1]) == 1
    assert cmd(r, "PFXEVICT", ns, "PAGES", 3) == {"evicted": 3, "freed": 3 * BB, "pinned": 4}
    assert get(r, ns, p2, "NOLEASE")["matched"] == 5 * PS  # p2's trailing pages went, p1 is pinned
    assert cmd(r, "PFXEVICT", ns, "BYTES", BB + 1) == {"evicted": 2, "freed": 2 * BB, "pinned": 4}
    assert get(r, ns, p2, "NOLEASE")["matched"] == 3 * PS
    assert cmd(r, "PFXEVICT", ns, "ALL") == {"evicted": 3, "freed": 3 * BB, "pinned": 4}
    assert get(r, ns, p2, "NOLEASE")["matched"] == 0
    s = stats(r)
    assert (s["pages"], s["pinned_pages"], s["blocks_free"], s["evictions"]) == (4, 4, 12, 16)
    r.flushall()
    assert get(r, ns, p1, "NOLEASE")["matched"] == 16
    assert pins.execute_command("PFXRELEASE", leases[0]) == 1
    r.flushall()
    s = stats(r)
    assert (s["pages"], s["blocks_free"]) == (0, 16)
    assert get(r, ns, p1, "NOLEASE")["matched"] == 0
    # Evicting what is not there.
    assert cmd(r, "PFXEVICT", ns, "PACKED", packed(p1)) == {"evicted": 0, "freed": 0, "pinned": 0}
    assert cmd(r, "PFXEVICT", "never-seen", "ALL") == {"evicted": 0, "freed": 0, "pinned": 0}
    r.close(), pins.close()


@pytest.mark.parametrize("policy, victim", [("lru", "a"), ("lfu", "b")])
def test_policy_config_set_decides_the_victim(fresh_daemon, policy, victim):
    d = fresh_daemon("--maxmemory", "12kb", *SMALL)  # 12 blocks
    r = client(d)
    assert r.execute_command("CONFIG", "SET", "maxmemory-policy", policy) in (True, b"OK")
    assert _key(pfxinfo(r)["policy"]) == policy
    assert r.info("memory")["maxmemory_policy"] == policy
    assert r.info("pfxcache")["pfxcache_policy"] == policy
    assert r.config_get("maxmemory-policy") == {"maxmemory-policy": policy}
    prompts = {name: page_tokens(seed, 4) for name, seed in (("a", 100), ("b", 200), ("c", 300))}
    for name, p in prompts.items():
        put(r, "pol", p, pattern(4 * BB, seed=ord(name)))
    # a: often, long ago; c: often, more recently; b: once, most recently.
    for name, hits in (("a", 5), ("c", 5), ("b", 1)):
        for _ in range(hits):
            get(r, "pol", prompts[name], "NOLEASE")
    put(r, "pol", page_tokens(400, 4), pattern(4 * BB, 4))
    assert stats(r)["evictions"] == 4
    matched = {name: get(r, "pol", p, "NOLEASE")["matched"] for name, p in prompts.items()}
    assert matched == {name: (0 if name == victim else 16) for name in prompts}


def test_policy_config_set_values_and_errors(small, redis_server):
    r = client(small)
    for policy in ("LRU", "lfu", "lru", "hybrid"):
        assert r.execute_command("CONFIG", "SET", "maxmemory-policy", policy) in (True, b"OK")
        assert _key(pfxinfo(r)["policy"]) == policy.lower()
        assert r.info("everything")["pfxcache_policy"] == policy.lower()
        assert r.info("memory")["maxmemory_policy"] == policy.lower()
    ours, theirs = Raw(small.address), Raw(redis_server.address)
    for bad in ("bogus", "allkeys-bogus", ""):
        mine = ours.call("CONFIG", "SET", "maxmemory-policy", bad)
        ref = theirs.call("CONFIG", "SET", "maxmemory-policy", "bogus")
        assert isinstance(mine, hiredis.ReplyError) and isinstance(ref, hiredis.ReplyError)
        head = "ERR CONFIG SET failed (possibly related to argument 'maxmemory-policy') - " \
               "argument(s) must be one of the following: "
        assert str(ref).startswith(head)
        # The choices are the policy registry's, in the config row's order, and noeviction.
        choices = next(d for d in DIRECTIVES if d.name == "maxmemory-policy").kind.choices
        assert set(choices) == set(SHIPPED) | {"noeviction"}
        assert str(mine) == head + ", ".join(choices)
    assert _key(pfxinfo(r)["policy"]) == "hybrid"
    ours.close(), theirs.close()
    r.close()


def test_info_pfxcache_section(small):
    r = client(small)
    put(r, "inf", page_tokens(1, 3), pattern(3 * BB, 1))
    get(r, "inf", page_tokens(1, 3, tail=1))
    raw = Raw(small.address)
    text = raw.call("INFO", "pfxcache").decode()
    raw.close()
    assert text.startswith("# pfxcache\r\n")
    fields = dict(line.split(":", 1) for line in text.split("\r\n")[1:] if line)
    assert all(name.startswith("pfxcache_") for name in fields)
    assert fields["pfxcache_arena"] == "shm" and fields["pfxcache_page_size"] == "4"
    assert fields["pfxcache_block_bytes"] == str(BB) and fields["pfxcache_blocks_total"] == "64"
    leased = (fields["pfxcache_pages"], fields["pfxcache_pinned_pages"], fields["pfxcache_active_leases"])
    assert leased == ("3", "3", "1")
    assert (fields["pfxcache_hits_tokens"], fields["pfxcache_misses_tokens"]) == ("12", "1")
    assert (fields["pfxcache_blocks_used"], fields["pfxcache_blocks_free"]) == ("3", "61")
    everything = r.info("everything")
    assert everything["pfxcache_pages"] == 3 and everything["pfxcache_namespaces"] == 1
    assert "pfxcache_pages" not in r.info()  # not a default section
    r.close()


def test_pfxinfo_hit_rate_is_the_shortest_double(small):
    """4 of 5 tokens hit: hit_rate is written 0.8 (Redis's d2string), not %.17g's 0.80000000000000004."""
    r = client(small)
    put(r, "rate", page_tokens(1, 1), pattern(BB, 1))
    get(r, "rate", page_tokens(1, 1, tail=1), "NOLEASE")
    r.close()
    with RawClient(small.address) as conn:
        for command in (("PFXINFO",), ("PFXINFO", "rate")):
            assert b"$8\r\nhit_rate\r\n$3\r\n0.8\r\n" in conn.call_raw(*command), command
        assert conn.call_raw("HELLO", "3").startswith(b"%")
        for command in (("PFXINFO",), ("PFXINFO", "rate")):
            assert b"$8\r\nhit_rate\r\n,0.8\r\n" in conn.call_raw(*command), command


# -- 6. namespaces ---------------------------------------------------------------------------------------


def test_namespaces_are_separate_and_counted(small):
    r = client(small)
    assert r.dbsize() == 0 and "db0" not in r.info("keyspace")
    prompt = page_tokens(1, 2)
    a = put(r, "tenant-a", prompt, pattern(2 * BB, 1))
    assert get(r, "tenant-b", prompt, "NOLEASE") == {"matched": 0, "lease": 0, "blocks": []}
    b = put(r, "tenant-b", prompt, pattern(2 * BB, 2))
    assert b["stored"] == 2 and b["existing"] == 0 and not set(a["blocks"]) & set(b["blocks"])
    assert get(r, "tenant-a", prompt, "NOLEASE", "WITHDATA")["data"] == pattern(2 * BB, 1)
    assert get(r, "tenant-b", prompt, "NOLEASE", "WITHDATA")["data"] == pattern(2 * BB, 2)
    put(r, "tenant-c", page_tokens(50, 1), pattern(BB, 3))
    assert r.dbsize() == 3
    assert r.info("keyspace")["db0"]["keys"] == 3
    assert stats(r)["namespaces"] == 3
    assert (stats(r, "tenant-a")["pages"], stats(r, "tenant-c")["pages"]) == (2, 1)
    # Evicting one namespace leaves the others alone.
    assert cmd(r, "PFXEVICT", "tenant-a", "ALL")["evicted"] == 2
    assert get(r, "tenant-b", prompt, "NOLEASE")["matched"] == 8
    assert get(r, "tenant-a", prompt, "NOLEASE")["matched"] == 0
    assert stats(r, "tenant-b")["evictions"] == 0
    # ALL deletes the key, as DEL would: it no longer counts, and its stats start afresh.
    assert r.dbsize() == 2 and stats(r, "tenant-a")["pages"] == 0 and stats(r, "tenant-a")["evictions"] == 0
    assert stats(r)["evictions"] == 2  # ... while the global counters keep its history
    r.close()


def test_pfxget_of_a_missing_key_creates_no_key(small):
    """A lookup must not create a key (nor cost memory per unknown key)."""
    r = client(small)
    assert get(r, "ghost", page_tokens(1, 2))["matched"] == 0
    assert r.dbsize() == 0 and "db0" not in r.info("keyspace")


def test_flushall_empties_the_keyspace(small):
    r = client(small)
    put(r, "real", page_tokens(1, 2), pattern(2 * BB, 1))
    assert r.dbsize() == 1
    r.flushall()  # nothing was pinned: everything goes
    assert stats(r)["pages"] == 0
    assert r.dbsize() == 0 and "db0" not in r.info("keyspace")


# -- 7. bad input -----------------------------------------------------------------------------------------

OWN = object()  # placeholder: a block id of this connection's allocation lease
FOREIGN = object()  # placeholder: a block id of another connection's allocation lease
CACHED = object()  # placeholder: a block id holding a cached page

T4 = ["TOKENS", "1", "2", "3", "4"]
T8 = ["TOKENS", *map(str, range(1, 9))]  # cached in the fixture
ARITY = "wrong number of arguments for '{}' command"

BAD_INPUT = [
    # name, argv, code, fragment of the reason
    ("token-not-integer", ["PFXGET", "bad", "TOKENS", "1", "2", "abc"], "ERR", "'abc'"),
    # A TOKENS list runs to the command's next option: words in it are bad token ids, not unknown options.
    ("tokens-all-words", ["PFXGET", "bad", "TOKENS", "a", "b", "c"], "ERR",
     "token id 'a' is not an unsigned 32-bit integer"),
    ("tokens-word-before-option", ["PFXGET", "bad", "TOKENS", "1", "two", "NOLEASE"], "ERR", "token id 'two'"),
    ("set-tokens-word", ["PFXSET", "bad", "TOKENS", "1", "2", "x", "4", "DATA", b"x" * BB], "ERR", "token id 'x'"),
    ("evict-tokens-word", ["PFXEVICT", "bad", "TOKENS", "a"], "ERR", "token id 'a'"),
    ("blocks-word", ["PFXSET", "bad", "TOKENS", "70", "71", "72", "73", "BLOCKS", "abc"], "ERR",
     "block id must be an integer, got 'abc'"),
    ("token-float", ["PFXGET", "bad", "TOKENS", "1.5"], "ERR", "'1.5'"),
    ("token-2**32", ["PFXGET", "bad", "TOKENS", "1", "4294967296"], "ERR", "'4294967296' is not an unsigned 32-bit"),
    ("token-negative", ["PFXGET", "bad", "TOKENS", "-1"], "ERR", "'-1' is not an unsigned 32-bit"),
    ("set-token-2**32", ["PFXSET", "bad", "TOKENS", "1", "2", "3", "4294967296", "DATA", b"x" * BB], "ERR",
     "4294967296"),
    ("packed-5-bytes", ["PFXGET", "bad", "PACKED", b"\x01\x02\x03\x04\x05"], "ERR", "5 bytes"),
    ("set-packed-6-bytes", ["PFXSET", "bad", "PACKED", b"\x01" * 6, "DATA", b""], "ERR", "6 bytes"),
    ("evict-packed-7-bytes", ["PFXEVICT", "bad", "PACKED", b"\x01" * 7], "ERR", "7 bytes"),
    ("packed-missing-blob", ["PFXEVICT", "bad", "PACKED"], "ERR", "PACKED needs a blob"),
    ("not-tokens-or-packed", ["PFXGET", "bad", "WORDS", "1"], "ERR", "TOKENS or PACKED"),
    ("empty-namespace", ["PFXGET", "", *T4], "ERR", "namespace"),
    ("get-unknown-option", ["PFXGET", "bad", *T4, "FROB"], "ERR", "'FROB'"),
    ("set-unknown-option", ["PFXSET", "bad", *T4, "FROB", "1", "DATA", b"x" * BB], "ERR", "'FROB'"),
    ("set-no-payload", ["PFXSET", "bad", *T4, "OFFSET", "0"], "ERR", "DATA"),
    ("set-data-without-blob", ["PFXSET", "bad", *T4, "DATA"], "ERR", "DATA"),
    ("set-data-too-short", ["PFXSET", "bad", *T8, "DATA", b"x" * (2 * BB - 1)], "ERR", f"expected {2 * BB}"),
    ("set-data-too-long", ["PFXSET", "bad", *T8, "DATA", b"x" * (2 * BB + 1)], "ERR", f"expected {2 * BB}"),
    ("set-data-for-the-tail", ["PFXSET", "bad", "TOKENS", *map(str, range(20, 26)), "DATA", b"x" * 2 * BB], "ERR",
     f"expected {BB}"),
    ("set-data-and-blocks", ["PFXSET", "bad", *T4, "DATA", b"x" * BB, "BLOCKS", OWN], "ERR", "BLOCKS"),
    ("set-data-twice", ["PFXSET", "bad", *T4, "DATA", b"x" * BB, "DATA", b"x" * BB], "ERR", "DATA"),
    ("offset-not-page-multiple", ["PFXSET", "bad", *T8, "OFFSET", "2", "DATA", b"x" * BB], "ERR", "multiple"),
    ("offset-beyond-tokens", ["PFXSET", "bad", *T8, "OFFSET", "12", "DATA", b""], "ERR", "12"),
    ("offset-beyond-whole-pages", ["PFXSET", "bad", "TOKENS", *map(str, range(1, 11)), "OFFSET", "10", "DATA", b""],
     "ERR", "10"),
    ("offset-negative", ["PFXSET", "bad", *T8, "OFFSET", "-4", "DATA", b"x" * BB], "ERR", "-4"),
    ("offset-not-integer", ["PFXSET", "bad", *T8, "OFFSET", "four", "DATA", b"x" * BB], "ERR", "'four'"),
    ("noprefix-nothing-cached", ["PFXSET", "bad", "TOKENS", *map(str, range(100, 112)), "OFFSET", "4",
                                 "DATA", b"x" * 2 * BB], "NOPREFIX", "not cached"),
    ("noprefix-partly-cached", ["PFXSET", "bad", "TOKENS", *map(str, [1, 2, 3, 4, 50, 51, 52, 53, 60, 61, 62, 63]),
                                "OFFSET", "8", "DATA", b"x" * BB], "NOPREFIX", "only 4"),
    ("blocks-of-another-connection", ["PFXSET", "bad", "TOKENS", "70", "71", "72", "73", "BLOCKS", FOREIGN], "ERR",
     "not held"),
    ("blocks-cached", ["PFXSET", "bad", "TOKENS", "70", "71", "72", "73", "BLOCKS", CACHED], "ERR", "not held"),
    ("blocks-random", ["PFXSET", "bad", "TOKENS", "70", "71", "72", "73", "BLOCKS", "9999"], "ERR", "9999"),
    ("blocks-too-few", ["PFXSET", "bad", "TOKENS", *map(str, range(70, 78)), "BLOCKS", OWN], "ERR", "block"),
    ("blocks-none", ["PFXSET", "bad", "TOKENS", "70", "71", "72", "73", "BLOCKS"], "ERR", "block"),
    ("blocks-twice", ["PFXSET", "bad", "TOKENS", *map(str, range(70, 78)), "BLOCKS", OWN, OWN], "ERR", "twice"),
    ("blocks-negative", ["PFXSET", "bad", "TOKENS", "70", "71", "72", "73", "BLOCKS", "-1"], "ERR", "-1"),
    ("alloc-zero", ["PFXALLOC", "bad", "0"], "ERR", "got 0"),
    ("alloc-negative", ["PFXALLOC", "bad", "-3"], "ERR", "-3"),
    ("alloc-huge", ["PFXALLOC", "bad", str(2**40)], "ERR", str(2**40)),
    ("alloc-not-integer", ["PFXALLOC", "bad", "many"], "ERR", "'many'"),
    ("alloc-junk-after", ["PFXALLOC", "bad", "1", "FROB"], "ERR", "syntax"),
    ("alloc-ttl-zero", ["PFXALLOC", "bad", "1", "TTL", "0"], "ERR", "TTL"),
    ("alloc-ttl-negative", ["PFXALLOC", "bad", "1", "TTL", "-100"], "ERR", "TTL"),
    ("alloc-ttl-not-integer", ["PFXALLOC", "bad", "1", "TTL", "soon"], "ERR", "TTL"),
    ("get-ttl-zero", ["PFXGET", "bad", *T8, "TTL", "0"], "ERR", "TTL"),
    ("get-ttl-negative", ["PFXGET", "bad", *T8, "TTL", "-1"], "ERR", "TTL"),
    ("get-ttl-not-integer", ["PFXGET", "bad", *T8, "TTL", "1.5"], "ERR", "TTL"),
    ("get-ttl-missing", ["PFXGET", "bad", *T8, "TTL"], "ERR", "TTL"),
    ("get-ttl-too-long", ["PFXGET", "bad", *T8, "TTL", str(7 * 24 * 3600 * 1000 + 1)], "ERR", "TTL"),
    ("release-not-integer", ["PFXRELEASE", "lease-1"], "ERR", "'lease-1'"),
    ("release-zero", ["PFXRELEASE", "0"], "ERR", "lease"),
    ("release-negative", ["PFXRELEASE", "-5"], "ERR", "lease"),
    ("evict-junk", ["PFXEVICT", "bad", "EVERYTHING"], "ERR", "syntax"),
    ("evict-pages-junk", ["PFXEVICT", "bad", "PAGES", "lots"], "ERR", "'lots'"),
    ("evict-pages-negative", ["PFXEVICT", "bad", "PAGES", "-1"], "ERR", "-1"),
    ("evict-bytes-missing", ["PFXEVICT", "bad", "BYTES"], "ERR", "syntax"),
    ("evict-all-extra", ["PFXEVICT", "bad", "ALL", "NOW"], "ERR", "syntax"),
    ("evict-tokens-extra", ["PFXEVICT", "bad", *T8, "NOW"], "ERR", "'NOW'"),
    ("evict-partial-page", ["PFXEVICT", "bad", "TOKENS", "1", "2"], "ERR", "whole page"),
    ("arity-pfxget", ["PFXGET", "bad"], "ERR", ARITY.format("pfxget")),
    ("arity-pfxget-bare", ["PFXGET"], "ERR", ARITY.format("pfxget")),
    ("arity-pfxset", ["PFXSET", "bad", "TOKENS", "1"], "ERR", ARITY.format("pfxset")),
    ("arity-pfxalloc", ["PFXALLOC", "bad"], "ERR", ARITY.format("pfxalloc")),
    ("arity-pfxrelease", ["PFXRELEASE"], "ERR", ARITY.format("pfxrelease")),
    ("arity-pfxevict", ["PFXEVICT", "bad"], "ERR", ARITY.format("pfxevict")),
    ("arity-pfxinfo", ["PFXINFO", "bad", "extra"], "ERR", ARITY.format("pfxinfo")),
]


@pytest.fixture(scope="module")
def bad_setup():
    """A daemon with 8 tokens (2 pages) cached in 'bad', an allocation lease held by another
    connection, one held by the clients under test; and those clients (RESP3, RESP2, raw)."""
    d = start_daemon("--maxmemory", "64kb", *SMALL)
    r3, r2, foreign = client(d, 3), client(d, 2), client(d, 3)
    raw = Raw(d.address)
    cached = put(r3, "bad", range(1, 9), pattern(2 * BB, 1))["blocks"]
    # Each client of the test gets its own allocation lease of one block: OWN stands for it.
    own = {id(c): cmd(c, "PFXALLOC", "bad", 1)["blocks"][0] for c in (r3, r2)}
    reply = raw.call("PFXALLOC", "bad", 1)
    own[id(raw)] = reply[reply.index(b"blocks") + 1][0]
    foreign_block = cmd(foreign, "PFXALLOC", "bad", 1)["blocks"][0]
    yield d, (r3, r2, raw), own, cached[0], foreign_block
    for c in (r3, r2, foreign):
        c.close()
    raw.close()
    d.stop()


def _state(r) -> tuple:
    return pfxinfo(r), pfxinfo(r, "bad"), pfxinfo(r, "never")


@pytest.mark.parametrize("name, argv, code, fragment", BAD_INPUT, ids=[case[0] for case in BAD_INPUT])
def test_bad_input_is_an_error_and_changes_nothing(bad_setup, name, argv, code, fragment):
    _, clients, own, cached, foreign = bad_setup
    r3 = clients[0]
    before = _state(r3)
    for c in clients:
        args = [own[id(c)] if a is OWN else foreign if a is FOREIGN else cached if a is CACHED else a for a in argv]
        if isinstance(c, Raw):
            err = c.call(*args)
            assert isinstance(err, hiredis.ReplyError), (name, err)
            line = str(err)
            assert line.startswith(code + " "), line
            reason = line[len(code) + 1 :]
        else:
            with pytest.raises(redis.ResponseError) as exc:
                c.execute_command(*args)
            # redis-py strips the "ERR " code, keeps the others.
            reason = str(exc.value)
            if code != "ERR":
                assert reason.startswith(code + " "), reason
                reason = reason[len(code) + 1 :]
        assert fragment in reason, (name, reason)
        assert len(reason) > 12, reason  # a reason, not just a code
        if name.startswith("arity-"):
            assert reason == fragment  # Redis's exact words
        assert (c.call("PING") if isinstance(c, Raw) else c.execute_command("PING")) in (True, b"PONG")
    assert _state(r3) == before
    # The own allocation leases are intact: the block is still usable for an insert by its owner.
    assert stats(r3)["blocks_leased"] == 4


def test_bad_input_fixture_leases_still_work(bad_setup):
    """After the whole table: the clients' own leases and the cached pages are as they were."""
    _, (r3, r2, _), own, _, _ = bad_setup
    assert get(r3, "bad", range(1, 9), "NOLEASE", "WITHDATA")["data"] == pattern(2 * BB, 1)
    s = stats(r3)
    assert (s["pages"], s["blocks_leased"], s["leases"], s["inserts"]) == (2, 4, 4, 1)
    res = put(r2, "bad", range(70, 74), blocks=[own[id(r2)]])
    assert res["stored"] == 1 and res["blocks"] == [own[id(r2)]]


# -- 8. shutdown and kill: the arena file -------------------------------------------------------------


def test_arena_file_lifecycle(fresh_daemon):
    # The arena is a sealed memfd (issue 12): nothing in /dev/shm at any time, so nothing a
    # SIGKILLed daemon could leave behind, and nothing a restart has to clean up.
    name = "pfxt" + uuid.uuid4().hex[:10]
    args = ("--arena-name", name, "--maxmemory", "64kb", "--block-bytes", "1024")

    def ours():
        return sorted(f for f in os.listdir("/dev/shm") if f.startswith(name + "-"))

    d = fresh_daemon(*args)
    path = _key(pfxinfo(client(d))["arena"]["path"])
    assert path.startswith(f"/proc/{d.proc.pid}/fd/") and os.path.exists(path) and ours() == []
    assert d.stop(signal.SIGTERM) == 0
    assert not os.path.exists(path) and ours() == []

    killed = fresh_daemon(*args)
    r = client(killed)
    put(r, "k", range(1, 17), pattern(BB, 1))  # default page-size: 16
    r.close()
    killed.stop(signal.SIGKILL)
    assert ours() == []
    fresh = fresh_daemon(*args)
    assert os.path.exists(_key(pfxinfo(client(fresh))["arena"]["path"])) and ours() == []
    assert fresh.stop(signal.SIGTERM) == 0


# -- 9. a writer on one shard never delays readers of another ------------------------------------------

BIG_PS = 16
BIG_BB = 65536


def _flat(reply) -> dict:
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


def _in_progress(info_reply) -> int:
    return _flat(_flat(info_reply)["stats"])["inserts_in_progress"]


def _race(d, ns: bytes, a: bytes, b: bytes, data: bytes) -> dict:
    """PFXSET ``a`` with ``data`` on one connection while two others loop:

    * O (other shard): pipelines PFXINFO, PFXGET b, PFXINFO. When both PFXINFOs show the insert
      in progress, the PFXGET between them (same connection, run in order) completed while the
      writer held its shard's lock: ``o_inside`` counts those rounds.
    * S (same shard): polls PFXINFO until it shows the insert in progress, then pipelines PFXINFO,
      PFXGET a. When that PFXINFO still shows the insert in progress, the PFXGET must wait for the
      commit: it must see every new page, and its reply must not come before the PFXSET's (checked
      by looking at the writer's socket when it arrives). (S sends no PFXGET before the insert has
      begun: one sent in the instant between the writer taking the lock and creating its plan
      would wait too, but no PFXINFO could show it.)
    """
    a_tokens = len(a) // 4
    b_tokens = len(b) // 4
    w, s, o = (socket.create_connection(d.address, timeout=60) for _ in range(3))
    readers = {w: hiredis.Reader(), s: hiredis.Reader(), o: hiredis.Reader()}
    pending = {w: [], s: [], o: []}
    o_round = b"".join(encode_command(*c) for c in (["PFXINFO"], ["PFXGET", ns, "PACKED", b, "NOLEASE"], ["PFXINFO"]))
    s_probe = encode_command("PFXINFO")
    s_round = encode_command("PFXINFO") + encode_command("PFXGET", ns, "PACKED", a, "NOLEASE")
    payload = memoryview(encode_command("PFXSET", ns, "PACKED", a, "DATA", data))
    w.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(w, selectors.EVENT_READ | selectors.EVENT_WRITE)
    sel.register(s, selectors.EVENT_READ)
    sel.register(o, selectors.EVENT_READ)
    o.sendall(o_round)
    s.sendall(s_probe)
    s_expect = 1  # replies S waits for: 1 while probing, 2 once it sent its PFXGET
    o_busy = s_busy = True
    out = {"o_inside": 0, "o_rounds": 0, "s_waited": False, "w_reply": None}
    sent = 0
    deadline = time.monotonic() + 60
    try:
        while out["w_reply"] is None or o_busy or s_busy:
            assert time.monotonic() < deadline, "the race did not finish"
            for key, events in sel.select(timeout=1):
                sock = key.fileobj
                if sock is w and events & selectors.EVENT_WRITE and sent < len(payload):
                    try:
                        sent += w.send(payload[sent : sent + (1 << 20)])
                    except BlockingIOError:
                        pass
                    if sent == len(payload):
                        sel.modify(w, selectors.EVENT_READ)
                if not events & selectors.EVENT_READ:
                    continue
                try:
                    chunk = sock.recv(1 << 16)
                except BlockingIOError:
                    continue
                assert chunk, "the daemon closed a connection"
                readers[sock].feed(chunk)
                while (reply := readers[sock].gets()) is not False:
                    assert not isinstance(reply, hiredis.ReplyError), reply
                    pending[sock].append(reply)
                if pending[w]:
                    out["w_reply"] = _flat(pending[w].pop())
                if len(pending[o]) == 3:
                    first, got, last = pending[o]
                    pending[o].clear()
                    assert _flat(got)["matched"] == b_tokens  # never blocked, never wrong
                    out["o_rounds"] += 1
                    if _in_progress(first) and _in_progress(last):
                        out["o_inside"] += 1
                    if out["w_reply"] is None:
                        o.sendall(o_round)
                    else:
                        o_busy = False
                if len(pending[s]) == s_expect == 1:
                    probe = pending[s].pop()
                    if out["w_reply"] is not None:
                        s_busy = False
                    elif _in_progress(probe):
                        s.sendall(s_round)
                        s_expect = 2
                    else:
                        s.sendall(s_probe)
                elif len(pending[s]) == s_expect == 2:
                    first, got = pending[s]
                    pending[s].clear()
                    if _in_progress(first):
                        # Queued behind the writer: sees all its pages, and only once it is done.
                        assert _flat(got)["matched"] == a_tokens
                        assert out["w_reply"] is not None or select.select([w], [], [], 0)[0], \
                            "a reader of the writer's shard answered before the writer"
                        out["s_waited"] = True
                    s_busy = False
    finally:
        sel.close()
        for sock in (w, s, o):
            sock.close()
    return out


def test_writer_on_one_shard_never_delays_readers_of_another(fresh_daemon):
    d = fresh_daemon("--maxmemory", "256mb", "--block-bytes", str(BIG_BB), "--page-size", str(BIG_PS),
                     "--shards", "16", "--evict-low-watermark", "0")
    r = client(d)
    nblocks = pfxinfo(r)["arena"]["blocks-total"]
    # The daemon's own shard function (same store code, a throwaway arena).
    shards = PrefixStore(MemoryArena(1, 1), page_size=BIG_PS, shards=16)
    ns = b"race"

    def prompt(seed: int, pages: int) -> bytes:
        return np.arange(seed, seed + pages * BIG_PS, dtype="<u4").tobytes()

    o_inside = 0
    s_waited = False
    for attempt, pages in enumerate((1024, 2048, 3072, 4000)):
        a = prompt(10_000_000 * (attempt + 1), pages)
        seed = 1
        while shards.shard_of(ns, prompt(seed, 1)) == shards.shard_of(ns, a):
            seed += BIG_PS
        b = prompt(seed, 4)
        cmd(r, "PFXEVICT", ns, "ALL")
        assert put(r, ns, np.frombuffer(b, "<u4"), bytes(4 * BIG_BB))["stored"] == 4
        data = (np.arange(pages * BIG_BB // 4, dtype="<u4") * 2654435761).view(np.uint8).tobytes()
        out = _race(d, ns, a, b, data)
        assert out["w_reply"]["stored"] == pages and out["w_reply"]["existing"] == 0
        blocks = out["w_reply"]["blocks"]
        assert len(blocks) == pages
        # The insert landed: the arena (mapped here) holds the data in the blocks it names.
        arena = np.memmap(_key(pfxinfo(r)["arena"]["path"]), dtype=np.uint8, mode="r", shape=(nblocks, BIG_BB))
        assert np.array_equal(arena[blocks].reshape(-1), np.frombuffer(data, np.uint8))
        del arena
        o_inside += out["o_inside"]
        s_waited = s_waited or out["s_waited"]
        if o_inside and s_waited:
            break
    assert o_inside > 0, "never saw a reader of another shard complete during the insert"
    assert s_waited, "never saw a reader of the writer's shard queue behind the insert"
    r.close()
