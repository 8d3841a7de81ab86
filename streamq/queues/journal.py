"""A durable classic queue's journal: which log offsets it holds, delivered and acked.

Owns one file per durable queue. The vhost log holds message contents once for every
queue; this file says which of its offsets belong to this queue and what happened to
them, so that a restart rebuilds the queue exactly: its messages in publish order, the
redelivered flag and delivery count of those delivered before, and never an acked one.

File layout (little-endian): a 16-byte header, then blocks, one per sync round:

    header: magic b"SQQJ" | u16 version (2) | u16 reserved | u64 reserved
    block:  u32 entry count | u32 crc32c(entries) | entries, 8 bytes each
    entry:  u64 = offset (bits 0-47) | kind (bits 48-49) | count (bits 50-63)

kind 1 ENQUEUE (the queue holds `offset`), 2 DELIVER (`count` deliveries so far,
saturating at 16383), 3 ACK (the queue is done with it: acked, rejected, purged). An
entry is one integer, so recording one costs an `array.append` on the hot path; the CRC
covers a whole block.

Durability: entries are buffered in memory; `prepare_sync` writes them to the OS and the
vhost log's sync round fdatasyncs the file (this object is one of the log's sync
companions), so an entry is durable after a round that began after it was recorded.
A compaction replaces the file with the live entries only (write temp, fsync, rename,
fsync directory), on the Syncer thread as part of a round.

Loading trusts nothing past the log: entries for offsets at or past the log's end after
recovery are discarded (a torn tail may give those offsets to new messages), and so are
entries below its start (segments already dropped). It does no routing and knows no AMQP.
"""

from __future__ import annotations

import os
import struct
import sys
import threading
from array import array
from collections.abc import Callable
from typing import Final, NamedTuple

import crc32c

from streamq.log.errors import OutOfSpace
from streamq.log.files import append_all, fsync_directory, write_file_atomic

MAGIC: Final = b"SQQJ"
VERSION: Final = 2
HEADER: Final = struct.Struct("<4sHHQ")
BLOCK: Final = struct.Struct("<II")
ENTRY_BYTES: Final = 8
BLOCK_ENTRIES_MAX: Final = 1 << 20  # a longer block is corruption, not a torn write
OFFSET_BITS: Final = 48
OFFSET_MASK: Final = (1 << OFFSET_BITS) - 1
ENQUEUE: Final = 1 << OFFSET_BITS
DELIVER: Final = 2 << OFFSET_BITS
ACK: Final = 3 << OFFSET_BITS
KIND_MASK: Final = 3 << OFFSET_BITS
COUNT_SHIFT: Final = 50
COUNT_MAX: Final = (1 << 14) - 1
# Compact when dead entries outnumber live ones this many times over, and there are at
# least COMPACT_DEAD_MIN of them (so that small queues do not rewrite their file often).
COMPACT_RATIO: Final = 4
COMPACT_DEAD_MIN: Final = 65536
_LITTLE: Final = sys.byteorder == "little"


