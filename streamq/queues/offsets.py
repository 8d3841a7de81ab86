"""Broker-side offset tracking of a stream: the stored offset of each named consumer.

Owns the rule of what is stored: the highest offset that the consumer acked together
with every offset before it (`AckWatermark`), not its read position, so that a crash never
skips a message the consumer had not acked (LavinMQ stores the read position and does). A
consumer that reconnects with the same tag resumes after it. Owns, too, when a stored
offset is written: the file itself, its format, recovery and failed writes, is
`offset_file`'s.

Durability: `store` is buffered. The stream log's sync rounds write the offsets stored
before them (this store is a sync companion of the log); and a store starts such a round
itself at most STORE_SYNC_DELAY_S after it, so that an offset is durable within that
delay plus the rounds it waits for, whether or not the stream receives messages. A write
that fails is held and retried (see `offset_file`), the newest offset of each tag winning.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Final

from streamq.log import files
from streamq.log.errors import LogClosed, LogError, OutOfSpace
from streamq.log.files import fsync_directory
from streamq.log.log import CompanionWork, SegmentLog
from streamq.queues.offset_file import (
    COMPACT_RECORDS_MIN,
    HEADER,
    Decoded,
    OffsetFile,
    OffsetsCorrupted,
    decode_file,
    encode_file,
)

# OffsetsCorrupted is offset_file's, named here too for the stream's other files.
__all__ = ["AckWatermark", "CompanionFile", "OffsetStore", "OffsetsCorrupted"]

logger = logging.getLogger(__name__)

# A stored offset's sync round starts at most this long after the store (docs/streams.md):
# soon enough that a quiet stream loses no ack to a crash, late enough that a consumer
# acking all the time costs a stream at most 1 / STORE_SYNC_DELAY_S rounds a second.
STORE_SYNC_DELAY_S: Final = 0.2
# Retries of a write that failed (the log retries one that found no room on its own).
RETRY_S_MAX: Final = 1.0
NO_WORK: Final = CompanionWork(())


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


class CompanionFile:
    """An append-only file that a stream log's sync companion writes, replaced whole when
    compacted (a temp file, fdatasynced by the round, then renamed into place): the
    publishers file (`publishers`)."""

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


class OffsetStore:
    """The stored offsets of one stream; the event-loop thread only (its file's writes
    run on the Syncer thread). Open with `open`, then `attach` to the stream's log."""

    def __init__(self, path: str, offsets: dict[str, int], file: OffsetFile) -> None:
        self.path = path
        self._offsets = offsets
        self._pending: dict[str, int] = {}  # stored since the last round took them
        self._pending_since_s = 0.0  # time.monotonic() of the oldest of them
        self._file = file
        self._log: SegmentLog | None = None
        self._flush: asyncio.TimerHandle | asyncio.Task[None] | None = None
        self._retry_s = STORE_SYNC_DELAY_S
        self._closed = False

    @classmethod
    def open(cls, path: str) -> OffsetStore:
        """Open or create. A torn tail is cut off, damage skipped (both logged, see
        `offset_file.decode_file`), and a damaged or bloated file replaced (fsyncs file
        and directory before returning). Needs no free space: on a full disk the file is
        repaired, or created, by its first write. Raises OffsetsCorrupted (a version this
        code does not know) and OSError."""
        try:
            with open(path, "rb") as file:
                data: bytes | None = file.read()
        except FileNotFoundError:
            data = None
        decoded = decode_file(path, data or b"")
        offsets = decoded.offsets
        fd, replace_whole = _open_for_appends(path, decoded, data)
        records = len(offsets) if replace_whole else decoded.records
        return cls(path, offsets, OffsetFile(path, fd, offsets, records, replace_whole))

    def attach(self, log: SegmentLog) -> None:
        """Write with `log`'s sync rounds, and start rounds of it for stores."""
        self._log = log
        log.add_sync_companion(self.prepare_sync)

    def get(self, tag: str) -> int | None:
        return self._offsets.get(tag)

    def store(self, tag: str, offset: int) -> None:
        """Buffered: durable after the stream log's next sync round, which starts at most
        STORE_SYNC_DELAY_S from now."""
        self._offsets[tag] = offset
        pending = self._pending
        if not pending:
            # The oldest store no round has taken: one clock read per round at most.
            self._pending_since_s = time.monotonic()
        pending[tag] = offset
        if self._flush is None and self._log is not None:
            self._schedule_flush(STORE_SYNC_DELAY_S)

    def prepare_sync(self) -> CompanionWork:
        """The stream log's sync companion: hand what was stored since the last round,
        and what a failed write holds, to the round's action."""
        if not self._pending and not self._file.action_due:
            return NO_WORK
        pending, self._pending = self._pending, {}
        action = self._file.hand_over(pending)
        return NO_WORK if action is None else CompanionWork((), (action,))

    def settled(self) -> bool:
        """Every stored offset is durable."""
        return not self._pending and self._file.settled()

    def close(self) -> None:
        self._closed = True
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self._file.close()

    # -- the rounds a store starts ---------------------------------------------------

    def _schedule_flush(self, delay_s: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop (offline tools): the next round writes them
        self._flush = loop.call_later(delay_s, self._start_flush)

    def _start_flush(self) -> None:
        """A delay is over. Start a round if some store is STORE_SYNC_DELAY_S old and no
        round took it (the stream's appends start rounds that take them: a busy stream
        needs none of its own), or a failed write waits; else look again when one can
        be due."""
        self._flush = None
        if self._closed:
            return
        if self._pending:
            age_s = time.monotonic() - self._pending_since_s
            if age_s < STORE_SYNC_DELAY_S:
                self._schedule_flush(STORE_SYNC_DELAY_S - age_s)
                return
        elif not self._file.action_due:
            if not self._file.settled():
                self._schedule_flush(STORE_SYNC_DELAY_S)  # a round has them in hand
            else:
                self._retry_s = STORE_SYNC_DELAY_S
            return
        self._flush = asyncio.get_running_loop().create_task(self._sync())

    async def _sync(self) -> None:
        """A sync round of the log with this store's writes; then, unless they are all
        durable, another: when the offsets stored meanwhile are due, or backing off up to
        RETRY_S_MAX while writes fail. Nothing it raises is left for
        "Task exception was never retrieved": what it does not expect is logged."""
        log = self._log
        assert log is not None
        failed = False
        try:
            await log.sync_companions()
        except OutOfSpace:
            failed = True  # held: the log says so, blocks publishers and retries too
        except LogClosed:
            return
        except LogError as exc:
            logger.error("offsets %s: not written, the stream's log failed: %s", self.path, exc)
            return
        except Exception:
            logger.exception("offsets %s: sync round failed", self.path)
            failed = True
        finally:
            self._flush = None
        if self._closed or self.settled():
            self._retry_s = STORE_SYNC_DELAY_S
        elif failed or self._file.failing:
            self._schedule_flush(self._retry_s)
            self._retry_s = min(self._retry_s * 2, RETRY_S_MAX)
        else:
            self._retry_s = STORE_SYNC_DELAY_S
            self._start_flush()  # offsets stored during the round: due when they are


def _open_for_appends(path: str, decoded: Decoded, data: bytes | None) -> tuple[int, bool]:
    """The descriptor to append to the file `path` with, or -1 when the first write must
    create it; and whether that write must replace the whole file first.

    A torn tail is cut off (which needs no room). A missing, damaged or bloated file is
    replaced now (fsyncs file and directory); on a full disk, by the first write."""
    if data is not None and not decoded.damaged and decoded.valid_bytes >= HEADER.size:
        fd = files.open_fd(path, os.O_WRONLY | os.O_APPEND)
        if decoded.valid_bytes < len(data):
            files.ftruncate(fd, decoded.valid_bytes)
            os.fsync(fd)
        return fd, decoded.records > len(decoded.offsets) + COMPACT_RECORDS_MIN
    try:
        files.write_file_atomic(path, encode_file(decoded.offsets), fsync_dir=True)
    except OutOfSpace as exc:
        logger.error("offsets file %s: not written at open (%s); its first write will", path, exc)
        if data is None:
            return -1, True
        return files.open_fd(path, os.O_WRONLY | os.O_APPEND), True
    return files.open_fd(path, os.O_WRONLY | os.O_APPEND), False
