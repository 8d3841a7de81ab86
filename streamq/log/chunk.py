"""The osiris chunk: the unit a version-2 stream segment stores and a Deliver sends.

Owns the byte layout of one chunk as RabbitMQ's osiris writes it (chunk format 0, magic
5) and nothing else: pure encode, decode and check functions over buffers, no I/O, no
state (docs/log-format-v2.md, DRAFT, issue 32, is the normative description). Nothing in
the log uses it yet.

All integers are big-endian. A chunk is a 48-byte header, the bloom filter, the entries
and the trailer, back to back::

    0   1  magic_version      0x50: magic 5 (high nibble), chunk format 0 (low nibble)
    1   1  chunk_type         0 user, 1 tracking delta, 2 tracking snapshot
    2   2  num_entries        u16
    4   4  num_records        u32: simple entries count 1, a sub-entry batch its records
    8   8  timestamp          i64, ms
    16  8  epoch              u64
    24  8  chunk_first_offset u64 (osiris' chunk id)
    32  4  chunk_crc          CRC32 (zlib's) of the entries only
    36  4  data_length        u32, bytes of entries
    40  4  trailer_length     u32
    44  1  bloom_filter_size  u8: 0, or 16..255
    45  3  reserved           ignored, as osiris does (written 0)

A simple entry is `u32 size` (top bit 0) then the message; a sub-entry batch is
`u8 1ccc0000` (c: compression, 0 none 1 gzip 2 snappy 3 lz4 4 zstd), `u16 records`,
`u32 uncompressed length`, `u32 length`, then the body as the producer sent it.

The bloom filter is osiris_bloom's (`bloom`): none (size 0) when no entry has a filter
value.

The trailer (user chunks) is osiris_tracking's delta: `u8 type` (0 sequence, 1 offset,
2 timestamp), `u8 id size`, id, `u64 value` (i64 for timestamps); a publisher's
reference with its highest publishing id in the chunk is a sequence record. A tracking
snapshot entry has the same records, except that a sequence carries `u64 chunk id`
before the sequence.

A stream-protocol Deliver carries the 48-byte header unchanged followed by the entries
alone (osiris skips the filter and the trailer: `deliver_spans`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Final, NamedTuple

from streamq.log._streamwire import crc32 as _crc32
from streamq.log.bloom import BLOOM_SIZE_DEFAULT, BLOOM_SIZE_MAX, BLOOM_SIZE_MIN, bloom_filter

MAGIC: Final = 5
CHUNK_FORMAT: Final = 0
MAGIC_VERSION: Final = MAGIC << 4 | CHUNK_FORMAT  # 0x50
CHUNK_TYPE_USER: Final = 0
CHUNK_TYPE_TRACKING_DELTA: Final = 1
CHUNK_TYPE_TRACKING_SNAPSHOT: Final = 2
CHUNK_TYPES: Final = frozenset(
    {CHUNK_TYPE_USER, CHUNK_TYPE_TRACKING_DELTA, CHUNK_TYPE_TRACKING_SNAPSHOT}
)

HEADER: Final = struct.Struct(">BBHIqQQIIIB3x")
HEADER_BYTES: Final = HEADER.size  # 48
ENTRIES_MAX: Final = 0xFFFF  # num_entries is a u16
SIMPLE_ENTRY_BYTES_MAX: Final = 0x7FFFFFFF  # a simple entry's size is 31 bits
SIMPLE_SIZE: Final = struct.Struct(">I")
BATCH_HEADER: Final = struct.Struct(">BHII")  # type byte, records, uncompressed, length
BATCH_RECORDS_MAX: Final = 0xFFFF
BATCH_FLAG: Final = 0x80
COMPRESSION_SHIFT: Final = 4
COMPRESSION_MASK: Final = 0x70
BATCH_RESERVED_MASK: Final = 0x0F
COMPRESSION_NONE: Final = 0
COMPRESSION_GZIP: Final = 1
COMPRESSION_SNAPPY: Final = 2
COMPRESSION_LZ4: Final = 3
COMPRESSION_ZSTD: Final = 4
COMPRESSION_MAX: Final = COMPRESSION_ZSTD  # 5 is "extension" in the protocol: refused
U32_MAX: Final = 0xFFFFFFFF
U64_MAX: Final = 0xFFFFFFFFFFFFFFFF

FILTER_VALUE_BYTES_MAX: Final = 0x7FFF  # Publish v2: an i16 length

TRACKING_SEQUENCE: Final = 0
TRACKING_OFFSET: Final = 1
TRACKING_TIMESTAMP: Final = 2
TRACKING_ID_BYTES_MAX: Final = 255  # a u8 size
_TRACKING_HEAD: Final = struct.Struct(">BB")
_U64: Final = struct.Struct(">Q")
_I64: Final = struct.Struct(">q")


class ChunkInvalid(ValueError):
    """The bytes are not a valid chunk (damage, or not a chunk at all)."""


class ChunkTruncated(ChunkInvalid):
    """Fewer bytes than the header says the chunk has: a torn tail at a file's end."""


