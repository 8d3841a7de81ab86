"""Version-2 segments: the frame around each stored chunk, the chunk index file, the trailer.

Owns the byte layout of what a format-version-2 segment adds around `chunk` (the osiris
chunk codec) and nothing else: pure encode, decode and check functions, no I/O, no state.
docs/log-format.md ("Format version 2") is the normative description.

After the 32-byte segment header of version 1 (with `format_version` 2), frames back to
back, never spanning segments::

    0   4  frame_crc    u32 LE, CRC32C of the chunk's 48-byte header, filter and trailer
    4   4  frame_flags  u32 LE, 0 (a reader refuses other values)
    8   ..  chunk       an osiris chunk, byte for byte (its entries covered by its CRC32)

Index file of a sealed version-2 segment: the 48-byte header of version 1 with
`format_version` 2, then one 32-byte entry per chunk (dense)::

    0   4  relative first offset (u32)    4   4  frame position (u32)
    8   8  timestamp (i64)                 16  4  num_records (u32)
    20  4  chunk bytes (u32)               24  8  epoch (u64)

Trailer: osiris sequence records (type 0: a publisher reference and its highest
publishing id in the chunk), then at most one streamq record of type 0x80 (id size 0)
holding the entries' filter values exactly, as runs of consecutive entries with the same
value: `u16 run count`, then per run `u16 first entry`, `u16 entries`, `u16 length`,
value (entries in no run have none); then one streamq record of type 0x81 (id size 0),
the entries' own checksums: `u16 count`, then per entry the CRC32C of its bytes (size or
batch header included), a u32. All trailer integers are big-endian, as osiris'. The
0x81 record lets a reader keep the intact entries of a chunk whose entries' CRC32
fails (`salvage`): bit rot loses the damaged entry's offsets alone.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

from streamq.log import chunk
from streamq.log._records import crc32c
from streamq.log._streamwire import crc32 as _crc32
from streamq.log.chunk import ChunkHeader, ChunkInvalid, ChunkTruncated

FORMAT_VERSION: Final = 2
FRAME_HEAD: Final = struct.Struct("<II")  # frame_crc, frame_flags
FRAME_HEAD_BYTES: Final = FRAME_HEAD.size  # 8
FRAME_OVERHEAD: Final = FRAME_HEAD_BYTES + chunk.HEADER_BYTES  # a frame's bytes beyond entries
INDEX_ENTRY: Final = struct.Struct("<IIqIIQ")
INDEX_ENTRY_BYTES: Final = INDEX_ENTRY.size  # 32
TRAILER_FILTER_VALUES: Final = 0x80
TRAILER_ENTRY_CRCS: Final = 0x81
ENTRY_CRC_BYTES: Final = 4
_FILTER_COUNT: Final = struct.Struct(">H")
_FILTER_RUN: Final = struct.Struct(">HHH")  # first entry, entries, value length
_SEQUENCE: Final = struct.Struct(">BB")
_U64: Final = struct.Struct(">Q")


class ChunkEntry(NamedTuple):
    """One entry of a chunk index: where a chunk's frame is and what it holds."""

    relative_offset: int
    position: int
    timestamp_ms: int
    records: int
    chunk_bytes: int
    epoch: int


FilterRun = tuple[int, int, bytes]  # first entry, entries, their filter value


class Trailer(NamedTuple):
    """What a streamq trailer says: publisher references' highest ids in the chunk, and
    the filter values of its entries as runs (first entry, entries, value)."""

    sequences: dict[bytes, int]
    filter_runs: list[FilterRun]
    entry_crcs: bytes = b""  # the 0x81 record's CRC32Cs, 4 bytes each (b"": none)


class EntriesDamaged(ChunkInvalid):
    """The frame CRC32C holds (the chunk's header, filter and trailer are sound), but its
    entries fail their CRC32 or framing: `salvage` finds the intact ones."""


def encode_frame(chunk_bytes: bytes) -> bytes:
    """The frame of an encoded chunk (whose header, filter and trailer it checksums)."""
    header = chunk.decode_header(chunk_bytes)
    return FRAME_HEAD.pack(_frame_crc(chunk_bytes, 0, header), 0) + chunk_bytes


