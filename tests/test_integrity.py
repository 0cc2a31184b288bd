"""Integrity: no worker ever gets bytes it should not (stale, foreign, recycled), and small
correctness rules a Redis user relies on (hz, integer syntax, lease-ttl 0). Issue 12.

Everything runs against a real pfxcached over real sockets; where Redis defines the behaviour
(integer syntax) a real redis-server answers the same requests side by side.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import redis

from support import wait_for


def ticks(client: redis.Redis) -> int:
    return int(client.info("pfxcache")["pfxcache_ticks"])


# -- item 8: hz, integer syntax, lease-ttl 0 --------------------------------------------------------


def test_config_set_hz_changes_how_often_background_work_runs(fresh_daemon):
    daemon = fresh_daemon()
    client = redis.Redis(host=daemon.host, port=daemon.port)
    assert client.config_set("hz", 1)
    time.sleep(1.1)  # the tick sleeping at the old hz ends
    start = ticks(client)
    time.sleep(2.5)
    # An upper bound: a loaded machine only makes ticks later, never more frequent.
    assert ticks(client) - start <= 4, "hz 1 must mean about one background run a second"
    assert client.config_set("hz", 500)
    start = ticks(client)
    # 100 runs take 0.2 s at 500 Hz and 10 s at the default 10 Hz.
    wait_for(lambda: ticks(client) - start >= 100, 5, "100 background runs at hz 500")
    client.close()


# Redis's string2ll decides what is an integer; a TOKENS list holds integers up to the command's next option.
INTEGER_SPELLINGS = [b"0", b"7", b"007", b"00", b"-0", b"+1", b" 1", b"1 ", b"-1", b"4294967295",
                     b"4294967296", b"1e3", b"0x10", b"\xd9\xa3"]


@pytest.mark.parametrize("raw", INTEGER_SPELLINGS, ids=repr)
def test_token_ids_are_integers_exactly_when_redis_says_so(daemon, redis_server, raw):
    reference = redis.Redis(host=redis_server.host, port=redis_server.port)
    ours = redis.Redis(host=daemon.host, port=daemon.port)
    try:
        reference.execute_command("INCRBY", "integrity:n", raw)
        redis_integer = True
    except redis.ResponseError as exc:
        assert "not an integer" in str(exc)
        redis_integer = False
    finally:
        reference.delete("integrity:n")
    try:
        ours.execute_command("PFXGET", "integrity", "TOKENS", raw, "NOLEASE")
        error = None
    except redis.ResponseError as exc:
        error = str(exc)
    if not redis_integer:
        # Not an integer, and no option: a bad token id.
        assert error is not None and "is not an unsigned 32-bit integer" in error, (raw, error)
    elif 0 <= int(raw) <= 2**32 - 1:
        assert error is None, (raw, error)
    else:
        assert error is not None and "unsigned 32-bit" in error, (raw, error)
    reference.close()
    ours.close()


def test_lease_ttl_zero_means_leases_without_deadline(fresh_daemon):
    daemon = fresh_daemon("--lease-ttl", "0", "--page-size", "2", "--block-bytes", "8")
    client = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    assert client.config_get("lease-ttl") == {"lease-ttl": "0"}
    client.execute_command("PFXSET", "t", "TOKENS", 1, 2, "DATA", b"x" * 8)
    lease = client.execute_command("PFXGET", "t", "TOKENS", 1, 2)[b"lease"]
    assert client.config_set("lease-ttl", 1)  # later leases get 1 ms; the one taken keeps no deadline
    start = ticks(client)
    wait_for(lambda: ticks(client) - start >= 3, 10, "three expiry passes")
    assert client.execute_command("PFXINFO")[b"stats"][b"leases"] == 1
    assert client.config_set("lease-ttl", 0)
    assert client.execute_command("PFXRELEASE", lease) == 1
    client.close()


# -- item 2: fresh blocks never show what another tenant wrote --------------------------------------

TENANTS_ACL = ("user tenant-a on >pa ~a:* +@pfx -@admin\n"
               "user tenant-b on >pb ~b:* +@pfx -@admin\n")


@pytest.fixture
def tenants(fresh_daemon, tmp_path):
    aclfile = tmp_path / "users.acl"
    aclfile.write_text(TENANTS_ACL)
    daemon = fresh_daemon("--page-size", "4", "--block-bytes", "128", "--maxmemory", "1024",
                          "--evict-low-watermark", "0", "--aclfile", str(aclfile))
    opened = []

    def connect(user: str, password: str) -> redis.Redis:
        client = redis.Redis(host=daemon.host, port=daemon.port, protocol=3, username=user, password=password or None)
        opened.append(client)
        return client

    yield daemon, connect
    for client in opened:
        client.close()


def test_allocated_blocks_never_hold_another_tenants_evicted_bytes(tenants):
    daemon, connect = tenants
    a, b = connect("tenant-a", "pa"), connect("tenant-b", "pb")
    admin = connect("default", "")
    # B fills every block of the arena with its secret, then forgets it.
    for i in range(8):
        b.execute_command("PFXSET", f"b:{i}", "TOKENS", i, 2, 3, 4, "DATA", b"SECRET!!" * 16)
    assert admin.execute_command("PFXINFO")[b"arena"][b"blocks-free"] == 0
    for i in range(8):
        b.execute_command("PFXEVICT", f"b:{i}", "ALL")
    # A allocates every block, commits them unwritten, and reads them back over RESP.
    for i in range(8):
        (block,) = a.execute_command("PFXALLOC", f"a:{i}", 1)[b"blocks"]
        a.execute_command("PFXSET", f"a:{i}", "TOKENS", 9, 9, 9, i, "BLOCKS", block)
        data = a.execute_command("PFXGET", f"a:{i}", "TOKENS", 9, 9, 9, i, "WITHDATA", "NOLEASE")[b"data"]
        assert data == b"\0" * 128, data


def test_blocks_written_through_the_arena_never_reach_another_namespaces_writer(fresh_daemon):
    """B's writer fills allocated blocks through the mapped arena and commits them; once they are evicted,
    A's writer gets the same blocks zeroed, and so it does after B's bytes were copied into blocks A had
    before. (A namespace's own next allocation may skip the memset: the blocks hold its own bytes.)"""
    from pfxcache.client import PrefixCache

    daemon = fresh_daemon("--page-size", "4", "--block-bytes", "128", "--maxmemory", str(128 * 8),
                          "--evict-low-watermark", "0")
    cache = PrefixCache(f"redis://{daemon.host}:{daemon.port}/0")
    try:
        cache.attach()
        with cache.alloc("b", 8) as allocation:
            cache.arena.write_from(allocation.blocks, np.frombuffer(b"SECRET!!" * 128, np.uint8))
            cache.commit("b", list(range(32)), allocation.blocks)
        written = sorted(allocation.blocks)
        cache.evict("b", all=True)
        with cache.alloc("a", 8) as allocation:
            assert sorted(allocation.blocks) == written  # the very blocks B wrote
            cache.commit("a", list(range(100, 132)), allocation.blocks)
        assert cache.lookup("a", list(range(100, 132)), lease=False, with_data=True).data == bytes(128 * 8)
        view = np.empty(128 * 8, np.uint8)
        cache.arena.read_into(written, view)
        assert not view.any()
        cache.evict("a", all=True)
        # B's bytes copied in by PFXSET DATA land in blocks last handed to A: A's next allocation zeroes them.
        cache.store("b", list(range(200, 232)), b"SECRET!!" * 128)
        cache.evict("b", all=True)
        with cache.alloc("a", 8) as allocation:
            assert sorted(allocation.blocks) == written
            cache.arena.read_into(written, view)
            assert not view.any()
    finally:
        cache.close()


def test_block_owners_zero_unless_the_block_holds_the_same_namespaces_bytes():
    from array import array

    from pfxcache.daemon.store.block_owners import BlockOwners

    owners = BlockOwners(16)
    owners.forget(array("q", [1, 2]))  # before any allocation: nothing to do, no label array
    assert owners.metadata_bytes == 0
    assert owners.hand_to([0, 1, 2, 3], b"a").tolist() == [0, 1, 2, 3]  # unknown contents
    assert owners.hand_to([0, 1, 4], b"a").tolist() == [4]  # 0 and 1 hold a's own bytes
    assert owners.hand_to(array("q", [1, 4, 5]), b"b").tolist() == [1, 4, 5]
    owners.forget(array("q", [4]))  # taken for a copy that may stop part way
    assert owners.hand_to([0, 4, 5], b"b").tolist() == [0, 4]
    assert owners.metadata_bytes == 32


def test_block_owners_past_the_last_label_always_zero(monkeypatch):
    from pfxcache.daemon.store import block_owners

    monkeypatch.setattr(block_owners, "MAX_LABELS", 2)
    owners = block_owners.BlockOwners(4)
    for name in (b"a", b"b"):
        owners.hand_to([0], name)
    assert owners.hand_to([1], b"c").tolist() == [1]
    assert owners.hand_to([1], b"c").tolist() == [1]  # no label of its own: zeroed every time
    assert owners.hand_to([0], b"b").tolist() == []


def test_arena_zero_clears_exactly_the_given_blocks_in_runs_or_scattered():
    from pfxcache.daemon.store import MemoryArena

    arena = MemoryArena(8, 200)
    arena.write(range(200), bytes(range(200)) * 8)
    scattered = list(range(199, 50, -3))  # more runs than one memset each
    for ids in ([0, 1, 2, 7], scattered, []):
        arena.zero(ids)
    zeroed = {0, 1, 2, 7, *scattered}
    for block in range(200):
        expected = bytes(8) if block in zeroed else (bytes(range(200)) * 8)[block * 8 : block * 8 + 8]
        assert arena.read([block]) == expected, block


# -- item 3: a worker that stalls past its lease's TTL never touches blocks someone else holds ------

PS3, BB3, NBLOCKS3 = 4, 64, 16
STALL = ("--page-size", str(PS3), "--block-bytes", str(BB3), "--maxmemory", str(BB3 * NBLOCKS3),
         "--evict-low-watermark", "0", "--hz", "100")


def drive(cache, steps, until: str):
    """Run an operation's steps (the client's own logic, see client/core.py) up to the reply of the
    first ``until`` command; return (steps, that reply) so the caller can stall before resuming."""
    request = next(steps)
    while True:
        reply = request.decode(cache._execute(*request.args))
        if request.args[0] == until:
            return steps, reply
        request = steps.send(reply)


def finish(cache, steps, reply):
    """Resume stalled steps with the reply they waited for and run them to the end."""
    try:
        request = steps.send(reply)
        while True:
            try:
                result = request.decode(cache._execute(*request.args))
            except Exception as exc:
                request = steps.throw(exc)
            else:
                request = steps.send(result)
    except StopIteration as done:
        return done.value


def fill_arena(client: redis.Redis, namespace: str, byte: bytes) -> list[list[int]]:
    """Store one-page sequences into every free block (no eviction); returns their token lists."""
    free = client.execute_command("PFXINFO")[b"arena"][b"blocks-free"]
    stored = []
    for i in range(free):
        tokens = [1000 + i, 1, 2, 3]
        client.execute_command("PFXSET", namespace, "TOKENS", *tokens, "DATA", byte * BB3)
        stored.append(tokens)
    return stored


def assert_pages_hold(client: redis.Redis, namespace: str, stored, byte: bytes) -> None:
    for tokens in stored:
        reply = client.execute_command("PFXGET", namespace, "TOKENS", *tokens, "WITHDATA", "NOLEASE")
        assert reply[b"data"] == byte * BB3, (tokens, reply[b"data"][:16])


def wait_expired(admin: redis.Redis) -> None:
    wait_for(lambda: admin.execute_command("PFXINFO")[b"stats"][b"leases"] == 0, 10, "the lease to expire")


def test_a_writer_stalled_past_its_ttl_never_corrupts_pages_handed_to_others(fresh_daemon):
    import numpy as np

    from pfxcache.client import PrefixCache, PrefixCacheError

    daemon = fresh_daemon(*STALL)
    url = f"redis://{daemon.host}:{daemon.port}/0"
    writer = PrefixCache.from_url(url, attach=True)
    admin = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    src = np.full(4 * BB3, ord("W"), dtype=np.uint8)
    steps, allocation = drive(writer, writer._save_steps("w", list(range(16)), src, 0, 50), until="PFXALLOC")
    wait_expired(admin)  # the writer stalls (GC pause, slow prefill, SIGSTOP) past its 50 ms
    stored = fill_arena(admin, "other", b"o")  # someone else takes every block it can get
    with pytest.raises(PrefixCacheError) as refused:
        finish(writer, steps, allocation)  # it writes through its mapping, then commits: refused
    assert_pages_hold(admin, "other", stored, b"o")
    assert "expired" in str(refused.value)
    assert len(stored) == NBLOCKS3 - 4  # the fenced blocks went to nobody...
    assert admin.execute_command("PFXINFO")[b"arena"][b"blocks-free"] == 4  # ...until released
    assert admin.execute_command("PFXCHECK") == b"OK"
    writer.close()
    admin.close()


def test_a_reader_stalled_past_its_ttl_reads_its_own_pages_and_is_told_the_lease_was_gone(fresh_daemon):
    import numpy as np

    from pfxcache.client import LeaseLostError, PrefixCache

    daemon = fresh_daemon(*STALL)
    url = f"redis://{daemon.host}:{daemon.port}/0"
    reader = PrefixCache.from_url(url, attach=True)
    admin = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    prompt = list(range(8))
    admin.execute_command("PFXSET", "r", "TOKENS", *prompt, "DATA", b"R" * (2 * BB3))
    out = np.zeros(2 * BB3, dtype=np.uint8)
    steps, match = drive(reader, reader._load_steps("r", prompt, out, 50), until="PFXGET")
    wait_expired(admin)
    admin.execute_command("PFXEVICT", "r", "ALL")  # the pinned pages stay...
    stored = fill_arena(admin, "other", b"o")  # ...and their blocks go to nobody else
    with pytest.raises(LeaseLostError):
        finish(reader, steps, match)
    assert bytes(out) == b"R" * (2 * BB3)
    assert_pages_hold(admin, "other", stored, b"o")
    assert admin.execute_command("PFXCHECK") == b"OK"
    reader.close()
    admin.close()


def test_timeout_spares_connections_holding_leases_and_closes_them_once_released(fresh_daemon):
    daemon = fresh_daemon(*STALL, "--timeout", "1")
    worker = redis.Redis(host=daemon.host, port=daemon.port, protocol=3, single_connection_client=True)
    admin = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    worker_id = worker.client_id()
    lease = worker.execute_command("PFXALLOC", "t", 2, "TTL", 50)[b"lease"]
    wait_expired(admin)
    time.sleep(2.5)  # two idle checks past the timeout: a worker still computing with its blocks

    def connected() -> bool:
        return worker_id in {int(c["id"]) for c in admin.client_list()}

    assert connected()
    assert worker.execute_command("PFXRELEASE", lease) == 0  # the lease had expired
    assert worker.client_id() == worker_id  # the same connection: no silent reconnect
    assert admin.execute_command("PFXINFO")[b"arena"][b"blocks-free"] == NBLOCKS3
    wait_for(lambda: not connected(), 10, "the idle connection without leases to be closed")
    worker.close()
    admin.close()


# -- item 6: what a tenant sees of the others ---------------------------------------------------------


def test_a_tenants_keyless_pfxinfo_shows_only_its_own_namespaces(tenants):
    daemon, connect = tenants
    a, b = connect("tenant-a", "pa"), connect("tenant-b", "pb")
    admin = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    b.execute_command("PFXSET", "b:x", "TOKENS", 1, 2, 3, 4, 5, 6, 7, 8, "DATA", b"b" * 256)
    for _ in range(3):
        b.execute_command("PFXGET", "b:x", "TOKENS", 1, 2, 3, 4, 5, 6, 7, 8)
    a.execute_command("PFXSET", "a:y", "TOKENS", 1, 2, 3, 4, "DATA", b"a" * 128)
    a.execute_command("PFXGET", "a:y", "TOKENS", 1, 2, 3, 4, "NOLEASE")
    seen = a.execute_command("PFXINFO")
    stats = seen[b"stats"]
    assert (stats[b"namespaces"], stats[b"pages"], stats[b"inserts"], stats[b"leases"]) == (1, 1, 1, 0)
    assert stats[b"hits_tokens"] == 4
    assert b"path" not in seen[b"arena"] and b"name" not in seen[b"arena"]
    assert b"blocks-free" not in seen[b"arena"] and b"policy-state" not in seen
    # The operator (all keys) still sees everything.
    everything = admin.execute_command("PFXINFO")
    assert everything[b"stats"][b"namespaces"] == 2 and everything[b"stats"][b"leases"] == 3
    assert b"path" in everything[b"arena"]
    admin.close()


def test_lease_ids_say_nothing_about_other_tenants_leases(tenants):
    daemon, connect = tenants
    a, b = connect("tenant-a", "pa"), connect("tenant-b", "pb")
    a.execute_command("PFXSET", "a:l", "TOKENS", 1, 2, 3, 4, "DATA", b"a" * 128)
    b.execute_command("PFXSET", "b:l", "TOKENS", 1, 2, 3, 4, "DATA", b"b" * 128)
    ids = []
    for _ in range(40):
        ids.append(a.execute_command("PFXGET", "a:l", "TOKENS", 1, 2, 3, 4)[b"lease"])
        for _ in range(3):
            b.execute_command("PFXGET", "b:l", "TOKENS", 1, 2, 3, 4)
    assert len(set(ids)) == 40 and all(0 < i < 2**63 for i in ids)
    # Neither ordered nor close together: a counter would give a, a+4, a+8, ...
    assert ids != sorted(ids) and max(ids) - min(ids) > 2**50
    assert a.execute_command("PFXRELEASE", *ids) == 40


def test_a_slow_writer_renews_its_lease_and_commits(fresh_daemon):
    from pfxcache.client import PrefixCache

    daemon = fresh_daemon(*STALL)
    cache = PrefixCache.from_url(f"redis://{daemon.host}:{daemon.port}/0", attach=True)
    admin = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    cache.attach()
    allocation = cache.alloc("slow", 2, ttl_ms=1000)
    for _ in range(3):  # a prefill of ~3 x 500 ms, past the TTL, renewing as it goes
        time.sleep(0.5)
        assert cache.renew(allocation, 1000)
    cache.arena.write_from(allocation.blocks, b"s" * (2 * BB3))
    assert cache.commit("slow", list(range(8)), allocation).stored == 2
    assert cache.release(allocation) == 1
    # Renewing what is gone says so; an expired lease cannot be brought back.
    assert not cache.renew(allocation.lease)
    other = cache.alloc("slow", 1, ttl_ms=1)
    wait_expired(admin)
    assert not cache.renew(other)
    with pytest.raises(redis.ResponseError, match="syntax error"):
        admin.execute_command("PFXRENEW", 5, "TTL")
    with pytest.raises(redis.ResponseError, match="lease id"):
        admin.execute_command("PFXRENEW", "007")
    cache.close()
    admin.close()


def test_fenced_blocks_stay_out_while_their_owner_lives_and_go_back_when_it_lets_go(fresh_daemon):
    # A live connection's expired lease is fenced: other commands from the same connection (another
    # task of an async worker, say) do not free its blocks, since its writer may still be mid-copy.
    # They go back when the owner releases the dead id (counted 0: it learns it was late) or closes.
    daemon = fresh_daemon(*STALL)
    worker = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    admin = redis.Redis(host=daemon.host, port=daemon.port, protocol=3)
    free = admin.execute_command("PFXINFO")[b"arena"][b"blocks-free"]
    lease = worker.execute_command("PFXALLOC", "w", 4, "TTL", 50)[b"lease"]
    wait_expired(admin)
    worker.ping()
    info = admin.execute_command("PFXINFO")
    assert info[b"stats"][b"fenced_leases"] == 1 and info[b"arena"][b"blocks-free"] == free - 4
    assert worker.execute_command("PFXRELEASE", lease) == 0
    info = admin.execute_command("PFXINFO")
    assert info[b"stats"][b"fenced_leases"] == 0 and info[b"arena"][b"blocks-free"] == free
    worker.execute_command("PFXALLOC", "w", 2, "TTL", 50)
    wait_expired(admin)
    worker.close()
    wait_for(lambda: admin.execute_command("PFXINFO")[b"arena"][b"blocks-free"] == free, 10, "the close")
    assert admin.execute_command("PFXCHECK") == b"OK"
    admin.close()
