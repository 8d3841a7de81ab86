"""A version-2 segment's chunks: scanning them (recovery) and reading them as records.

Owns the two walks of a segment of frames (`frame`): `scan_chunk_segment`, which checks
every frame from the header on, builds the dense chunk index and tells a torn tail from
damage (a bad frame with a valid one after it: only its chunk's offsets are lost); and
`chunk_records`, which turns one stored chunk into the `format.Record`s the log's record
readers (AMQP consumers, the web UI, tracking) take: simple entries one each, sub-entry
batches decompressed (`batches`), filter values from the trailer, and the native mark
with publishing id 0 (a chunk does not keep per-message ids). It decides nothing about
what to cut or fail: `recovery` and `reader` do.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Final, NamedTuple

from streamq.log import amqp10, batches, chunk, frame
from streamq.log import format as fmt
from streamq.log.chunk import ChunkHeader, ChunkInvalid, ChunkTruncated
from streamq.log.damage import DamagedSpan
from streamq.log.index import ChunkIndex
from streamq.log.salvage import LostEntries, damaged_spans, salvage

_NATIVE: Final = amqp10.native_properties(0)
_new: Final = tuple.__new__
RESYNC_BYTES_MAX: Final = 256 << 20  # bytes of a segment searched for the next valid frame
RESYNC_WINDOW_BYTES: Final = 1 << 20  # read at a time by that search


class ChunkScan(NamedTuple):
    """How far the valid chunks of a segment reach, and the damage passed over."""

    valid_bytes: int
    file_bytes: int
    next_offset: int
    first_timestamp_ms: int
    last_timestamp_ms: int
    chunk_index: ChunkIndex
    damaged: list[DamagedSpan]


def scan_chunk_segment(path: str, base_offset: int, durable_to: int = 0) -> ChunkScan:
    """Walk a version-2 segment frame by frame: both CRCs, dense offsets from
    `base_offset`, timestamps and epochs that never decrease. Entries that fail their own
    checksum in a sound frame are damage alone (`salvage`). Bad bytes followed by a
    valid frame are damage (listed; the walk goes on there); bad bytes with none after
    them end the walk (a torn tail). The header is the caller's to check. One pread per
    frame: memory is bounded by the largest chunk, not the segment. The file's last frame
    with bad entries is a torn write's unless its offsets are below `durable_to`."""
    index = ChunkIndex()
    damaged: list[DamagedSpan] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        position, offset = fmt.SEGMENT_HEADER_BYTES, base_offset
        first_ts = last_ts = -1
        epoch = 0
        while position < size:
            try:
                last = (last_ts, epoch)
                header, lost = _frame_at(fd, size, position, offset, last, durable_to)
                damaged += damaged_spans(path, base_offset, position, lost)
            except ChunkInvalid:
                found = _resync(fd, size, position, offset, last_ts, epoch)
                if found is None:
                    break  # a torn tail
                resume, header = found
                damaged.append(DamagedSpan(path, base_offset, position, resume, offset,
                                           header.first_offset, resume - position))  # fmt: skip
                position, offset = resume, header.first_offset
            index.add_chunk(
                offset - base_offset, position, header.timestamp_ms, header.num_records,
                header.size, header.epoch,
            )  # fmt: skip
            if first_ts < 0:
                first_ts = header.timestamp_ms
            last_ts, epoch = header.timestamp_ms, header.epoch
            position += frame.frame_bytes(header)
            offset = header.next_offset
    finally:
        os.close(fd)
    return ChunkScan(position, size, offset, first_ts, last_ts, index, damaged)


def _read_frame(
    fd: int, size: int, position: int, durable_to: int = 0
) -> tuple[bytes, ChunkHeader, list[LostEntries]]:
    """The checked frame at `position` of a file of `size` bytes (ChunkInvalid if not),
    and the entries it lost to damage (`salvage`; positions within the frame). Bad
    entries in the file's last frame are a torn write's (ChunkInvalid) unless its
    offsets are below `durable_to`."""
    head = os.pread(fd, frame.FRAME_OVERHEAD, position)
    header = chunk.decode_header(head, frame.FRAME_HEAD_BYTES)
    if frame.frame_bytes(header) > size - position:
        raise ChunkTruncated("the frame passes the end of the file")
    data = os.pread(fd, frame.frame_bytes(header), position)
    try:
        return data, frame.check_frame(data), []
    except frame.EntriesDamaged:
        if position + len(data) >= size and header.next_offset > durable_to:
            raise
        return data, header, salvage(data, frame.FRAME_HEAD_BYTES, header).lost


