"""The README's examples run as written, and the documentation's commands and links exist.

* the two opening commands: the scripts exist, `scripts/run` starts pfxcached, CI runs `scripts/test`;
* the redis-cli tours, run with redis-cli against a real daemon, output compared line by line;
* the worker example, run as written against a real daemon, twice;
* every `scripts/...` command in README.md, docs/ and the research notes: its launcher exists, and
  every `--option` it passes is one the tool's `--help` lists;
* every relative link in README.md, docs/ and the scripts' READMEs names a file that exists, and an
  anchor a heading of that file makes.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINKED = [README, *DOCS, ROOT / "scripts" / "README.md", ROOT / "scripts" / "research" / "README.md"]
REQUIRE_REDIS_CLI = os.environ.get("PFXCACHE_REQUIRE_REDIS_SERVER") == "1"  # scripts/test installs redis-tools


def section(text: str, heading: str) -> str:
    """The text of the section that starts with ``heading``, up to the next heading of its level."""
    start = text.index(heading + "\n")
    level = heading.split(" ", 1)[0]
    end = text.find("\n" + level + " ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def fenced_blocks(text: str, language: str | None = None) -> list[tuple[str, str]]:
    """Every fenced code block, as (language, body)."""
    blocks = re.findall(r"^```([a-z]*)\n(.*?)^```$", text, re.S | re.M)
    return [(lang, body) for lang, body in blocks if language is None or lang == language]


# -- the two opening commands -------------------------------------------------------------------

def opening_commands() -> list[str]:
    text = README.read_text()
    first = text.index("```")
    assert text[:first].strip() == "# pfxcache", "the README opens with its two commands"
    language, body = fenced_blocks(text[first:])[0]
    assert language == "sh"
    return [line.split("#", 1)[0].strip() for line in body.splitlines()]


def test_the_readme_opens_with_the_two_commands():
    assert opening_commands() == ["scripts/run", "scripts/test"]
    for command in opening_commands():
        script = ROOT / command
        assert script.is_file() and os.access(script, os.X_OK), f"{command} is not an executable script"


def test_scripts_run_starts_pfxcached_with_its_arguments():
    """scripts/run sets up .venv and hands its arguments to pfxcached (the tours below run that daemon)."""
    lines = (ROOT / "scripts" / "run").read_text().splitlines()
    assert "scripts/setup" in lines
    assert lines[-1] == 'exec .venv/bin/pfxcached "$@"'
    result = subprocess.run([str(ROOT / "scripts" / "run"), "--version"], capture_output=True, text=True,
                            timeout=600, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("pfxcached v="), result.stdout


def test_ci_runs_the_second_command():
    """The whole test suite is `scripts/test`, and CI runs exactly that."""
    assert (ROOT / ".ci" / "run").read_text().splitlines()[-1] == "exec scripts/test"
    assert (ROOT / "scripts" / "test").read_text().splitlines()[-1] == 'exec .venv/bin/python -m pytest "$@"'


# -- the redis-cli tours ------------------------------------------------------------------------

def tour_blocks() -> list[str]:
    tour = section(README.read_text(), "## A short tour with redis-cli")
    return [body for _, body in fenced_blocks(tour, "console")]


def steps(block: str) -> list[tuple[str, list[str]]]:
    """The ``$ command`` lines of a console block, each with the output lines shown under it."""
    result: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            result.append((line[2:], []))
        else:
            result[-1][1].append(line)
    return result


def redis_cli() -> str:
    found = shutil.which("redis-cli")
    if found is None:
        if REQUIRE_REDIS_CLI:
            pytest.fail("redis-cli is missing (scripts/setup test installs redis-tools)")
        pytest.skip("redis-cli is not installed (scripts/setup test installs it)")
    return found


def run_step(command: str, port: int) -> str:
    """Run one tour line against ``port``, as a terminal shows it (redis-cli formats replies on a tty)."""
    command = command.split("  #", 1)[0].strip()
    assert command.startswith("redis-cli -p 6390 "), command
    rest = command[len("redis-cli -p 6390 "):]
    if "|" in rest:  # a pipe: redis-cli's raw output, as the reader's shell sees it too
        line = f"{redis_cli()} -p {port} {rest}"
    else:
        line = f"{redis_cli()} -p {port} --no-raw {rest}"
    result = subprocess.run(line, shell=True, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout


def check_output(command: str, shown: list[str], got: str) -> None:
    lines = got.splitlines()
    if not shown:  # nothing shown: it must answer, and not with an error
        assert lines and not lines[0].startswith(("(error)", "ERR")), f"{command}: {got}"
        return
    if shown[-1] == "...":
        shown = shown[:-1]
        lines = lines[:len(shown)]
    assert lines == shown, f"{command}:\n{got}"


def test_the_server_tour_runs_against_a_real_daemon(fresh_daemon):
    """The first tour, against a daemon on its embedded defaults; it ends with SHUTDOWN."""
    daemon = fresh_daemon()
    tour = steps(tour_blocks()[0])
    assert tour[-1][0] == "redis-cli -p 6390 SHUTDOWN"
    for command, shown in tour[:-1]:
        check_output(command, shown, run_step(command, daemon.port))
    subprocess.run(f"{redis_cli()} -p {daemon.port} SHUTDOWN", shell=True, capture_output=True, timeout=60)
    assert daemon.proc.wait(timeout=30) == 0


def test_the_prefix_tour_runs_against_a_real_daemon(fresh_daemon):
    """The second tour, against a daemon started with the geometry its first line gives scripts/run."""
    (start, _), *tour = steps(tour_blocks()[1])
    assert start.startswith("scripts/run ") and start.endswith(" &"), start
    daemon = fresh_daemon(*shlex.split(start[len("scripts/run "):-2]))
    assert len(tour) >= 4
    for command, shown in tour:
        check_output(command, shown, run_step(command, daemon.port))


# -- the worker example -------------------------------------------------------------------------

def worker_example() -> str:
    blocks = fenced_blocks(section(README.read_text(), "## Using it from a worker"), "python")
    assert len(blocks) == 1
    return blocks[0][1]


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


# -- the documented commands --------------------------------------------------------------------

SCRIPT_COMMAND = re.compile(r"^(?:\$ )?(scripts/[\w./-]+)(.*)$")


def documented_commands(path: Path) -> list[str]:
    """``scripts/...`` commands in code blocks (a line each) and in inline code spans."""
    text = path.read_text()
    found = []
    for _, body in fenced_blocks(text):
        found += [line.strip() for line in body.splitlines() if SCRIPT_COMMAND.match(line.strip())]
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M)
    found += [span for span in re.findall(r"`([^`\n]+)`", prose) if SCRIPT_COMMAND.match(span)]
    return found


@cache
def module_help(command: tuple[str, ...]) -> str:
    """What ``python COMMAND --help`` prints, run as the launchers run it (no set-up, no install)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"))  # the research package, as its launcher has it
    result = subprocess.run([sys.executable, *command, "--help"], capture_output=True, text=True,
                            timeout=120, cwd=ROOT, env=env)
    assert result.returncode == 0, f"{' '.join(command)} --help: {result.stderr}"
    return result.stdout + result.stderr


