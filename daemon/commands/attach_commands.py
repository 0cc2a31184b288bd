"""PFXATTACH: the arena partitions a local worker may map, handed over the unix socket.

The reply is the layout of what is sent; the descriptors themselves go with the reply's bytes
as SCM_RIGHTS ancillary data (the connection writes them: fd_passing.py). Which partitions a
user gets, and whether read-only, is arena_grants.py's rule. Over TCP, or for an arena that is
not shared memory, nothing can be passed: -ERR, and nothing changes.
"""

from __future__ import annotations

import os
from typing import Any

from pfxcache.protocol.replies import Error

from pfxcache.daemon.security.arena_grants import grants
from . import handles
from .context import Context

#: Descriptors one connection may have waiting to go out with its next write (SCM_MAX_FD is 253).
MAX_PENDING_FDS = 128


@handles("pfxattach")
def pfxattach(ctx: Context, argv: list[bytes]) -> Any:
    client = ctx.client
    if not client.is_unix:
        return Error("ERR PFXATTACH works only on the unix socket (the unixsocket directive): descriptors "
                     "cannot cross TCP; over TCP use PFXGET WITHDATA and PFXSET DATA")
    if client.pubsub is not None:  # its push writer shares the socket: the descriptors could land mid-frame
        return Error("ERR PFXATTACH is not allowed on a subscribed connection: attach on a connection of its own")
    if client.mute:  # CLIENT REPLY OFF/SKIP: the descriptors would arrive with no layout to say what they are
        return Error("ERR PFXATTACH needs its reply: not under CLIENT REPLY OFF or SKIP")
    service = ctx.server.prefix
    layout = service.attach_layout()
    if layout is None:
        return Error(f"ERR PFXATTACH needs the shm arena (this daemon's is {service.arena.backend})")
    granted = grants(ctx.server.acl.users.get(client.user), layout)
    if len(client.outgoing_fds) + len(granted) > MAX_PENDING_FDS:
        return Error("ERR too many PFXATTACH in one pipeline: read the replies first")
    fds = []
    try:
        for grant in granted:
            fds.append(service.arena.open_partition(grant.number, grant.writable))
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        return Error(f"ERR cannot open the arena partition: {exc.strerror}")
    client.outgoing_fds += fds
    arena = service.arena
    return {
        "arena-id": arena.id,
        "block-bytes": arena.block_bytes,
        "nblocks": arena.nblocks,
        "partitions": [{"pattern": grant.pattern, "first-block": grant.first_block, "nblocks": grant.nblocks,
                        "access": "rw" if grant.writable else "ro"} for grant in granted],
    }