class SimpleEntry(NamedTuple):
    data: bytes  # the message as sent (an AMQP 1.0 message, normally)
    filter_value: bytes = b""  # b"": none


class SubBatch(NamedTuple):
    data: bytes  # the batch body as the producer sent it (compressed or not)
    records: int
    compression: int = COMPRESSION_NONE
    uncompressed_length: int = 0  # as the producer declared it; len(data) when none
    filter_value: bytes = b""


Entry = SimpleEntry | SubBatch


class ChunkHeader(NamedTuple):
    chunk_type: int
    num_entries: int
    num_records: int
    timestamp_ms: int
    epoch: int
    first_offset: int
    crc: int
    data_length: int
    trailer_length: int
    bloom_size: int

    @property
    def size(self) -> int:
        """The whole chunk's bytes, header included."""
        return HEADER_BYTES + self.bloom_size + self.data_length + self.trailer_length

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.num_records


class EntryView(NamedTuple):
    offset: int  # the offset of its first record
    records: int  # 1 for a simple entry
    batch: bool
    compression: int
    uncompressed_length: int  # a simple entry's: its size
    data: memoryview  # the message, or the batch body


class TrackingRecord(NamedTuple):
    kind: int  # TRACKING_SEQUENCE, TRACKING_OFFSET or TRACKING_TIMESTAMP
    id: bytes
    value: int
    chunk_id: int = -1  # a snapshot's sequence records only


def encode_entry(entry: Entry) -> bytes:
    """One entry's bytes, its size or batch header included."""
    if isinstance(entry, SimpleEntry):
        if len(entry.data) > SIMPLE_ENTRY_BYTES_MAX:
            raise ValueError(f"entry of {len(entry.data)} bytes over {SIMPLE_ENTRY_BYTES_MAX}")
        return SIMPLE_SIZE.pack(len(entry.data)) + entry.data
    if not 0 <= entry.compression <= COMPRESSION_MAX:
        raise ValueError(f"unknown compression {entry.compression}")
    if not 1 <= entry.records <= BATCH_RECORDS_MAX:
        raise ValueError(f"sub-entry batch of {entry.records} records")
    if len(entry.data) > U32_MAX or not 0 <= entry.uncompressed_length <= U32_MAX:
        raise ValueError("sub-entry batch length over a u32")
    kind = BATCH_FLAG | entry.compression << COMPRESSION_SHIFT
    head = BATCH_HEADER.pack(kind, entry.records, entry.uncompressed_length, len(entry.data))
    return head + entry.data


def encode_chunk(
    entries: Iterable[Entry],
    first_offset: int,
    timestamp_ms: int,
    epoch: int = 0,
    trailer: bytes = b"",
    bloom_size: int = BLOOM_SIZE_DEFAULT,
    chunk_type: int = CHUNK_TYPE_USER,
) -> bytes:
    """A chunk of `entries` (at least one, at most 65535) from `first_offset`, as osiris'
    make_chunk writes it: the filter from the entries' filter values (`bloom_size`
    bytes, or none when no entry has one), the CRC32 of the entries."""
    if not BLOOM_SIZE_MIN <= bloom_size <= BLOOM_SIZE_MAX:
        raise ValueError(
            f"bloom filter size {bloom_size} outside {BLOOM_SIZE_MIN}..{BLOOM_SIZE_MAX}"
        )
    if chunk_type not in CHUNK_TYPES:
        raise ValueError(f"unknown chunk type {chunk_type}")
    parts: list[bytes] = []
    values: set[bytes] = set()
    records = 0
    for entry in entries:
        parts.append(encode_entry(entry))
        values.add(entry.filter_value)
        records += entry.records if isinstance(entry, SubBatch) else 1
    if not 1 <= len(parts) <= ENTRIES_MAX:
        raise ValueError(f"a chunk holds 1..{ENTRIES_MAX} entries, not {len(parts)}")
    if first_offset + records > U64_MAX or not 0 <= epoch <= U64_MAX or first_offset < 0:
        raise ValueError("offset or epoch outside a u64")
    data = b"".join(parts)
    bloom = bloom_filter(values, bloom_size)
    header = HEADER.pack(
        MAGIC_VERSION, chunk_type, len(parts), records, timestamp_ms, epoch, first_offset,
        _crc32(data, 0), len(data), len(trailer), len(bloom),
    )  # fmt: skip
    return b"".join((header, bloom, data, trailer))


