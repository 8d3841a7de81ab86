"""A vhost's settling and dead-lettering: where a delivered message goes when it is done.

Owns what happens to a message after delivery or instead of it: settled for good (an
ack; on a stream, the consumer's tracked offset moves), requeued (a nack, reject or
recover with requeue, a channel closed with it unacked; `x-delivery-limit` counted),
rejected without requeue, dropped from the head (a drop-head length limit, after a
publish or a requeue, as RabbitMQ), or expired (per-queue and per-message TTL, at the
head, by the housekeeping timer or on a declare, and in runs where timestamps allow).
Whatever dies this way is dead-lettered: republished to the queue's dead-letter exchange
with its death recorded in `x-death` (runs of like messages share one splice and one
route, `DeadLetterRun`), dropped without one, or, for an at-least-once queue, held by
its `DeadLetters` (which this object owns) until every target has a copy.

A dead letter is a publish: it goes through the `Publisher` and the `Router` like any
other. A requeue asks the `Schedule` for a drain, or, for a batch a client expects
delivered at once, calls `deliver_now`, which the vhost wires in (delivery is the
component above this one: it takes expired messages out of its rounds through
`expired`, `dead_letter_record` and `expire_head_from` here). It knows no AMQP: the
gateway's `PropertiesCodec` (on the `Router`) reads expirations and writes deaths.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Final

from streamq.broker.dead_letters import DeadLetters
from streamq.broker.deadletter import DeadLetterRun, dead_letter_copy, may_expire
from streamq.broker.delivery import MessageUnreadable, read_message, read_queued
from streamq.broker.queue import Consumer, Queue
from streamq.broker.streams import track
from streamq.broker.vhost_publish import Publisher
from streamq.broker.vhost_routing import Router
from streamq.broker.vhost_schedule import Schedule
from streamq.log.errors import ReadFailed
from streamq.log.format import Record
from streamq.log.log import RunMessage

EXPIRE_RUN_MAX: Final = 4096  # expired messages read, dead-lettered and settled per run


class Settler:
    """Settling, requeueing, expiry and dead-lettering for the queues of one vhost."""

    __slots__ = (
        "dead_letter_route",
        "dead_letters",
        "deliver_now",
        "fail_queue",
        "kick",
        "log",
        "publish",
        "publish_run",
        "queues",
        "router",
        "schedule",
    )

    def __init__(self, router: Router, publisher: Publisher, schedule: Schedule) -> None:
        self.router = router
        self.queues = router.queues  # the registry's, read only
        self.log = publisher.log
        self.schedule = schedule
        # The collaborators' calls this object makes, bound once (as they were methods of
        # one class before, the moved code reads as it did).
        self.publish = publisher.publish
        self.publish_run = publisher.publish_run
        self.dead_letter_route = router.dead_letter_route
        self.kick = schedule.kick
        self.fail_queue = schedule.fail_queue
        self.dead_letters = DeadLetters(router, publisher, schedule)  # of at-least-once queues
        # Wired in by the vhost: hand a queue's ready messages to its consumers now.
        self.deliver_now: Callable[[Queue], None] = _unwired

    def settle(self, queue: Queue, offset: int, consumer: Consumer | None = None) -> None:
        """The message left `queue` for good (acked, or rejected without requeue)."""
        if queue.stream is not None:
            # Reading a stream consumes nothing: the ack returned credit, and moves the
            # consumer's stored offset if it tracks one.
            if consumer is not None:
                track(queue.stream, consumer, offset)
            return
        if self.queues.get(queue.name) is not queue:
            return  # deleted meanwhile: nothing is held for it any more
        queue.cursor.ack(offset)

    def settle_classic(self, queue: Queue, offsets: list[int]) -> None:
        """`settle` of several messages of one classic queue (acks with `multiple`)."""
        if self.queues.get(queue.name) is not queue:
            return  # deleted meanwhile: nothing is held for it any more
        queue.cursor.ack_many(offsets)

    def requeue(self, queue: Queue, offset: int, consumer: Consumer | None = None) -> None:
        """Back to the queue; on a stream, back to the consumer that had it, if it is
        still there (nothing to do otherwise: the message stays in the stream). A
        drop-head length limit applies after it, as RabbitMQ applies it after a requeue."""
        self._requeue(queue, offset, consumer)
        self._drop_head_requeued(queue)

    def requeue_many(
        self, entries: Iterable[tuple[Queue, int, Consumer | None]], *, deliver: bool
    ) -> None:
        """`requeue` of a batch (a group of a nack, a reject or a recover, or what a
        closed channel held): every message back in its place first, then each queue's
        drop-head limit once, as RabbitMQ's requeue_and_run drops from the head after the
        whole batch (dropping per message would dead-letter in another order); with
        `deliver`, the queue then delivers at once, as requeue_and_run does, before the
        caller's next batch."""
        queues: dict[Queue, None] = {}
        for queue, offset, consumer in entries:
            self._requeue(queue, offset, consumer)
            queues[queue] = None
        for queue in queues:
            self._drop_head_requeued(queue)
            if deliver:
                self.deliver_now(queue)

    def _drop_head_requeued(self, queue: Queue) -> None:
        if queue.stream is not None or queue.overflow != "drop-head":
            return
        limited = queue.max_length is not None or queue.max_length_bytes is not None
        if limited and self.queues.get(queue.name) is queue:
            self.drop_head(queue, int(time.time() * 1000))

    def _requeue(self, queue: Queue, offset: int, consumer: Consumer | None) -> None:
        if queue.stream is not None:
            if consumer is not None and consumer in queue.consumers:
                consumer.stream_redeliver.append(offset)
                queue.stats.redeliver += 1
                self.kick(queue)
            return
        if self.queues.get(queue.name) is not queue:
            return  # deleted meanwhile: nothing is held for it any more
        limit = queue.delivery_limit
        if limit is not None and queue.cursor.delivery_count(offset) > limit:
            # Requeued more often than x-delivery-limit allows (each delivery but this
            # one ended in a requeue): dead-lettered, or dropped without a DLX.
            self.dead_letter(queue, offset, "delivery_limit", int(time.time() * 1000))
            return
        queue.cursor.requeue(offset)
        queue.stats.redeliver += 1
        self.kick(queue)

    def drop_head(self, queue: Queue, now_ms: int) -> None:
        """drop-head: dead-letter (reason maxlen) from the head while over a limit (a
        publish or a requeue went over it)."""
        while queue.over_limit(0, 0):
            taken = queue.cursor.take()
            if taken is None:
                return
            self.dead_letter_taken(queue, taken.offset, "maxlen", now_ms)

    def expired(self, queue: Queue, record: Record, now_ms: int) -> bool:
        ttl = queue.message_ttl_ms
        codec = self.router.properties_codec
        if codec is not None and may_expire(record.properties):
            own = codec.expiration_ms(record.properties)
            if own is not None:
                ttl = own if ttl is None else min(ttl, own)
        return ttl is not None and now_ms >= record.timestamp_ms + ttl and ttl >= 0

    def _expiry_check(
        self, queue: Queue, now_ms: int, fresh_from: int | None
    ) -> Callable[[int], Record | None]:
        """The record of the message at an offset of `queue` if it has expired at
        `now_ms`, else None; those from `fresh_from` on that were never delivered wait
        for their first delivery round and have not (see `take`). Reads the record
        (MessageUnreadable)."""
        log = self.log
        # Nothing in a queue is at the log's next offset or past it.
        fresh_min = log.next_offset if fresh_from is None else fresh_from
        delivered = queue.cursor.delivery_count  # looked up only from fresh_min on

        def expired(offset: int) -> Record | None:
            if offset >= fresh_min and delivered(offset) == 0:
                return None
            record = read_queued(log, queue, offset)
            return record if self.expired(queue, record, now_ms) else None

        return expired

    def fresh_from_offset(self, queue: Queue) -> int | None:
        """Where the messages of `queue` that wait for their first delivery round start,
        None if none wait: a round is due after each enqueue to a queue with consumers
        (the queue is dirty until the gateway's next drain, in the next loop turn)."""
        return queue.fresh_offset_min if queue in self.schedule.dirty else None

    def expire_heads(self, now_ms: int) -> int:
        """Dead-letter what has expired at the head of each queue, consumers or not (as
        RabbitMQ); returns how many. The housekeeping timer calls it."""
        return sum(self.expire_head(queue, now_ms) for queue in list(self.queues.values()))

    def expire_head(self, queue: Queue, now_ms: int) -> int:
        """Dead-letter what has expired at the head of `queue`; returns how many.
        RabbitMQ drops such messages when they expire (at once for a TTL of 0 unless a
        consumer takes it on arrival), so a declare-ok or get-ok never counts them: those
        call it, and housekeeping. Messages that wait for their first delivery round (see
        `take`) stay for it."""
        return self.expire_head_from(queue, now_ms, self.fresh_from_offset(queue))

    def expire_head_from(self, queue: Queue, now_ms: int, fresh_from: int | None) -> int:
        """`expire_head`, the messages from `fresh_from` on that were never delivered
        left for their first delivery round (a delivery round passes its own)."""
        if queue.stream is not None or queue.failed is not None:
            return 0
        if queue.message_ttl_ms is None and not queue.holds_expiring:
            return 0
        if queue in self.schedule.read_held:
            return 0  # its last read failed (EIO): read again after the retry interval
        expired_runs = 0
        if not queue.holds_expiring and queue.max_priority is None and not queue.at_least_once:
            try:
                expired_runs = self._expire_head_runs(queue, now_ms, fresh_from)
            except MessageUnreadable as exc:
                self.schedule.unreadable(queue, exc)
                return 0
        run: list[DeadLetterRun | None] = [None]
        cursor = queue.cursor

        def dead_letter(offset: int, record: object) -> None:
            # Each expired message is read once and dead-lettered right away: a run of
            # them with the same exchange, routing key and properties (say, one
            # publisher's) shares one x-death splice and one route (`DeadLetterRun`).
            assert isinstance(record, Record)
            if queue.at_least_once:
                self.dead_letters.hold(queue, offset, "expired", now_ms, taken=record)
                return
            run[0] = self.dead_letter_record(queue, record, "expired", now_ms, run[0])
            cursor.dropped(offset, len(record.body))

        expired = self._expiry_check(queue, now_ms, fresh_from)
        if queue.at_least_once:
            expired = self.dead_letters.bounded(expired)  # the rest at the next tick
        try:
            taken = cursor.take_expired(expired, dead_letter)
        except MessageUnreadable as exc:
            self.schedule.unreadable(queue, exc)
            return 0
        return expired_runs + len(taken)

    def _expire_head_runs(self, queue: Queue, now_ms: int, fresh_from: int | None) -> int:
        """`_expire_head` for a queue whose only TTL is its own, in runs: the expired
        messages at its head that were never delivered are read in order (timestamps
        never decrease along the log, so they end at the first one that has not
        expired), taken as one run, dead-lettered as runs of publishes and settled as
        one journal entry. What is left (requeued messages) takes the general path.
        Returns how many expired. Raises MessageUnreadable."""
        ttl = queue.message_ttl_ms
        if ttl is None or ttl < 0:
            return 0
        cursor = queue.cursor
        log = self.log
        fresh_min = log.next_offset if fresh_from is None else fresh_from
        published_max_ms = now_ms - ttl  # expired: published at or before this
        total = 0
        while True:
            first, count = cursor.fresh_head_run()
            count = min(count, fresh_min - first, EXPIRE_RUN_MAX)
            if count <= 0:
                return total
            records: list[Record] = []
            for offset in range(first, first + count):
                record = read_queued(log, queue, offset)
                if record.timestamp_ms > published_max_ms:
                    break
                records.append(record)
            if not records:
                return total
            taken, taken_count = cursor.take_run(len(records))
            assert (taken, taken_count) == (first, len(records))
            self._dead_letter_records(queue, records, "expired", now_ms)
            cursor.dropped_run(first, len(records), sum(len(r.body) for r in records))
            total += len(records)
            if len(records) < count:
                return total

    def _dead_letter_records(
        self, queue: Queue, records: list[Record], reason: str, now_ms: int
    ) -> None:
        """Dead-letter `records` of `queue`, in order: those that share exchange, routing
        key and properties with the one before share its x-death splice and route, and
        are published as one run (`publish_run`) where it takes them."""
        index = 0
        while index < len(records):
            head = records[index]
            run = self.dead_letter_record(queue, head, reason, now_ms)
            end = index + 1
            while end < len(records) and (
                records[end].properties == head.properties
                and records[end].exchange == head.exchange
                and records[end].routing_key == head.routing_key
            ):
                end += 1
            rest = records[index + 1 : end]
            if rest and run is not None and run.targets:
                exchange_name = queue.dead_letter_exchange or ""
                # A publish run's items as the gateway's scan gives them (what follows
                # properties and body is not read by `publish_run`).
                messages: list[RunMessage] = [
                    (run.properties, r.body, exchange_name, run.dead_routing_key, 0) for r in rest
                ]
                if not self.publish_run(
                    exchange_name, run.dead_routing_key, messages, run.targets, now_ms
                ):
                    for record in rest:  # a limit or a stream on the way: one by one
                        self.dead_letter_record(queue, record, reason, now_ms, run)
            index = end

    def reject(self, queue: Queue, offset: int, consumer: Consumer | None = None) -> None:
        """A nack or reject without requeue: dead-lettered, or dropped without a DLX."""
        if queue.stream is not None:
            self.settle(queue, offset, consumer)
            return
        if self.queues.get(queue.name) is not queue:
            return  # deleted meanwhile: nothing to dead-letter from, nothing to release
        self.dead_letter(queue, offset, "rejected", int(time.time() * 1000))

    def dead_letter(self, queue: Queue, offset: int, reason: str, now_ms: int) -> None:
        """Move the message in flight at `offset` out of `queue`: republish it to the
        dead-letter exchange with its death recorded, or drop it (no DLX, a missing one,
        or a cycle); an at-least-once queue holds it until its targets have it."""
        if queue.at_least_once:
            if not self.dead_letters.hold(queue, offset, reason, now_ms):
                self.requeue(queue, offset)  # its read failed (EIO): it stays queued
            return
        if queue.dead_letter_exchange is not None:
            try:
                record = read_message(self.log, offset)
            except MessageUnreadable as exc:
                self.schedule.unreadable(queue, exc)
                if isinstance(exc.__cause__, ReadFailed):
                    self.requeue(queue, offset)  # not lost: dead-lettered when rejected again
                return
            self.dead_letter_record(queue, record, reason, now_ms)
        self.settle(queue, offset)

    def dead_letter_taken(self, queue: Queue, offset: int, reason: str, now_ms: int) -> None:
        """`dead_letter` of a message just taken from the cursor, not delivered."""
        try:
            record = read_queued(self.log, queue, offset)
        except MessageUnreadable as exc:
            queue.cursor.untake(offset)
            self.schedule.unreadable(queue, exc)
            return
        self.dead_letter_record(queue, record, reason, now_ms)
        queue.cursor.dropped(offset, len(record.body))

    def dead_letter_record(
        self,
        queue: Queue,
        record: Record,
        reason: str,
        now_ms: int,
        run: DeadLetterRun | None = None,
    ) -> DeadLetterRun | None:
        """Republish `record` as a dead letter of `queue`; returns what a following
        message of the same run can reuse (see `expire_head_from`)."""
        exchange_name = queue.dead_letter_exchange
        codec = self.router.properties_codec
        if exchange_name is None or codec is None or exchange_name not in self.router.exchanges:
            return None
        body = record.body
        properties_raw = record.properties
        exchange = record.exchange.decode("utf-8", "surrogateescape")
        routing_key = record.routing_key.decode("utf-8", "surrogateescape")
        if (
            run is not None
            and run.properties_raw == properties_raw
            and run.exchange == exchange
            and run.routing_key == routing_key
        ):
            self.publish(
                exchange_name,
                run.dead_routing_key,
                run.properties,
                body,
                run.targets,
                now_ms,
            )
            return run
        copy = dead_letter_copy(
            codec, queue, record, reason, now_ms // 1000, self.dead_letter_route(exchange_name)
        )
        self.publish(exchange_name, copy.routing_key, copy.properties, body, copy.targets, now_ms)
        return DeadLetterRun(
            properties_raw, exchange, routing_key, copy.routing_key, copy.properties, copy.targets
        )


def _unwired(queue: Queue) -> None:
    raise AssertionError("the vhost wires this in before the first requeue")
