"""SegmentLog with format version 2 (streams): entries gathered into osiris chunks cut at
each sync round, a dense chunk index, reads as records, torn tails and damage per chunk,
and logs that hold version-1 and version-2 segments (docs/log-format.md)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamq.log import amqp10, chunk, frame
from streamq.log import format as fmt
from streamq.log._records import entry_crcs
from streamq.log.chunk import SimpleEntry, SubBatch
from streamq.log.errors import LogError
from streamq.log.log import LogConfig, SegmentLog
from streamq.queues.sub_entries import compress
from tests.unit.log.conftest import message

V2 = LogConfig(segment_bytes_max=4096, index_interval_bytes=256, format_version=2)


@pytest.fixture
def log2(tmp_path: Path) -> Iterator[SegmentLog]:
    opened = SegmentLog.open(str(tmp_path / "log"), V2)
    yield opened
    if opened.failed is None:
        opened.close_blocking()


def body(i: int, size: int = 20) -> bytes:
    return (f"m{i}-".encode() * size)[:size]


def frames(path: Path) -> list[tuple[int, chunk.ChunkHeader]]:
    """(position, header) of every frame of a version-2 segment file."""
    data = path.read_bytes()
    assert fmt.decode_segment_version(data) == 2
    out, at = [], fmt.SEGMENT_HEADER_BYTES
    while at < len(data) and data[at + frame.FRAME_HEAD_BYTES] != 0:  # not direct I/O padding
        header = frame.check_frame(data, at)
        out.append((at, header))
        at += frame.frame_bytes(header)
    return out


def test_a_round_makes_one_chunk_of_what_was_appended_before_it(
    log2: SegmentLog, tmp_path: Path
) -> None:
    assert log2.append_entries([SimpleEntry(body(i)) for i in range(3)], 1000) == 0
    assert log2.append_entries([SimpleEntry(body(3), b"red")], 1001) == 3
    assert log2.read(0, 10) == []  # not durable yet
    assert log2.sync_blocking() == 4
    assert log2.append_entries([SimpleEntry(body(4))], 999) == 4  # raised to 1001
    log2.sync_blocking()
    found = frames(tmp_path / "log" / fmt.segment_name(0))
    assert [(h.first_offset, h.num_records, h.timestamp_ms, h.epoch) for _, h in found] == [
        (0, 4, 1000, 1),
        (4, 1, 1001, 1),
    ]
    records = log2.read(0, 100)
    assert [r.offset for r in records] == [0, 1, 2, 3, 4]
    assert [r.body for r in records] == [body(i) for i in range(5)]
    assert [r.routing_key for r in records] == [b"", b"", b"", b"red", b""]
    assert all(amqp10.is_native(r.properties) for r in records)
    assert [r.timestamp_ms for r in records] == [1000, 1000, 1000, 1000, 1001]


def test_stored_chunk_is_osiris_bytes_with_bloom_and_trailer(
    log2: SegmentLog, tmp_path: Path
) -> None:
    log2.append_entries([SimpleEntry(b"a", b"red"), SimpleEntry(b"b")], 5, sequences={b"pub-1": 41})
    log2.sync_blocking()
    data = (tmp_path / "log" / fmt.segment_name(0)).read_bytes()
    ((position, header),) = frames(tmp_path / "log" / fmt.segment_name(0))
    at = position + frame.FRAME_HEAD_BYTES
    crcs = entry_crcs(b"".join(chunk.encode_entry(SimpleEntry(b)) for b in (b"a", b"b")))
    expected = chunk.encode_chunk(
        [SimpleEntry(b"a", b"red"), SimpleEntry(b"b")], 0, 5, epoch=1,
        trailer=frame.encode_trailer({b"pub-1": 41}, [(0, 1, b"red")], crcs),
    )  # fmt: skip
    assert data[at : at + header.size] == expected
    trailer = frame.parse_trailer(chunk.trailer_of(data, at, header))
    assert trailer == frame.Trailer({b"pub-1": 41}, [(0, 1, b"red")], crcs)


def test_check_trailer_checks_header_and_trailer_not_the_entries(
    log2: SegmentLog, tmp_path: Path
) -> None:
    log2.append_entries([SimpleEntry(b"abc", b"red")], 5, sequences={b"pub-1": 41})
    log2.sync_blocking()
    data = bytearray((tmp_path / "log" / fmt.segment_name(0)).read_bytes())
    ((position, header),) = frames(tmp_path / "log" / fmt.segment_name(0))
    size = frame.FRAME_HEAD_BYTES + header.size
    entries_at = position + frame.FRAME_HEAD_BYTES + chunk.HEADER_BYTES + header.bloom_size
    damaged = bytearray(data[position : position + size])
    damaged[entries_at - position] ^= 0x01  # an entry's byte: not what a trailer reader needs
    assert frame.check_trailer(damaged) == header
    with pytest.raises(frame.EntriesDamaged):
        frame.check_frame(damaged)
    damaged = bytearray(data[position : position + size])
    damaged[-1] ^= 0x01  # the trailer's last byte: the frame CRC32C fails
    with pytest.raises(chunk.ChunkInvalid, match="frame CRC32C"):
        frame.check_trailer(damaged)


@pytest.mark.parametrize("compression", [0, 1, 2, 3, 4])
def test_sub_entry_batches_are_stored_as_sent_and_read_as_their_messages(
    log2: SegmentLog, tmp_path: Path, compression: int
) -> None:
    messages = [body(i, 50) for i in range(7)]
    raw = compress(compression, messages)
    _kind, records, plain, _length = chunk.BATCH_HEADER.unpack_from(raw)
    batch = SubBatch(raw[chunk.BATCH_HEADER.size :], records, compression, plain)
    assert log2.append_entries([SimpleEntry(b"x"), batch, SimpleEntry(b"y")], 7) == 0
    log2.sync_blocking()
    assert log2.next_offset == 9
    data = (tmp_path / "log" / fmt.segment_name(0)).read_bytes()
    assert raw in data  # kept compressed, byte for byte
    assert [r.body for r in log2.read(0, 100)] == [b"x", *messages, b"y"]
    assert [r.offset for r in log2.read(3, 2)] == [3, 4]  # inside the batch
    assert log2.read_record(5).body == messages[4]


def test_chunks_roll_segments_and_reads_cross_them(log2: SegmentLog) -> None:
    expected = []
    for round_ in range(40):
        entries = [SimpleEntry(body(round_ * 5 + i, 100 + i)) for i in range(5)]
        expected += [e.data for e in entries]
        log2.append_entries(entries, 10 + round_)
        log2.sync_blocking()
    infos = log2.segments()
    assert len(infos) > 5
    for info, following in itertools.pairwise(infos):
        assert info.next_offset == following.base_offset
        assert info.size_bytes <= 4096
    for start in range(0, 200, 13):
        records = log2.read(start, 17)
        assert [r.offset for r in records] == list(range(start, min(200, start + 17)))
        assert [r.body for r in records] == expected[start : start + 17]
    assert log2.seek_timestamp(25) == 75  # round 15's chunk
    assert log2.seek_timestamp(1000) == 200


def test_a_large_append_is_cut_at_the_chunk_size_limit(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes_max=1 << 20, chunk_data_bytes_max=1000, format_version=2)
    log = SegmentLog.open(str(tmp_path / "log"), config)
    log.append_entries([SimpleEntry(body(i, 96)) for i in range(25)], 1)
    log.append_entries([SimpleEntry(b"z" * 3000)], 1)  # alone: over the limit
    log.sync_blocking()
    found = frames(tmp_path / "log" / fmt.segment_name(0))
    assert [h.num_records for _, h in found] == [10, 10, 5, 1]
    assert all(h.data_length <= 1000 for _, h in found[:3])
    assert [r.offset for r in log.read(0, 100)] == list(range(26))
    log.close_blocking()


def test_records_cannot_be_appended_to_a_chunk_log(log2: SegmentLog) -> None:
    with pytest.raises(LogError):
        log2.append([message(1)], 1)
    with pytest.raises(LogError):
        log2.append_one(b"", b"", b"\x00\x00", b"x", 1)


def test_reopen_reads_the_index_of_sealed_segments_and_scans_the_active(
    tmp_path: Path,
) -> None:
    log = SegmentLog.open(str(tmp_path / "log"), V2)
    for round_ in range(30):
        log.append_entries([SimpleEntry(body(round_, 300))], round_)
        log.sync_blocking()
    before = log.segments()
    log.close_blocking()
    assert any(name.endswith(".idx") for name in os.listdir(tmp_path / "log"))
    log = SegmentLog.open(str(tmp_path / "log"), V2)
    assert log.segments() == before
    assert [r.body for r in log.read(0, 100)] == [body(i, 300) for i in range(30)]
    log.append_entries([SimpleEntry(b"more")], 99)
    log.sync_blocking()
    assert log.read(30, 1)[0].body == b"more"
    log.close_blocking()


def test_a_torn_last_chunk_is_cut_at_recovery(tmp_path: Path) -> None:
    log = SegmentLog.open(str(tmp_path / "log"), V2)
    log.append_entries([SimpleEntry(b"one")], 1)
    log.sync_blocking()
    log.append_entries([SimpleEntry(b"two"), SimpleEntry(b"three")], 2)
    log.sync_blocking()
    log.close_blocking()
    path = tmp_path / "log" / fmt.segment_name(0)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 3)  # the second chunk torn
    (tmp_path / "log" / fmt.DURABLE_FILE).write_bytes(fmt.encode_durable(1))
    log = SegmentLog.open(str(tmp_path / "log"), V2)
    assert log.next_offset == 1
    assert [r.body for r in log.read(0, 10)] == [b"one"]
    assert path.stat().st_size < size - 3
    log.close_blocking()


@pytest.mark.parametrize("where", ["entries", "header"])
def test_a_damaged_chunk_followed_by_a_valid_one_loses_its_offsets_alone(
    tmp_path: Path, where: str
) -> None:
    """A flip in an entry loses that entry (its own CRC32C in the trailer); one in the
    chunk's header (the frame CRC32C fails) loses the chunk."""
    log = SegmentLog.open(str(tmp_path / "log"), V2)
    for i in range(3):
        log.append_entries([SimpleEntry(body(i, 40)), SimpleEntry(body(i + 10, 40))], i)
        log.sync_blocking()
    log.close_blocking()
    path = tmp_path / "log" / fmt.segment_name(0)
    (position, _header) = frames(path)[1]
    with open(path, "r+b") as f:  # a flipped bit in the second chunk
        into = chunk.HEADER_BYTES + 10 if where == "entries" else 12  # 12: the timestamp
        at = position + frame.FRAME_HEAD_BYTES + into
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    log = SegmentLog.open(str(tmp_path / "log"), V2)
    assert log.next_offset == 6
    lost = (2, 3) if where == "entries" else (2, 4)
    kept = [n for n in range(6) if not lost[0] <= n < lost[1]]
    assert [r.offset for r in log.read(0, 10)] == kept
    assert [(s.first_offset, s.end_offset) for s in log.damage.spans] == [lost]
    log.close_blocking()


