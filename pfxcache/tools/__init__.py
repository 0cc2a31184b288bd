"""pfxcache's tools: benchmarks, trace replay, the transformers demo, the GPU check.

Each module runs with ``python -m pfxcache.tools.<name>``; ``scripts/<name>`` is a
launcher that sets up .venv first. Tests import the modules like any other code.
"""