def _frame_crc(buffer: bytes | bytearray | memoryview, pos: int, header: ChunkHeader) -> int:
    """CRC32C of the chunk at `pos`'s header and filter (contiguous), then its trailer."""
    view = memoryview(buffer)
    head_end = pos + chunk.HEADER_BYTES + header.bloom_size
    trailer_at = head_end + header.data_length
    value = crc32c(view[pos:head_end])
    return crc32c(view[trailer_at : trailer_at + header.trailer_length], value)


def check_frame(buffer: bytes | bytearray | memoryview, pos: int = 0) -> ChunkHeader:
    """The header of the whole frame at `pos` (`pos` is the frame's start), every byte of
    it checked: frame CRC32C, flags, chunk CRC32 and entry framing. Raises ChunkTruncated
    when the buffer ends inside the frame, ChunkInvalid for anything wrong, including a
    chunk type other than user."""
    check_trailer(buffer, pos)
    try:
        return chunk.check_chunk(buffer, pos + FRAME_HEAD_BYTES)
    except ChunkTruncated:
        raise
    except ChunkInvalid as exc:
        raise EntriesDamaged(str(exc)) from None


def check_trailer(buffer: bytes | bytearray | memoryview, pos: int = 0) -> ChunkHeader:
    """`check_frame` for a reader of the header and trailer alone: the frame's length,
    flags, chunk type and frame CRC32C (which covers header and trailer), not the
    entries. Raises ChunkTruncated or ChunkInvalid as `check_frame`."""
    if len(buffer) - pos < FRAME_OVERHEAD:
        raise ChunkTruncated(f"{len(buffer) - pos} bytes left for a frame")
    frame_crc, flags = FRAME_HEAD.unpack_from(buffer, pos)
    header = chunk.decode_header(buffer, pos + FRAME_HEAD_BYTES)
    if len(buffer) - pos - FRAME_HEAD_BYTES < header.size:
        raise ChunkTruncated(f"the buffer ends inside a {header.size}-byte chunk")
    if flags != 0:
        raise ChunkInvalid(f"frame flags {flags:#x}")
    if header.chunk_type != chunk.CHUNK_TYPE_USER:
        raise ChunkInvalid(f"chunk type {header.chunk_type} in a stream segment")
    if _frame_crc(buffer, pos + FRAME_HEAD_BYTES, header) != frame_crc:
        raise ChunkInvalid(f"chunk at offset {header.first_offset}: the frame CRC32C fails")
    return header


def check_crcs(buffer: bytes | bytearray | memoryview, pos: int = 0) -> ChunkHeader:
    """`check_frame` without walking the entries: the frame CRC32C and the entries'
    CRC32 only (the entries' framing was checked when they were written, and the CRC32
    covers it), for the read paths that do not decode entries. EntriesDamaged when
    only the CRC32 fails."""
    if len(buffer) - pos < FRAME_OVERHEAD:
        raise ChunkTruncated(f"{len(buffer) - pos} bytes left for a frame")
    header = chunk.decode_header(buffer, pos + FRAME_HEAD_BYTES)
    if len(buffer) - pos - FRAME_HEAD_BYTES < header.size:
        raise ChunkTruncated(f"the buffer ends inside a {header.size}-byte chunk")
    frame_crc, flags = FRAME_HEAD.unpack_from(buffer, pos)
    if flags or header.chunk_type != chunk.CHUNK_TYPE_USER:
        raise ChunkInvalid(f"frame flags {flags:#x}, chunk type {header.chunk_type}")
    if _frame_crc(buffer, pos + FRAME_HEAD_BYTES, header) != frame_crc:
        raise ChunkInvalid(f"chunk at offset {header.first_offset}: the frame CRC32C fails")
    start = pos + FRAME_HEAD_BYTES + chunk.HEADER_BYTES + header.bloom_size
    with memoryview(buffer) as view:
        if _crc32(view[start : start + header.data_length], 0) != header.crc:
            raise EntriesDamaged(f"chunk at offset {header.first_offset}: the entries' CRC32 fails")
    return header


def frame_bytes(header: ChunkHeader) -> int:
    return FRAME_HEAD_BYTES + header.size


# The trailer ---------------------------------------------------------------------------


