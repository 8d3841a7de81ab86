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
  allows; several share a queue round robin, one message each, as RabbitMQ does.
- A requeued message (redelivered, with a delivery count to show) and every message of
  a queue with TTLs go one at a time through `Consumer.deliver`, with the record read
  and checked by `SegmentLog.read_record`.

It knows no AMQP: the consumer (the gateway) writes the frames.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from streamq.broker.queue import Consumer, Queue
from streamq.log import format as fmt
from streamq.log.errors import LogError, OffsetOutOfRange, RecordDamaged, SegmentCorrupted
from streamq.log.log import SegmentLog
from streamq.queues.classic import ReadyMessage


class MessageUnreadable(Exception):
    """A queued message could not be read back from the log."""


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
    consumers: list[Consumer],
    take: Callable[[], tuple[ReadyMessage, fmt.Record] | None] | None,
    budget: int,
    runs_from: Callable[[int], bool] | None = None,
) -> tuple[int, bool]:
    """Deliver to `consumers` in turn while one has credit; returns the budget left and
    whether the queue ran out of ready messages. `take` (queues with TTLs) takes one
    message at a time, its record read; without it, runs go out where they can. With
    both, `runs_from(first)` says whether a run from offset `first` on may go out
    whole (nothing in it expired: a queue TTL with the head not expired, since
    timestamps never decrease along the log). Raises MessageUnreadable."""
    count = len(consumers)
    if count > 1 and consumers is queue.consumers:
        return _rotate(log, queue, take, budget)
    cursor = queue.cursor
    index = queue.next_consumer
    idle = 0
    empty = False
    budget_given = budget
    no_ack = 0
    single = count > 1 or (take is not None and runs_from is None)
    while idle < count and budget > 0:
        consumer = consumers[index % count]
        index += 1
        credit = consumer.credit()
        if credit <= 0:
            idle += 1
            continue
        idle = 0
        if not single:
            first, got = cursor.take_run(min(credit, budget))
            if got and runs_from is not None and not runs_from(first):
                cursor.untake_run(first, got)  # its head expired: one at a time
                got = 0
            if got:
                sent = deliver_run(log, queue, consumer, first, got)
                if consumer.no_ack:
                    cursor.ack_many(list(range(first, first + sent)))
                    no_ack += sent
                budget -= sent
                continue
        if take is not None:
            taken = take()
        else:
            ready = cursor.take()
            taken = None if ready is None else (ready, _read_taken(log, queue, ready))
        if taken is None:
            # This consumer got nothing: its turn is the next message's, as in
            # RabbitMQ, where only a consumer that received moves to the back.
            index -= 1
            empty = True
            break
        ready, record = taken
        consumer.deliver(queue, ready, record)
        cursor.delivered(ready.offset, len(record.body))
        if consumer.no_ack:
            cursor.ack(ready.offset)
            no_ack += 1
        budget -= 1
    queue.next_consumer = index % count
    # Counted once per batch, not per message (the hot path).
    stats = queue.stats
    stats.deliver += budget_given - budget - no_ack
    stats.deliver_no_ack += no_ack
    return budget, empty


def _rotate(
    log: SegmentLog,
    queue: Queue,
    take: Callable[[], tuple[ReadyMessage, fmt.Record] | None] | None,
    budget: int,
) -> tuple[int, bool]:
    """`round_robin` over all of a queue's consumers (one priority, not single active)
    in RabbitMQ's order (`Queue.turns`): one message each, the head of the turns first,
    which then goes to their tail; a consumer without credit is parked, and comes back
    at the tail once it has credit again (RabbitMQ's unblock). An index that skips the
    consumers without credit served them in another order once one came back."""
    turns, cursor = queue.turns, queue.cursor
    if queue.parked:
        parked, queue.parked = queue.parked, []
        for consumer in parked:
            (turns if consumer.credit() > 0 else queue.parked).append(consumer)
    empty, budget_given, no_ack = False, budget, 0
    while turns and budget > 0:
        if not cursor.message_count:
            # Nothing to hand out: no consumer is tried, so none is parked (RabbitMQ's
            # run_message_queue looks at the queue before its consumers).
            empty = True
            break
        consumer = turns[0]
        if consumer.credit() <= 0:
            queue.parked.append(turns.popleft())
            continue
        if take is not None:
            taken = take()
        else:
            ready = cursor.take()
            taken = None if ready is None else (ready, _read_taken(log, queue, ready))
        if taken is None:
            empty = True  # the head keeps its turn for the next message, as in RabbitMQ
            break
        turns.rotate(-1)
        ready, record = taken
        consumer.deliver(queue, ready, record)
        cursor.delivered(ready.offset, len(record.body))
        if consumer.no_ack:
            cursor.ack(ready.offset)
            no_ack += 1
        budget -= 1
    stats = queue.stats
    stats.deliver += budget_given - budget - no_ack
    stats.deliver_no_ack += no_ack
    return budget, empty


def _read_taken(log: SegmentLog, queue: Queue, ready: ReadyMessage) -> fmt.Record:
    try:
        return read_message(log, ready.offset)
    except MessageUnreadable as exc:
        queue.cursor.untake(ready.offset)
        if isinstance(exc.__cause__, RecordDamaged):  # not the queue's failure
            queue.cursor.note_damage(exc.__cause__)
        raise