def tool_help(launcher: str, args: str) -> str:
    """The --help of the module a command runs, read off its launcher; "" for launchers of no tool."""
    if launcher == "scripts/research/run":
        module = args.split()[0] if args.split() else ""
        return module_help(("-m", "research", module)) if module.isidentifier() else ""
    script = (ROOT / launcher).read_text()
    match = re.search(r'"\$\(dirname "\$0"\)/tool"(?: --setup \w+)* (\w+) "\$@"', script)
    if match is None:  # run, test, setup, tool: not a tool launcher
        return ""
    return module_help(("-m", f"pfxcache.tools.{match.group(1)}"))


@pytest.mark.parametrize("path", [README, *DOCS, ROOT / "scripts" / "research" / "README.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_commands_exist(path):
    commands = documented_commands(path)
    for command in commands:
        launcher, args = SCRIPT_COMMAND.match(command).groups()
        launcher = launcher.rstrip(".,:")
        script = ROOT / launcher
        if launcher.startswith("scripts/out") or script.is_dir():  # what tools write; a folder
            continue
        if script.suffix:  # a file named in the text, not a command
            assert script.exists(), f"{path.name}: {command}: no such file"
            continue
        assert script.is_file() and os.access(script, os.X_OK), f"{path.name}: {command}: no such script"
        help_text = tool_help(launcher, args)
        if not help_text:
            continue
        for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", args.split("  #", 1)[0]):
            assert option in help_text, f"{path.name}: {command}: {launcher} has no {option}"


# -- links --------------------------------------------------------------------------------------

def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.S | re.M)
    return {anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(path):
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.S | re.M)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    for link in links:
        if re.match(r"[a-z]+:", link):  # http:, mailto: ...
            continue
        target, _, fragment = link.partition("#")
        resolved = (path.parent / target).resolve() if target else path
        assert resolved.exists(), f"{path.relative_to(ROOT)}: {link}: no such file"
        if fragment:
            assert fragment in anchors(resolved), f"{path.relative_to(ROOT)}: {link}: no such heading"
