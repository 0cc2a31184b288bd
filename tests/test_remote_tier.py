"""The shared tier on a real Redis Cluster: pages stored behind one daemon are served, byte for byte,
behind another; values changed behind our back, another tenant's pages, a stopped, killed or hung
node cost misses and counters, never a wrong byte or a client error.

Every page's bytes are a function of its namespace and whole token prefix (``payload``), so any
answer can be checked without keeping a copy. The value format and the URL are checked first,
without a cluster.
"""

from __future__ import annotations

import hashlib
import random
import signal
import struct
import time

import pytest
import redis

from pfxcache.daemon.service.remote_nodes import drop_namespace_keys
from pfxcache.daemon.service.remote_target import RemoteTarget
from pfxcache.daemon.store.idents import chain, namespace_ident
from pfxcache.daemon.tier import remote_format
from pfxcache.testing import start_daemon

from cluster_support import redis_cluster, wait_for
from support import fetch_checked, prefix_pages, store_prefix

PAGE = 4  # tokens a page
BLOCK = 4096  # bytes a page
FP = b"f" * 16


def payload(ns: str, tokens: list[int]) -> bytes:
    return prefix_pages(ns, tokens, PAGE, BLOCK)


def idents(ns: str, tokens: list[int]) -> list[bytes]:
    packed = chain(namespace_ident(ns.encode()), struct.pack(f"<{len(tokens)}I", *tokens), PAGE * 4)
    return [packed[i : i + 16] for i in range(0, len(packed), 16)]


def key(ns: str, tokens: list[int], page: int) -> bytes:
    return remote_format.key_of(ns.encode(), idents(ns, tokens)[page])


def prompts(count: int, pages: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 50000) for _ in range(pages * PAGE)] for _ in range(count)]


def put(r: redis.Redis, ns: str, tokens: list[int]) -> None:
    store_prefix(r, ns, tokens, PAGE, BLOCK)


def get(r: redis.Redis, ns: str, tokens: list[int]) -> int:
    """Tokens matched; asserts the bytes served are the right ones."""
    return fetch_checked(r, ns, tokens, PAGE, BLOCK)


def tiers(r: redis.Redis) -> dict:
    return r.info("tiers")


def written(r: redis.Redis, pages: int) -> dict:
    """Wait until ``pages`` pages were written to the shared tier and the queue is empty."""
    wait_for(lambda: tiers(r)["tier_remote_writes"] >= pages and tiers(r)["tier_remote_queue_pages"] == 0,
             f"{pages} pages written")
    return tiers(r)


# -- without a cluster ----------------------------------------------------------------------------

def test_a_value_verifies_only_as_the_page_asked_for():
    ns, ident, parent, data = b"tenant-a", b"i" * 16, b"p" * 16, bytes(range(256)) * 16
    value = remote_format.encode(ns, ident, parent, FP, data)
    assert bytes(remote_format.verify(value, ns, ident, parent, FP, len(data))) == data
    assert remote_format.verify(None, ns, ident, parent, FP, len(data)) is None
    wrong = [
        value[:-1],  # truncated
        value + b"x",  # longer
        value[: remote_format.HEADER_BYTES + len(ns)] + bytes(len(data)),  # payload replaced
        bytes(len(value)),  # zeros
        b"garbage",
        remote_format.encode(b"tenant-b", ident, parent, FP, data),  # another namespace
        remote_format.encode(ns, b"j" * 16, parent, FP, data),  # another page
        remote_format.encode(ns, ident, b"q" * 16, FP, data),  # another parent
        remote_format.encode(ns, ident, parent, b"g" * 16, data),  # another geometry
    ]
    flipped = bytearray(value)
    flipped[20] ^= 1  # a header byte: the header CRC
    wrong.append(bytes(flipped))
    for bad in wrong:
        assert remote_format.verify(bad, ns, ident, parent, FP, len(data)) is None
    assert remote_format.verify(value, ns, ident, parent, FP, len(data) - 1) is None


def test_keys_carry_no_hash_tag_and_differ_by_namespace():
    ident = b"i" * 16
    a, b = remote_format.key_of(b"a", ident), remote_format.key_of(b"b", ident)
    assert a != b and b"{" not in a and a.startswith(b"pfx:v1:")
    assert a.startswith(remote_format.namespace_pattern(b"a")[:-1])
    assert not b.startswith(remote_format.namespace_pattern(b"a")[:-1])


