"""The README's worker example runs as written, against a real daemon."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def worker_example() -> str:
    text = README.read_text()
    section = text[text.index("## Using it from a worker"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run_worker_example(daemon) -> subprocess.CompletedProcess:
    code = worker_example().replace("redis://127.0.0.1:6390/0", f"redis://{daemon.host}:{daemon.port}/0")
    assert code.count(f":{daemon.port}/0") == 1  # the example really talks to this daemon
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_worker_example_runs(fresh_daemon):
    daemon = fresh_daemon("--page-size", "16", "--block-bytes", "64", "--maxmemory", "1mb")
    result = run_worker_example(daemon)
    assert result.returncode == 0, result.stderr


def test_worker_example_runs_again_against_the_same_daemon(fresh_daemon):
    daemon = fresh_daemon("--page-size", "16", "--block-bytes", "64", "--maxmemory", "1mb")
    for run in range(2):
        result = run_worker_example(daemon)
        assert result.returncode == 0, f"run {run + 1}: {result.stderr}"
