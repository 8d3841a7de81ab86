"""Damaged records of one log: where valid records resume after bad bytes, and the spans lost.

Owns the rule that tells damage from a torn tail (docs/durability.md, "Bit rot"): bad
bytes followed by a valid record are damage, and only the records in between are lost;
bad bytes with nothing valid after them are a torn tail, which recovery cuts. It finds
the next valid record (`find_resync`) and remembers every damaged span of the log
(`DamageMap`), so that readers step over a span instead of failing, and so that the
broker can report what was lost. It never changes a segment's bytes: the damage stays on
disk for inspection, and is found again (the same way) after a restart.

How the next record is found: from the first bad byte on, every position is tried as the
start of a record (one C call per chunk, `_records.resync_records`). A candidate must
have a plausible length and fields, end within the file, carry an offset after the last
good one but no further than the bytes passed over allow (a record is at least 32 bytes),
a timestamp not below the last good one, and a CRC32C that matches. Random bytes pass all
of that with a probability of about 2**-32 per position that already has an offset in
range, which payload bytes almost never have. The search is bounded by the segment's size
and reads `RESYNC_CHUNK_BYTES` at a time.

No I/O beyond `os.pread` on a descriptor the caller owns (or the positional read the
caller passes to `find_resync_with`); no asyncio.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, NamedTuple

from streamq.log import format as fmt
from streamq.log._records import resync_records
from streamq.log.errors import RecordDamaged

if TYPE_CHECKING:  # segment imports this module
    from streamq.log.segment import Segment

logger = logging.getLogger(__name__)

RESYNC_CHUNK_BYTES: Final = 1 << 20  # bytes read per step of the search for the next record
_RECORD_BYTES_MIN: Final = fmt.RECORD_HEADER_BYTES  # a record lost takes this much at least


class DamagedSpan(NamedTuple):
    """Bytes of a segment that hold no valid record, and the offsets lost with them."""

    path: str  # the segment file
    base_offset: int  # the segment's
    position: int  # where the first bad record starts
    end_position: int  # where the next valid record starts (or the segment's end)
    first_offset: int  # the first offset lost
    end_offset: int  # the offset of the next valid record: [first_offset, end_offset) lost
    body_bytes: int  # the lost bodies' size, as well as the bad bytes tell it

    @property
    def records(self) -> int:
        """How many offsets were lost."""
        return self.end_offset - self.first_offset

    def error(self) -> RecordDamaged:
        return RecordDamaged(
            self.path, self.position, self.first_offset, self.end_offset, self.body_bytes
        )


def find_resync(
    fd: int, position: int, file_bytes: int, expected_offset: int, last_timestamp_ms: int
) -> tuple[int, int] | None:
    """The (position, offset) of the first valid record after the bad record at `position`
    (which should have held `expected_offset`) in the segment open at `fd`, whose size is
    `file_bytes`; None when nothing valid follows (a torn tail).

    Reads at most the rest of the file, `RESYNC_CHUNK_BYTES` at a time. Raises OSError."""
    return find_resync_with(
        lambda length, at: os.pread(fd, length, at),
        position,
        file_bytes,
        expected_offset,
        last_timestamp_ms,
    )


def find_resync_with(
    pread: Callable[[int, int], bytes],
    position: int,
    file_bytes: int,
    expected_offset: int,
    last_timestamp_ms: int,
) -> tuple[int, int] | None:
    """`find_resync` over any positional read, `pread(length, position)` (the Spark
    source reads segments through its own stores, local or remote)."""
    start = position + 1
    chunk_at = start
    while chunk_at + fmt.RECORD_HEADER_BYTES <= file_bytes:
        data = pread(min(RESYNC_CHUNK_BYTES, file_bytes - chunk_at), chunk_at)
        if len(data) < fmt.RECORD_HEADER_BYTES:
            return None  # the file shrank under us
        bound = expected_offset + 1 + (chunk_at - start) // _RECORD_BYTES_MIN
        found = resync_records(
            data, 0, file_bytes - chunk_at, expected_offset + 1, bound, last_timestamp_ms
        )
        if found is None:
            # The last 31 bytes could start a record: the next chunk begins with them.
            chunk_at += len(data) - fmt.RECORD_HEADER_BYTES + 1
            continue
        at, offset, complete = found
        if complete:
            return chunk_at + at, offset
        # A candidate larger than the chunk: read it whole and check it.
        record = pread(4 + int.from_bytes(data[at : at + 4], "little"), chunk_at + at)
        checked = fmt.check_record(record, 0)
        if checked is not None and checked[0] == offset:
            return chunk_at + at, offset
        chunk_at += at + 1
    return None


def lost_body_bytes(header: bytes, span_bytes: int, count: int) -> int:
    """The lost bodies' size: exact when one record is lost and its header's lengths
    agree with the span; otherwise the span less a record header per record."""
    if count == 1 and len(header) >= fmt.RECORD_HEADER_BYTES:
        length, _, _, _, lex, lrk, _, lprops = fmt.RECORD_HEADER.unpack_from(header, 0)
        body = length - fmt.RECORD_LENGTH_MIN - lex - lrk - lprops
        if 4 + length == span_bytes and body >= 0:
            return int(body)
    return max(0, span_bytes - count * fmt.RECORD_HEADER_BYTES)


class DamageMap:
    """The damaged spans found in one log since it was opened, by segment and by offset.

    `records` counts the offsets lost (it stays when retention drops their segment, so
    that a report never goes back)."""

    __slots__ = ("_starts", "records", "spans")

    def __init__(self) -> None:
        self.spans: list[DamagedSpan] = []  # in offset order
        self._starts: list[int] = []  # each span's first_offset, for bisect
        self.records = 0

    def __len__(self) -> int:
        return len(self.spans)

    def add(self, span: DamagedSpan, found_by: str) -> bool:
        """Remember a span and log it; False if it was known already."""
        if self.at(span.base_offset, span.position) is not None:
            return False
        i = bisect_right(self._starts, span.first_offset)
        self._starts.insert(i, span.first_offset)
        self.spans.insert(i, span)
        self.records += span.records
        logger.error(
            "damaged records in %s at position %d (to %d): offsets %d to %d lost "
            "(%d record%s, found %s); the records after them are kept",
            span.path,
            span.position,
            span.end_position,
            span.first_offset,
            span.end_offset - 1,
            span.records,
            "" if span.records == 1 else "s",
            found_by,
        )
        return True

    def at(self, base_offset: int, position: int) -> DamagedSpan | None:
        """The span of segment `base_offset` that starts at `position`, if any."""
        for span in self.spans:
            if span.base_offset == base_offset and span.position == position:
                return span
        return None

    def covering(self, offset: int) -> DamagedSpan | None:
        """The span that lost `offset`, if any. O(log spans)."""
        i = bisect_right(self._starts, offset) - 1
        if i >= 0 and offset < self.spans[i].end_offset:
            return self.spans[i]
        return None


def span_at(
    path: str,
    base_offset: int,
    fd: int,
    position: int,
    offset: int,
    file_bytes: int,
    last_timestamp_ms: int,
    next_offset: int,
) -> tuple[DamagedSpan, int]:
    """The damaged span that starts with the bad record at `position` (which should hold
    `offset`) in the segment open at `fd`, and the timestamp of the record after it (-1
    when the damage reaches `file_bytes`, the segment's end, whose next record would
    have had `next_offset`). Raises OSError."""
    found = find_resync(fd, position, file_bytes, offset, last_timestamp_ms)
    end_position, end_offset, timestamp_ms = file_bytes, next_offset, -1
    if found is not None:
        end_position, end_offset = found
        header = os.pread(fd, fmt.RECORD_HEADER_BYTES, end_position)
        timestamp_ms = int(fmt.RECORD_HEADER.unpack_from(header, 0)[3])
    count = end_offset - offset
    head = os.pread(fd, fmt.RECORD_HEADER_BYTES, position)
    body_bytes = lost_body_bytes(head, end_position - position, count)
    span = DamagedSpan(path, base_offset, position, end_position, offset, end_offset, body_bytes)
    return span, timestamp_ms


def resolve(
    damage: DamageMap, segment: Segment, fd: int, file_bytes: int, position: int, offset: int
) -> DamagedSpan:
    """The span of `segment` that starts with the bad record at `position` (which should
    hold `offset`): known already, or found now, remembered, logged and given an index
    entry where records resume (so that later lookups start after it). Raises OSError."""
    known = damage.at(segment.base_offset, position)
    if known is not None:
        return known
    index = segment.index
    i = bisect_right(index.relative_offsets, offset - segment.base_offset) - 1
    floor_ms = index.timestamps[i] if i >= 0 else -(1 << 62)
    span, resumed_ms = span_at(
        segment.path,
        segment.base_offset,
        fd,
        position,
        offset,
        min(file_bytes, segment.size_bytes),
        floor_ms,
        segment.next_offset,
    )
    if resumed_ms >= 0:
        index.insert(span.end_offset - segment.base_offset, span.end_position, resumed_ms)
    damage.add(span, "while running, by a read or the scrub")
    return span
