"""The disk tier's files (daemon/tier): real segment files in tmp_path, damaged the ways disks and
operators damage them; a page reads back True only with the bytes that were written."""

from __future__ import annotations

import json
import mmap
import os
import random
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

from pfxcache.daemon.tier import format as fmt
from pfxcache.daemon.tier.faults import Faults
from pfxcache.daemon.tier.files import TierFiles, TierPathError
from pfxcache.daemon.tier.format import HEADER_BYTES, Layout, RecordHeader

FINGERPRINT = b"geometry-print-1"
OTHER_FINGERPRINT = b"geometry-print-2"
BLOCK = 4096
SLOTS_PER_SEGMENT = 8
NSLOTS = 32  # four segments of eight slots


def make_pages(count: int, *, block: int = BLOCK, seed: int = 0, first_seq: int = 1):
    rng = random.Random(seed)
    headers = [RecordHeader(rng.randbytes(16), rng.randbytes(16), f"tenant-{slot % 3}".encode(),
                            first_seq + slot, slot) for slot in range(count)]
    payloads = [rng.randbytes(block) for _ in range(count)]
    return headers, payloads


def open_tier(path, *, nslots: int = NSLOTS, block: int = BLOCK, fingerprint: bytes = FINGERPRINT,
              **options) -> TierFiles:
    options.setdefault("segment_bytes", SLOTS_PER_SEGMENT * fmt.round_up(block, 4096))
    return TierFiles(str(path), nslots=nslots, block_bytes=block, fingerprint=fingerprint, **options)


def segment_path(path, number: int) -> str:
    return os.path.join(str(path), "pfxtier", f"seg-{number:06d}.pfx")


def layout(nslots: int = NSLOTS, block: int = BLOCK) -> Layout:
    return Layout(nslots, block, SLOTS_PER_SEGMENT * fmt.round_up(block, 4096))


def flip_bit(file_path: str, offset: int, bit: int = 3) -> None:
    with open(file_path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ (1 << bit)]))


def read_all(tier: TierFiles, headers, payloads):
    """Read every page; asserting that a True page holds exactly its bytes. The pages that failed."""
    targets = [bytearray(tier.block_bytes) for _ in headers]
    ok = tier.read(headers, targets)
    for good, target, payload in zip(ok, targets, payloads):
        if good:
            assert target == payload
    return {header.slot for good, header in zip(ok, headers) if not good}


@pytest.fixture
def written(tmp_path):
    """A closed tier whose 32 slots all hold a record."""
    headers, payloads = make_pages(NSLOTS)
    with open_tier(tmp_path) as tier:
        assert all(tier.write(headers, payloads))
    return tmp_path, headers, payloads


# -- round trips ------------------------------------------------------------------------------------

def test_round_trip_across_segments_into_an_mmapped_arena(tmp_path):
    nslots = 37  # the last of five segments holds five slots
    headers, payloads = make_pages(nslots)
    order = list(range(nslots))
    random.Random(1).shuffle(order)
    arena = mmap.mmap(-1, nslots * BLOCK)
    try:
        with open_tier(tmp_path, nslots=nslots) as tier:
            for batch in (order[:5], order[5:19], order[19:]):
                assert tier.write([headers[i] for i in batch], [payloads[i] for i in batch]) == [True] * len(batch)
            targets = [memoryview(arena)[i * BLOCK:(i + 1) * BLOCK] for i in order]
            assert tier.read([headers[i] for i in order], targets) == [True] * nslots
            assert all(bytes(target) == payloads[i] for target, i in zip(targets, order))
            stats = tier.stats()
            del targets
        assert (stats["write_pages"], stats["read_pages"], stats["segments"]) == (nslots, nslots, 5)
        assert stats["read_bytes"] == stats["write_bytes"] == nslots * BLOCK
        assert (stats["io_errors"], stats["verify_failures"], stats["last_error"]) == (0, 0, "")
    finally:
        arena.close()
    names = sorted(os.listdir(tmp_path / "pfxtier"))
    assert names == ["LOCK", *(f"seg-{n:06d}.pfx" for n in range(5)), "tier.meta"]
    geometry = layout(nslots)
    assert geometry.slots_in(4) == 5
    assert os.path.getsize(segment_path(tmp_path, 4)) == geometry.segment_bytes(4) < geometry.segment_bytes(0)


