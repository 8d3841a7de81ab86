"""Publisher deduplication of a stream: the highest publishing id stored per reference.

Owns the file `publishers` in the stream's log directory and the rule of deduplication:
a stream-protocol publisher that declared a reference has each message stored only if its
publishing id is above the highest one stored for that reference, any id when it stored
none yet (RabbitMQ's rule; the
parsing and skipping is `StreamQueue.append_publish`'s, in C). The stored state must
never run ahead of the log: an id counted here whose record was lost in a crash would
make the publisher's retry be dropped as a duplicate.

File layout (little-endian, docs/log-format.md "Publishers file"): header magic b"SQPS" |
u16 version (1) | u16 reserved, then records `u32 length | u32 crc32c(payload) | payload`,
the payload `u64 covered | u64 sequence | u64 offset | reference (UTF-8)`: the reference's
highest publishing id, the offset of the record that stored it, and `covered`, the log's
next offset when the record was written (every record below it is accounted for in the
file). The newest record of a reference wins; a record with an empty reference only moves
`covered`. A torn last record is cut off; a bad record before the last raises
PublishersCorrupted.

Durability: `update` is buffered; `prepare_sync` (a sync companion of the stream's log)
writes the changed references once per sync round, so the state is durable with the
records it counts. On open the state is rebuilt from the file plus a scan of the native
records from `covered` on; if the file counts records the log no longer has (a crash
between the file's write and the segment's fsync), the references whose record is gone
are dropped and the whole log is scanned for them.
"""

from __future__ import annotations

import logging
import os
import struct
from typing import Final

from streamq.log import amqp10, files, frame
from streamq.log._records import crc32c
from streamq.log.errors import OutOfSpace
from streamq.log.files import write_file_atomic
from streamq.log.log import CompanionWork, SegmentLog
from streamq.log.versions import refuse_newer
from streamq.queues.offsets import CompanionFile, OffsetsCorrupted

FILE_NAME: Final = "publishers"
MAGIC: Final = b"SQPS"
VERSION: Final = 1
HEADER: Final = struct.Struct("<4sHH")
RECORD: Final = struct.Struct("<II")
ENTRY: Final = struct.Struct("<QQQ")  # covered, sequence, offset
REFERENCE_BYTES_MAX: Final = 255  # the record's exchange field holds it (u8 length)
logger = logging.getLogger(__name__)
COMPACT_RECORDS_MIN: Final = 4096  # rewrite when the file holds this many more than references
# A round with no publishes still moves `covered` when the log grew this much since, so
# that the scan on open stays short on a stream written mostly over AMQP.
COVERED_LAG_MAX: Final = 65536
SCAN_BATCH_RECORDS: Final = 4096
_PUBLISHING_ID: Final = struct.Struct("<Q")
# A reference that stored nothing yet (`encode_publish`'s convention). The file holds
# only references that stored a message, so a record with sequence 0 means id 0 was
# stored: it still deduplicates id 0 after a restart.
NO_SEQUENCE: Final = -1
NO_WORK: Final = CompanionWork(())


class BadPublish(ValueError):
    """A Publish frame's messages do not parse; nothing of the frame was appended."""


# An OffsetsCorrupted: the broker treats both files of a stream alike (the stream is not
# restored, its files stay for an operator).
class PublishersCorrupted(OffsetsCorrupted):
    def __init__(self, path: str, position: int, reason: str) -> None:
        # Not OffsetsCorrupted's text: this is the publishers file.
        Exception.__init__(self, f"publishers file {path} is corrupt at byte {position}: {reason}")


class Entry:
    """A reference's highest stored publishing id and the offset of its record."""

    __slots__ = ("offset", "sequence")

    def __init__(self, sequence: int, offset: int) -> None:
        self.sequence = sequence
        self.offset = offset


def encode_record(covered: int, reference: bytes, sequence: int, offset: int) -> bytes:
    payload = ENTRY.pack(covered, sequence, offset) + reference
    return RECORD.pack(len(payload), crc32c(payload)) + payload


def encode_file(covered: int, entries: dict[bytes, Entry]) -> bytes:
    body = [encode_record(covered, ref, e.sequence, e.offset) for ref, e in entries.items()]
    if not entries:
        body.append(encode_record(covered, b"", 0, 0))
    return HEADER.pack(MAGIC, VERSION, 0) + b"".join(body)


def decode_file(path: str, data: bytes) -> tuple[dict[bytes, Entry], int, int, int]:
    """The entries, `covered`, how many records held them and the length of the valid part."""
    if len(data) < HEADER.size:
        return {}, 0, 0, 0
    magic, version, _ = HEADER.unpack_from(data, 0)
    if magic == MAGIC:
        refuse_newer(path, "stream publishers", version, VERSION)
    if magic != MAGIC or version != VERSION:
        raise PublishersCorrupted(path, 0, f"bad header {magic!r} version {version}")
    entries: dict[bytes, Entry] = {}
    position, records, covered = HEADER.size, 0, 0
    while position + RECORD.size <= len(data):
        length, crc = RECORD.unpack_from(data, position)
        start = position + RECORD.size
        payload = data[start : start + length]
        valid = ENTRY.size <= length <= ENTRY.size + REFERENCE_BYTES_MAX
        if not valid or len(payload) < length or crc32c(payload) != crc:
            if valid and start + length < len(data):
                raise PublishersCorrupted(path, position, "record fails its checksum")
            break  # torn last record
        covered, sequence, offset = ENTRY.unpack_from(payload, 0)
        reference = payload[ENTRY.size :]
        if reference:
            entries[reference] = Entry(sequence, offset)
        records += 1
        position = start + length
    return entries, covered, records, position