def test_urls_parse_and_their_password_never_shows():
    target = RemoteTarget("redis-cluster://tier:s%40cret@127.0.0.1:7000,[::1]:7001")
    assert target.cluster and target.nodes == [("127.0.0.1", 7000), ("::1", 7001)]
    assert (target.username, target.password) == ("tier", "s@cret")
    assert "s@cret" not in str(target) and "tier:***@" in str(target)
    assert target.scrub("AUTH tier s@cret failed") == "AUTH tier *** failed"
    one = RemoteTarget("redis://127.0.0.1:6379")
    assert not one.cluster and one.password is None and str(one) == "redis://127.0.0.1:6379"
    for bad in ("http://h:1", "redis://h", "redis://a:1,b:2", "redis-cluster://h:x"):
        with pytest.raises(ValueError):
            RemoteTarget(bad)


# -- on a real cluster ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with redis_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture
def daemons(tmp_path):
    started = []

    def start(url: str, *extra: str, blocks: int = 64):
        d = start_daemon("--dir", str(tmp_path), "--page-size", str(PAGE), "--block-bytes", str(BLOCK),
                         "--maxmemory", str(blocks * BLOCK), "--remote-tier", url, *extra)
        started.append(d)
        r = redis.Redis(host=d.host, port=d.port)
        wait_for(lambda: tiers(r)["tier_remote_state"] in ("ok", "refused"), "the shared tier connected")
        return d, r

    yield start
    for d in started:
        d.stop(signal.SIGKILL)


def test_a_prefix_stored_behind_one_daemon_is_served_behind_another(cluster, daemons):
    _, a = daemons(cluster.url())
    _, b = daemons(cluster.url())
    work = prompts(8, 4, seed=1)
    for tokens in work:
        put(a, "shared", tokens)
    written(a, 32)
    for tokens in work:
        assert get(b, "shared", tokens) == len(tokens)
    info = tiers(b)
    assert info["tier_remote_hits"] == 32 and info["tier_remote_verify_failures"] == 0
    # No hash tag: the pages are spread over every master.
    owners = {cluster.owner_of(key("shared", tokens, p)).port for tokens in work for p in range(4)}
    assert len(owners) == 3
    # A prompt that goes on past what anyone stored: the stored part, then a miss.
    longer = work[0] + [7, 7, 7, 7]
    assert get(b, "shared", longer) == len(work[0])


def test_values_changed_behind_our_back_are_misses_and_counted(cluster, daemons):
    _, a = daemons(cluster.url())
    _, b = daemons(cluster.url())
    work = prompts(4, 3, seed=2)
    for tokens in work:
        put(a, "tamper", tokens)
    written(a, 12)
    direct = cluster.client()
    try:
        good = direct.get(key("tamper", work[0], 0))
        direct.set(key("tamper", work[0], 1), b"garbage")  # garbage at page 1
        direct.set(key("tamper", work[1], 0), good[:-100])  # truncated
        direct.set(key("tamper", work[2], 0), direct.get(key("tamper", work[3], 0)))  # another page's value
        other = direct.get(key("tamper", work[3], 0)).replace(b"tamper", b"tampex")  # same length, bad header
        direct.set(key("tamper", work[3], 0), other)
    finally:
        direct.close()
    assert get(b, "tamper", work[0]) == PAGE  # page 0 good, page 1 garbage: the run ends there
    for tokens in work[1:]:
        assert get(b, "tamper", tokens) == 0
    info = tiers(b)
    assert info["tier_remote_verify_failures"] == 4 and info["tier_remote_hits"] == 1
    assert get(a, "tamper", work[1]) == len(work[1])  # the writer's RAM is untouched


def test_a_tenants_pages_cannot_be_read_through_another_namespace(cluster, daemons):
    _, a = daemons(cluster.url())
    _, b = daemons(cluster.url())
    work = prompts(3, 2, seed=3)
    for tokens in work:
        put(a, "tenant-a", tokens)
    written(a, 6)
    for tokens in work:
        assert get(b, "tenant-b", tokens) == 0
    # Even with tenant-a's values copied under tenant-b's keys.
    direct = cluster.client()
    try:
        for tokens in work:
            for page in range(2):
                direct.set(key("tenant-b", tokens, page), direct.get(key("tenant-a", tokens, page)))
    finally:
        direct.close()
    time.sleep(1.1)  # the daemon remembers an absent page for ABSENT_TTL_S
    for tokens in work:
        assert get(b, "tenant-b", tokens) == 0
    assert tiers(b)["tier_remote_verify_failures"] == 3
    for tokens in work:
        assert get(b, "tenant-a", tokens) == len(tokens)


