"""Makes the eviction research (scripts/research, not installed) importable as ``research`` in tests.

``import research_support`` puts the checkout's scripts/ folder on sys.path, as scripts/research/run
does with PYTHONPATH; ``research_policies()`` registers the research policies for a while.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))


@contextlib.contextmanager
def research_policies():
    """Within: the research policies registered (research.policies.register()); the registry as it was after."""
    from pfxcache.daemon.store.registry import POLICIES
    from research import policies

    before = dict(POLICIES)
    policies.register()
    try:
        yield POLICIES
    finally:
        POLICIES.clear()
        POLICIES.update(before)
