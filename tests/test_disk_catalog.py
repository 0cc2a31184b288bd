"""The disk tier's catalog (daemon/store/disk_catalog.py): runs, reservations, leaf-first LRU eviction,
group bounds, removals deferred under I/O, start-up loading, and a seeded random walk against a plain model."""

from __future__ import annotations

import hashlib
import random
from types import SimpleNamespace

import pytest

from pfxcache.daemon.store.disk_catalog import READY, WRITING, DiskCatalog


class Clock:
    """A clock that moves one tick per reading, so every reading is distinct and ordered."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def seed(ns: bytes) -> bytes:
    return hashlib.blake2b(b"pfxcache-namespace\0" + ns, digest_size=16).digest()


def chained(parent: bytes, token: object) -> bytes:
    return hashlib.blake2b(parent + repr(token).encode(), digest_size=16).digest()


def chain(ns: bytes, tokens, parent: bytes | None = None) -> list[tuple[bytes, bytes, bytes]]:
    """(ident, parent, namespace) per page of ``tokens`` after ``parent`` (the namespace's seed by default)."""
    parent = seed(ns) if parent is None else parent
    pages = []
    for token in tokens:
        ident = chained(parent, token)
        pages.append((ident, parent, ns))
        parent = ident
    return pages


def stored(catalog: DiskCatalog, pages) -> list:
    """Reserve and commit ``pages``; every one must get a record."""
    records, _ = catalog.reserve(pages)
    assert None not in records
    assert catalog.commit(records, [True] * len(records)) == []
    return records


def idents(pages) -> list[bytes]:
    return [page[0] for page in pages]


# -- runs, reservations, commits --------------------------------------------------------------------


def test_run_counts_the_leading_ready_records_and_stops_at_a_hole_or_a_write():
    catalog = DiskCatalog(8, clock=Clock())
    pages = chain(b"ns", "abcd")
    a, b, c, d = (catalog.reserve([page])[0][0] for page in pages)
    assert catalog.run(idents(pages)) == 0  # all writing
    catalog.commit([a, b, d], [True, True, True])
    assert catalog.run(idents(pages)) == 2  # c is still being written
    catalog.commit([c], [True])
    assert catalog.run(idents(pages)) == 4
    assert catalog.run([a.ident, chained(a.ident, "x"), c.ident]) == 1  # a hole
    assert catalog.run([]) == 0
    assert catalog.check() == []


def test_reserve_and_commit_round_trip():
    catalog = DiskCatalog(4, clock=Clock())
    pages = chain(b"ns", "abc")
    records, evicted = catalog.reserve(pages)
    assert evicted == []
    assert [r.state for r in records] == [WRITING] * 3
    assert len({r.slot for r in records}) == 3 and all(0 <= r.slot < 4 for r in records)
    assert [r.seq for r in records] == [1, 2, 3] and catalog.next_seq == 4
    assert [(r.ident, r.parent, r.namespace) for r in records] == pages
    assert catalog.stats() == {"pages": 3, "free_slots": 1, "evictions": 0, "writing": 3, "pinned": 0, "dead": 0}
    # Present in any state: no second record.
    again, _ = catalog.reserve(pages + chain(b"ns", "d", parent=pages[-1][0]))
    assert again[:3] == [None, None, None] and again[3] is not None
    assert catalog.commit(records + [again[3]], [True] * 4) == []
    assert all(r.state == READY for r in records)
    assert catalog.get(pages[0][0]) is records[0]
    assert catalog.by_namespace(b"ns") == 4 and catalog.by_namespace(b"other") == 0
    assert catalog.by_group(None) == 4
    assert catalog.stats()["writing"] == 0 and catalog.free_slots == 0
    with pytest.raises(ValueError):
        catalog.commit(records[:1], [True])  # already ready
    assert catalog.check() == []


def test_a_failed_write_frees_its_slot():
    catalog = DiskCatalog(2, clock=Clock())
    pages = chain(b"ns", "ab")
    records, _ = catalog.reserve(pages)
    removed = catalog.commit(records, [True, False])
    assert removed == [records[1]]
    assert catalog.get(pages[1][0]) is None and catalog.pages == 1 and catalog.free_slots == 1
    assert catalog.run(idents(pages)) == 1
    (again,), evicted = catalog.reserve(pages[1:])
    assert evicted == [] and again.slot == records[1].slot and again.seq == 3
    assert catalog.check() == []


# -- eviction order ---------------------------------------------------------------------------------


def test_eviction_is_leaf_first_then_least_recently_used():
    catalog = DiskCatalog(4, clock=Clock())
    a, b, c = stored(catalog, chain(b"ns", "abc"))  # a is the oldest of all ...
    (x,) = stored(catalog, chain(b"ns", "x"))  # ... and x the youngest leaf
    gone = []
    for token in "defg":
        (record,), evicted = catalog.reserve(chain(b"other", [token]))
        assert record is not None
        gone += evicted
        catalog.commit([record], [True])
        assert catalog.check() == []
    assert gone[:3] == [c, b, a]  # a chain goes from its leaf up, even though a is older than x
    assert gone[3] is x
    assert catalog.evictions == 4
    assert catalog.run(idents(chain(b"ns", "abc"))) == 0


def test_touch_moves_a_record_to_the_back_of_the_order():
    catalog = DiskCatalog(2, clock=Clock())
    (old,) = stored(catalog, chain(b"ns", "o"))
    (young,) = stored(catalog, chain(b"ns", "y"))
    catalog.touch([old])
    assert old.freq == 1 and old.last_use > young.last_use
    _, evicted = catalog.reserve(chain(b"ns", "n"))
    assert evicted == [young]
    assert catalog.check() == []


def test_pinned_and_writing_records_are_never_evicted():
    catalog = DiskCatalog(2, clock=Clock())
    (ready,) = stored(catalog, chain(b"ns", "r"))
    (writing,), _ = catalog.reserve(chain(b"ns", "w"))
    assert catalog.pin([ready.ident]) == [ready]
    assert catalog.pin([writing.ident]) == []  # only ready records are pinned
    records, evicted = catalog.reserve(chain(b"ns", "n"))
    assert records == [None] and evicted == []
    assert catalog.unpin([ready]) == []
    records, evicted = catalog.reserve(chain(b"ns", "n"))
    assert evicted == [ready] and records[0].slot == ready.slot
    assert catalog.get(writing.ident) is writing
    assert catalog.check() == []


def test_no_room_gives_none_to_the_page_and_to_its_children():
    catalog = DiskCatalog(3, clock=Clock(), group_of=lambda ns: ns)
    catalog.set_limit(b"a", 1)
    (held,) = stored(catalog, chain(b"a", "h"))
    catalog.pin([held.ident])
    first = chain(b"a", "1")  # group a is at its bound and has nothing it may evict
    orphan = chain(b"b", "2", parent=first[0][0])  # another group, but its parent gets no record
    other = chain(b"b", "3")
    records, evicted = catalog.reserve(first + orphan + other)
    assert records[:2] == [None, None] and records[2] is not None and evicted == []
    assert catalog.free_slots == 1  # there was room for the orphan: it got None for its parent
    assert catalog.check() == []


def test_reserve_never_evicts_the_parent_of_its_pages():
    catalog = DiskCatalog(2, clock=Clock())
    (root,) = stored(catalog, chain(b"ns", "r"))  # the least recently used leaf ...
    (leaf,) = stored(catalog, chain(b"other", "x"))
    records, evicted = catalog.reserve(chain(b"ns", "ab", parent=root.ident))  # ... but these hang below it
    assert evicted == [leaf] and records[0] is not None and records[1] is None  # then no room is left
    assert catalog.get(root.ident) is root
    assert catalog.check() == []


# -- groups -----------------------------------------------------------------------------------------


def test_a_group_at_its_bound_evicts_its_own_records():
    catalog = DiskCatalog(10, clock=Clock(), group_of=lambda ns: ns)
    (b_old,) = stored(catalog, chain(b"b", "0"))  # the oldest leaf of all
    a1, a2 = stored(catalog, chain(b"a", "1")) + stored(catalog, chain(b"a", "2"))
    catalog.set_limit(b"a", 2)
    (a3,), evicted = catalog.reserve(chain(b"a", "3"))
    assert evicted == [a1] and a3 is not None  # its own, although a free slot and an older leaf exist
    assert catalog.by_group(b"a") == 2 and catalog.get(b_old.ident) is b_old
    catalog.commit([a3], [True])
    catalog.pin([a2.ident, a3.ident])
    catalog.pin([a3.ident])
    records, evicted = catalog.reserve(chain(b"a", "4"))
    assert records == [None] and evicted == []  # never another group's
    assert catalog.check() == []


def test_a_group_under_its_bound_evicts_globally():
    catalog = DiskCatalog(3, clock=Clock(), group_of=lambda ns: ns)
    catalog.set_limit(b"a", 5)
    (a1,) = stored(catalog, chain(b"a", "1"))
    stored(catalog, chain(b"b", "1"))
    stored(catalog, chain(b"a", "2"))
    (b2,), evicted = catalog.reserve(chain(b"b", "2"))
    assert evicted == [a1]  # group b has no bound: the oldest leaf anywhere goes
    catalog.commit([b2], [True])
    (a3,), evicted = catalog.reserve(chain(b"a", "3"))  # a is under its bound: the same
    assert a3 is not None and [r.namespace for r in evicted] == [b"b"]
    catalog.set_limit(b"a", None)
    assert catalog.check() == []


# -- removals under I/O -----------------------------------------------------------------------------


def test_drop_subtree_defers_pinned_records_until_unpinned():
    catalog = DiskCatalog(6, clock=Clock())
    a, b, c = stored(catalog, chain(b"ns", "abc"))
    (d,) = stored(catalog, chain(b"ns", "d", parent=a.ident))
    pinned = catalog.pin(idents(chain(b"ns", "abc"))[:2]) + catalog.pin([a.ident, d.ident])
    assert pinned == [a, b, a, d] and a.pins == 2
    removed = catalog.drop_subtree(b.ident)
    assert removed == [c] and b.dead and not c.dead
    assert catalog.get(b.ident) is None and catalog.run(idents(chain(b"ns", "abc"))) == 1
    assert catalog.stats()["dead"] == 1 and catalog.pages == 2 and catalog.by_namespace(b"ns") == 2
    assert catalog.check() == []
    # b's slot stays taken: three free slots, three new pages, none gets it, and a fourth finds no room.
    fresh, evicted = catalog.reserve(chain(b"other", "xyzw"))
    assert evicted == [] and fresh[3] is None
    assert len({r.slot for r in fresh[:3]} | {a.slot, b.slot, d.slot}) == 6
    assert catalog.unpin(pinned) == [b]  # now b is gone and its slot is free
    assert catalog.free_slots == 1 and catalog.stats()["dead"] == 0
    assert catalog.check() == []


def test_drop_subtree_of_an_absent_page_drops_what_hangs_below_it():
    catalog = DiskCatalog(4, clock=Clock())
    gone = chained(seed(b"ns"), "in RAM only")
    below = stored(catalog, chain(b"ns", "xy", parent=gone))
    (kept,) = stored(catalog, chain(b"ns", "k"))
    assert set(map(id, catalog.drop_subtree(gone))) == set(map(id, below))
    assert catalog.pages == 1 and catalog.get(kept.ident) is kept
    assert catalog.check() == []


def test_drop_namespace_of_a_record_being_written_frees_it_at_commit():
    catalog = DiskCatalog(3, clock=Clock())
    (done,) = stored(catalog, chain(b"ns", "a"))
    (writing,), _ = catalog.reserve(chain(b"ns", "b", parent=done.ident))
    (other,) = stored(catalog, chain(b"other", "a"))
    assert catalog.drop_namespace(b"ns") == [done]
    assert writing.dead and catalog.by_namespace(b"ns") == 0 and catalog.pages == 1
    assert catalog.get(writing.ident) is None and catalog.free_slots == 1
    assert catalog.check() == []
    assert catalog.commit([writing], [True]) == [writing]  # removed whatever ok says
    assert catalog.free_slots == 2 and catalog.get(other.ident) is other
    assert catalog.check() == []


def test_flush_removes_everything_and_defers_what_is_under_io():
    catalog = DiskCatalog(4, clock=Clock())
    a, b = stored(catalog, chain(b"ns", "ab"))
    (writing,), _ = catalog.reserve(chain(b"ns", "w"))
    (pinned,) = catalog.pin([a.ident])
    removed = catalog.flush()
    assert removed == [b]
    assert catalog.pages == 0 and catalog.by_namespace(b"ns") == 0 and catalog.run([a.ident]) == 0
    assert catalog.stats() == {"pages": 0, "free_slots": 2, "evictions": 0, "writing": 0, "pinned": 1, "dead": 2}
    assert catalog.check() == []
    fresh, _ = catalog.reserve(chain(b"new", "xyz"))
    assert fresh[2] is None and {r.slot for r in fresh[:2]}.isdisjoint({a.slot, writing.slot})
    assert catalog.commit([writing], [True]) == [writing]
    assert catalog.unpin([pinned]) == [a]
    assert catalog.free_slots == 2 and catalog.check() == []


def test_remove_takes_only_the_records_named():
    catalog = DiskCatalog(4, clock=Clock())
    a, b, c = stored(catalog, chain(b"ns", "abc"))
    assert catalog.remove([b.ident, b"absent" * 3]) == [b]
    assert catalog.get(c.ident) is c and catalog.run(idents(chain(b"ns", "abc"))) == 1
    assert catalog.check() == []


# -- start-up ---------------------------------------------------------------------------------------


def test_load_keeps_the_highest_seq_per_ident_and_per_slot():
    clock = Clock()
    catalog = DiskCatalog(6, clock=clock)
    (x, _, ns), (y, _, _) = pages = chain(b"ns", "xy")

    def header(ident, parent, seq, slot):
        return SimpleNamespace(ident=ident, parent=parent, namespace=ns, seq=seq, slot=slot)

    z = chained(seed(b"ns"), "z")
    lost = catalog.load([
        header(x, seed(b"ns"), 5, 0),
        header(x, seed(b"ns"), 9, 1),  # x's newest copy
        header(y, x, 3, 2),  # slot 2 rewritten since by z
        header(z, seed(b"ns"), 7, 2),
        header(y, x, 2, 4),  # y's other copy, older still
    ])
    assert lost == [0, 4]
    assert catalog.get(x).slot == 1 and catalog.get(x).seq == 9 and catalog.get(z).slot == 2
    assert catalog.get(y) is None and catalog.pages == 2 and catalog.free_slots == 4
    assert catalog.next_seq == 10 and all(catalog.get(i).state == READY for i in (x, z))
    assert catalog.run(idents(pages)) == 1
    assert catalog.check() == []
    (w,), _ = catalog.reserve(chain(b"ns", "w"))
    assert w.seq == 10 and w.slot not in (1, 2)
    with pytest.raises(RuntimeError):
        catalog.load([])


def test_loaded_leaves_are_evicted_oldest_write_first():
    catalog = DiskCatalog(2, clock=Clock())
    (a, pa, ns), (b, pb, _) = chain(b"ns", "a") + chain(b"ns", "b")
    catalog.load([SimpleNamespace(ident=b, parent=pb, namespace=ns, seq=4, slot=0),
                  SimpleNamespace(ident=a, parent=pa, namespace=ns, seq=2, slot=1)])
    _, evicted = catalog.reserve(chain(b"ns", "c"))
    assert [r.ident for r in evicted] == [a]
    assert catalog.check() == []


# -- a seeded random walk against a plain model -----------------------------------------------------


NAMESPACES = (b"n0", b"n1", b"n2")
GROUP_OF = {b"n0": "g0", b"n1": "g0", b"n2": "g1"}
G1_LIMIT = 5


class Model:
    """What the catalog must hold, kept by rules stated plainly: records by ident, slots by record."""

    def __init__(self) -> None:
        self.present: dict[bytes, object] = {}  # ident -> the record the catalog must return
        self.owned: dict[int, object] = {}  # slot -> record (present or dead)
        self.dead: set[int] = set()  # id() of records dropped while under I/O

    def descendants(self, ident: bytes) -> list:
        found, stack = [], [ident]
        while stack:
            top = stack.pop()
            for record in self.present.values():
                if record.parent == top and record not in found:
                    found.append(record)
                    stack.append(record.ident)
        return found

    def drop(self, records) -> set[int]:
        """The catalog's rule for removals: returns id() of those whose slot comes free now."""
        now = set()
        for record in records:
            del self.present[record.ident]
            if record.pins or record.state == WRITING:
                self.dead.add(id(record))
            else:
                now.add(id(record))
        return now

    def release(self, records) -> None:
        for record in records:
            assert self.owned.pop(record.slot) is record
            self.dead.discard(id(record))

    def run(self, chain_idents) -> int:
        n = 0
        for ident in chain_idents:
            record = self.present.get(ident)
            if record is None or record.state != READY:
                break
            n += 1
        return n


@pytest.mark.parametrize("rng_seed", [1, 2, 3])
def test_random_walk_matches_a_plain_model(rng_seed):
    rng = random.Random(rng_seed)
    nslots = 24
    catalog = DiskCatalog(nslots, clock=Clock(), group_of=GROUP_OF.__getitem__)
    catalog.set_limit("g1", G1_LIMIT)
    model = Model()
    writes: list[list] = []  # reservations not yet committed
    reads: list[list] = []  # pins not yet released
    chains: list[list[bytes]] = []  # every chain reserved, from its namespace's seed
    paths: dict[bytes, list[bytes]] = {}  # ident -> the idents from the seed down to it
    counts = dict.fromkeys(["reserve", "evicted", "none", "dead"], 0)

    for step in range(1500):
        op = rng.random()
        if op < 0.35:
            ns = rng.choice(NAMESPACES)
            known = [i for i in model.present if model.present[i].namespace == ns]
            start = rng.choice(known) if known and rng.random() < 0.6 else None
            pages = chain(ns, [rng.randrange(3) for _ in range(rng.randint(1, 4))], parent=start)
            before = dict(model.present)
            free_before = catalog.free_slots
            records, evicted = catalog.reserve(pages)
            counts["reserve"] += 1
            counts["evicted"] += len(evicted)
            for record in evicted:
                assert before[record.ident] is record and record.state == READY and record.pins == 0
                assert record not in records and not any(record.ident == p[1] for p in pages)
                del model.present[record.ident]
                model.release([record])
            reserved = []
            failed = set()  # pages that got None for want of room
            for (ident, parent, namespace), record in zip(pages, records):
                if record is None and ident not in model.present:
                    failed.add(ident)
                if parent in failed:
                    assert record is None  # unreachable: its parent got no record
                if record is None:
                    counts["none"] += 1
                    # With room for every page and no bound in play, only a present ident gets None.
                    assert ident in model.present or free_before < len(pages) or ns == b"n2"
                    continue
                assert ident not in model.present  # a present ident never gets a second record
                assert record.slot not in model.owned and record.state == WRITING
                model.present[ident] = record
                model.owned[record.slot] = record
                reserved.append(record)
                paths[ident] = paths.get(parent, []) + [ident]
                chains.append(paths[ident])
            for record in evicted:  # leaf first: nothing present hangs below an evicted record
                if record.ident not in model.present:
                    assert all(r.parent != record.ident for r in model.present.values())
            assert catalog.by_group("g1") <= G1_LIMIT
            assert catalog.free_slots == nslots - len(model.owned)
            if free_before >= len(pages) and ns != b"n2":
                assert evicted == []
            if reserved:
                writes.append(reserved)
        elif op < 0.55 and writes:
            batch = writes.pop(rng.randrange(len(writes)))
            ok = [rng.random() < 0.85 for _ in batch]
            expect = {id(r) for r, good in zip(batch, ok) if id(r) in model.dead or not good}
            removed = catalog.commit(batch, ok)
            assert {id(r) for r in removed} == expect
            for record, good in zip(batch, ok):
                if id(record) not in expect:
                    assert record.state == READY
                elif not record.dead:
                    del model.present[record.ident]
            model.release(removed)
        elif op < 0.67 and chains:
            wanted = rng.choice(chains)
            expected_run = model.run(wanted)
            pinned = catalog.pin(wanted)
            assert [r.ident for r in pinned] == wanted[:expected_run]
            if pinned:
                reads.append(pinned)
        elif op < 0.79 and reads:
            batch = reads.pop(rng.randrange(len(reads)))
            expect = [r for r in batch if r.pins == 1 and id(r) in model.dead]
            if rng.random() < 0.5:
                catalog.touch(batch)
            released = catalog.unpin(batch)
            assert [id(r) for r in released] == [id(r) for r in expect]
            model.release(released)
        elif op < 0.84 and model.present:
            catalog.touch(rng.sample(list(model.present.values()), min(3, len(model.present))))
        elif op < 0.97:
            kind = rng.randrange(3)
            if kind == 0 and model.present:
                named = rng.sample(list(model.present), min(2, len(model.present)))
                expect = model.drop([model.present[i] for i in named])
                removed = catalog.remove(named)
            elif kind == 1 and chains:
                top = rng.choice(rng.choice(chains))
                victims = ([model.present[top]] if top in model.present else []) + model.descendants(top)
                expect = model.drop(victims)
                removed = catalog.drop_subtree(top)
            else:
                ns = rng.choice(NAMESPACES)
                expect = model.drop([r for r in model.present.values() if r.namespace == ns])
                removed = catalog.drop_namespace(ns)
            assert {id(r) for r in removed} == expect
            model.release(removed)
        elif op < 0.985:
            expect = model.drop(list(model.present.values()))
            removed = catalog.flush()
            assert {id(r) for r in removed} == expect
            model.release(removed)

        assert catalog.check() == [], f"step {step}"
        assert catalog.pages == len(model.present)
        assert catalog.free_slots == nslots - len(model.owned)
        assert len({r.slot for r in model.owned.values()}) == len(model.owned)
        assert catalog.stats()["dead"] == len(model.dead)
        counts["dead"] = max(counts["dead"], len(model.dead))
        for ident in paths:
            assert catalog.get(ident) is model.present.get(ident)
        for wanted in rng.sample(chains, min(5, len(chains))):
            assert catalog.run(wanted) == model.run(wanted)
        for ns in NAMESPACES:
            assert catalog.by_namespace(ns) == sum(r.namespace == ns for r in model.present.values())

    # The walk went everywhere it should have.
    assert counts["reserve"] > 300 and counts["evicted"] > 50 and counts["none"] > 50 and counts["dead"] >= 2
    assert catalog.evictions == counts["evicted"]
