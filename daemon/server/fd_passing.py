"""Writing replies that carry file descriptors (PFXATTACH's partitions) as SCM_RIGHTS.

A handler puts descriptors on ``client.outgoing_fds``; the connection then writes its buffered
replies through :func:`send_with_fds`, which attaches them to the first bytes it sends (a unix
stream socket delivers them with whatever read first takes those bytes), and closes its own
copies whatever happens: the worker's are new descriptors of the same memory.
"""

from __future__ import annotations

import array
import os
import socket
from typing import Any

from trio.lowlevel import wait_writable

from pfxcache.protocol.replies import ReplyBuffer

from pfxcache.daemon.server.clients import Client


def discard_fds(client: Client) -> None:
    """Close descriptors that never went out (the connection ended first)."""
    fds, client.outgoing_fds = client.outgoing_fds, []
    for fd in fds:
        os.close(fd)


async def send_with_fds(client: Client, sock: socket.socket, out: ReplyBuffer, stats: Any) -> None:
    """Write ``out`` with ``client.outgoing_fds`` attached (OSError when the peer is gone)."""
    fds, client.outgoing_fds = client.outgoing_fds, []
    try:
        if not len(out):  # the reply was muted (CLIENT REPLY OFF): nothing to carry them
            return
        data = b"".join(out.take())
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        view = memoryview(data)
        sent = 0
        while sent < len(data):
            try:
                # The descriptors go with the first bytes only; the rest is plain data.
                sent += sock.sendmsg([view[sent:]], ancillary) if ancillary else sock.send(view[sent:])
                ancillary = []
            except BlockingIOError:
                await wait_writable(sock)
        stats.total_net_output_bytes += sent
        stats.total_writes_processed += 1
    finally:
        for fd in fds:
            os.close(fd)