def test_scan_after_reopen_returns_what_was_written(written):
    path, headers, payloads = written
    with open_tier(path) as tier:
        uuid = tier.uuid
        assert sorted(tier.scan()) == sorted(headers)
    with open_tier(path) as tier:
        assert tier.uuid == uuid
        assert sorted(tier.scan(), key=lambda h: h.slot) == headers
        assert read_all(tier, headers, payloads) == set()


def test_flush_seq_hides_older_records_after_reopen(written):
    path, headers, payloads = written  # seqs 1..32
    with open_tier(path) as tier:
        tier.set_flush_seq(20)
        assert {h.seq for h in tier.scan()} == set(range(21, 33))
        newer, newer_payloads = make_pages(4, seed=9, first_seq=100)
        assert all(tier.write(newer, newer_payloads))
    with open_tier(path) as tier:
        assert tier.flush_seq == 20
        assert sorted(tier.scan(), key=lambda h: h.slot) == newer + headers[20:]


def test_clear_hides_records_for_good(written):
    path, headers, payloads = written
    cleared = {0, 1, 2, 9, 30}
    with open_tier(path) as tier:
        tier.clear(sorted(cleared, reverse=True))
        assert {h.slot for h in tier.scan()} == set(range(NSLOTS)) - cleared
    with open_tier(path) as tier:
        assert {h.slot for h in tier.scan()} == set(range(NSLOTS)) - cleared
        assert read_all(tier, headers, payloads) == cleared
        assert tier.stats()["verify_failures"] == len(cleared)


def test_a_rewritten_slot_answers_for_the_new_record_only(written):
    path, headers, payloads = written
    replacement, replacement_payload = make_pages(8, seed=5, first_seq=500)
    with open_tier(path) as tier:
        assert tier.write([replacement[3]], [replacement_payload[3]]) == [True]
        assert read_all(tier, [headers[3]], [payloads[3]]) == {3}
        assert read_all(tier, [replacement[3]], [replacement_payload[3]]) == set()
        assert [h for h in tier.scan() if h.slot == 3] == [replacement[3]]


def test_block_bytes_padded_to_the_page_stride(tmp_path):
    block = 5000
    headers, payloads = make_pages(20, block=block)
    with open_tier(tmp_path, nslots=20, block=block) as tier:
        assert tier.slot_stride == 8192
        assert all(tier.write(headers, payloads))
        assert read_all(tier, headers, payloads) == set()
    geometry = layout(20, block)
    with open(segment_path(tmp_path, 1), "rb") as segment:
        data = segment.read()
    assert len(data) == geometry.segment_bytes(1)
    for index in range(geometry.slots_in(1)):
        start = geometry.payload_offset(1, index)
        assert start % 4096 == 0
        assert data[start:start + block] == payloads[SLOTS_PER_SEGMENT + index]
        assert data[start + block:start + 8192] == bytes(8192 - block)


def test_runs_longer_than_iov_max_are_written_in_chunks(tmp_path, monkeypatch):
    from pfxcache.daemon.tier import files
    monkeypatch.setattr(files, "IOV_MAX", 3)  # a run of 8 pages and 7 paddings: five vectors
    block = 5000
    headers, payloads = make_pages(16, block=block)
    with open_tier(tmp_path, nslots=16, block=block) as tier:
        assert all(tier.write(headers, payloads))
        assert read_all(tier, headers, payloads) == set()
    geometry = layout(16, block)
    with open(segment_path(tmp_path, 0), "rb") as segment:
        data = segment.read()
    for index in range(SLOTS_PER_SEGMENT):
        start = geometry.payload_offset(0, index)
        assert data[start:start + block] == payloads[index]


@pytest.mark.parametrize("fsync", ["always", "no"])
def test_other_fsync_modes_and_dropping_the_cache(tmp_path, fsync):
    headers, payloads = make_pages(NSLOTS)
    with open_tier(tmp_path, fsync=fsync) as tier:
        assert all(tier.write(headers, payloads))
        tier.sync()
        tier.drop_cache()
        assert read_all(tier, headers, payloads) == set()


