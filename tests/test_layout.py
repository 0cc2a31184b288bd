"""The repository's shape, checked from its source: the package is the product, layers go one way, no cycles.

A PFXGET goes socket -> protocol -> command table -> service -> store -> arena. In the daemon that path is
folders: ``server/`` (listeners, connections, clients) -> ``commands/`` (table, dispatch, handlers) ->
``service/`` (PrefixService, locks, KV events) -> ``store/`` (the synchronous core). ``config/``,
``observability/`` and ``security/`` are side layers that every layer above the store may use. ``protocol/``
is sans-IO RESP (bytes in, commands out) under all of them; ``client/`` talks to the daemon over sockets and
the arena only, so it imports nothing of the daemon. The tools a user runs sit on top of everything. The
eviction research lives in ``scripts/research/`` (a package named ``research``), outside the wheel.

These tests read the modules' import statements (no daemon runs) and fail when a change makes a layer import
one above it, closes an import cycle, hides an import inside a function, puts research back in the package,
or makes the daemon's top level flat again.
"""

from __future__ import annotations

import ast
import importlib.util
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
#: Installed package -> its folder in the repository (pyproject's package-dir): what the wheel ships.
PACKAGE_DIRS: dict[str, str] = SETUPTOOLS["package-dir"]


def _modules() -> dict[str, Path]:
    modules = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            # A folder mapped on its own (pfxcache.daemon -> daemon/) is not also a part of its parent's folder.
            modules.setdefault(".".join([package, *parts]), path)
    return modules


MODULES = _modules()


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The module names ``node`` imports (``from x import y`` counts x and, if a module, x.y)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]
        for _ in range(node.level - 1):
            base = base.rsplit(".", 1)[0]
        target = f"{base}.{node.module}" if node.module else base
    else:
        target = node.module or ""
    return [target, *(f"{target}.{alias.name}" for alias in node.names)]


