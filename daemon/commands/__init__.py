"""Commands as data: the command table and the handlers bound to its rows.

Each command is described by a JSON file in ``defs/`` (Redis's
``src/commands/*.json`` schema). Dispatch, arity errors and the ``COMMAND``
family all derive from those rows. A handler is a function marked with
:func:`handles`; it receives ``(ctx, argv)``, where ``ctx`` is the
connection's :class:`~pfxcache.daemon.commands.context.Context` and ``argv`` is the full
argument list including the command name (as in Redis), and returns a reply
value (see :mod:`pfxcache.protocol.replies`). A handler may be ``async``.

An ``async`` handler that usually has nothing to wait for (PFXGET, PFXSET: a
shard lock nobody holds, a small copy) may also have a synchronous attempt,
marked with :func:`handles_now`: dispatch runs it first, and awaits the
handler only when the attempt returns ``LATER`` (it changed nothing). A
request then costs a plain call instead of a chain of coroutines and the
lock's scheduler checkpoints.
"""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def handles(*fullnames: str) -> Callable[[F], F]:
    """Mark a function as the handler of the command(s) ``fullnames``.

    Names are lowercase Redis full names: ``"ping"``, ``"client|id"``.
    """

    def mark(fn: F) -> F:
        existing = getattr(fn, "handles", ())
        fn.handles = tuple(existing) + fullnames  # type: ignore[attr-defined]
        return fn

    return mark


def handles_now(*fullnames: str) -> Callable[[F], F]:
    """Mark a function as the synchronous attempt of the async handler of ``fullnames``.

    It returns the reply, or :data:`~pfxcache.daemon.commands.context.LATER`
    when the command has to wait: it must then have changed nothing, and the
    async handler runs the command from the start.
    """

    def mark(fn: F) -> F:
        existing = getattr(fn, "handles_now", ())
        fn.handles_now = tuple(existing) + fullnames  # type: ignore[attr-defined]
        return fn

    return mark
