"""Damage in a log's segments and indexes (docs/durability.md, "Bit rot"): a bad record
followed by a valid one is lost alone, wherever it is (first, middle or last record of
the newest or of a sealed segment, its length field included), reported in the log's
damage map and passed over by every read; a damaged index is rebuilt; a damaged header
rewritten. Random flips check the rules over many logs in seconds. The C search for the
next record (`_records.resync_records`) is checked on its own first."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from streamq.log import format as fmt
from streamq.log._records import resync_records
from streamq.log.damage import find_resync
from streamq.log.errors import RecordDamaged
from streamq.log.log import LogConfig, SegmentLog
from streamq.log.scrub import Scrub, Scrubber
from tests.unit.log.conftest import message

CONFIG = LogConfig(segment_bytes_max=4096, index_interval_bytes=256)
RANDOM_LOGS = int(os.environ.get("STREAMQ_BIT_ROT_UNIT_LOGS", "60"))


def build(directory: Path, count: int, seed: int = 0) -> list[fmt.Record]:
    rng = random.Random(seed)
    log = SegmentLog.open(str(directory), CONFIG)
    for i in range(count):
        log.append([message(i, size=rng.randrange(1, 300))], 1000 + i)
    log.close_blocking()
    reopened = SegmentLog.open(str(directory), CONFIG)
    records = reopened.read(0, count)
    reopened.close_blocking()
    assert len(records) == count
    return records


def spans(directory: Path) -> list[tuple[Path, int, int, int]]:
    """(segment, position, end, offset) of every record, from the files' bytes."""
    out = []
    for path in sorted(directory.glob("*.seg")):
        data = path.read_bytes()
        offset = fmt.decode_segment_header(data, str(path))
        position = fmt.SEGMENT_HEADER_BYTES
        while (checked := fmt.check_record(data, position)) is not None:
            out.append((path, position, position + checked[2], offset))
            position += checked[2]
            offset += 1
    return out


def flip(path: Path, byte: int, bit: int = 3) -> None:
    with open(path, "r+b") as f:
        f.seek(byte)
        value = f.read(1)[0]
        f.seek(byte)
        f.write(bytes([value ^ (1 << bit)]))


def test_resync_finds_the_next_record_and_nothing_in_garbage() -> None:
    records = b"".join(
        fmt.encode_record(10 + i, 5, fmt.Message(b"x", b"k", b"", b"body" * i)) for i in range(3)
    )
    second = len(fmt.encode_record(10, 5, fmt.Message(b"x", b"k", b"", b"")))
    assert resync_records(records, 1, len(records), 11, 11, 0) == (second, 11, True)
    # An offset out of range, an older timestamp or a record past the file: no candidate.
    assert resync_records(records, 1, len(records), 12, 12, 0) is not None  # the third
    assert resync_records(records, 1, len(records), 11, 11, 6) is None
    assert resync_records(records[:-1], 1, len(records) - 1, 11, 11, 0)[:2] == (second, 11)
    rng = random.Random(7)
    garbage = bytes(rng.randrange(256) for _ in range(1 << 16))
    assert resync_records(garbage, 0, len(garbage), 0, 1 << 40, -(1 << 62)) is None
    # A candidate past the data (but within the file) is reported incomplete.
    assert resync_records(records[: second + 34], 1, len(records), 11, 11, 0) == (
        second,
        11,
        False,
    )