def _imports(module: str, *, in_functions: bool) -> set[str]:
    """What ``module`` imports (``if TYPE_CHECKING:`` blocks excluded): when it is imported, and with
    ``in_functions`` also what its functions import when they run."""
    tree = ast.parse(MODULES[module].read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not in_functions:
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(_imported(module, node))
        for child in ast.iter_child_nodes(node):
            visit(child)

    for node in tree.body:
        if not _is_type_checking(node):
            visit(node)
    return found


def _runtime_imports(module: str) -> set[str]:
    """Everything ``module`` imports when it is imported."""
    return _imports(module, in_functions=False)


def _own_imports(module: str) -> set[str]:
    """The package's modules that ``module`` uses, at import time or from a function."""
    return {name for name in _imports(module, in_functions=True) if name in MODULES and name != module}


def test_the_modules_are_found() -> None:
    assert {"pfxcache.daemon.server.server", "pfxcache.daemon.service.prefix", "pfxcache.daemon.commands.table",
            "pfxcache.daemon.store.store", "pfxcache.protocol.requests", "pfxcache.client.core",
            "pfxcache.client.vllm.connector", "pfxcache.tools.replay", "pfxcache.testing"} <= set(MODULES)


# -- the package is the product ----------------------------------------------------------------------

#: The eviction research the issue moved out of the package (scripts/research/): never a module of it again.
RESEARCH_TOOLS = ("hindsight", "adversarial", "fifo_family", "policy_memory", "policy_cost", "stress")
RESEARCH = ROOT / "scripts" / "research"


@pytest.mark.parametrize("name", RESEARCH_TOOLS)
def test_no_research_tool_is_a_module_of_the_package(name: str) -> None:
    assert (RESEARCH / f"{name}.py").is_file(), f"scripts/research/{name}.py: the research tool went missing"
    assert f"pfxcache.tools.{name}" not in MODULES
    assert importlib.util.find_spec(f"pfxcache.tools.{name}") is None  # not importable from the installed package


def test_no_unshipped_policy_is_a_module_of_the_store() -> None:
    unshipped = sorted(path.stem for path in (RESEARCH / "policies").glob("*.py") if path.stem != "__init__")
    shipped_too = [name for name in unshipped if f"pfxcache.daemon.store.{name}" in MODULES]
    assert shipped_too == []


def test_the_package_imports_no_research() -> None:
    """The package runs without scripts/ on sys.path: no module of it names ``research``, statically or by
    ``importlib.import_module``."""
    found = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = _imported(module, node)
            elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str) and ast.unparse(node.func).endswith("import_module")):
                names = [node.args[0].value]
            if any(name == "research" or name.startswith("research.") or ".research" in name for name in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_the_wheel_ships_the_product_folders_only() -> None:
    """Every installed package comes from daemon/, protocol/, client/ or pfxcache/, never from scripts/."""
    folders = {package: PACKAGE_DIRS[max((p for p in PACKAGE_DIRS if package == p or package.startswith(p + ".")),
                                          key=len)] for package in SETUPTOOLS["packages"]}
    assert set(folders.values()) == {"daemon", "protocol", "client", "pfxcache"}, folders
    assert [package for package in SETUPTOOLS["packages"] if "research" in package] == []


# -- no cycles, nothing hidden -----------------------------------------------------------------------

def test_no_import_cycles() -> None:
    """Over the whole package (daemon, protocol, client, tools), counting the imports inside functions: a
    cycle hidden in a function is still two modules that cannot be read one without the other."""
    graph = {module: _own_imports(module) for module in MODULES}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            # A package's __init__ is imported before its submodules: an edge between a submodule and its
            # own package is the package being set up (or re-exporting), not a cycle.
            if module.startswith(target + ".") or target.startswith(module + "."):
                continue
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []


def test_no_own_module_imported_inside_a_function() -> None:
    """In the daemon and the protocol, imports inside functions are for optional third-party packages only:
    one of pfxcache's own modules imported there is how an import cycle gets hidden. (The client and the
    tools import their heavy parts lazily; the cycle test above counts those imports.)"""
    hidden = []
    for module, path in MODULES.items():
        if not module.startswith(("pfxcache.daemon", "pfxcache.protocol")):
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    own = [name for name in _imported(module, node) if name.startswith("pfxcache")]
                    if own:
                        hidden.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert hidden == []


# -- layers only downward ----------------------------------------------------------------------------

D = "pfxcache.daemon"
SIDE = (f"{D}.config", f"{D}.observability", f"{D}.security")
BELOW_SERVICE = (f"{D}.store", f"{D}.tier", "pfxcache.protocol", "pfxcache")
#: Layer -> the layers its modules may import (each may import itself). A module's layer is the longest
#: name here that it is or lies under; ``pfxcache`` alone is the package's root (its version).
ALLOWED: dict[str, tuple[str, ...]] = {
    "pfxcache": (),
    "pfxcache.protocol": ("pfxcache",),
    f"{D}.store": ("pfxcache",),
    # the disk tier's files: blocking I/O beside the store, for the service's worker threads
    f"{D}.tier": ("pfxcache",),
    # side layers: under everything above the store, beside one another
    f"{D}.config": (*SIDE, *BELOW_SERVICE),
    f"{D}.observability": (*SIDE, *BELOW_SERVICE),
    f"{D}.security": (*SIDE, *BELOW_SERVICE),
    f"{D}.service": (*SIDE, *BELOW_SERVICE),
    f"{D}.commands": (f"{D}.service", *SIDE, *BELOW_SERVICE),
    f"{D}.server": (f"{D}.commands", f"{D}.service", *SIDE, *BELOW_SERVICE),
    # the daemon's top level (cli, __main__) assembles it: every layer
    D: (f"{D}.server", f"{D}.commands", f"{D}.service", *SIDE, *BELOW_SERVICE),
    "pfxcache.client": ("pfxcache.protocol", "pfxcache"),
    "pfxcache.testing": ("pfxcache.protocol", "pfxcache"),
    # a Redis Cluster of redis-server processes, for tests and tools (on top of testing's launchers)
    "pfxcache.testing_cluster": ("pfxcache.testing", "pfxcache.protocol", "pfxcache"),
}
# what a user runs: on top of all of it
ALLOWED["pfxcache.tools"] = (*(layer for layer in ALLOWED if layer.startswith(D)), "pfxcache.client",
                             "pfxcache.testing", "pfxcache.testing_cluster", "pfxcache.protocol", "pfxcache")
#: What a layer (or one module of it) must not import besides: the store is synchronous, the protocol does no
#: I/O, the prefix service speaks no RESP (its replies are built by the commands).
FORBIDDEN = {f"{D}.store": ("trio",), f"{D}.tier": ("trio",), "pfxcache.protocol": ("trio", "socket"),
             f"{D}.service.prefix": ("pfxcache.protocol",)}


def _layer(module: str) -> str:
    return max((layer for layer in ALLOWED if module == layer or module.startswith(layer + ".")), key=len)


def _upward_imports(layer: str) -> list[str]:
    offending = []
    for module in MODULES:
        if _layer(module) != layer:
            continue
        for name in sorted(_runtime_imports(module)):
            if name in MODULES and name != module:
                target = _layer(name)
                if target != layer and target not in ALLOWED[layer]:
                    offending.append(f"{module} -> {name}")
            for owner, names in FORBIDDEN.items():
                if (module == owner or module.startswith(owner + ".")) and any(
                        name == bad or name.startswith(bad + ".") for bad in names):
                    offending.append(f"{module} -> {name}")
    return offending


def test_every_module_has_a_layer() -> None:
    assert {_layer(module) for module in MODULES} == set(ALLOWED)


#: The layers whose imports go upward in today's code, each with what does: the check is expected to fail
#: there, and fails (strict) once they are fixed, so that the mark goes.
UPWARD_TODAY: dict[str, str] = {}


@pytest.mark.parametrize("layer", [
    pytest.param(layer, marks=pytest.mark.xfail(strict=True, reason=UPWARD_TODAY[layer]))
    if layer in UPWARD_TODAY else layer for layer in ALLOWED
])
def test_imports_go_only_downward(layer: str) -> None:
    assert _upward_imports(layer) == []


# -- the daemon's top level --------------------------------------------------------------------------

def test_the_daemon_has_a_dozen_top_level_entries_at_most() -> None:
    """Its layers are folders: daemon/ itself holds them and the entry points, not the modules."""
    daemon = ROOT / PACKAGE_DIRS[D]
    entries = sorted(path.name for path in daemon.iterdir()
                     if (path.is_file() and path.suffix == ".py") or (path / "__init__.py").is_file())
    assert len(entries) <= 12, entries
