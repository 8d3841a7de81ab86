"""Message TTL and dead-lettering, RabbitMQ's way.

Owns the rules: a message expires `x-message-ttl` (argument or policy `message-ttl`, the
smaller wins) or its own `expiration` (the smaller of the two) after it was published,
and an expired message never reaches a consumer; a message that expires or is rejected
without requeue goes to the queue's dead-letter exchange (`x-dead-letter-exchange` /
policy `dead-letter-exchange`, with the routing key `x-dead-letter-routing-key` or its
own and its `CC` keys), carrying the `x-death` header, or is dropped when there is none
or it is missing.
A message that would go round a cycle of queues without any rejection is dropped.
Dead-lettering is at most once (the copy is published once, and the message leaves its
queue whatever became of it), except on a queue that `at_least_once` names: those hold
their dead letters until every target has them (`dead_letters.py`).

The AMQP property encoding is not the broker core's business: the gateway provides a
`PropertiesCodec` that reads `expiration` and writes `x-death`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from streamq.broker.queue import Queue
from streamq.broker.queue_arguments import OVERFLOW_MODES, QUORUM
from streamq.broker.raw_properties import EXPIRATION_FLAG
from streamq.log.format import Record


@dataclass(frozen=True, slots=True)
class Death:
    queue: str
    reason: str  # expired, rejected, maxlen, delivery_limit
    exchange: str
    routing_keys: tuple[str, ...]  # the message's routing key and its CC keys
    time_s: int
    # RabbitMQ removes CC when the queue has a dead-letter routing key (dlx.md, "Effects").
    remove_cc: bool = False


class DeadLetterRun(NamedTuple):
    """A dead letter as republished, for the next message of a run to reuse when its
    properties, exchange and routing key are the same (`VHost._expire_head`)."""

    properties_raw: bytes  # before
    exchange: str
    routing_key: str
    dead_routing_key: str  # what the copy is published with
    properties: bytes  # after: x-death added
    targets: list[Queue]


class PropertiesCodec(Protocol):
    def expiration_ms(self, properties_raw: bytes) -> int | None:
        """The message's own TTL (`expiration`, in ms), None if it has none or a bad one."""

    def cc_keys(self, properties_raw: bytes) -> tuple[str, ...]:
        """The routing keys of the message's `CC` header, () without one."""

    def deaths(self, properties_raw: bytes) -> list[tuple[str, str]]:
        """The (queue, reason) pairs of the message's `x-death` header, newest first."""

    def with_death(self, properties_raw: bytes, death: Death) -> bytes:
        """The properties with `death` recorded in `x-death` (and `x-first-death-*`), and
        without `expiration` (RabbitMQ drops it so the copy does not expire again), nor
        `CC` when `death.remove_cc`."""


class DeadLetterCopy(NamedTuple):
    """A dead letter as it is published: routing key, properties and target queues."""

    routing_key: str  # the first of the keys it was routed with
    properties: bytes  # x-death recorded
    targets: list[Queue]  # cycles left out


def dead_letter_copy(
    codec: PropertiesCodec,
    queue: Queue,
    record: Record,
    reason: str,
    time_s: int,
    route: Callable[[str, bytes], list[Queue]],
) -> DeadLetterCopy:
    """The copy of `record` that `queue` dead-letters for `reason` at `time_s`, routed by
    `route(routing key, properties)` on the queue's dead-letter exchange."""
    properties_raw = record.properties
    exchange = record.exchange.decode("utf-8", "surrogateescape")
    routing_key = record.routing_key.decode("utf-8", "surrogateescape")
    # As RabbitMQ: x-death lists the routing key and the CC keys; without a
    # dead-letter routing key the copy is routed with all of them (BCC keys are
    # not stored, so they are not among them), with one the CC header goes.
    keys = (routing_key, *codec.cc_keys(properties_raw))
    own_key = queue.dead_letter_routing_key
    death = Death(queue.name, reason, exchange, keys, time_s, own_key is not None)
    properties = codec.with_death(properties_raw, death)
    # A first death (no x-death yet: the common case) needs no decoding back.
    deaths = codec.deaths(properties) if b"x-death" in properties_raw else [(queue.name, reason)]
    route_keys = keys if own_key is None else (own_key,)
    routed = route(route_keys[0], properties)
    for key in route_keys[1:]:
        routed += [q for q in route(key, properties) if q not in routed]
    # deaths[0] is this one: a queue already on the way back is a cycle unless a
    # rejection came in between.
    targets = [q for q in routed if not cycles(deaths, q.name)]
    return DeadLetterCopy(route_keys[0], properties, targets)