def scan_native(log: SegmentLog, start: int, entries: dict[bytes, Entry]) -> None:
    """Raise `entries` to the publishing ids of the native records from `start` on (only
    at open, and bounded by COVERED_LAG_MAX plus a sync round after a clean run): an
    upgraded stream's version-1 segments (its oldest) record by record, 3 us each in
    Python; version-2 chunks by their trailers alone, no entry read (a 10M-record stream
    without its file took 32 s to open when its records were read too, 0.9 s so)."""
    offset = max(start, log.start_offset)
    version_1_end = log.version_1_end(offset)
    unpack = _PUBLISHING_ID.unpack_from
    while offset < version_1_end:
        batch = log.read(offset, min(SCAN_BATCH_RECORDS, version_1_end - offset))
        if not batch:
            break
        for record in batch:
            if record.exchange and amqp10.is_native(record.properties):
                sequence = unpack(record.properties, 2)[0]
                _raise(entries, record.exchange, sequence, record.offset)
        offset = batch[-1].offset + 1
    for last, trailer in log.chunk_trailers(max(offset, version_1_end)):
        for reference, sequence in frame.parse_trailer(trailer).sequences.items():
            _raise(entries, reference, sequence, last)


def _raise(entries: dict[bytes, Entry], reference: bytes, sequence: int, offset: int) -> None:
    entry = entries.get(reference)
    if entry is None:
        entries[reference] = Entry(sequence, offset)
    elif sequence >= entry.sequence:
        entry.sequence, entry.offset = sequence, offset


class PublisherSequences(CompanionFile):
    """The publishing ids of one stream; the event-loop thread only (but `_replace`)."""

    def __init__(
        self, path: str, log: SegmentLog, entries: dict[bytes, Entry], records: int, fd: int
    ) -> None:
        super().__init__(path, fd)
        self._log = log
        self._entries = entries
        self._records = records
        self._covered = log.next_offset
        self._pending: set[bytes] = set()

    @classmethod
    def open(cls, log: SegmentLog) -> PublisherSequences:
        """Open or create the file in `log`'s directory and rebuild the state (see the
        module's docstring); the file is rewritten with it (fsyncs file and directory
        before returning). Raises PublishersCorrupted, LogError and OSError."""
        path = os.path.join(log.directory, FILE_NAME)
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            data = b""
        entries, covered, records, valid = decode_file(path, data)
        end = log.next_offset
        lost = covered > end  # the file counts records that the log lost
        if lost:
            entries = {ref: e for ref, e in entries.items() if e.offset < end}
            covered = 0
        if covered < end:
            scan_native(log, covered, entries)
        if not data or valid != len(data) or covered < end or records > len(entries) + 1:
            try:
                write_file_atomic(path, encode_file(end, entries), fsync_dir=True)
            except OutOfSpace as exc:
                # Kept as it is (a restart rebuilds the same state from it and the log),
                # unless it counts lost records or has no header: then no room is fatal.
                if lost or valid < HEADER.size:
                    raise
                _cut_in_place(path, valid, exc)
            records = max(len(entries), 1)
        fd = files.open_fd(path, os.O_WRONLY | os.O_APPEND)
        return cls(path, log, entries, records, fd)

    def sequence(self, reference: bytes) -> int:
        """The highest publishing id stored for `reference`, NO_SEQUENCE if none: a new
        reference's first publishing id, 0 included, is never a duplicate (RabbitMQ's
        osiris knows no writer until it stored one of its messages)."""
        entry = self._entries.get(reference)
        return NO_SEQUENCE if entry is None else entry.sequence

    def references(self) -> dict[bytes, int]:
        return {ref: e.sequence for ref, e in self._entries.items()}

    def update(self, reference: bytes, sequence: int, offset: int) -> None:
        """`reference`'s highest id is now `sequence`, stored at `offset`. Buffered:
        durable after the stream log's next sync round."""
        entry = self._entries.get(reference)
        if entry is None:
            self._entries[reference] = Entry(sequence, offset)
        else:
            entry.sequence, entry.offset = sequence, offset
        self._pending.add(reference)

    def prepare_sync(self) -> CompanionWork:
        """The stream log's sync companion: write what changed since the last round."""
        if self._fd < 0:
            return NO_WORK
        covered = self._log.next_offset
        if not self._pending and covered - self._covered < COVERED_LAG_MAX:
            return NO_WORK
        pending, self._pending = self._pending, set()
        self._covered = covered
        entries = self._entries
        if self._records + len(pending) + 1 > len(entries) + COMPACT_RECORDS_MIN:
            return self._compact(covered)
        chunks = [
            encode_record(covered, r, entries[r].sequence, entries[r].offset) for r in pending
        ]
        if not chunks:
            chunks.append(encode_record(covered, b"", 0, 0))
        self._records += len(chunks)
        return CompanionWork((), writes=((self._fd, b"".join(chunks)),))

    def _compact(self, covered: int) -> CompanionWork:
        """A new file holding every reference; the round writes and fdatasyncs it on the
        Syncer thread, then renames it into place."""
        tmp, fd = self._start_replacement()
        data = encode_file(covered, self._entries)
        self._records = max(len(self._entries), 1)
        return CompanionWork((), (lambda: self._replace(tmp),), ((fd, data),))


def _cut_in_place(path: str, valid_bytes: int, why: OutOfSpace) -> None:
    """A full disk at open: cut a torn tail off in place (no room needed) instead of
    rewriting the file, with a log line."""
    fd = files.open_fd(path, os.O_WRONLY)
    try:
        files.ftruncate(fd, valid_bytes)
        os.fsync(fd)
    finally:
        files.close_fd(fd)
    logger.warning("publishers file %s: not rewritten at open (%s); kept as it is", path, why)
