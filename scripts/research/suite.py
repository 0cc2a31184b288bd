"""The eviction suite with the research's sets: pfxcache.tools.suite, two halves more.

Everything ``scripts/suite`` does (its options, tables, summaries and plot), and:

  --half stress        research.stress's set, made after the designs were chosen:
                       shapes that change, share an arena, or come in other page sizes
  --half adversarial   research.adversarial's three sets (loops longer than the cache,
                       phases, drifting popularity), a summary each

``--workloads`` takes any of their workloads too, and the default policies include the
research's (ghost, reuse), registered by the launcher.

    scripts/research/run suite --half stress --policies lru,tempo,guard   # phase changes, co-located apps, page sizes
    scripts/research/run suite --half adversarial --policies lru,guard --fractions 0.005,0.02,0.06,0.2,0.5
    scripts/research/run suite                     # the suite's halves, lru,lfu,hybrid,ghost,reuse,tempo,guard

The plot goes to scripts/out/suite.png, as scripts/suite's does.
"""

from __future__ import annotations

import sys

from pfxcache.tools import suite
from research import workloads

DEFAULT_POLICIES = "lru,lfu,hybrid,ghost,reuse,tempo,guard"


def main(argv: list[str] | None = None) -> int:
    return suite.main(argv, sets=workloads.halves(), default_policies=DEFAULT_POLICIES,
                      command_name="research/run suite", doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
