"""Log each distinct cause once: a dead daemon or a refused key must not fill vLLM's log at every step."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("pfxcache.vllm")


class LogOnce:
    """``warn(cause, message, *args)`` logs the first time ``cause`` is seen; ``forget(cause)`` re-arms it."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, cause: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        if cause not in self._seen:
            self._seen.add(cause)
            log.log(level, message, *args)

    def forget(self, cause: str) -> None:
        self._seen.discard(cause)