def encode_trailer(
    sequences: dict[bytes, int], filter_runs: Sequence[FilterRun], entry_crcs: bytes = b""
) -> bytes:
    """A trailer: one osiris sequence record per reference, then the filter values (if
    any entry has one) as a 0x80 record of runs, then the entries' CRC32Cs (packed by
    `_records.entry_crcs`) as a 0x81 record."""
    out = bytearray(
        chunk.encode_tracking(
            chunk.TrackingRecord(chunk.TRACKING_SEQUENCE, ref, seq)
            for ref, seq in sequences.items()
        )
    )
    if filter_runs:
        out += _SEQUENCE.pack(TRAILER_FILTER_VALUES, 0) + _FILTER_COUNT.pack(len(filter_runs))
        for first, entries, value in filter_runs:
            out += _FILTER_RUN.pack(first, entries, len(value)) + value
    if entry_crcs:
        out += _SEQUENCE.pack(TRAILER_ENTRY_CRCS, 0)
        out += _FILTER_COUNT.pack(len(entry_crcs) // ENTRY_CRC_BYTES) + entry_crcs
    return bytes(out)


def parse_trailer(data: bytes | memoryview) -> Trailer:
    """A streamq trailer's sequences and filter values; ChunkInvalid when malformed."""
    view, at = memoryview(data), 0
    sequences: dict[bytes, int] = {}
    values: list[FilterRun] = []
    crcs = b""
    while at < len(view):
        if len(view) - at < _SEQUENCE.size:
            raise ChunkInvalid("a trailer record crosses the trailer's end")
        kind, size = _SEQUENCE.unpack_from(view, at)
        at += _SEQUENCE.size
        if kind == TRAILER_FILTER_VALUES and size == 0:
            at = _parse_filter_values(view, at, values)
            continue
        if kind == TRAILER_ENTRY_CRCS and size == 0 and len(view) - at >= _FILTER_COUNT.size:
            (count,) = _FILTER_COUNT.unpack_from(view, at)
            at += _FILTER_COUNT.size
            crcs = bytes(view[at : at + count * ENTRY_CRC_BYTES])
            if len(crcs) != count * ENTRY_CRC_BYTES:
                raise ChunkInvalid("the entry checksums cross the trailer's end")
            at += len(crcs)
            continue
        if kind != chunk.TRACKING_SEQUENCE or len(view) - at < size + _U64.size:
            raise ChunkInvalid(f"trailer record of type {kind:#x} in a stream chunk")
        sequences[bytes(view[at : at + size])] = _U64.unpack_from(view, at + size)[0]
        at += size + _U64.size
    return Trailer(sequences, values, crcs)


def _parse_filter_values(view: memoryview, at: int, values: list[FilterRun]) -> int:
    if len(view) - at < _FILTER_COUNT.size:
        raise ChunkInvalid("a filter values record crosses the trailer's end")
    (count,) = _FILTER_COUNT.unpack_from(view, at)
    at += _FILTER_COUNT.size
    for _ in range(count):
        if len(view) - at < _FILTER_RUN.size:
            raise ChunkInvalid("a filter value crosses the trailer's end")
        first, entries, length = _FILTER_RUN.unpack_from(view, at)
        at += _FILTER_RUN.size
        if len(view) - at < length:
            raise ChunkInvalid("a filter value crosses the trailer's end")
        values.append((first, entries, bytes(view[at : at + length])))
        at += length
    return at


def filter_value_list(runs: Sequence[FilterRun], entries: int) -> list[bytes]:
    """Each of `entries` entries' filter value (b"": none), from the runs."""
    out = [b""] * entries
    for first, count, value in runs:
        out[first : first + count] = [value] * count
    return out[:entries]


def add_filter_run(runs: list[FilterRun], first: int, count: int, value: bytes) -> None:
    """Append a run, merged with the last one when it continues it with the same value."""
    if runs and runs[-1][2] == value and runs[-1][0] + runs[-1][1] == first:
        last = runs[-1]
        runs[-1] = (last[0], last[1] + count, value)
    else:
        runs.append((first, count, value))


# The index file of a sealed version-2 segment --------------------------------------------


def encode_index_entries(entries: Iterable[tuple[int, int, int, int, int, int]]) -> bytes:
    return b"".join(INDEX_ENTRY.pack(*entry) for entry in entries)


def decode_index_entries(data: bytes | memoryview) -> list[ChunkEntry]:
    if len(data) % INDEX_ENTRY_BYTES:
        raise ChunkInvalid("index entries of a partial size")
    return [ChunkEntry(*fields) for fields in INDEX_ENTRY.iter_unpack(data)]
