"""``python -m research MODULE [ARGS]``: register the research policies, then run MODULE as a script.

MODULE is a module of this package, or else a tool of the product (``pfxcache.tools.MODULE``), so
the product's tools run with the research policies too. Only a module with a ``main`` function runs:
a library (``workloads``, ``stress``, ``adversarial``, ``fifo_family``, ``policies``) is refused.
"""

from __future__ import annotations

import ast
import importlib.util
import runpy
import sys


def module_path(name: str) -> str | None:
    """``research.NAME`` or ``pfxcache.tools.NAME``, whichever exists first (None: neither)."""
    for package in ("research", "pfxcache.tools"):
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            return f"{package}.{name}"
    return None


def has_main(path: str) -> bool:
    """Whether module ``path`` defines a top-level ``main`` function (read from its source, not imported)."""
    spec = importlib.util.find_spec(path)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    with open(spec.origin, encoding="utf-8") as source:
        tree = ast.parse(source.read(), spec.origin)
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "main"
               for node in tree.body)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        import research

        print(__doc__.strip() + "\n\n" + (research.__doc__ or "").strip()
              + "\n\nusage: scripts/research/run MODULE [ARGS]", file=sys.stderr)
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    path = module_path(name) if name.isidentifier() else None
    if path is None:
        print(f"scripts/research/run: no module {name!r} in research/ or pfxcache.tools", file=sys.stderr)
        return 2
    if not has_main(path):
        print(f"scripts/research/run: {path} is a library (it has no main function), not a run; "
              f"see scripts/research/run --help", file=sys.stderr)
        return 2
    from research import policies

    policies.register()
    sys.argv = [f"scripts/research/run {name}", *args]
    runpy.run_module(path, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
