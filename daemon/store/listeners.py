"""Who the store tells of its changes: the KV events sink and WATCH's ``touched`` callback.

One ``Listeners`` belongs to a store and is shared by the parts that change pages (evictions,
inserts, namespace deletion): they read it at the moment of a change, so setting or removing a
listener takes effect at once everywhere and costs nothing while none is set.
"""

from __future__ import annotations

from collections.abc import Callable

from .events import StoreEvents


class Listeners:
    """The store's two listeners; None means nobody listens."""

    __slots__ = ("events", "touched")

    def __init__(self) -> None:
        #: Told of every page stored and removed (events.py); None: KV events are off.
        self.events: StoreEvents | None = None
        #: Called with a namespace's name when a page enters or leaves it, or its expiry changes
        #: (what WATCH watches); None: nobody watches (the daemon sets it only while someone does).
        self.touched: Callable[[bytes], None] | None = None