def test_pfxtier_drop_removes_a_namespace_from_the_shared_tier_and_leaves_the_others(cluster, daemons):
    _, a = daemons(cluster.url())
    work = prompts(4, 2, seed=4)
    for tokens in work:
        put(a, "drop-me", tokens)
        put(a, "keep-me", tokens)
    written(a, 16)
    assert a.execute_command("PFXTIER", "DROP", "drop-me") == 8
    assert a.execute_command("PFXTIER", "DROP", "drop-me") == 0  # nothing left: nothing to do
    direct = cluster.client()
    try:
        assert all(direct.get(key("drop-me", t, p)) is None for t in work for p in range(2))
        assert all(direct.get(key("keep-me", t, p)) is not None for t in work for p in range(2))
        put(a, "keep-me", prompts(1, 1, seed=40)[0])  # the function the command runs, on a client of ours
        written(a, 17)
        assert drop_namespace_keys(direct, b"keep-me") == 9
    finally:
        direct.close()
    assert tiers(a)["tier_remote_dropped_keys"] == 8
    assert get(a, "drop-me", work[0]) == len(work[0])  # the local tiers are not touched
    _, b = daemons(cluster.url())
    assert get(b, "drop-me", work[0]) == 0 and get(b, "keep-me", work[0]) == 0


def test_pfxtier_is_an_admin_command_with_redis_style_errors(cluster, daemons, tmp_path):
    d, a = daemons(cluster.url())
    a.execute_command("ACL", "SETUSER", "tenant", "on", ">pw", "~t:*", "+@all", "-@admin")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'pfxtier|drop' command"):
        a.execute_command("PFXTIER", "DROP")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'pfxtier|drop' command"):
        a.execute_command("PFXTIER", "DROP", "a", "b")
    with pytest.raises(redis.ResponseError, match=r"unknown subcommand 'NOPE'. Try PFXTIER HELP."):
        a.execute_command("PFXTIER", "NOPE")
    with pytest.raises(redis.ResponseError, match="timeout must be an integer"):
        a.execute_command("PFXTIER", "FLUSH", "-1")
    with pytest.raises(redis.ResponseError, match="syntax error"):
        a.execute_command("PFXTIER", "FLUSH", "1", "2")
    assert any(b"DROP <namespace>" in line for line in a.execute_command("PFXTIER", "HELP"))
    tenant = redis.Redis(host=d.host, port=d.port, username="tenant", password="pw")
    try:
        for args in (("DROP", "t:x"), ("FLUSH",), ("INFO",)):
            with pytest.raises(redis.exceptions.NoPermissionError):
                tenant.execute_command("PFXTIER", *args)
    finally:
        tenant.close()
    for category in ("admin", "dangerous"):
        assert {b"pfxtier|drop", b"pfxtier|flush"} <= set(a.execute_command("ACL", "CAT", category))
    # Without a shared tier: an error that says so; nothing else changes.
    alone = start_daemon("--dir", str(tmp_path), "--page-size", str(PAGE), "--block-bytes", str(BLOCK))
    try:
        r = redis.Redis(host=alone.host, port=alone.port)
        with pytest.raises(redis.ResponseError, match="no shared tier is configured"):
            r.execute_command("PFXTIER", "DROP", "x")
        with pytest.raises(redis.ResponseError, match="no tier is configured"):
            r.execute_command("PFXTIER", "FLUSH")
        assert r.execute_command("PFXTIER", "INFO") == {}
        r.close()
    finally:
        alone.stop(signal.SIGKILL)
    # The disk tier alone: FLUSH waits for its queue, INFO shows it; DROP is the shared tier's only.
    disk = start_daemon("--dir", str(tmp_path), "--page-size", str(PAGE), "--block-bytes", str(BLOCK),
                        "--disk-tier-size", str(1 << 20), "--disk-tier-write", "through")
    try:
        r = redis.Redis(host=disk.host, port=disk.port)
        for tokens in prompts(4, 2, seed=15):
            put(r, "d", tokens)
        assert r.execute_command("PFXTIER", "FLUSH", "10000") == {b"disk": {b"queued": 0}}
        assert r.execute_command("PFXTIER", "INFO")[b"disk"][b"pages"] == 8
        with pytest.raises(redis.ResponseError, match="no shared tier is configured"):
            r.execute_command("PFXTIER", "DROP", "d")
        r.close()
    finally:
        disk.stop(signal.SIGKILL)


