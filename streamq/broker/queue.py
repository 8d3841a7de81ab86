"""A queue as the broker core sees it: its declaration, its cursor and its consumers.

Owns a queue's identity (name, flags, arguments, exclusive owner), the consumers attached
to it and the round-robin order in which they get messages. The cursor
(`streamq.queues.classic`) owns the message order as offsets of the vhost's log, which
holds the contents; the read window (`streamq.queues.window`) is the queue's place in
that log.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from operator import attrgetter
from typing import Protocol

from streamq.broker.equivalence import QUEUE_CHECKED_ARGUMENTS, check_arguments
from streamq.broker.errors import PreconditionFailed, ResourceLocked
from streamq.broker.expiration import EXPIRY_NONE
from streamq.broker.queue_arguments import max_priority, smaller
from streamq.broker.stats import MessageStats
from streamq.broker.turns import Turns
from streamq.log.format import Record
from streamq.queues.classic import ClassicQueue, ReadyMessage
from streamq.queues.journal import QueueJournal
from streamq.queues.offsets import AckWatermark
from streamq.queues.priority import PriorityQueue
from streamq.queues.stream import StreamQueue
from streamq.queues.window import ReadWindow


class Consumer(Protocol):
    """What the broker needs of a consumer; the gateway implements it."""

    tag: str
    no_ack: bool
    exclusive: bool
    priority: int  # x-priority: higher gets messages first
    # Stream queues only: the next offset to read, and offsets nacked with requeue, which
    # go to this consumer again first.
    stream_position: int
    stream_redeliver: deque[int]
    stream_tracker: AckWatermark | None  # x-stream-automatic-offset-tracking
    stream_window: ReadWindow | None  # its place in the stream's log, while it reads

    @property
    def stream_filtered(self) -> bool:
        """x-stream-filter was given: ask `accepts` for every record."""

    def accepts(self, properties_raw: bytes) -> bool:
        """Whether a stream record passes this consumer's filter."""

    def can_take(self) -> bool:
        """Whether prefetch allows one more delivery now."""

    def credit(self) -> int:
        """How many more deliveries prefetch allows now (0: none)."""

    def deliver(self, queue: Queue, message: ReadyMessage, record: Record) -> None:
        """Send the message; the consumer accounts for it (delivery tag, credit)."""

    def deliver_records(
        self,
        queue: Queue,
        records: bytes | bytearray | memoryview,
        position: int,
        first: int,
        count: int,
    ) -> tuple[int, int, int, list[int]]:
        """Send the never-delivered messages at offsets `first` .. `first + count - 1`,
        whose log records are in `records` from `position` on (earlier records passed
        over); stops at the end of the whole records given. Returns (how many went out,
        where the next record starts, its offset or -1, their body sizes)."""

    def deliver_stream_records(
        self,
        queue: Queue,
        records: bytes | bytearray | memoryview,
        position: int,
        first: int,
        count: int,
    ) -> tuple[int, int, int, bool]:
        """`deliver_records` for a stream consumer (never redelivered, each with its
        offset to show), counted in the queue's stats. Returns (how many went out, where
        the next record starts, its offset or -1, whether it stopped before a record
        that `deliver` must send)."""

    def cancel_by_broker(self) -> None:
        """The queue is gone or failed: tell the client (consumer_cancel_notify)."""


_PRIORITY_OF = attrgetter("priority")


