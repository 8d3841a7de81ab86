"""Recovery on open: torn tails cut at every byte, segments torn during a roll, index
rebuilds, and corruption that fails one log (with its segment and position) and nothing
else."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from streamq.log import format as fmt
from streamq.log.errors import RecordDamaged, SegmentCorrupted
from streamq.log.log import LogConfig, SegmentLog
from tests.unit.log.conftest import message

CONFIG = LogConfig(segment_bytes_max=2048, index_interval_bytes=256)


def build(directory: Path, count: int, size: int = 100) -> list[fmt.Record]:
    log = SegmentLog.open(str(directory), CONFIG)
    log.append([message(i, size=size) for i in range(count)], 1000)
    log.close_blocking()
    reopened = SegmentLog.open(str(directory), CONFIG)
    records = reopened.read(0, count)
    reopened.close_blocking()
    assert len(records) == count
    return records


def segment_path(directory: Path, base: int) -> Path:
    return directory / fmt.segment_name(base)


def last_record_span(directory: Path, records: list[fmt.Record]) -> tuple[Path, int, int]:
    """(segment file, start, end) of the newest record."""
    log = SegmentLog.open(str(directory), CONFIG)
    active = log.segments()[-1]
    log.close_blocking()
    path = segment_path(directory, active.base_offset)
    size = os.path.getsize(path)
    last = records[-1]
    record_bytes = fmt.record_size(
        fmt.Message(last.exchange, last.routing_key, last.properties, last.body)
    )
    return path, size - record_bytes, size


def mark_durable(directory: Path, offset: int) -> None:
    """The `durable` marker as a crash leaves it: a torn record was never durable (a
    record below the marker that is gone is damage, not a torn tail)."""
    (directory / fmt.DURABLE_FILE).write_bytes(fmt.encode_durable(offset))


def check_cut(directory: Path, records: list[fmt.Record], cut_offset: int) -> None:
    """Reopen: everything before the cut is intact, the cut record is gone, appends go on."""
    mark_durable(directory, cut_offset)
    log = SegmentLog.open(str(directory), CONFIG)
    assert log.next_offset == log.durable_next == cut_offset
    assert log.read(0, len(records)) == records[:cut_offset]
    assert log.append([message(999)], 2000) == cut_offset
    log.close_blocking()
    again = SegmentLog.open(str(directory), CONFIG)
    tail = again.read(cut_offset, 10)
    assert [(r.offset, r.body) for r in tail] == [(cut_offset, message(999).body)]
    again.close_blocking()


def test_torn_tail_cut_at_every_byte_of_the_last_record(tmp_path: Path) -> None:
    original = tmp_path / "original"
    records = build(original, 45)
    path, start, end = last_record_span(original, records)
    assert start > fmt.SEGMENT_HEADER_BYTES  # the last segment holds other records too
    for cut in range(start, end):
        work = tmp_path / f"cut-{cut}"
        shutil.copytree(original, work)
        with open(work / path.name, "r+b") as f:
            f.truncate(cut)
        check_cut(work, records, len(records) - 1)
        shutil.rmtree(work)


def test_torn_tail_when_the_last_record_is_alone_in_its_segment(tmp_path: Path) -> None:
    original = tmp_path / "original"
    records = build(original, 10, size=1500)  # one record per segment
    path, start, end = last_record_span(original, records)
    assert start == fmt.SEGMENT_HEADER_BYTES
    for cut in range(start, end, 7):
        work = tmp_path / f"cut-{cut}"
        shutil.copytree(original, work)
        with open(work / path.name, "r+b") as f:
            f.truncate(cut)
        check_cut(work, records, 9)
        shutil.rmtree(work)


def test_a_segment_header_torn_at_creation_is_rewritten(tmp_path: Path) -> None:
    records = build(tmp_path, 10, size=1500)
    log = SegmentLog.open(str(tmp_path), CONFIG)
    log.append([message(10, size=1500)], 1000)  # rolls: a new segment, base 10
    log.close_blocking()
    for cut in range(fmt.SEGMENT_HEADER_BYTES):
        with open(segment_path(tmp_path, 10), "r+b") as f:
            f.truncate(cut)
        reopened = SegmentLog.open(str(tmp_path), CONFIG)
        assert reopened.next_offset == 10
        assert reopened.read(0, 20) == records
        reopened.close_blocking()


def test_a_segment_torn_during_a_roll_is_cut_with_every_later_segment(tmp_path: Path) -> None:
    """A crash after the roll but before the round that seals the old segment: its index
    was never written, its tail is torn, and the newer segment holds records that were
    never reported durable. Recovery cuts the torn segment and deletes the later one."""
    records = build(tmp_path, 60)
    log = SegmentLog.open(str(tmp_path), CONFIG)
    infos = log.segments()
    log.close_blocking()
    old, newest = infos[-2], infos[-1]
    os.remove(tmp_path / fmt.index_name(old.base_offset))
    with open(segment_path(tmp_path, old.base_offset), "r+b") as f:
        f.truncate(old.size_bytes - 5)
    mark_durable(tmp_path, old.next_offset - 1)
    reopened = SegmentLog.open(str(tmp_path), CONFIG)
    assert reopened.next_offset == old.next_offset - 1
    assert not segment_path(tmp_path, newest.base_offset).exists()
    assert reopened.read(0, 100) == records[: old.next_offset - 1]
    assert reopened.append([message(1)], 1) == old.next_offset - 1
    reopened.close_blocking()


@pytest.mark.parametrize("damage", ["delete", "flip", "stale"])
def test_a_missing_or_bad_index_is_rebuilt(tmp_path: Path, damage: str) -> None:
    records = build(tmp_path, 60)
    log = SegmentLog.open(str(tmp_path), CONFIG)
    infos = log.segments()
    seeks = [log.seek_timestamp(t) for t in (0, 1000, 1001)]
    log.close_blocking()
    index = tmp_path / fmt.index_name(infos[1].base_offset)
    original = index.read_bytes()
    if damage == "delete":
        index.unlink()
    elif damage == "flip":
        data = bytearray(original)
        data[60] ^= 0xFF
        index.write_bytes(bytes(data))
    else:
        data = bytearray(original)
        data[24:32] = (infos[1].size_bytes - 1).to_bytes(8, "little")  # segment_bytes
        index.write_bytes(fmt.encode_index(*_index_fields(bytes(data))))
    reopened = SegmentLog.open(str(tmp_path), CONFIG)
    assert reopened.read(0, 100) == records
    assert [reopened.seek_timestamp(t) for t in (0, 1000, 1001)] == seeks
    assert reopened.segments() == infos
    reopened.close_blocking()
    assert index.read_bytes() == original


def _index_fields(data: bytes) -> tuple[int, int, int, int, list[tuple[int, int, int]]]:
    fields = fmt.INDEX_HEADER.unpack_from(data)
    entries = [
        (int(a), int(b), int(c))
        for a, b, c in fmt.INDEX_ENTRY.iter_unpack(data[fmt.INDEX_HEADER_BYTES :])
    ]
    return fields[3], fields[4], fields[5], fields[6], entries


def test_a_flipped_bit_in_a_closed_segment_loses_that_record_only(tmp_path: Path) -> None:
    """A sealed segment is trusted at open (its index checks); the damage is found when a
    reader reaches it: the damaged record is passed over, reported (the log's damage map)
    and never returned, every other record is, and the log goes on."""
    records = build(tmp_path / "a", 60)
    log = SegmentLog.open(str(tmp_path / "a"), CONFIG)
    other = SegmentLog.open(str(tmp_path / "b"), CONFIG)
    closed = log.segments()[1]
    path = segment_path(tmp_path / "a", closed.base_offset)
    position = closed.size_bytes // 2
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0x04]))
    read = log.read(0, 100)
    [lost] = [r.offset for r in records if r not in read]
    assert read == [r for r in records if r.offset != lost]
    assert log.damage.records == 1 and log.failed is None
    [span] = log.damage.spans
    assert span.path == str(path) and span.position <= position < span.end_position
    with pytest.raises(RecordDamaged, match=rf"{path.name} at position \d+: records {lost} "):
        log.read_record(lost)
    assert log.read_record(lost + 1) == records[lost + 1]
    first = log.append([message(0)], 1)
    assert log.sync_blocking() == first + 1
    log.close_blocking()
    other.append([message(i) for i in range(20)], 1)
    assert other.sync_blocking() == 20
    assert len(other.read(0, 100)) == 20
    other.close_blocking()


def test_damage_in_a_closed_segment_is_found_at_open_when_it_is_scanned(
    tmp_path: Path,
) -> None:
    """Without a usable index the closed segment is scanned at open; a bad record inside
    it is damage, not a torn tail to cut: the segment keeps its bytes, the damaged
    record alone is lost and the index is rebuilt around it."""
    records = build(tmp_path, 60)
    log = SegmentLog.open(str(tmp_path), CONFIG)
    closed = log.segments()[1]
    log.close_blocking()
    os.remove(tmp_path / fmt.index_name(closed.base_offset))
    path = segment_path(tmp_path, closed.base_offset)
    with open(path, "r+b") as f:
        f.seek(closed.size_bytes // 2)
        f.write(b"\xff\xff")
    reopened = SegmentLog.open(str(tmp_path), CONFIG)
    assert os.path.getsize(path) == closed.size_bytes  # nothing was cut
    assert reopened.damage.records == 1
    read = reopened.read(0, 100)
    assert len(read) == 59 and all(r in records for r in read)
    reopened.close_blocking()
    assert (tmp_path / fmt.index_name(closed.base_offset)).exists()


def test_a_gap_between_sealed_segments_is_corruption(tmp_path: Path) -> None:
    build(tmp_path, 60)
    log = SegmentLog.open(str(tmp_path), CONFIG)
    middle = log.segments()[1]
    log.close_blocking()
    os.remove(segment_path(tmp_path, middle.base_offset))
    with pytest.raises(SegmentCorrupted, match="gap in the log"):
        SegmentLog.open(str(tmp_path), CONFIG)


def test_a_segment_shorter_than_its_index_is_corruption(tmp_path: Path) -> None:
    build(tmp_path, 60)
    log = SegmentLog.open(str(tmp_path), CONFIG)
    closed = log.segments()[1]
    log.close_blocking()
    with open(segment_path(tmp_path, closed.base_offset), "r+b") as f:
        f.truncate(closed.size_bytes - 1)
    with pytest.raises(SegmentCorrupted, match="shorter than the"):
        SegmentLog.open(str(tmp_path), CONFIG)
