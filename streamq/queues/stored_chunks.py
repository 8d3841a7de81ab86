"""Stream-protocol chunks of a version-2 segment: the stored osiris chunks, as they are.

Owns what a stream-protocol consumer gets from a segment of chunks (docs/log-format.md,
"Format version 2"): the chunk holding its offset, header and entries exactly as stored
(what osiris sends: the filter and the trailer stay behind), the same bytes and epoch on
every read. A consumer attaching inside a chunk gets the whole chunk, as from RabbitMQ
(clients drop the entries below their offset). With a filter, a chunk whose bloom filter
rules it out is passed over; one that may match is checked exactly against the filter
values of its trailer: wholly matching, it goes as stored; else its first run of
matching entries goes as a chunk built for it (an exact filter, as version 1 gives).
A chunk that fails its checks (frame CRC32C, the entries' CRC32) is damage: its offsets
are lost alone (`SegmentLog.chunk_damaged`).
"""

from __future__ import annotations

from streamq.log import chunk, frame
from streamq.log.bloom import bloom_may_match
from streamq.log.chunk import ChunkHeader, ChunkInvalid
from streamq.log.log import SegmentLog
from streamq.log.reader import ChunkPlace
from streamq.queues.chunks import Chunk, ChunkFilter

_HEAD = frame.FRAME_HEAD_BYTES


def read_stored_chunk(
    log: SegmentLog, place: ChunkPlace, offset: int, filter: ChunkFilter | None
) -> Chunk:
    """The chunk at `place` for a consumer at `offset` (see the module docstring)."""
    end = place.first_offset + place.records
    data = log.frame_at(place.base_offset, place.position, place.chunk_bytes)
    try:
        header = frame.check_crcs(data)
    except ChunkInvalid as exc:
        log.chunk_damaged(place, str(exc))
        return Chunk(-1, end, 0, b"")
    if filter is None:
        return Chunk(header.first_offset, end, header.num_records, _deliver_bytes(data, header))
    bloom = chunk.bloom_of(data, _HEAD, header)
    if not bloom_may_match(bloom, filter.values, filter.match_unfiltered):
        return Chunk(-1, end, 0, b"")
    return _filtered(data, header, max(offset, header.first_offset), filter)


def _deliver_bytes(data: bytes, header: ChunkHeader) -> bytes | memoryview:
    """Header and entries: one view when the chunk has no filter, else a join."""
    start = _HEAD + chunk.HEADER_BYTES
    if not header.bloom_size:
        return memoryview(data)[_HEAD : start + header.data_length]
    entries = start + header.bloom_size
    return data[_HEAD:start] + data[entries : entries + header.data_length]


def _filtered(data: bytes, header: ChunkHeader, offset: int, filter: ChunkFilter) -> Chunk:
    """Exact filtering of a chunk that may match, from the entry holding `offset`."""
    values: dict[int, bytes] = {}
    if header.trailer_length:
        values = frame.parse_trailer(chunk.trailer_of(data, _HEAD, header)).filter_values
    wanted, unfiltered = filter.values, filter.match_unfiltered
    matching: list[tuple[int, chunk.EntryView]] = []
    run_end = -1
    for number, entry in enumerate(chunk.iter_entries(data, _HEAD, header)):
        if entry.offset + entry.records <= offset:
            continue
        value = values.get(number, b"")
        if (value in wanted) if value else unfiltered:
            if matching and run_end != entry.offset:
                break  # a run ends at the first entry passed over
            matching.append((number, entry))
            run_end = entry.offset + entry.records
        elif matching:
            break
    end = header.first_offset + header.num_records
    if not matching:
        return Chunk(-1, end, 0, b"")
    if len(matching) == header.num_entries:
        return Chunk(header.first_offset, end, header.num_records, _deliver_bytes(data, header))
    first = matching[0][1].offset
    entries = [_as_entry(entry) for _, entry in matching]
    built = chunk.encode_chunk(entries, first, header.timestamp_ms, header.epoch)
    return Chunk(first, run_end, run_end - first, built)


def _as_entry(entry: chunk.EntryView) -> chunk.Entry:
    if not entry.batch:
        return chunk.SimpleEntry(bytes(entry.data))
    return chunk.SubBatch(
        bytes(entry.data), entry.records, entry.compression, entry.uncompressed_length
    )
