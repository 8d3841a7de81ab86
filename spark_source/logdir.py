"""One stream's log as a reader in another process sees it, through a `Store`.

Owns the read-only view of a log that the broker writes: which segments exist, the
durable end offset (the `durable` marker), the seek of an offset or a timestamp through
the index files, and reading a range of records. It uses `streamq.log.format` for every
byte it decodes and never writes a file; `store` says where the bytes come from.

Rules:
1. Nothing at or past the durable offset is read: records there may be a torn tail.
2. Retention deletes whole old segments at any time. A segment that vanishes between
   listing and reading raises `SegmentGone`; the caller decides whether that is data loss.
3. An index file that is missing, corrupt or stale (its `segment_bytes` differs from the
   segment's size) is ignored and the segment is scanned from its first record.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from typing import Final, NamedTuple

from spark_source import chunkdir
from spark_source.columns import RecordColumns, decode_columns
from spark_source.store import SegmentFile, Store, stream_directory
from streamq.log import format as fmt
from streamq.log.damage import find_resync_with
from streamq.log.errors import SegmentCorrupted

log = logging.getLogger(__name__)

__all__ = [
    "LogView",
    "SegmentGone",
    "first_at_or_after",
    "read_range",
    "read_range_columns",
    "stream_directory",
]

READ_CHUNK_BYTES: Final = 1 << 20  # one read; a larger record is read whole on its own
DURABLE_READ_ATTEMPTS_MAX: Final = 5  # the broker rewrites the marker in place
SCAN_RECORDS_MAX: Final = 4096  # records decoded at once by a timestamp scan
_AFTER_ANY: Final = 1 << 64  # sorts after every position in an index entry


class SegmentGone(Exception):
    """A segment listed earlier was deleted (by retention) before it could be read."""

    def __init__(self, where: str) -> None:
        super().__init__(f"segment {where} was deleted (retention) before it could be read")
        self.where = where


class LogView(NamedTuple):
    """A snapshot of a stream's log: its segments and the readable offset range."""

    store: Store
    bases: tuple[int, ...]  # base offsets of the segments, ascending
    earliest: int  # first offset retained
    latest: int  # one past the last durable record


def read_durable(store: Store) -> int | None:
    """The durable end offset, or None when the marker is absent or stays torn."""
    for _ in range(DURABLE_READ_ATTEMPTS_MAX):
        try:
            data = store.read_file(fmt.DURABLE_FILE)
        except FileNotFoundError:
            return None
        offset = fmt.decode_durable(data)
        if offset is not None:
            return offset
    return None


def view_log(store: Store) -> LogView:
    """Read the durable marker, then list the segments. The marker is read first, so every
    record below it is in a listed segment (segments appear before their records become
    durable) unless retention deleted it. Raises FileNotFoundError when the stream's
    directory does not exist."""
    durable = read_durable(store)
    names = (fmt.parse_segment_name(name) for name in store.list_files())
    bases = tuple(sorted(base for base in names if base is not None))
    earliest = bases[0] if bases else (durable or 0)
    latest = max(durable or 0, earliest)
    return LogView(store, bases, earliest, latest)


def _load_index(store: Store, base: int, segment_bytes: int) -> fmt.IndexFile | None:
    try:
        name = fmt.index_name(base)
        index = fmt.decode_index(store.read_file(name), name)
    except FileNotFoundError:
        return None
    if index is None or index.segment_bytes != segment_bytes or not index.entries:
        return None
    return index


def _seek_offset(index: fmt.IndexFile | None, base: int, offset: int) -> tuple[int, int]:
    """(offset, position) of the indexed record at or before `offset` (binary search)."""
    if index is None:
        return base, fmt.SEGMENT_HEADER_BYTES
    i = max(bisect_right(index.entries, (offset - base, _AFTER_ANY)) - 1, 0)
    return base + index.entries[i][0], index.entries[i][1]


