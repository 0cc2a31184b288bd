"""The disk tier: pages the arena evicts, kept in fixed-slot segment files and read back on a hit.

This package is the I/O half and uses only the standard library (and the optional ``crc32c``
package): ``format`` says what the bytes on disk are, ``files`` (:class:`TierFiles`) reads and
writes them in runs of slots and verifies everything it reads, ``faults`` injects disk errors
and delays for tests. Its calls block; the daemon makes them from worker threads.
"""

from __future__ import annotations

from .faults import Faults
from .files import TierFiles, TierPathError
from .format import RecordHeader

__all__ = ["Faults", "RecordHeader", "TierFiles", "TierPathError"]
