"""The distribution installs its folders under the ``pfxcache.`` prefix only, and holds the product: no research."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_holds_prefixed_packages_and_command_defs(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    wheel = next(tmp_path.glob("pfxcache-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/", 1)[0] for name in names}
    assert top_level <= {"pfxcache", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, top_level
    assert "pfxcache/daemon/server/server.py" in names
    assert "pfxcache/protocol/requests.py" in names
    assert "pfxcache/client/__init__.py" in names
    assert "pfxcache/daemon/commands/defs/ping.json" in names
    assert "pfxcache/daemon/commands/defs/pfxget.json" in names
    assert "pfxcache/daemon/store/radix.py" in names
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    assert "pfxcached = pfxcache.daemon.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_generic_names_are_not_importable(tmp_path):
    code = (
        "import importlib.util, pfxcache.daemon, pfxcache.protocol, pfxcache.client;"
        "print([importlib.util.find_spec(n) is None for n in ('daemon', 'protocol', 'client')])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert result.stdout.strip() == "[True, True, True]", result.stderr


def test_building_the_package_warns_about_nothing(tmp_path):
    """scripts/setup stays quiet: the packaging itself draws no setuptools warning (license, packages, data)."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stdout + result.stderr, result.stdout + result.stderr


# -- the product apart from the research ----------------------------------------------------------------------

RESEARCH = ROOT / "scripts" / "research"
# Research modules named as product modules on purpose: they extend pfxcache.tools.suite and .workloads.
EXTENDS_THE_PRODUCT = {"suite", "workloads"}


def _research_modules() -> set[str]:
    return {p.stem for p in RESEARCH.rglob("*.py")} - {"__init__", "__main__"} - EXTENDS_THE_PRODUCT


def _clean_wheel(tmp_path: Path) -> list[str]:
    """The wheel's members, built from a copy of what the wheel is made of (build/ of this checkout may hold
    modules that moved out since, which setuptools would pack again)."""
    import shutil

    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", *(p.name for p in ROOT.glob("LICENSE*"))):
        shutil.copy(ROOT / name, source / name)
    for folder in ("pfxcache", "daemon", "protocol", "client"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(source)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return zipfile.ZipFile(next(tmp_path.glob("pfxcache-*.whl"))).namelist()


def test_the_wheel_holds_the_tools_and_no_research_module(tmp_path):
    names = _clean_wheel(tmp_path)
    research = _research_modules()
    assert {"hindsight", "adversarial", "fifo_family", "policy_memory", "policy_cost", "stress"} <= research
    shipped = {Path(n).stem for n in names if n.endswith(".py")}
    assert not research & shipped, research & shipped
    assert not [n for n in names if "research" in n.split("/")]
    for tool in ("suite", "workloads", "replay", "bench", "bench_store", "store_vs_sglang", "demo", "fleet",
                 "gpu_check"):
        assert f"pfxcache/tools/{tool}.py" in names


def test_no_product_module_installs_anything():
    """Installing (pip install/download, apt-get) is scripts/setup's: the modules only find what is there."""
    for path in [*ROOT.joinpath("pfxcache").rglob("*.py"), *(p for f in ("daemon", "protocol", "client")
                                                               for p in ROOT.joinpath(f).rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.List, ast.Tuple)):
                words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                assert not ({"pip", "apt-get", "apt", "ensurepip"} & set(words)), (path, node.lineno, words)


def test_the_research_tree_runs_apart_from_the_package(tmp_path):
    """scripts/research is a package of its own (``research``), run with scripts/ on PYTHONPATH."""
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts"), "PFXCACHE_OUT": str(tmp_path)}
    helped = subprocess.run([sys.executable, "-m", "research", "hindsight", "--help"], capture_output=True,
                            text=True, env=env, cwd=tmp_path, timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert "scripts/research/run hindsight" in helped.stdout
    ran = subprocess.run([sys.executable, "-m", "research", "suite", "--workloads", "loop", "--policies", "lru,ghost",
                          "--fractions", "0.2", "--no-plot", "--quiet", "--json"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert report["policies"] == ["lru", "ghost"] and list(report["summary"]) == ["adversarial, first set"]
    missing = subprocess.run([sys.executable, "-m", "research", "no_such_study"], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=60)
    assert missing.returncode == 2 and "no module 'no_such_study'" in missing.stderr
    outside = subprocess.run([sys.executable, "-c", "import research"], capture_output=True, text=True, cwd=tmp_path,
                             env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=60)
    assert outside.returncode != 0  # the installed package brings no research
