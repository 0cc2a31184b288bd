"""Shared fixtures: a real pfxcached process and a real redis-server side by side."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from pfxcache.testing import RedisServerMissing, start_daemon, start_redis_server

# scripts/test (hence CI) installs redis-server and sets this: there a missing redis-server fails
# the tests that need it instead of skipping them, so CI never passes with the comparisons unrun.
REQUIRE_REDIS_SERVER = os.environ.get("PFXCACHE_REQUIRE_REDIS_SERVER") == "1"

# Property tests draw the same examples on every run (CI included): a failure is reproducible and
# never a matter of the seed. HYPOTHESIS_PROFILE=explore draws fresh random examples to hunt bugs.
settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Only the tests that start a redis-server need one: without it they skip, saying why."""
    report = yield
    if (call.excinfo is not None and call.excinfo.errisinstance(RedisServerMissing)
            and not REQUIRE_REDIS_SERVER and report.failed):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {call.excinfo.value}")
    return report


@pytest.fixture(scope="module")
def daemon():
    """A pfxcached on a free loopback port, shared by the tests of one module."""
    instance = start_daemon()
    yield instance
    code = instance.stop()
    assert code == 0, instance.log_text()


@pytest.fixture
def fresh_daemon():
    """A factory for pfxcached instances with their own directives; all stopped afterwards."""
    started = []

    def factory(*args: str, **kwargs):
        instance = start_daemon(*args, **kwargs)
        started.append(instance)
        return instance

    yield factory
    for instance in started:
        instance.stop()


@pytest.fixture(scope="session")
def redis_server():
    """Debian's redis-server 7 on a free loopback port: the reference for Redis behaviour."""
    instance = start_redis_server()
    yield instance
    instance.stop()
