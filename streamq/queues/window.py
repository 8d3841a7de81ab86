"""A queue's place in its vhost's segment log, for reading its messages back.

Owns a chunk of segment bytes read ahead (at most `READ_CHUNK_BYTES`; released when the
queue has nothing to deliver) and the offset and position of the next record in it. A
classic queue's offsets come in runs of consecutive log offsets, which are consecutive
records: reading on in the window finds them without a lookup. A target far ahead, or
behind, is found with the segment's sparse index (`SegmentLog.locate`).

It reads only through `SegmentLog.read_at`, which serves recent records from memory and
older ones from the file, and checks every record it reads (length, CRC32C, offset, in
one C call per chunk) before the consumer's framing sees it.
"""

from __future__ import annotations

import os
from typing import Final

from streamq.log import format as fmt
from streamq.log._records import check_records
from streamq.log.errors import SegmentCorrupted
from streamq.log.log import SegmentLog

READ_CHUNK_BYTES: Final = 128 * 1024
# A window more than this many offsets behind the next one to read seeks with the
# segment index rather than reading the records in between.
RELOCATE_RECORDS: Final = 2048


class ReadWindow:
    """A queue's place in its vhost's log: bytes read ahead, from a record boundary."""

    __slots__ = ("base", "data", "file_position", "offset", "position")

    def __init__(self) -> None:
        self.base = -1  # the segment's base offset; -1: nothing read
        self.file_position = 0  # where data[0] is in that segment
        self.data: bytes | bytearray | memoryview = b""
        self.position = 0  # the next record in data
        self.offset = -1  # that record's offset

    def release(self) -> None:
        self.base = -1
        self.data = b""

    def records(self, log: SegmentLog, target: int) -> tuple[bytes | bytearray | memoryview, int]:
        """Bytes holding whole records from one at or before `target` on, and where in
        them the first such record starts."""
        if (
            self.base < 0
            or self.offset < 0
            or target < self.offset
            or target - self.offset > RELOCATE_RECORDS
        ):
            base, position, offset = log.locate(target)
            self._load(log, base, position, offset)
        elif self.position >= len(self.data):
            self._load(log, self.base, self.file_position + self.position, self.offset)
        return self.data, self.position

    def read_on(self, log: SegmentLog) -> bool:
        """Read again from the first record not used (the bytes ended inside it, or
        before the next one); False when that brings nothing new."""
        left = len(self.data) - self.position
        base = self.base
        self._load(log, base, self.file_position + self.position, self.offset)
        return self.base != base or len(self.data) > left

    def _load(self, log: SegmentLog, base: int, position: int, offset: int) -> None:
        """Read from `position` of segment `base`, where the record `offset` starts, and
        check the whole records read (length, CRC, offset sequence): the window ends
        before a damaged one, which raises SegmentCorrupted once it is the next."""
        data = log.read_at(base, position, READ_CHUNK_BYTES)
        if not data:  # the end of that segment: the next one starts after its header
            following = log.segment_after(base)
            if following is not None:
                base, position, offset = following, fmt.SEGMENT_HEADER_BYTES, following
                data = log.read_at(base, position, READ_CHUNK_BYTES)
        elif len(data) >= 4:
            need = 4 + int.from_bytes(data[:4], "little")
            if need > len(data):  # a record larger than a chunk
                data = log.read_at(base, position, need)
        end, _, error = check_records(data, 0, offset)
        if error is not None:
            if end == 0:
                path = os.path.join(log.directory, fmt.segment_name(base))
                raise SegmentCorrupted(path, position, f"{error} (offset {offset})")
            data = data[:end]
        self.base, self.file_position, self.data, self.position = base, position, data, 0
        self.offset = offset

    def advance(self, position: int, next_offset: int) -> None:
        self.position = position
        if next_offset >= 0:
            self.offset = next_offset