class JournalCorrupted(Exception):
    """An entry before the last one fails its CRC, or the header is wrong."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"queue journal {path} is corrupt at byte {position}: {reason}")
        self.path = path
        self.position = position


class LiveMessage(NamedTuple):
    offset: int
    delivery_count: int


def entry(offset: int, kind: int, count: int = 0) -> int:
    return offset | kind | (min(count, COUNT_MAX) << COUNT_SHIFT)


def encode_header() -> bytes:
    return HEADER.pack(MAGIC, VERSION, 0, 0)


def encode_block(entries: array[int]) -> bytes:
    if not _LITTLE:
        entries = array("Q", entries)
        entries.byteswap()
    payload = entries.tobytes()
    return BLOCK.pack(len(entries), crc32c.crc32c(payload)) + payload


def encode_live(offsets: list[int], counts: dict[int, int]) -> bytes:
    """The whole file for a queue holding `offsets` (sorted), `counts` giving the delivery
    count of those delivered before: header, then one block of ENQUEUE (and DELIVER)."""
    entries = array("Q")
    append = entries.append
    for offset in offsets:
        append(offset | ENQUEUE)
        count = counts.get(offset)
        if count:
            append(entry(offset, DELIVER, count))
    return encode_header() + (encode_block(entries) if entries else b"")


def encode_live_messages(live: list[LiveMessage]) -> bytes:
    return encode_live(
        [m.offset for m in live], {m.offset: m.delivery_count for m in live if m.delivery_count}
    )


class JournalWork(NamedTuple):
    """What one sync round does for a journal (see `QueueJournal.prepare_sync`)."""

    fd: int | None  # to append `data` to (on the fsync thread), then fdatasync
    action: Callable[[], None] | None  # a compaction: writes and syncs the new file
    data: bytes


class Replay(NamedTuple):
    live: list[LiveMessage]  # in offset order
    entries: int  # how many entries the file held, valid ones
    valid_bytes: int  # the file up to the last valid entry
    discarded: int  # entries outside the log's range


def replay(path: str, data: bytes, log_start: int, log_next: int) -> Replay:
    """Decode a journal file's bytes. A torn last block ends the replay; a bad block
    followed by more bytes raises JournalCorrupted."""
    if len(data) < HEADER.size:
        return Replay([], 0, 0, 0)  # created, header not yet durable: an empty queue
    magic, version, _, _ = HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise JournalCorrupted(path, 0, f"bad header {magic!r} version {version}")
    counts: dict[int, int] = {}
    position = HEADER.size
    entries = discarded = 0
    while position + BLOCK.size <= len(data):
        count, crc = BLOCK.unpack_from(data, position)
        start = position + BLOCK.size
        end = start + count * ENTRY_BYTES
        if count > BLOCK_ENTRIES_MAX or end > len(data) or crc32c.crc32c(data[start:end]) != crc:
            if end < len(data) and count <= BLOCK_ENTRIES_MAX:
                raise JournalCorrupted(path, position, "block fails its checksum")
            break  # a torn last block
        values = array("Q", data[start:end])
        if not _LITTLE:
            values.byteswap()
        for value in values:
            offset = value & OFFSET_MASK
            if not log_start <= offset < log_next:
                discarded += 1
                continue
            kind = value & KIND_MASK
            if kind == ENQUEUE:
                counts[offset] = 0
            elif kind == DELIVER:
                if offset in counts:
                    counts[offset] = value >> COUNT_SHIFT
            elif kind == ACK:
                counts.pop(offset, None)
            else:
                raise JournalCorrupted(path, position, f"entry of unknown kind {value:#x}")
        entries += count
        position = end
    live = [LiveMessage(o, counts[o]) for o in sorted(counts)]
    return Replay(live, entries, position, discarded)


class QueueJournal:
    """The open journal of one durable queue; used from the event-loop thread only."""

    __slots__ = (
        "_buffer",
        "_compact",
        "_dead",
        "_dirty",
        "_fd",
        "_header",
        "_live",
        "_lock",
        "live_source",
        "path",
    )

    def __init__(self, path: str, fd: int, live_count: int, dirty: set[QueueJournal]) -> None:
        self.path = path
        self._fd = fd
        self._header = b""  # a new file's header, written with its first block
        self._buffer: array[int] = array("Q")
        self._live = live_count
        self._dead = 0
        self._compact = False
        # The journals with something to write: the vhost's sync companion drains it.
        self._dirty = dirty
        # What the queue holds now, for a compaction (the queue's cursor sets it).
        self.live_source: Callable[[], tuple[list[int], dict[int, int]]] | None = None
        # Held by a compaction's rename (fsync thread) and by `close` (event loop), so
        # that a queue deleted meanwhile does not get its file back.
        self._lock = threading.Lock()

    @classmethod
    def create(cls, path: str, dirty: set[QueueJournal]) -> QueueJournal:
        """A new, empty journal. Buffered: the file and its header are durable after the
        next sync round and a directory fsync (the vhost adds one)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        journal = cls(path, fd, 0, dirty)
        journal._header = encode_header()
        dirty.add(journal)
        return journal

    @classmethod
    def load(
        cls, path: str, log_start: int, log_next: int, dirty: set[QueueJournal]
    ) -> tuple[QueueJournal, list[LiveMessage]]:
        """Open an existing journal and return what the queue holds.

        If the file held anything beyond its live entries that must not be read again
        (discarded or torn entries, or enough acked ones), it is rewritten with its live
        entries first; this fsyncs the file and directory before returning (start-up only).
        Raises JournalCorrupted and OSError.
        """
        with open(path, "rb") as file:
            data = file.read()
        result = replay(path, data, log_start, log_next)
        live_entries = len(result.live) * 2
        if result.discarded or result.valid_bytes != len(data) or result.entries > live_entries:
            write_file_atomic(path, encode_live_messages(result.live), fsync_dir=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        return cls(path, fd, len(result.live), dirty), result.live

    def enqueued(self, offset: int) -> None:
        if not self._buffer:
            self._dirty.add(self)
        self._buffer.append(offset | ENQUEUE)
        self._live += 1

    def enqueued_run(self, first: int, count: int) -> None:
        """`enqueued` for the `count` offsets from `first` on (one run of publishes)."""
        if not self._buffer:
            self._dirty.add(self)
        start = first | ENQUEUE  # offsets stay below bit 48, so the kind bits add up
        self._buffer.extend(range(start, start + count))
        self._live += count

    def delivered(self, offset: int, count: int) -> None:
        if not self._buffer:
            self._dirty.add(self)
        # A comparison, not min(): this runs once per delivery.
        self._buffer.append(
            offset | DELIVER | ((count if count < COUNT_MAX else COUNT_MAX) << COUNT_SHIFT)
        )
        self._dead += 1

    def acked(self, offset: int) -> None:
        if not self._buffer:
            self._dirty.add(self)
        self._buffer.append(offset | ACK)
        self._live -= 1
        self._dead += 2

    def acked_many(self, offsets: list[int]) -> None:
        """`acked` of each of `offsets`."""
        if not offsets:
            return
        if not self._buffer:
            self._dirty.add(self)
        self._buffer.extend(map(ACK.__or__, offsets))
        self._live -= len(offsets)
        self._dead += 2 * len(offsets)

    def wants_compaction(self) -> bool:
        return self._dead >= COMPACT_DEAD_MIN and self._dead >= COMPACT_RATIO * self._live

    def request_compaction(self) -> None:
        """Rewrite the file with the queue's live messages at the start of the next round
        (tests call it; otherwise `prepare_sync` decides by the dead-entry count)."""
        self._compact = True
        self._dirty.add(self)

    def prepare_sync(self) -> JournalWork:
        """At the start of a sync round: take the buffer, encoded, for the fsync thread to
        append to the descriptor and fdatasync; when compacting, instead the action that
        writes and syncs the replacement file on that thread."""
        compact = self._compact or self.wants_compaction()
        if not compact or self.live_source is None:
            data = b""
            if self._buffer or self._header:
                block = encode_block(self._buffer) if self._buffer else b""
                data = self._header + block
                self._header = b""
                self._buffer = array("Q")
            return JournalWork(self._fd, None, data)
        # Compaction. The snapshot (a C-level sort and dict copy here) includes everything
        # recorded so far, so the new file replaces the buffer too; encoding and writing it
        # happen on the fsync thread. Later entries go to the new file: they are written
        # by the next round's prepare, which cannot run before this round is over.
        offsets, counts = self.live_source()
        self._compact = False
        self._header = b""
        self._buffer = array("Q")
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        os.close(self._fd)
        self._fd = fd
        self._live = len(offsets)
        self._dead = len(counts)
        work = os.dup(fd)
        return JournalWork(None, lambda: self._replace(work, tmp, offsets, counts), b"")

    def _replace(self, fd: int, tmp: str, offsets: list[int], counts: dict[int, int]) -> None:
        """Runs on the fsync thread: write the snapshot, fsync, rename, fsync directory.

        Raises OutOfSpace, with `fd` kept open and nothing renamed, when the file system
        has no room for the snapshot: the round runs this again later, before any entry
        is written to the new file."""
        try:
            os.ftruncate(fd, 0)  # a run after a full disk starts the snapshot again
            append_all(fd, encode_live(offsets, counts))
        except OutOfSpace:
            raise
        except BaseException:
            os.close(fd)
            raise
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with self._lock:
            if self._fd >= 0:
                os.replace(tmp, self.path)
        fsync_directory(os.path.dirname(self.path))

    def close(self) -> None:
        """Close the file; what was not prepared for a sync round is lost (call after the
        last round)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
