"""Scrubbing: reading the sealed segments of logs in the background to find damage early.

Owns where the scrub of each log stands (`Scrub`: a segment and position) and the turn
of the logs (`Scrubber`). Start-up trusts a sealed segment whose index checks, so damage
in it (bit rot) is otherwise found only when a reader reaches it; the scrub reads every
sealed segment over and over, a bounded number of bytes per call, checks each record
(length, CRC32C, offset; one C call per read) and hands damage to
`SegmentLog.resolve_damage`, which logs and reports it and lets every reader pass over
it. It never writes, and never reads the active segment (recovery checks that one).

Cost: the caller's budget per call (the broker's housekeeping gives `SCRUB_BYTES_PER_TICK`
five times a second: 1.25 MiB/s, a 10 GiB data directory in about 2.3 hours), one pread
of at most `SCRUB_READ_BYTES` at a time, on the caller's thread.
"""

from __future__ import annotations

import logging
from typing import Final

from streamq.log import chunk, frame
from streamq.log import format as fmt
from streamq.log._records import check_records
from streamq.log.chunk import ChunkInvalid
from streamq.log.errors import LogError, OffsetOutOfRange
from streamq.log.log import SegmentLog

logger = logging.getLogger(__name__)

SCRUB_READ_BYTES: Final = 256 * 1024  # one read of a scrub step
SCRUB_BYTES_PER_TICK: Final = 256 * 1024  # what the broker's housekeeping gives per tick


class Scrub:
    """The scrub of one log: the next record to check (its segment, position, offset)."""

    __slots__ = ("base", "offset", "passes", "position")

    def __init__(self) -> None:
        self.base = -1  # -1: start a pass at the first segment
        self.position = 0
        self.offset = 0
        self.passes = 0  # passes over every sealed segment completed

    def step(self, log: SegmentLog, bytes_max: int) -> int:
        """Check up to about `bytes_max` bytes of sealed segments from where the scrub
        stands; returns how many were read, fewer once a pass is complete (the next call
        starts the next one). Raises the log's errors (LogFailed)."""
        done = 0
        while done < bytes_max:
            if self.base < 0:
                self._start(log.start_offset)
            if log.segment_after(self.base) is None:  # the active segment: a pass is done
                self.base = -1
                self.passes += 1
                return done
            try:
                if log.segment_version(self.base) == frame.FORMAT_VERSION:
                    done += self._check_chunk(log)
                    continue
                data = log.read_at(self.base, self.position, min(SCRUB_READ_BYTES, bytes_max))
            except OffsetOutOfRange:  # retention dropped the segment: start again
                self.base = -1
                continue
            done += max(len(data), 1)
            self._check(log, data)
        return done

    def _check_chunk(self, log: SegmentLog) -> int:
        """Check the next chunk of a version-2 segment (both CRCs) and move past it; a
        bad one is damage (its offsets lost alone; only its entries that fail their own
        checksum when the frame is sound). Returns the bytes read."""
        place = log.chunk_at(self.offset)
        if place is None or place.base_offset != self.base:  # the segment's end
            following = log.segment_after(self.base)
            assert following is not None
            self._start(following)
            return 1
        data = log.frame_at(place.base_offset, place.position, place.chunk_bytes)
        try:
            frame.check_crcs(data)
        except frame.EntriesDamaged as exc:  # header and trailer sound: per entry
            try:
                header = chunk.decode_header(data, frame.FRAME_HEAD_BYTES)
                log.salvage_chunk(place.path, place.base_offset, place.position, data, header,
                                  f"scrub: {exc}")  # fmt: skip
            except ChunkInvalid as whole:
                log.chunk_damaged(place, str(whole))
        except ChunkInvalid as exc:
            log.chunk_damaged(place, str(exc))
        self.position = place.position + len(data)
        self.offset = place.first_offset + place.records
        return max(len(data), 1)

    def _start(self, base: int) -> None:
        self.base, self.position, self.offset = base, fmt.SEGMENT_HEADER_BYTES, base

    def _check(self, log: SegmentLog, data: bytes) -> None:
        """Check the records of `data` (read at the scrub's position) and move past
        them; damage at the position is resolved and passed over."""
        if not data:  # the segment's end: on to the next one
            following = log.segment_after(self.base)
            assert following is not None
            self._start(following)
            return
        end, next_offset, error = check_records(data, 0, self.offset)
        need = 4 + int.from_bytes(data[:4], "little") if len(data) >= 4 else 0
        if end == 0 and (error is not None or need > len(data)):
            if error is None:  # a record larger than the read: check it whole
                whole = log.read_at(self.base, self.position, need)
                if len(whole) == need:
                    self._check(log, whole)
                    return
            span = log.resolve_damage(self.base, self.position, self.offset)
            self.position, self.offset = span.end_position, span.end_offset
            return
        self.position += end
        self.offset = next_offset


class Scrubber:
    """Scrubs a set of logs in turn: each call spends its budget on one log, and moves to
    the next once that log's pass is complete."""

    __slots__ = ("_scrubs", "_turn")

    def __init__(self) -> None:
        self._scrubs: dict[str, Scrub] = {}  # by log directory
        self._turn = 0

    def step(self, logs: list[SegmentLog], bytes_max: int) -> None:
        """One bounded step over `logs` (those of the broker now). A log that fails is
        passed over (its failure is its own, reported where it happened)."""
        if not logs:
            self._scrubs.clear()
            return
        self._turn %= len(logs)
        log = logs[self._turn]
        scrub = self._scrubs.setdefault(log.directory, Scrub())
        try:
            if log.failed is None and scrub.step(log, bytes_max) >= bytes_max:
                return  # more of this log next time
        except LogError as exc:
            logger.warning("scrub of %s stopped: %s", log.directory, exc)
        self._turn += 1
        if len(self._scrubs) > len(logs):
            wanted = {log.directory for log in logs}
            self._scrubs = {d: s for d, s in self._scrubs.items() if d in wanted}
