"""The distribution installs its folders under the ``pfxcache.`` prefix only."""

from __future__ import annotations

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
