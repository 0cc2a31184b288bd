"""Client library for inference workers (built on redis-py).

>>> from pfxcache.client import PrefixCache
>>> cache = PrefixCache.from_url("redis://127.0.0.1:6390/0")
>>> with cache.lookup("llama3-8b", prompt_ids) as match:   # doctest: +SKIP
...     cache.arena.read_into(match.blocks, kv_buffer)       # zero-copy arena, or match.data over RESP

Layout (like redis-py's module commands): :mod:`.commands` builds arguments,
:mod:`.replies` decodes replies into the dataclasses re-exported here,
:mod:`.core` describes every operation once as the requests it sends (what
both clients share), :mod:`.cache` holds the two front ends (blocking and
asyncio) that send them, :mod:`.errors` maps the daemon's errors to
exceptions, :mod:`.arena` maps the daemon's shared-memory arena.
"""

from .arena import ShmArenaView, kv_buffer, open_arena
from .cache import AsyncPrefixCache, PrefixCache
from .commands import pack_tokens
from .errors import AttachError, CacheFullError, LeaseLostError, NoPrefixError, PrefixCacheError
from .replies import Allocation, EvictResult, Info, Match, StoreResult

__all__ = [
    "Allocation",
    "AsyncPrefixCache",
    "AttachError",
    "CacheFullError",
    "EvictResult",
    "Info",
    "LeaseLostError",
    "Match",
    "NoPrefixError",
    "PrefixCache",
    "PrefixCacheError",
    "ShmArenaView",
    "StoreResult",
    "kv_buffer",
    "open_arena",
    "pack_tokens",
]