def pause_writes(cluster, ms: int) -> None:
    """CLIENT PAUSE WRITE on every node: SETs wait (the daemons' queues fill), GETs and PINGs answer."""
    cluster.on_all("CLIENT", "PAUSE", str(ms), "WRITE")


def test_pfxtier_flush_writes_the_queue_out_and_its_wait_is_bounded(cluster, daemons):
    _, a = daemons(cluster.url(), "--remote-tier-timeout", "300")  # writer's socket timeout: 3 s
    work = prompts(6, 2, seed=11)
    pause_writes(cluster, 1500)
    try:
        for tokens in work:
            put(a, "flush", tokens)
        at_once = a.execute_command("PFXTIER", "FLUSH", "0")[b"remote"]
        assert at_once[b"queued"] > 0 and at_once[b"written"] == 0
        assert a.ping() and get(a, "flush", work[0]) == len(work[0])  # others are not held meanwhile
        out = a.execute_command("PFXTIER", "FLUSH", "10000")[b"remote"]
    finally:
        cluster.on_all("CLIENT", "UNPAUSE")
    assert out[b"queued"] == 0 and out[b"dropped"] == 0 and out[b"written"] == 12
    assert tiers(a)["tier_remote_writes"] == 12
    info = a.execute_command("PFXTIER", "INFO")
    assert info[b"remote"][b"writes"] == 12 and info[b"remote"][b"queue-pages"] == 0


def test_shutdown_writes_the_queue_out_within_its_deadline(cluster, daemons):
    d, a = daemons(cluster.url(), "--remote-tier-timeout", "300", "--remote-tier-shutdown-flush", "10000")
    work = prompts(5, 2, seed=12)
    pause_writes(cluster, 1000)
    try:
        for tokens in work:
            put(a, "bye", tokens)
        assert tiers(a)["tier_remote_queue_pages"] == 10  # held by the pause
        assert d.stop() == 0  # SIGTERM: the queue is written once the pause ends
    finally:
        cluster.on_all("CLIENT", "UNPAUSE")
    assert "10 queued pages written at shutdown, 0 dropped" in d.log_text()
    direct = cluster.client()
    try:
        assert all(direct.get(key("bye", t, p)) is not None for t in work for p in range(2))
    finally:
        direct.close()


def test_a_shutdown_flush_past_its_deadline_drops_and_counts(cluster, daemons):
    d, a = daemons(cluster.url(), "--remote-tier-timeout", "300", "--remote-tier-shutdown-flush", "100")
    work = prompts(3, 2, seed=13)
    pause_writes(cluster, 5000)
    try:
        for tokens in work:
            put(a, "late", tokens)
        assert tiers(a)["tier_remote_queue_pages"] == 6
        assert d.stop() == 0
    finally:
        cluster.on_all("CLIENT", "UNPAUSE")
    assert "0 queued pages written at shutdown, 6 dropped" in d.log_text()


