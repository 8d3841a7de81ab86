"""A stream's version-2 segments (osiris chunks) as a reader in another process sees them.

Owns reading a range of records from a segment of chunks (docs/log-format.md, "Format
version 2") through a `Store`: the chunk holding the first offset is found with the
segment's chunk index when it is valid (else by walking frame headers from the first),
each chunk is read whole and checked (frame CRC32C, the entries' CRC32 and framing),
and its records are the ones the broker's readers see (`chunk_segment.chunk_records`:
sub-entry batches decompressed, filter values from the trailer). Also the first offset
at or after a time. `logdir` owns version-1 segments and the log's view; this module is
its twin for version 2, with the same rules (nothing at or past the durable end,
SegmentGone, damage skipped only when asked).
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Iterator

from spark_source.store import SegmentFile, Store
from streamq.log import chunk, frame
from streamq.log import format as fmt
from streamq.log.chunk import ChunkHeader, ChunkInvalid, EntryView
from streamq.log.chunk_segment import chunk_records, resync_frame
from streamq.log.errors import SegmentCorrupted
from streamq.log.salvage import salvage

log = logging.getLogger(__name__)
Entries = list[tuple[int, EntryView]]  # (entry number, entry): the intact ones


def is_chunk_segment(segment: SegmentFile, where: str) -> bool:
    """Whether the segment (its header checked) is of format version 2."""
    head = segment.pread(fmt.SEGMENT_HEADER_BYTES, 0)
    fmt.decode_segment_header(head, where)
    return fmt.decode_segment_version(head) == frame.FORMAT_VERSION


def _chunk_index(store: Store, base: int, size: int) -> list[frame.ChunkEntry] | None:
    name = fmt.index_name(base)
    try:
        raw = store.read_file(name)
    except FileNotFoundError:
        return None
    if not fmt.index_intact(raw, name) or fmt.index_version(raw) != frame.FORMAT_VERSION:
        return None
    if fmt.INDEX_HEADER.unpack_from(raw, 0)[5] != size:
        return None  # stale
    return frame.decode_index_entries(memoryview(raw)[fmt.INDEX_HEADER_BYTES :])


def _start_position(store: Store, base: int, size: int, offset: int) -> int:
    entries = _chunk_index(store, base, size)
    if not entries:
        return fmt.SEGMENT_HEADER_BYTES
    i = max(bisect_right([e.relative_offset for e in entries], offset - base) - 1, 0)
    return entries[i].position


def _frames(
    segment: SegmentFile, where: str, position: int, end: int, skip_damage: bool
) -> Iterator[tuple[bytes, ChunkHeader, Entries | None]]:
    """The checked frames from `position` up to the one holding offset `end - 1`, with
    the intact entries of one whose entries alone are damaged (`salvage`, when
    `skip_damage`; None: all of them)."""
    size = segment.size()
    while position < size:
        head = segment.pread(frame.FRAME_OVERHEAD, position)
        entries: Entries | None = None
        try:
            header = chunk.decode_header(head, frame.FRAME_HEAD_BYTES)
            data = segment.pread(frame.frame_bytes(header), position)
            try:
                header = frame.check_frame(data)
            except frame.EntriesDamaged:
                if not skip_damage:
                    raise
                entries = salvage(data, frame.FRAME_HEAD_BYTES, header).entries
                log.warning("%s: damaged entries of the chunk at position %d skipped "
                            "(failOnDataLoss=false)", where, position)  # fmt: skip
        except ChunkInvalid as exc:
            if not skip_damage:
                raise SegmentCorrupted(where, position, str(exc)) from None
            found = resync_frame(segment.pread(size - position, position), 0)
            log.warning("%s: damaged chunk at position %d skipped (failOnDataLoss=false)",
                        where, position)  # fmt: skip
            if found is None:
                return
            position += found
            continue
        if header.first_offset >= end:
            return
        yield data, header, entries
        if header.next_offset >= end:
            return  # what follows is not durable (or padding of the active segment)
        position += len(data)


def read_range_records(
    store: Store, base: int, start: int, end: int, records_max: int, skip_damage: bool = False
) -> Iterator[list[fmt.Record]]:
    """The records [start, end) of the version-2 segment `base`, in lists of at most
    `records_max`. Raises SegmentCorrupted for damage unless `skip_damage`, and
    FileNotFoundError when the segment is gone (the caller's SegmentGone)."""
    name = fmt.segment_name(base)
    where = f"{store.describe()}/{name}"
    segment = store.open_file(name)
    try:
        position = _start_position(store, base, segment.size(), start)
        out: list[fmt.Record] = []
        for data, header, entries in _frames(segment, where, position, end, skip_damage):
            if header.next_offset <= start:
                continue
            chunk_records(data, 0, header, start, header.num_records, out, entries)
            while len(out) >= records_max:
                yield [r for r in out[:records_max] if r.offset < end]
                del out[:records_max]
        out = [r for r in out if r.offset < end]
        if out:
            yield out
    finally:
        segment.close()


def first_at_or_after(store: Store, base: int, end: int, timestamp_ms: int) -> int | None:
    """The first offset below `end` of the version-2 segment `base` whose chunk was
    written at or after `timestamp_ms` (every record has its chunk's time), or None."""
    name = fmt.segment_name(base)
    segment = store.open_file(name)
    try:
        frames = _frames(segment, f"{store.describe()}/{name}", fmt.SEGMENT_HEADER_BYTES, end,
                         False)  # fmt: skip
        for _data, header, _entries in frames:
            if header.timestamp_ms >= timestamp_ms:
                return header.first_offset
    finally:
        segment.close()
    return None
