"""Every eviction policy by its ``maxmemory-policy`` name: the one place that knows them all."""

from __future__ import annotations

from .guard import GuardPolicy
from .lhd import LHDPolicy
from .odds import OddsPolicy
from .policies import GhostPolicy, HybridPolicy, LFUPolicy, LRUPolicy
from .reuse import ReusePolicy
from .tempo import TempoPolicy

POLICIES = {cls.name: cls for cls in (LRUPolicy, LFUPolicy, HybridPolicy, GhostPolicy, ReusePolicy, TempoPolicy, LHDPolicy, OddsPolicy, GuardPolicy)}
