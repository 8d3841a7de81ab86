"""The read path of a segment log: `LogReader`, a part of `SegmentLog` (see `state`).

Owns reading: records from an offset (`read`, durable records only, damaged ones passed
over), bytes at a segment position (`read_at`, and `view_at` without a copy from sealed
segments), one record (`read_record`), lookups by offset and time (`locate`,
`segment_after`, `seek_timestamp`), resolving damage found on the way (`resolve_damage`),
and the read descriptors and mappings it keeps (up to `read_fds_max` each).

It never appends, syncs or drops segments, and holds no state of its own. `read_at` and
`view_at` serve the stream protocol and deliveries for every chunk: keep them free of
extra calls and attribute hops.
"""

from __future__ import annotations

import mmap
import os
from bisect import bisect_left, bisect_right
from functools import partial
from typing import NamedTuple

from streamq.log import chunk, frame
from streamq.log import format as fmt
from streamq.log.chunk import ChunkInvalid
from streamq.log.chunk_runs import ChunkRun, chunk_run, frame_run
from streamq.log.chunk_segment import chunk_records
from streamq.log.damage import DamagedSpan, resolve
from streamq.log.errors import LogError, OffsetOutOfRange, ReadFailed, SegmentCorrupted
from streamq.log.index import ChunkIndex
from streamq.log.salvage import damaged_spans, salvage
from streamq.log.segment import Segment, find_record, read_records
from streamq.log.state import LogState

DECODED_CHUNKS_MAX = 8  # chunks kept decoded for record readers (`_decoded_chunk`)


class ChunkPlace(NamedTuple):
    """A stored chunk of a version-2 segment, as its index tells it."""

    base_offset: int  # the segment's
    position: int  # of its frame
    first_offset: int
    records: int
    chunk_bytes: int
    path: str


