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
from collections.abc import Callable, Iterator
from typing import Final, NamedTuple

import numpy as np

from spark_source.columns import Ints, RecordColumns, run_columns
from spark_source.store import SegmentFile, Store
from streamq.log import chunk, frame
from streamq.log import format as fmt
from streamq.log._streamwire import chunk_message_spans
from streamq.log.chunk import ChunkHeader, ChunkInvalid, EntryView
from streamq.log.chunk_runs import ChunkRun, checked_frame_run, chunk_run
from streamq.log.chunk_segment import chunk_records, resync_frame
from streamq.log.errors import SegmentCorrupted
from streamq.log.salvage import salvage

log = logging.getLogger(__name__)
# Runs of records (a chunk's each) are joined into one batch up to this many bytes.
JOIN_BYTES_MAX: Final = 256 * 1024
# A chunk of fewer records and bytes than these is read as records (joined with its
# neighbours into a batch), never as `MessageSpans`: each of those is a batch of its own.
SPANS_RECORDS_MIN: Final = 1024
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
) -> Iterator[tuple[int, memoryview, ChunkHeader, Entries | None]]:
    """The checked frames from `position` up to the one holding offset `end - 1`, each
    with its position and, for one whose entries alone are damaged, its intact entries
    (`salvage`, when `skip_damage`; None: all of them)."""
    size = segment.size()
    window = _Window(segment, size)
    while position < size:
        head = window.read(frame.FRAME_OVERHEAD, position)
        entries: Entries | None = None
        try:
            header = chunk.decode_header(head, frame.FRAME_HEAD_BYTES)
            data = window.read(frame.frame_bytes(header), position)
            try:
                header = frame.check_crcs(data)  # framing: where the entries are read
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
        yield position, data, header, entries
        if header.next_offset >= end:
            return  # what follows is not durable (or padding of the active segment)
        position += len(data)


class _Window:
    """A segment read `read_bytes` at a time (the file's: 1 MiB on this machine's disk,
    4 MiB over HTTP), so that small chunks cost one read (for a remote store, one HTTP
    request) per window, not two each. The window is one buffer
    reused for every read, and what `read` returns is a view of it: valid until the next
    `read` (every reader of a frame copies what it keeps: the C run, `chunk_records`).
    A read that starts inside the window and ends past it keeps what the window holds
    of it and reads the rest with the next window: a chunk a little over the window was
    read twice, its head's window and then the whole chunk."""

    def __init__(self, segment: SegmentFile, size: int) -> None:
        self.segment = segment
        self.size = size
        self.at = 0
        self.buffer = bytearray()
        self.view = memoryview(self.buffer)
        self.length = 0  # the bytes of the buffer read

    def read(self, length: int, position: int) -> memoryview:
        end = position + length
        if not (self.at <= position and end <= self.at + self.length):
            kept = 0
            if self.at <= position < self.at + self.length:
                kept = min(self.at + self.length - position, length)
            step = self.segment.read_bytes
            want = min(max(length, kept + step), max(self.size - position, length))
            held = self.view[position - self.at : position - self.at + kept]
            if want > len(self.buffer):  # views of the old buffer keep it alive
                self.buffer = bytearray(want)
                self.view = memoryview(self.buffer)
            self.view[:kept] = held  # memmove when in the same buffer
            got = self.segment.pread_into(self.view[kept:want], position + kept)
            self.at, self.length = position, kept + got
        start = position - self.at
        return self.view[start : min(start + length, self.length)]


class _Frame(NamedTuple):
    """A checked frame of a read, with where it is (for the errors of its decode)."""

    where: str
    at: int
    data: memoryview  # a view of the read window: valid until the next frame
    header: ChunkHeader
    entries: Entries | None  # the intact ones, when `salvage` ran; None: all


def _read_frames(
    store: Store, base: int, start: int, end: int, skip_damage: bool
) -> Iterator[_Frame]:
    """The checked frames of the version-2 segment `base` that hold offsets of [start,
    end), found from the chunk index. Raises as `_frames` does, and FileNotFoundError
    when the segment is gone (the caller's SegmentGone)."""
    name = fmt.segment_name(base)
    where = f"{store.describe()}/{name}"
    segment = store.open_file(name)
    try:
        position = _start_position(store, base, segment.size(), start)
        for at, data, header, entries in _frames(segment, where, position, end, skip_damage):
            if header.next_offset > start:
                yield _Frame(where, at, data, header, entries)
    finally:
        segment.close()