def test_damage_met_by_a_reader_loses_that_entry_only(log2: SegmentLog, tmp_path: Path) -> None:
    for i in range(3):
        log2.append_entries([SimpleEntry(body(i, 40))], i)
        log2.sync_blocking()
    path = tmp_path / "log" / fmt.segment_name(0)
    (position, _header) = frames(path)[1]
    with open(path, "r+b") as f:
        f.seek(position + frame.FRAME_HEAD_BYTES + chunk.HEADER_BYTES + 6)
        f.write(b"\xff")
    assert [r.offset for r in log2.read(0, 10)] == [0, 2]
    assert [(s.first_offset, s.end_offset) for s in log2.damage.spans] == [(1, 2)]


def test_a_version_1_log_goes_on_in_version_2_segments(tmp_path: Path) -> None:
    v1 = LogConfig(segment_bytes_max=4096, index_interval_bytes=256)
    log = SegmentLog.open(str(tmp_path / "log"), v1)
    log.append([message(i) for i in range(5)], 1)
    log.sync_blocking()
    log.close_blocking()
    log = SegmentLog.open(str(tmp_path / "log"), V2)
    log.append_entries([SimpleEntry(b"v2-a"), SimpleEntry(b"v2-b")], 2)
    log.sync_blocking()
    records = log.read(0, 100)
    assert [r.offset for r in records] == list(range(7))
    assert [r.body for r in records[:5]] == [message(i).body for i in range(5)]
    assert [r.exchange for r in records[:5]] == [b"amq.direct"] * 5  # version 1 as it is
    assert [r.body for r in records[5:]] == [b"v2-a", b"v2-b"]
    assert [s.base_offset for s in log.segments()] == [0, 5]
    log.close_blocking()
    log = SegmentLog.open(str(tmp_path / "log"), V2)
    assert [r.offset for r in log.read(0, 100)] == list(range(7))
    assert log.seek_timestamp(2) == 5
    log.close_blocking()


