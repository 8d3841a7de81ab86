"""Where the stored chunks of a follower's version-2 segments are: `ChunkPlaces`.

Owns the follower's view of one format-version-2 segment (docs/log-format.md, "Format
version 2") of its copy: the chunks known so far, each one's frame position, first
offset, record count, size and timestamp. A sealed segment's `.idx` gives them all at
once (when it is whole and matches the segment's size); otherwise, as for the active
segment, they are found by walking the frames' headers from the last one known (one
`pread` of a frame head and chunk header per chunk), so that a reader going forward
reads each header once.

A walk stops, without error, at a frame that the copy does not hold whole yet (the
replication stream is still bringing it). A header that does not follow its
predecessor (its first offset is not the previous one's next) is damage: a follower
does not resolve damage (the leader's scrub does), the read fails (ReadFailed).

It reads only; `ReplicaLog` keeps one per version-2 segment and the descriptors.
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_left, bisect_right
from typing import Final

from streamq.log import chunk, frame
from streamq.log import format as fmt
from streamq.log.chunk import ChunkInvalid
from streamq.log.errors import ReadFailed

WALK_CHUNKS_MAX: Final = 65536  # headers read by one walk (the caller walks again)


class ChunkPlaces:
    """The chunks of one version-2 segment of a follower's copy, as known so far."""

    __slots__ = ("base_offset", "chunk_bytes", "firsts", "path", "positions", "records",
                 "timestamps", "walked_to")  # fmt: skip

    def __init__(self, base_offset: int, path: str) -> None:
        self.base_offset = base_offset
        self.path = path
        self.firsts = array("Q")
        self.positions = array("Q")
        self.records = array("I")
        self.chunk_bytes = array("I")
        self.timestamps = array("q")
        self.walked_to = fmt.SEGMENT_HEADER_BYTES  # the position after the last chunk known

    def __len__(self) -> int:
        return len(self.firsts)

    @property
    def next_offset(self) -> int:
        """The offset after the last chunk known (the base offset when none is)."""
        return self.firsts[-1] + self.records[-1] if self.firsts else self.base_offset

    def find(self, offset: int) -> int:
        """The number of the chunk holding `offset`, or of the first known after it."""
        i = bisect_right(self.firsts, offset) - 1
        if i < 0:
            return 0
        return i if offset < self.firsts[i] + self.records[i] else i + 1

    def first_at_or_after(self, timestamp_ms: int) -> int:
        """The number of the first known chunk whose timestamp is `timestamp_ms` or later."""
        return bisect_left(self.timestamps, timestamp_ms)

    def load_index(self, data: bytes, segment_bytes: int) -> bool:
        """Take every chunk from a sealed segment's index file `data` when it is a whole
        version-2 index of a segment of `segment_bytes`; False (nothing taken) otherwise."""
        if not fmt.index_intact(data, self.path) or fmt.index_version(data) != frame.FORMAT_VERSION:
            return False
        if fmt.INDEX_HEADER.unpack_from(data, 0)[5] != segment_bytes:
            return False  # an index of an earlier state of the segment
        try:
            entries = frame.decode_index_entries(memoryview(data)[fmt.INDEX_HEADER_BYTES :])
        except ChunkInvalid:
            return False
        for entry in entries:
            self._add(self.base_offset + entry.relative_offset, entry.position, entry.records,
                      entry.chunk_bytes, entry.timestamp_ms)  # fmt: skip
        self.walked_to = segment_bytes
        return True

    def walk(self, fd: int, end_offset: int) -> None:
        """Read the headers of the chunks after the last known one, while they start
        below `end_offset` and the file holds them whole."""
        size = os.fstat(fd).st_size
        position = self.walked_to
        for _ in range(WALK_CHUNKS_MAX):
            if self.next_offset >= end_offset or size - position < frame.FRAME_OVERHEAD:
                return
            try:
                head = os.pread(fd, frame.FRAME_OVERHEAD, position)
                header = chunk.decode_header(head, frame.FRAME_HEAD_BYTES)
            except (OSError, ChunkInvalid) as exc:
                raise ReadFailed(self.path, position, OSError(f"chunk header: {exc}")) from exc
            if header.first_offset != self.next_offset:
                reason = f"chunk {header.first_offset} where {self.next_offset} follows"
                raise ReadFailed(self.path, position, OSError(reason))
            if size - position < frame.FRAME_HEAD_BYTES + header.size:
                return  # not all here yet
            self._add(header.first_offset, position, header.num_records, header.size,
                      header.timestamp_ms)  # fmt: skip
            position += frame.FRAME_HEAD_BYTES + header.size
            self.walked_to = position

    def _add(self, first: int, position: int, records: int, size: int, timestamp_ms: int) -> None:
        self.firsts.append(first)
        self.positions.append(position)
        self.records.append(records)
        self.chunk_bytes.append(size)
        self.timestamps.append(timestamp_ms)
