"""Every eviction policy by its ``maxmemory-policy`` name: the one place that knows them all.

The shipped choices are ``lru``, ``lfu``, ``hybrid``, ``tempo`` and ``guard`` (the default);
``noeviction`` is not a policy but a switch of the service (it keeps the policy in force for
PFXEVICT). The guard's experts ``reuse`` and ``lhd`` are parts of it, not choices of their own.
The config's list of names (daemon/config/directives.py) is made from POLICIES; research runs
add the policies they study with ``register`` (scripts/research/policies).
"""

from __future__ import annotations

from .guard import GuardPolicy
from .policies import HybridPolicy, LFUPolicy, LRUPolicy
from .policy import EvictionOrder
from .tempo import TempoPolicy

DEFAULT = GuardPolicy.name

POLICIES: dict[str, type[EvictionOrder]] = {cls.name: cls for cls in (LRUPolicy, LFUPolicy, HybridPolicy, TempoPolicy,
                                                                       GuardPolicy)}
#: The maxmemory-policy choices (whatever a research run registers in its own process besides).
SHIPPED: tuple[str, ...] = tuple(POLICIES)


def register(policy: type[EvictionOrder]) -> None:
    """Make ``policy`` selectable by its name in this process (PrefixStore, set_policy, the tools' --policies)."""
    POLICIES[policy.name] = policy
