"""An insert in flight: what begin_insert reserved and pinned, until commit_insert or abort_insert ends it."""

from __future__ import annotations

class InsertPlan:
    """An insert between begin_insert and commit_insert/abort_insert.

    The daemon copies the data of the new pages into ``new_blocks`` (in DATA
    mode: ``arena.write(plan.new_blocks, plan.new_data(data))``), possibly in a
    worker thread: those blocks belong to the plan alone until it ends. The
    cached prefix is pinned meanwhile.
    """

    __slots__ = (
        "_block_bytes",
        "done",
        "dup_blocks",
        "id",
        "new_blocks",
        "node",
        "npages",
        "ns",
        "offset_pages",
        "owner",
        "shard",
        "sources",
        "start",
        "tokens",
        "tree",
    )

    def __init__(self, plan_id, ns, shard, owner, tree, node, tokens, npages, offset_pages, start, block_bytes):
        self.id = plan_id
        self.ns = ns
        self.shard = shard
        self.owner = owner
        self.tree = tree
        self.node = node  # pinned: the cached prefix ends exactly at this node
        self.tokens = tokens
        self.npages = npages
        self.offset_pages = offset_pages
        self.start = start  # first page not cached at begin time
        self.new_blocks: list[int] = []  # blocks for pages start..npages-1 (state LEASED)
        self.dup_blocks: list[int] = []  # BLOCKS mode: given blocks of pages already cached
        self.sources: list[int] | None = None  # BLOCKS mode: lease id of each given block, for abort
        self.done = False
        self._block_bytes = block_bytes

    @property
    def copy_needed(self) -> bool:
        """False in BLOCKS mode: the writer already filled its blocks."""
        return self.sources is None and bool(self.new_blocks)

    @property
    def new_pages(self) -> range:
        """Indices, counted from the offset, of the pages whose data goes into new_blocks."""
        return range(self.start - self.offset_pages, self.npages - self.offset_pages)

    @property
    def existing(self) -> int:
        """Pages from the offset that were cached already at begin time."""
        return self.start - self.offset_pages

    def new_data(self, data) -> memoryview:
        """The slice of DATA (all pages from the offset) that belongs to the new pages."""
        bb = self._block_bytes
        return memoryview(data)[(self.start - self.offset_pages) * bb : (self.npages - self.offset_pages) * bb]

