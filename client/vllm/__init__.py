"""vLLM serves through pfxcache: ``PrefixCacheConnector``, a vLLM KV connector (KVConnectorBase_V1).

Engines on one host share prefix KV through the daemon's arena (shared
memory, or the CUDA arena's IPC handle); engines elsewhere through RESP::

    from vllm import LLM
    from vllm.config import KVTransferConfig

    llm = LLM(model=..., block_size=32, kv_transfer_config=KVTransferConfig(
        kv_connector="PrefixCacheConnector", kv_connector_module_path="pfxcache.client.vllm",
        kv_role="kv_both", kv_connector_extra_config={"pfxcache_url": "redis://127.0.0.1:6390/0"}))

The daemon's page size and block size must fit the model: ``python -m
pfxcache.client.vllm MODEL_DIR --block-size 32`` prints the directives.

Modules: :mod:`.layout` (the page layout, geometry, namespaces; no vLLM, no
torch), :mod:`.plan` (the plain data between the halves), :mod:`.scheduler`
(the engine core's half: lookups, leases, plans), :mod:`.worker` (the workers'
half: copies), :mod:`.connector` (the class vLLM loads). Importing this
package needs vLLM only for ``PrefixCacheConnector``.
"""

from __future__ import annotations

from typing import Any

from .layout import (
    PageGeometry,
    base_namespace,
    geometry_for_model,
    geometry_from_config,
    request_namespace,
)

__all__ = [
    "PageGeometry",
    "PrefixCacheConnector",
    "base_namespace",
    "geometry_for_model",
    "geometry_from_config",
    "request_namespace",
]


def __getattr__(name: str) -> Any:
    # vLLM loads the connector by getattr(import_module("pfxcache.client.vllm"), "PrefixCacheConnector"):
    # only then is vLLM imported.
    if name in ("PrefixCacheConnector", "PrefixCacheMetadata", "PrefixCacheStats"):
        from . import connector

        return getattr(connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
