"""Recovery of a log directory on open: find the valid records, cut what is not.

Owns the decisions taken when a log is opened after any stop, clean or `kill -9`:

* A closed segment with a valid index whose size matches is trusted (sealed).
* A segment without a usable index is scanned record by record and gets a new index.
* Bad bytes followed by a valid record are damage (bit rot), not a torn write: only
  the records in them are lost, everything after is kept (`damage` finds where records
  resume), and the spans are returned for the log to report and its readers to skip.
* The valid part of the log ends at bad bytes with nothing valid after them in an
  unsealed segment: a torn tail. Everything after it was never reported durable (a sync
  seals segments in order and fsyncs them before reporting), so it is cut: the segment
  is truncated and any later segments are deleted. Unless the `durable` marker or a
  sealed segment after it says records there were durable: then they are damage too,
  the bytes stay, and the log goes on after them (in a new segment if it was the last).
* A bad segment header is rewritten from the file name (the header holds nothing else
  a reader needs but the floor timestamp, taken from the segment before).
* Damage that no rule above explains (a sealed segment shorter than its index says, a
  gap between segments) raises SegmentCorrupted naming the segment and position: the
  caller fails that log only.

Every change is fsynced (file, then directory) before `recover` returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import NamedTuple

from streamq.log import files, frame
from streamq.log import format as fmt
from streamq.log.chunk_segment import scan_chunk_segment
from streamq.log.damage import DamagedSpan, span_at
from streamq.log.errors import SegmentCorrupted
from streamq.log.files import fsync_directory, write_all
from streamq.log.full_disk import write_index_or_defer
from streamq.log.index import ChunkIndex, SparseIndex
from streamq.log.segment import Segment, scan_segment
from streamq.progress import Progress

logger = logging.getLogger(__name__)


class Recovered(NamedTuple):
    segments: list[Segment]  # oldest first; the last one is the active segment
    truncated_bytes: int
    deleted_segments: int
    damaged: list[DamagedSpan]  # records lost to damage, in offset order


class _Opened(NamedTuple):
    """A segment as recovery found it."""

    segment: Segment
    cut_bytes: int  # torn bytes cut from its end
    damaged: list[DamagedSpan]
    tail_lost: bool  # its last records are damaged, and the log goes on after them


def recover(directory: str, interval_bytes: int, version: int = fmt.FORMAT_VERSION) -> Recovered:
    """Open `directory` as a log, repairing a torn tail. Fsyncs every repair before returning.
    A new log's first segment is of format `version`; an existing log's segments keep theirs.

    Raises SegmentCorrupted for damage a crash cannot explain.
    """
    files.makedirs(directory)
    _remove_temp_files(directory)
    bases = _segment_bases(directory)
    if not bases:
        segment = create_segment(directory, 0, interval_bytes, version=version)
        fsync_directory(directory)
        return Recovered([segment], 0, 0, [])
    segments: list[Segment] = []
    truncated = 0
    deleted = 0
    damaged: list[DamagedSpan] = []
    tail_lost = False
    sealed_after = _sealed_flags(directory, bases)
    durable = _durable_offset(directory)
    progress = Progress(logger, f"log {directory}: recovery", len(bases), "segments")
    for i, base in enumerate(bases):
        path = os.path.join(directory, fmt.segment_name(base))
        if segments and segments[-1].next_offset != base:
            if any(sealed_after[i:]):
                raise SegmentCorrupted(
                    path, 0, f"gap in the log: expected offset {segments[-1].next_offset}"
                )
            deleted += _delete_segments(directory, bases[i:])
            break
        is_last = i == len(bases) - 1
        later_sealed = any(sealed_after[i + 1 :])
        if not is_last and not later_sealed and os.path.getsize(path) < fmt.SEGMENT_HEADER_BYTES:
            # Created during a roll that never became durable, like everything after it.
            deleted += _delete_segments(directory, bases[i:])
            break
        # Durable up to here: the next segment's base if it is sealed (or below the
        # marker), else the marker.
        durable_to = durable
        if not is_last and (later_sealed or durable >= bases[i + 1]):
            durable_to = bases[i + 1]
        floor_ms = segments[-1].last_timestamp_ms if segments else 0
        opened = _open_segment(path, base, interval_bytes, is_last, durable_to, floor_ms, version)
        segment = opened.segment
        segments.append(segment)
        progress.step()
        damaged += opened.damaged
        tail_lost = opened.tail_lost
        truncated += opened.cut_bytes
        if is_last or (opened.tail_lost and segment.next_offset == bases[i + 1]):
            continue
        if opened.cut_bytes or opened.tail_lost:
            # A torn (or damaged) unsealed segment: nothing after it was ever durable.
            deleted += _delete_segments(directory, bases[i + 1 :])
            break
    if not segments:
        segments.append(create_segment(directory, bases[0], interval_bytes, version=version))
        os.fsync(segments[0].write_fd)
    elif tail_lost:
        # The newest segment ends in damage: appends go on in a new one, after it.
        last = segments[-1]
        segments.append(
            create_segment(
                directory,
                last.next_offset,
                interval_bytes,
                last.last_timestamp_ms,
                version=last.version,
            )
        )
        os.fsync(segments[-1].write_fd)
    _make_active(segments[-1])
    for segment in segments[:-1]:
        if not segment.sealed:
            segment.sealed = write_index_or_defer(segment.index_path, segment.index_bytes())
    if truncated or deleted or not all(s.sealed for s in segments[:-1]):
        logger.warning(
            "log %s recovered: truncated %d bytes of torn tail, deleted %d unsynced segments",
            directory,
            truncated,
            deleted,
        )
    fsync_directory(directory)
    progress.finish()
    return Recovered(segments, truncated, deleted, damaged)


def create_segment(
    directory: str,
    base_offset: int,
    interval_bytes: int,
    floor_ms: int = 0,
    *,
    write_header: bool = True,
    version: int = fmt.FORMAT_VERSION,
) -> Segment:
    """Create an empty segment file holding only its header (without `write_header`,
    empty: the caller writes the header first, as the log does on a roll).

    The header is buffered in the OS: durable after the caller's fsync of the file, the
    file's existence after an fsync of the directory.
    """
    path = os.path.join(directory, fmt.segment_name(base_offset))
    fd = files.open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    if write_header:
        write_all(fd, fmt.encode_segment_header(base_offset, floor_ms, version))
    index = ChunkIndex() if version == frame.FORMAT_VERSION else SparseIndex(interval_bytes)
    segment = Segment(path, base_offset, index, version)
    segment.write_fd = fd
    return segment


def _make_active(segment: Segment) -> None:
    """Open the newest segment for appends; an active segment has no index file."""
    if segment.write_fd < 0:
        segment.write_fd = files.open_fd(segment.path, os.O_WRONLY | os.O_APPEND)
    segment.sealed = False
    with contextlib.suppress(FileNotFoundError):
        files.remove(segment.index_path)


def _open_segment(
    path: str,
    base: int,
    interval_bytes: int,
    is_last: bool,
    durable_to: int,
    floor_ms: int,
    version: int = fmt.FORMAT_VERSION,
) -> _Opened:
    """The segment at `path`, what was cut from it and the damage found in it. Records
    below `durable_to` were durable: bad bytes in their place are damage, not a torn tail."""
    file_bytes = os.path.getsize(path)
    if is_last and file_bytes < fmt.SEGMENT_HEADER_BYTES:
        # Created but its header never reached the disk: write it again.
        files.remove(path)
        segment = create_segment(os.path.dirname(path), base, interval_bytes, version=version)
        os.fsync(segment.write_fd)
        return _Opened(segment, 0, [], False)
    indexed = _load_index(path, base, file_bytes, interval_bytes) if not is_last else None
    if indexed is not None:
        with open(path, "rb") as f:  # a newer streamq's segment stops the start
            fmt.refuse_newer_segment(f.read(fmt.SEGMENT_HEADER_BYTES), path)
        return _Opened(indexed, 0, [], False)
    found = _check_header(path, base, floor_ms, version)
    if found == frame.FORMAT_VERSION:
        return _open_chunk_segment(path, base, durable_to, floor_ms)
    scan = scan_segment(path, base, interval_bytes, 1 << 64)
    segment = Segment(path, base, scan.sparse_index)
    segment.next_offset = scan.next_offset
    segment.size_bytes = scan.valid_bytes
    segment.first_timestamp_ms = scan.first_timestamp_ms
    segment.last_timestamp_ms = scan.last_timestamp_ms
    damaged = list(scan.damaged)
    cut = scan.file_bytes - scan.valid_bytes
    tail_lost = bool(cut) and durable_to > scan.next_offset
    if tail_lost:
        # Durable records were there: damage, kept on disk, and the log goes on after it.
        fd = os.open(path, os.O_RDONLY)
        try:
            span, _ = span_at(path, base, fd, scan.valid_bytes, scan.next_offset,
                              scan.file_bytes, scan.last_timestamp_ms, durable_to)  # fmt: skip
        finally:
            os.close(fd)
        damaged.append(span)
        segment.next_offset = durable_to
        segment.size_bytes = scan.file_bytes
        if not len(segment.index):  # no record is left: the first (damaged) keeps its entry
            floor_ms = max(floor_ms, 0)
            segment.index.add(0, fmt.SEGMENT_HEADER_BYTES, floor_ms)
            segment.first_timestamp_ms = segment.last_timestamp_ms = floor_ms
        cut = 0
    # The records that survived may have been in the page cache only (a killed process
    # leaves it intact): fsync them before anyone reads them as durable, or a power loss
    # later could take back records that were delivered, and their offsets with them.
    fd = files.open_fd(path, os.O_WRONLY)
    try:
        if cut:
            files.ftruncate(fd, scan.valid_bytes)
        os.fsync(fd)
    finally:
        files.close_fd(fd)
    return _Opened(segment, cut, damaged, tail_lost)


def _check_header(path: str, base: int, floor_ms: int, version: int) -> int:
    """The segment's format version; a damaged header is rewritten from what the file
    name and the log say (it holds no record; its version from the first bytes after
    it: a chunk frame's magic says 2, else `version` for an empty file, else 1).
    Fsynced before returning."""
    with open(path, "rb") as f:
        head = f.read(fmt.SEGMENT_HEADER_BYTES + frame.FRAME_HEAD_BYTES + 1)
    try:
        found = fmt.decode_segment_header(head, path)
        if found == base:
            return fmt.decode_segment_version(head)
        reason = f"{path}: base offset {found} in the header"
    except SegmentCorrupted as exc:
        reason = str(exc)
    logger.error("%s; header rewritten (base offset %d, floor %d ms)", reason, base, floor_ms)
    first = head[fmt.SEGMENT_HEADER_BYTES + frame.FRAME_HEAD_BYTES :]
    if len(head) <= fmt.SEGMENT_HEADER_BYTES:
        kind = version
    else:
        kind = frame.FORMAT_VERSION if first[:1] == b"\x50" else fmt.FORMAT_VERSION
    fd = files.open_fd(path, os.O_WRONLY)
    try:
        files.pwrite(fd, fmt.encode_segment_header(base, floor_ms, kind), 0)
        os.fsync(fd)
    finally:
        files.close_fd(fd)
    return kind


def _open_chunk_segment(path: str, base: int, durable_to: int, floor_ms: int) -> _Opened:
    """`_open_segment` of a version-2 segment (its header checked): the same rules per
    chunk. A bad tail below `durable_to` is damage: its offsets are lost, the bytes stay
    and the log goes on after them."""
    scan = scan_chunk_segment(path, base, durable_to)
    segment = Segment(path, base, scan.chunk_index, frame.FORMAT_VERSION)
    segment.next_offset = scan.next_offset
    segment.size_bytes = scan.valid_bytes
    segment.first_timestamp_ms = scan.first_timestamp_ms
    segment.last_timestamp_ms = scan.last_timestamp_ms
    damaged = list(scan.damaged)
    cut = scan.file_bytes - scan.valid_bytes
    tail_lost = bool(cut) and durable_to > scan.next_offset
    if tail_lost:
        damaged.append(
            DamagedSpan(
                path, base, scan.valid_bytes, scan.file_bytes, scan.next_offset, durable_to, cut
            )
        )
        segment.next_offset = durable_to
        segment.size_bytes = scan.file_bytes
        if segment.first_timestamp_ms < 0:
            segment.first_timestamp_ms = segment.last_timestamp_ms = max(floor_ms, 0)
        cut = 0
    fd = files.open_fd(path, os.O_WRONLY)  # durable before anyone reads it as durable
    try:
        if cut:
            files.ftruncate(fd, scan.valid_bytes)
        os.fsync(fd)
    finally:
        files.close_fd(fd)
    return _Opened(segment, cut, damaged, tail_lost)


def _durable_offset(directory: str) -> int:
    """The `durable` marker's offset: every record below it was durable (0 when it is
    missing or damaged: nothing is then known to have been)."""
    try:
        with open(os.path.join(directory, fmt.DURABLE_FILE), "rb") as f:
            return fmt.decode_durable(f.read()) or 0
    except FileNotFoundError:
        return 0


def _load_index(path: str, base: int, file_bytes: int, interval_bytes: int) -> Segment | None:
    """A sealed segment from its index file, or None if the index is missing or stale.

    Raises SegmentCorrupted if the segment is shorter than its durable index says.
    """
    index_path = os.path.join(os.path.dirname(path), fmt.index_name(base))
    try:
        with open(index_path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if fmt.index_intact(raw, index_path) and fmt.index_version(raw) == frame.FORMAT_VERSION:
        return _load_chunk_index(path, base, file_bytes, raw)
    decoded = fmt.decode_index(raw, index_path)
    if decoded is None or decoded.base_offset != base or not decoded.entries:
        return None
    if file_bytes < decoded.segment_bytes:
        raise SegmentCorrupted(
            path, file_bytes, f"segment is shorter than the {decoded.segment_bytes} bytes indexed"
        )
    if file_bytes != decoded.segment_bytes:
        return None
    segment = Segment(path, base, SparseIndex.from_entries(interval_bytes, decoded.entries))
    segment.next_offset = decoded.next_offset
    segment.size_bytes = decoded.segment_bytes
    segment.first_timestamp_ms = decoded.entries[0][2]
    segment.last_timestamp_ms = decoded.last_timestamp_ms
    segment.sealed = True
    return segment


def _sealed_flags(directory: str, bases: list[int]) -> list[bool]:
    """Whether each segment has a valid index file (checked again when it is opened)."""
    flags = []
    for base in bases:
        try:
            index_path = os.path.join(directory, fmt.index_name(base))
            with open(index_path, "rb") as f:
                flags.append(fmt.index_intact(f.read(), index_path))
        except FileNotFoundError:
            flags.append(False)
    return flags


def _segment_bases(directory: str) -> list[int]:
    bases = []
    for name in os.listdir(directory):
        base = fmt.parse_segment_name(name)
        if base is not None:
            bases.append(base)
        elif name.endswith(fmt.INDEX_SUFFIX) and not os.path.exists(
            os.path.join(directory, name[: -len(fmt.INDEX_SUFFIX)] + fmt.SEGMENT_SUFFIX)
        ):
            files.remove(os.path.join(directory, name))  # index of a segment retention deleted
    return sorted(bases)


def _delete_segments(directory: str, bases: list[int]) -> int:
    for base in bases:
        for name in (fmt.segment_name(base), fmt.index_name(base)):
            with contextlib.suppress(FileNotFoundError):
                files.remove(os.path.join(directory, name))
    return len(bases)


def _remove_temp_files(directory: str) -> None:
    for name in os.listdir(directory):
        if name.endswith(".tmp"):
            files.remove(os.path.join(directory, name))


def _load_chunk_index(path: str, base: int, file_bytes: int, raw: bytes) -> Segment | None:
    """`_load_index` of a version-2 index file (intact)."""
    _, _, _, base_found, next_offset, segment_bytes, last_ts, _, _ = fmt.INDEX_HEADER.unpack_from(
        raw, 0
    )
    entries = frame.decode_index_entries(memoryview(raw)[fmt.INDEX_HEADER_BYTES :])
    if base_found != base or not entries:
        return None
    if file_bytes < segment_bytes:
        raise SegmentCorrupted(
            path, file_bytes, f"segment is shorter than the {segment_bytes} bytes indexed"
        )
    if file_bytes != segment_bytes:
        return None
    segment = Segment(path, base, ChunkIndex.from_chunks(entries), frame.FORMAT_VERSION)
    segment.next_offset = next_offset
    segment.size_bytes = segment_bytes
    segment.first_timestamp_ms = entries[0].timestamp_ms
    segment.last_timestamp_ms = last_ts
    segment.sealed = True
    return segment
