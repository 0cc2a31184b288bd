"""The radix tree of one (namespace, shard): cached pages of token sequences.

Tokens are packed little-endian uint32 bytes; a page is ``page_bytes`` of them
and only whole pages are cached. Every edge holds a run of whole pages (its
``key``) and one arena block id per page (``blocks``: in the store an
``array('q')``, 8 bytes a page and no Python int per page, usually a BlockRun
that knows the runs of ids it is made of, so evicting a node hands the
allocator its runs, never its ids one by one). A node's blocks are never
changed in place, only replaced (path_nodes relies on it). Children are found by
the bytes of their first page, so a lookup costs one dict probe and one
C-level bytes comparison per edge: match cost grows with the prompt, never
with the number of cached pages.

Pins (``lock_ref``) walk to the root as in SGLang: a node is pinned while it
or any descendant is leased, so the unpinned nodes are exactly whole subtrees
and every unpinned page can be evicted leaf first.

The tree keeps its ``index`` (policies.EvictionIndex) informed of every node
that enters or leaves the set of unpinned leaves, and of every cut edge (the
policy's node state follows the pages: policy.py); it never decides what to
evict itself.
"""

from __future__ import annotations

from array import array

from .block_ids import BlockPath, BlockRun

#: What an evicted node whose blocks were a run holds: a run never grows, so one empty one serves all.
_NO_BLOCKS = BlockRun()


class Totals:
    """Page counters shared by all trees (the store's global view)."""

    __slots__ = ("pages", "ticks", "unpinned")

    def __init__(self) -> None:
        self.pages = 0  # cached pages (= blocks in state TREE)
        self.unpinned = 0  # pages of nodes with lock_ref == 0: all evictable, leaf first
        # Logical clock: one tick per lookup or insert. Reuse gaps are measured in
        # ticks, not seconds, so a replay in process and one through the daemon
        # see the same gaps.
        self.ticks = 0


class Node:
    """An edge of the tree and the node below it (the root has an empty key)."""

    __slots__ = (
        "page_hashes",
        "blocks",
        "blocks_encoded",
        "blocks_list",
        "children",
        "evictable",
        "freq",
        "gap",
        "idents",
        "key",
        "last_access",
        "lock_ref",
        "parent",
        "policy_data",
        "tick",
        "tree",
        "version",
    )

    def __init__(self, tree: RadixTree, parent: Node | None, key: bytes, blocks, now: float) -> None:
        self.tree = tree
        self.parent = parent
        self.key = key  # whole pages of packed tokens
        self.blocks = blocks  # one arena block per page of key (a sliceable sequence: the store's are array('q'))
        # The block ids as replies carry them, cached by the daemon (opaque bytes to the store),
        # so a hot path is encoded once, not per request; None whenever ``blocks`` changes.
        self.blocks_encoded: bytes | None = None
        # Unused (always None): paths are joined from ``blocks`` (arrays) with one copy per node
        # (BlockPath), so no node keeps a list of ints any more; the slot stays for the tools that
        # size a node's fields.
        self.blocks_list: list[int] | None = None
        self.children: dict[bytes, Node] = {}  # first page of the child's key -> child
        self.lock_ref = 0  # leases/plans pinning this node or a descendant
        self.last_access = now
        self.freq = 0  # hits (matches through this node)
        self.tick = tree.totals.ticks if parent is not None else 0  # logical time of the last access
        self.gap = 0  # ticks between the two latest accesses, measured at the latest hit (0: never hit)
        # Owned by the eviction policy (policy.py: what it knows of the node); None until it sets it.
        self.policy_data = None
        self.version = 0  # bumped on every change of eviction-index membership or priority
        self.evictable = False  # mirrors membership in the eviction index
        self.page_hashes = None  # KV events: the pages' block hashes, 8 bytes each (block_hashes.py)
        self.idents = None  # tiers: the pages' idents, 16 bytes each (idents.py)

    @property
    def pages(self) -> int:
        return len(self.blocks)

    def __repr__(self) -> str:
        return f"Node(pages={len(self.blocks)}, children={len(self.children)}, lock_ref={self.lock_ref})"


