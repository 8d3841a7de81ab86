"""Stream queues in the broker core: declaration rules, their logs, and deliveries.

Owns what makes a queue declared with `x-queue-type: stream` different from a classic
one: RabbitMQ's declaration rules (durable, not exclusive, not auto-delete, no arguments
that only classic queues understand), a log of its own per stream under the vhost
directory, and the drain that reads each consumer's next records from that log: in runs
framed from the log's bytes for a consumer without a filter, record by record otherwise.
Reading consumes nothing; acks only return credit and move a tracked offset. It knows
no AMQP.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from typing import Final

from retention.rules import RuleInvalid, rules_from_arguments
from streamq.broker.delivery import MessageUnreadable, unreadable_text
from streamq.broker.equivalence import type_name
from streamq.broker.errors import PreconditionFailed
from streamq.broker.queue import Consumer, Queue
from streamq.log import files
from streamq.log.amqp10 import NATIVE_MARK, as_amqp091, filter_properties
from streamq.log.errors import LogError, ReadFailed
from streamq.log.format import Record
from streamq.log.log import LogConfig, SegmentLog
from streamq.log.syncer import Syncer
from streamq.queues.classic import ReadyMessage
from streamq.queues.offsets import OffsetStore
from streamq.queues.stream import StreamQueue
from streamq.queues.window import ReadWindow

# Arguments that make no sense for a stream (RabbitMQ refuses them with 406).
STREAM_REFUSED_ARGUMENTS: Final = (
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-expires",
    "x-overflow",
    "x-max-priority",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-message-ttl",
)
SEGMENT_BYTES_MIN: Final = 4096  # smaller x-stream-max-segment-size-bytes round up to it
SEGMENT_BYTES_DEFAULT: Final = 8 * 1024 * 1024
SEGMENT_BYTES_MAX: Final = 3_000_000_000  # RabbitMQ's cap (decimal: 3,000,000,001 is refused)
OFFSETS_SUFFIX: Final = ".offsets"
# The format of the segments a stream writes (docs/log-format.md): 2, osiris chunks. A
# stream written by an older streamq keeps its version-1 segments and goes on in version 2.
STREAM_FORMAT: Final = 2
DRAIN_RECORDS_MAX: Final = 4096  # per stream per drain, so one stream cannot starve others
# Records read at once for the per-record path when a run stops (native records the C
# conversion leaves to Python): one read per record would make them 10x slower.
PER_RECORD_READ_MAX: Final = 256
_new: Final = tuple.__new__  # skips the NamedTuple constructor (as `format.decode_records`)


def check_stream_arguments(name: str, vhost: str, arguments: Mapping[str, object]) -> None:
    """RabbitMQ's rules for a stream's arguments; raises PreconditionFailed (406). Its
    properties are checked after (`queue_arguments.check_queue_properties`)."""
    where = f"queue '{name}' in vhost '{vhost}'"
    for key in STREAM_REFUSED_ARGUMENTS:
        if key in arguments:
            raise PreconditionFailed(
                f"invalid arg '{key}' for {where} of queue type rabbit_stream_queue"
            )
    segment_bytes(arguments, where)
    try:
        rules_from_arguments(arguments)
    except RuleInvalid as exc:
        raise PreconditionFailed(f"{exc} for {where}") from None


def segment_bytes(arguments: Mapping[str, object], where: str) -> int:
    """The stream's segment size from x-stream-max-segment-size-bytes, checked as RabbitMQ
    checks it (a non-negative integer: 406 with its text otherwise) and raised to
    SEGMENT_BYTES_MIN: RabbitMQ accepts 1,000 or 0 (osiris then starts a segment per
    chunk); a segment here holds at least its header and one record, so smaller sizes
    are rounded up, not refused (docs/compatibility.md)."""
    value = arguments.get("x-stream-max-segment-size-bytes", SEGMENT_BYTES_DEFAULT)
    if not isinstance(value, int) or isinstance(value, bool):
        problem = f'"expected integer, got {type_name(value)}"'
    elif value < 0:
        problem = f"{{value_negative,{value}}}"
    elif value > SEGMENT_BYTES_MAX:
        raise PreconditionFailed("Exceeded max value for x-stream-max-segment-size-bytes")
    else:
        return max(value, SEGMENT_BYTES_MIN)
    raise PreconditionFailed(
        f"invalid arg 'x-stream-max-segment-size-bytes' for {where}: {problem}"
    )


def open_stream(directory: str, queue: Queue, syncer: Syncer) -> StreamQueue:
    """Open (recovering) or create the stream's log. Raises LogError and OSError."""
    config = LogConfig(
        segment_bytes_max=segment_bytes(queue.arguments, queue.name),
        format_version=STREAM_FORMAT,
        # Through the page cache: readers behind the writers by less than the memory the
        # kernel gives it read from there (docs/durability.md, "The page cache").
        direct_io=False,
        write_behind=True,
    )
    stream = StreamQueue(
        SegmentLog.open(directory, config, syncer),
        rules_from_arguments(queue.arguments),
        OffsetStore.open(directory + OFFSETS_SUFFIX),
    )
    stream.apply_retention(int(time.time() * 1000), force=True)
    return stream


