"""What memory this host can still give the daemon, read before the arena is reserved.

The shm arena is reserved in full at startup (``posix_fallocate`` of its
memfd), and the memory arena is touched page by page as it fills. A
``maxmemory`` the host cannot back therefore does not fail cleanly: the kernel
hands out pages until it runs short, then its OOM killer ends a process,
often another one (a neighbouring daemon) before this one. So the daemon
compares the arena's size with what the host can give *before* it allocates
anything, and refuses to start when it does not fit, as a startup error.

What the host can give is the tightest of these limits:

* the machine: ``MemAvailable + SwapFree`` of ``/proc/meminfo`` (the kernel's
  own estimate of what can be allocated without swapping out what others use,
  plus swap the arena's pages could go to);
* every memory cgroup the process sits in, up to the hierarchy's root:
  cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``, less what the cgroup
  uses (``memory.current`` / ``memory.usage_in_bytes``) without its inactive
  page cache, which the kernel reclaims before it would kill (the working set,
  as container runtimes compute it).

The memfd arena lives in the kernel's internal tmpfs, not in ``/dev/shm``:
the size of ``/dev/shm`` (64 MiB in a default container) does not bound it,
while its pages count in ``MemAvailable`` and are charged to the cgroup, both
read here. A limit whose file cannot be read is left out: the check refuses
only what it can show will not fit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pfxcache.daemon.observability.info import human_bytes

__all__ = ["HostLimit", "host_limits", "shortfall"]

#: cgroup v1 writes "no limit" as the largest page-aligned long; anything this large is no limit.
UNLIMITED = 1 << 62


@dataclass(frozen=True, slots=True)
class HostLimit:
    """One bound on the memory the process can still get: what it is, and how many bytes."""

    source: str
    available: int

    def __str__(self) -> str:
        return f"{human_bytes(self.available)} ({self.source})"


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:  # "max": no limit
        return None


def _stat_field(directory: str, name: str) -> int:
    """One field of a cgroup's memory.stat (0 when absent)."""
    for line in (_read(os.path.join(directory, "memory.stat")) or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0


def _machine_limit(proc: str) -> HostLimit | None:
    fields: dict[str, int] = {}
    for line in (_read(os.path.join(proc, "meminfo")) or "").splitlines():
        key, _, rest = line.partition(":")
        words = rest.split()
        if words and words[0].isdigit():
            fields[key] = int(words[0]) * (1024 if words[1:] == ["kB"] else 1)
    if "MemAvailable" not in fields:
        return None
    return HostLimit("MemAvailable + SwapFree", fields["MemAvailable"] + fields.get("SwapFree", 0))


def _ancestors(mount: str, path: str) -> list[str]:
    """The cgroup's directory under ``mount`` and each parent up to the mount, those that exist.

    Inside a container the path /proc names may not exist under the mount (the mount is the
    container's own cgroup): then the mount itself is the nearest directory there is.
    """
    parts = [part for part in path.split("/") if part]
    dirs = [os.path.join(mount, *parts[:depth]) for depth in range(len(parts), -1, -1)]
    return [directory for directory in dirs if os.path.isdir(directory)]


def _cgroup_limits(proc: str, cgroup_fs: str) -> list[HostLimit]:
    limits: list[HostLimit] = []
    for line in (_read(os.path.join(proc, "self", "cgroup")) or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2: memory.max, memory.current
            for mount in (cgroup_fs, os.path.join(cgroup_fs, "unified")):
                if not os.path.exists(os.path.join(mount, "cgroup.controllers")):
                    continue
                for directory in _ancestors(mount, path):
                    limit = _read_int(os.path.join(directory, "memory.max"))
                    used = _read_int(os.path.join(directory, "memory.current"))
                    if limit is not None and used is not None and limit < UNLIMITED:
                        working_set = max(0, used - _stat_field(directory, "inactive_file"))
                        limits.append(HostLimit(f"cgroup {directory}: memory.max less its working set",
                                                max(0, limit - working_set)))
        elif "memory" in controllers.split(","):  # v1: memory.limit_in_bytes, memory.usage_in_bytes
            for mount in (os.path.join(cgroup_fs, "memory"), os.path.join(cgroup_fs, controllers)):
                for directory in _ancestors(mount, path):
                    limit = _read_int(os.path.join(directory, "memory.limit_in_bytes"))
                    used = _read_int(os.path.join(directory, "memory.usage_in_bytes"))
                    if limit is not None and used is not None and limit < UNLIMITED:
                        working_set = max(0, used - _stat_field(directory, "total_inactive_file"))
                        limits.append(HostLimit(f"cgroup {directory}: memory.limit_in_bytes less its working set",
                                                max(0, limit - working_set)))
                if os.path.isdir(mount):
                    break
    return limits


def host_limits(proc: str = "/proc", cgroup_fs: str = "/sys/fs/cgroup") -> list[HostLimit]:
    """Every bound this host puts on the memory the process can still get (the roots are
    parameters so that tests can give a machine of their own)."""
    machine = _machine_limit(proc)
    return ([machine] if machine is not None else []) + _cgroup_limits(proc, cgroup_fs)


def shortfall(nbytes: int, limits: list[HostLimit]) -> HostLimit | None:
    """The tightest limit ``nbytes`` exceeds, or None when they fit under every one."""
    tight = min(limits, key=lambda limit: limit.available, default=None)
    return tight if tight is not None and nbytes > tight.available else None
