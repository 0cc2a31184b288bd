"""The daemon's structure, checked from its source: one direction, no hidden cycles.

A PFXGET goes socket -> protocol -> command table -> service -> store -> arena.
These tests read the modules' import statements (no daemon runs) and fail when
a change makes a lower layer import a higher one, closes an import cycle, or
hides one with an import inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Folder in the repository -> the package it is installed as.
PACKAGES = {"daemon": "pfxcache.daemon", "protocol": "pfxcache.protocol"}


def _modules() -> dict[str, Path]:
    modules = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
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


def _runtime_imports(module: str) -> set[str]:
    """Everything ``module`` imports when it is imported (``if TYPE_CHECKING:`` blocks excluded)."""
    tree = ast.parse(MODULES[module].read_text())
    found: set[str] = set()
    for node in tree.body:
        if _is_type_checking(node):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                found.update(_imported(module, sub))
    return found


def _own_imports(module: str) -> set[str]:
    return {name for name in _runtime_imports(module) if name in MODULES and name != module}


def test_the_modules_are_found() -> None:
    assert {"pfxcache.daemon.server.server", "pfxcache.daemon.service.prefix", "pfxcache.daemon.commands.table",
            "pfxcache.daemon.store.store", "pfxcache.protocol.requests"} <= set(MODULES)


def test_no_import_cycles() -> None:
    graph = {module: _own_imports(module) for module in MODULES}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            # A package's __init__ is imported before its submodules: an edge from a
            # submodule to its own package is the package being set up, not a cycle.
            if module.startswith(target + "."):
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
    """Imports inside functions are for optional third-party packages only: one of
    pfxcache's own modules imported there is how an import cycle gets hidden."""
    hidden = []
    for module, path in MODULES.items():
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    own = [name for name in _imported(module, node) if name.startswith("pfxcache")]
                    if own:
                        hidden.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert hidden == []


@pytest.mark.parametrize(
    ("lower", "forbidden"),
    [
        # sans-IO: bytes in, commands out; it knows no daemon and no event loop.
        ("pfxcache.protocol", ("pfxcache.daemon", "pfxcache.client", "trio")),
        # The store core is synchronous and speaks no RESP.
        ("pfxcache.daemon.store", ("trio", "pfxcache.protocol", "pfxcache.daemon.commands",
                                   "pfxcache.daemon.server.server", "pfxcache.daemon.service.prefix")),
        # The prefix service sits under the commands and above the store.
        ("pfxcache.daemon.service.prefix", ("pfxcache.daemon.commands", "pfxcache.daemon.server.server",
                                    "pfxcache.protocol")),
        # The ACL is consulted by dispatch: it uses the table it is given, never imports it.
        ("pfxcache.daemon.security.acl", ("pfxcache.daemon.commands", "pfxcache.daemon.server.server")),
        # Handlers and INFO see the server through their Context, never the module.
        ("pfxcache.daemon.commands", ("pfxcache.daemon.server.server", "pfxcache.daemon.server.connection")),
        ("pfxcache.daemon.observability.info", ("pfxcache.daemon.server.server",)),
    ],
)
def test_imports_go_one_direction(lower: str, forbidden: tuple[str, ...]) -> None:
    offending = []
    for module in MODULES:
        if module != lower and not module.startswith(lower + "."):
            continue
        for name in _runtime_imports(module):
            if any(name == bad or name.startswith(bad + ".") for bad in forbidden):
                offending.append(f"{module} imports {name}")
    assert offending == []