def _seek_timestamp(index: fmt.IndexFile | None, base: int, timestamp_ms: int) -> tuple[int, int]:
    """(offset, position) of the last indexed record older than `timestamp_ms`, or the
    first record: scanning forward from it finds the first record at or after that time.
    Timestamps never decrease within a log, so the entries are sorted by them too."""
    if index is None:
        return base, fmt.SEGMENT_HEADER_BYTES
    i = max(bisect_left(index.entries, timestamp_ms, key=lambda entry: entry[2]) - 1, 0)
    return base + index.entries[i][0], index.entries[i][1]


def _open_segment(store: Store, base: int) -> tuple[SegmentFile, str]:
    name = fmt.segment_name(base)
    where = f"{store.describe()}/{name}"
    try:
        return store.open_file(name), where
    except FileNotFoundError as exc:
        raise SegmentGone(where) from exc


def read_range(
    store: Store, base: int, start: int, end: int, records_max: int
) -> Iterator[list[fmt.Record]]:
    """Yield the records [start, end) of the segment `base` in lists of at most
    `records_max`. Seeks with the index when it is valid, else scans from the header.

    Raises SegmentGone when the segment no longer exists, and SegmentCorrupted when a
    record below `end` is missing or fails its checks (the caller read `end` from the
    durable marker, so every such record must be intact). A version-2 segment's
    records come from its chunks (`chunkdir`).
    """
    if is_chunk_segment(store, base):
        try:
            yield from chunkdir.read_range_records(store, base, start, end, records_max)
        except FileNotFoundError as exc:
            raise SegmentGone(f"{store.describe()}/{fmt.segment_name(base)}") from exc
        return
    segment, where = _open_segment(store, base)
    try:
        offset, position = _seek(store, segment, where, base, start)
        yield from _read_from(segment, where, position, offset, start, end, records_max)
    except FileNotFoundError as exc:  # a remote segment deleted between two reads
        raise SegmentGone(where) from exc
    finally:
        segment.close()


def read_range_columns(
    store: Store, base: int, start: int, end: int, records_max: int, skip_damage: bool = False
) -> Iterator[RecordColumns]:
    """`read_range`, decoded in bulk: the same records and errors, as columns. With
    `skip_damage` (failOnDataLoss=false), damaged records (bit rot: a bad record followed
    by a valid one, docs/durability.md) are skipped with a warning instead of failing
    the read, as the broker's consumers skip them."""
    segment, where = _open_segment(store, base)
    try:
        offset, position = _seek(store, segment, where, base, start)
        while offset < end:
            data = _read_chunk(segment, position)
            try:
                columns, result = decode_columns(
                    data, position, 0, offset, end, records_max, where, skip_before=start
                )
            except SegmentCorrupted:
                if not skip_damage:
                    raise
                columns, resumed = _around_damage(
                    segment, where, data, (position, offset), start, end
                )
                if columns.record_count:
                    yield columns
                if resumed is None:
                    return  # nothing valid after the damage in this segment
                position, offset = resumed
                continue
            position, offset = _advance(where, position, offset, result)
            if columns.record_count:
                yield columns
    except FileNotFoundError as exc:
        raise SegmentGone(where) from exc
    finally:
        segment.close()


def _around_damage(
    segment: SegmentFile,
    where: str,
    data: bytes,
    at: tuple[int, int],
    start: int,
    end: int,
) -> tuple[RecordColumns, tuple[int, int] | None]:
    """The good records of the chunk read at `at` (position, offset) before its damaged
    one, and where the next valid record is after it ((position, offset), None if none:
    the rest of the segment is lost). Logs what was skipped."""
    position, offset = at
    good: list[fmt.Record] = []
    try:
        fmt.decode_records(data, position, 0, offset, end, good, end - offset, where)
    except SegmentCorrupted:
        pass  # at the damaged record, as decode_columns did: `good` holds those before
    else:
        raise SegmentCorrupted(where, position, "the bulk and per-record decodes disagree")
    columns, result = decode_columns(
        data, position, 0, offset, offset + len(good), len(good), where, skip_before=start
    )
    bad_position, bad_offset = position + result.position, offset + len(good)
    last_ms = good[-1].timestamp_ms if good else 0
    resumed = find_resync_with(segment.pread, bad_position, segment.size(), bad_offset, last_ms)
    lost = "to the end of the segment" if resumed is None else f"to {resumed[1] - 1}"
    log.warning(
        "%s: damaged records from offset %d %s at position %d skipped (failOnDataLoss=false)",
        where,
        bad_offset,
        lost,
        bad_position,
    )
    return columns, resumed


