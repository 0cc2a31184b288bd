"""The eviction research: studies, workload sets and policies that the installed package does not ship.

Not part of the wheel: importable as ``research`` with ``scripts/`` on sys.path, run as
``scripts/research/run MODULE [ARGS]`` (``python -m research MODULE`` under .venv), which first
registers the research policies (``research.policies.register()``) so that every policy name
works in the runs, then runs ``research.MODULE``, or ``pfxcache.tools.MODULE`` for a product
tool (``scripts/research/run replay --policies lru,ghost``).

Runnable (``scripts/research/run MODULE``):

  suite          pfxcache.tools.suite with the research sets: ``--half stress``, ``--half adversarial``
  hindsight      what Belady keeps that LRU loses, and what knowing it would be worth
  policy_memory  the bytes each policy's state takes, as INFO's used_memory_policy estimates them
  policy_cost    the CPU each policy costs, on a hot PFXGET loop and in process on the shared trace

Libraries (imported by the runs above, no ``main``: the launcher refuses them):

  workloads      every workload the research runs know (the suite's, the stress and adversarial sets)
  stress         the stress set: phase changes, co-located applications, other page sizes
  adversarial    three sets of loops, phases and drifts, each judged before the next was made
  fifo_family    S3-FIFO, SIEVE and a prefix-aware SIEVE, page-granular, for hindsight
  policies       the policies not shipped (ghost, odds, reuse, lhd), registered by ``register()``
"""