class LogReader(LogState):
    """Reads and lookups of a `SegmentLog`."""

    def read(self, offset: int, records_max: int) -> list[fmt.Record]:
        """Durable records from `offset` on, at most `records_max`, possibly fewer.

        Returns [] at the durable end. Damaged records are passed over, never returned
        (`resolve_damage`): the offsets of those returned may have gaps. Raises
        OffsetOutOfRange below `start_offset`, and ReadFailed for an I/O error reading
        (that read fails; the log goes on).
        """
        self._check_usable()
        if offset < self.start_offset:
            raise OffsetOutOfRange(offset, self.start_offset)
        out: list[fmt.Record] = []
        end = self._durable_next
        while offset < end and len(out) < records_max:
            segment = self._segments[bisect_right(self._bases, offset) - 1]
            if segment.version == frame.FORMAT_VERSION:
                reached = self._read_chunks(segment, offset, end, records_max - len(out), out)
                if reached == offset:
                    break
                offset = reached
                continue
            rel, position = segment.index.floor_offset(offset - segment.base_offset)
            try:
                _, offset = read_records(
                    self._read_fd(segment),
                    segment,
                    position,
                    segment.base_offset + rel,
                    end,
                    records_max - len(out),
                    offset,
                    self.config.read_chunk_bytes,
                    out,
                    partial(self.resolve_damage, segment.base_offset),
                )
            except SegmentCorrupted as exc:
                if segment.sealed and segment is not self._active:
                    # A sealed segment never changes again: its damage fails the readers
                    # of its offsets, not the log, which goes on appending and reading.
                    raise
                raise self._fail(exc) from exc
            except LogError as exc:
                raise self._fail(exc) from exc
            except OSError as exc:  # EIO: this read fails, not the log
                raise ReadFailed(segment.path, position, exc) from exc
        return out

    def _read_chunks(
        self, segment: Segment, offset: int, end: int, records_max: int, out: list[fmt.Record]
    ) -> int:
        """`read` in a version-2 segment: the records of its chunks from the one holding
        `offset`; returns where reading goes on (the segment's end when its chunks are
        done). A chunk that fails its checks is damage: its offsets (the index says which)
        are lost alone, and readers pass over them."""
        index = segment.index
        assert isinstance(index, ChunkIndex)
        base = segment.base_offset
        i = index.find(offset - base)
        wanted = records_max
        while i < len(index) and offset < end and wanted > 0:
            first = base + index.relative_offsets[i]
            if first >= end:
                return end
            position, size = index.positions[i], index.chunk_bytes[i]
            chunk_end = first + index.records[i]
            before = len(out)
            try:
                records = self._decoded_chunk(segment, position, size, first, chunk_end)
                # Offsets may have gaps (entries lost to damage): find `offset` by value.
                start = bisect_left(records, offset, key=_record_offset)
                taken = records[start : start + wanted]
                out += taken
                more = start + len(taken) < len(records)
                reached = taken[-1].offset + 1 if taken and more else chunk_end
            except ChunkInvalid as exc:
                del out[before:]
                span = DamagedSpan(segment.path, base, position,
                                   position + frame.FRAME_HEAD_BYTES + size, first, chunk_end,
                                   size)  # fmt: skip
                self.damage.add(span, f"reading ({exc})")
                reached = chunk_end
            wanted -= len(out) - before
            offset = max(offset, reached)
            if reached < chunk_end:
                return offset  # records_max reached inside the chunk
            i += 1
        return max(offset, segment.next_offset) if i >= len(index) else offset

    def _decoded_chunk(
        self, segment: Segment, position: int, size: int, first: int, end: int
    ) -> list[fmt.Record]:
        """The records of the chunk at `position` (offsets `first` to `end`), checked and
        decoded once for the readers that read it record by record (kept for the last
        few chunks read: consumers read a chunk a few records at a time). Entries that
        fail their own checksum are damage, lost alone (`salvage`); the records of the
        others are returned, their offsets with gaps."""
        base = segment.base_offset
        key = (base, position)
        records = self._decoded.get(key)
        if records is not None:
            return records
        data = self.frame_at(base, position, size)
        entries = None
        try:
            header = frame.check_frame(data)
        except frame.EntriesDamaged as exc:
            header = chunk.decode_header(data, frame.FRAME_HEAD_BYTES)
            entries = self.salvage_chunk(segment.path, base, position, data, header, str(exc))
        if header.first_offset != first or header.next_offset != end:
            raise ChunkInvalid(f"chunk {header.first_offset} where {first} was indexed")
        records = []
        chunk_records(data, 0, header, first, header.num_records, records, entries)
        if len(self._decoded) >= DECODED_CHUNKS_MAX:
            del self._decoded[next(iter(self._decoded))]
        self._decoded[key] = records
        return records

    def chunk_run(self, offset: int) -> ChunkRun | None:
        """The records of the durable chunk holding `offset` in the version-1 record form
        (`chunk_runs`), for the C run path of AMQP consumers; None when `offset` is not in
        a version-2 segment's chunk, or the chunk has no run (damage, long filter
        values): the per-record path (`read`) then reads it. Kept for the last few chunks."""
        place = self.chunk_at(offset)
        if place is None or offset < place.first_offset:
            return None
        key = (place.base_offset, place.position)
        if key in self._runs:
            return self._runs[key]
        try:
            data = self.frame_at(place.base_offset, place.position, place.chunk_bytes)
            run = frame_run(data, place.first_offset, place.records)
        except ChunkInvalid:
            run = None  # damage: the decoded records' path finds it (and salvages)
        if run is None:
            segment = self._segments[bisect_right(self._bases, place.base_offset) - 1]
            end = place.first_offset + place.records
            try:
                records = self._decoded_chunk(segment, place.position, place.chunk_bytes,
                                              place.first_offset, end)  # fmt: skip
            except ChunkInvalid:
                return None  # `read` meets it again and records the damage
            run = chunk_run(records, place.first_offset, place.records)
        if len(self._runs) >= DECODED_CHUNKS_MAX:
            del self._runs[next(iter(self._runs))]
        self._runs[key] = run
        return run

    def chunk_at(self, offset: int) -> ChunkPlace | None:
        """Where the durable chunk holding `offset` is (or the first durable one after
        it in the same segment, past offsets lost to damage), when `offset` is in a
        version-2 segment; None when it is in a version-1 segment or past the durable
        end. Raises OffsetOutOfRange below the log's start."""
        self._check_usable()
        if offset < self.start_offset:
            raise OffsetOutOfRange(offset, self.start_offset)
        while offset < self._durable_next:
            segment = self._segments[bisect_right(self._bases, offset) - 1]
            index = segment.index
            if not isinstance(index, ChunkIndex):
                return None
            i = index.find(offset - segment.base_offset)
            if i >= len(index):
                if segment.next_offset <= offset:
                    return None
                offset = segment.next_offset  # lost at the segment's end: the next one
                continue
            first = segment.base_offset + index.relative_offsets[i]
            if first >= self._durable_next:
                return None
            return ChunkPlace(segment.base_offset, index.positions[i], first,
                              index.records[i], index.chunk_bytes[i], segment.path)  # fmt: skip
        return None

    def version_1_end(self, start: int) -> int:
        """The first offset at or after `start` in a version-2 segment, else the durable
        end: where the records of an upgraded stream's version-1 segments (its oldest)
        end."""
        i = max(bisect_right(self._bases, start) - 1, 0)
        for segment in self._segments[i:]:
            if segment.version == frame.FORMAT_VERSION:
                return min(max(segment.base_offset, start), self._durable_next)
        return self._durable_next

    def segment_version(self, base_offset: int) -> int:
        """The format version of the segment at `base_offset` (2: chunks)."""
        return self._segments[bisect_right(self._bases, base_offset) - 1].version

    def salvage_chunk(
        self,
        path: str,
        base: int,
        position: int,
        data: bytes | memoryview,
        header: chunk.ChunkHeader,
        reason: str,
    ) -> list[tuple[int, chunk.EntryView]]:
        """The intact entries of the frame `data` at `position` of the segment at `base`,
        whose entries fail their CRC32 (`frame.EntriesDamaged`); the lost ones are
        damage (`salvage`). ChunkInvalid when the chunk cannot be salvaged."""
        found = salvage(data, frame.FRAME_HEAD_BYTES, header)
        for span in damaged_spans(path, base, position, found.lost):
            self.damage.add(span, f"reading ({reason}; per-entry checksums)")
        return found.entries

    def chunk_damaged(self, place: ChunkPlace, reason: str) -> None:
        """The chunk at `place` fails its checks: its offsets are lost alone."""
        size = frame.FRAME_HEAD_BYTES + place.chunk_bytes
        span = DamagedSpan(place.path, place.base_offset, place.position, place.position + size,
                           place.first_offset, place.first_offset + place.records,
                           place.chunk_bytes)  # fmt: skip
        self.damage.add(span, f"reading ({reason})")

    def chunk_trailers(self, start: int) -> list[tuple[int, bytes]]:
        """(last offset, trailer) of every durable chunk from the one holding `start` on
        (version-2 segments only; damaged chunks are passed over): the publishers'
        sequences for `queues.publishers` at open."""
        out: list[tuple[int, bytes]] = []
        offset = max(start, self.start_offset)
        while (place := self.chunk_at(offset)) is not None:
            data = self.frame_at(place.base_offset, place.position, place.chunk_bytes)
            try:
                header = frame.check_trailer(data)  # the entries are not read here
                out.append((place.first_offset + place.records - 1,
                            chunk.trailer_of(data, frame.FRAME_HEAD_BYTES, header)))  # fmt: skip
            except ChunkInvalid as exc:
                self.chunk_damaged(place, str(exc))
            offset = place.first_offset + place.records
        return out

    def frame_view(self, base_offset: int, position: int, chunk_bytes: int) -> bytes | memoryview:
        """`frame_at` without a copy where it can: a view of a sealed segment's mapping
        (`view_at`), so that a stream consumer's chunk goes from the page cache to the
        socket with no copy through Python. Release the view promptly."""
        want = frame.FRAME_HEAD_BYTES + chunk_bytes
        data = self.view_at(base_offset, position, want)
        if len(data) == want:
            return data
        return self.frame_at(base_offset, position, chunk_bytes)

    def file_of(self, base_offset: int) -> int | None:
        """A read descriptor of the sealed segment at `base_offset` whose bytes are all
        in the file (none held back by a full disk or kept only in memory), for
        `os.sendfile`; None for any other segment. Valid until the log is next used."""
        segment = self._segments[bisect_right(self._bases, base_offset) - 1]
        if not segment.sealed or self._recent.holds(segment) or self._stalled.bytes:
            return None
        try:
            return self._read_fd(segment)
        except OSError:
            return None

    def frame_at(self, base_offset: int, position: int, chunk_bytes: int) -> bytes:
        """The frame of the `chunk_bytes` chunk at `position` of the version-2 segment at
        `base_offset` (its index says both), from memory or the file (`read_at`)."""
        want = frame.FRAME_HEAD_BYTES + chunk_bytes
        data = self.read_at(base_offset, position, want)
        while 0 < len(data) < want:
            more = self.read_at(base_offset, position + len(data), want - len(data))
            if not more:
                break
            data += more
        return data

    def resolve_damage(self, base_offset: int, position: int, offset: int) -> DamagedSpan:
        """The damaged span at `position` (a bad record that should hold `offset`) of the
        segment at `base_offset`: readers pass over it (`damage.resolve`). LogFailed for
        an I/O error."""
        segment = self._segments[bisect_right(self._bases, base_offset) - 1]
        try:
            fd = self._read_fd(segment)
            return resolve(self.damage, segment, fd, os.fstat(fd).st_size, position, offset)
        except OSError as exc:
            raise self._fail(exc) from exc

    def locate(self, offset: int) -> tuple[int, int, int]:
        """Where to read on from for the record at `offset`, durable or not: (the base
        offset of its segment, the position of a record at or before it there, from
        the sparse index, and that record's offset). Raises OffsetOutOfRange outside
        the log's records."""
        self._check_usable()
        if not self.start_offset <= offset < self._next_offset:
            raise OffsetOutOfRange(offset, self.start_offset)
        segment = self._segments[bisect_right(self._bases, offset) - 1]
        if isinstance(segment.index, ChunkIndex):
            # The chunk holding it (or the one after lost offsets); the open chunk's
            # offsets are not placed yet: the segment's end.
            i = segment.index.find(offset - segment.base_offset)
            if i >= len(segment.index):
                return segment.base_offset, segment.size_bytes, segment.next_offset
            rel, position = segment.index.relative_offsets[i], segment.index.positions[i]
            return segment.base_offset, position, segment.base_offset + rel
        rel, position = segment.index.floor_offset(offset - segment.base_offset)
        return segment.base_offset, position, segment.base_offset + rel

    def segment_after(self, base_offset: int) -> int | None:
        """The base offset of the segment after the one at `base_offset`, if any."""
        i = bisect_right(self._bases, base_offset)
        return self._bases[i] if i < len(self._bases) else None

    def read_at(self, base_offset: int, position: int, size: int) -> bytes:
        """Up to `size` bytes of the segment at `base_offset` from `position` (a record
        boundary) on, records appended but not yet durable included: from the buffers in
        memory when they hold them, else from the file. The result holds whole records
        and maybe a partial one at its end (read on from that record's position); it is
        empty at the segment's end. Records are not checked here: the reader checks
        each record's length and offset (the CRC is checked when `read` reads them).

        Raises OffsetOutOfRange for a segment that was dropped, ReadFailed for an I/O
        error (the log goes on)."""
        self._check_usable()
        i = bisect_right(self._bases, base_offset) - 1
        if i < 0 or self._bases[i] != base_offset:
            raise OffsetOutOfRange(base_offset, self.start_offset)
        segment = self._segments[i]
        end = segment.size_bytes
        if position >= end:
            return b""
        memory_from = end
        if segment is self._active:
            memory_from = end - len(self._buffer)
            if position >= memory_from:
                start = position - memory_from
                with memoryview(self._buffer) as view:  # a copy: the buffer grows
                    return bytes(view[start : start + size])
        data, start = self._recent.find(segment, position)
        if data is not None:
            with memoryview(data) as view:
                return bytes(view[position - start : position - start + size])
        if start >= 0:
            memory_from = min(memory_from, start)
        size = min(size, memory_from - position)
        try:
            return os.pread(self._read_fd(segment), size, position)
        except OSError as exc:  # EIO: this read fails, not the log
            raise ReadFailed(segment.path, position, exc) from exc

    def view_at(self, base_offset: int, position: int, size: int) -> bytes | memoryview:
        """`read_at` without a copy where it can: the bytes of a sealed segment (complete,
        durable, never written again) are a view of the file's mapping, so that building
        a stream-protocol chunk does not first copy them out of the page cache. The view
        keeps its mapping alive; release it promptly. Other segments: `read_at`."""
        self._check_usable()
        i = bisect_right(self._bases, base_offset) - 1
        if i < 0 or self._bases[i] != base_offset:
            raise OffsetOutOfRange(base_offset, self.start_offset)
        segment = self._segments[i]
        if not segment.sealed or self._recent.holds(segment):
            return self.read_at(base_offset, position, size)
        end = min(position + size, segment.size_bytes)
        if position >= end:
            return b""
        mapping = self._maps.get(base_offset)
        if mapping is None:
            try:
                mapping = mmap.mmap(self._read_fd(segment), segment.size_bytes, prot=mmap.PROT_READ)
            except OSError as exc:
                raise self._fail(exc) from exc
            if len(self._maps) >= self.config.read_fds_max:
                # Not closed: a view still held keeps its mapping until it is released.
                del self._maps[next(iter(self._maps))]
            self._maps[base_offset] = mapping
        return memoryview(mapping)[position:end]

    def read_record(self, offset: int) -> fmt.Record:
        """The record at `offset`, durable or not, its CRC checked (and those read on the
        way from the index entry before it, in C): `segment.find_record`. Raises
        OffsetOutOfRange, RecordDamaged (lost to bit rot), SegmentCorrupted, LogFailed."""
        base, position, first_offset = self.locate(offset)
        if (lost := self.damage.covering(offset)) is not None:
            raise lost.error()
        segment = self._segments[bisect_right(self._bases, base) - 1]
        if segment.version == frame.FORMAT_VERSION:
            out: list[fmt.Record] = []
            found = self._read_chunks(segment, offset, self._next_offset, 1, out)
            if out and out[0].offset == offset:
                return out[0]
            lost = self.damage.covering(offset)
            if lost is not None:
                raise lost.error()
            raise OffsetOutOfRange(found, self.start_offset)
        path = self._segments[bisect_right(self._bases, base) - 1].path
        read, resolve = partial(self.read_at, base), partial(self.resolve_damage, base)
        # The index entry is at most an interval before it: read about that much.
        size = self.config.index_interval_bytes + 1024
        return find_record(read, resolve, path, position, first_offset, offset, size)

    def seek_timestamp(self, timestamp_ms: int) -> int:
        """The first durable offset whose timestamp is `timestamp_ms` or later, or
        `durable_next` if there is none. O(log segments + one index interval).
        """
        self._check_usable()
        i = bisect_right(self._segments, timestamp_ms - 1, key=_last_timestamp_key)
        if i == len(self._segments):
            return self._durable_next
        segment = self._segments[i]
        if segment.record_count == 0:
            return self._durable_next
        if isinstance(segment.index, ChunkIndex):  # every record has its chunk's time
            j = segment.index.first_at_or_after(timestamp_ms)
            if j >= len(segment.index):
                return self._durable_next
            return min(segment.base_offset + segment.index.relative_offsets[j], self._durable_next)
        rel, _position = segment.index.floor_timestamp(timestamp_ms)
        offset = segment.base_offset + rel
        while offset < self._durable_next:
            batch = self.read(offset, 64)
            for record in batch:
                if record.timestamp_ms >= timestamp_ms:
                    return record.offset
            if not batch:
                break
            offset = batch[-1].offset + 1
        return self._durable_next

    def _read_fd(self, segment: Segment) -> int:
        fd = self._read_fds.get(segment.base_offset)
        if fd is None:
            if len(self._read_fds) >= self.config.read_fds_max:
                oldest = next(iter(self._read_fds))
                os.close(self._read_fds.pop(oldest))
            fd = os.open(segment.path, os.O_RDONLY)
            # Segments are written past the page cache (see `writer`), so reads come from
            # the disk: readers go forward, and a larger readahead keeps them ahead of it.
            if hasattr(os, "posix_fadvise"):  # not on macOS
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            self._read_fds[segment.base_offset] = fd
        return fd


def _record_offset(record: fmt.Record) -> int:
    return record.offset


def _last_timestamp_key(segment: Segment) -> int:
    # Only the active segment can be empty; it sorts last, after every timestamp.
    return segment.last_timestamp_ms if segment.record_count else (1 << 63) - 1
