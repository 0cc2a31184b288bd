"""PFXTIER: the operator's commands on the tiers under the arena (an admin container, like Redis's
MEMORY or SLOWLOG).

* ``PFXTIER DROP <namespace>``: every page of the namespace removed from the **shared** tier, the
  whole fleet's (service/remote_tier.py ``drop_shared``: a SCAN of each primary, UNLINKs in
  bounded pipelines, in a worker thread). The reply is the number of keys removed. The local
  tiers are not touched: ``PFXEVICT <namespace> ALL`` drops RAM and disk, here. An -ERR when no
  shared tier is configured, when it is not connected, or when a primary cannot be scanned.
* ``PFXTIER FLUSH [milliseconds]``: wait until the write queues (shared tier, disk tier) are written
  out, at most the timeout (default: ``remote-tier-shutdown-flush``, or 10 seconds with the disk
  tier alone). The reply is a map per tier: the pages ``written``, ``dropped`` meanwhile and still
  ``queued`` (the shared tier), ``queued`` (the disk tier).
* ``PFXTIER INFO``: PFXINFO's ``tiers`` maps, and the shared tier's cluster node by node (address,
  role, state, errors). PFXINFO is a tenant's command (@pfx, read-only, its own namespaces); node
  addresses and operations on the fleet's pages are the operator's, so they live here, @admin.

Every subcommand awaits: the loop and the other clients go on meanwhile.
"""

from __future__ import annotations

from typing import Any

import trio

from pfxcache.protocol.replies import Error

from pfxcache.daemon.service.remote_tier import RemoteTierService
from pfxcache.daemon.service.tier_chain import tiers_of
from pfxcache.daemon.service.tiering import TierService
from . import handles
from .context import Context
from .introspection import help_reply

#: The longest PFXTIER FLUSH wait a client may ask for: an hour.
MAX_FLUSH_MS = 3600 * 1000
#: PFXTIER FLUSH's wait with the disk tier alone.
DISK_FLUSH_S = 10.0
DRAIN_POLL_S = 0.005

_HELP = (
    "DROP <namespace>",
    "    Remove every page of <namespace> from the shared tier (every daemon's); reply: keys removed.",
    "FLUSH [<milliseconds>]",
    "    Write the tiers' queues out now, waiting at most <milliseconds>; reply: written, dropped, queued.",
    "INFO",
    "    The tiers' figures and the shared tier's cluster nodes (address, role, state, errors).",
)


def _tiers(ctx: Context) -> list[Any]:
    return tiers_of(ctx.server.prefix.tier)


def _remote(ctx: Context) -> RemoteTierService | None:
    return next((t for t in _tiers(ctx) if isinstance(t, RemoteTierService)), None)


def _disk(ctx: Context) -> TierService | None:
    return next((t for t in _tiers(ctx) if isinstance(t, TierService)), None)


@handles("pfxtier|help")
def pfxtier_help(ctx: Context, argv: list[bytes]) -> Any:
    return help_reply(argv[0], _HELP)


@handles("pfxtier|drop")
async def pfxtier_drop(ctx: Context, argv: list[bytes]) -> Any:
    remote = _remote(ctx)
    if remote is None:
        return Error("ERR PFXTIER DROP: no shared tier is configured (remote-tier)")
    if not argv[2]:
        return Error("ERR PFXTIER DROP: the namespace is empty")
    try:
        return await remote.drop_shared(argv[2])
    except RuntimeError as exc:
        return Error(f"ERR PFXTIER DROP: {exc}")
    except Exception as exc:  # what redis-py raises: a primary could not be scanned
        return Error("ERR PFXTIER DROP failed: " + remote.target.scrub(f"{type(exc).__name__}: {exc}")
                     .replace("\r", " ").replace("\n", " "))


@handles("pfxtier|flush")
async def pfxtier_flush(ctx: Context, argv: list[bytes]) -> Any:
    if len(argv) > 3:
        return Error("ERR syntax error")
    remote, disk = _remote(ctx), _disk(ctx)
    if remote is None and disk is None:
        return Error("ERR PFXTIER FLUSH: no tier is configured (remote-tier, disk-tier-size)")
    timeout_s = remote.shutdown_flush_s if remote is not None else DISK_FLUSH_S
    if len(argv) == 3:
        raw = argv[2]
        if not raw.isdigit() or len(raw) > 10 or int(raw) > MAX_FLUSH_MS:
            return Error(f"ERR timeout must be an integer between 0 and {MAX_FLUSH_MS} milliseconds")
        timeout_s = int(raw) / 1000
    reply: dict = {}
    with trio.move_on_after(timeout_s):  # the disk tier's queue, then the shared tier's, one deadline
        deadline = trio.current_time() + timeout_s
        if disk is not None:
            while _disk_queued(disk):
                await trio.sleep(DRAIN_POLL_S)
        if remote is not None:
            reply["remote"] = await remote.write_out(max(0.0, deadline - trio.current_time()))
    if disk is not None:
        reply["disk"] = {"queued": _disk_queued(disk)}
    if remote is not None and "remote" not in reply:
        reply["remote"] = await remote.write_out(0)
    return reply


def _disk_queued(disk: TierService) -> int:
    return dict(disk.info())["tier_disk_queue_pages"]


@handles("pfxtier|info")
def pfxtier_info(ctx: Context, argv: list[bytes]) -> Any:
    reply: dict = {}
    for tier in _tiers(ctx):
        reply.update(tier.describe())
        if isinstance(tier, RemoteTierService):
            reply["remote"]["nodes"] = tier.nodes.describe()
    return reply