def test_records_carry_their_checksum_algorithm(tmp_path, monkeypatch):
    headers, payloads = make_pages(NSLOTS)
    monkeypatch.setattr(fmt, "PREFERRED_ALGORITHM", fmt.ZLIB_CRC32)
    with open_tier(tmp_path) as tier:
        assert all(tier.write(headers, payloads))
    monkeypatch.undo()  # reopened with crc32c preferred where the package is installed
    with open_tier(tmp_path) as tier:
        assert read_all(tier, headers, payloads) == set()
        assert all(tier.write(headers[:8], payloads[:8]))
        assert read_all(tier, headers, payloads) == set()
        # An algorithm this process cannot compute never verifies.
        entry = fmt.encode_record(headers[9], tier.uuid, 7, BLOCK, 0)
    with open(segment_path(tmp_path, 1), "r+b") as segment:
        segment.seek(Layout.header_offset(1))
        segment.write(entry)
    with open_tier(tmp_path) as tier:
        assert read_all(tier, headers, payloads) == {9}
        assert 9 not in {h.slot for h in tier.scan()}


# -- damage -----------------------------------------------------------------------------------------

def test_a_flipped_payload_bit_fails_that_page(written):
    path, headers, payloads = written
    flip_bit(segment_path(path, 1), layout().payload_offset(1, 2) + 1234)
    with open_tier(path) as tier:
        assert read_all(tier, headers, payloads) == {10}
        assert tier.stats()["verify_failures"] == 1


def test_a_flipped_header_bit_fails_the_page_and_hides_the_record(written):
    path, headers, payloads = written
    flip_bit(segment_path(path, 2), Layout.header_offset(1) + 70)
    with open_tier(path) as tier:
        assert read_all(tier, headers, payloads) == {17}
        assert 17 not in {h.slot for h in tier.scan()}
        assert tier.stats()["scan_rejected"] == 1
        assert tier.stats()["verify_failures"] == 1


def test_a_truncated_segment_fails_what_is_gone_and_recovers_on_write(written):
    path, headers, payloads = written
    geometry = layout()
    os.truncate(segment_path(path, 2), geometry.payload_offset(2, 4) + 100)  # payloads 20.. go
    os.truncate(segment_path(path, 3), Layout.header_offset(5))  # headers of 29.. go, every payload
    with open_tier(path) as tier:
        lost = set(range(20, 24)) | set(range(24, 32))
        # Targets that already hold the right bytes: True must still mean they came from the disk.
        targets = [bytearray(payload) for payload in payloads]
        assert {h.slot for h, good in zip(headers, tier.read(headers, targets)) if not good} == lost
        assert tier.stats()["verify_failures"] == len(lost)
        assert read_all(tier, headers, payloads) == lost
        assert {h.slot for h in tier.scan()} == set(range(29))
        assert tier.write([headers[21], headers[30]], [payloads[21], payloads[30]]) == [True, True]
        assert read_all(tier, headers, payloads) == lost - {21, 30}
    assert os.path.getsize(segment_path(path, 3)) == geometry.segment_bytes(3)


def test_swapped_segments_yield_nothing_until_rewritten(written):
    path, headers, payloads = written
    os.rename(segment_path(path, 0), segment_path(path, 9))
    os.rename(segment_path(path, 1), segment_path(path, 0))
    os.rename(segment_path(path, 9), segment_path(path, 1))
    with open_tier(path) as tier:
        assert read_all(tier, headers, payloads) == set(range(16))
        assert {h.slot for h in tier.scan()} == set(range(16, NSLOTS))
        assert tier.stats()["segments_rejected"] == 2
        assert tier.write([headers[0]], [payloads[0]]) == [True]  # reinitialises segment 0
        assert {h.slot for h in tier.scan()} == {0} | set(range(16, NSLOTS))
        assert read_all(tier, headers, payloads) == set(range(1, 16))


