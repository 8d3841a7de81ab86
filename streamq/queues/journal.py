"""A durable classic queue's journal: which log offsets it holds, delivered and acked.

Owns one file per durable queue. The vhost log holds message contents once for every
queue; this file says which of its offsets belong to this queue and what happened to
them, so that a restart rebuilds the queue exactly: its messages in publish order, the
redelivered flag and delivery count of those delivered before, and never an acked one.
It records runs of consecutive offsets, as the queue holds them, so that its size and a
restart cost O(runs), not O(messages): a queue fed by one publisher and consumed in
order writes a few entries per read, and restarting it reads nothing from the log.

File layout (little-endian): a 16-byte header, then blocks, one per sync round:

    header: magic b"SQQJ" | u16 version (4) | u16 reserved | u64 reserved
    block:  u32 entry count | u32 crc32c(entries) | entries, 24 bytes each
    entry:  u64 first offset (bits 0-47) | flags (bits 48-55) | kind (bits 56-63)
            u64 count | u64 value

kind 1 ENQUEUE: the queue holds `count` offsets from `first` on, whose bodies total
`value` bytes (flag 1: some carry their own expiration); kind 2 ACK: the queue is done
with them (acked, rejected, expired, purged), bodies totalling `value` bytes; kind 3
DELIVER: they went out, `value` deliveries so far each; kind 4 DEAD: they were
dead-lettered by a queue with at-least-once dead-lettering and are held until every
target has them (an ACK ends that), `value` being the death (`dead_mark`: the reason's
code in bits 56-63, the time in seconds below). Consecutive entries of one kind that
continue each other (and, for DELIVER and DEAD, carry the same value) merge in memory
before they are written. The bytes totals
make the queue's byte count exact after a restart without reading the messages (a
purge may put its whole total on its first entry: only sums matter).

Version 3 files (the same entries, without DEAD) are read as they are and rewritten in
version 4 when loaded. Version 2 files (8-byte entries, one per message and event) are
still read; their byte total is inexact, so the vhost counts it from the log and
`rewrite`s them in version 4.

Durability: entries are buffered in memory; `prepare_sync` writes them to the OS and the
vhost log's sync round fdatasyncs the file (this object is one of the log's sync
companions), so an entry is durable after a round that began after it was recorded.
A compaction replaces the file with the live entries only (write temp, fsync, rename,
fsync directory), on the Syncer thread as part of a round.

Loading trusts nothing past the log: entries for offsets at or past the log's end after
recovery are discarded (a torn tail may give those offsets to new messages), and so are
entries below its start (segments already dropped); the byte total is then marked
inexact, and the vhost counts it from the log. It does no routing and knows no AMQP.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import threading
from array import array
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final, NamedTuple

from streamq.log import files
from streamq.log._records import crc32c
from streamq.log.errors import OutOfSpace
from streamq.log.files import append_all, fsync_directory, write_file_atomic
from streamq.log.versions import refuse_newer
from streamq.queues.runs import RunSet

MAGIC: Final = b"SQQJ"
VERSION: Final = 4
VERSION_RUNS: Final = 3  # the same entries, before DEAD
VERSION_ENTRIES: Final = 2  # the previous layout, one 8-byte entry per message and event
HEADER: Final = struct.Struct("<4sHHQ")
BLOCK: Final = struct.Struct("<II")
WORDS: Final = 3  # u64 words per entry
ENTRY_BYTES: Final = 8 * WORDS
BLOCK_ENTRIES_MAX: Final = 1 << 20  # a longer block is corruption, not a torn write
OFFSET_BITS: Final = 48
OFFSET_MASK: Final = (1 << OFFSET_BITS) - 1
FLAGS_SHIFT: Final = 48
KIND_SHIFT: Final = 56
ENQUEUE: Final = 1
ACK: Final = 2
DELIVER: Final = 3
DEAD: Final = 4
FLAG_EXPIRING: Final = 1  # on ENQUEUE: some of the messages carry their own expiration
_ENQUEUE_WORD: Final = ENQUEUE << KIND_SHIFT
_ACK_WORD: Final = ACK << KIND_SHIFT
_DELIVER_WORD: Final = DELIVER << KIND_SHIFT
_DEAD_WORD: Final = DEAD << KIND_SHIFT
# DEAD's value: the reason of the death in the top byte, its time (epoch s) below.
DEAD_REASONS: Final = ("expired", "rejected", "delivery_limit", "maxlen")
_DEAD_REASON_SHIFT: Final = 56
_DEAD_TIME_MASK: Final = (1 << _DEAD_REASON_SHIFT) - 1
_HEAD_MASK: Final = ~OFFSET_MASK & ((1 << 64) - 1)  # kind and flags of a first word
# Version 2 entries: u64 = offset (bits 0-47) | kind (bits 48-49) | count (bits 50-63),
# kind 1 ENQUEUE, 2 DELIVER, 3 ACK.
_V2_KIND_MASK: Final = 3 << OFFSET_BITS
_V2_COUNT_SHIFT: Final = 50
# Compact when the entries written since the last compaction outnumber the live ones
# this many times over, and there are at least COMPACT_ENTRIES_MIN of them (so that small
# queues do not rewrite their file often).
COMPACT_RATIO: Final = 4
COMPACT_ENTRIES_MIN: Final = 65536
_LITTLE: Final = sys.byteorder == "little"

logger = logging.getLogger(__name__)


class JournalCorrupted(Exception):
    """An entry before the last one fails its CRC, or the header is wrong."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"queue journal {path} is corrupt at byte {position}: {reason}")
        self.path = path
        self.position = position