def delete_stream_files(directory: str) -> None:
    """Remove a deleted stream's log directory (its segments go with it) and offsets."""
    with contextlib.suppress(OSError):
        files.remove_tree(directory)
    for leftover in (directory + OFFSETS_SUFFIX, directory + OFFSETS_SUFFIX + ".tmp"):
        if os.path.exists(leftover):
            files.remove(leftover)
    parent = os.path.dirname(directory)
    if os.path.isdir(parent):
        files.fsync_directory(parent)


def drain_stream(queue: Queue, stream: StreamQueue) -> bool:
    """Deliver the next records to every consumer of `stream` that has credit, one
    consumer after the other; returns True if it stopped at its limit with more to do.
    Raises MessageUnreadable naming the consumer whose read failed with an I/O error
    (the stream goes on), LogError when the log failed."""
    budget = DRAIN_RECORDS_MAX
    for consumer in list(queue.consumers):
        try:
            budget = _drain_consumer(queue, stream, consumer, budget)
        except ReadFailed as exc:
            unreadable = MessageUnreadable(unreadable_text(consumer.stream_position, exc))
            unreadable.consumer = consumer
            raise unreadable from exc
        if budget <= 0:
            return True
    return False


def _drain_consumer(queue: Queue, stream: StreamQueue, consumer: Consumer, budget: int) -> int:
    """Deliver to one consumer while it has credit: first what it nacked with requeue,
    then from its position, in runs framed from the log's bytes when it has no filter.
    Returns the budget left (records looked at count against it)."""
    while budget > 0 and consumer.can_take():
        if consumer.stream_redeliver:
            offset = consumer.stream_redeliver.popleft()
            if offset < stream.log.start_offset:
                continue  # retention dropped it meanwhile
            records = stream.log.read(offset, 1)
            if not records:
                break
            budget = _deliver_each(queue, stream, consumer, records, True, budget)
            continue
        if not consumer.stream_filtered:
            sent = _deliver_run(queue, stream, consumer, budget)
            if sent is None:  # the next records are the per-record path's (native ones)
                position = max(consumer.stream_position, stream.log.start_offset)
                count = min(consumer.credit(), budget, PER_RECORD_READ_MAX)
                durable = position < stream.log.durable_next
                records = stream.log.read(position, max(count, 1)) if durable else []
            elif sent:
                budget -= sent
                continue
            else:
                break
        else:
            records = stream.read(consumer.stream_position)
        if not records:
            break
        budget = _deliver_each(queue, stream, consumer, records, False, budget)
    return budget