def test_find_resync_reads_across_chunks(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    far = fmt.encode_record(3, 5, fmt.Message(b"", b"", b"", b"z" * 100))
    # The next record 3 MiB on: the search reads several chunks, the last 31 bytes of
    # each again with the next. Two records lost take at least 64 bytes: offset 3 fits.
    path.write_bytes(b"\0" * (3 << 20) + far)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert find_resync(fd, 0, (3 << 20) + len(far), 1, 0) == (3 << 20, 3)
        assert find_resync(fd, 0, (3 << 20) + len(far) - 1, 1, 0) is None  # cut short
    finally:
        os.close(fd)


@pytest.mark.parametrize("where", ["first", "middle", "last", "length"])
@pytest.mark.parametrize("segment", ["newest", "sealed"])
def test_one_damaged_record_is_lost_alone(tmp_path: Path, where: str, segment: str) -> None:
    records = build(tmp_path, 90)
    layout = spans(tmp_path)
    files = sorted({p for p, *_ in layout})
    chosen = files[-1] if segment == "newest" else files[1]
    inside = [s for s in layout if s[0] == chosen]
    path, position, end, lost = {
        "first": inside[0],
        "middle": inside[len(inside) // 2],
        "last": inside[-1],
        "length": inside[len(inside) // 2],
    }[where]
    flip(path, position + 1 if where == "length" else (position + end) // 2)
    log = SegmentLog.open(str(tmp_path), CONFIG)
    try:
        assert log.read(0, 200) == [r for r in records if r.offset != lost]
        assert log.damage.records == 1
        [span] = log.damage.spans
        assert (span.path, span.position, span.first_offset) == (str(path), position, lost)
        with pytest.raises(RecordDamaged):
            log.read_record(lost)
        if lost + 1 < len(records):
            assert log.read_record(lost + 1) == records[lost + 1]
        assert log.append([message(7)], 5000) == len(records)  # no offset is reused
        assert log.sync_blocking() == len(records) + 1
    finally:
        log.close_blocking()
    again = SegmentLog.open(str(tmp_path), CONFIG)  # found again the same way
    try:
        assert len(again.read(0, 200)) == len(records)
        assert again.damage.records == 1
    finally:
        again.close_blocking()


def test_a_damaged_index_and_header_lose_nothing(tmp_path: Path) -> None:
    records = build(tmp_path, 90)
    indexes = sorted(tmp_path.glob("*.idx"))
    flip(indexes[0], 20)
    flip(indexes[1], fmt.INDEX_HEADER_BYTES + 5)
    flip(sorted(tmp_path.glob("*.seg"))[0], 9)  # the header of a segment now scanned
    flip(sorted(tmp_path.glob("*.seg"))[-1], 12)  # and of the newest
    log = SegmentLog.open(str(tmp_path), CONFIG)
    try:
        assert log.read(0, 200) == records
        assert log.damage.records == 0
        assert log.seek_timestamp(1050) == 50
    finally:
        log.close_blocking()
    reopened = SegmentLog.open(str(tmp_path), CONFIG)  # the repairs were written
    reopened.close_blocking()
    with open(sorted(tmp_path.glob("*.seg"))[0], "rb") as f:
        fmt.decode_segment_header(f.read(fmt.SEGMENT_HEADER_BYTES), "first")


def test_a_torn_last_record_is_cut_but_a_damaged_one_is_not_reused(tmp_path: Path) -> None:
    """The `durable` marker tells them apart: past it, a bad last record is a torn
    write, cut; below it, it was durable: damage, reported, and its offset never
    given to another message (the log goes on in a new segment)."""
    records = build(tmp_path, 40)
    path, position, end, lost = spans(tmp_path)[-1]
    flip(path, (position + end) // 2)
    log = SegmentLog.open(str(tmp_path), CONFIG)
    assert log.read(0, 100) == records[:-1]
    assert log.damage.records == 1 and log.next_offset == 40
    log.append([message(1)], 9000)
    log.close_blocking()
    torn = tmp_path / "torn"
    build(torn, 40)
    path, position, end, lost = spans(torn)[-1]
    with open(path, "r+b") as f:
        f.truncate(end - 3)
    (torn / fmt.DURABLE_FILE).write_bytes(fmt.encode_durable(lost))  # as a crash leaves it
    log = SegmentLog.open(str(torn), CONFIG)
    assert log.damage.records == 0 and log.next_offset == lost
    log.close_blocking()


@pytest.mark.parametrize("seed", range(RANDOM_LOGS))
def test_random_flips_lose_only_the_records_hit(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    records = build(tmp_path, rng.randrange(20, 120), seed)
    layout = spans(tmp_path)
    files = [p for p in sorted(tmp_path.iterdir()) if p.suffix in (".seg", ".idx")]
    lost = set()
    for _ in range(rng.randint(1, 5)):
        path = rng.choice(files)
        byte = rng.randrange(path.stat().st_size)
        flip(path, byte, rng.randrange(8))
        lost |= {o for p, start, end, o in layout if p == path and start <= byte < end}
    log = SegmentLog.open(str(tmp_path), CONFIG)
    try:
        assert log.read(0, 200) == [r for r in records if r.offset not in lost], seed
        assert log.damage.records == len(lost), seed
        for offset in lost:
            with pytest.raises(RecordDamaged):
                log.read_record(offset)
    finally:
        log.close_blocking()


def test_a_scrub_finds_damage_in_sealed_segments_before_any_read(tmp_path: Path) -> None:
    """The scrub reads every sealed segment (never the active one) in bounded steps and
    reports damage there; a reader then passes over it without a search."""
    records = build(tmp_path, 90)
    layout = spans(tmp_path)
    sealed = [s for s in layout if s[0] == sorted({p for p, *_ in layout})[1]]
    path, position, end, lost = sealed[len(sealed) // 3]
    flip(path, (position + end) // 2)
    log = SegmentLog.open(str(tmp_path), CONFIG)
    try:
        assert log.damage.records == 0  # start-up trusts the sealed segment
        scrub = Scrub()
        steps = 0
        while scrub.passes == 0:
            assert scrub.step(log, 1000) <= 1000 + 4096
            steps += 1
        assert steps > 3  # bounded steps, not one read of everything
        assert log.damage.records == 1 and log.damage.spans[0].first_offset == lost
        scrub.step(log, 1 << 20)  # a second pass finds nothing new
        assert log.damage.records == 1
        assert log.read(0, 200) == [r for r in records if r.offset != lost]
        scrubber = Scrubber()
        other = SegmentLog.open(str(tmp_path / "other"), CONFIG)
        for _ in range(10):
            scrubber.step([log, other], 1 << 20)
        other.close_blocking()
    finally:
        log.close_blocking()