def encode_header() -> bytes:
    return HEADER.pack(MAGIC, VERSION, 0, 0)


def encode_block(words: array[int]) -> bytes:
    if not _LITTLE:
        words = array("Q", words)
        words.byteswap()
    payload = words.tobytes()
    return BLOCK.pack(len(words) // WORDS, crc32c(payload)) + payload


def dead_mark(reason: str, time_s: int) -> int:
    """A DEAD entry's value for a death of `reason` (one of DEAD_REASONS) at `time_s`."""
    return ((DEAD_REASONS.index(reason) + 1) << _DEAD_REASON_SHIFT) | (time_s & _DEAD_TIME_MASK)


def dead_of(mark: int) -> tuple[str, int]:
    """(reason, time_s) of a DEAD entry's value; an unknown reason code reads "rejected"."""
    code = mark >> _DEAD_REASON_SHIFT
    reason = DEAD_REASONS[code - 1] if 1 <= code <= len(DEAD_REASONS) else "rejected"
    return reason, mark & _DEAD_TIME_MASK


def encode_live(
    runs: list[tuple[int, int]],
    counts: dict[int, int],
    size_bytes: int,
    expiring: bool,
    dead: Mapping[int, int] | None = None,
) -> bytes:
    """The whole file for a queue holding `runs` (sorted) whose bodies total
    `size_bytes`, `counts` giving the delivery count of those delivered before and
    `dead` the marks of those held as dead letters: header, then one block of ENQUEUE
    (and DELIVER, DEAD) entries."""
    words = array("Q")
    head = _ENQUEUE_WORD | ((FLAG_EXPIRING if expiring else 0) << FLAGS_SHIFT)
    for first, count in runs:
        words.extend((head | first, count, size_bytes))
        size_bytes = 0
    for offset in sorted(counts):
        if counts[offset]:
            words.extend((_DELIVER_WORD | offset, 1, counts[offset]))
    for offset in sorted(dead or ()):
        words.extend((_DEAD_WORD | offset, 1, (dead or {})[offset]))
    return encode_header() + (encode_block(words) if words else b"")


class JournalWork(NamedTuple):
    """What one sync round does for a journal (see `QueueJournal.prepare_sync`)."""

    fd: int | None  # to append `data` to (on the fsync thread), then fdatasync
    action: Callable[[], None] | None  # a compaction: writes and syncs the new file
    data: bytes


_NO_DEAD: Final[Mapping[int, int]] = MappingProxyType({})


class LiveSnapshot(NamedTuple):
    """What a queue holds, for a compaction."""

    runs: list[tuple[int, int]]  # sorted
    counts: dict[int, int]  # delivery counts of those delivered before
    size_bytes: int
    expiring: bool  # some may carry their own expiration
    dead: Mapping[int, int]  # the marks of those held as dead letters (`dead_mark`)


class Replay(NamedTuple):
    runs: list[tuple[int, int]]  # the offsets held, as sorted (first, count) runs
    counts: dict[int, int]  # delivery counts of the held offsets delivered before
    size_bytes: int  # the bodies held, in total
    size_exact: bool  # False: entries were discarded, count the bytes from the log
    expiring: bool  # some held message may carry its own expiration
    entries: int  # how many entries the file held, valid ones
    valid_bytes: int  # the file up to the last valid entry
    discarded: int  # entries outside the log's range
    version: int
    dead: Mapping[int, int] = _NO_DEAD  # held offsets dead-lettered and held, their marks

    @property
    def message_count(self) -> int:
        return sum(count for _, count in self.runs)


def replay(path: str, data: bytes, log_start: int, log_next: int) -> Replay:
    """Decode a journal file's bytes. A torn last block ends the replay; a bad block
    followed by more bytes raises JournalCorrupted."""
    if len(data) < HEADER.size:
        # Created, header not yet durable: an empty queue.
        return Replay([], {}, 0, True, False, 0, 0, 0, VERSION)
    magic, version, _, _ = HEADER.unpack_from(data, 0)
    if magic == MAGIC:
        refuse_newer(path, "queue journal", version, VERSION)
    if magic != MAGIC or version not in (VERSION, VERSION_RUNS, VERSION_ENTRIES):
        raise JournalCorrupted(path, 0, f"bad header {magic!r} version {version}")
    state: _V3State | _V2State
    if version == VERSION_ENTRIES:
        state = _V2State(log_start, log_next)
    else:
        state = _V3State(log_start, log_next, dead_allowed=version == VERSION)
    entry_bytes = 8 if version == VERSION_ENTRIES else ENTRY_BYTES
    position = HEADER.size
    entries = 0
    while position + BLOCK.size <= len(data):
        count, crc = BLOCK.unpack_from(data, position)
        start = position + BLOCK.size
        end = start + count * entry_bytes
        if count > BLOCK_ENTRIES_MAX or end > len(data) or crc32c(data[start:end]) != crc:
            if end < len(data) and count <= BLOCK_ENTRIES_MAX:
                raise JournalCorrupted(path, position, "block fails its checksum")
            break  # a torn last block
        values = array("Q", data[start:end])
        if not _LITTLE:
            values.byteswap()
        reason = state.apply(values)
        if reason is not None:
            raise JournalCorrupted(path, position, reason)
        entries += count
        position = end
    return state.result(entries, position, version)


class _V3State:
    """Replay of version 3 and 4 entries: runs in, runs out."""

    def __init__(self, log_start: int, log_next: int, *, dead_allowed: bool) -> None:
        self.dead_allowed = dead_allowed
        self.dead: dict[int, int] = {}  # offsets held as dead letters: their marks
        self.log_start = log_start
        self.log_next = log_next
        self.live = RunSet()
        self.delivered = RunSet()  # delivered once, live or not yet known to be gone
        self.counts: dict[int, int] = {}  # delivered more than once
        self.size_bytes = 0
        self.discarded = 0
        self.expiring = False

    def apply(self, words: array[int]) -> str | None:
        live, delivered, counts = self.live, self.delivered, self.counts
        for i in range(0, len(words), WORDS):
            head, count, value = words[i], words[i + 1], words[i + 2]
            first = head & OFFSET_MASK
            kind = head >> KIND_SHIFT
            end = min(first + count, self.log_next)
            start = max(first, self.log_start)
            if start > first or end < first + count:
                self.discarded += 1
            if kind == ENQUEUE:
                if end > start:
                    live.append_run(start, end - start)
                self.size_bytes += value
                if (head >> FLAGS_SHIFT) & FLAG_EXPIRING:
                    self.expiring = True
            elif kind == ACK:
                if end > start:
                    live.remove_run(start, end - start)
                    delivered.remove_run(start, end - start)
                    if counts:
                        for offset in range(start, end):
                            counts.pop(offset, None)
                    if self.dead:
                        _forget(self.dead, start, end)
                self.size_bytes -= value
            elif kind == DELIVER:
                if end <= start:
                    continue
                if value <= 1:
                    delivered.append_run(start, end - start)
                else:
                    for offset in range(start, end):
                        counts[offset] = value
            elif kind == DEAD and self.dead_allowed:
                for offset in range(start, end):
                    self.dead[offset] = value
            else:
                return f"entry of unknown kind {kind}"
        return None

    def result(self, entries: int, valid_bytes: int, version: int) -> Replay:
        live = self.live
        counts = {o: c for o, c in self.counts.items() if o in live}
        for first, count in self.delivered.runs():
            for offset in range(first, first + count):
                if offset in live and offset not in counts:
                    counts[offset] = 1
        return Replay(
            live.runs(),
            counts,
            self.size_bytes,
            not self.discarded,
            self.expiring,
            entries,
            valid_bytes,
            self.discarded,
            version,
            {o: mark for o, mark in self.dead.items() if o in live},
        )


def _forget(dead: dict[int, int], start: int, end: int) -> None:
    """Remove the offsets `start` .. `end - 1` from `dead`, walking the smaller side."""
    if len(dead) < end - start:
        for offset in [o for o in dead if start <= o < end]:
            del dead[offset]
    else:
        for offset in range(start, end):
            dead.pop(offset, None)


class _V2State:
    """Replay of version 2 entries (one per message and event); sizes were not kept."""

    def __init__(self, log_start: int, log_next: int) -> None:
        self.log_start = log_start
        self.log_next = log_next
        self.counts: dict[int, int] = {}
        self.discarded = 0

    def apply(self, values: array[int]) -> str | None:
        counts = self.counts
        for value in values:
            offset = value & OFFSET_MASK
            if not self.log_start <= offset < self.log_next:
                self.discarded += 1
                continue
            kind = value & _V2_KIND_MASK
            if kind == 1 << OFFSET_BITS:
                counts[offset] = 0
            elif kind == 2 << OFFSET_BITS:
                if offset in counts:
                    counts[offset] = value >> _V2_COUNT_SHIFT
            elif kind == 3 << OFFSET_BITS:
                counts.pop(offset, None)
            else:
                return f"entry of unknown kind {value:#x}"
        return None

    def result(self, entries: int, valid_bytes: int, version: int) -> Replay:
        live = RunSet()
        for offset in sorted(self.counts):
            live.append_run(offset, 1)
        delivered = {o: c for o, c in self.counts.items() if c}
        return Replay(
            live.runs(), delivered, 0, False, True, entries, valid_bytes, self.discarded, version
        )


def _rewrite_or_defer(path: str, live: bytes, valid_bytes: int, size: int) -> bool:
    """Start-up: replace the journal at `path` with `live`. On a full disk, returns False
    instead, with the file cut back to its `valid_bytes` (a torn last block goes; cutting
    needs no room) and otherwise as it was, for the caller to compact it in a sync round,
    which the log holds and retries until there is room: a restart on a full disk keeps
    every queue (the file is read as before by a restart meanwhile)."""
    try:
        write_file_atomic(path, live, fsync_dir=True)
    except OSError as exc:
        if not files.is_out_of_space(exc):
            raise
        if os.path.exists(path + ".tmp"):
            files.remove(path + ".tmp")
        if valid_bytes < size:
            fd = files.open_fd(path, os.O_WRONLY)
            try:
                files.ftruncate(fd, valid_bytes)
                os.fsync(fd)
            finally:
                files.close_fd(fd)
        logger.warning(
            "queue journal %s: no room to rewrite it at start-up (%s); read as it is, "
            "compacted by the first sync round that finds room",
            path,
            exc,
        )
        return False
    return True


class QueueJournal:
    """The open journal of one durable queue; used from the event-loop thread only."""

    __slots__ = (
        "_buffer",
        "_compact",
        "_dirty",
        "_entries",
        "_fd",
        "_header",
        "_lock",
        "live_entries",
        "live_source",
        "path",
    )

    def __init__(self, path: str, fd: int, entries: int, dirty: set[QueueJournal]) -> None:
        self.path = path
        self._fd = fd
        self._header = b""  # a new file's header, written with its first block
        self._buffer: array[int] = array("Q")
        self._entries = entries  # in the file and the buffer, since the last compaction
        self._compact = False
        # The journals with something to write: the vhost's sync companion drains it.
        self._dirty = dirty
        # What the queue holds now, for a compaction (the queue's cursor sets both): the
        # snapshot, and a cheap estimate of how many entries it would take.
        self.live_source: Callable[[], LiveSnapshot] | None = None
        self.live_entries: Callable[[], int] = lambda: 0
        # Held by a compaction's rename (fsync thread) and by `close` (event loop), so
        # that a queue deleted meanwhile does not get its file back.
        self._lock = threading.Lock()

    @classmethod
    def create(cls, path: str, dirty: set[QueueJournal]) -> QueueJournal:
        """A new, empty journal. Buffered: the file and its header are durable after the
        next sync round and a directory fsync (the vhost adds one)."""
        fd = files.open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        journal = cls(path, fd, 0, dirty)
        journal._header = encode_header()
        dirty.add(journal)
        return journal

    @classmethod
    def load(
        cls, path: str, log_start: int, log_next: int, dirty: set[QueueJournal]
    ) -> tuple[QueueJournal, Replay]:
        """Open an existing journal and return what the queue holds.

        If the file held anything beyond its live entries that must not be read again
        (discarded or torn entries, an older version, or enough dead entries), it is
        rewritten with its live entries first; this fsyncs the file and directory
        before returning (start-up only). A file whose byte total is inexact is
        rewritten by the caller once it has counted them (`rewrite`). Raises
        JournalCorrupted and OSError.
        """
        with open(path, "rb") as file:
            data = file.read()
        result = replay(path, data, log_start, log_next)
        live_entries = len(result.runs) + len(result.counts) + len(result.dead)
        deferred = False
        if result.size_exact and (
            result.valid_bytes != len(data)
            or result.entries > 2 * live_entries + 16
            or result.version != VERSION
        ):
            live = encode_live(
                result.runs, result.counts, result.size_bytes, result.expiring, result.dead
            )
            deferred = not _rewrite_or_defer(path, live, result.valid_bytes, len(data))
            if not deferred:
                result = result._replace(entries=live_entries)
        fd = files.open_fd(path, os.O_WRONLY | os.O_APPEND)
        journal = cls(path, fd, result.entries, dirty)
        if deferred:
            journal.request_compaction()
        return journal, result

    def rewrite(self, replayed: Replay, size_bytes: int, expiring: bool) -> None:
        """Start-up, after a load whose byte total was inexact: replace the file with the
        live entries and the byte total counted from the log (fsyncs file and dir).
        On a full disk the file stays as it is and the first sync round compacts it
        instead (held and retried by the log until there is room)."""
        live = encode_live(replayed.runs, replayed.counts, size_bytes, expiring, replayed.dead)
        size = os.fstat(self._fd).st_size
        if not _rewrite_or_defer(self.path, live, size, size):
            self.request_compaction()
            return
        files.close_fd(self._fd)
        self._fd = files.open_fd(self.path, os.O_WRONLY | os.O_APPEND)
        self._entries = len(replayed.runs) + len(replayed.counts) + len(replayed.dead)

    def _append(self, word: int, count: int, value: int, merge: bool) -> None:
        """One entry; merged into the previous one when it continues it."""
        buffer = self._buffer
        if not buffer:
            self._dirty.add(self)
        elif (
            merge
            and buffer[-3] & _HEAD_MASK == word & _HEAD_MASK
            and (buffer[-3] & OFFSET_MASK) + buffer[-2] == word & OFFSET_MASK
            and (value == buffer[-1] if word >> KIND_SHIFT in (DELIVER, DEAD) else True)
        ):
            buffer[-2] += count
            if word >> KIND_SHIFT not in (DELIVER, DEAD):
                buffer[-1] += value
            return
        buffer.extend((word, count, value))
        self._entries += 1

    def enqueued_run(self, first: int, count: int, size_bytes: int, expiring: bool = False) -> None:
        """The queue holds `count` new offsets from `first` on, bodies of `size_bytes`."""
        word = first | _ENQUEUE_WORD | ((FLAG_EXPIRING << FLAGS_SHIFT) if expiring else 0)
        self._append(word, count, size_bytes, True)

    def delivered_run(self, first: int, count: int, deliveries: int) -> None:
        """The `count` offsets from `first` on went out; `deliveries` so far each."""
        self._append(first | _DELIVER_WORD, count, deliveries, True)

    def dead_run(self, first: int, count: int, mark: int) -> None:
        """The `count` offsets from `first` on were dead-lettered (`dead_mark`) and are
        held until an ACK releases them."""
        self._append(first | _DEAD_WORD, count, mark, True)

    def acked_run(self, first: int, count: int, size_bytes: int) -> None:
        """The queue is done with the `count` offsets from `first` on (bodies of
        `size_bytes` in total)."""
        self._append(first | _ACK_WORD, count, size_bytes, True)

    def wants_compaction(self) -> bool:
        entries = self._entries
        return entries >= COMPACT_ENTRIES_MIN and entries >= COMPACT_RATIO * max(
            self.live_entries(), 1
        )

    def request_compaction(self) -> None:
        """Rewrite the file with the queue's live messages at the start of the next round
        (tests call it; otherwise `prepare_sync` decides by the entry count)."""
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
        # Compaction. The snapshot includes everything recorded so far, so the new file
        # replaces the buffer too; encoding and writing it happen on the fsync thread.
        # Later entries go to the new file: they are written by the next round's
        # prepare, which cannot run before this round is over.
        runs, counts, size_bytes, expiring, dead = self.live_source()
        self._compact = False
        self._header = b""
        self._buffer = array("Q")
        tmp = self.path + ".tmp"
        fd = files.open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        files.close_fd(self._fd)
        self._fd = fd
        self._entries = len(runs) + len(counts) + len(dead)
        work = files.dup_fd(fd)
        data = encode_live(runs, counts, size_bytes, expiring, dead)
        return JournalWork(None, lambda: self._replace(work, tmp, data), b"")

    def _replace(self, fd: int, tmp: str, data: bytes) -> None:
        """Runs on the fsync thread: write the snapshot, fsync, rename, fsync directory.

        Raises OutOfSpace, with `fd` kept open and nothing renamed, when the file system
        has no room for the snapshot: the round runs this again later, before any entry
        is written to the new file."""
        try:
            files.ftruncate(fd, 0)  # a run after a full disk starts the snapshot again
            append_all(fd, data)
        except OutOfSpace:
            raise
        except BaseException:
            files.close_fd(fd)
            raise
        try:
            os.fsync(fd)
        finally:
            files.close_fd(fd)
        with self._lock:
            if self._fd >= 0:
                files.replace(tmp, self.path)
        fsync_directory(os.path.dirname(self.path))

    def close(self) -> None:
        """Close the file; what was not prepared for a sync round is lost (call after the
        last round)."""
        with self._lock:
            if self._fd >= 0:
                files.close_fd(self._fd)
                self._fd = -1
