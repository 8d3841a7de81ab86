"""A virtual host: its exchanges, queues and bindings, and the routing of messages.

Owns the entity registry of one vhost, the shared message log of its classic queues
(each routed message is appended once, whatever the number of queues it goes to; the
queues hold offsets in it and read their messages back from it, `delivery.py`), and
the hand-over of ready messages to consumers. It is synchronous and single-threaded; the
gateway calls `drain` when the vhost asks for it through `wakeup`, so that deliveries are
batched per event-loop turn.

Durability: durable exchanges, durable non-exclusive queues and the bindings between
durable ends are recorded in the definitions journal; each such queue records its
messages in its own journal (`streamq.queues.journal`). Both are sync companions of the
log, so one fsync round covers messages, queue journals and definitions alike. Opening a
vhost restores all of it before it returns: nothing is served before that.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Final

from streamq.broker.dead_letters import DeadLetters
from streamq.broker.deadletter import (
    DeadLetterRun,
    PropertiesCodec,
    dead_letter_copy,
    may_expire,
)
from streamq.broker.definitions import (
    COMPACT_SLACK_RECORDS,
    Op,
)
from streamq.broker.delivery import MessageUnreadable, read_message, read_queued, round_robin
from streamq.broker.errors import (
    AccessRefused,
    QueueUnavailable,
)
from streamq.broker.exchange import Destination
from streamq.broker.parameters import RuntimeParameters
from streamq.broker.queue import Consumer, Queue
from streamq.broker.stats import MessageStats
from streamq.broker.streams import (
    drain_stream,
    track,
)
from streamq.broker.vhost_entities import Entities
from streamq.broker.vhost_policies import PolicySet
from streamq.broker.vhost_publish import Publisher
from streamq.broker.vhost_routing import RouteFields, Router
from streamq.broker.vhost_schedule import Schedule
from streamq.broker.vhost_store import (
    Storage,
)
from streamq.log.errors import LogError
from streamq.log.format import Record
from streamq.log.log import RunMessage
from streamq.log.syncer import Syncer
from streamq.queues.classic import ReadyMessage

logger = logging.getLogger(__name__)


DRAIN_DELIVERIES_MAX: Final = 4096  # per queue per drain, so one queue cannot starve others
EXPIRE_RUN_MAX: Final = 4096  # expired messages read, dead-lettered and settled per run
# Publisher flow control: a classic queue whose consumers are all out of credit after a
# delivery round and whose ready backlog exceeds the high mark is "in flow" (publishers to
# it are held briefly) until the backlog falls below the low mark.
FLOW_READY_HIGH: Final = 10_000
FLOW_READY_LOW: Final = FLOW_READY_HIGH // 2
ROUTE_DEPTH_MAX: Final = 64  # exchange-to-exchange hops followed for one message
DEFAULT_EXCHANGE_REFUSED: Final = "operation not permitted on the default exchange"
_DEFAULT_EXCHANGE: Final = Destination("exchange", "")


class VHost:
    def __init__(
        self, name: str, directory: str, syncer: Syncer, *, failover: bool = False
    ) -> None:
        """Open the vhost and restore its durable state (blocking: start-up only). With
        `failover` (a node promoted to cluster leader), every message restored into a
        classic queue comes back flagged redelivered (see `VHostStore._restore_cursor`).

        Raises LogError, DefinitionsCorrupted and OSError.
        """
        self.name = name
        self.directory = directory
        self.storage = Storage(name, directory, syncer, failover=failover)
        self.log = self.storage.log
        self.schedule = Schedule(name)
        self.kick = self.schedule.kick
        self.fail_queue = self.schedule.fail_queue
        self.stream_appended = self.schedule.stream_appended
        self.streams_to_sync = self.schedule.streams_to_sync
        self.sync_stream = self.schedule.sync_stream
        self.publisher = Publisher(name, directory, self.log, self.schedule)
        self.publish = self.publisher.publish
        self.publish_run = self.publisher.publish_run
        self.delay = self.publisher.delay
        self.due_delayed = self.publisher.due_delayed
        self.duplicate_free = self.publisher.duplicate_free
        self.delayed = self.publisher.delayed
        self.queue_dedupers = self.publisher.queue_dedupers
        ops = self.storage.open_definitions()
        self.definitions = self.storage.definitions
        self.policy_set = PolicySet(name, self.definitions)
        self.policies = self.policy_set.policies
        self.operator_policies = self.policy_set.operator_policies
        self.set_policy = self.policy_set.set_policy
        self.clear_policy = self.policy_set.clear_policy
        self.apply_policies = self.policy_set.apply_policies
        self.entities = Entities(name, self.storage, self.policy_set, self.publisher, self.schedule)
        self.policy_set.queues = self.entities.queues
        self.policy_set.exchanges = self.entities.exchanges
        self.exchanges = self.entities.exchanges
        self.queues = self.entities.queues
        self.exchange = self.entities.exchange
        self.declare_exchange = self.entities.declare_exchange
        self.delete_exchange = self.entities.delete_exchange
        self.bind = self.entities.bind
        self.unbind = self.entities.unbind
        self.queue = self.entities.queue
        self.declare_queue = self.entities.declare_queue
        self.delete_queue = self.entities.delete_queue
        self.remove_queue = self.entities.remove_queue
        self.purge_queue = self.entities.purge_queue
        self.expire_queues = self.entities.expire_queues
        self.retired_stats = self.entities.retired_stats
        self.binding_listeners = self.entities.binding_listeners
        self.stream_removed_listeners = self.entities.stream_removed_listeners
        self.router = Router(self.entities)
        self.route = self.router.route
        self.route_run = self.router.route_run
        self.dead_letter_route = self.router.dead_letter_route
        # Shovels and federation upstreams, recorded in the definitions journal.
        self.parameters = RuntimeParameters(name, self.definitions.record)
        # Message statistics (streamq.broker.stats): confirms and unroutable publishes,
        # and exchanges' publishes by name (deleted queues' counts: `retired_stats`).
        self.stats = MessageStats()
        self.exchange_stats: dict[str, MessageStats] = {}
        # Followers of queue changes (federation: streamq.links): `queue_listeners[name]`
        # are called after a drain round of that queue and when it loses a consumer (its
        # demand may have changed).
        self.queue_listeners: dict[str, list[Callable[[Queue], None]]] = {}
        for op in ops:
            self._replay(op)
        snapshot = self._snapshot()
        if len(ops) > len(snapshot) + COMPACT_SLACK_RECORDS:
            self.definitions.replace(snapshot)
        self.dead_letters = DeadLetters(self)  # held by at-least-once queues
        self.publisher.stream_count = self.storage.restore_queues(
            self.queues.values(), self.dead_letters.restore
        )
        self.publisher.restore(self.exchanges, self.queues.values())
        self.publisher.drain_queue = self._drain_queue
        self.publisher.drop_head = self._drop_head
        self.publisher.dead_letter_record = self._dead_letter_record
        self.policy_set.drop_dead_letters = self.dead_letters.drop
        self.entities.expire_head = self.expire_head
        self.apply_policies()
        self.log.add_sync_companion(self.storage.prepare_sync)

    # -- messages --------------------------------------------------------------------------

    def _drop_head(self, queue: Queue, now_ms: int) -> None:
        """drop-head: dead-letter (reason maxlen) from the head while over a limit."""
        while queue.over_limit(0, 0):
            taken = queue.cursor.take()
            if taken is None:
                return
            self.dead_letter_taken(queue, taken.offset, "maxlen", now_ms)

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

    def deliver_now(self, queue: Queue) -> None:
        """Hand `queue`'s ready messages to its consumers with credit now, not at the end
        of the loop turn (where RabbitMQ's queue process delivers within one event)."""
        if queue.consumers and self.queues.get(queue.name) is queue:
            self._drain_queue(queue)

    def _drop_head_requeued(self, queue: Queue) -> None:
        if queue.stream is not None or queue.overflow != "drop-head":
            return
        limited = queue.max_length is not None or queue.max_length_bytes is not None
        if limited and self.queues.get(queue.name) is queue:
            self._drop_head(queue, int(time.time() * 1000))

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

    def collect_segments(self) -> int:
        """Delete log segments that no queue needs any more (`Storage.collect_segments`)."""
        return self.storage.collect_segments(self.queues.values())

    async def sync(self) -> int:
        """Make every published message durable (group commit with all other callers),
        streams included."""
        # A delayed message touches no log record: wait for a round of the companions.
        durable = await self.log.sync(companions=self.delayed.unsynced)
        for queue in list(self.schedule.streams_unsynced):
            if queue.stream is not None:
                await queue.stream.log.sync()
        return durable

    # -- consumers -------------------------------------------------------------------------

    # -- TTL and dead letters ----------------------------------------------------------------

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
        Raises QueueUnavailable when the message cannot be read (the queue fails)."""
        try:
            taken = self.take(queue, now_ms)
        except MessageUnreadable as exc:
            self.fail_queue(queue, str(exc))
            raise QueueUnavailable(queue.name, self.name, str(exc)) from exc
        if taken is not None:
            ready, record = taken
            queue.cursor.delivered(ready.offset, len(record.body))
        return taken

    def _expired(self, queue: Queue, record: Record, now_ms: int) -> bool:
        ttl = queue.message_ttl_ms
        codec = self.properties_codec
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
            return record if self._expired(queue, record, now_ms) else None

        return expired

    def _runs_from(self, queue: Queue, now_ms: int, fresh_from: int) -> Callable[[int], bool]:
        """For a queue whose only TTL is its own (no message carries an expiration):
        whether the never-delivered messages from an offset on may go out as a run
        without an expiry check each. Those of the round (from `fresh_from` on) may (see
        `take`); an older run may if its first message has not expired, since
        timestamps never decrease along the log."""
        ttl = queue.message_ttl_ms
        log = self.log

        def runs_from(first: int) -> bool:
            if first >= fresh_from:
                return True
            if ttl is None or ttl < 0:
                return True
            return now_ms < read_queued(log, queue, first).timestamp_ms + ttl

        return runs_from

    def _fresh_from(self, queue: Queue) -> int | None:
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
        return self._expire_head(queue, now_ms, self._fresh_from(queue))

    def _expire_head(self, queue: Queue, now_ms: int, fresh_from: int | None) -> int:
        if queue.stream is not None or queue.failed is not None:
            return 0
        if queue.message_ttl_ms is None and not queue.holds_expiring:
            return 0
        expired_runs = 0
        if not queue.holds_expiring and queue.max_priority is None and not queue.at_least_once:
            try:
                expired_runs = self._expire_head_runs(queue, now_ms, fresh_from)
            except MessageUnreadable as exc:
                self.fail_queue(queue, str(exc))
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
            run[0] = self._dead_letter_record(queue, record, "expired", now_ms, run[0])
            cursor.dropped(offset, len(record.body))

        expired = self._expiry_check(queue, now_ms, fresh_from)
        if queue.at_least_once:
            expired = self.dead_letters.bounded(expired)  # the rest at the next tick
        try:
            taken = cursor.take_expired(expired, dead_letter)
        except MessageUnreadable as exc:
            self.fail_queue(queue, str(exc))
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
            run = self._dead_letter_record(queue, head, reason, now_ms)
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
                        self._dead_letter_record(queue, record, reason, now_ms, run)
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
            self.dead_letters.hold(queue, offset, reason, now_ms)
            return
        if queue.dead_letter_exchange is not None:
            try:
                record = read_message(self.log, offset)
            except MessageUnreadable as exc:
                self.fail_queue(queue, str(exc))
                return
            self._dead_letter_record(queue, record, reason, now_ms)
        self.settle(queue, offset)

    def dead_letter_taken(self, queue: Queue, offset: int, reason: str, now_ms: int) -> None:
        """`dead_letter` of a message just taken from the cursor, not delivered."""
        try:
            record = read_queued(self.log, queue, offset)
        except MessageUnreadable as exc:
            queue.cursor.untake(offset)
            self.fail_queue(queue, str(exc))
            return
        self._dead_letter_record(queue, record, reason, now_ms)
        queue.cursor.dropped(offset, len(record.body))

    def _dead_letter_record(
        self,
        queue: Queue,
        record: Record,
        reason: str,
        now_ms: int,
        run: DeadLetterRun | None = None,
    ) -> DeadLetterRun | None:
        """Republish `record` as a dead letter of `queue`; returns what a following
        message of the same run can reuse (see `_expire_head`)."""
        exchange_name = queue.dead_letter_exchange
        codec = self.properties_codec
        if exchange_name is None or codec is None or exchange_name not in self.exchanges:
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

    def add_consumer(self, queue: Queue, consumer: Consumer) -> None:
        if any(c.exclusive for c in queue.consumers):
            raise AccessRefused(f"queue '{queue.name}' in vhost '{self.name}' in exclusive use")
        if consumer.exclusive and queue.consumers:
            raise AccessRefused(f"queue '{queue.name}' in vhost '{self.name}' in exclusive use")
        if not queue.consumers:
            # What came while nobody consumed was not offered on arrival: its TTL counts.
            queue.fresh_offset_min = self.log.next_offset
        queue.consumers.append(consumer)
        queue.turns.append(consumer)
        queue.had_consumers = True
        self.kick(queue)
        self._queue_changed(queue)

    def remove_consumer(self, queue: Queue, consumer: Consumer) -> None:
        if consumer in queue.consumers:
            queue.consumers.remove(consumer)
            if consumer in queue.turns:
                queue.turns.remove(consumer)
            elif consumer in queue.parked:
                queue.parked.remove(consumer)
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
        if queue.stream is not None:
            try:
                if drain_stream(queue, queue.stream):
                    self.kick(queue)
            except LogError as exc:
                self.fail_queue(queue, f"its log failed: {exc}")
            return
        consumers = queue.consumers
        if not consumers:
            queue.in_flow = False
            queue.window.release()
            return
        take: Callable[[], tuple[ReadyMessage, Record] | None] | None = None
        runs_from: Callable[[int], bool] | None = None
        # With TTLs, the round offers what came since the last complete one (see `take`),
        # up to the log's end now; a round is complete when it empties the queue or
        # leaves every consumer out of credit.
        offered_end = None
        if queue.message_ttl_ms is not None or queue.holds_expiring:
            now_ms = int(time.time() * 1000)
            fresh_from, offered_end = queue.fresh_offset_min, self.log.next_offset

            def take() -> tuple[ReadyMessage, Record] | None:
                return self.take(queue, now_ms, fresh_from)

            if not queue.holds_expiring:
                runs_from = self._runs_from(queue, now_ms, fresh_from)

        if queue.single_active:
            groups = [consumers[:1]]  # the first consumer to subscribe, until it leaves
        elif any(c.priority for c in consumers):
            groups = priority_groups(consumers)  # x-priority: higher ones first
        else:
            groups = [consumers]
        budget = DRAIN_DELIVERIES_MAX
        for group in groups:
            try:
                budget, empty = round_robin(self.log, queue, group, take, budget, runs_from)
            except MessageUnreadable as exc:
                self.fail_queue(queue, str(exc))
                return
            if empty:
                queue.in_flow = False
                queue.window.release()
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

    # -- the schedule's state, as the gateways read and set it -------------------------------

    @property
    def dirty(self) -> set[Queue]:
        return self.schedule.dirty

    @property
    def wakeup(self) -> Callable[[], None]:
        return self.schedule.wakeup

    @wakeup.setter
    def wakeup(self, wakeup: Callable[[], None]) -> None:
        self.schedule.wakeup = wakeup

    @property
    def default_queue_type(self) -> str | None:
        return self.entities.default_queue_type

    @default_queue_type.setter
    def default_queue_type(self, queue_type: str | None) -> None:
        self.entities.default_queue_type = queue_type

    @property
    def decode_for_route(self) -> Callable[[bytes], RouteFields]:
        return self.router.decode_for_route

    @decode_for_route.setter
    def decode_for_route(self, decode: Callable[[bytes], RouteFields]) -> None:
        self.router.decode_for_route = decode

    @property
    def properties_codec(self) -> PropertiesCodec | None:
        return self.router.properties_codec

    @properties_codec.setter
    def properties_codec(self, codec: PropertiesCodec | None) -> None:
        self.router.properties_codec = codec

    @property
    def publish_rejected(self) -> bool:
        """Whether the last publish was refused by a full queue (the gateway reads
        `publisher.publish_rejected` on its publish path)."""
        return self.publisher.publish_rejected

    @property
    def on_delay(self) -> Callable[[int], None]:
        return self.publisher.on_delay

    @on_delay.setter
    def on_delay(self, on_delay: Callable[[int], None]) -> None:
        self.publisher.on_delay = on_delay

    @property
    def streams_unsynced(self) -> set[Queue]:
        return self.schedule.streams_unsynced

    @property
    def stream_synced_listeners(self) -> list[Callable[[Queue], None]]:
        return self.schedule.stream_synced_listeners

    def needs_sync(self) -> bool:
        """Whether definitions, queue journals or delayed messages hold changes not yet
        written."""
        return self.storage.needs_sync() or self.delayed.dirty

    async def sync_all(self) -> None:
        """Make every change so far durable: messages, queue journals, definitions."""
        await self.storage.sync_all()

    async def aclose(self) -> None:
        """Write and fsync everything buffered (after any round in flight), then close."""
        try:
            await self.storage.close(self.queues.values())
        finally:
            self._close_journals()

    def close(self) -> None:
        """Write and fsync everything buffered, then close (blocking: shutdown only)."""
        try:
            self.storage.close_blocking(self.queues.values())
        finally:
            self._close_journals()

    def _close_journals(self) -> None:
        self.storage.close_journals(self.queues.values())
        self.delayed.close()

    # -- replaying and snapshotting the definitions journal -------------------------------

    def _replay(self, op: Op) -> None:
        """Replay one definitions record: a change, applied without side effects, by the
        component whose state it records. Raises DefinitionsCorrupted."""
        kind = op["op"]
        if kind in ("policy", "operator_policy", "policy.delete", "operator_policy.delete"):
            self.policy_set.restore(op)
        elif kind in ("parameter", "parameter.delete"):
            self.parameters.restore(op)
        else:
            self.entities.restore(op)

    def _snapshot(self) -> list[Op]:
        """The definitions records that recreate every durable entity, policy and
        parameter as it is now."""
        return self.entities.ops() + self.policy_set.ops() + self.parameters.ops()


def priority_groups(consumers: list[Consumer]) -> list[list[Consumer]]:
    """Consumers grouped by `x-priority`, highest first, each group in subscription order:
    a lower group gets messages only while every higher one is out of credit."""
    groups: dict[int, list[Consumer]] = {}
    for consumer in consumers:
        groups.setdefault(consumer.priority, []).append(consumer)
    return [groups[p] for p in sorted(groups, reverse=True)]
