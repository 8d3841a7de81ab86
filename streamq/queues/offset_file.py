"""The file of a stream's stored offsets, `<stream>.offsets`: its format, its recovery and
its writes, which a full disk or an I/O error holds back and never loses.

Format (little-endian): header magic b"SQOF" | u16 version (1) | u16 reserved, then
records `u32 length | u32 crc32c(payload) | payload`, the payload `u64 offset` followed by
the consumer tag in UTF-8. The newest record of a tag wins.

Recovery (`decode_file`) keeps every valid record. A bad record with nothing valid after
it is a torn tail (a write cut short by a crash): it is cut off. A bad record followed by
a valid one is damage: it is skipped and reported, and its tag keeps the value of its
previous record, if any (the file is only appended to, so an older value is still there
unless a compaction dropped it). Either way a line is logged with the file and position;
no offset silently goes back.

Writes (`OffsetFile`) run on the Syncer thread, as an action of a sync round of the
stream's log (never on the event loop). The offsets handed over are held, newest per tag,
until a write of them is durable (appended and fdatasynced, or the whole file replaced:
temp file, fsync, rename, directory fsync). A write that finds no room is cut back and
raises OutOfSpace, so the log leaves the action for its next round, blocks publishers and
retries until there is room; one that meets another error (EIO, a failed fsync) is
reported and retried by the next round with a whole-file replacement, since after a
failed fsync what the old file holds is unknown. Held offsets cost one dict entry per tag
whatever the time the disk stays full.

It knows nothing of consumers or of the event loop.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Final, NamedTuple

from streamq.log import files
from streamq.log._records import crc32c
from streamq.log.errors import OutOfSpace
from streamq.log.files import append_all, write_file_atomic
from streamq.log.versions import refuse_newer

logger = logging.getLogger(__name__)

MAGIC: Final = b"SQOF"
VERSION: Final = 1
HEADER: Final = struct.Struct("<4sHH")
RECORD: Final = struct.Struct("<II")
OFFSET: Final = struct.Struct("<Q")
TAG_BYTES_MAX: Final = 255  # an AMQP consumer tag is a shortstr
PAYLOAD_BYTES_MAX: Final = OFFSET.size + TAG_BYTES_MAX
COMPACT_RECORDS_MIN: Final = 4096  # rewrite when the file holds this many more than tags
# While writes fail, a reminder is logged this often (the first failure is logged at once).
FAILING_LOG_INTERVAL_S: Final = 30.0


class OffsetsCorrupted(Exception):
    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"offsets file {path} is corrupt at byte {position}: {reason}")


def encode_record(tag: str, offset: int) -> bytes:
    payload = OFFSET.pack(offset) + tag.encode("utf-8", "surrogateescape")
    return RECORD.pack(len(payload), crc32c(payload)) + payload


def encode_file(offsets: dict[str, int]) -> bytes:
    return HEADER.pack(MAGIC, VERSION, 0) + b"".join(
        encode_record(tag, offset) for tag, offset in offsets.items()
    )


class Decoded(NamedTuple):
    """What `decode_file` found."""

    offsets: dict[str, int]
    records: int  # valid records (the newest of a tag wins)
    valid_bytes: int  # the file up to the end of its last valid record
    damaged: list[tuple[int, int]]  # (position, bytes skipped) of each damaged stretch


def _record_at(data: bytes, position: int) -> tuple[str, int, int] | None:
    """(tag, offset, end) of a valid record at `position`, or None."""
    if position + RECORD.size > len(data):
        return None
    length, crc = RECORD.unpack_from(data, position)
    start = position + RECORD.size
    if not OFFSET.size <= length <= PAYLOAD_BYTES_MAX or start + length > len(data):
        return None
    payload = data[start : start + length]
    if crc32c(payload) != crc:
        return None
    tag = payload[OFFSET.size :].decode("utf-8", "surrogateescape")
    return tag, OFFSET.unpack_from(payload, 0)[0], start + length


def _next_valid(data: bytes, position: int) -> int | None:
    """The position of the first valid record after `position`, or None. A byte scan: the
    file holds at most COMPACT_RECORDS_MIN records more than tags, and a CRC32C match at
    a wrong position has odds of 2**-32."""
    for candidate in range(position + 1, len(data) - RECORD.size - OFFSET.size + 1):
        if _record_at(data, candidate) is not None:
            return candidate
    return None


def decode_file(path: str, data: bytes) -> Decoded:
    """The stored offsets in `data`, the contents of the file `path` (for the messages).
    Logs each torn tail and damaged stretch. Raises NewerFormat for a newer broker's
    file, OffsetsCorrupted for version 0."""
    offsets: dict[str, int] = {}
    damaged: list[tuple[int, int]] = []
    if not data:
        return Decoded(offsets, 0, 0, damaged)
    magic, version = (HEADER.unpack_from(data, 0)[:2]) if len(data) >= HEADER.size else (b"", 0)
    if magic == MAGIC:
        refuse_newer(path, "stream offsets", version, VERSION)
    if magic == MAGIC and version != VERSION:
        raise OffsetsCorrupted(path, 0, f"unknown version {version}")
    if magic != MAGIC:
        logger.error(
            "offsets file %s: damaged header %r; reading the records after it", path, data[:8]
        )
        damaged.append((0, HEADER.size))
    position, records, valid = HEADER.size, 0, HEADER.size
    while position < len(data):
        found = _record_at(data, position)
        if found is None:
            following = _next_valid(data, position)
            if following is None:
                logger.warning(
                    "offsets file %s: torn last record at byte %d (%d bytes) cut off; its "
                    "tag keeps its previous offset",
                    path,
                    position,
                    len(data) - position,
                )
                break
            logger.error(
                "offsets file %s: damaged record at byte %d (%d bytes) skipped; its tag "
                "keeps its previous offset, if it had one",
                path,
                position,
                following - position,
            )
            damaged.append((position, following - position))
            position = following
            continue
        tag, offsets[tag], position = found
        records += 1
        valid = position
    return Decoded(offsets, records, valid, damaged)


class OffsetFile:
    """The writes of one offsets file. `hand_over` and `close` run on the event loop, the
    action it returns on the Syncer thread; `_state` guards what both touch."""

    def __init__(
        self, path: str, fd: int, offsets: dict[str, int], records: int, replace_whole: bool
    ) -> None:
        """`fd`: the file opened for appending, or -1 when the first write must create
        it (a full disk at open); `replace_whole`: the first write replaces the file
        (it was damaged, or is missing)."""
        self.path = path
        self._fd = fd
        self._state = threading.Lock()  # short holds only: the event loop takes it
        self._io = threading.Lock()  # a write against `close`
        self._held: dict[str, int] = {}  # handed over, not yet durable
        self._file_offsets = dict(offsets)  # what the file holds (durably)
        self._records = records
        self._queued = False  # the action is in a round, or left for the next one
        self._closed = False
        # Held offsets with no action queued: a write failed (not for want of room: the
        # log runs that action again), or newer ones came while one was written. The
        # next round must be handed the action again. Read by the event loop.
        self.action_due = False
        self._replace_whole = replace_whole or fd < 0
        self._failing_since_s: float | None = None
        self._failing_logged_s = 0.0

    @property
    def failing(self) -> bool:
        """The last write failed (read by the event loop for its backoff)."""
        return self._failing_since_s is not None

    def settled(self) -> bool:
        """Everything handed over is durable."""
        with self._state:
            return not self._held

    def hand_over(self, pending: dict[str, int]) -> Callable[[], None] | None:
        """Hold `pending` (newer than what is held) for writing; the action to give the
        round, or None when one is already queued (it writes these too) or closed."""
        with self._state:
            self._held.update(pending)
            if self._queued or self._closed or not self._held:
                return None
            self._queued = True
            self.action_due = False
        return self._write

    def close(self) -> None:
        with self._state:
            self._closed = True
        with self._io:
            if self._fd >= 0:
                files.close_fd(self._fd)
                self._fd = -1

    def _write(self) -> None:
        """The round's action (Syncer thread): make the held offsets durable. Raises
        OutOfSpace, with nothing of this write left in the file, for the log to run it
        again in a later round; any other error is reported and left to the next round.
        Durable when it returns without raising and `settled()`."""
        with self._io:
            with self._state:
                if self._closed:
                    self._queued = False
                    return
                held = dict(self._held)
            try:
                self._land(held)
            except OutOfSpace as exc:
                self._failed(exc, held)
                raise  # the action stays queued: the log runs it again
            except OSError as exc:
                self._replace_whole = True  # what the old file holds is unknown now
                self._failed(exc, held)
                with self._state:
                    self._queued = False
                    self.action_due = True
                return
            with self._state:
                for tag, offset in held.items():
                    if self._held.get(tag) == offset:
                        del self._held[tag]
                self._queued = False
                self.action_due = bool(self._held)  # stored while this one was written
        self._recovered()

    def _land(self, held: dict[str, int]) -> None:
        """Append `held` and fdatasync, or replace the whole file when asked to or when it
        holds many more records than tags. Raises OutOfSpace (nothing left behind) and
        OSError."""
        merged = {**self._file_offsets, **held}
        if self._replace_whole or self._records + len(held) > len(merged) + COMPACT_RECORDS_MIN:
            write_file_atomic(self.path, encode_file(merged), fsync_dir=True)
            fd = files.open_fd(self.path, os.O_WRONLY | os.O_APPEND)
            if self._fd >= 0:
                files.close_fd(self._fd)
            self._fd, self._records, self._replace_whole = fd, len(merged), False
        else:
            append_all(self._fd, b"".join(encode_record(t, o) for t, o in held.items()))
            os.fdatasync(self._fd)
            self._records += len(held)
        self._file_offsets = merged

    def _failed(self, exc: OSError, held: dict[str, int]) -> None:
        now_s = time.monotonic()
        if self._failing_since_s is None:
            self._failing_since_s = now_s
        elif now_s - self._failing_logged_s < FAILING_LOG_INTERVAL_S:
            return
        self._failing_logged_s = now_s
        logger.error(
            "offsets file %s: write failed for %.1f s (%s); holding %d offsets, retrying "
            "until it works",
            self.path,
            now_s - self._failing_since_s,
            exc,
            len(held),
        )

    def _recovered(self) -> None:
        if self._failing_since_s is not None:
            logger.warning(
                "offsets file %s: written again after %.1f s of failed writes",
                self.path,
                time.monotonic() - self._failing_since_s,
            )
            self._failing_since_s = None
