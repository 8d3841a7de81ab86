"""Stream-protocol chunks of a version-2 segment: the stored osiris chunks, as they are.

Owns what a stream-protocol consumer gets from a segment of chunks (docs/log-format.md,
"Format version 2"): the chunk holding its offset, header and entries exactly as stored
(what osiris sends: the filter and the trailer stay behind), the same bytes and epoch on
every read. A consumer attaching inside a chunk gets the whole chunk, as from RabbitMQ
(clients drop the entries below their offset). With a filter, a chunk whose bloom filter
rules it out is passed over; one that may match is checked exactly against the filter
values of its trailer: wholly matching, it goes as stored; else its first run of
matching entries goes as a chunk built for it (an exact filter, as version 1 gives).
A chunk whose frame CRC32C fails is damage: its offsets are lost alone
(`SegmentLog.chunk_damaged`). One whose entries' CRC32 alone fails loses only the
entries that fail their own CRC32C (`salvage`): the intact ones go as chunks built of
their runs (the stored bytes would fail the client's CRC check).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from streamq.log import chunk, frame
from streamq.log.bloom import bloom_may_match
from streamq.log.chunk import ChunkHeader, ChunkInvalid
from streamq.log.reader import ChunkPlace
from streamq.queues.chunks import Chunk, ChunkFilter

_HEAD = frame.FRAME_HEAD_BYTES


class ChunkSource(Protocol):
    """What reading a stored chunk needs of a log: `SegmentLog`'s, or a cluster
    follower's `ReplicaLog` over its copy."""

    def frame_view(self, base_offset: int, position: int, chunk_bytes: int) -> bytes | memoryview:
        """The frame of the chunk at `position`, a view where it can be."""

    def chunk_damaged(self, place: ChunkPlace, reason: str) -> None:
        """The chunk at `place` fails its checks."""

    def salvage_chunk(
        self,
        path: str,
        base: int,
        position: int,
        data: bytes | memoryview,
        header: ChunkHeader,
        reason: str,
    ) -> list[tuple[int, chunk.EntryView]]:
        """The intact entries of a chunk whose entries fail their CRC32 (`salvage`)."""

    def file_of(self, base_offset: int) -> int | None:
        """A descriptor for `os.sendfile` of the segment at `base_offset`, or None."""


def read_stored_chunk(
    log: ChunkSource, place: ChunkPlace, offset: int, filter: ChunkFilter | None
) -> Chunk:
    """The chunk at `place` for a consumer at `offset` (see the module docstring)."""
    end = place.first_offset + place.records
    data = log.frame_view(place.base_offset, place.position, place.chunk_bytes)
    try:
        header = frame.check_crcs(data)
    except frame.EntriesDamaged as exc:  # header and trailer sound: entries lost alone
        try:
            header = chunk.decode_header(data, _HEAD)
            entries = log.salvage_chunk(place.path, place.base_offset, place.position, data,
                                        header, str(exc))  # fmt: skip
        except ChunkInvalid as whole:
            log.chunk_damaged(place, str(whole))
            return Chunk(-1, end, 0, b"")
        return _salvaged(data, header, entries, max(offset, header.first_offset), filter)
    except ChunkInvalid as exc:
        log.chunk_damaged(place, str(exc))
        return Chunk(-1, end, 0, b"")
    if filter is None:
        deliver = _deliver_bytes(data, header)
        return Chunk(header.first_offset, end, header.num_records, deliver,
                     _file_span(log, place, header))  # fmt: skip
    bloom = chunk.bloom_of(data, _HEAD, header)
    if not bloom_may_match(bloom, filter.values, filter.match_unfiltered):
        return Chunk(-1, end, 0, b"")
    return _filtered(data, header, max(offset, header.first_offset), filter)


def _file_span(
    log: ChunkSource, place: ChunkPlace, header: ChunkHeader
) -> tuple[int, int, int] | None:
    """Where header and entries are one span of a sealed segment's file, for sendfile."""
    if header.bloom_size:
        return None  # two spans: a copy is simpler than two sendfile calls
    fd = log.file_of(place.base_offset)
    if fd is None:
        return None
    return fd, place.position + _HEAD, chunk.HEADER_BYTES + header.data_length


