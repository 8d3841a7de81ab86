"""A stored chunk's records in the version-1 record form: `ChunkRun`, for the C run path.

Owns rendering the records of one version-2 chunk (as `chunk_segment.chunk_records`
decodes them: native records, an AMQP 1.0 message each, the filter value in the routing
key) as version-1 records back to back (`format`), so that AMQP 0-9-1 stream consumers
take a chunk the way they take a version-1 segment's bytes: one C call per run that
splices, converts (native records, in C) and frames the deliveries
(`Consumer.deliver_stream_records`), not a Python step per message. The reader keeps the
last few chunks' runs.

Two ways to a run: `frame_run`, from a stored frame's entries straight to the records in
C (`_streamwire.chunk_run_records`: simple entries and uncompressed sub-entry batches, no
Python object per message), and `chunk_run`, from records decoded in Python (chunks with
compressed batches, or whose entries were salvaged). Only a chunk whose records are all
there (no entry lost to damage) and whose filter values fit a record's routing key (255
bytes) has a run; readers take the per-record path for the others. Pure: no I/O.
"""

from __future__ import annotations

from array import array
from typing import Final, NamedTuple

from streamq.log import chunk, frame
from streamq.log import format as fmt
from streamq.log._records import encode_records
from streamq.log._streamwire import chunk_run_records
from streamq.log.chunk import ChunkInvalid

_FIELD_BYTES_MAX: Final = 255  # a record's routing key (the filter value)
_NO_LIMIT: Final = 1 << 62
_HEADER: Final = fmt.RECORD_HEADER_BYTES  # a record's bytes beyond its fields


class ChunkRun(NamedTuple):
    """Version-1 records of a chunk's offsets `first_offset`, `first_offset + 1`, ..."""

    first_offset: int
    data: bytes
    positions: array[int]  # where each record starts in `data`


def frame_run(data: bytes | memoryview, first_offset: int, count: int) -> ChunkRun | None:
    """The run of the chunk in the frame `data` (a stored frame, checked here: frame
    CRC32C, the entries' CRC32, then their framing while the C function walks them),
    which must hold `count` records from `first_offset`. None when the chunk needs the
    Python path (`chunk_run`): a compressed sub-entry batch, or a filter value too long
    for a routing key. Raises ChunkInvalid when the frame is damaged or not the one
    indexed (EntriesDamaged when its entries' CRC32 alone fails: `salvage`'s case)."""
    header = frame.check_crcs(data)
    if header.first_offset != first_offset or header.num_records != count:
        raise ChunkInvalid(f"chunk {header.first_offset} where {first_offset} was indexed")
    return checked_frame_run(data, header)


def checked_frame_run(data: bytes | memoryview, header: chunk.ChunkHeader) -> ChunkRun | None:
    """`frame_run` of a frame whose CRCs the caller checked (`header` is its header):
    the C conversion alone. None when the chunk needs the Python path; raises
    ChunkInvalid when the entries' framing is not what the header says."""
    at = frame.FRAME_HEAD_BYTES
    runs: list[frame.FilterRun] = []
    if header.trailer_length:
        runs = frame.parse_trailer(chunk.trailer_of(data, at, header)).filter_runs
    try:
        made = chunk_run_records(data, at + chunk.HEADER_BYTES + header.bloom_size,
                                 header.data_length, header.num_entries, header.first_offset,
                                 header.num_records, header.timestamp_ms, runs)  # fmt: skip
    except ValueError as exc:
        raise ChunkInvalid(str(exc)) from None
    if made is None:
        return None
    records, starts = made
    positions = array("q")
    positions.frombytes(starts)
    return ChunkRun(header.first_offset, records, positions)


def chunk_run(records: list[fmt.Record], first_offset: int, count: int) -> ChunkRun | None:
    """The run of a chunk's `count` records from `first_offset` (`records` as decoded), or
    None when records are missing (damage) or a filter value is too long for the form."""
    if len(records) != count or not records or records[0].offset != first_offset:
        return None
    buffer = bytearray()
    positions = array("q")
    timestamp_ms = records[0].timestamp_ms
    group: list[tuple[bytes, bytes]] = []
    key = records[0].routing_key
    start = first_offset
    position = 0
    for record in records:
        if record.routing_key != key:
            if not _encode(buffer, start, timestamp_ms, key, group):
                return None
            start, key, group = record.offset, record.routing_key, []
        positions.append(position)
        position += _HEADER + len(key) + len(record.properties) + len(record.body)
        group.append((record.properties, record.body))
    if not _encode(buffer, start, timestamp_ms, key, group) or len(buffer) != position:
        return None
    return ChunkRun(first_offset, bytes(buffer), positions)


def _encode(
    buffer: bytearray, first: int, timestamp_ms: int, key: bytes, group: list[tuple[bytes, bytes]]
) -> bool:
    """Append `group`'s records (offsets from `first`, routing key `key`); False when
    they do not fit the record form."""
    if len(key) > _FIELD_BYTES_MAX:
        return False
    done = encode_records(buffer, first, timestamp_ms, b"", key, group, 0, _NO_LIMIT, _NO_LIMIT,
                          _NO_LIMIT)  # fmt: skip
    return done == len(group)