def test_a_damaged_segment_header_loses_its_records_for_good(written):
    path, headers, payloads = written
    flip_bit(segment_path(path, 1), 20)
    with open_tier(path) as tier:
        assert read_all(tier, headers, payloads) == set(range(8, 16))
        assert tier.stats()["segments_rejected"] == 0
        assert {h.slot for h in tier.scan()} == set(range(NSLOTS)) - set(range(8, 16))
        assert tier.stats()["segments_rejected"] == 1
        assert tier.write([headers[12]], [payloads[12]]) == [True]  # reinitialised: table zeroed
    with open_tier(path) as tier:
        assert {h.slot for h in tier.scan()} == set(range(NSLOTS)) - set(range(8, 16)) | {12}
        assert read_all(tier, headers, payloads) == set(range(8, 16)) - {12}


def test_a_segment_copied_from_another_tier_is_foreign(written):
    path, headers, payloads = written
    other = path / "other"
    other.mkdir()
    with open_tier(other) as tier:  # the same records, geometry and fingerprint; another uuid
        assert all(tier.write(headers, [bytes(BLOCK)] * NSLOTS))
    shutil.copyfile(segment_path(other, 1), segment_path(path, 1))
    with open_tier(path) as tier:
        assert read_all(tier, headers, payloads) == set(range(8, 16))
        assert {h.slot for h in tier.scan()} == set(range(NSLOTS)) - set(range(8, 16))


def test_a_record_copied_from_another_tier_is_foreign(written):
    path, headers, payloads = written
    other = path / "other"
    other.mkdir()
    _, other_payloads = make_pages(NSLOTS, seed=4)
    with open_tier(other) as tier:  # the same record headers, another uuid and other bytes
        assert all(tier.write(headers, other_payloads))
    geometry = layout()
    with open(segment_path(other, 0), "rb") as source, open(segment_path(path, 0), "r+b") as target:
        for offset, size in ((Layout.header_offset(3), HEADER_BYTES), (geometry.payload_offset(0, 3), BLOCK)):
            source.seek(offset)
            target.seek(offset)
            target.write(source.read(size))
    with open_tier(path) as tier:
        assert read_all(tier, headers, payloads) == {3}
        assert 3 not in {h.slot for h in tier.scan()}


def test_a_record_header_in_another_slot_is_misplaced(written):
    path, headers, payloads = written
    with open(segment_path(path, 0), "r+b") as segment:  # slot 2's header (and payload) into slot 3
        segment.seek(Layout.header_offset(2))
        entry = segment.read(HEADER_BYTES)
        segment.seek(Layout.header_offset(3))
        segment.write(entry)
        segment.seek(layout().payload_offset(0, 3))
        segment.write(payloads[2])
    with open_tier(path) as tier:
        assert [h.slot for h in tier.scan()].count(2) == 1
        assert 3 not in {h.slot for h in tier.scan()}
        assert read_all(tier, headers, payloads) == {3}
        assert read_all(tier, [headers[2]._replace(slot=3)], [payloads[2]]) == {3}


def test_a_new_fingerprint_makes_every_record_foreign(written):
    path, headers, payloads = written
    with open_tier(path) as tier:
        uuid = tier.uuid
    with open_tier(path, fingerprint=OTHER_FINGERPRINT) as tier:
        assert tier.uuid != uuid and tier.flush_seq == 0
        assert tier.scan() == []
        assert read_all(tier, headers, payloads) == set(range(NSLOTS))
    with open_tier(path) as tier:  # the old geometry again: the meta was rewritten, still foreign
        assert tier.uuid != uuid
        assert tier.scan() == []


def test_a_damaged_meta_means_a_new_uuid(written):
    path, headers, payloads = written
    with open_tier(path) as tier:
        uuid = tier.uuid
    flip_bit(str(path / "pfxtier" / "tier.meta"), 12)
    with open_tier(path) as tier:
        assert tier.uuid != uuid
        assert tier.scan() == []
        assert read_all(tier, headers, payloads) == set(range(NSLOTS))


