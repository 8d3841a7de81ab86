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
from collections.abc import Callable
from typing import Final

from streamq.broker.deadletter import (
    PropertiesCodec,
)
from streamq.broker.definitions import (
    COMPACT_SLACK_RECORDS,
    Op,
)
from streamq.broker.delivery import MessageUnreadable, read_queued, round_robin
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
)
from streamq.broker.vhost_entities import Entities
from streamq.broker.vhost_policies import PolicySet
from streamq.broker.vhost_publish import Publisher
from streamq.broker.vhost_routing import RouteFields, Router
from streamq.broker.vhost_schedule import Schedule
from streamq.broker.vhost_settle import Settler
from streamq.broker.vhost_store import (
    Storage,
)
from streamq.log.errors import LogError
from streamq.log.format import Record
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
        self.settler = Settler(self.router, self.publisher, self.schedule)
        self.settle = self.settler.settle
        self.settle_classic = self.settler.settle_classic
        self.requeue = self.settler.requeue
        self.requeue_many = self.settler.requeue_many
        self.reject = self.settler.reject
        self.dead_letter = self.settler.dead_letter
        self.dead_letter_taken = self.settler.dead_letter_taken
        self.expire_heads = self.settler.expire_heads
        self.expire_head = self.settler.expire_head
        self.dead_letters = self.settler.dead_letters
        self._expired = self.settler.expired
        self._dead_letter_record = self.settler.dead_letter_record
        self._expire_head = self.settler.expire_head_from
        self._fresh_from = self.settler.fresh_from_offset
        self.publisher.stream_count = self.storage.restore_queues(
            self.queues.values(), self.dead_letters.restore
        )
        self.publisher.restore(self.exchanges, self.queues.values())
        self.publisher.drain_queue = self._drain_queue
        self.publisher.drop_head = self.settler.drop_head
        self.publisher.dead_letter_record = self.settler.dead_letter_record
        self.policy_set.drop_dead_letters = self.dead_letters.drop
        self.entities.expire_head = self.settler.expire_head
        self.settler.deliver_now = self.deliver_now
        self.dead_letters.drain = self.drain
        self.apply_policies()
        self.log.add_sync_companion(self.storage.prepare_sync)

    # -- messages --------------------------------------------------------------------------

    def deliver_now(self, queue: Queue) -> None:
        """Hand `queue`'s ready messages to its consumers with credit now, not at the end
        of the loop turn (where RabbitMQ's queue process delivers within one event)."""
        if queue.consumers and self.queues.get(queue.name) is queue:
            self._drain_queue(queue)

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
