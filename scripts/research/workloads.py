"""Every workload the research runs know, and the research's halves of the suite.

The suite's own (pfxcache.tools.workloads.SUITE), the stress set (research.stress) and the three
adversarial sets (research.adversarial): ``generator(name)`` finds a workload in any of them,
``NAMES`` lists them all, and ``halves()`` is the suite's ``--half`` table with ``stress`` and
``adversarial`` added (``scripts/research/run suite``).
"""

from __future__ import annotations

from collections.abc import Callable

from pfxcache.tools import suite, workloads
from pfxcache.tools.replay import Trace
from research import adversarial, stress


def generator(name: str) -> Callable[..., Trace] | None:
    """The generator of workload ``name`` in the suite, the stress set or the adversarial sets (None: none)."""
    return workloads.SUITE.get(name) or stress.STRESS.get(name) or adversarial.ADVERSARIAL.get(name)


NAMES = (*workloads.SUITE, *stress.STRESS, *adversarial.ADVERSARIAL)  # every workload generator() knows


def halves() -> dict[str, list[suite.WorkloadSet]]:
    """The suite's halves, and ``stress`` (one set) and ``adversarial`` (its three sets, a summary each)."""
    sets = suite.halves()
    sets["stress"] = [suite.WorkloadSet("stress", tuple(stress.STRESS), stress.STRESS, "stress")]
    sets["adversarial"] = [
        suite.WorkloadSet(f"adversarial, {which} set", names, adversarial.ADVERSARIAL, "adversarial")
        for which, names in (("first", adversarial.FIRST), ("second", adversarial.SECOND),
                             ("third", adversarial.THIRD))]
    return sets
