"""The segment log: append, group-committed sync, read, seek and head drops.

Owns one log directory (see `format` for its layout) for one writer. It is used from a
single thread, the broker's event loop; segment writes (see `writer`) and fsync work run
on the `Syncer` thread, in the order they were handed over, never on the caller's.
Readers see only the durable part of the log: records below `durable_next`.

Durability: `append` is buffered, and durable after a `sync()` (or `sync_blocking()`) that
began after it returned. `sync` group-commits: one round of fdatasync calls covers every
append made before the round began, whoever asked.

A log that meets an I/O error, or corrupt data in the segment being written, is failed:
every later call raises LogFailed. A full disk is not such an error: a write that finds no
room before anything of it was fsynced is cut back and retried, in order, until there is
room (see `space`); meanwhile `out_of_space` is true, the Syncer lists the log among those
waiting for room, and `sync` waits, so that nothing is reported durable early. A failed
fsync still fails the log. A damaged record (bit rot) is lost alone: readers pass over
it (`damage`, `resolve_damage`) and `damage` reports it. Other logs are not affected.

`SegmentLog` is its state (`state.LogState`) with a part per path, each in its module:
`appender` (append, segment rolls, writes handed to the Syncer), `commit` (sync rounds,
the wait for disk space) and `reader` (read, seek, lookups). This module opens the log,
keeps the recent buffers' memory in check, drops head segments, and closes the log. The
parts are classes over one shared state rather than objects of their own because the
append and read paths run per message: they read the state directly, with no call or
attribute hop added between the caller and it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os

from streamq.heap import return_freed_memory
from streamq.log import files, frame
from streamq.log import format as fmt
from streamq.log.appender import LogAppender, RunMessage
from streamq.log.chunk_appender import ChunkAppender
from streamq.log.commit import LogCommit
from streamq.log.config import MIB, LogConfig
from streamq.log.errors import LogError, fenced
from streamq.log.reader import LogReader
from streamq.log.recent import IDLE_RELEASE_S
from streamq.log.recovery import create_segment, recover
from streamq.log.rounds import NO_COMPANION_WORK, CompanionWork
from streamq.log.segment import Segment, SegmentInfo
from streamq.log.space import close_batches
from streamq.log.state import LogState
from streamq.log.syncer import Syncer

__all__ = [  # what the rest of the code base imports from here
    "MIB",
    "NO_COMPANION_WORK",
    "CompanionWork",
    "LogConfig",
    "RunMessage",
    "SegmentInfo",
    "SegmentLog",
]

logger = logging.getLogger(__name__)


class SegmentLog(LogAppender, ChunkAppender, LogCommit, LogReader, LogState):
    """An append-only log of messages in a directory of segments. Open with `open()`."""

    @classmethod
    def open(
        cls, directory: str, config: LogConfig | None = None, syncer: Syncer | None = None
    ) -> SegmentLog:
        """Open or create the log in `directory`, recovering a torn tail.

        Blocks on fsync: call it before serving, or from a worker thread. Every repair is
        durable before it returns. Raises SegmentCorrupted for damage a crash cannot
        explain (the caller fails this log only).
        """
        config = config or LogConfig()
        recovered = recover(directory, config.index_interval_bytes, config.format_version)
        segments = recovered.segments
        if config.format_version == frame.FORMAT_VERSION and segments[-1].version == 1:
            segments[-1] = _start_chunk_segment(directory, segments, config)
        log = cls(directory, config, syncer or Syncer(), segments)
        for span in recovered.damaged:
            log.damage.add(span, "at recovery")
        if log._active.version == 1 and config.format_version == frame.FORMAT_VERSION:
            # The version-1 active segment holds records: it is sealed (by the next
            # round), and appends go to a version-2 segment after it.
            log._seal_active(log._active.next_offset, log._active.size_bytes, frame.FORMAT_VERSION)
            log.sync_blocking()
        return log

    def limit_recent(self, bytes_max: int) -> None:
        """Keep at most `bytes_max` bytes of written buffers in memory (never more than
        `LogConfig.recent_bytes_max`); the broker sizes it from its memory watermark."""
        recent = self._recent
        recent.bytes_max = max(0, min(bytes_max, self.config.recent_bytes_max))
        recent.trim(recent.bytes_max, writes_parked=self._stalled.bytes != 0)

    @property
    def recent_bytes_max(self) -> int:
        """Written buffers kept in memory, at most (see `limit_recent`)."""
        return self._recent.bytes_max

    @property
    def recent_bytes(self) -> int:
        """The bytes of the buffers kept in memory, written or not."""
        return self._recent.bytes

    @property
    def recent_reads(self) -> int:
        """Reads served from the buffers kept in memory since the log was opened."""
        return self._recent.hits

    def release_recent_if_unread(self) -> int:
        """Drop the written buffers if no read used them since the last call (no reader
        near the tail); returns the bytes dropped. A timer calls it every
        `IDLE_RELEASE_S` while any buffer is kept."""
        if self._closed or self._failed is not None:
            return 0
        return self._recent.release_if_unread(writes_parked=self._stalled.bytes != 0)

    def _at_rest(self) -> None:
        """Neither appends nor reads near the tail for an idle period, and much was
        released: hand the freed memory back to the kernel (docs/perf.md, "Memory at
        rest")."""
        return_freed_memory()
        self._syncer.release_staging()

    def _arm_recent_release(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop (a tool, a blocking caller): kept up to the limit
        self._recent_timer = loop.call_later(IDLE_RELEASE_S, self._recent_release_due)

    def _recent_release_due(self) -> None:
        self._recent_timer = None
        self.release_recent_if_unread()
        if (len(self._recent) or self._recent.rest_owed) and not self._closed:
            self._arm_recent_release()

    # -- retention -----------------------------------------------------------------------

    def drop_segments_before(self, offset: int) -> int:
        """Delete the segments whose records are all below `offset`; never the active one,
        nor one not yet sealed. Returns how many were deleted.

        The files are unlinked now; the deletion is durable after the next sync round (a
        deletion lost in a crash is redone by the next retention pass).
        """
        self._check_usable()
        dropped = 0
        while len(self._segments) > 1:
            head = self._segments[0]
            if head.next_offset > offset or not head.sealed:
                break
            fd = self._read_fds.pop(head.base_offset, None)
            if fd is not None:
                os.close(fd)
            self._maps.pop(head.base_offset, None)
            files.remove(head.index_path)
            files.remove(head.path)
            del self._segments[0]
            del self._bases[0]
            dropped += 1
        if dropped:
            self._dir_dirty = True
            self._decoded.clear()  # chunks of dropped segments among them, maybe
            self._runs.clear()
        return dropped

    # -- close ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Sync what was appended, then release every file. Idempotent. A log out of
        space is closed without its unwritten appends (none of them was reported
        durable): waiting for room could hold a shutdown for ever."""
        if self._closed:
            return
        if self._space is not None:
            logger.warning(
                "log %s: closed out of disk space; %d appended bytes never written",
                self.directory,
                self._stalled.bytes + len(self._buffer),
            )
            self._closed = True  # before waking the waiters: they must not start rounds
            self._end_space_wait(resumed=False)
            self._buffer = bytearray()
            if self._inflight is not None:
                await asyncio.wait([self._inflight])
            self._release(wait=False)
            await self._writes_done()
        elif self._failed is None:
            try:
                await self.sync(companions=bool(self._companions))
            except LogError as exc:
                if not fenced(exc):
                    raise
                # The node stepped down: its last rounds are not ours to confirm, and
                # closing is all that is left to do.
            finally:
                self._release(cut_padding=True, wait=False)
                await self._writes_done()
        else:
            if self._inflight is not None:
                await asyncio.wait([self._inflight])
            self._release(wait=False)
            await self._writes_done()

    async def _writes_done(self) -> None:
        """Wait for the Syncer thread to finish what this log handed it."""
        done = self._writes_barrier()
        if done is not None:
            await asyncio.wrap_future(done)

    def _writes_barrier(self) -> concurrent.futures.Future[None] | None:
        """A future done once the Syncer thread has run everything handed to it so far;
        None when the Syncer was shut down, which it is only with all of it run."""
        try:
            return self._syncer.submit_write(lambda: None)
        except RuntimeError:
            return None

    def close_blocking(self) -> None:
        """`close()` for callers without an event loop."""
        if self._closed:
            return
        try:
            if self._failed is None:
                self.sync_blocking()
        except LogError as exc:
            if not fenced(exc):
                raise
        finally:
            self._release(cut_padding=True)

    def discard(self) -> None:
        """Close without syncing: the log is being deleted with its directory. A round in
        flight on the Syncer thread still uses the files (it fdatasyncs the segments and
        writes the durable offset): they are released once it is over, after its own
        completion (which closes the segments it sealed). Released at once, they made
        that completion close descriptors already closed and the round write to numbers
        another file may have reused."""
        if self._closed:
            return
        inflight = self._inflight
        if inflight is None:
            self._release(wait=False)
            return
        self._closed = True  # no new round; waiters see LogClosed
        inflight.add_done_callback(lambda _: self._release(wait=False))

    def _release(self, *, cut_padding: bool = False, wait: bool = True) -> None:
        """Close every file. The writer's file closes on the Syncer thread, after the writes
        queued there; with `wait`, this returns once it has. With `cut_padding` the active
        segment loses its padding (a clean close); without, it keeps it, as after a kill."""
        self._closed = True
        if self._recent_timer is not None:
            self._recent_timer.cancel()
            self._recent_timer = None
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        self._maps.clear()
        for segment in [*self._unsealed, self._active]:
            if segment.write_fd >= 0:
                files.close_fd(segment.write_fd)
                segment.write_fd = -1
        files.close_fd(self._durable_fd)
        close_batches(self._companions_left)
        self._companions_left = []
        self._submit_drop_stalled()  # a no-op unless writes wait for room
        self._finish_writer(self._active, cut_padding=cut_padding and self._failed is None)
        if wait and (done := self._writes_barrier()) is not None:
            done.result()

    def _submit_drop_stalled(self) -> None:
        """On the Syncer thread, after what was handed to it: forget the parked writes,
        closing the writers parked with them."""
        try:
            self._syncer.submit_write(self._stalled.drop)
        except RuntimeError:  # the Syncer was shut down: no thread to race with
            self._stalled.drop()


def _start_chunk_segment(directory: str, segments: list[Segment], config: LogConfig) -> Segment:
    """The log's newest segment when it is a version-1 segment without records and the
    log now writes version 2: replaced by an empty version-2 segment (same base and
    floor). One with records is kept (`SegmentLog.open` seals it)."""
    active = segments[-1]
    if active.record_count or active.size_bytes > fmt.SEGMENT_HEADER_BYTES:
        return active
    floor = max([0, *(s.last_timestamp_ms for s in segments[:-1])])
    with open(active.path, "rb") as file:
        floor = max(floor, fmt.decode_segment_floor(file.read(fmt.SEGMENT_HEADER_BYTES)))
    files.close_fd(active.write_fd)
    files.remove(active.path)
    new = create_segment(directory, active.base_offset, config.index_interval_bytes, floor,
                         version=frame.FORMAT_VERSION)  # fmt: skip
    os.fsync(new.write_fd)
    files.fsync_directory(directory)
    return new
