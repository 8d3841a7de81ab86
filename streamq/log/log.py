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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import struct
from array import array
from collections.abc import Callable, Sequence
from typing import Final

from streamq.heap import return_freed_memory
from streamq.log import files
from streamq.log import format as fmt
from streamq.log._records import encode_records as _encode_records
from streamq.log._streamwire import span_indexed as _span_indexed
from streamq.log.commit import LogCommit
from streamq.log.config import MIB, LogConfig
from streamq.log.errors import (
    LogError,
    OutOfSpace,
    RecordTooLarge,
    fenced,
)
from streamq.log.files import append_all
from streamq.log.reader import LogReader
from streamq.log.recent import IDLE_RELEASE_S
from streamq.log.recovery import create_segment, recover
from streamq.log.rounds import NO_COMPANION_WORK, CompanionWork
from streamq.log.segment import Segment, SegmentInfo
from streamq.log.space import (
    close_batches,
)
from streamq.log.state import LogState
from streamq.log.syncer import Syncer
from streamq.log.writer import SegmentWriter

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

_encode_record_parts: Final = fmt.encode_record_parts  # a global, not a module attribute
_RECORD_HEADER_BYTES: Final = fmt.RECORD_HEADER_BYTES
_TIMESTAMP: Final = struct.Struct("=q")  # an index timestamp as array("q") holds it
# `span_indexed` writes index entries as 4-byte native integers for array("I").
assert array("I").itemsize == 4, "array('I') items are not 4 bytes here"


# A message of a run given to `append_run`: its properties and body, then the publish's
# exchange, routing key and bits, which the log ignores (the gateway's tuples as they
# come from its frame scanner, so that no per-message tuple is built for the log).
RunMessage = tuple[bytes, bytes, str, str, int]


