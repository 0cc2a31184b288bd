"""scripts/: thin launchers of the package's tools, which run as modules (python -m pfxcache.tools.NAME)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
TOOLS = {"bench": "bench", "bench-latency": "bench_latency", "bench-store": "bench_store", "replay": "replay",
         "bench-hotpath": "bench_hotpath", "bench-attach": "bench_attach",
         "gpu-check": "gpu_check", "demo": "demo", "bench-tier": "bench_tier",
         "bench-remote-tier": "bench_remote_tier",
         "bench-sglang-backend": "bench_sglang_backend", "bench-lmcache": "bench_lmcache_connector"}


@pytest.mark.parametrize("script", sorted(TOOLS))
def test_each_tool_is_a_module_and_its_script_a_launcher(script):
    launcher = (SCRIPTS / script).read_text().splitlines()
    # code lives in the package; a launcher at most installs a peer (scripts/setup GROUP) before it runs the tool
    assert len(launcher) <= 12 and f"{TOOLS[script]} " in launcher[-1], launcher
    assert "python" not in "\n".join(launcher[1:]) and "pip " not in "\n".join(launcher), launcher
    result = subprocess.run([sys.executable, "-m", f"pfxcache.tools.{TOOLS[script]}", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: scripts/{script} ")


def test_setup_again_is_silent():
    first = subprocess.run([str(SCRIPTS / "setup")], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([str(SCRIPTS / "setup")], capture_output=True, text=True, timeout=60)
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")


def test_replay_through_its_launcher_from_another_directory(tmp_path):
    """The launcher sets up .venv, runs the module and leaves the working directory alone (relative paths work)."""
    saved = tmp_path / "trace.jsonl"
    result = subprocess.run(
        [str(SCRIPTS / "replay"), "--generate", "sessions", "--sessions", "12", "--block-tokens", "16",
         "--capacities", "40", "--policies", "lru", "--save", "trace.jsonl", "--json", "--quiet", "--no-plot"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["command"].startswith("scripts/replay --generate sessions")
    assert doc["results"]["lru"]["40"]["input_tokens"] == doc["input_tokens"] > 0
    assert saved.exists() and len(saved.read_text().splitlines()) == doc["requests"]


def test_the_research_runs_through_its_own_launcher(tmp_path):
    """scripts/research/run MODULE: .venv set up, scripts/ on PYTHONPATH, the research policies registered."""
    run = SCRIPTS / "research" / "run"
    helped = subprocess.run([str(run), "hindsight", "--help"], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: scripts/research/run hindsight ")
    suite = subprocess.run([str(run), "suite", "--help"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert suite.returncode == 0 and "--half {tuning,held-out,all,stress,adversarial}" in suite.stdout, suite.stderr
    replay = subprocess.run([str(run), "replay", "--help"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert replay.returncode == 0 and "ghost" in replay.stdout, replay.stderr  # a product tool, research policies
    bare = subprocess.run([str(run)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bare.returncode == 2 and "usage: scripts/research/run" in bare.stderr