class Queue:
    __slots__ = (
        "arguments",
        "at_least_once",
        "auto_delete",
        "consumers",
        "cursor",
        "dead_letter_exchange",
        "dead_letter_routing_key",
        "durable",
        "exclusive_owner",
        "failed",
        "fresh_offset_min",
        "had_consumers",
        "holds_expiring",
        "in_flow",
        "last_used_s",
        "level_of",
        "levels",
        "max_length",
        "max_length_bytes",
        "message_ttl_ms",
        "name",
        "next_consumer",
        "overflow",
        "own_expiry_min_ms",
        "policy",
        "stats",
        "stream",
        "window",
    )

    def __init__(
        self,
        name: str,
        durable: bool,
        exclusive_owner: object | None,
        auto_delete: bool,
        arguments: Mapping[str, object],
    ) -> None:
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments)
        priorities = max_priority(self.arguments)
        self.cursor = ClassicQueue() if priorities is None else PriorityQueue(priorities)
        self.consumers: list[Consumer] = []
        self.next_consumer = 0
        # RabbitMQ's round robin (rabbit_queue_consumers): the consumers' turns, one
        # `Turns` per `x-priority` level, highest first (`levels`), each found by its
        # priority (`level_of`). The vhost adds and removes consumers (`join`, `leave`);
        # the gateway reports credit that may have grown (`unblock`).
        self.levels: list[Turns] = []
        self.level_of: dict[int, Turns] = {}
        self.had_consumers = False
        # Publisher flow control (classic queues): set by a delivery round that left every
        # consumer out of credit with a ready backlog past FLOW_READY_HIGH; cleared below
        # FLOW_READY_LOW, without consumers, or when the queue is deleted or fails. The
        # gateway holds a connection that publishes here (see VHost._drain_queue).
        self.in_flow = False
        self.failed: str | None = None  # why its durable state could not be restored
        self.stream: StreamQueue | None = None  # set for x-queue-type stream
        self.window = ReadWindow()  # classic queues: their place in the vhost's log
        self.policy: dict[str, object] = {}  # the effective policy definition
        self.stats = MessageStats()  # counted on the hot path, sampled for rates
        # From arguments and policy (see VHost._apply_policy): TTL and dead-lettering.
        self.message_ttl_ms: int | None = None
        # Set once a message with its own `expiration` was enqueued: only then does every
        # delivery check message TTLs (the check costs on the hot path).
        self.holds_expiring = False
        # Before this (ms since the epoch) no never-delivered message of the queue expires
        # by its own expiration: a lower bound, kept by `streamq.broker.expiration`.
        self.own_expiry_min_ms = EXPIRY_NONE
        # The first log offset that no complete delivery round (one that emptied the queue
        # or left every consumer out of credit) has offered yet, past all that came while
        # the queue had no consumer. Messages from here on that were never delivered do
        # not expire before a round offers them, as RabbitMQ hands a message to a consumer
        # with credit on arrival without looking at its expiry: so a TTL of 0 reaches a
        # ready consumer (VHost.take).
        self.fresh_offset_min = 0
        # Length limits (argument or policy, the stricter wins) and what happens beyond.
        self.max_length: int | None = None
        self.max_length_bytes: int | None = None
        self.overflow = "drop-head"
        self.dead_letter_exchange: str | None = None
        self.dead_letter_routing_key: str | None = None
        # At-least-once dead-lettering (`deadletter.at_least_once`): dead letters stay
        # held in the cursor until every target has them (`dead_letters.py`).
        self.at_least_once = False
        # x-expires: when the queue was last used (declared, consumed from, basic.get),
        # on the monotonic clock. A restart starts the lease again, as in RabbitMQ.
        self.last_used_s = time.monotonic()

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    def join(self, consumer: Consumer) -> None:
        """`consumer` takes turns at its priority's level, after those there (O(levels)
        for a new level)."""
        level = self.level_of.get(consumer.priority)
        if level is None:
            level = self.level_of[consumer.priority] = Turns(consumer.priority)
            self.levels.append(level)
            self.levels.sort(key=_PRIORITY_OF, reverse=True)
        level.add(consumer)

    def leave(self, consumer: Consumer) -> None:
        """`consumer` takes no more turns; an emptied level goes."""
        level = self.level_of[consumer.priority]
        level.remove(consumer)
        if not level:
            del self.level_of[consumer.priority]
            self.levels.remove(level)

    def clear_turns(self) -> None:
        self.levels = []
        self.level_of = {}

    def unblock(self, consumer: Consumer) -> None:
        """`consumer`'s credit may have grown (acks, flow, qos, a socket that drains):
        if it was parked without credit, it rejoins its level's turns at their tail
        (`Turns.unblock`), O(1). The gateway calls it; the drain's kick follows."""
        level = self.level_of.get(consumer.priority)
        if level is not None:
            level.unblock(consumer)

    def parked_at(self, consumer: Consumer) -> int | None:
        """When `consumer` was parked without credit (a number ordering parkings across
        queues), None if it takes turns or is not a consumer here."""
        level = self.level_of.get(consumer.priority)
        return None if level is None else level.parked_at(consumer)

    @property
    def message_count(self) -> int:
        """What queue.declare-ok reports: ready messages, or a stream's length."""
        if self.stream is not None:
            return self.stream.message_count
        return self.cursor.message_count

    @property
    def single_active(self) -> bool:
        """x-single-active-consumer: only the first consumer to subscribe gets messages,
        until it leaves (VHost._drain_queue); the others wait."""
        return self.arguments.get("x-single-active-consumer") is True

    def activity_status(self, consumer: Consumer) -> str:
        """RabbitMQ 3.10's consumer `activity_status`: "single_active" for the consumer
        that gets this single-active-consumer queue's messages, "waiting" for the others,
        "up" for every consumer of any other queue."""
        if not self.single_active:
            return "up"
        consumers = self.consumers
        return "single_active" if consumers and consumers[0] is consumer else "waiting"

    @property
    def single_active_consumer_tag(self) -> str | None:
        """The tag of the consumer a single-active-consumer queue delivers to; None
        without one (or for another kind of queue)."""
        consumers = self.consumers
        return consumers[0].tag if self.single_active and consumers else None

    @property
    def exclusive_consumer_tag(self) -> str | None:
        """The tag of the consumer that holds the queue with basic.consume exclusive."""
        return next((c.tag for c in self.consumers if c.exclusive), None)

    @property
    def max_priority(self) -> int | None:
        """x-max-priority: None for a queue without priorities."""
        cursor = self.cursor
        return cursor.max_priority if isinstance(cursor, PriorityQueue) else None

    @property
    def delivery_limit(self) -> int | None:
        """x-delivery-limit or policy delivery-limit (the smaller): how many times a
        message may be requeued before it is dead-lettered (reason delivery_limit)."""
        return smaller(self.arguments, "x-delivery-limit", self.policy, "delivery-limit")

    @property
    def consumer_timeout_ms(self) -> int | None:
        """x-consumer-timeout or policy consumer-timeout (the smaller); None: the
        broker's default applies."""
        return smaller(self.arguments, "x-consumer-timeout", self.policy, "consumer-timeout")

    @property
    def expires_ms(self) -> int | None:
        """x-expires or policy expires (the smaller): how long the queue may stay
        unused before it is deleted."""
        if "x-expires" not in self.arguments and "expires" not in self.policy:
            return None  # the common case, checked for every queue on every timer tick
        expires = smaller(self.arguments, "x-expires", self.policy, "expires")
        return expires if expires else None

    def expired(self, now_s: float) -> bool:
        """Whether the queue has gone unused for its x-expires (never while it has
        consumers: RabbitMQ counts a queue with consumers as used)."""
        expires = self.expires_ms
        if expires is None or self.consumers:
            return False
        return (now_s - self.last_used_s) * 1000 >= expires

    def over_limit(self, messages: int, size: int) -> bool:
        """Whether the queue would exceed a length limit with `messages` more ready
        messages of `size` bytes more; the dead letters it holds count, as RabbitMQ's
        quorum queues count theirs (rabbit_fifo:is_over_limit)."""
        cursor = self.cursor
        max_length = self.max_length
        if max_length is not None:
            held = cursor.message_count + len(cursor.dead)
            if held + messages > max_length:
                return True
        limit = self.max_length_bytes
        if limit is None:
            return False
        held_bytes = cursor.bytes_ready + (cursor.bytes_dead if cursor.dead else 0)
        return held_bytes + size > limit

    def refuses(self, size: int) -> bool:
        """Whether a publish of `size` bytes is refused here (full, and an overflow mode
        other than drop-head)."""
        return self.overflow != "drop-head" and self.over_limit(1, size)

    @property
    def persisted(self) -> bool:
        """Kept across a restart: durable and not exclusive (as RabbitMQ)."""
        return self.durable and self.exclusive_owner is None

    def attach_journal(self, journal: QueueJournal) -> None:
        cursor = self.cursor
        cursor.journal = journal
        journal.live_source = lambda: cursor.live_snapshot(self.holds_expiring)
        journal.live_entries = cursor.live_entries

    def check_equivalent(
        self,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: Mapping[str, object],
        vhost: str,
    ) -> None:
        """Raise PreconditionFailed, in RabbitMQ's words, if a redeclare differs
        (ResourceLocked, 405, if only the exclusive flag does, as RabbitMQ)."""
        for field, current, received in (
            ("durable", self.durable, durable),
            ("auto_delete", self.auto_delete, auto_delete),
        ):
            if current != received:
                raise PreconditionFailed(
                    f"inequivalent arg '{field}' for queue '{self.name}' in vhost '{vhost}': "
                    f"received '{str(received).lower()}' but current is '{str(current).lower()}'"
                )
        check_arguments(
            "queue", self.name, vhost, self.arguments, arguments, QUEUE_CHECKED_ARGUMENTS
        )
        if self.exclusive != exclusive:
            raise ResourceLocked(locked_text(self.name, vhost))


def locked_text(name: str, vhost: str) -> str:
    """RabbitMQ's 405 text for a queue another connection holds exclusively."""
    return (
        f"cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost}'. "
        "It could be originally declared on another connection or the exclusive "
        "property value does not match that of the original declaration."
    )