class SegmentLog(LogCommit, LogReader, LogState):
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
        recovered = recover(directory, config.index_interval_bytes)
        log = cls(directory, config, syncer or Syncer(), recovered.segments)
        for span in recovered.damaged:
            log.damage.add(span, "at recovery")
        return log

    # -- append --------------------------------------------------------------------------

    def append(self, messages: Sequence[fmt.Message], timestamp_ms: int) -> int:
        """Append a batch of messages and return the offset of the first one.

        Buffered; durable after a `sync()` that begins after this returns. Timestamps never
        decrease within a log: an earlier `timestamp_ms` is raised to the last one used.
        Raises RecordTooLarge (appending nothing) if a message exceeds `record_bytes_max`.
        """
        self._check_usable()
        cap = self.config.record_bytes_max
        for message in messages:
            if fmt.record_size(message) > cap:
                raise RecordTooLarge(f"record of {fmt.record_size(message)} bytes exceeds {cap}")
        timestamp_ms = max(timestamp_ms, self._last_timestamp_ms)
        self._last_timestamp_ms = timestamp_ms
        first = self._next_offset
        encode = fmt.encode_record
        place = self._place
        for message in messages:
            place(encode(self._next_offset, timestamp_ms, message), timestamp_ms)
        return first

    def append_one(
        self, exchange: bytes, routing_key: bytes, properties: bytes, body: bytes, timestamp_ms: int
    ) -> int:
        """`append` of one message, the publish hot path (no batch, no Message tuple).

        Buffered; durable after a `sync()` that begins after this returns. Raises
        RecordTooLarge, appending nothing.
        """
        if self._failed is not None or self._closed:
            self._check_usable()
        # Per message: comparisons rather than max(), one attribute read per field.
        if timestamp_ms < self._last_timestamp_ms:  # noqa: PLR1730 (max() is a call)
            timestamp_ms = self._last_timestamp_ms
        offset = self._next_offset
        record = _encode_record_parts(offset, timestamp_ms, exchange, routing_key, properties, body)
        size = len(record)
        if size > self._record_bytes_max:
            raise RecordTooLarge(f"record of {size} bytes exceeds {self._record_bytes_max}")
        self._last_timestamp_ms = timestamp_ms
        segment = self._active
        position = segment.size_bytes
        index = segment.index
        if (
            position + size > self._segment_bytes_max
            or position - index.last_position >= index.interval_bytes
            or segment.first_timestamp_ms < 0
        ):
            self._place(record, timestamp_ms)  # a roll, an index entry or a first record
            return offset
        # The common case of `_place`, inline: no roll, no index entry.
        buffer = self._buffer
        buffer += record
        segment.last_timestamp_ms = timestamp_ms
        segment.size_bytes = position + size
        segment.next_offset = self._next_offset = offset + 1
        if len(buffer) >= self._write_buffer_bytes_max:
            self._flush(segment)
        return offset

    def append_run(
        self,
        exchange: bytes,
        routing_key: bytes,
        messages: list[RunMessage],
        timestamp_ms: int,
    ) -> int:
        """`append_one` for every message of `messages` (items start with properties
        and body), all with one exchange, routing key and timestamp: the publish hot path
        for a run of publishes. Returns the first message's offset; the others follow it
        one by one.

        Buffered; durable after a `sync()` that begins after this returns. Raises
        RecordTooLarge at a record over `record_bytes_max`, the ones before it appended
        (the broker's message size cap keeps every record under it).
        """
        if self._failed is not None or self._closed:
            self._check_usable()
        if timestamp_ms < self._last_timestamp_ms:  # noqa: PLR1730 (max() is a call)
            timestamp_ms = self._last_timestamp_ms
        first = self._next_offset
        count = len(messages)
        done = 0
        while done < count:
            segment = self._active
            if len(self._buffer) >= self._write_buffer_bytes_max:
                self._flush(segment)
            buffer = self._buffer  # `_flush` and `_place` start a new one
            position = segment.size_bytes
            index = segment.index
            buffered = len(buffer)
            end = done
            room = self._segment_bytes_max - position
            if segment.first_timestamp_ms >= 0 and room > 0:
                if position - index.last_position >= index.interval_bytes:
                    # The next record starts an index interval: its entry, then the run
                    # goes on (the index then covers it even if `_place` writes it).
                    message = messages[done]
                    size = _RECORD_HEADER_BYTES + len(exchange) + len(routing_key)
                    if size + len(message[0]) + len(message[1]) <= room:
                        index.add(self._next_offset - segment.base_offset, position, timestamp_ms)
                # One C call encodes the records up to the next index entry, segment
                # roll or full write buffer; a record that does not fit takes `_place`.
                end = _encode_records(
                    buffer,
                    self._next_offset,
                    timestamp_ms,
                    exchange,
                    routing_key,
                    messages,
                    done,
                    max(index.last_position + index.interval_bytes - position, 0),
                    min(room, max(self._write_buffer_bytes_max - buffered, 0)),
                    self._record_bytes_max,
                )
            if end > done:
                segment.last_timestamp_ms = timestamp_ms
                segment.size_bytes = position + len(buffer) - buffered
                segment.next_offset = self._next_offset = self._next_offset + end - done
                self._last_timestamp_ms = timestamp_ms
                done = end
                continue
            properties, body = messages[done][0], messages[done][1]
            record = _encode_record_parts(
                self._next_offset, timestamp_ms, exchange, routing_key, properties, body
            )
            if len(record) > self._record_bytes_max:
                raise RecordTooLarge(
                    f"record of {len(record)} bytes exceeds {self._record_bytes_max}"
                )
            self._last_timestamp_ms = timestamp_ms
            self._place(record, timestamp_ms)
            done += 1
        return first

    def append_encoded(self, records: bytes, count: int, timestamp_ms: int) -> int:
        """Append `count` records already encoded back to back in `records` (the layout
        of `format.encode_record_parts`), with the offsets from `next_offset` on and all
        with `timestamp_ms`, which must not be below `last_timestamp_ms` (the caller
        encoded them for this log: the stream protocol's Publish path). Returns the first
        offset. One copy into the write buffer, and one C call for the index entries,
        per segment roll or full write buffer.

        Buffered; durable after a `sync()` that begins after this returns. The caller
        keeps every record under `record_bytes_max`.
        """
        if self._failed is not None or self._closed:
            self._check_usable()
        assert timestamp_ms >= self._last_timestamp_ms, "records encoded before a newer append"
        first = self._next_offset
        position_in = 0
        done = 0
        while done < count:
            segment = self._active
            if len(self._buffer) >= self._write_buffer_bytes_max:
                self._flush(segment)
            position = segment.size_bytes
            room = self._segment_bytes_max - position
            n = 0
            if segment.first_timestamp_ms >= 0 and room > 0:
                index = segment.index
                end, n, relative_offsets, positions, last_index = _span_indexed(
                    records,
                    position_in,
                    position,
                    self._next_offset - segment.base_offset,
                    index.last_position,
                    index.interval_bytes,
                    min(room, max(self._write_buffer_bytes_max - len(self._buffer), 0)),
                )
            if n == 0:  # a roll, a first record or a full buffer: `_place` decides
                end = (
                    position_in
                    + 4
                    + int.from_bytes(records[position_in : position_in + 4], "little")
                )
                n = 1
                self._last_timestamp_ms = timestamp_ms
                self._place(records[position_in:end], timestamp_ms)
            else:
                if positions:  # C-level extends, not an `index.add` per entry
                    index.relative_offsets.frombytes(relative_offsets)
                    index.positions.frombytes(positions)
                    index.timestamps.frombytes(
                        _TIMESTAMP.pack(timestamp_ms) * (len(positions) // 4)
                    )
                    index.last_position = last_index
                with memoryview(records) as view:
                    self._buffer += view[position_in:end]
                segment.last_timestamp_ms = timestamp_ms
                segment.size_bytes = position + end - position_in
                segment.next_offset = self._next_offset = self._next_offset + n
            self._last_timestamp_ms = timestamp_ms
            position_in = end
            done += n
        return first

    def _place(self, record: bytes, timestamp_ms: int) -> None:
        """Put one encoded record (for offset `_next_offset`) into the active segment:
        roll first if it would not fit, index it, buffer it, flush a full buffer."""
        offset = self._next_offset
        segment = self._active
        size = len(record)
        position = segment.size_bytes
        if position + size > self.config.segment_bytes_max and offset > segment.base_offset:
            self._seal_active(offset, position)
            segment = self._active
            position = segment.size_bytes
        index = segment.index
        if position - index.last_position >= index.interval_bytes:
            index.add(offset - segment.base_offset, position, timestamp_ms)
        buffer = self._buffer
        buffer += record
        if segment.first_timestamp_ms < 0:
            segment.first_timestamp_ms = timestamp_ms
        segment.last_timestamp_ms = timestamp_ms
        segment.size_bytes = position + size
        segment.next_offset = offset + 1
        self._next_offset = offset + 1
        if len(buffer) >= self.config.write_buffer_bytes_max:
            self._flush(segment)

    def _flush(self, segment: Segment) -> None:
        """Hand the write buffer (the last bytes of `segment`) to the Syncer thread to write
        (not durable until a round that follows it) and start a new one. Blocks while more
        than `writes_pending_bytes_max` wait to be written: the disk sets the pace.

        The buffer itself goes, not a copy: a fresh 1 MiB `bytes` per flush cost 50 us per
        64 KiB message in page faults (glibc maps such blocks anew every time)."""
        if self._write_error is not None:
            raise self._fail(self._write_error)
        if self._stalled.error is not None and self._space is None:
            self._ran_out_of_space(self._stalled.error)
        buffer = self._buffer
        if not buffer:
            return
        position = segment.size_bytes - len(buffer)
        writer = segment.writer
        if writer is None:
            try:
                direct = self.config.direct_io and self._syncer.direct_io
                writer = SegmentWriter(segment.path, position, direct=direct)
            except OSError as exc:
                raise self._fail(exc) from exc
            segment.writer = writer
        self._buffer = bytearray()
        writes = self._writes
        written = self._submit_write(writer, position, buffer)
        recent = self._recent
        recent.add(segment, position, buffer, written)
        # A write parked by a full disk is done but not on disk: nothing goes then (its
        # future completes after it is parked, so no parked bytes means it was written).
        recent.trim(recent.bytes_max, writes_parked=self._stalled.bytes != 0)
        if self._recent_timer is None:
            self._arm_recent_release()
        writes.append((written, len(buffer)))
        self._writes_bytes += len(buffer)
        while writes and (
            writes[0][0].done() or self._writes_bytes > self.config.writes_pending_bytes_max
        ):
            future, size = writes.popleft()
            future.result()  # waits if not done; a write's error is in `_write_error`
            self._writes_bytes -= size

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

    def _submit_write(
        self, writer: SegmentWriter, position: int, data: bytearray
    ) -> concurrent.futures.Future[None]:
        staging = self._syncer.staging

        def write() -> None:  # on the Syncer thread; a repeat after a full disk too
            writer.write(position, data, staging)

        try:
            return self._syncer.submit_write(lambda: self._run_write(write, len(data)))
        except RuntimeError as exc:  # the Syncer was shut down
            raise self._fail(exc) from exc

    def _run_write(self, op: Callable[[], None], size: int) -> None:
        """On the Syncer thread: run a segment write (or a writer's close, size 0) in
        order, parked behind any that wait for disk space; keep the first other error."""
        if self._write_error is None:
            try:
                self._stalled.run_or_park(op, size)
            except (OSError, LogError) as exc:
                self._write_error = exc

    def _seal_active(self, offset: int, position: int) -> None:
        """Close the active segment for appends and start the next one at `offset`."""
        old = self._active
        old.size_bytes = position
        old.next_offset = offset
        self._flush(old)
        self._finish_writer(old, cut_padding=True)
        self._unsealed.append(old)
        try:
            # The new segment's floor is the newest timestamp the log holds before it.
            new = create_segment(
                self.directory,
                offset,
                self.config.index_interval_bytes,
                old.last_timestamp_ms,
                write_header=False,
            )
        except OSError as exc:
            raise self._fail(exc) from exc
        header = fmt.encode_segment_header(offset, old.last_timestamp_ms)
        try:
            append_all(new.write_fd, header)
        except OutOfSpace:
            # No room even for the header: it goes with the first write, on the Syncer
            # thread, which holds it back like any write instead of failing the roll (a
            # segment cut before its header is rewritten by recovery).
            self._buffer += header
        except OSError as exc:
            raise self._fail(exc) from exc
        self._segments.append(new)
        self._bases.append(offset)
        self._active = new
        self._dir_dirty = True

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

    def _finish_writer(self, segment: Segment, *, cut_padding: bool) -> None:
        """Close the segment's writer on the Syncer thread, after its queued writes."""
        writer = segment.writer
        if writer is None:
            return
        segment.writer = None

        def finish() -> None:
            try:
                writer.finish(cut_padding=cut_padding and self._write_error is None)
            except OSError as exc:
                if self._write_error is None:
                    self._write_error = exc

        try:
            # After the writes parked for want of room, if any (size 0: a close).
            self._syncer.submit_write(lambda: self._stalled.run_or_park(finish, 0))
        except RuntimeError:  # the Syncer was shut down, with every write done
            finish()

    def _submit_drop_stalled(self) -> None:
        """On the Syncer thread, after what was handed to it: forget the parked writes,
        closing the writers parked with them."""
        try:
            self._syncer.submit_write(self._stalled.drop)
        except RuntimeError:  # the Syncer was shut down: no thread to race with
            self._stalled.drop()