def test_an_empty_version_1_log_starts_writing_version_2(tmp_path: Path) -> None:
    SegmentLog.open(str(tmp_path / "log"), LogConfig()).close_blocking()
    log = SegmentLog.open(str(tmp_path / "log"), V2)
    log.append_entries([SimpleEntry(b"x")], 1)
    log.sync_blocking()
    assert len(frames(tmp_path / "log" / fmt.segment_name(0))) == 1
    log.close_blocking()


def test_damage_is_passed_over_across_the_resync_window(tmp_path: Path) -> None:
    """A damaged chunk larger than the search's read window (1 MiB): the next valid frame
    is found in a later window."""
    config = LogConfig(format_version=2)
    log = SegmentLog.open(str(tmp_path / "log"), config)
    for entries in ([SimpleEntry(b"a")], [SimpleEntry(b"big" * 600_000)], [SimpleEntry(b"c")]):
        log.append_entries(entries, 1)
        log.sync_blocking()
    log.append_entries([SimpleEntry(b"d")], 1)  # the damage is then not at the tail
    log.sync_blocking()
    log.close_blocking()
    path = tmp_path / "log" / fmt.segment_name(0)
    (position, _header) = frames(path)[1]
    with open(path, "r+b") as f:  # the big chunk's magic: nothing of it reads as a frame
        f.seek(position + frame.FRAME_HEAD_BYTES)
        f.write(b"\x00")
    log = SegmentLog.open(str(tmp_path / "log"), config)
    assert [r.body for r in log.read(0, 10)] == [b"a", b"c", b"d"]
    assert [(s.first_offset, s.end_offset) for s in log.damage.spans] == [(1, 2)]
    log.close_blocking()


