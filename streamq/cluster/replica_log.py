"""One stream's log as a follower reads it from its copy: `ReplicaLog`.

Owns the read-only view of a stream directory that replication writes into, with the
subset of `SegmentLog`'s read interface that `streamq.queues.chunks.read_chunk` uses
(`start_offset`, `durable_next`, `locate`, `view_at`, `segment_after`,
`resolve_damage`), so that a follower builds the same chunks as the leader, and the
offset specifications' starting points (`start_at`). It never writes a file.

What it serves ends at `durable_next`, the committed end: the `durable` marker's value
as read when the follower had received no more stream bytes than the leader has since
declared committed (`ReplicaProgress`). The leader writes the marker after the fsync of
the records below it and records that write in its tap; a COMMITTED position at or past
the bytes the follower had received when it read the marker covers that write, so every
in-sync replica has those records and the leader confirmed them: a failover never takes
back what a follower served. Each refresh remembers (bytes received, marker value), at
most CANDIDATES_MAX of them, until a COMMITTED position covers it.

Locating an offset uses the segment's index file when it has one (sealed segments), and
otherwise the record starts it saw at each read (`view_at` reads at record starts): a
reader that goes forward finds its next record within one read.

Version-2 segments (stored chunks, docs/log-format.md) are read as the leader reads them:
`chunk_at` places an offset's chunk (`replica_chunks.ChunkPlaces`), and
`stored_chunks.read_stored_chunk` sends its stored bytes, so a follower's chunks are the
leader's, byte for byte.
"""

from __future__ import annotations

import contextlib
import os
from bisect import bisect_right, insort
from collections import deque
from typing import Final

from streamq.cluster.replica_chunks import ChunkPlaces
from streamq.cluster.replica_progress import ReplicaProgress
from streamq.log import format as fmt
from streamq.log import frame
from streamq.log.chunk import ChunkHeader, EntryView
from streamq.log.damage import DamagedSpan
from streamq.log.errors import OffsetOutOfRange, ReadFailed
from streamq.log.reader import ChunkPlace

CANDIDATES_MAX: Final = 1024  # marker values waiting for a COMMITTED position
POINTS_MAX: Final = 4096  # record starts remembered per segment
FDS_MAX: Final = 16  # open segment files per stream
SCAN_BYTES: Final = 1 << 20  # one read of a timestamp scan
_OFFSET_AT: Final = 8  # a record header's offset field (format.RECORD_HEADER)