def _deliver_each(
    queue: Queue,
    stream: StreamQueue,
    consumer: Consumer,
    records: list[Record],
    redelivered: bool,
    budget: int,
) -> int:
    """Deliver `records` one at a time (redeliveries, filtered consumers, and records a
    run leaves to this path); records its filter refuses are passed over without using
    credit. Returns the budget left."""
    filtered = consumer.stream_filtered
    can_take, deliver = consumer.can_take, consumer.deliver
    for record in records:
        if budget <= 0 or not can_take():
            break
        budget -= 1
        offset = record.offset
        if not redelivered:
            if offset > consumer.stream_position and stream.log.damage.spans:
                _pass_lost(stream, consumer, offset)
            consumer.stream_position = offset + 1
        native = record.properties[:2] == NATIVE_MARK  # a stream client's AMQP 1.0 message
        if filtered and not consumer.accepts(
            filter_properties(record.routing_key) if native else record.properties
        ):
            track(stream, consumer, offset)  # passed over: as good as acked
            continue
        ready = _new(ReadyMessage, (offset, redelivered, 0))
        deliver(queue, ready, as_amqp091(queue.name, record) if native else record)
    return budget


def _deliver_run(queue: Queue, stream: StreamQueue, consumer: Consumer, budget: int) -> int | None:
    """Deliver the consumer's next durable records as one run framed from the log's bytes
    (`Consumer.deliver_stream_records`, one C call per chunk), read and checked (length,
    CRC32C, offsets) through the consumer's `ReadWindow`. Returns how many went out (0:
    nothing to read now), or None when the next record is the per-record path's: one
    the C splice leaves to Python, or a read that failed here (that path reads it again
    and raises what it raises, as before runs). The window is released when the consumer
    has caught up, so an idle consumer holds no chunk."""
    log = stream.log
    position = max(consumer.stream_position, log.start_offset)
    consumer.stream_position = position
    count = min(consumer.credit(), budget, log.durable_next - position)
    if count <= 0:
        if position >= log.durable_next:
            consumer.stream_window = None
        return 0
    if log.chunk_at(position) is not None:  # a version-2 segment: its chunks' runs
        consumer.stream_window = None
        return _deliver_chunk(queue, stream, consumer, position, count)
    window = consumer.stream_window
    if window is None:
        window = consumer.stream_window = ReadWindow()
    try:
        while True:
            data, start = window.records(log, position)
            delivered, start, next_offset, stopped = consumer.deliver_stream_records(
                queue, data, start, position, count
            )
            window.advance(start, next_offset)
            if delivered or stopped:
                break
            if not window.read_on(log):
                return None  # a record is missing where the window reads
    except (LogError, ValueError):
        consumer.stream_window = None
        return None
    consumer.stream_position = position + delivered
    if position + delivered >= log.durable_next:
        consumer.stream_window = None
    if stopped and not delivered:
        return None
    return delivered


def _deliver_chunk(
    queue: Queue, stream: StreamQueue, consumer: Consumer, position: int, count: int
) -> int | None:
    """`_deliver_run` in a version-2 segment: the chunk holding `position` as version-1
    records (`SegmentLog.chunk_run`), delivered by the same C call. None when the chunk
    has no run (the per-record path takes it) or the run stops before anything went out."""
    run = stream.log.chunk_run(position)
    at = position - run.first_offset if run is not None else -1
    if run is None or not 0 <= at < len(run.positions):
        return None
    delivered, _start, _next, _stopped = consumer.deliver_stream_records(
        queue, run.data, run.positions[at], position, count
    )
    consumer.stream_position = position + delivered
    if not delivered:
        return None
    return delivered


def _pass_lost(stream: StreamQueue, consumer: Consumer, offset: int) -> None:
    """The offsets lost to damage on disk (bit rot) between the consumer's position and
    `offset` count as passed over, as filtered-out records: its tracked offset moves on."""
    damage = stream.log.damage
    for lost in range(max(consumer.stream_position, stream.log.start_offset), offset):
        if damage.covering(lost) is not None:
            track(stream, consumer, lost)


def track(stream: StreamQueue, consumer: Consumer, offset: int) -> None:
    """`offset` is acked (or passed over): store the consumer's offset if it moved."""
    tracker = consumer.stream_tracker
    if tracker is not None and tracker.done(offset):
        stream.offsets.store(consumer.tag, tracker.next - 1)


def track_run(stream: StreamQueue, consumer: Consumer, offsets: list[int]) -> None:
    """`track` of a run of the consumer's acked offsets: the store is written once."""
    tracker = consumer.stream_tracker
    if tracker is not None and tracker.done_run(offsets):
        stream.offsets.store(consumer.tag, tracker.next - 1)
