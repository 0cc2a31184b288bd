"""Where the daemon's memory goes: the arena, the metadata indexing it, and the process around both.

``maxmemory`` sizes the arena only: it is cut into ``maxmemory // block-bytes``
blocks, reserved at start-up. Everything else the process holds is on top of
it, and is reported rather than hidden:

* **arena**: ``arena_bytes`` reserved for blocks; ``dataset_bytes`` of them
  hold KV data now (blocks in use x block-bytes); ``arena_resident_bytes`` of
  the shared-memory arena are resident in this process (the pages it touched).
* **heap**: the process's private memory (Python objects: the radix trees,
  leases, the eviction index, the block allocator). ``startup_heap_bytes`` is
  what it was once the empty store existed; the growth since is the
  ``metadata_bytes`` the cached pages cost, also given per cached page.
* **process**: ``rss_bytes``, everything resident (heap + touched arena pages
  + code).

The figures come from their owners (the store for blocks and pages, the
arena for its size, ``/proc/self/status`` for the process) and cost one small
file read: INFO, MEMORY STATS and the metrics endpoint read them on demand.
Redis's names map onto them as INFO shows: ``used_memory`` = dataset + heap
(``used_memory_dataset`` + ``used_memory_overhead``), ``used_memory_rss`` =
rss, ``used_memory_startup`` = the start-up heap.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MemoryAccount", "MemoryFigures", "process_status"]


def process_status() -> dict[str, int]:
    """The memory lines of /proc/self/status in bytes: VmRSS, RssAnon, RssFile, RssShmem (empty off Linux)."""
    figures: dict[str, int] = {}
    try:
        with open("/proc/self/status") as file:
            for line in file:
                if line.startswith(("VmRSS:", "RssAnon:", "RssFile:", "RssShmem:", "VmPeak:", "VmHWM:")):
                    name, value = line.split(":", 1)
                    figures[name] = int(value.split()[0]) * 1024  # the kernel writes kB
    except OSError:
        pass
    return figures


@dataclass(frozen=True)
class MemoryFigures:
    """One reading of where the memory goes (bytes); see the module docstring."""

    arena_bytes: int
    dataset_bytes: int
    arena_resident_bytes: int
    heap_bytes: int
    startup_heap_bytes: int
    allocator_bytes: int
    rss_bytes: int
    pages: int
    peak_bytes: int

    @property
    def metadata_bytes(self) -> int:
        """What the cached pages' index costs: the heap's growth since start-up (never below 0)."""
        return max(self.heap_bytes - self.startup_heap_bytes, 0)

    @property
    def metadata_per_page(self) -> float:
        """Metadata bytes per cached page (0 with nothing cached)."""
        return self.metadata_bytes / self.pages if self.pages else 0.0

    @property
    def used_bytes(self) -> int:
        """Redis's ``used_memory``: the KV data held plus everything the process allocated besides."""
        return self.dataset_bytes + self.heap_bytes

    def fields(self) -> dict[str, int | float]:
        """Every figure by name (what MEMORY STATS and the metrics endpoint show)."""
        return {
            "arena_bytes": self.arena_bytes,
            "dataset_bytes": self.dataset_bytes,
            "arena_resident_bytes": self.arena_resident_bytes,
            "heap_bytes": self.heap_bytes,
            "startup_heap_bytes": self.startup_heap_bytes,
            "metadata_bytes": self.metadata_bytes,
            "metadata_per_page": self.metadata_per_page,
            "allocator_bytes": self.allocator_bytes,
            "rss_bytes": self.rss_bytes,
            "used_bytes": self.used_bytes,
            "peak_bytes": self.peak_bytes,
        }


class MemoryAccount:
    """The memory figures of one prefix store and its process; made once the store exists."""

    def __init__(self, store) -> None:
        self.store = store
        self.startup_heap = self._heap(process_status())
        self.peak = 0

    def mark_startup(self) -> None:
        """Take the heap now as the start-up baseline (the server calls it once everything is set up)."""
        self.startup_heap = self._heap(process_status())

    @staticmethod
    def _heap(status: dict[str, int]) -> int:
        # Both arenas are shared mappings (a memfd, or mmap(-1)'s MAP_SHARED anonymous
        # memory for "memory"), so their pages count in RssShmem, never in RssAnon.
        return status.get("RssAnon", 0)

    def figures(self) -> MemoryFigures:
        """Read the figures now (raising the peak of ``used_bytes`` when it is higher)."""
        store = self.store
        status = process_status()
        stats = store.stats()
        figures = MemoryFigures(
            arena_bytes=store.arena.size,
            dataset_bytes=stats["blocks_used"] * store.block_bytes,
            arena_resident_bytes=status.get("RssShmem", 0),
            heap_bytes=self._heap(status),
            startup_heap_bytes=self.startup_heap,
            allocator_bytes=store.allocator_bytes,
            rss_bytes=status.get("VmRSS", 0),
            pages=stats["pages"],
            peak_bytes=self.peak,
        )
        if figures.used_bytes > self.peak:
            self.peak = figures.used_bytes
            figures = MemoryFigures(**{**figures.__dict__, "peak_bytes": self.peak})
        return figures
