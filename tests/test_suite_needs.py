"""The suite without redis-server: pure tests run, the tests that start one skip (or fail where it is required)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# One pure test (the store's lock) and one that compares against a real redis-server.
SELECTION = ["test_rwlock.py::test_release_without_hold_is_an_error",
             "test_differential.py::test_protocol_matches_redis"]


def run_without_redis_server(**env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "PFXCACHE_REQUIRE_REDIS_SERVER"}
    environment.update(PFXCACHE_REDIS_SERVER="/nonexistent/redis-server", **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           *(str(TESTS / name) for name in SELECTION)],
                          capture_output=True, text=True, timeout=300, env=environment, cwd=TESTS.parent)


def test_without_redis_server_only_its_tests_skip():
    result = run_without_redis_server()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    assert "skipped" in result.stdout and "redis-server is not installed" in result.stdout


def test_required_redis_server_fails_instead_of_skipping():
    result = run_without_redis_server(PFXCACHE_REQUIRE_REDIS_SERVER="1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 passed" in result.stdout and "skipped" not in result.stdout
    assert "redis-server is not installed" in result.stdout