def test_a_torn_rewrite_fails_verification(written):
    path, headers, payloads = written
    _, other_payloads = make_pages(NSLOTS, seed=3)
    with open(segment_path(path, 0), "r+b") as segment:  # a new payload whose header never landed
        segment.seek(layout().payload_offset(0, 5))
        segment.write(other_payloads[5])
    with open_tier(path) as tier:
        assert read_all(tier, headers, payloads) == {5}


def test_reading_a_slot_never_written_fails(tmp_path):
    headers, payloads = make_pages(NSLOTS)
    with open_tier(tmp_path) as tier:
        assert tier.write(headers[:4], payloads[:4]) == [True] * 4
        assert read_all(tier, headers, payloads) == set(range(4, NSLOTS))  # empty slots, absent files
        assert tier.stats()["io_errors"] == 0


def test_a_reader_beside_a_writer_never_gets_wrong_bytes(tmp_path):
    slots, rounds = 16, 40

    def version(slot: int, round_number: int):
        rng = random.Random(slot * 1000 + round_number)
        header = RecordHeader(rng.randbytes(16), bytes(16), b"ns", round_number * slots + slot, slot)
        return header, rng.randbytes(BLOCK)

    with open_tier(tmp_path, nslots=slots) as tier:
        published = [0] * slots
        assert all(tier.write(*zip(*(version(slot, 0) for slot in range(slots)))))
        reader_failures: list[str] = []
        done = threading.Event()

        def reader() -> None:
            rng = random.Random(2)
            while not done.is_set():
                picks = rng.sample(range(slots), 6)
                expected = [version(slot, published[slot]) for slot in picks]
                targets = [bytearray(BLOCK) for _ in picks]
                for good, target, (_, payload) in zip(tier.read([h for h, _ in expected], targets), targets, expected):
                    if good and target != payload:
                        reader_failures.append("wrong bytes")

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            for round_number in range(1, rounds):
                pages = [version(slot, round_number) for slot in range(slots)]
                assert all(tier.write([h for h, _ in pages], [p for _, p in pages]))
                published[:] = [round_number] * slots
        finally:
            done.set()
            thread.join()
        assert reader_failures == []
        assert read_all(tier, *zip(*(version(slot, rounds - 1) for slot in range(slots)))) == set()


# -- the path and the lock --------------------------------------------------------------------------

def test_a_second_tier_on_the_same_path_names_the_holder(tmp_path):
    with open_tier(tmp_path):
        with pytest.raises(TierPathError, match=rf"disk-tier-path {tmp_path} is in use by pid {os.getpid()}$"):
            open_tier(tmp_path)
    open_tier(tmp_path).close()  # free again once closed


