"""redis-py 8, sync and asyncio, RESP3 (its default) and RESP2, with and without a password."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry
import pytest


@pytest.mark.parametrize("protocol", [3, 2])
def test_sync_client(daemon, protocol):
    client = redis.Redis(host=daemon.host, port=daemon.port, protocol=protocol, client_name="worker-7",
                         health_check_interval=1)
    try:
        assert client.ping() is True
        assert client.echo(b"\x00binary\xff") == b"\x00binary\xff"
        assert client.client_getname() in ("worker-7", b"worker-7")
        info = client.info()
        assert info["redis_version"] == "7.0.15"
        assert info["tcp_port"] == daemon.port
        assert isinstance(info["connected_clients"], int)
        assert client.config_get("maxclients") == {"maxclients": "10000"} or client.config_get("maxclients") == {b"maxclients": b"10000"}
        hello = client.execute_command("HELLO")
        if isinstance(hello, list):  # RESP2: the map arrives as a flat name/value array
            hello = dict(zip(hello[::2], hello[1::2]))
        assert (hello.get("proto") or hello.get(b"proto")) == protocol
        assert client.dbsize() == 0
        seconds, micros = client.time()
        assert seconds > 1_700_000_000 and 0 <= micros < 1_000_000
        me = client.client_info()
        assert me["name"] == "worker-7"
        assert "lib-name" not in me  # Redis 7.0.15 has no CLIENT SETINFO: redis-py's call is refused, as there
        with pytest.raises(redis.ResponseError, match="unknown command"):
            client.execute_command("NOSUCH")
    finally:
        client.close()


@pytest.mark.parametrize("protocol", [3, 2])
def test_asyncio_client(daemon, protocol):
    # redis.asyncio runs on asyncio; the suite's async tests run on trio, so drive asyncio here.
    async def scenario():
        client = redis.asyncio.Redis(host=daemon.host, port=daemon.port, protocol=protocol, health_check_interval=1)
        try:
            assert await client.ping() is True
            async with client.pipeline(transaction=False) as pipe:
                for i in range(100):
                    pipe.echo(f"value-{i}")
                results = await pipe.execute()
            assert results == [f"value-{i}".encode() for i in range(100)]
            assert (await client.client_id()) > 0
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_health_checks_survive_idle_periods(daemon):
    import time

    client = redis.Redis(host=daemon.host, port=daemon.port, health_check_interval=0.1)
    try:
        for _ in range(3):
            assert client.ping()
            time.sleep(0.25)
    finally:
        client.close()


NO_RETRY = Retry(NoBackoff(), 0)  # an auth failure is final; redis-py would retry it with backoff


@pytest.mark.parametrize("protocol", [3, 2])
def test_password(fresh_daemon, protocol):
    locked = fresh_daemon("--requirepass", "hunter2")
    anonymous = redis.Redis(host=locked.host, port=locked.port, protocol=protocol, retry=NO_RETRY)
    with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
        anonymous.ping()
    anonymous.close()
    wrong = redis.Redis(host=locked.host, port=locked.port, protocol=protocol, password="nope", retry=NO_RETRY)
    with pytest.raises(redis.AuthenticationError):
        wrong.ping()
    wrong.close()
    good = redis.Redis(host=locked.host, port=locked.port, protocol=protocol, password="hunter2")
    assert good.ping()
    good.close()
    user = redis.Redis(host=locked.host, port=locked.port, protocol=protocol, username="default", password="hunter2")
    assert user.echo("x") == b"x"
    user.close()


def test_command_table_visible_to_clients(daemon):
    client = redis.Redis(host=daemon.host, port=daemon.port, decode_responses=True)
    try:
        commands = client.command()
        assert "ping" in commands and commands["ping"]["arity"] == -1
        assert client.command_count() == len(commands)
        docs = client.execute_command("COMMAND DOCS", "echo")
        assert "echo" in docs
    finally:
        client.close()
