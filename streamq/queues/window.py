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
_HEADER = fmt.RECORD_HEADER.unpack_from
_new = tuple.__new__


class ReadWindow:
    """A queue's place in its vhost's log: bytes read ahead, from a record boundary."""

    __slots__ = ("base", "data", "file_position", "offset", "position")

    def __init__(self) -> None:
        self.base = -1  # the segment's base offset; -1: nothing read
        self.file_position = 0  # where data[0] is in that segment
        self.data = b""
        self.position = 0  # the next record in data
        self.offset = -1  # that record's offset

    def release(self) -> None:
        self.base = -1
        self.data = b""

    def records(self, log: SegmentLog, target: int) -> tuple[bytes, int]:
        """Bytes holding whole records from one at or before `target` on, and where in
        them the first such record starts. Raises RecordDamaged when `target` was lost
        to damage (the window then stands after it)."""
        if log.damage.spans and log.damage.covering(target) is not None:
            raise _lost(log, target)  # known lost: looking would find the damage again
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
        if self.offset > target:  # passed over: `target` was in a damaged span
            raise _lost(log, target)
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
        before a damaged one. A damaged record next is passed over with its span
        (`SegmentLog.resolve_damage`), so the window may start past `offset`."""
        while True:
            data = log.read_at(base, position, READ_CHUNK_BYTES)
            bad = False
            if not data:  # the end of that segment: the next one starts after its header
                following = log.segment_after(base)
                if following is not None:
                    base, position, offset = following, fmt.SEGMENT_HEADER_BYTES, following
                    data = log.read_at(base, position, READ_CHUNK_BYTES)
            elif len(data) >= 4:
                need = 4 + int.from_bytes(data[:4], "little")
                if need > len(data):  # a record larger than a chunk
                    data = log.read_at(base, position, need)
                    bad = need > len(data)  # longer than the segment: a damaged length
            end, _, error = check_records(data, 0, offset)
            if end == 0 and (bad or error is not None):
                span = log.resolve_damage(base, position, offset)
                position, offset = span.end_position, span.end_offset
                continue
            if error is not None:
                data = data[:end]
            break
        self.base, self.file_position, self.data, self.position = base, position, data, 0
        self.offset = offset

    def record(self, log: SegmentLog, target: int) -> fmt.Record:
        """The record at offset `target`, read through the window (sequential reads, say
        the expired head of a queue, cost a chunk read per 128 KiB, not one each).
        Raises RecordDamaged (lost to damage), SegmentCorrupted (missing) and what
        `SegmentLog.read_at` raises."""
        if self.offset == target and self.base >= 0:
            # Hot path (a queue's head read in order): the record is next in the window,
            # checked when the chunk was read; its fields are sliced out, no CRC again.
            data, position = self.data, self.position
            if position + fmt.RECORD_HEADER_BYTES <= len(data):
                length, _, offset, timestamp_ms, lex, lrk, _, lprops = _HEADER(data, position)
                end = position + 4 + length
                if end <= len(data) and offset == target:
                    a = position + fmt.RECORD_HEADER_BYTES
                    b = a + lex
                    c = b + lrk
                    d = c + lprops
                    self.position, self.offset = end, target + 1
                    fields = (target, timestamp_ms, data[a:b], data[b:c], data[c:d], data[d:end])
                    return _new(fmt.Record, fields)
        while True:
            data, position = self.records(log, target)
            offset = self.offset
            end = len(data)
            while position + 4 <= end:  # pass over the records before it
                size = 4 + int.from_bytes(data[position : position + 4], "little")
                if position + size > end or offset == target:
                    break
                position += size
                offset += 1
            self.advance(position, offset)
            if offset == target and position + 4 <= end:
                out: list[fmt.Record] = []
                path = os.path.join(log.directory, fmt.segment_name(self.base))
                result = fmt.decode_records(
                    data, self.file_position, position, target, target + 1, out, 1, path
                )
                if out:
                    self.advance(result.position, target + 1)
                    return out[0]
            if not self.read_on(log):
                path = os.path.join(log.directory, fmt.segment_name(self.base))
                raise SegmentCorrupted(path, self.file_position, f"record {target} is missing")

    def advance(self, position: int, next_offset: int) -> None:
        self.position = position
        if next_offset >= 0:
            self.offset = next_offset


def _lost(log: SegmentLog, offset: int) -> SegmentCorrupted:
    """The error for a record the window passed over: RecordDamaged with its span."""
    span = log.damage.covering(offset)
    if span is not None:
        return span.error()
    path = os.path.join(log.directory, "(log)")
    return SegmentCorrupted(path, 0, f"record {offset} is missing")