def decode_header(buffer: bytes | bytearray | memoryview, pos: int = 0) -> ChunkHeader:
    """The header at `pos`, checked for what the header alone can show. Raises
    ChunkTruncated when fewer than 48 bytes are left, ChunkInvalid for a bad magic or
    version, an unknown chunk type, a filter size of 1..15, no entries, or fewer records
    than entries."""
    if len(buffer) - pos < HEADER_BYTES:
        raise ChunkTruncated(
            f"{len(buffer) - pos} bytes left for a {HEADER_BYTES}-byte chunk header"
        )
    fields = HEADER.unpack_from(buffer, pos)
    magic_version, header = fields[0], ChunkHeader(*fields[1:])
    if magic_version != MAGIC_VERSION:
        raise ChunkInvalid(
            f"chunk magic and version {magic_version:#04x}, not {MAGIC_VERSION:#04x}"
        )
    if header.chunk_type not in CHUNK_TYPES:
        raise ChunkInvalid(f"unknown chunk type {header.chunk_type}")
    if 0 < header.bloom_size < BLOOM_SIZE_MIN:
        raise ChunkInvalid(f"bloom filter size {header.bloom_size} below {BLOOM_SIZE_MIN}")
    if header.num_entries == 0 or header.num_records < header.num_entries:
        raise ChunkInvalid(f"{header.num_entries} entries and {header.num_records} records")
    if header.first_offset + header.num_records > U64_MAX:
        raise ChunkInvalid("the chunk's offsets pass a u64")
    return header


def check_chunk(buffer: bytes | bytearray | memoryview, pos: int = 0) -> ChunkHeader:
    """The header of the whole chunk at `pos`, its entries' CRC checked (and with
    iter_entries, their framing). Raises ChunkTruncated when the buffer ends inside the
    chunk, ChunkInvalid for anything else wrong."""
    header = decode_header(buffer, pos)
    if len(buffer) - pos < header.size:
        raise ChunkTruncated(f"{len(buffer) - pos} bytes left for a {header.size}-byte chunk")
    start = pos + HEADER_BYTES + header.bloom_size
    data = memoryview(buffer)[start : start + header.data_length]
    if _crc32(data, 0) != header.crc:
        raise ChunkInvalid(f"chunk at offset {header.first_offset}: the entries' CRC32 fails")
    for _ in iter_entries(buffer, pos, header):
        pass
    return header


def iter_entries(
    buffer: bytes | bytearray | memoryview, pos: int = 0, header: ChunkHeader | None = None
) -> Iterator[EntryView]:
    """The entries of the chunk at `pos` (its CRC not checked: see check_chunk). Raises
    ChunkInvalid when the entries do not fill data_length exactly, their count or record
    count differs from the header's, or a batch has reserved bits or an unknown codec."""
    if header is None:
        header = decode_header(buffer, pos)
    view = memoryview(buffer)
    at = pos + HEADER_BYTES + header.bloom_size
    end = at + header.data_length
    if len(view) < end:
        raise ChunkTruncated("the buffer ends inside the chunk's entries")
    offset, entries = header.first_offset, 0
    while at < end:
        if end - at < SIMPLE_SIZE.size:
            raise ChunkInvalid("an entry header crosses the end of the entries")
        kind = view[at]
        if kind & BATCH_FLAG:
            entry, at = _batch_at(view, at, end, offset)
        else:
            (size,) = SIMPLE_SIZE.unpack_from(view, at)
            if size > end - at - SIMPLE_SIZE.size:
                raise ChunkInvalid("a simple entry crosses the end of the entries")
            body = view[at + SIMPLE_SIZE.size : at + SIMPLE_SIZE.size + size]
            entry, at = (
                EntryView(offset, 1, False, COMPRESSION_NONE, size, body),
                at + SIMPLE_SIZE.size + size,
            )
        entries += 1
        offset += entry.records
        if entries > header.num_entries:
            raise ChunkInvalid(f"more entries than the header's {header.num_entries}")
        yield entry
    if entries != header.num_entries or offset - header.first_offset != header.num_records:
        raise ChunkInvalid(
            f"{entries} entries and {offset - header.first_offset} records, the header says"
            f" {header.num_entries} and {header.num_records}"
        )