def at_least_once(
    arguments: Mapping[str, object], policy: Mapping[str, object], overflow: str
) -> bool:
    """Whether the queue dead-letters at least once. As RabbitMQ 3.10's quorum queues
    (rabbit_quorum_queue:dead_letter_handler): its `x-dead-letter-strategy` (else the
    policy's `dead-letter-strategy`) is `at-least-once`, its overflow `reject-publish`
    and it has a dead-letter exchange; any other combination dead-letters at most once.
    A classic queue refuses the argument at declare (`queue_arguments.py`) and ignores
    the policy key, as RabbitMQ."""
    if arguments.get("x-queue-type") != QUORUM or overflow != "reject-publish":
        return False
    strategy = arguments.get("x-dead-letter-strategy", policy.get("dead-letter-strategy"))
    exchange, _ = dead_letter_target(arguments, policy)
    return strategy == "at-least-once" and exchange is not None


def may_expire(properties_raw: bytes) -> bool:
    """Whether the properties carry an `expiration` (a flag bit: no decoding)."""
    return bool(properties_raw) and bool(properties_raw[0] & EXPIRATION_FLAG)


def ttl_of(arguments: Mapping[str, object], policy: Mapping[str, object]) -> int | None:
    """The queue's message TTL: the smaller of argument and policy; None without one."""
    values = [
        v
        for v in (arguments.get("x-message-ttl"), policy.get("message-ttl"))
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0
    ]
    return min(values) if values else None


def dead_letter_target(
    arguments: Mapping[str, object], policy: Mapping[str, object]
) -> tuple[str | None, str | None]:
    """(exchange, routing key) for dead letters: arguments win over the policy."""
    exchange = arguments.get("x-dead-letter-exchange", policy.get("dead-letter-exchange"))
    key = arguments.get("x-dead-letter-routing-key", policy.get("dead-letter-routing-key"))
    return (
        exchange if isinstance(exchange, str) else None,
        key if isinstance(key, str) else None,
    )


def cycles(deaths: list[tuple[str, str]], target: str) -> bool:
    """RabbitMQ's cycle rule: the message has died in `target` before, and none of its
    deaths since was a rejection (a client's decision breaks the cycle)."""
    for queue, reason in deaths:
        if reason == "rejected":
            return False
        if queue == target:
            return True
    return False


def length_limits(
    arguments: Mapping[str, object], policy: Mapping[str, object]
) -> tuple[int | None, int | None, str]:
    """(max messages, max bytes, overflow) of a classic queue: for each limit the smaller
    of argument and policy; the overflow mode of the argument, else the policy's. A
    quorum queue takes `reject-publish-dlx` and overflows with `drop-head`, as RabbitMQ
    3.10 does (rabbit_quorum_queue:overflow/3 logs a warning and uses its default)."""

    def smaller(*values: object) -> int | None:
        numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
        return min(numbers) if numbers else None

    overflow = arguments.get("x-overflow", policy.get("overflow", "drop-head"))
    if overflow == "reject-publish-dlx" and arguments.get("x-queue-type") == QUORUM:
        overflow = "drop-head"
    return (
        smaller(arguments.get("x-max-length"), policy.get("max-length")),
        smaller(arguments.get("x-max-length-bytes"), policy.get("max-length-bytes")),
        overflow if isinstance(overflow, str) and overflow in OVERFLOW_MODES else "drop-head",
    )
