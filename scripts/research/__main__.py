"""``python -m research MODULE [ARGS]``: register the research policies, then run MODULE as a script.

MODULE is a module of this package, or else a tool of the product (``pfxcache.tools.MODULE``), so
the product's tools run with the research policies too.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys


def module_path(name: str) -> str | None:
    """``research.NAME`` or ``pfxcache.tools.NAME``, whichever exists first (None: neither)."""
    for package in ("research", "pfxcache.tools"):
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            return f"{package}.{name}"
    return None


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\nusage: scripts/research/run MODULE [ARGS]", file=sys.stderr)
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    path = module_path(name) if name.isidentifier() else None
    if path is None:
        print(f"scripts/research/run: no module {name!r} in research/ or pfxcache.tools", file=sys.stderr)
        return 2
    from research import policies

    policies.register()
    sys.argv = [f"scripts/research/run {name}", *args]
    runpy.run_module(path, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
