"""pfxcache: a prefix (KV-cache) cache daemon for LLM inference, operated like Redis.

The sub-packages live in top-level folders of the repository and are installed
under this package: ``pfxcache.daemon``, ``pfxcache.protocol``, ``pfxcache.client``.
"""

__version__ = "0.1.0"