def test_key_pages_stored_behind_one_daemon_are_served_behind_another(cluster, daemons):
    """HASHES: each key stands for its prefix, so a run is found from any of its keys, on a daemon
    whose namespace held nothing (it becomes a key namespace, as a HASHES PFXSET makes it)."""
    _, a = daemons(cluster.url())
    keys = [f"chain/{i}".encode() for i in range(6)]

    def data(ks: list[bytes]) -> bytes:
        return b"".join(hashlib.shake_256(b"page:" + k).digest(BLOCK) for k in ks)

    def get_keys(r: redis.Redis, ns: str, ks: list[bytes]) -> int:
        reply = r.execute_command("PFXGET", ns, "HASHES", len(ks), *ks, "NOLEASE", "WITHDATA")
        assert reply.get(b"data", b"") == data(ks[: reply[b"matched"]]), "wrong bytes"
        return reply[b"matched"]

    a.execute_command("PFXSET", "keys", "HASHES", 4, *keys[:4], "DATA", data(keys[:4]))
    a.execute_command("PFXSET", "keys", "HASHES", 6, *keys, "OFFSET", 4, "DATA", data(keys[4:]))  # below page 3
    written(a, 6)
    _, b = daemons(cluster.url())
    assert get_keys(b, "keys", keys) == 6
    with pytest.raises(redis.ResponseError, match="holds key pages"):
        b.execute_command("PFXGET", "keys", "TOKENS", 1, 2, 3, 4)
    _, c = daemons(cluster.url())
    assert get_keys(c, "keys", keys[3:]) == 3  # a run that starts at a key page stored below others
    assert get_keys(c, "keys", keys) == 6  # then the whole chain, C's namespace known as keys
    assert c.execute_command("PFXCHECK") == b"OK"
    # A namespace of token pages here takes no key pages from the shared tier.
    put(c, "tokens-here", prompts(1, 1, seed=14)[0])
    a.execute_command("PFXSET", "tokens-here", "HASHES", 2, *keys[:2], "DATA", data(keys[:2]))
    written(a, 8)
    with pytest.raises(redis.ResponseError, match="holds token pages"):
        c.execute_command("PFXGET", "tokens-here", "HASHES", 2, *keys[:2])
    assert tiers(b)["tier_remote_verify_failures"] == 0 and tiers(c)["tier_remote_verify_failures"] == 0


def test_credentials_work_and_are_never_logged_and_missing_rights_are_reported(cluster, daemons):
    cluster.on_all("ACL", "SETUSER", "tier", "on", ">Sekr1t-pw", "~pfx:*", "+@all")
    cluster.on_all("ACL", "SETUSER", "weak", "on", ">Weak-pw-9", "~other:*", "+@all")
    da, a = daemons(cluster.url("tier:Sekr1t-pw"))
    work = prompts(2, 2, seed=5)
    for tokens in work:
        put(a, "creds", tokens)
    written(a, 4)
    _, b = daemons(cluster.url("tier:Sekr1t-pw"))
    assert get(b, "creds", work[0]) == len(work[0])
    assert "Sekr1t-pw" not in str(tiers(a)) and "tier:***@" in tiers(a)["tier_remote_url"]
    assert b"Sekr1t-pw" not in repr(a.execute_command("PFXTIER", "INFO")).encode()
    dw, w = daemons(cluster.url("weak:Weak-pw-9"))
    assert tiers(w)["tier_remote_state"] == "refused"
    put(w, "creds", work[1])  # local serving goes on
    assert get(w, "creds", work[1]) == len(work[1])
    da.stop()
    dw.stop()
    assert "Sekr1t-pw" not in da.log_text() and "tier:***@" in da.log_text()
    text = dw.log_text()
    assert "Weak-pw-9" not in text and "lacks rights" in text


def one_page_prompts_by_node(cluster, ns: str, count: int, seed: int) -> dict[int, list[list[int]]]:
    by_node: dict[int, list[list[int]]] = {}
    for tokens in prompts(count, 1, seed):
        by_node.setdefault(cluster.owner_of(key(ns, tokens, 0)).port, []).append(tokens)
    return by_node


def node_lines(r: redis.Redis) -> dict[str, dict]:
    """INFO tiers' line per cluster node, by address."""
    info = tiers(r)
    return {info[f"tier_remote_node{i}"]["addr"]: info[f"tier_remote_node{i}"]
            for i in range(info["tier_remote_nodes"])}


