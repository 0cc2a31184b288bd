"""Shared fixtures: a real pfxcached process and a real redis-server side by side."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import settings

from support import REDIS_SERVER, start_daemon, start_redis_server

# Property tests draw the same examples on every run (CI included): a failure is reproducible and
# never a matter of the seed. HYPOTHESIS_PROFILE=explore draws fresh random examples to hunt bugs.
settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


def pytest_collection_modifyitems(config, items):
    if shutil.which("redis-server") is None and not shutil.which(REDIS_SERVER):
        raise pytest.UsageError("redis-server is required by the test suite (apt-get install redis-server)")


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