def _frame_at(
    fd: int, size: int, position: int, offset: int, last: tuple[int, int], durable_to: int
) -> tuple[ChunkHeader, list[LostEntries]]:
    last_ts, epoch = last
    _data, header, lost = _read_frame(fd, size, position, durable_to)
    if header.first_offset != offset:
        raise ChunkInvalid(f"chunk of offset {header.first_offset} where {offset} was expected")
    if header.timestamp_ms < last_ts or header.epoch < epoch:
        raise ChunkInvalid(f"chunk of offset {offset}: its timestamp or epoch goes back")
    return header, lost


def _resync(
    fd: int, size: int, position: int, offset: int, last_ts: int, epoch: int
) -> tuple[int, ChunkHeader] | None:
    """The next valid frame after the bad bytes at `position`: a chunk magic at +8, a
    plausible header (read from the window), then both CRCs, an offset after `offset`
    that the bytes passed over can account for (each lost record took 4 bytes at least),
    a timestamp and epoch not going back. Read `RESYNC_WINDOW_BYTES` at a time."""
    magic = bytes((chunk.MAGIC_VERSION,))
    window_at = position + 1
    end = min(size, position + RESYNC_BYTES_MAX)
    while window_at < end:
        window = os.pread(fd, RESYNC_WINDOW_BYTES + frame.FRAME_OVERHEAD, window_at)
        at = frame.FRAME_HEAD_BYTES
        while (at := window.find(magic, at, RESYNC_WINDOW_BYTES + frame.FRAME_HEAD_BYTES)) >= 0:
            start = window_at + at - frame.FRAME_HEAD_BYTES
            at += 1
            try:
                header = chunk.decode_header(window, at - 1)
                if not offset < header.first_offset <= offset + (start - position) // 4 + 1:
                    continue
                _data, header, _lost = _read_frame(fd, size, start)
            except ChunkInvalid:
                continue
            if header.timestamp_ms >= last_ts and header.epoch >= epoch:
                return start, header
        window_at += RESYNC_WINDOW_BYTES
    return None


def resync_frame(data: bytes, position: int) -> int | None:
    """The position of the next frame in `data` after the bad bytes at `position` that
    passes every check (both CRCs, the framing), or None. For readers without the log's
    offsets (the Spark source); recovery's `_resync` also checks offsets and time."""
    at = position + 1
    while True:
        at = data.find(bytes((chunk.MAGIC_VERSION,)), at + frame.FRAME_HEAD_BYTES)
        if at < 0:
            return None
        start = at - frame.FRAME_HEAD_BYTES
        try:
            frame.check_frame(data, start)
        except ChunkInvalid:
            at = start + 1
            continue
        return start


def chunk_records(
    buffer: bytes | bytearray | memoryview,
    pos: int,
    header: ChunkHeader,
    skip_before: int,
    records_max: int,
    out: list[fmt.Record],
    entries: Iterable[tuple[int, chunk.EntryView]] | None = None,
) -> int:
    """Append to `out` the records of the chunk whose frame is at `pos` in `buffer`
    (checked by the caller), those at or past `skip_before`, at most `records_max`;
    `entries` (number, entry) instead of all of them (the intact ones of a damaged
    chunk, `salvage`). Returns the offset after the last record taken (or passed over)."""
    at = pos + frame.FRAME_HEAD_BYTES
    values: list[bytes] = []
    if header.trailer_length:
        runs = frame.parse_trailer(chunk.trailer_of(buffer, at, header)).filter_runs
        values = frame.filter_value_list(runs, header.num_entries)
    ts = header.timestamp_ms
    append = out.append
    offset = header.first_offset
    taken = 0
    if entries is None:
        entries = enumerate(chunk.iter_entries(buffer, at, header))
    for number, entry in entries:
        if taken >= records_max:
            return offset
        if entry.offset + entry.records <= skip_before:
            offset = entry.offset + entry.records
            continue
        value = values[number] if values else b""
        messages = batches.messages(entry) if entry.batch else [bytes(entry.data)]
        for offset, message in enumerate(messages, entry.offset):
            if offset < skip_before:
                continue
            if taken >= records_max:
                return offset
            append(_new(fmt.Record, (offset, ts, b"", value, _NATIVE, message)))
            taken += 1
        offset = entry.offset + entry.records
    return offset


def read_frame(fd: int, position: int, chunk_bytes: int) -> bytes:
    """The frame of a `chunk_bytes` chunk at `position` (its size from the index)."""
    return os.pread(fd, frame.FRAME_HEAD_BYTES + chunk_bytes, position)