def _decode(f: _Frame, skip_before: int, out: list[fmt.Record]) -> None:
    """Append the frame's records at or past `skip_before` to `out` (`chunk_records`).
    Raises SegmentCorrupted when the entries' framing is not what the header says (the
    CRCs held: a bad writer, not bit rot)."""
    try:
        chunk_records(f.data, 0, f.header, skip_before, f.header.num_records, out, f.entries)
    except ChunkInvalid as exc:
        raise SegmentCorrupted(f.where, f.at, str(exc)) from None


def read_range_records(
    store: Store, base: int, start: int, end: int, records_max: int, skip_damage: bool = False
) -> Iterator[list[fmt.Record]]:
    """The records [start, end) of the version-2 segment `base`, in lists of at most
    `records_max`. Raises SegmentCorrupted for damage unless `skip_damage`, and
    FileNotFoundError when the segment is gone (the caller's SegmentGone)."""
    out: list[fmt.Record] = []
    for f in _read_frames(store, base, start, end, skip_damage):
        _decode(f, start, out)
        while len(out) >= records_max:
            yield [r for r in out[:records_max] if r.offset < end]
            del out[:records_max]
    out = [r for r in out if r.offset < end]
    if out:
        yield out


class MessageSpans(NamedTuple):
    """The messages of one chunk, where they are in its frame: what a reader that takes
    the messages as they are (`Spans.payloads` said yes) gets instead of records."""

    data: memoryview  # the frame: a view of the read window, valid until the next item
    first_offset: int  # of `payloads[0]`
    timestamp_ms: int
    payloads: Ints  # each message's part that the reader keeps: start in `data`
    ends: Ints  # and end


class Spans(NamedTuple):
    """How a reader takes chunks as `MessageSpans`: `payloads(data, starts, ends)` gives
    what it keeps of each message (its starts; the ends stay), or None to take the chunk
    as records; `filter_values_ok` whether a chunk with filter values may come so (the
    spans do not carry them)."""

    payloads: Callable[[memoryview, Ints, Ints], Ints | None]
    filter_values_ok: bool


def read_range_columns(
    store: Store,
    base: int,
    start: int,
    end: int,
    records_max: int,
    skip_damage: bool = False,
    spans: Spans | None = None,
) -> Iterator[RecordColumns | list[fmt.Record] | MessageSpans]:
    """`read_range_records` in bulk: the records [start, end) as columns of at most
    `records_max` rows, the chunks' runs joined across chunks (each chunk's records made
    by `chunk_runs` in C: no Python object per record). A chunk only the Python path
    takes (salvaged entries, a filter value over 255 bytes) comes as its list of records,
    in order. With `spans`, a chunk of SPANS_RECORDS_MIN records or JOIN_BYTES_MAX of
    entries or more that it takes comes as `MessageSpans` (no record made, no copy).
    Raises as `read_range_records` does."""
    batch = _Batch(records_max)
    for f in _read_frames(store, base, start, end, skip_damage):
        taken = None if spans is None else _message_spans(f, spans, start, end)
        if taken is not None:
            yield from batch.flush()
            if len(taken.payloads):
                yield taken
            continue
        run, records = _run(f)
        if run is None:
            yield from batch.flush()
            kept = [r for r in records if start <= r.offset < end]
            if kept:
                yield kept
            continue
        first = max(start - run.first_offset, 0)
        last = min(end - run.first_offset, len(run.positions))
        yield from batch.add(run.data, np.frombuffer(run.positions, np.int64)[first:last])
    yield from batch.flush()


def _message_spans(f: _Frame, spans: Spans, start: int, end: int) -> MessageSpans | None:
    """The frame's messages in [start, end) as `MessageSpans`, when `spans` takes the
    chunk: large enough, intact, no compressed batch (`chunk_message_spans`, in C), and
    no filter value unless `spans.filter_values_ok`."""
    header = f.header
    large = header.num_records >= SPANS_RECORDS_MIN or header.data_length >= JOIN_BYTES_MAX
    if f.entries is not None or not large:
        return None
    at = frame.FRAME_HEAD_BYTES
    if (
        not spans.filter_values_ok
        and header.trailer_length
        and frame.parse_trailer(chunk.trailer_of(f.data, at, header)).filter_runs
    ):
        return None
    entries_at = at + chunk.HEADER_BYTES + header.bloom_size
    if _first_message_refused(f.data, entries_at, header.data_length, spans):
        return None  # a chunk of other messages costs one look, not a walk of all
    try:
        found = chunk_message_spans(f.data, entries_at, header.data_length,
                                    header.num_entries, header.first_offset,
                                    header.num_records)  # fmt: skip
    except ValueError as exc:
        raise SegmentCorrupted(f.where, f.at, str(exc)) from None
    if found is None:
        return None
    bounds = np.frombuffer(found, np.int64)
    first = max(start - header.first_offset, 0)
    last = min(end - header.first_offset, header.num_records)
    starts, ends = bounds[0::2][first:last], bounds[1::2][first:last]
    payloads = spans.payloads(f.data, starts, ends)
    if payloads is None:
        return None
    return MessageSpans(f.data, header.first_offset + first, header.timestamp_ms, payloads, ends)


