"""Who the store tells of its changes: the KV events sink, WATCH's ``touched`` callback and a lower tier.

One ``Listeners`` belongs to a store and is shared by the parts that change pages (evictions,
inserts, namespace deletion): they read it at the moment of a change, so setting or removing a
listener takes effect at once everywhere and costs nothing while none is set.
"""

from __future__ import annotations

from collections.abc import Callable

from .events import StoreEvents


class Listeners:
    """The store's two listeners; None means nobody listens."""

    __slots__ = ("demote", "events", "forget", "stored", "touched")

    def __init__(self) -> None:
        #: Told of every page stored and removed (events.py); None: KV events are off.
        self.events: StoreEvents | None = None
        #: Called with a namespace's name when a page enters or leaves it, or its expiry changes
        #: (what WATCH watches); None: nobody watches (the daemon sets it only while someone does).
        self.touched: Callable[[bytes], None] | None = None
        #: Told of pages the eviction policy is about to take out of RAM, before they go, with
        #: ``(namespace, node, k)``: the last k pages of ``node`` (a leaf). The disk tier sets it to
        #: keep a copy of them; None: no lower tier (PFXEVICT's and FLUSHALL's drops never call it).
        self.demote: Callable[[bytes, object, int], None] | None = None
        #: Told of pages an insert just stored, with ``(namespace, node, k)``: the last k pages of
        #: ``node``. A write-through tier sets it; None: nobody copies new pages.
        self.stored: Callable[[bytes, object, int], None] | None = None
        #: Told of a namespace deleted (DEL, UNLINK, an expiry): a lower tier drops its pages.
        self.forget: Callable[[bytes], None] | None = None
