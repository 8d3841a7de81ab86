"""A vhost's delivery: handing the ready messages of its queues to their consumers.

Owns the drain rounds (`drain`, once per event-loop turn over the queues the `Schedule`
holds due, and `deliver_now` within one event, as RabbitMQ's queue process delivers
there), which consumers of a queue take part and in what order (single active consumer,
`x-priority` groups, round robin: `delivery.round_robin`, which writes the runs), the
TTL rules of a round (what came since the last round is offered before it expires, as
RabbitMQ offers a message to a consumer with credit on arrival), basic.get, the
consumers joining and leaving a queue, and publisher flow control (a queue "in flow"
while its consumers are out of credit and its backlog is high). It also owns the
followers of those changes (`queue_listeners`: federation reads a queue's demand).

What a round finds expired is dead-lettered by the `Settler` (`expired`,
`dead_letter_record`, `expire_head_from`, `fresh_from_offset`, and its `DeadLetters` for
at-least-once queues); this is the top component of the vhost below `VHost` itself.
The collaborators' calls it makes are bound once in `__init__`, under the names they
had when all of this was one class. It knows no AMQP: the consumer (the gateway)
writes the frames.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from streamq.broker.delivery import (
    MessageUnreadable,
    RunLength,
    read_queued,
    round_robin,
    unexpired_runs,
)
from streamq.broker.errors import AccessRefused, MessageReadFailed, QueueUnavailable
from streamq.broker.expiration import EXPIRY_NONE
from streamq.broker.queue import Consumer, Queue
from streamq.broker.streams import drain_stream
from streamq.broker.turns import Turns
from streamq.broker.vhost_entities import Entities
from streamq.broker.vhost_schedule import Schedule
from streamq.broker.vhost_settle import Settler
from streamq.log.errors import LogError, ReadFailed
from streamq.log.format import Record
from streamq.queues.classic import ReadyMessage

DRAIN_DELIVERIES_MAX: Final = 4096  # per queue per drain, so one queue cannot starve others
# Publisher flow control: a classic queue whose consumers are all out of credit after a
# delivery round and whose ready backlog exceeds the high mark is "in flow" (publishers to
# it are held briefly) until the backlog falls below the low mark.
FLOW_READY_HIGH: Final = 10_000
FLOW_READY_LOW: Final = FLOW_READY_HIGH // 2


class Delivery:
    """The drain rounds, consumers and basic.get of the queues of one vhost."""

    __slots__ = (
        "_dead_letter_record",
        "_expire_head",
        "_expired",
        "_fresh_from",
        "dead_letters",
        "fail_queue",
        "kick",
        "log",
        "name",
        "queue_listeners",
        "queues",
        "remove_queue",
        "schedule",
    )

    def __init__(self, entities: Entities, settler: Settler, schedule: Schedule) -> None:
        self.name = entities.name
        self.log = settler.log
        self.schedule = schedule
        self.queues = entities.queues  # the registry's, read only
        # Followers of queue changes (federation: streamq.links): `queue_listeners[name]`
        # are called after a drain round of that queue and when it loses a consumer (its
        # demand may have changed).
        self.queue_listeners: dict[str, list[Callable[[Queue], None]]] = {}
        # The collaborators' calls this object makes, bound once, under the names they
        # had when this code was part of one class (the moved bodies read as they did).
        self.kick = schedule.kick
        self.fail_queue = schedule.fail_queue
        self.remove_queue = entities.remove_queue
        self.dead_letters = settler.dead_letters
        self._expired = settler.expired
        self._dead_letter_record = settler.dead_letter_record
        self._expire_head = settler.expire_head_from
        self._fresh_from = settler.fresh_from_offset

    def take(
        self, queue: Queue, now_ms: int, fresh_from: int | None = None
    ) -> tuple[ReadyMessage, Record] | None:
        """The next message of a classic queue for a consumer or basic.get, with its
        record, taken from the cursor (the caller marks it delivered); expired ones on
        the way are dead-lettered (or dropped), never delivered; so are those at the head
        once it is taken, as RabbitMQ's fetch drops them: basic.get-ok's message_count
        leaves them out. Raises MessageUnreadable.

        A delivery round passes `fresh_from` (`Queue.fresh_offset_min`): the messages
        from that offset on that were never delivered are its to offer and do not expire
        first, as RabbitMQ gives a message to a consumer with credit on arrival whatever
        its TTL (a requeued one expires, as RabbitMQ's requeue drops it). basic.get
        passes none: it never returns a message whose TTL has passed, not even one of 0."""
        while True:
            ready = queue.cursor.take()
            if ready is None:
                return None
            try:
                record = read_queued(self.log, queue, ready.offset)
            except MessageUnreadable:
                queue.cursor.untake(ready.offset)
                if queue.cursor.damage_noted():
                    continue  # lost to bit rot: the cursor drops it (log/damage.py)
                raise
            if fresh_from is not None and ready.offset >= fresh_from and not ready.redelivered:
                break
            if not self._expired(queue, record, now_ms):
                break
            if queue.at_least_once:
                self.dead_letters.hold(queue, ready.offset, "expired", now_ms, taken=record)
                continue
            self._dead_letter_record(queue, record, "expired", now_ms)
            queue.cursor.dropped(ready.offset, len(record.body))
        self._expire_head(
            queue, now_ms, self._fresh_from(queue) if fresh_from is None else fresh_from
        )
        return ready, record

    def get(self, queue: Queue, now_ms: int) -> tuple[ReadyMessage, Record] | None:
        """basic.get: `take`, and the message is in flight (settle or requeue it).
        Raises QueueUnavailable when the message cannot be read (the queue fails), and
        MessageReadFailed for an I/O error reading it (the queue goes on, the message
        stays in it)."""
        try:
            taken = self.take(queue, now_ms)
        except MessageUnreadable as exc:
            if isinstance(exc.__cause__, ReadFailed):  # EIO: this get fails, not the queue
                self.schedule.read_failed(queue, str(exc))
                raise MessageReadFailed(queue.name, self.name, str(exc)) from exc
            self.fail_queue(queue, str(exc))
            raise QueueUnavailable(queue.name, self.name, str(exc)) from exc
        if taken is not None:
            ready, record = taken
            queue.cursor.delivered(ready.offset, len(record.body))
        return taken

    def add_consumer(self, queue: Queue, consumer: Consumer) -> None:
        if any(c.exclusive for c in queue.consumers):
            raise AccessRefused(f"queue '{queue.name}' in vhost '{self.name}' in exclusive use")
        if consumer.exclusive and queue.consumers:
            raise AccessRefused(f"queue '{queue.name}' in vhost '{self.name}' in exclusive use")
        if not queue.consumers:
            # What came while nobody consumed was not offered on arrival: its TTL counts.
            queue.fresh_offset_min = self.log.next_offset
        queue.consumers.append(consumer)
        queue.join(consumer)
        queue.had_consumers = True
        self.kick(queue)
        self._queue_changed(queue)

    def remove_consumer(self, queue: Queue, consumer: Consumer) -> None:
        if consumer in queue.consumers:
            queue.consumers.remove(consumer)
            queue.leave(consumer)
            queue.last_used_s = time.monotonic()  # the x-expires lease starts again
        if not queue.consumers:
            queue.in_flow = False
        if queue.auto_delete and not queue.consumers and queue.name in self.queues:
            self.remove_queue(queue)
        self._queue_changed(queue)

    def _queue_changed(self, queue: Queue) -> None:
        for listener in tuple(self.queue_listeners.get(queue.name, ())):
            listener(queue)

    def drain(self) -> None:
        """Hand ready messages to consumers with credit, round robin per queue."""
        dirty = self.schedule.dirty
        self.schedule.dirty = set()
        for queue in dirty:
            self._drain_queue(queue)
            if self.queue_listeners:
                self._queue_changed(queue)

    def _drain_queue(self, queue: Queue) -> None:
        if self.schedule.read_held and queue in self.schedule.read_held:
            return  # its last read failed (EIO): the retry comes (`Schedule.retry_reads`)
        if queue.stream is not None:
            try:
                if drain_stream(queue, queue.stream):
                    self.kick(queue)
            except MessageUnreadable as exc:  # EIO: that consumer's read, not the stream
                self.schedule.read_failed(queue, str(exc), exc.consumer)
            except LogError as exc:
                self.fail_queue(queue, f"its log failed: {exc}")
            return
        consumers = queue.consumers
        if not consumers:
            queue.in_flow = False
            queue.window.release()
            return
        take: Callable[[], tuple[ReadyMessage, Record] | None] | None = None
        runs_from: RunLength | None = None
        # With TTLs, the round offers what came since the last complete one (see `take`),
        # up to the log's end now; a round is complete when it empties the queue or
        # leaves every consumer out of credit.
        offered_end = None
        if queue.message_ttl_ms is not None or queue.holds_expiring:
            now_ms = int(time.time() * 1000)
            fresh_from, offered_end = queue.fresh_offset_min, self.log.next_offset

            def take() -> tuple[ReadyMessage, Record] | None:
                return self.take(queue, now_ms, fresh_from)

            runs_from = unexpired_runs(
                self.log,
                queue,
                fresh_from,
                lambda record: self._expired(queue, record, now_ms),
                now_ms,
            )

        groups: list[list[Consumer]] | list[Turns]
        if queue.single_active:
            groups = [consumers[:1]]  # the first consumer to subscribe, until it leaves
        elif len(consumers) == 1:
            groups = [consumers]  # alone: no turns to keep
        else:
            groups = queue.levels  # x-priority levels, highest first; O(1) per level
        budget = DRAIN_DELIVERIES_MAX
        for group in groups:
            try:
                budget, empty = round_robin(self.log, queue, group, take, budget, runs_from)
            except MessageUnreadable as exc:
                self.schedule.unreadable(queue, exc, exc.consumer)
                return
            if empty:
                queue.in_flow = False
                queue.window.release()
                if not queue.cursor.message_count:
                    # No never-delivered message is left: none bounds the next ones.
                    queue.own_expiry_min_ms = EXPIRY_NONE
                if offered_end is not None:
                    queue.fresh_offset_min = offered_end
                return
            if budget <= 0:  # the next round offers the rest
                self.kick(queue)
                if queue.in_flow and queue.cursor.message_count < FLOW_READY_LOW:
                    queue.in_flow = False
                return
        if offered_end is not None:
            # What the consumers, all out of credit now, could not take had its chance: a
            # TTL of 0 at the head expires at once, as in RabbitMQ on arrival.
            queue.fresh_offset_min = offered_end
            self._expire_head(queue, now_ms, offered_end)
        # Every consumer is out of credit: flow control (one comparison per round).
        ready = queue.cursor.message_count
        if ready > FLOW_READY_HIGH:
            queue.in_flow = True
        elif ready < FLOW_READY_LOW:
            queue.in_flow = False

    # The publisher's name for it: a queue with consumers drained before a limit counts.
    drain_queue = _drain_queue

    def deliver_now(self, queue: Queue) -> None:
        """Hand `queue`'s ready messages to its consumers with credit now, not at the end
        of the loop turn (where RabbitMQ's queue process delivers within one event)."""
        if queue.consumers and self.queues.get(queue.name) is queue:
            self._drain_queue(queue)
