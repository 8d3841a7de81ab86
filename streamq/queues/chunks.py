"""Osiris chunks for stream-protocol consumers, built from a stream's segment bytes.

Owns the chunk layout RabbitMQ's stream protocol delivers (osiris, chunk format 0): a
48-byte big-endian header, then simple entries `u32 size (top bit 0) | message` with
contiguous offsets. The entries are built in C (`_streamwire.chunk_add`) from the bytes
`SegmentLog.view_at` returns (a view of the file's mapping for a sealed segment, in
memory for the newest records, else one pread per span of whole records): a native
record's entry is its body; an AMQP 0-9-1 record's is its AMQP 1.0 conversion
(`amqp10.to_amqp10`, called back from C). A record's 32-byte header
differs from an entry's 4-byte size, so `os.sendfile` cannot send segment bytes as a
chunk: each chunk is one copy of the bodies (docs/stream-protocol.md).

Chunk header (big-endian)::

    0   1  magic_version    0x50 (osiris magic 5, chunk format 0)
    1   1  chunk_type       0 (user records)
    2   2  num_entries      u16
    4   4  num_records      u32 (= num_entries: no sub-entry batches)
    8   8  timestamp        i64, ms: the append time of the first record
    16  8  epoch            u64, 0 (one node writes the log)
    24  8  chunk_first_offset  u64
    32  4  chunk_crc        CRC32 (zlib's) of the entries (_streamwire.crc32: PCLMULQDQ)
    36  4  data_length      u32, bytes of entries
    40  4  trailer_length   u32, 0
    44  1  bloom_filter_size  0
    45  3  reserved         0
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from streamq.log import amqp10
from streamq.log import format as fmt
from streamq.log._records import check_records
from streamq.log._streamwire import chunk_add as _chunk_add
from streamq.log._streamwire import crc32 as _crc32
from streamq.log.log import SegmentLog

CHUNK_HEADER: Final = struct.Struct(">BBHIqQQIIII")
CHUNK_HEADER_BYTES: Final = CHUNK_HEADER.size  # 48
MAGIC_VERSION: Final = 0x50
CHUNK_TYPE_USER: Final = 0
ENTRIES_MAX: Final = 0xFFFF  # num_entries is a u16
# A chunk's first read of segment bytes is sized from its limits; each further read
# doubles, up to the cap.
READ_BYTES_MIN: Final = 64 * 1024
READ_RECORD_OVERHEAD: Final = 48  # a record's bytes beyond its entry's, without a reference
READ_BYTES_MAX: Final = 4 * 1024 * 1024
# A filtered read passes over at most this many bytes of records before it returns what
# it has (maybe an empty chunk): a rare filter value costs bounded work per call.
SCAN_BYTES_MAX: Final = 16 * 1024 * 1024


class ChunkFilter(NamedTuple):
    """A consumer's filter: records whose filter value is one of `values`, and those
    without a filter value if `match_unfiltered`."""

    values: frozenset[bytes]
    match_unfiltered: bool


class Chunk(NamedTuple):
    first_offset: int  # -1 when records is 0
    # Where the next read continues: past the records passed over by the filter too.
    next_offset: int
    # Entries in the chunk. 0 only with a filter: records were passed over and none was
    # taken (data is then b""); read on from next_offset.
    records: int
    # The whole chunk, header included, ready to follow Deliver's header (a view of a
    # stored chunk's bytes for a version-2 segment: `stored_chunks`).
    data: bytes | bytearray | memoryview
    # Where `data` also is in a segment file, complete and durable: (descriptor, position,
    # length), for `os.sendfile` (valid until the log is next used); None otherwise.
    file: tuple[int, int, int] | None = None


def read_chunk(
    log: SegmentLog,
    offset: int,
    records_max: int,
    bytes_max: int,
    filter: ChunkFilter | None = None,
) -> Chunk | None:
    """One chunk of `log`'s durable records from `offset` (raised to the log's start):
    at most `records_max` entries (and 65535) and `bytes_max` bytes of entries (the
    first entry always goes in); with a filter, only matching records, and a skipped
    run ends the chunk. None when no durable record is at or after `offset`.

    Records lost to damage on disk are passed over (`SegmentLog.resolve_damage`): a chunk
    ends before them, and the next starts after them. Raises the log's errors
    (LogFailed, OffsetOutOfRange when retention drops the segment meanwhile).
    """
    offset = max(offset, log.start_offset)
    end = log.durable_next
    if offset >= end:
        return None
    records_max = min(records_max, ENTRIES_MAX)
    base, position, at = log.locate(offset)
    out = bytearray(CHUNK_HEADER_BYTES)
    values = None if filter is None else tuple(filter.values)
    unfiltered = filter is not None and filter.match_unfiltered
    records, first, timestamp_ms, closed = 0, -1, 0, False
    # The first read is about what the chunk will take (an entry is a record less its
    # header, properties and reference), so that little is read twice.
    size = min(max(bytes_max + records_max * READ_RECORD_OVERHEAD, READ_BYTES_MIN), READ_BYTES_MAX)
    scanned = 0
    while at < end and scanned < SCAN_BYTES_MAX:
        data = log.view_at(base, position, size)
        if not data:  # the end of a segment: the next one starts with the next offset
            following = log.segment_after(base)
            if following is None:
                break
            base, position = following, fmt.SEGMENT_HEADER_BYTES
            continue
        mark = len(out)
        try:
            used, at, records, first, timestamp_ms, closed, full = _chunk_add(
                out, data, 0, at, offset, end, records_max, bytes_max,
                amqp10.to_amqp10, values, unfiltered, records, first, timestamp_ms, closed,
            )  # fmt: skip
        except ValueError:
            del out[mark:]  # what the call added: it goes again, up to the damage
            used, _, _ = check_records(data, 0, at)
            if used == 0:
                # A damaged record next (bit rot): its span is passed over, lost; a chunk
                # holds contiguous offsets, so one with entries ends before it.
                if records:
                    break
                position, at = _past_damage(log, base, position, at)
                continue
            size = used  # the records before the damage, then the damage alone
            continue
        position += used
        scanned += used
        if full:
            break
        need = 4 + int.from_bytes(data[:4], "little") if len(data) >= 4 else 0
        if used == 0 and need > len(data) and len(data) < size:
            # Longer than what is left of the segment: a damaged length.
            if records:
                break
            position, at = _past_damage(log, base, position, at)
        elif used == 0 and len(data) >= 4:  # one record larger than the read
            size = max(size, need)
        else:
            size = min(size * 2, READ_BYTES_MAX)
    if records == 0:
        return Chunk(-1, at, 0, b"") if at > offset else None
    crc = _crc32(out, CHUNK_HEADER_BYTES)
    data_length = len(out) - CHUNK_HEADER_BYTES
    CHUNK_HEADER.pack_into(
        out, 0, MAGIC_VERSION, CHUNK_TYPE_USER, records, records, timestamp_ms, 0, first,
        crc, data_length, 0, 0,
    )  # fmt: skip
    return Chunk(first, at, records, out)  # no copy: the chunk is not changed after


def _past_damage(log: SegmentLog, base: int, position: int, offset: int) -> tuple[int, int]:
    """Where records resume after the damaged record at `position` (which should hold
    `offset`) of the segment at `base`: its span's end, position and offset."""
    span = log.resolve_damage(base, position, offset)
    return span.end_position, span.end_offset