def _first_message_refused(data: memoryview, at: int, length: int, spans: Spans) -> bool:
    """Whether `spans` refuses the chunk's first message, when its first entry is a
    simple one (its size checked against the entries' end)."""
    if length < chunk.SIMPLE_SIZE.size or data[at] & chunk.BATCH_FLAG:
        return False
    (size,) = chunk.SIMPLE_SIZE.unpack_from(data, at)
    if size > length - chunk.SIMPLE_SIZE.size:
        return False  # the walk says what is wrong
    start = at + chunk.SIMPLE_SIZE.size
    bounds = np.array([start, start + size], np.int64)
    return spans.payloads(data, bounds[:1], bounds[1:]) is None


def _run(f: _Frame) -> tuple[ChunkRun | None, list[fmt.Record]]:
    """The frame's records in the version-1 form, made in C; when the C declines
    (compressed sub-entry batches, salvaged entries), from its records decoded in
    Python, which come too (the run is None when even they do not fit the form: records
    lost to damage, a filter value too long for a routing key)."""
    header = f.header
    if f.entries is None:
        try:
            run = checked_frame_run(f.data, header)
        except ChunkInvalid as exc:
            raise SegmentCorrupted(f.where, f.at, str(exc)) from None
        if run is not None:
            return run, []
    records: list[fmt.Record] = []
    _decode(f, header.first_offset, records)
    return chunk_run(records, header.first_offset, header.num_records), records


class _Batch:
    """Runs of records gathered into columns of at most `records_max` rows. Small runs
    are joined (a batch per chunk of a few records would cost Arrow's fixed work per
    batch); a run of JOIN_BYTES_MAX or more goes out alone, never copied."""

    def __init__(self, records_max: int) -> None:
        self.records_max = records_max
        self.parts: list[tuple[bytes, Ints]] = []  # a buffer, its records' positions
        self.count = 0
        self.bytes = 0

    def add(self, buffer: bytes, positions: Ints) -> Iterator[RecordColumns]:
        if not len(positions):
            return
        if len(buffer) >= JOIN_BYTES_MAX:
            yield from self.flush()
        self.parts.append((buffer, positions))
        self.count += len(positions)
        self.bytes += len(buffer)
        while self.count >= self.records_max:
            columns = self._joined()
            yield _slice(columns, 0, self.records_max)
            rest = columns.positions[self.records_max :]
            self.parts, self.count, self.bytes = [], 0, 0
            if len(rest):
                at = int(rest[0])
                self.parts = [(columns.buffer[at:], rest - at)]
                self.count, self.bytes = len(rest), len(columns.buffer) - at
        if self.bytes >= JOIN_BYTES_MAX:
            yield from self.flush()

    def flush(self) -> Iterator[RecordColumns]:
        if self.count:
            yield self._joined()
        self.parts, self.count, self.bytes = [], 0, 0

    def _joined(self) -> RecordColumns:
        if len(self.parts) == 1:
            return run_columns(*self.parts[0])
        bases = np.cumsum([0] + [len(buffer) for buffer, _ in self.parts[:-1]])
        positions = np.concatenate([p + b for (_, p), b in zip(self.parts, bases, strict=True)])
        return run_columns(b"".join(buffer for buffer, _ in self.parts), positions)


def _slice(c: RecordColumns, first: int, last: int) -> RecordColumns:
    return RecordColumns(c.buffer, *(column[first:last] for column in c[1:]))


def first_at_or_after(store: Store, base: int, end: int, timestamp_ms: int) -> int | None:
    """The first offset below `end` of the version-2 segment `base` whose chunk was
    written at or after `timestamp_ms` (every record has its chunk's time), or None."""
    name = fmt.segment_name(base)
    segment = store.open_file(name)
    try:
        frames = _frames(segment, f"{store.describe()}/{name}", fmt.SEGMENT_HEADER_BYTES, end,
                         False)  # fmt: skip
        for _at, _data, header, _entries in frames:
            if header.timestamp_ms >= timestamp_ms:
                return header.first_offset
    finally:
        segment.close()
    return None