def test_the_lock_holds_across_processes(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from pfxcache.daemon.tier.files import TierFiles
            tier = TierFiles({str(tmp_path)!r}, nslots=4, block_bytes=4096, fingerprint={FINGERPRINT!r})
            print("locked", flush=True)
            sys.stdin.read()
            """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(TierPathError, match=rf"in use by pid {holder.pid}$"):
            open_tier(tmp_path)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
    open_tier(tmp_path).close()


def test_unusable_paths_are_one_line_errors(tmp_path):
    with pytest.raises(TierPathError, match=rf"^disk-tier-path {tmp_path}/missing does not exist$"):
        open_tier(tmp_path / "missing")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(TierPathError, match=rf"^disk-tier-path {tmp_path}/file is not a directory$"):
        open_tier(tmp_path / "file")
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "pfxtier").write_bytes(b"")
    with pytest.raises(TierPathError, match=r"pfxtier is not a directory$"):
        open_tier(tmp_path / "occupied")
    if os.path.isdir("/proc/self"):  # a directory nobody can create files in, root included
        with pytest.raises(TierPathError, match=r"^disk-tier-path /proc/self is not writable: "):
            open_tier("/proc/self")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0o500 directory")
def test_an_unwritable_directory_is_refused(tmp_path):
    (tmp_path / "readonly").mkdir(mode=0o500)
    try:
        with pytest.raises(TierPathError, match=rf"^disk-tier-path {tmp_path}/readonly is not writable: "):
            open_tier(tmp_path / "readonly")
    finally:
        (tmp_path / "readonly").chmod(0o700)


# -- faults -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, error", [("eio:write:1", "EIO"), ("enospc:write:1", "ENOSPC"),
                                         ("efbig:write:1", "EFBIG")])
def test_injected_write_errors_fail_every_page(tmp_path, spec, error):
    headers, payloads = make_pages(NSLOTS)
    with open_tier(tmp_path, faults=Faults.parse(spec)) as tier:
        assert tier.write(headers, payloads) == [False] * NSLOTS
        stats = tier.stats()
        assert (stats["io_errors"], stats["last_error"], stats["write_pages"]) == (4, error, 0)
        assert tier.scan() == []
    assert not any(name.startswith("seg-") for name in os.listdir(tmp_path / "pfxtier"))


def test_injected_read_errors_fail_every_page(written):
    path, headers, payloads = written
    with open_tier(path, faults=Faults.parse("eio:read:1,delay:read:1us")) as tier:
        assert read_all(tier, headers, payloads) == set(range(NSLOTS))
        assert (tier.stats()["io_errors"], tier.stats()["last_error"]) == (4, "EIO")


def test_injected_errors_are_seeded_and_only_fail(tmp_path):
    headers, payloads = make_pages(NSLOTS)
    outcomes = []
    for attempt in range(2):
        directory = tmp_path / str(attempt)
        directory.mkdir()
        with open_tier(directory, faults=Faults.parse("eio:write:0.5, delay:write:1us")) as tier:
            ok = [tier.write([h], [p])[0] for h, p in zip(headers, payloads)]
            assert tier.stats()["io_errors"] == ok.count(False)
        with open_tier(directory) as tier:
            assert read_all(tier, headers, payloads) == {slot for slot in range(NSLOTS) if not ok[slot]}
        outcomes.append(ok)
    assert outcomes[0] == outcomes[1]
    assert 0 < outcomes[0].count(True) < NSLOTS


def test_fault_specs_parse():
    assert Faults.parse(None) is None
    assert Faults.parse(" ") is None
    faults = Faults.parse("eio:read:0.2,eio:write:0.2,delay:read:200ms,delay:write:50ms,enospc:write:1")
    with pytest.raises(OSError) as raised:
        faults.before_write()  # eio at 0.2 may pass; enospc at 1 never does
    assert raised.value.errno in (5, 28)


@pytest.mark.parametrize("spec, reason", [
    ("eio:read", "is not KIND:OP:VALUE"),
    ("eio:read:1:2", "is not KIND:OP:VALUE"),
    ("crash:read:1", "unknown kind 'crash'"),
    ("eio:append:1", "eio applies to read and write only"),
    ("enospc:read:1", "enospc applies to write only"),
    ("eio:read:often", "'often' is not a probability"),
    ("eio:read:1.5", "probability 1.5 is not between 0 and 1"),
    ("delay:read:fast", "'fast' is not a duration"),
    ("delay:write:200", "'200' is not a duration"),
    ("eio:read:0.1,eio:read:0.2", "eio:read is given twice"),
])
def test_bad_fault_specs_say_why(spec, reason):
    with pytest.raises(ValueError, match=reason):
        Faults.parse(spec)


def test_a_file_size_limit_fails_writes_without_a_crash(tmp_path):
    geometry = Layout(64, BLOCK, 1 << 20)
    within = tmp_path / "within"
    within.mkdir()
    headers, payloads = make_pages(64)
    with TierFiles(str(within), nslots=64, block_bytes=BLOCK, fingerprint=FINGERPRINT, segment_bytes=1 << 20) as tier:
        assert tier.write(headers[:1], payloads[:1]) == [True]  # the segment exists, whole
    limit = geometry.payload_offset(0, 4)
    script = textwrap.dedent(f"""
        import json, random, resource, signal
        from pfxcache.daemon.tier.files import TierFiles
        from pfxcache.daemon.tier.format import RecordHeader
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
        def page(slot):
            rng = random.Random(slot)
            return RecordHeader(rng.randbytes(16), bytes(16), b"ns", slot + 1, slot), rng.randbytes({BLOCK})
        report = {{}}
        for name in ("within", "fresh"):
            with TierFiles({str(tmp_path)!r} + "/" + name, nslots=64, block_bytes={BLOCK},
                           fingerprint={FINGERPRINT!r}, segment_bytes=1 << 20) as tier:
                (low, low_payload), (high, high_payload) = page(1), page(60)
                report[name] = [tier.write([low], [low_payload]), tier.write([high], [high_payload]),
                                tier.stats()["io_errors"], tier.stats()["last_error"]]
                straddling = [page(slot) for slot in (3, 4, 5)]  # the limit falls inside this run
                report[name + " run"] = tier.write([h for h, _ in straddling], [p for _, p in straddling])
        print(json.dumps(report))
        """)
    (tmp_path / "fresh").mkdir()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # An existing segment: a write below the limit lands, one past it is EFBIG from the write itself.
    assert report["within"] == [[True], [False], 1, "EFBIG"]
    assert report["within run"] == [False, False, False]
    # A new segment larger than the limit: posix_fallocate is refused, so nothing is written.
    assert report["fresh"] == [[False], [False], 2, "EFBIG"]
    assert not os.path.exists(segment_path(tmp_path / "fresh", 0))


# -- hygiene and mistakes ---------------------------------------------------------------------------

def test_close_leaves_no_descriptor_open(tmp_path):
    before = sorted(os.listdir("/proc/self/fd"))
    headers, payloads = make_pages(NSLOTS)
    tier = open_tier(tmp_path, faults=Faults.parse("eio:write:0.3"))
    tier.write(headers, payloads)
    read_all(tier, headers, payloads)
    tier.scan()
    tier.clear([1, 2, 3])
    tier.set_flush_seq(4)
    tier.sync()
    tier.drop_cache()
    with pytest.raises(TierPathError):
        open_tier(tmp_path)  # the refused second tier closes what it opened
    tier.close()
    tier.close()
    assert sorted(os.listdir("/proc/self/fd")) == before
    with pytest.raises(ValueError, match="closed"):
        tier.scan()
    with pytest.raises(TierPathError):
        open_tier(tmp_path / "missing")
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_caller_mistakes_are_value_errors(tmp_path):
    headers, payloads = make_pages(4)
    with pytest.raises(ValueError, match="fsync"):
        open_tier(tmp_path, fsync="sometimes")
    with pytest.raises(ValueError, match="fingerprint"):
        open_tier(tmp_path, fingerprint=b"short")
    with open_tier(tmp_path) as tier:
        with pytest.raises(ValueError, match="namespace longer than 255"):
            tier.write([headers[0]._replace(namespace=b"n" * 256)], [payloads[0]])
        tier.write([headers[0]._replace(namespace=b"n" * 255)], [payloads[0]])  # the longest allowed
        with pytest.raises(ValueError, match="not block_bytes"):
            tier.write([headers[0]], [payloads[0][:-1]])
        with pytest.raises(ValueError, match="outside"):
            tier.write([headers[0]._replace(slot=NSLOTS)], [payloads[0]])
        with pytest.raises(ValueError, match="written twice"):
            tier.write([headers[0], headers[1]._replace(slot=0)], payloads[:2])
        with pytest.raises(ValueError, match="not writable"):
            tier.read([headers[0]], [bytes(BLOCK)])
        with pytest.raises(ValueError, match="one target"):
            tier.read(headers, [])
        assert tier.stats()["write_pages"] == 1


def test_layout_arithmetic():
    assert Layout(10, 4096, 1).slots_per_segment == 1  # a segment smaller than a slot holds one
    assert Layout(10, 4096, 1 << 30).slots_per_segment == 10
    geometry = Layout(10, 5000, 3 * 8192)
    assert (geometry.slot_stride, geometry.slots_per_segment, geometry.nsegments) == (8192, 3, 4)
    assert geometry.locate(7) == (2, 1) and geometry.slots_in(3) == 1
    assert geometry.payload_offset(0, 0) == 4096 + 4096
    assert Layout(100, 4096, 100 * 4096).table_bytes(0) == fmt.round_up(100 * HEADER_BYTES, 4096)