def test_a_master_killed_costs_its_pages_only(tmp_path, daemons):
    import urllib.request

    from pfxcache.testing import free_port

    pytest.importorskip("prometheus_client")
    with redis_cluster(tmp_path / "c") as cluster:
        _, a = daemons(cluster.url())
        metrics_port = free_port()
        _, b = daemons(cluster.url(), "--metrics-port", str(metrics_port))
        wait_for(lambda: all(n["state"] == "up" for n in node_lines(b).values()), "every node probed up")
        assert sorted(node_lines(b)) == sorted(n.address for n in cluster.nodes)
        assert all(n["role"] == "master" and n["errors"] == 0 for n in node_lines(b).values())
        by_node = one_page_prompts_by_node(cluster, "kill", 30, seed=6)
        assert len(by_node) == 3
        for group in by_node.values():
            for tokens in group:
                put(a, "kill", tokens)
        written(a, 30)
        victim = cluster.nodes[0]
        victim.kill()
        for tokens in by_node[victim.port]:
            assert get(b, "kill", tokens) == 0
            assert get(a, "kill", tokens) == PAGE  # local pages whatever the cluster does
        # The node's own line says it is down, the others' that they are up (probed, not inferred).
        wait_for(lambda: node_lines(b)[victim.address]["state"] == "down", "the killed node seen down")
        lines = node_lines(b)
        assert lines[victim.address]["errors"] >= 1
        assert all(n["state"] == "up" for addr, n in lines.items() if addr != victim.address)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        for node in cluster.nodes:
            up = 0 if node is victim else 1
            assert f'pfxcache_tier_remote_node_up{{node="{node.address}",role="master"}} {up}.0' in text
        nodes = b.execute_command("PFXTIER", "INFO")[b"remote"][b"nodes"]
        assert {n[b"addr"].decode(): n[b"state"] for n in nodes}[victim.address] == b"down"
        # Failures in a row rebuild the clients (reads are misses meanwhile): wait for it to be back.
        wait_for(lambda: tiers(b)["tier_remote_state"] == "ok", "the shared tier back")
        for port, group in by_node.items():
            if port != victim.port:
                assert all(get(b, "kill", tokens) == PAGE for tokens in group)
        assert tiers(b)["tier_remote_hits"] == 30 - len(by_node[victim.port])


def test_a_stopped_cluster_costs_misses_and_the_daemons_reconnect(tmp_path, daemons):
    with redis_cluster(tmp_path / "c") as cluster:
        _, a = daemons(cluster.url())
        _, b = daemons(cluster.url())
        work = prompts(6, 2, seed=7)
        for tokens in work[:3]:
            put(a, "stop", tokens)
        written(a, 6)
        for node in cluster.nodes:
            node.kill()
        for tokens in work:
            assert get(b, "stop", tokens) == 0
            put(a, "stop", tokens)  # PFXSET never waits on the cluster
            assert get(a, "stop", tokens) == len(tokens)
        wait_for(lambda: get(b, "stop", work[0]) == 0 and tiers(b)["tier_remote_state"] == "down",
                 "the shared tier seen down")
        assert tiers(b)["tier_remote_errors"] > 0
        for node in cluster.nodes:
            node.start()
        cluster.wait_ok()
        wait_for(lambda: tiers(a)["tier_remote_state"] == "ok" and tiers(b)["tier_remote_state"] == "ok",
                 "reconnected", timeout=30)
        assert tiers(b)["tier_remote_reconnects"] >= 1
        fresh = prompts(2, 2, seed=8)
        before = tiers(a)["tier_remote_writes"]
        for tokens in fresh:
            put(a, "stop", tokens)
        written(a, before + 4)
        for tokens in fresh:
            assert get(b, "stop", tokens) == len(tokens)


def test_a_hung_node_bounds_the_wait_and_others_are_not_held(tmp_path, daemons):
    with redis_cluster(tmp_path / "c") as cluster:
        _, a = daemons(cluster.url(), "--remote-tier-timeout", "50")
        _, b = daemons(cluster.url(), "--remote-tier-timeout", "50")
        by_node = one_page_prompts_by_node(cluster, "hang", 30, seed=9)
        for group in by_node.values():
            for tokens in group:
                put(a, "hang", tokens)
        written(a, 30)
        victim = cluster.nodes[1]
        victim.pause()
        try:
            for tokens in by_node[victim.port]:
                assert get(b, "hang", tokens) == 0
            assert tiers(b)["tier_remote_fetches_late"] >= 1
            # The fetches the requests stopped waiting for hold their threads until the socket timeout
            # ends them (a few of them may put the tier down for a reconnect): then the others are free.
            wait_for(lambda: tiers(b)["tier_remote_fetches"] >= tiers(b)["tier_remote_fetches_late"],
                     "the late fetches ended")
            wait_for(lambda: tiers(b)["tier_remote_state"] == "ok", "the shared tier back")
            for port, group in by_node.items():  # pages on the live masters are still hits
                if port != victim.port:
                    assert all(get(b, "hang", tokens) == PAGE for tokens in group)
            assert b.ping()
        finally:
            victim.resume()