def _deliver_bytes(data: bytes | memoryview, header: ChunkHeader) -> bytes | memoryview:
    """Header and entries: one view when the chunk has no filter, else a join."""
    start = _HEAD + chunk.HEADER_BYTES
    if not header.bloom_size:
        return memoryview(data)[_HEAD : start + header.data_length]
    entries = start + header.bloom_size
    view = memoryview(data)
    return b"".join((view[_HEAD:start], view[entries : entries + header.data_length]))


def _filtered(
    data: bytes | memoryview, header: ChunkHeader, offset: int, filter: ChunkFilter
) -> Chunk:
    """Exact filtering of a chunk that may match, from the entry holding `offset`: by
    its filter value runs alone when they decide for the whole chunk, else per entry."""
    runs: list[frame.FilterRun] = []
    if header.trailer_length:
        runs = frame.parse_trailer(chunk.trailer_of(data, _HEAD, header)).filter_runs
    wanted, unfiltered = filter.values, filter.match_unfiltered
    end = header.first_offset + header.num_records
    without = header.num_entries - sum(count for _, count, _ in runs)  # entries with none
    matching_runs = [value in wanted for _, _, value in runs]
    if all(matching_runs) and (unfiltered or not without):
        return Chunk(header.first_offset, end, header.num_records, _deliver_bytes(data, header))
    if not any(matching_runs) and not (unfiltered and without):
        return Chunk(-1, end, 0, b"")
    values = frame.filter_value_list(runs, header.num_entries)
    return _first_run(header, values, enumerate(chunk.iter_entries(data, _HEAD, header)),
                      offset, filter)  # fmt: skip


def _salvaged(
    data: bytes | memoryview,
    header: ChunkHeader,
    entries: list[tuple[int, chunk.EntryView]],
    offset: int,
    filter: ChunkFilter | None,
) -> Chunk:
    """A chunk of the first run of intact (and matching) entries from `offset` of a
    chunk that lost entries to damage (`salvage`): built, as the stored bytes fail their
    CRC32."""
    values: list[bytes] = [b""] * header.num_entries
    if header.trailer_length:
        runs = frame.parse_trailer(chunk.trailer_of(data, _HEAD, header)).filter_runs
        values = frame.filter_value_list(runs, header.num_entries)
    return _first_run(header, values, entries, offset, filter)


def _first_run(
    header: ChunkHeader,
    values: list[bytes],
    entries: Iterable[tuple[int, chunk.EntryView]],
    offset: int,
    filter: ChunkFilter | None,
) -> Chunk:
    """A chunk built of the first run of consecutive matching entries (all of them match
    without a filter) whose records reach `offset` or past it; a run ends at the first
    entry passed over or missing."""
    end = header.first_offset + header.num_records
    matching: list[chunk.EntryView] = []
    previous = -1
    for number, entry in entries:
        if entry.offset + entry.records <= offset:
            continue
        value = values[number]
        match = filter is None or ((value in filter.values) if value else filter.match_unfiltered)
        if match and (not matching or number == previous + 1):
            matching.append(entry)
            previous = number
        elif matching:
            break  # a run of matching entries ends at the first one passed over
    if not matching:
        return Chunk(-1, end, 0, b"")
    first, run_end = matching[0].offset, matching[-1].offset + matching[-1].records
    kept = [_as_entry(entry) for entry in matching]
    built = chunk.encode_chunk(kept, first, header.timestamp_ms, header.epoch)
    return Chunk(first, run_end, run_end - first, built)


def _as_entry(entry: chunk.EntryView) -> chunk.Entry:
    if not entry.batch:
        return chunk.SimpleEntry(bytes(entry.data))
    return chunk.SubBatch(
        bytes(entry.data), entry.records, entry.compression, entry.uncompressed_length
    )