class RadixTree:
    """One tree; ``scope`` is the namespace it belongs to, ``shard`` its shard number."""

    def __init__(self, page_bytes: int, index, totals: Totals, scope: bytes = b"", shard: int = 0) -> None:
        self.page_bytes = page_bytes
        self.index = index
        self.totals = totals
        self.scope = scope
        self.shard = shard
        self.root = Node(self, None, b"", [], 0.0)
        self.pages = 0
        self.unpinned = 0
        self.nodes = 0  # excluding the root
        # A namespace of key pages (page_keys.py): which node holds each page, so a lookup can
        # start where a chain's first key is held, not only at the root. None for token pages.
        self.keys: dict[bytes, Node] | None = None
        index.attach(self)

    def _count(self, pages: int, unpinned: int) -> None:
        self.pages += pages
        self.unpinned += unpinned
        self.totals.pages += pages
        self.totals.unpinned += unpinned

    # -- lookup -----------------------------------------------------------------------------

    def walk(self, tokens: bytes, npages: int, node: Node | None = None, pages: int = 0
             ) -> tuple[Node, int, Node | None, int]:
        """Longest cached prefix of the first ``npages`` pages, without changing anything.

        Starts at the root, or at ``node`` whose path covers the first ``pages`` pages.
        Returns ``(node, pages, child, extra)``: the path to ``node`` covers
        ``pages`` pages; ``child`` (or None) matches ``extra`` more pages of
        its edge, 0 < extra < child.pages.
        """
        P = self.page_bytes
        end = npages * P
        if node is None:
            node, pages = self.root, 0
        pos = pages * P
        children_get = node.children.get
        while pos < end:
            child = children_get(tokens[pos : pos + P])
            if child is None:
                break
            key = child.key
            if tokens.startswith(key, pos, end):  # whole edge: one memcmp
                pos += len(key)
                pages += len(child.blocks)
                node = child
                children_get = node.children.get
                continue
            # Partial edge: binary search the matching pages (first page matched via the dict).
            kv = memoryview(key)
            lo, hi = 1, min(len(key), end - pos) // P
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if tokens.startswith(kv[: mid * P], pos):
                    lo = mid
                else:
                    hi = mid - 1
            return node, pages, child, lo
        return node, pages, None, 0

    def split(self, child: Node, m: int) -> Node:
        """Cut ``child``'s edge after ``m`` pages; returns the new upper node (the cut is semantic no-op)."""
        P = self.page_bytes
        cut = m * P
        parent = child.parent
        top = Node(self, parent, child.key[:cut], child.blocks[:m], child.last_access)
        top.freq = child.freq
        top.tick = child.tick
        top.gap = child.gap
        top.lock_ref = child.lock_ref  # every pin through child also passes through top
        if child.page_hashes is not None:  # each page keeps its block hash
            top.page_hashes, child.page_hashes = child.page_hashes[: m * 8], child.page_hashes[m * 8 :]
        if child.idents is not None:
            top.idents, child.idents = child.idents[: m * 16], child.idents[m * 16 :]
        self.index.split(top, child, m)  # the policy's state of the upper part (what it keeps per page: cut)
        parent.children[top.key[:P]] = top
        keys = self.keys
        if keys is not None:
            for pos in range(0, cut, P):
                if keys.get(child.key[pos : pos + P]) is child:
                    keys[child.key[pos : pos + P]] = top
        child.key = child.key[cut:]
        child.blocks = child.blocks[m:]
        child.blocks_encoded = None
        child.parent = top
        top.children[child.key[:P]] = child
        self.nodes += 1
        # child keeps its evictability and priority (same last_access/freq): its index entries stay valid.
        return top

    def locate(self, tokens: bytes, npages: int) -> tuple[Node, int]:
        """Like walk(), but split a partially matched edge so the match ends exactly at a node."""
        node, pages, child, extra = self.walk(tokens, npages)
        if child is not None:
            node = self.split(child, extra)
            pages += extra
        return node, pages

    @staticmethod
    def path_blocks(node: Node) -> BlockPath:
        """Block ids of every page from the root down to the end of ``node`` (with the path's nodes).

        One copy of each node's array: the cost per page is a memcpy of 8 bytes.
        """
        nodes = []
        while node.parent is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        out = BlockPath()
        extend = out.extend
        for part in nodes:
            ids = part.blocks
            if not isinstance(ids, array):  # a tree built outside the store (lists): converted per page
                ids = array("q", ids)
            extend(ids)
        out.nodes = nodes
        return out

    @staticmethod
    def path_nodes(node: Node) -> tuple[list[Node], list]:
        """The nodes from the root down to ``node`` (root side first) and their blocks as they are now.

        A node's blocks are never changed in place, only replaced (a split or trim gives it a new
        array), so joining those arrays later gives the path's ids as they were at this call: an
        insert's result joins them only if its ``blocks`` are read.
        """
        nodes = []
        while node.parent is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes, [part.blocks for part in nodes]

    @staticmethod
    def depth_pages(node: Node) -> int:
        """Pages from the root to the end of ``node``."""
        n = 0
        while node.parent is not None:
            n += len(node.blocks)
            node = node.parent
        return n

    # -- access statistics and pins -----------------------------------------------------------

    def touch(self, node: Node, now: float, hit: bool) -> None:
        """Record an access of the path ending at ``node`` at the current tick.

        A hit also counts frequency and measures each node's reuse gap (ticks
        since its previous access).
        """
        index = self.index
        tick = self.totals.ticks
        while node.parent is not None:
            evictable = node.evictable
            if evictable:  # its priority changes: leave and re-enter the index
                index.remove(node)
            node.last_access = now
            if hit:
                node.freq += 1
                if tick > node.tick:
                    node.gap = tick - node.tick
            node.tick = tick
            if evictable:
                index.add(node)
            node = node.parent

    def pin(self, node: Node) -> None:
        """inc_lock_ref: pin ``node`` and its ancestors."""
        index = self.index
        while node.parent is not None:
            if node.lock_ref == 0:
                self._count(0, -len(node.blocks))
                if node.evictable:
                    index.remove(node)
            node.lock_ref += 1
            node = node.parent

    def unpin(self, node: Node) -> None:
        """dec_lock_ref: undo one pin(); nodes dropping to zero become evictable again."""
        index = self.index
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._count(0, len(node.blocks))
                if not node.children:
                    index.add(node)
            node = node.parent

    # -- growth and eviction ------------------------------------------------------------------

    def add_leaf(self, parent: Node, key: bytes, blocks, now: float) -> Node:
        """Hang a new unpinned leaf of whole pages below ``parent`` (no child there starts with key's first page)."""
        node = Node(self, parent, key, blocks, now)
        keys = self.keys
        if keys is not None:
            P = self.page_bytes
            for pos in range(0, len(key), P):
                keys[key[pos : pos + P]] = node
        if parent.evictable:
            self.index.remove(parent)
        parent.children[key[: self.page_bytes]] = node
        self.nodes += 1
        self._count(len(blocks), len(blocks))
        self.index.add(node)
        return node

    def trim(self, node: Node, k: int):
        """Evict the last ``k`` pages of an unpinned leaf; returns their blocks, of the node's own
        sequence type (the caller frees them).

        Removing a whole leaf may turn its parent into an unpinned leaf.
        """
        freed = node.blocks
        n = len(freed)
        if self.keys is not None:
            self._unindex(node, n - k, n)
        if k < n:
            if self.index.evicted is not None:
                self.index.evicted(node, whole=False)
            node.blocks = freed[: n - k]  # replaced, never changed in place (see path_nodes)
            freed = freed[n - k :]
            node.blocks_encoded = None
            node.key = node.key[: (n - k) * self.page_bytes]
            if node.page_hashes is not None:  # the kept pages keep their hashes
                node.page_hashes = node.page_hashes[: (n - k) * 8]
            if node.idents is not None:
                node.idents = node.idents[: (n - k) * 16]
            self.index.trimmed(node, n - k)
            self._count(-k, -k)
            return freed  # same priority, still a leaf: its index entries stay valid
        index = self.index
        if index.evicted is not None:
            index.evicted(node, whole=True)
        index.remove(node)
        parent = node.parent
        children = parent.children
        del children[node.key[: self.page_bytes]]
        node.parent = None
        node.blocks = _NO_BLOCKS if type(freed) is BlockRun else freed[:0]
        node.blocks_encoded = None
        # Stale entries in the policy's orders hold the node until they are dropped or compacted
        # away (five orders under guard): without its pages' bytes, hashes and policy data it is ~300 bytes.
        node.key = b""
        node.page_hashes = node.policy_data = node.idents = None
        self.nodes -= 1
        self.pages -= n
        self.unpinned -= n
        totals = self.totals
        totals.pages -= n
        totals.unpinned -= n
        if not children and not parent.lock_ref and parent.parent is not None:
            index.add(parent, uncovered=True)
        return freed

    def _unindex(self, node: Node, lo: int, hi: int) -> None:
        """Forget where pages lo..hi-1 of ``node`` are (they are leaving it)."""
        keys, P, key = self.keys, self.page_bytes, node.key
        for pos in range(lo * P, hi * P, P):
            page = key[pos : pos + P]
            if keys.get(page) is node:
                del keys[page]

    def walk_keys(self, tokens: bytes, npages: int) -> tuple[Node, int, Node | None, int, int]:
        """:meth:`walk` for a tree of key pages: from the root, or, when the first page is not a
        first page of the tree, from wherever the tree holds it (splitting its edge there).

        Returns ``(node, pages, child, extra, base)`` as walk's, ``pages`` counted from the first page
        of ``tokens``, and ``base``: the pages on the path from the root before that first page
        (0 for a walk from the root). A run found is one path of linked pages: never a hole.
        """
        node, pages, child, extra = self.walk(tokens, npages)
        if pages + extra or self.keys is None or not npages:
            return node, pages, child, extra, 0
        P = self.page_bytes
        first = tokens[:P]
        holder = self.keys.get(first)
        if holder is None:
            return node, 0, None, 0, 0
        pos = 0
        while True:  # the page's place on the holder's edge (a page boundary)
            pos = holder.key.find(first, pos)
            if pos < 0:  # not there after all: the index is kept in step, so never
                return node, 0, None, 0, 0
            if pos % P == 0:
                break
            pos += 1
        page = pos // P
        top = self.split(holder, page + 1) if page + 1 < len(holder.blocks) else holder
        base = self.depth_pages(top) - 1
        node, pages, child, extra = self.walk(tokens, npages, top, 1)
        return node, pages, child, extra, base

    @staticmethod
    def subtree(top: Node) -> list[Node]:
        """``top`` and its descendants, every node after all of its descendants (iterative)."""
        out = []
        stack = [top]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        out.reverse()
        return out

    def drop_subtree(self, top: Node) -> tuple[array, int]:
        """Evict every unpinned page of ``top``'s subtree (leaf first); returns (freed blocks, pinned pages kept)."""
        freed = array("q")
        pinned = 0
        for node in self.subtree(top):
            if node.parent is None:
                continue  # the root holds no pages
            if node.lock_ref == 0:
                freed.extend(self.trim(node, len(node.blocks)))  # its children are gone already
            else:
                pinned += len(node.blocks)
        return freed, pinned

    # -- invariants -----------------------------------------------------------------------------

    def check(self, direct_pins: dict[int, int]) -> tuple[list[str], list[Node]]:
        """Structural violations, given the pins each node receives directly (id(node) -> count).

        Returns (problems, nodes) where nodes are all non-root nodes.
        """
        P = self.page_bytes
        problems: list[str] = []
        nodes = [n for n in self.subtree(self.root) if n.parent is not None]
        pins_below: dict[int, int] = {}
        pages = unpinned = 0
        for node in nodes:  # descendants first: pins_below of children are complete
            where = f"tree {self.scope!r}/{self.shard} node {node!r}"
            if node.tree is not self:
                problems.append(f"{where}: belongs to another tree")
            if not node.key or len(node.key) % P:
                problems.append(f"{where}: key of {len(node.key)} bytes is not whole pages")
            if len(node.key) // P != len(node.blocks):
                problems.append(f"{where}: {len(node.key) // P} pages but {len(node.blocks)} blocks")
            if node.parent.children.get(node.key[:P]) is not node:
                problems.append(f"{where}: parent does not list it under its first page")
            for first, child in node.children.items():
                if child.parent is not node or child.key[:P] != first:
                    problems.append(f"{where}: child entry inconsistent")
            pins = direct_pins.get(id(node), 0) + sum(pins_below.get(id(c), 0) for c in node.children.values())
            pins_below[id(node)] = pins
            if node.lock_ref != pins:
                problems.append(f"{where}: lock_ref {node.lock_ref} but {pins} pins at or below")
            if node.freq < 0:
                problems.append(f"{where}: negative frequency")
            pages += len(node.blocks)
            if node.lock_ref == 0:
                unpinned += len(node.blocks)
            if node.evictable != (node.lock_ref == 0 and not node.children):
                problems.append(f"{where}: evictable flag {node.evictable} wrong")
        if self.root.key or self.root.blocks or self.root.parent is not None or self.root.lock_ref:
            problems.append(f"tree {self.scope!r}/{self.shard}: malformed root")
        for first, child in self.root.children.items():
            if child.parent is not self.root or child.key[:P] != first:
                problems.append(f"tree {self.scope!r}/{self.shard}: root child entry inconsistent")
        if direct_pins.get(id(self.root)):
            problems.append(f"tree {self.scope!r}/{self.shard}: the root is pinned directly")
        if (pages, unpinned, len(nodes)) != (self.pages, self.unpinned, self.nodes):
            problems.append(f"tree {self.scope!r}/{self.shard}: counters pages/unpinned/nodes "
                            f"{self.pages}/{self.unpinned}/{self.nodes} != {pages}/{unpinned}/{len(nodes)}")
        if self.keys is not None:
            # Key pages: the index names, for each page it holds, a node of this tree holding that page.
            # (A key held twice, once as a first page and once deeper, is indexed once; when that copy
            # goes the other is found from the root only, until stored again: a miss, never a wrong page.)
            live = {id(node) for node in nodes}
            for page, node in self.keys.items():
                if id(node) not in live or all(node.key[pos : pos + P] != page for pos in range(0, len(node.key), P)):
                    problems.append(f"tree {self.scope!r}/{self.shard}: key index names a node without the page")
        return problems, nodes
