"""Delivery of a classic queue's ready messages, read from the vhost's log.

Owns the hand-over from a queue's cursor to its consumers: which consumer gets what, in
runs where the order allows it, and where the bytes come from. A classic queue holds
offsets only; its messages' contents stay in the vhost's segment log (on disk, and in
the log's buffers while they are recent), so memory does not grow with a queue's depth.

- A `ReadWindow` per queue (`streamq.queues.window`) is its place in the log.
  Consecutive offsets are consecutive records, so a run of a queue's offsets is a run
  of records; the consumer frames them in one C call (`Consumer.deliver_records`)
  straight from the window's bytes.
- One consumer (the common case for throughput) takes runs as long as its prefetch
  allows. Several share a queue round robin in RabbitMQ's order (`Turns`, one per
  `x-priority` level, higher levels first), a turn each: one message each while the
  backlog is small (RUN_BACKLOG_MIN), as RabbitMQ hands them out; past that a run
  each, its share of the backlog (at least RUN_TURN_MIN) up to RUN_MAX and its credit
  (`run_size`). A run of one still goes out through the run path.
- A queue with TTLs delivers runs up to the first message that has expired
  (`unexpired_runs`); that one is dead-lettered by the vhost's `take`.
- A requeued message (redelivered, with a delivery count to show) goes alone through
  `Consumer.deliver`, with the record read and checked by `SegmentLog.read_record`.

It knows no AMQP: the consumer (the gateway) writes the frames.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from streamq.broker.queue import Consumer, Queue
from streamq.broker.turns import Turns
from streamq.log import format as fmt
from streamq.log.errors import LogError, OffsetOutOfRange, RecordDamaged, SegmentCorrupted
from streamq.log.log import SegmentLog
from streamq.queues.classic import ReadyMessage

RunLength = Callable[[int, int], int]
"""How many of the `count` never-delivered messages from offset `first` on may go out
as a run (`unexpired_runs`)."""

RUN_MAX: Final = 128
"""Messages one consumer takes per turn when several share a queue (`run_size`)."""
RUN_BACKLOG_MIN: Final = 64
"""Ready messages under which several consumers of a queue take one message each."""
RUN_TURN_MIN: Final = 32
"""Messages a turn hands over at least once runs apply (its credit allowing): with many
consumers, a share of a few messages each would cost a socket write per few messages."""


class MessageUnreadable(Exception):
    """A queued message could not be read back from the log. Its cause says why: a
    ReadFailed (an I/O error, which may heal) or damage. `consumer` is the one the
    delivery was for, if any (set by the drain round)."""

    consumer: Consumer | None = None


def deliver_run(log: SegmentLog, queue: Queue, consumer: Consumer, first: int, count: int) -> int:
    """Deliver the `count` messages of `queue` at offsets `first` .. (taken from its
    cursor by `take_run`) to `consumer`; returns how many went out (the rest goes back
    to the cursor). Raises MessageUnreadable."""
    window = queue.window
    cursor = queue.cursor
    done = 0
    try:
        while done < count:
            target = first + done
            data, position = window.records(log, target)
            delivered, position, next_offset, sizes = consumer.deliver_records(
                queue, data, position, target, count - done
            )
            window.advance(position, next_offset)
            if delivered:
                cursor.delivered_run(target, sizes)
                done += delivered
            elif not window.read_on(log):
                raise MessageUnreadable(f"message at offset {target} is missing from the log")
    except RecordDamaged as exc:  # bit rot: the run ends before it, the cursor drops it
        cursor.note_damage(exc, failed_read=False)
    except (LogError, ValueError) as exc:
        window.release()
        raise MessageUnreadable(unreadable_text(first + done, exc)) from exc
    finally:
        if done < count:
            cursor.untake_run(first + done, count - done)
    return done


def read_message(log: SegmentLog, offset: int) -> fmt.Record:
    """The record of a queued message. Raises MessageUnreadable."""
    try:
        return log.read_record(offset)
    except OffsetOutOfRange as exc:
        raise MessageUnreadable(f"message at offset {offset} is missing from the log") from exc
    except LogError as exc:
        raise MessageUnreadable(unreadable_text(offset, exc)) from exc


def read_queued(log: SegmentLog, queue: Queue, offset: int) -> fmt.Record:
    """The record of a message of `queue`, read through its window: reading a queue's
    messages in order (its expired head, a run of dead letters) reads each chunk once.
    Raises MessageUnreadable."""
    try:
        return queue.window.record(log, offset)
    except OffsetOutOfRange as exc:
        queue.window.release()
        raise MessageUnreadable(f"message at offset {offset} is missing from the log") from exc
    except LogError as exc:
        queue.window.release()
        if isinstance(exc, RecordDamaged):  # not the queue's failure (VHost.fail_queue)
            queue.cursor.note_damage(exc)
        raise MessageUnreadable(unreadable_text(offset, exc)) from exc


def unreadable_text(offset: int, exc: Exception) -> str:
    """Why the message at `offset` cannot be read, short enough for a reply text (the
    segment by its file name, not its path)."""
    if isinstance(exc, SegmentCorrupted):
        where = f"{os.path.basename(exc.path)} at position {exc.position}"
        return f"message at offset {offset} is damaged: {exc.reason} in segment {where}"
    return f"message at offset {offset} cannot be read: {exc}"


def round_robin(
    log: SegmentLog,
    queue: Queue,
    consumers: list[Consumer] | Turns,
    take: Callable[[], tuple[ReadyMessage, fmt.Record] | None] | None,
    budget: int,
    run_length: RunLength | None = None,
) -> tuple[int, bool]:
    """Deliver to `consumers` in turn while one has credit; returns the budget left and
    whether the queue ran out of ready messages. `consumers` is one priority level's
    `Turns` (`_rotate`), or a list: the queue's one consumer, or a single active one.
    `take` (queues with TTLs) takes one message at a time, its record read; without it,
    runs go out where they can. With both, `run_length(first, count)` says how many of
    a run from offset `first` may go out whole (those before the first that has
    expired: see `unexpired_runs`). Raises MessageUnreadable."""
    if isinstance(consumers, Turns):
        return _rotate(log, queue, consumers, take, budget, run_length)
    count = len(consumers)
    index = queue.next_consumer
    idle = 0
    empty = False
    budget_given = budget
    no_ack = 0
    single = count > 1 or (take is not None and run_length is None)
    try:
        while idle < count and budget > 0:
            consumer = consumers[index % count]
            index += 1
            credit = consumer.credit()
            if credit <= 0:
                idle += 1
                continue
            idle = 0
            if not single:
                sent = _deliver_fresh(log, queue, consumer, min(credit, budget), run_length)
                if sent:
                    if consumer.no_ack:
                        no_ack += sent
                    budget -= sent
                    continue
            taken = _take_one(log, queue, take)
            if taken is None:
                # This consumer got nothing: its turn is the next message's, as in
                # RabbitMQ, where only a consumer that received moves to the back.
                index -= 1
                empty = True
                break
            no_ack += _deliver_one(queue, consumer, taken)
            budget -= 1
    except MessageUnreadable as exc:
        exc.consumer = consumer  # the delivery that failed was this one's
        raise
    finally:
        queue.next_consumer = index % count
        # Counted once per batch, not per message (the hot path).
        stats = queue.stats
        stats.deliver += budget_given - budget - no_ack
        stats.deliver_no_ack += no_ack
    return budget, empty


def run_size(ready: int, turns: int, credit: int, budget: int) -> int:
    """How many messages the consumer at the head of the turns takes this turn, with
    `ready` messages in the queue and `turns` consumers taking turns: one (RabbitMQ's
    order, message by message) while the backlog is under RUN_BACKLOG_MIN; past that a
    run of its share of the backlog, at least RUN_TURN_MIN, at most RUN_MAX and its
    credit. A consumer alone in the turns takes what its credit allows."""
    if turns == 1:
        return max(1, min(credit, budget))  # nobody to be fair to: as one consumer
    if ready < RUN_BACKLOG_MIN:
        return 1
    share = max(ready // turns, RUN_TURN_MIN)
    return max(1, min(share, RUN_MAX, credit, budget))


def _rotate(
    log: SegmentLog,
    queue: Queue,
    level: Turns,
    take: Callable[[], tuple[ReadyMessage, fmt.Record] | None] | None,
    budget: int,
    run_length: RunLength | None,
) -> tuple[int, bool]:
    """`round_robin` over one priority level of a queue's consumers (not single active)
    in RabbitMQ's order (`Turns`): the head of the turns takes its turn (one message, or
    a run: `run_size`), then goes to their tail; a consumer without credit is parked,
    and comes back at the tail when the gateway says its credit may have grown
    (`Queue.unblock`, RabbitMQ's unblock), so a round costs O(1) in the consumers
    without credit: it never walks them. An index that skips the consumers without
    credit served them in another order once one came back."""
    turns, cursor = level.active, queue.cursor
    empty, budget_given, no_ack = False, budget, 0
    runs = take is None or run_length is not None
    try:
        while turns and budget > 0:
            ready = cursor.message_count
            if not ready:
                # Nothing to hand out: no consumer is tried, so none is parked (RabbitMQ's
                # run_message_queue looks at the queue before its consumers).
                empty = True
                break
            consumer = turns[0]
            credit = consumer.credit()
            if credit <= 0:
                level.park()  # back by `Queue.unblock`, O(1)
                continue
            sent = 0
            if runs:
                size = run_size(ready, len(turns), credit, budget)
                sent = _deliver_fresh(log, queue, consumer, size, run_length)
            if not sent:
                taken = _take_one(log, queue, take)
                if taken is None:
                    empty = True  # the head keeps its turn for the next message, as in RabbitMQ
                    break
                _deliver_one(queue, consumer, taken)
                sent = 1
            turns.rotate(-1)
            if consumer.no_ack:
                no_ack += sent
            budget -= sent
    except MessageUnreadable as exc:
        exc.consumer = turns[0] if turns else None  # the head: the delivery was its
        raise
    finally:
        stats = queue.stats
        stats.deliver += budget_given - budget - no_ack
        stats.deliver_no_ack += no_ack
    return budget, empty


def _deliver_fresh(
    log: SegmentLog, queue: Queue, consumer: Consumer, size: int, run_length: RunLength | None
) -> int:
    """Deliver up to `size` never-delivered messages at the head of `queue` to `consumer`
    as one run, framed from the log's bytes; returns how many (0: the next message was
    delivered before, or has expired, or its check met damage, and goes by `_take_one`)."""
    cursor = queue.cursor
    first, got = cursor.take_run(size)
    if got and run_length is not None:
        try:
            allowed = run_length(first, got)
        except MessageUnreadable:
            # The run goes back whole; a record lost to bit rot that the check read is
            # noted (`read_queued`) and dropped, and counted, when it reaches the front.
            cursor.untake_run(first, got)
            if cursor.damage_noted():
                return 0
            raise
        if allowed < got:
            cursor.untake_run(first + allowed, got - allowed)
            got = allowed
    if not got:
        return 0
    sent = deliver_run(log, queue, consumer, first, got)
    if consumer.no_ack:
        cursor.ack_many(list(range(first, first + sent)))
    return sent


def _take_one(
    log: SegmentLog,
    queue: Queue,
    take: Callable[[], tuple[ReadyMessage, fmt.Record] | None] | None,
) -> tuple[ReadyMessage, fmt.Record] | None:
    """The next message and its record, taken singly (`take` for queues with TTLs)."""
    if take is not None:
        return take()
    ready = queue.cursor.take()
    return None if ready is None else (ready, _read_taken(log, queue, ready))


def _deliver_one(queue: Queue, consumer: Consumer, taken: tuple[ReadyMessage, fmt.Record]) -> int:
    """Send a message taken singly; returns 1 if it was settled at once (no-ack)."""
    ready, record = taken
    consumer.deliver(queue, ready, record)
    cursor = queue.cursor
    cursor.delivered(ready.offset, len(record.body))
    if consumer.no_ack:
        cursor.ack(ready.offset)
        return 1
    return 0


def unexpired_runs(
    log: SegmentLog,
    queue: Queue,
    fresh_from: int,
    expired: Callable[[fmt.Record], bool],
    now_ms: int,
) -> RunLength:
    """For a queue with TTLs, in a delivery round at `now_ms` that offers the messages
    from `fresh_from` on (`VHost.take`): how many of a run of never-delivered messages
    from an offset on may go out whole, up to the first that `expired` (the others go
    through `take`, which dead-letters it). Those of the round may all go, whatever
    their TTL. Before them, the run's first message decides for the queue's own TTL
    (timestamps never decrease along the log, so the later ones expire later); per-message
    expirations cannot have passed before the queue's bound (`Queue.own_expiry_min_ms`,
    `streamq.broker.expiration`), and past it each is read and checked, up to the first
    that has expired. Reads records (MessageUnreadable)."""
    window = queue.window
    by_head = not queue.holds_expiring or now_ms < queue.own_expiry_min_ms
    queue_ttl = queue.message_ttl_ms is not None

    def run_length(first: int, count: int) -> int:
        if first >= fresh_from:
            return count
        if by_head:
            if not queue_ttl:
                return count  # no queue TTL, and no own expiration has come yet
            return 0 if expired(read_queued(log, queue, first)) else count
        # The scan reads ahead in the window; the run is then framed from `first`, so
        # the window goes back to where it was if it still holds those bytes.
        base, file_position, position, offset = (
            window.base,
            window.file_position,
            window.position,
            window.offset,
        )
        checked = min(count, fresh_from - first)
        for index in range(checked):
            if expired(read_queued(log, queue, first + index)):
                count = index
                break
        if window.base == base and window.file_position == file_position and base >= 0:
            window.position, window.offset = position, offset
        return count

    return run_length


def _read_taken(log: SegmentLog, queue: Queue, ready: ReadyMessage) -> fmt.Record:
    try:
        return read_message(log, ready.offset)
    except MessageUnreadable as exc:
        queue.cursor.untake(ready.offset)
        if isinstance(exc.__cause__, RecordDamaged):  # not the queue's failure
            queue.cursor.note_damage(exc.__cause__)
        raise