def _seek(store: Store, segment: SegmentFile, where: str, base: int, start: int) -> tuple[int, int]:
    """Check the segment header; (offset, position) to read from to reach `start`."""
    fmt.decode_segment_header(segment.pread(fmt.SEGMENT_HEADER_BYTES, 0), where)
    return _seek_offset(_load_index(store, base, segment.size()), base, start)


def _read_chunk(segment: SegmentFile, position: int) -> bytes:
    """READ_CHUNK_BYTES from `position`, or the whole record there if it is longer."""
    data = segment.pread(READ_CHUNK_BYTES, position)
    if len(data) >= 4:
        need = 4 + int.from_bytes(data[:4], "little")
        if need > len(data):
            data = segment.pread(need, position)
    return data


def _advance(where: str, position: int, offset: int, result: fmt.DecodeResult) -> tuple[int, int]:
    """(position, offset) after a decode; raises SegmentCorrupted when it made no progress
    (a record the durable marker covers is missing or truncated)."""
    if result.next_offset == offset:
        raise SegmentCorrupted(where, position, f"record {offset} is missing or truncated")
    return position + result.position, result.next_offset


def _read_from(
    segment: SegmentFile,
    where: str,
    position: int,
    offset: int,
    start: int,
    end: int,
    records_max: int,
) -> Iterator[list[fmt.Record]]:
    """Decode records from `position` (which holds `offset`), returning those >= start."""
    while offset < end:
        data = _read_chunk(segment, position)
        out: list[fmt.Record] = []
        result = fmt.decode_records(
            data, position, 0, offset, end, out, records_max, where, skip_before=start
        )
        position, offset = _advance(where, position, offset, result)
        if out:
            yield out


def first_at_or_after(view: LogView, timestamp_ms: int) -> int:
    """The first durable offset whose record was appended at or after `timestamp_ms`, or
    `view.latest` when there is none. Sealed segments whose index says they end earlier
    are skipped without reading them. Raises SegmentGone as `read_range`."""
    for i, base in enumerate(view.bases):
        seg_end = view.bases[i + 1] if i + 1 < len(view.bases) else view.latest
        seg_end = min(seg_end, view.latest)
        if seg_end <= base:
            continue
        found = _first_in_segment(view.store, base, seg_end, timestamp_ms)
        if found is not None:
            return found
    return view.latest


def is_chunk_segment(store: Store, base: int) -> bool:
    """Whether the segment `base` is of format version 2 (chunks: `chunkdir` reads it).
    Raises SegmentGone, and SegmentCorrupted for a bad header."""
    segment, where = _open_segment(store, base)
    try:
        return chunkdir.is_chunk_segment(segment, where)
    except FileNotFoundError as exc:
        raise SegmentGone(where) from exc
    finally:
        segment.close()


def _first_in_segment(store: Store, base: int, end: int, timestamp_ms: int) -> int | None:
    if is_chunk_segment(store, base):
        try:
            return chunkdir.first_at_or_after(store, base, end, timestamp_ms)
        except FileNotFoundError as exc:
            raise SegmentGone(f"{store.describe()}/{fmt.segment_name(base)}") from exc
    segment, where = _open_segment(store, base)
    try:
        index = _load_index(store, base, segment.size())
        if index is not None and index.last_timestamp_ms < timestamp_ms:
            return None
        offset, position = _seek_timestamp(index, base, timestamp_ms)
        for records in _read_from(segment, where, position, offset, offset, end, SCAN_RECORDS_MAX):
            for record in records:
                if record.timestamp_ms >= timestamp_ms:
                    return record.offset
    finally:
        segment.close()
    return None
