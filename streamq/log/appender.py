"""The append path of a segment log: `LogAppender`, a part of `SegmentLog` (see `state`).

Owns appending: encoding and placing records in the active segment (`append`,
`append_one`, `append_run`, `append_encoded`), its sparse index entries, rolling to a new
segment when one is full (`_seal_active`), and handing the write buffer to the Syncer
thread (`_flush`), which writes it (see `writer`); at most `writes_pending_bytes_max` wait
there, beyond which appending blocks.

Durability: everything here is buffered; durable after a `sync()` (see `commit`) that
began after it returned. It holds no state of its own and never fsyncs.

This is the broker's hottest path: in the common case `append_one` makes one call per
message (the C encoding) and `append_run` one per run, each reading the state it needs
once. Keep it free of extra calls and attribute hops; measure with
benchmarks/log_bench.py.
"""

from __future__ import annotations

import concurrent.futures
import struct
from array import array
from collections.abc import Callable, Sequence
from typing import Final

from streamq.log import format as fmt
from streamq.log._records import encode_records as _encode_records
from streamq.log._streamwire import span_indexed as _span_indexed
from streamq.log.errors import LogError, OutOfSpace, RecordTooLarge
from streamq.log.files import append_all
from streamq.log.recovery import create_segment
from streamq.log.segment import Segment
from streamq.log.state import LogState
from streamq.log.writer import SegmentWriter

_encode_record_parts: Final = fmt.encode_record_parts  # a global, not a module attribute
_RECORD_HEADER_BYTES: Final = fmt.RECORD_HEADER_BYTES
_TIMESTAMP: Final = struct.Struct("=q")  # an index timestamp as array("q") holds it
# `span_indexed` writes index entries as 4-byte native integers for array("I").
assert array("I").itemsize == 4, "array('I') items are not 4 bytes here"


# A message of a run given to `append_run`: its properties and body, then the publish's
# exchange, routing key and bits, which the log ignores (the gateway's tuples as they
# come from its frame scanner, so that no per-message tuple is built for the log).
RunMessage = tuple[bytes, bytes, str, str, int]


class LogAppender(LogState):
    """Appends, segment rolls and segment writes of a `SegmentLog`."""

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
        if self._active.version != fmt.FORMAT_VERSION:
            raise LogError(f"log {self.directory}: records appended to a chunk segment")
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
        if self._active.version != fmt.FORMAT_VERSION:
            raise LogError(f"log {self.directory}: records appended to a chunk segment")
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
        if segment.version != fmt.FORMAT_VERSION:
            raise LogError(f"log {self.directory}: a record appended to a chunk segment")
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
                writer = SegmentWriter(
                    segment.path, position, direct=direct, write_behind=self.config.write_behind
                )
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

    def _seal_active(self, offset: int, position: int, version: int = 0) -> None:
        """Close the active segment for appends and start the next one at `offset`, of
        format `version` (0: the active segment's)."""
        old = self._active
        version = version or old.version
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
                version=version,
            )
        except OSError as exc:
            raise self._fail(exc) from exc
        header = fmt.encode_segment_header(offset, old.last_timestamp_ms, version)
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