def epochs(directory: Path) -> list[tuple[int, int]]:
    """(first offset, epoch) of every chunk of every segment, in offset order."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(fmt.SEGMENT_SUFFIX))
    return [(h.first_offset, h.epoch) for name in names for _, h in frames(directory / name)]


def test_each_opening_of_the_log_begins_a_new_epoch(tmp_path: Path) -> None:
    """As osiris bumps its writer's epoch at each election, a log's chunks get one more
    than the newest stored chunk's each time the log is opened for writes (a restart, or
    a node taking over as leader); epochs never decrease, also across segments, and an
    opening that wrote nothing leaves no trace."""
    directory = tmp_path / "log"
    expected: list[tuple[int, int]] = []
    offset = 0
    for opening, rounds in enumerate((2, 0, 3, 1), start=1):
        log = SegmentLog.open(str(directory), V2)
        for _ in range(rounds):
            log.append_entries([SimpleEntry(body(offset, 1500))], 1000)
            log.sync_blocking()
            expected.append((offset, opening - (opening > 2)))  # the second wrote nothing
            offset += 1
        log.close_blocking()
    assert epochs(directory) == expected
    assert len([n for n in os.listdir(directory) if n.endswith(fmt.SEGMENT_SUFFIX)]) > 2
    reopened = SegmentLog.open(str(directory), V2)
    assert [r.offset for r in reopened.read(0, 100)] == list(range(offset))
    reopened.close_blocking()
