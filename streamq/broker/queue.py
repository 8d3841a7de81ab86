"""A queue as the broker core sees it: its declaration, its cursor and its consumers.

Owns a queue's identity (name, flags, arguments, exclusive owner), the consumers attached
to it and the round-robin order in which they get messages. The cursor
(`streamq.queues.classic`) owns the message order; the vhost owns message contents.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Protocol

from streamq.broker.equivalence import QUEUE_CHECKED_ARGUMENTS, check_arguments
from streamq.broker.errors import PreconditionFailed, ResourceLocked
from streamq.queues.classic import ClassicQueue, ReadyMessage
from streamq.queues.journal import QueueJournal
from streamq.queues.offsets import AckWatermark
from streamq.queues.stream import StreamQueue


class StoredMessage:
    """A routed message's contents, shared by every queue it went to (`refs` of them)."""

    __slots__ = (
        "body",
        "exchange",
        "offset",
        "properties_raw",
        "refs",
        "routing_key",
        "timestamp_ms",
    )

    def __init__(
        self,
        offset: int,
        exchange: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
        refs: int,
        timestamp_ms: int = 0,
    ) -> None:
        self.offset = offset
        self.timestamp_ms = timestamp_ms  # when it was published: TTLs count from here
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties_raw = properties_raw
        self.body = body
        self.refs = refs


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

    @property
    def stream_filtered(self) -> bool:
        """x-stream-filter was given: ask `accepts` for every record."""

    def accepts(self, properties_raw: bytes) -> bool:
        """Whether a stream record passes this consumer's filter."""

    def can_take(self) -> bool:
        """Whether prefetch allows one more delivery now."""

    def deliver(self, queue: Queue, message: ReadyMessage, stored: StoredMessage) -> None:
        """Send the message; the consumer accounts for it (delivery tag, credit)."""

    def cancel_by_broker(self) -> None:
        """The queue is gone or failed: tell the client (consumer_cancel_notify)."""


class Queue:
    __slots__ = (
        "arguments",
        "auto_delete",
        "consumers",
        "cursor",
        "dead_letter_exchange",
        "dead_letter_routing_key",
        "durable",
        "exclusive_owner",
        "failed",
        "had_consumers",
        "holds_expiring",
        "max_length",
        "max_length_bytes",
        "message_ttl_ms",
        "name",
        "next_consumer",
        "overflow",
        "policy",
        "stream",
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
        self.cursor = ClassicQueue()
        self.consumers: list[Consumer] = []
        self.next_consumer = 0
        self.had_consumers = False
        self.failed: str | None = None  # why its durable state could not be restored
        self.stream: StreamQueue | None = None  # set for x-queue-type stream
        self.policy: dict[str, object] = {}  # the effective policy definition
        # From arguments and policy (see VHost._apply_policy): TTL and dead-lettering.
        self.message_ttl_ms: int | None = None
        # Set once a message with its own `expiration` was enqueued: only then does every
        # delivery check message TTLs (the check costs on the hot path).
        self.holds_expiring = False
        # Length limits (argument or policy, the stricter wins) and what happens beyond.
        self.max_length: int | None = None
        self.max_length_bytes: int | None = None
        self.overflow = "drop-head"
        self.dead_letter_exchange: str | None = None
        self.dead_letter_routing_key: str | None = None

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        """What queue.declare-ok reports: ready messages, or a stream's length."""
        if self.stream is not None:
            return self.stream.message_count
        return self.cursor.message_count

    @property
    def persisted(self) -> bool:
        """Kept across a restart: durable and not exclusive (as RabbitMQ)."""
        return self.durable and self.exclusive_owner is None

    def attach_journal(self, journal: QueueJournal) -> None:
        self.cursor.journal = journal
        journal.live_source = self.cursor.live_snapshot

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
