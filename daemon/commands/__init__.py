"""Commands as data: the command table and the handlers bound to its rows.

Each command is described by a JSON file in ``defs/`` (Redis's
``src/commands/*.json`` schema). Dispatch, arity errors and the ``COMMAND``
family all derive from those rows. A handler is a function marked with
:func:`handles`; it receives ``(ctx, argv)``, where ``ctx`` is the
connection's :class:`~pfxcache.daemon.commands.context.Context` and ``argv`` is the full
argument list including the command name (as in Redis), and returns a reply
value (see :mod:`pfxcache.protocol.replies`). A handler may be ``async``.
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