class ReplicaLog:
    """A stream directory of a follower's copy, read up to the committed end."""

    def __init__(self, directory: str, progress: ReplicaProgress) -> None:
        self.directory = directory
        self.progress = progress
        self.end = 0  # the committed end: readers see offsets below it
        self.known = False  # whether `end` was ever set from a committed marker
        self._epoch = -1
        self._candidates: deque[tuple[int, int]] = deque()  # (received, marker value)
        self._bases: list[int] = []
        self._points: dict[int, list[tuple[int, int]]] = {}  # base: [(offset, position)]
        self._places: dict[int, ChunkPlaces] = {}  # base: chunks of a version-2 segment
        self._versions: dict[int, int] = {}  # base: segment format version
        self._fds: dict[int, int] = {}

    # -- what may be read ------------------------------------------------------------------

    def refresh(self, *, relist: bool = False) -> bool:
        """Look at the marker (and the segments, when `end` moved or `relist`) again;
        True when `end` moved. Nothing moves while the copy is not readable (a full
        sync)."""
        progress = self.progress
        if relist:
            self._list_segments()
        if not progress.readable:
            return False
        if progress.epoch != self._epoch:
            self._epoch = progress.epoch
            self._candidates.clear()  # positions of an earlier connection
        received = progress.received  # read before the marker: see the module docstring
        value = self._read_marker()
        last = self._candidates[-1][1] if self._candidates else self.end
        if value is not None and (value > last or not (self.known or self._candidates)):
            if len(self._candidates) >= CANDIDATES_MAX:
                self._candidates.popleft()  # the older ones are covered before it anyway
            self._candidates.append((received, value))
        moved = False
        while self._candidates and self._candidates[0][0] <= progress.committed:
            _received, committed = self._candidates.popleft()
            self.known = True
            if committed > self.end:
                self.end, moved = committed, True
        if moved or not self._bases:
            self._list_segments()
        return moved

    def _read_marker(self) -> int | None:
        try:
            with open(os.path.join(self.directory, fmt.DURABLE_FILE), "rb") as file:
                return fmt.decode_durable(file.read(fmt.DURABLE_RECORD.size + 1))
        except FileNotFoundError:
            return None

    def _list_segments(self) -> None:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            names = []
        bases = sorted(b for b in map(fmt.parse_segment_name, names) if b is not None)
        for gone in set(self._points) - set(bases):
            del self._points[gone]
        for gone in set(self._places) - set(bases):
            del self._places[gone]
        for gone in set(self._versions) - set(bases):
            del self._versions[gone]
        for gone in set(self._fds) - set(bases):
            os.close(self._fds.pop(gone))
        self._bases = bases

    def exists(self) -> bool:
        return os.path.isdir(self.directory)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    # -- SegmentLog's read interface, as read_chunk uses it ------------------------------

    @property
    def start_offset(self) -> int:
        return self._bases[0] if self._bases else self.end

    @property
    def durable_next(self) -> int:
        return self.end

    def locate(self, offset: int) -> tuple[int, int, int]:
        """(segment base, position of a record at or before `offset`, its offset)."""
        if not self._bases or offset < self._bases[0]:
            raise OffsetOutOfRange(offset, self.start_offset)
        base = self._bases[bisect_right(self._bases, offset) - 1]
        points = self._segment_points(base)
        i = bisect_right(points, (offset, 1 << 64)) - 1
        at, position = points[max(i, 0)]
        return base, position, at

    def segment_after(self, base_offset: int) -> int | None:
        i = bisect_right(self._bases, base_offset)
        return self._bases[i] if i < len(self._bases) else None

    def view_at(self, base_offset: int, position: int, size: int) -> bytes:
        """Up to `size` bytes of the segment from `position` (a record start); remembers
        where that record is, for the next `locate`."""
        try:
            data = os.pread(self._fd(base_offset), size, position)
        except OSError as exc:
            raise ReadFailed(fmt.segment_name(base_offset), position, exc) from exc
        if len(data) >= _OFFSET_AT + 8:
            offset = int.from_bytes(data[_OFFSET_AT : _OFFSET_AT + 8], "little")
            self._remember(base_offset, offset, position)
        return data

    def resolve_damage(self, base_offset: int, position: int, offset: int) -> DamagedSpan:
        """A follower does not resolve damage (the leader's scrub does): the read fails."""
        raise ReadFailed(
            fmt.segment_name(base_offset), position, OSError(f"damaged record at {offset}")
        )

    # -- stored chunks (version-2 segments), as stored_chunks.read_stored_chunk reads them --

    def chunk_at(self, offset: int) -> ChunkPlace | None:
        """Where the committed chunk holding `offset` is (or the first one after it in the
        same segment) when `offset` is in a version-2 segment; None in a version-1
        segment or at the committed end (`SegmentLog.chunk_at`)."""
        if not self._bases or offset < self._bases[0]:
            raise OffsetOutOfRange(offset, self.start_offset)
        while offset < self.end:
            base = self._bases[bisect_right(self._bases, offset) - 1]
            if self._version(base) != frame.FORMAT_VERSION:
                return None
            places = self._chunk_places(base)
            i = places.find(offset)
            if i >= len(places):
                following = self.segment_after(base)
                if following is None or following >= self.end:
                    return None
                offset = following  # the segment's chunks end before it: the next one
                continue
            first = places.firsts[i]
            if first >= self.end:
                return None
            return ChunkPlace(base, places.positions[i], first, places.records[i],
                              places.chunk_bytes[i], places.path)  # fmt: skip
        return None

    def frame_view(self, base_offset: int, position: int, chunk_bytes: int) -> bytes:
        """The frame of the chunk at `position` (`chunk_at` placed it)."""
        try:
            return os.pread(self._fd(base_offset), frame.FRAME_HEAD_BYTES + chunk_bytes, position)
        except OSError as exc:
            raise ReadFailed(fmt.segment_name(base_offset), position, exc) from exc

    def chunk_damaged(self, place: ChunkPlace, reason: str) -> None:
        """A follower does not resolve damage (the leader's scrub does): the read fails."""
        raise ReadFailed(place.path, place.position, OSError(f"damaged chunk: {reason}"))

    def salvage_chunk(
        self,
        path: str,
        base: int,
        position: int,
        data: bytes | memoryview,
        header: ChunkHeader,
        reason: str,
    ) -> list[tuple[int, EntryView]]:
        """A follower does not resolve damage (the leader's scrub does): the read fails."""
        raise ReadFailed(path, position, OSError(f"damaged entries: {reason}"))

    def file_of(self, base_offset: int) -> int | None:
        """No `sendfile` from a follower's copy: its chunks go by a copy."""
        return None

    def _version(self, base: int) -> int:
        version = self._versions.get(base)
        if version is None:
            path = os.path.join(self.directory, fmt.segment_name(base))
            try:
                head = os.pread(self._fd(base), fmt.SEGMENT_HEADER_BYTES, 0)
            except OSError as exc:
                raise ReadFailed(path, 0, exc) from exc
            fmt.decode_segment_header(head, path)  # SegmentCorrupted when short or bad
            version = self._versions[base] = fmt.decode_segment_version(head)
        return version

    def _chunk_places(self, base: int) -> ChunkPlaces:
        """The chunks of the version-2 segment at `base` known up to the committed end."""
        places = self._places.get(base)
        if places is None:
            path = os.path.join(self.directory, fmt.segment_name(base))
            places = self._places[base] = ChunkPlaces(base, path)
            index_path = os.path.join(self.directory, fmt.index_name(base))
            with contextlib.suppress(FileNotFoundError), open(index_path, "rb") as file:
                places.load_index(file.read(), os.fstat(self._fd(base)).st_size)
        places.walk(self._fd(base), self.end)
        return places

    # -- offset specifications -------------------------------------------------------------

    def first_at_or_after(self, timestamp_ms: int) -> int:
        """The first committed offset appended at or after `timestamp_ms`, else `end`."""
        for i, base in enumerate(self._bases):
            end = min(self._bases[i + 1] if i + 1 < len(self._bases) else self.end, self.end)
            if end > base:
                found = self._scan_timestamp(base, end, timestamp_ms)
                if found is not None:
                    return found
        return self.end

    def _scan_timestamp(self, base: int, end: int, timestamp_ms: int) -> int | None:
        if self._version(base) == frame.FORMAT_VERSION:  # every record has its chunk's time
            places = self._chunk_places(base)
            i = places.first_at_or_after(timestamp_ms)
            return places.firsts[i] if i < len(places) and places.firsts[i] < end else None
        position, offset, size = fmt.SEGMENT_HEADER_BYTES, base, SCAN_BYTES
        path = os.path.join(self.directory, fmt.segment_name(base))
        while offset < end:
            data = self.view_at(base, position, size)
            records: list[fmt.Record] = []
            result = fmt.decode_records(data, position, 0, offset, end, records, 1 << 20, path)
            for record in records:
                if record.timestamp_ms >= timestamp_ms:
                    return record.offset
            if not records:
                if len(data) < size:
                    return None  # the segment's end
                size *= 2  # one record larger than the read
                continue
            position += result.position
            offset = result.next_offset
        return None

    # -- internals ---------------------------------------------------------------------

    def _segment_points(self, base: int) -> list[tuple[int, int]]:
        points = self._points.get(base)
        if points is None:
            points = [(base, fmt.SEGMENT_HEADER_BYTES)]
            index = self._read_index(base)
            if index is not None:
                points += [(base + rel, position) for rel, position, _ts in index.entries]
                points.sort()
            self._points[base] = points
        return points

    def _read_index(self, base: int) -> fmt.IndexFile | None:
        path = os.path.join(self.directory, fmt.index_name(base))
        try:
            with open(path, "rb") as file:
                index = fmt.decode_index(file.read(), path)
            size = os.path.getsize(os.path.join(self.directory, fmt.segment_name(base)))
        except FileNotFoundError:
            return None
        return index if index is not None and index.segment_bytes == size else None

    def _remember(self, base: int, offset: int, position: int) -> None:
        if not base <= offset < self.end:
            return  # not a committed record's start: never a point to read from
        points = self._segment_points(base)
        i = bisect_right(points, (offset, 1 << 64))
        if i and points[i - 1][0] == offset:
            return
        if (i and points[i - 1][1] >= position) or (i < len(points) and points[i][1] <= position):
            return  # out of order with what is known: not a record start
        insort(points, (offset, position))
        if len(points) > POINTS_MAX:
            del points[1::2]  # thin out, keeping the segment's first record

    def _fd(self, base: int) -> int:
        fd = self._fds.get(base)
        if fd is None:
            if len(self._fds) >= FDS_MAX:
                os.close(self._fds.pop(next(iter(self._fds))))
            try:
                fd = os.open(os.path.join(self.directory, fmt.segment_name(base)), os.O_RDONLY)
            except FileNotFoundError:
                with contextlib.suppress(ValueError):
                    self._bases.remove(base)  # retention removed it
                raise OffsetOutOfRange(base, self.start_offset) from None
            self._fds[base] = fd
        return fd
