"""Broker-side offset tracking of a stream: the stored offset of each named consumer.

Owns one file per stream, `<stream>.offsets`, and the rule of what is stored: the highest
offset that the consumer acked together with every offset before it (`AckWatermark`),
not its read position, so that a crash never skips a message the consumer had not acked
(LavinMQ stores the read position and does). A consumer that reconnects with the same
tag resumes after it.

File layout (little-endian): header magic b"SQOF" | u16 version (1) | u16 reserved, then
records `u32 length | u32 crc32c(payload) | payload`, the payload `u64 offset` followed
by the consumer tag in UTF-8. The newest record of a tag wins. A torn last record is cut
off; a bad record before the last raises OffsetsCorrupted.

Durability: `store` is buffered; `prepare_sync` writes the newest offset of each changed
tag, once per sync round (it is a sync companion of the stream's log), so stored offsets
are durable after the round that follows the ack. When the file holds many more records
than tags, a round replaces it with one record per tag (temp file, fdatasync, rename,
directory fsync).
"""

from __future__ import annotations

import os
import struct
import threading
from typing import Final

from streamq.log import files
from streamq.log._records import crc32c
from streamq.log.files import fsync_directory, write_all, write_file_atomic
from streamq.log.log import CompanionWork

MAGIC: Final = b"SQOF"
VERSION: Final = 1
HEADER: Final = struct.Struct("<4sHH")
RECORD: Final = struct.Struct("<II")
OFFSET: Final = struct.Struct("<Q")
TAG_BYTES_MAX: Final = 255  # an AMQP consumer tag is a shortstr
COMPACT_RECORDS_MIN: Final = 4096  # rewrite when the file holds this many more than tags
NO_WORK: Final = CompanionWork(())


class OffsetsCorrupted(Exception):
    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"offsets file {path} is corrupt at byte {position}: {reason}")


class AckWatermark:
    """The offsets below `next` are all acked (or passed over by a filter)."""

    __slots__ = ("_done", "next")

    def __init__(self, start: int) -> None:
        self.next = start
        self._done: set[int] = set()  # acked offsets above a gap

    def done(self, offset: int) -> bool:
        """Record `offset` as acked; True if the watermark moved."""
        if offset < self.next:
            return False
        if offset > self.next:
            self._done.add(offset)
            return False
        following = offset + 1
        done = self._done
        while following in done:
            done.discard(following)
            following += 1
        self.next = following
        return True

    def done_run(self, offsets: list[int]) -> bool:
        """`done` of each of `offsets` (any order, repeats allowed); True if the
        watermark moved. The common run, the offsets from `next` on with no gap and
        nothing acked above a gap before, moves it in one step (C-level set, min, max:
        no Python code per offset)."""
        fresh = set(offsets)
        start = self.next
        if not fresh or max(fresh) < start:
            return False
        if min(fresh) < start:
            fresh = set(filter(start.__le__, fresh))  # acked before: nothing to do
        done = self._done
        # n distinct offsets from `start` whose largest is start + n - 1 are exactly
        # start .. start + n - 1.
        if not done and min(fresh) == start and max(fresh) == start + len(fresh) - 1:
            self.next = start + len(fresh)
            return True
        done |= fresh
        if start not in done:
            return False
        following = start
        while following in done:
            done.discard(following)
            following += 1
        self.next = following
        return True


def encode_record(tag: str, offset: int) -> bytes:
    payload = OFFSET.pack(offset) + tag.encode("utf-8", "surrogateescape")
    return RECORD.pack(len(payload), crc32c(payload)) + payload


def encode_file(offsets: dict[str, int]) -> bytes:
    return HEADER.pack(MAGIC, VERSION, 0) + b"".join(
        encode_record(tag, offset) for tag, offset in offsets.items()
    )


def decode_file(path: str, data: bytes) -> tuple[dict[str, int], int, int]:
    """The stored offsets, how many records held them and the length of the valid part."""
    if len(data) < HEADER.size:
        return {}, 0, 0
    magic, version, _ = HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise OffsetsCorrupted(path, 0, f"bad header {magic!r} version {version}")
    offsets: dict[str, int] = {}
    position, records = HEADER.size, 0
    while position + RECORD.size <= len(data):
        length, crc = RECORD.unpack_from(data, position)
        start = position + RECORD.size
        payload = data[start : start + length]
        valid = OFFSET.size <= length <= OFFSET.size + TAG_BYTES_MAX
        if not valid or len(payload) < length or crc32c(payload) != crc:
            if valid and start + length < len(data):
                raise OffsetsCorrupted(path, position, "record fails its checksum")
            break  # torn last record
        tag = payload[OFFSET.size :].decode("utf-8", "surrogateescape")
        offsets[tag] = OFFSET.unpack_from(payload, 0)[0]
        records += 1
        position = start + length
    return offsets, records, position


class CompanionFile:
    """An append-only file that a stream log's sync companion writes, replaced whole when
    compacted (a temp file, fdatasynced by the round, then renamed into place). Shared by
    the offsets and the publishers files."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._lock = threading.Lock()  # a compaction's rename against `close`

    def _start_replacement(self) -> tuple[str, int]:
        """Appends go to a new temp file from now on: (its path, its fd)."""
        tmp = self.path + ".tmp"
        fd = files.open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        files.close_fd(self._fd)
        self._fd = fd
        return tmp, fd

    def _replace(self, tmp: str) -> None:
        """Runs on the fsync thread after `tmp` was written and fdatasynced."""
        with self._lock:
            if self._fd >= 0:
                files.replace(tmp, self.path)
        fsync_directory(os.path.dirname(self.path))

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                files.close_fd(self._fd)
                self._fd = -1


class OffsetStore(CompanionFile):
    """The stored offsets of one stream; the event-loop thread only (but `_replace`)."""

    def __init__(self, path: str, offsets: dict[str, int], records: int, fd: int) -> None:
        super().__init__(path, fd)
        self._offsets = offsets
        self._records = records
        self._pending: dict[str, int] = {}

    @classmethod
    def open(cls, path: str) -> OffsetStore:
        """Open or create; a torn tail is cut and a bloated file compacted first (fsyncs
        file and directory before returning). Raises OffsetsCorrupted and OSError."""
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            data = b""
        offsets, records, valid = decode_file(path, data)
        if not data or valid != len(data) or records > len(offsets) + COMPACT_RECORDS_MIN:
            write_file_atomic(path, encode_file(offsets), fsync_dir=True)
            records = len(offsets)
        return cls(path, offsets, records, files.open_fd(path, os.O_WRONLY | os.O_APPEND))

    def get(self, tag: str) -> int | None:
        return self._offsets.get(tag)

    def store(self, tag: str, offset: int) -> None:
        """Buffered: durable after the stream log's next sync round."""
        self._offsets[tag] = offset
        self._pending[tag] = offset

    def prepare_sync(self) -> CompanionWork:
        """The stream log's sync companion: write what changed since the last round."""
        if not self._pending or self._fd < 0:
            return NO_WORK
        pending, self._pending = self._pending, {}
        if self._records + len(pending) <= len(self._offsets) + COMPACT_RECORDS_MIN:
            write_all(self._fd, b"".join(encode_record(t, o) for t, o in pending.items()))
            self._records += len(pending)
            return CompanionWork((self._fd,))
        # Compaction: the new file holds every offset, the pending ones included; the
        # round fdatasyncs it, then renames it into place.
        tmp, fd = self._start_replacement()
        write_all(fd, encode_file(self._offsets))
        self._records = len(self._offsets)
        return CompanionWork((fd,), (lambda: self._replace(tmp),))
