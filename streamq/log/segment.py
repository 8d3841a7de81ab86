"""One segment file: its metadata in memory, and scanning and reading it by position.

Owns what a single segment knows (base and next offset, size, timestamps, sparse index)
and the two ways of walking its bytes: `scan_segment` (recovery and index rebuilds: stop at
the first invalid record) and `read_records` (readers: a bad record is corruption). It
never decides what to do about a torn tail or another segment; `recovery` and `log` do.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import BinaryIO, NamedTuple

from streamq.log import format as fmt
from streamq.log import frame
from streamq.log._records import check_records, scan_records
from streamq.log.damage import DamagedSpan, span_at
from streamq.log.errors import SegmentCorrupted
from streamq.log.frame import encode_index_entries
from streamq.log.index import ChunkIndex, SparseIndex
from streamq.log.writer import SegmentWriter

_U64_MAX = (1 << 64) - 1
SCAN_CHUNK_BYTES = 1 << 20  # read unit of scans, bounded so a scan never holds a whole file


class SegmentInfo(NamedTuple):
    """What retention and operators see of a segment."""

    base_offset: int
    next_offset: int
    size_bytes: int
    first_timestamp_ms: int
    last_timestamp_ms: int
    active: bool


class Segment:
    """Metadata of one segment. `next_offset` and `size_bytes` include buffered appends."""

    __slots__ = (
        "base_offset",
        "first_timestamp_ms",
        "index",
        "last_timestamp_ms",
        "next_offset",
        "path",
        "sealed",
        "size_bytes",
        "version",
        "write_fd",
        "writer",
    )

    def __init__(
        self, path: str, base_offset: int, index: SparseIndex, version: int = fmt.FORMAT_VERSION
    ) -> None:
        self.path = path
        # The segment's format version: 1 holds records, 2 chunks (`index` a ChunkIndex).
        self.version = version
        self.base_offset = base_offset
        self.next_offset = base_offset
        self.size_bytes = fmt.SEGMENT_HEADER_BYTES
        self.index = index
        self.first_timestamp_ms = -1
        self.last_timestamp_ms = -1
        # Sealed: closed for appends, its data and index file durable.
        self.sealed = False
        self.write_fd = -1
        # Writes this segment's appends on the Syncer thread; None until the first one.
        self.writer: SegmentWriter | None = None

    @property
    def record_count(self) -> int:
        return self.next_offset - self.base_offset

    @property
    def index_path(self) -> str:
        return os.path.join(os.path.dirname(self.path), fmt.index_name(self.base_offset))

    def index_bytes(self) -> bytes:
        if isinstance(self.index, ChunkIndex):
            return fmt.encode_index_body(
                self.base_offset, self.next_offset, self.size_bytes, self.last_timestamp_ms,
                len(self.index), encode_index_entries(self.index.chunks()), frame.FORMAT_VERSION,
            )  # fmt: skip
        return fmt.encode_index(
            self.base_offset,
            self.next_offset,
            self.size_bytes,
            self.last_timestamp_ms,
            self.index.entries(),
        )


class ScanResult(NamedTuple):
    """How far the valid records of a segment reach, and the damage passed over."""

    valid_bytes: int  # position after the last valid record
    file_bytes: int
    next_offset: int
    first_timestamp_ms: int
    last_timestamp_ms: int
    sparse_index: SparseIndex
    damaged: list[DamagedSpan]  # bad bytes with valid records after them, oldest first


def scan_segment(path: str, base_offset: int, interval_bytes: int, limit_offset: int) -> ScanResult:
    """Walk a segment record by record, checking length, CRC and offset sequence, and build
    its sparse index. Bad bytes followed by a valid record are damage: the walk goes on
    from that record (`damage.find_resync`), which gets an index entry, and the span is
    listed. Stops at bad bytes with nothing valid after them (a torn tail), or before a
    record whose offset is `limit_offset` or more. Raises SegmentCorrupted for a bad header.

    The walk is one C call per chunk (`_records.scan_records`): recovery scans a vhost's
    newest segment, up to 64 MiB, before the broker listens.
    """
    index = SparseIndex(interval_bytes)
    damaged: list[DamagedSpan] = []
    with open(path, "rb") as f:
        file_bytes = os.fstat(f.fileno()).st_size
        fmt.decode_segment_header(f.read(fmt.SEGMENT_HEADER_BYTES), path)
        position = fmt.SEGMENT_HEADER_BYTES
        offset = base_offset
        first_ts = last_ts = -1
        while True:
            position, offset, first_ts, last_ts = _scan_run(
                f, base_offset, position, file_bytes, offset, limit_offset, index, first_ts, last_ts
            )
            if position >= file_bytes or offset >= limit_offset:
                break
            span, resumed_ts = span_at(
                path, base_offset, f.fileno(), position, offset, file_bytes, last_ts, offset
            )
            if resumed_ts < 0 or span.end_offset >= limit_offset:
                break  # nothing valid after the bad bytes: a torn tail
            damaged.append(span)
            if not len(index):  # the first record is damaged: it keeps its entry
                index.add(0, fmt.SEGMENT_HEADER_BYTES, resumed_ts)
            index.insert(span.end_offset - base_offset, span.end_position, resumed_ts)
            position, offset = span.end_position, span.end_offset
    return ScanResult(position, file_bytes, offset, first_ts, last_ts, index, damaged)


def _scan_run(
    f: BinaryIO,
    base_offset: int,
    position: int,
    file_bytes: int,
    offset: int,
    limit_offset: int,
    index: SparseIndex,
    first_ts: int,
    last_ts: int,
) -> tuple[int, int, int, int]:
    """Walk the valid records from `position` on, adding index entries; returns where
    they end, the offset there, and the first and last timestamps met."""
    while position < file_bytes:
        buffer, _ = _refill(f, position)
        end, offset_after, first, last, entries, stopped = scan_records(
            buffer,
            0,
            offset,
            min(limit_offset, _U64_MAX),
            position,
            index.last_position,
            index.interval_bytes,
            last_ts,
        )
        for entry_offset, entry_position, entry_ts in entries:
            index.add(entry_offset - base_offset, entry_position, entry_ts)
        if first_ts < 0:
            first_ts = first
        last_ts = last
        offset = offset_after
        position += end
        if stopped or end == 0:
            break  # torn, corrupt or out of order; or a record the chunk cannot hold
    return position, offset, first_ts, last_ts


def _refill(f: BinaryIO, position: int) -> tuple[bytes, int]:
    """Read the next chunk starting at `position`, large enough for the record there."""
    f.seek(position)
    head = f.read(4)
    want = SCAN_CHUNK_BYTES
    if len(head) == 4:
        want = max(want, 4 + int.from_bytes(head, "little"))
    # A garbage length must not make us allocate beyond the file: read() is bounded by EOF.
    return head + f.read(want - len(head)), position


def read_records(
    fd: int,
    segment: Segment,
    position: int,
    offset: int,
    offset_end: int,
    records_max: int,
    skip_before: int,
    chunk_bytes: int,
    out: list[fmt.Record],
    resolve: Callable[[int, int], DamagedSpan] | None = None,
) -> tuple[int, int]:
    """Append to `out` the records from `position` (which holds record `offset`) up to
    `offset_end`, at most `records_max` of them, skipping (but checking) those below
    `skip_before`. Returns the (position, offset) where reading stopped.

    A damaged record is passed over with its span when `resolve(position, offset)` gives
    it (`SegmentLog.resolve_damage`): the records in it are lost, never returned. Raises
    SegmentCorrupted when a record that must be there is missing or damaged and there
    is no `resolve`.
    """
    end = min(offset_end, segment.next_offset)
    while offset < end and records_max > 0:
        # A small read (a consumer's next few records, a seek) reads a small chunk; the
        # loop reads on when the records turn out to be larger.
        wanted = records_max + max(0, skip_before - offset)
        data = os.pread(fd, min(chunk_bytes, max(4096, wanted * 128)), position)
        if len(data) >= 4:
            # Bounded by the segment: a damaged length must not allocate gigabytes.
            need = min(4 + int.from_bytes(data[:4], "little"), segment.size_bytes - position)
            if need > len(data):
                data = os.pread(fd, need, position)
        before = len(out)
        try:
            result = fmt.decode_records(
                data, position, 0, offset, end, out, records_max, segment.path, skip_before
            )
            if result.next_offset == offset:
                raise SegmentCorrupted(
                    segment.path, position, f"record {offset} is missing or truncated"
                )
        except SegmentCorrupted:
            if resolve is None:
                raise
            # The records before the bad one went into `out`; the span starts at it.
            good_bytes, good_next, _ = check_records(data, 0, offset)
            span = resolve(position + good_bytes, good_next)
            records_max -= len(out) - before
            position, offset = span.end_position, span.end_offset
            continue
        records_max -= len(out) - before
        position += result.position
        offset = result.next_offset
    return position, offset


def find_record(
    read_at: Callable[[int, int], bytes],
    resolve: Callable[[int, int], DamagedSpan],
    path: str,
    position: int,
    first_offset: int,
    offset: int,
    size: int,
) -> fmt.Record:
    """The record `offset` of a segment, read with `read_at(position, size)` from
    `position`, which holds record `first_offset` (a sparse index entry at or before it),
    `size` bytes at a time (a read is a copy, and callers read one record at a time).
    Damaged records on the way are passed over with `resolve(position, offset)`.

    Raises RecordDamaged when `offset` was lost to damage, and what `read_at` raises."""
    out: list[fmt.Record] = []
    while True:
        data = read_at(position, size)
        if len(data) >= 4:
            need = 4 + int.from_bytes(data[:4], "little")
            if need > len(data):
                data = read_at(position, need)
        if first_offset < offset:
            # Pass over the records before it: one C call per chunk, not a decode each.
            end, first_offset, _, _, _, _ = scan_records(
                data, 0, first_offset, offset, 0, 0, 1 << 62, -(1 << 62)
            )
            if end > 0:
                position += end
                continue
            # Nothing passed over: the next record is damaged or missing (below).
        with contextlib.suppress(SegmentCorrupted):  # the record at `position`: below
            fmt.decode_records(
                bytes(data), position, 0, first_offset, offset + 1, out, 1, path, offset
            )
        if out:
            return out[0]
        # Damaged (or missing) here: pass over the span, unless it holds `offset`.
        lost = resolve(position, first_offset)
        if lost.end_offset > offset:
            raise lost.error()
        position, first_offset = lost.end_position, lost.end_offset
