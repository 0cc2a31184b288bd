"""pfxcache's tools: benchmarks, trace replay, the eviction suite, the fleet, the transformers demo, the GPU check.

Each module runs with ``python -m pfxcache.tools.<name>``; ``scripts/<name>`` is a
launcher that sets up .venv first (and installs what a tool compares against, with
``scripts/setup``: no module here installs anything). Tests import the modules like
any other code. The eviction research (studies, further workload sets, policies not
shipped) is not part of the package: it lives in scripts/research.
"""
