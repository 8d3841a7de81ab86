"""A stream queue: its own segment log, read from any offset by any number of consumers.

Owns a stream's log and the translation of a consumer's starting point (`x-stream-offset`:
first, last, next, an offset, the last N, a timestamp or an age) into an offset. Reading
consumes nothing: each consumer keeps its own position, and the broker core moves it. It
knows no AMQP; the gateway parses the argument into a `StreamStart`.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from retention.rules import RetentionRules, drop_before
from streamq.log import amqp10
from streamq.log import format as fmt
from streamq.log._streamwire import encode_publish as _encode_publish
from streamq.log._streamwire import publish_entries as _publish_entries
from streamq.log.chunk import SimpleEntry
from streamq.log.log import RunMessage, SegmentLog
from streamq.queues import chunks, sub_entries
from streamq.queues.chunks import Chunk, ChunkFilter
from streamq.queues.converted_run import append_converted
from streamq.queues.offsets import OffsetStore
from streamq.queues.publish_entries import parse_publish
from streamq.queues.publishers import NO_SEQUENCE, BadPublish, PublisherSequences
from streamq.queues.stored_chunks import read_stored_chunk

READ_RECORDS_MAX: Final = 256  # records read for one consumer per drain
# The newest appends stay in memory as records (the tail), so that consumers at the end
# of the stream (the common case) get them without a pread, a decode and a CRC check.
# A few sync rounds' worth; the bytes cap bounds the memory per stream.
TAIL_RECORDS_MAX: Final = 4096
TAIL_BYTES_MAX: Final = 1024 * 1024  # of bodies and properties
_new: Final = tuple.__new__
_NO_TAIL: Final = 1 << 62


class PublishResult(NamedTuple):
    """What `append_publish` did with a Publish frame."""

    # Messages in the frame. The contract's name: it shadows tuple.count, which no
    # caller of a PublishResult uses.
    count: int  # type: ignore[assignment]
    appended: int  # records written (count - duplicates)
    # The log's next offset after the append: confirm all `count` ids once
    # `log.durable_next >= next_offset`.
    next_offset: int
    ids: bytes  # the publishing ids, u64 big-endian each, in frame order (PublishConfirm's)


class StreamStart(NamedTuple):
    """Where a consumer starts: kind is first, last, next, offset (value: the offset),
    tail (value: how many of the newest messages) or time (value: a time in ms)."""

    kind: str
    value: int = 0


NEXT: Final = StreamStart("next")


class StreamQueue:
    """A stream's log; the broker's event-loop thread only."""

    __slots__ = (
        "_checked_segments",
        "_tail",
        "_tail_base",
        "_tail_bytes",
        "log",
        "offsets",
        "publishers",
        "retention",
    )

    def __init__(
        self,
        log: SegmentLog,
        retention: RetentionRules,
        offsets: OffsetStore,
        publishers: PublisherSequences | None = None,
    ) -> None:
        """`publishers`: opened from the log's directory when not given (blocks on
        fsync, as `SegmentLog.open`; raises PublishersCorrupted and OSError)."""
        self.log = log
        self.retention = retention
        self.offsets = offsets  # broker-side offset tracking
        offsets.attach(log)  # its writes go with the log's sync rounds
        self.publishers = publishers or PublisherSequences.open(log)
        log.add_sync_companion(self.publishers.prepare_sync)
        self._checked_segments = -1  # segment count at the last retention check
        self._tail: list[fmt.Record] = []  # the records of offsets _tail_base and on
        # A stream in chunks keeps no tail (readers decode its chunks): never reached.
        self._tail_base = _NO_TAIL if log.chunked else log.next_offset
        self._tail_bytes = 0

    @property
    def message_count(self) -> int:
        return self.log.next_offset - self.log.start_offset

    def append(
        self, exchange: bytes, routing_key: bytes, properties: bytes, body: bytes, timestamp_ms: int
    ) -> int:
        """Buffered: readable and durable after the log's next sync round. A stream in
        chunks stores the message converted to AMQP 1.0 (`amqp10.to_amqp10`), with the
        `x-stream-filter-value` header as its filter value."""
        log = self.log
        if log.chunked:
            return log.append_entries((_converted(exchange, routing_key, properties, body),),
                                      timestamp_ms)  # fmt: skip
        offset = log.append_one(exchange, routing_key, properties, body, timestamp_ms)
        self._remember(offset, log.last_timestamp_ms, exchange, routing_key, properties, body)
        return offset

    def append_run(
        self,
        exchange: bytes,
        routing_key: bytes,
        messages: list[RunMessage],
        timestamp_ms: int,
    ) -> int:
        """`append` of a run of messages (`SegmentLog.append_run`); returns the first
        offset. Buffered: readable and durable after the log's next sync round."""
        log = self.log
        if log.chunked:
            first = append_converted(log, exchange, routing_key, messages, timestamp_ms)
            if first is not None:
                return first
            return log.append_entries(  # an entry over the limit: RecordTooLarge there
                [_converted(exchange, routing_key, m[0], m[1]) for m in messages], timestamp_ms
            )
        first = log.append_run(exchange, routing_key, messages, timestamp_ms)
        timestamp_ms = log.last_timestamp_ms
        remember = self._remember
        for offset, message in enumerate(messages, first):
            remember(offset, timestamp_ms, exchange, routing_key, message[0], message[1])
        return first

    def append_publish(
        self, reference: bytes, version: int, payload: bytes | memoryview, timestamp_ms: int
    ) -> PublishResult:
        """Append a stream-protocol Publish frame's messages as native records (see
        docs/log-format.md), skipping duplicates when `reference` is not empty (a
        publishing id at or below the reference's sequence). `payload` is the frame's
        body from its message count on; `version` 1 or 2 (with filter values).

        Parsed and encoded in C, no Python object per message (a frame with compressed
        sub-entry batches is decompressed first: `sub_entries`). Buffered: readable and
        durable after the log's next sync round, with the reference's new sequence.
        Raises BadPublish (a ValueError) for a malformed payload, appending nothing, and
        the log's errors (LogFailed, LogClosed).
        """
        log = self.log
        if timestamp_ms < log.last_timestamp_ms:  # noqa: PLR1730 (as append_one)
            timestamp_ms = log.last_timestamp_ms
        publishers = self.publishers
        sequence = publishers.sequence(reference) if reference else NO_SEQUENCE
        if log.chunked:
            return self._append_entries(reference, version, payload, timestamp_ms, sequence)
        arguments = (
            log.next_offset,
            timestamp_ms,
            reference,
            sequence,
            log.config.record_bytes_max,
        )
        try:
            try:
                encoded = _encode_publish(version, payload, *arguments)
            except ValueError as exc:
                if str(exc) != sub_entries.COMPRESSED_TEXT:
                    raise
                # Compressed sub-entry batches: decompressed, then parsed as any batch.
                encoded = _encode_publish(
                    version, sub_entries.uncompress_batches(version, payload), *arguments
                )
        except (ValueError, OverflowError) as exc:
            raise BadPublish(str(exc)) from None
        records, count, appended, ids, sequence = encoded
        if appended:
            log.append_encoded(records, appended, timestamp_ms)
            # The tail holds Record tuples of every record from its base: native records
            # skip it (no object per message here), so it restarts after them.
            self._tail.clear()
            self._tail_base, self._tail_bytes = log.next_offset, 0
            if reference:
                publishers.update(reference, sequence, log.next_offset - 1)
        return PublishResult(count, appended, log.next_offset, ids)

    def _append_entries(
        self,
        reference: bytes,
        version: int,
        payload: bytes | memoryview,
        timestamp_ms: int,
        sequence: int,
    ) -> PublishResult:
        """`append_publish` to a stream in chunks: the messages as sent, parsed in C
        (`_streamwire.publish_entries`), the reference's sequence in the chunk's trailer;
        a frame with compressed batches takes `_append_compressed`."""
        log = self.log
        try:
            parsed = _publish_entries(
                version, payload, sequence, bool(reference), log.config.record_bytes_max
            )
        except ValueError as exc:
            if str(exc) != sub_entries.COMPRESSED_TEXT:
                raise BadPublish(str(exc)) from None
            return self._append_compressed(reference, version, payload, timestamp_ms, sequence)
        data, sizes, records, count, stored, ids, sequence, filters = parsed
        if stored:
            sequences = {reference: sequence} if reference else None
            log.append_entry_run(data, sizes, records, filters, timestamp_ms, sequences)
            if reference:
                self.publishers.update(reference, sequence, log.next_offset - 1)
        return PublishResult(count, stored, log.next_offset, ids)

    def _append_compressed(
        self,
        reference: bytes,
        version: int,
        payload: bytes | memoryview,
        timestamp_ms: int,
        sequence: int,
    ) -> PublishResult:
        """A Publish frame with compressed sub-entry batches, parsed in Python
        (`publish_entries`): each batch decompressed once to check it, stored compressed."""
        log = self.log
        try:
            parsed = parse_publish(
                version, payload, sequence, bool(reference), log.config.record_bytes_max
            )
        except (ValueError, OverflowError) as exc:
            raise BadPublish(str(exc)) from None
        if parsed.entries:
            sequences = {reference: parsed.sequence} if reference else None
            log.append_entries(parsed.entries, timestamp_ms, sequences)
            if reference:
                self.publishers.update(reference, parsed.sequence, log.next_offset - 1)
        return PublishResult(parsed.count, parsed.records, log.next_offset, parsed.ids)

    def read_chunk(
        self, offset: int, records_max: int, bytes_max: int, filter: ChunkFilter | None = None
    ) -> Chunk | None:
        """One osiris chunk of the durable records from `offset` (raised to the stream's
        start) for a stream-protocol consumer; see `chunks.read_chunk`. None when there
        is no durable record at or after `offset`."""
        log = self.log
        offset = max(offset, log.start_offset)
        place = log.chunk_at(offset)
        if place is not None:  # a version-2 segment: its chunks as stored
            return read_stored_chunk(log, place, offset, filter)
        return chunks.read_chunk(log, offset, records_max, bytes_max, filter)

    def _remember(
        self,
        offset: int,
        timestamp_ms: int,
        exchange: bytes,
        routing_key: bytes,
        properties: bytes,
        body: bytes,
    ) -> None:
        """Keep the newest appends in the tail (within its bounds) for consumers there."""
        tail = self._tail
        size = len(body) + len(properties)
        if size > TAIL_BYTES_MAX:  # a large message is read back from the log
            tail.clear()
            self._tail_base, self._tail_bytes = offset + 1, 0
            return
        if len(tail) >= TAIL_RECORDS_MAX or self._tail_bytes + size > TAIL_BYTES_MAX:
            self._trim_tail()
        # tuple.__new__ skips the NamedTuple constructor (as `format.decode_records`).
        tail.append(
            _new(fmt.Record, (offset, timestamp_ms, exchange, routing_key, properties, body))
        )
        self._tail_bytes += size

    def _trim_tail(self) -> None:
        """Drop the older half of the tail (amortised: O(1) per append)."""
        tail = self._tail
        half = (len(tail) + 1) // 2
        self._tail_bytes -= sum([len(r.body) + len(r.properties) for r in tail[:half]])
        del tail[:half]
        self._tail_base += half

    def start_offset(self, start: StreamStart) -> int:
        """The first offset a consumer starting at `start` reads (RabbitMQ's meanings;
        `last` is the first offset of the newest segment that holds messages)."""
        log = self.log
        first, end = log.start_offset, log.durable_next
        kind = start.kind
        if kind == "first":
            return first
        if kind == "last":
            with_records = [s for s in log.segments() if s.next_offset > s.base_offset]
            return max(first, with_records[-1].base_offset) if with_records else end
        if kind == "offset":
            return min(max(start.value, first), end)
        if kind == "tail":
            return max(first, end - start.value)
        if kind == "time":
            return log.seek_timestamp(start.value) if end > first else end
        return log.next_offset  # next: only what is published from now on

    def apply_retention(self, now_ms: int, *, force: bool) -> int:
        """Drop the whole segments the rules no longer keep; returns how many went.

        Without `force`, only when a segment rolled since the last check (the call after
        every sync round is then an integer comparison). The deletion is durable after
        the log's next sync round.
        """
        log = self.log
        if not force and log.segment_count == self._checked_segments:
            return 0
        dropped = 0
        if not self.retention.empty:
            cut = drop_before(log.segments(), self.retention, now_ms)
            if cut > log.start_offset:
                dropped = log.drop_segments_before(cut)
        self._checked_segments = log.segment_count
        return dropped

    def read(self, offset: int) -> list[fmt.Record]:
        """Durable records from `offset` (raised to the stream's start if retention has
        dropped it), at most READ_RECORDS_MAX: from the tail in memory when it holds
        `offset`, else from the log."""
        log = self.log
        offset = max(offset, log.start_offset)
        first = offset - self._tail_base
        if first >= 0 and log.failed is None:
            end = min(first + READ_RECORDS_MAX, log.durable_next - self._tail_base)
            return self._tail[first:end] if end > first else []
        return log.read(offset, READ_RECORDS_MAX)


def _converted(exchange: bytes, routing_key: bytes, properties: bytes, body: bytes) -> SimpleEntry:
    """An AMQP 0-9-1 publish as a chunk entry: its AMQP 1.0 conversion and filter value.
    A native record given in the record form (`amqp10.native_properties`: the routing key
    is its filter value) is its body as it is."""
    if amqp10.is_native(properties):
        return SimpleEntry(body, routing_key)
    return SimpleEntry(
        amqp10.to_amqp10(exchange, routing_key, properties, body),
        amqp10.filter_value_of(properties),
    )