def _batch_at(view: memoryview, at: int, end: int, offset: int) -> tuple[EntryView, int]:
    if end - at < BATCH_HEADER.size:
        raise ChunkInvalid("a sub-entry batch header crosses the end of the entries")
    kind, records, uncompressed, length = BATCH_HEADER.unpack_from(view, at)
    if kind & BATCH_RESERVED_MASK:
        raise ChunkInvalid(f"sub-entry batch type byte {kind:#04x} has reserved bits set")
    compression = (kind & COMPRESSION_MASK) >> COMPRESSION_SHIFT
    if compression > COMPRESSION_MAX:
        raise ChunkInvalid(f"unknown sub-entry batch compression {compression}")
    if records == 0:
        raise ChunkInvalid("a sub-entry batch of 0 records")
    start = at + BATCH_HEADER.size
    if length > end - start:
        raise ChunkInvalid("a sub-entry batch crosses the end of the entries")
    body = view[start : start + length]
    return EntryView(offset, records, True, compression, uncompressed, body), start + length


def deliver_spans(header: ChunkHeader, pos: int = 0) -> tuple[tuple[int, int], tuple[int, int]]:
    """What a Deliver sends of the chunk stored at `pos`: (position, length) of the
    48-byte header, then of the entries (osiris skips the filter and the trailer)."""
    return (pos, HEADER_BYTES), (pos + HEADER_BYTES + header.bloom_size, header.data_length)


def bloom_of(buffer: bytes | bytearray | memoryview, pos: int, header: ChunkHeader) -> bytes:
    start = pos + HEADER_BYTES
    return bytes(memoryview(buffer)[start : start + header.bloom_size])


def trailer_of(buffer: bytes | bytearray | memoryview, pos: int, header: ChunkHeader) -> bytes:
    start = pos + HEADER_BYTES + header.bloom_size + header.data_length
    return bytes(memoryview(buffer)[start : start + header.trailer_length])


# The trailer and tracking entries (osiris_tracking) -------------------------------------


def encode_tracking(records: Iterable[TrackingRecord], snapshot: bool = False) -> bytes:
    """A trailer (or a tracking delta entry), or with `snapshot` a tracking snapshot's
    entry body."""
    out = bytearray()
    for record in records:
        if len(record.id) > TRACKING_ID_BYTES_MAX:
            raise ValueError(f"tracking id of {len(record.id)} bytes over {TRACKING_ID_BYTES_MAX}")
        if record.kind not in (TRACKING_SEQUENCE, TRACKING_OFFSET, TRACKING_TIMESTAMP):
            raise ValueError(f"unknown tracking type {record.kind}")
        out += _TRACKING_HEAD.pack(record.kind, len(record.id)) + record.id
        if snapshot and record.kind == TRACKING_SEQUENCE:
            out += _U64.pack(record.chunk_id)
        out += (_I64 if record.kind == TRACKING_TIMESTAMP else _U64).pack(record.value)
    return bytes(out)


def parse_tracking(data: bytes | memoryview, snapshot: bool = False) -> list[TrackingRecord]:
    """The records of a trailer (or of a snapshot entry with `snapshot`). Raises
    ChunkInvalid for an unknown type or a record crossing the end."""
    view, at, out = memoryview(data), 0, []
    while at < len(view):
        if len(view) - at < _TRACKING_HEAD.size:
            raise ChunkInvalid("a tracking record crosses the end of the trailer")
        kind, size = _TRACKING_HEAD.unpack_from(view, at)
        if kind not in (TRACKING_SEQUENCE, TRACKING_OFFSET, TRACKING_TIMESTAMP):
            raise ChunkInvalid(f"unknown tracking type {kind}")
        with_chunk = snapshot and kind == TRACKING_SEQUENCE
        end = at + _TRACKING_HEAD.size + size + 8 + (8 if with_chunk else 0)
        if end > len(view):
            raise ChunkInvalid("a tracking record crosses the end of the trailer")
        id_ = bytes(view[at + 2 : at + 2 + size])
        chunk_id = _U64.unpack_from(view, at + 2 + size)[0] if with_chunk else -1
        (value,) = (_I64 if kind == TRACKING_TIMESTAMP else _U64).unpack_from(view, end - 8)
        out.append(TrackingRecord(kind, id_, value, chunk_id))
        at = end
    return out
