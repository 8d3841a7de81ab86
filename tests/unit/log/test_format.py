"""The on-disk format: records, segment headers and index files round-trip, and every
integrity check rejects damaged bytes."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from streamq.log import format as fmt
from streamq.log.errors import SegmentCorrupted

shortstr = st.binary(max_size=255)
messages = st.builds(
    fmt.Message, shortstr, shortstr, st.binary(max_size=300), st.binary(max_size=2000)
)


def decode_all(buffer: bytes, first_offset: int) -> list[fmt.Record]:
    out: list[fmt.Record] = []
    result = fmt.decode_records(buffer, 0, 0, first_offset, 1 << 64, out, 1 << 30, "seg")
    assert result.complete
    assert result.position == len(buffer)
    return out


@given(st.lists(messages, max_size=20), st.integers(0, 1 << 40), st.integers(0, 1 << 50))
def test_records_round_trip(batch: list[fmt.Message], first: int, timestamp_ms: int) -> None:
    buffer = b"".join(fmt.encode_record(first + i, timestamp_ms, m) for i, m in enumerate(batch))
    records = decode_all(buffer, first)
    assert [r.offset for r in records] == list(range(first, first + len(batch)))
    assert [fmt.Message(r.exchange, r.routing_key, r.properties, r.body) for r in records] == batch
    assert all(r.timestamp_ms == timestamp_ms for r in records)
    assert len(buffer) == sum(fmt.record_size(m) for m in batch)


def test_record_layout_matches_the_documented_bytes() -> None:
    record = fmt.encode_record(
        7, 1_700_000_000_000, fmt.Message(b"ex", b"key", b"\x80\x00", b"hello")
    )
    length, crc, offset, ts, lex, lrk, flags, lprops = struct.unpack_from("<IIQqBBHI", record)
    assert length == len(record) - 4
    assert crc == crc32c(record[8:])
    assert (offset, ts, lex, lrk, flags, lprops) == (7, 1_700_000_000_000, 2, 3, 0, 2)
    assert record[32:] == b"ex" + b"key" + b"\x80\x00" + b"hello"


def test_decode_stops_at_a_partial_record_without_error() -> None:
    record = fmt.encode_record(0, 1, fmt.Message(b"", b"", b"", b"x" * 50))
    out: list[fmt.Record] = []
    assert fmt.decode_records(b"", 0, 0, 0, 10, out, 10, "seg") == fmt.DecodeResult(0, 0, True)
    for cut in range(1, len(record)):
        result = fmt.decode_records(record[:cut], 0, 0, 0, 10, out, 10, "seg")
        assert result == fmt.DecodeResult(0, 0, False)
    assert out == []


@pytest.mark.parametrize("byte", [4, 9, 20, 30, 40])
def test_decode_rejects_a_flipped_bit(byte: int) -> None:
    record = bytearray(fmt.encode_record(0, 1, fmt.Message(b"ex", b"rk", b"", b"payload-bytes")))
    record[byte] ^= 0x10
    with pytest.raises(
        SegmentCorrupted, match=r"seg at position 100: (record checksum mismatch|bad record length)"
    ):
        fmt.decode_records(bytes(record), 100, 0, 0, 10, [], 10, "seg")


def test_decode_rejects_an_offset_out_of_sequence() -> None:
    buffer = fmt.encode_record(0, 1, fmt.Message(b"", b"", b"", b"a")) + fmt.encode_record(
        2, 1, fmt.Message(b"", b"", b"", b"b")
    )
    with pytest.raises(SegmentCorrupted, match=r"record offset 2 .* where 1 was expected"):
        fmt.decode_records(buffer, 0, 0, 0, 10, [], 10, "seg")


def test_decode_rejects_a_length_shorter_than_the_header() -> None:
    record = bytearray(fmt.encode_record(0, 1, fmt.Message(b"abc", b"", b"", b"")))
    struct.pack_into("<I", record, 0, 10)
    with pytest.raises(SegmentCorrupted, match="bad record length 10"):
        fmt.decode_records(bytes(record), 0, 0, 0, 10, [], 10, "seg")
    assert fmt.check_record(bytes(record), 0) is None


def test_check_record_reports_offset_timestamp_and_size() -> None:
    record = fmt.encode_record(5, 99, fmt.Message(b"e", b"r", b"p", b"body"))
    assert fmt.check_record(record, 0) == (5, 99, len(record))
    assert fmt.check_record(record[:-1], 0) is None


def test_decode_honours_offset_end_records_max_and_skip_before() -> None:
    batch = [fmt.Message(b"", b"", b"", bytes([i])) for i in range(10)]
    buffer = b"".join(fmt.encode_record(i, 0, m) for i, m in enumerate(batch))
    out: list[fmt.Record] = []
    result = fmt.decode_records(buffer, 0, 0, 0, 8, out, 3, "seg", skip_before=4)
    assert [r.offset for r in out] == [4, 5, 6]
    assert result.next_offset == 7 and result.complete
    out.clear()
    result = fmt.decode_records(buffer, 0, 0, 0, 5, out, 100, "seg")
    assert [r.offset for r in out] == [0, 1, 2, 3, 4]


def test_segment_header_round_trip_and_checks() -> None:
    header = fmt.encode_segment_header(123, 456)
    assert len(header) == fmt.SEGMENT_HEADER_BYTES and header[:4] == b"SQSG"
    assert fmt.decode_segment_header(header, "p") == 123
    with pytest.raises(SegmentCorrupted, match="truncated"):
        fmt.decode_segment_header(header[:31], "p")
    with pytest.raises(SegmentCorrupted, match="bad segment magic"):
        fmt.decode_segment_header(b"XXXX" + header[4:], "p")
    future = bytearray(header)
    assert fmt.decode_segment_version(header) == 1
    assert fmt.decode_segment_version(fmt.encode_segment_header(123, 456, 2)) == 2
    struct.pack_into("<H", future, 4, 3)  # its CRC not updated: damage
    with pytest.raises(SegmentCorrupted, match="unsupported segment format version 3"):
        fmt.decode_segment_header(bytes(future), "p")
    damaged = bytearray(header)
    damaged[10] ^= 1
    with pytest.raises(SegmentCorrupted, match="checksum"):
        fmt.decode_segment_header(bytes(damaged), "p")


def test_index_round_trip_and_damage_is_reported_as_none() -> None:
    entries = [(0, 32, 1000), (40, 4200, 1001), (81, 8300, 1005)]
    data = fmt.encode_index(500, 620, 9000, 1010, entries)
    assert fmt.decode_index(data) == fmt.IndexFile(500, 620, 9000, 1010, entries)
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x01
        assert fmt.decode_index(bytes(damaged)) is None
    assert fmt.decode_index(data[:-1]) is None
    assert fmt.decode_index(b"") is None


def test_durable_marker_round_trip() -> None:
    data = fmt.encode_durable(12345)
    assert fmt.decode_durable(data) == 12345
    assert fmt.decode_durable(data[:-1]) is None
    assert fmt.decode_durable(b"\x00" * len(data)) is None


def test_segment_names_sort_by_offset_and_parse_back() -> None:
    names = [fmt.segment_name(o) for o in (0, 9, 10, 1 << 63)]
    assert sorted(names) == names
    assert [fmt.parse_segment_name(n) for n in names] == [0, 9, 10, 1 << 63]
    for bad in ("0.seg", "0000000000000000000a.seg", fmt.index_name(1), "durable"):
        assert fmt.parse_segment_name(bad) is None
