"""The eviction policies the package does not ship, for in-process research runs.

``register()`` adds them to the store's registry (pfxcache.daemon.store.registry.POLICIES), so
that PrefixStore, the replay and the suite take their names in this process: ``ghost`` and
``odds`` (here), and the guard's experts ``reuse`` and ``lhd`` on their own (they live in the
package, as parts of the guard). A daemon never offers them: its config's list of choices is the
shipped registry's. What each was measured to do, and what was tried and not taken: NOTES.md.
"""

from __future__ import annotations

from pfxcache.daemon.store.lhd import LHDPolicy
from pfxcache.daemon.store.registry import POLICIES
from pfxcache.daemon.store.registry import register as register_policy
from pfxcache.daemon.store.reuse import ReusePolicy

from .ghost import GhostPolicy
from .odds import OddsPolicy

#: The research policies by name, in the order research runs list them.
RESEARCH = {cls.name: cls for cls in (GhostPolicy, ReusePolicy, LHDPolicy, OddsPolicy)}


def register() -> dict:
    """Add every research policy to the registry (again: no change); returns the registry."""
    for policy in RESEARCH.values():
        register_policy(policy)
    return POLICIES


__all__ = ["RESEARCH", "GhostPolicy", "OddsPolicy", "register"]
