"""Streams and super streams as RabbitMQ's stream plugin declares them, on the broker core.

Owns what the stream protocol and the management API's super-stream endpoint create and
remove: a stream is a durable queue with `x-queue-type: stream` (declared as an AMQP
client would, so that policies apply), with RabbitMQ's stream-protocol argument names
(`max-length-bytes`, `max-age`, `stream-max-segment-size-bytes`, `initial-cluster-size`)
turned into queue arguments; a super stream (RabbitMQ 3.13's layout) is a durable direct
exchange with `x-super-stream: true` whose bindings to its partition streams carry
`x-stream-partition-order`. It answers the protocol's Partitions and Route from those
bindings. It knows no frames nor response codes: errors are the broker core's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from streamq.broker.errors import NotFound, PreconditionFailed
from streamq.broker.exchange import Destination
from streamq.broker.queue import Queue
from streamq.broker.queue_arguments import STREAM
from streamq.broker.vhost import VHost

SUPER_STREAM_ARGUMENT: Final = "x-super-stream"
PARTITION_ORDER_ARGUMENT: Final = "x-stream-partition-order"
PARTITIONS_MAX: Final = 1024  # a bound on what one request may create
# The stream protocol's Create arguments (strings) -> queue arguments, with their types.
_INTEGER_ARGUMENTS: Final = {
    "max-length-bytes": "x-max-length-bytes",
    "stream-max-segment-size-bytes": "x-stream-max-segment-size-bytes",
    "initial-cluster-size": "x-initial-cluster-size",
}
_TEXT_ARGUMENTS: Final = {"max-age": "x-max-age", "queue-leader-locator": "x-queue-leader-locator"}


def stream_arguments(arguments: Mapping[str, str]) -> dict[str, object]:
    """Queue arguments of a stream created with the stream protocol's `arguments`.

    Raises PreconditionFailed for an unknown argument or an integer that is not one."""
    result: dict[str, object] = {"x-queue-type": STREAM}
    for key, value in arguments.items():
        if key in _INTEGER_ARGUMENTS:
            try:
                result[_INTEGER_ARGUMENTS[key]] = int(value)
            except ValueError:
                raise PreconditionFailed(f"invalid stream argument {key}={value!r}") from None
        elif key in _TEXT_ARGUMENTS:
            result[_TEXT_ARGUMENTS[key]] = value
        else:
            raise PreconditionFailed(f"unknown stream argument {key!r}")
    return result


def declare_stream(vhost: VHost, name: str, arguments: Mapping[str, object]) -> Queue:
    """Create the stream `name` (durable once the vhost's next sync round ends).

    Raises PreconditionFailed if a queue of that name exists (the caller tells an
    existing stream apart first), for bad arguments, and AccessRefused for `amq.*`."""
    if name in vhost.queues:
        raise PreconditionFailed(f"queue '{name}' in vhost '{vhost.name}' exists")
    return vhost.declare_queue(name, False, True, False, False, arguments, None)


def is_stream(vhost: VHost, name: str) -> bool:
    queue = vhost.queues.get(name)
    return queue is not None and queue.arguments.get("x-queue-type") == STREAM


def create_super_stream(
    vhost: VHost,
    name: str,
    partitions: Sequence[str],
    binding_keys: Sequence[str],
    arguments: Mapping[str, object],
) -> None:
    """Declare the super stream's exchange, its partition streams and their bindings
    (partition i bound with binding key i and order i). Durable after the vhost's next
    sync round. Raises PreconditionFailed for mismatched lists, an existing exchange or
    partition, and what declaring a stream raises."""
    if not partitions or len(partitions) != len(binding_keys) or len(partitions) > PARTITIONS_MAX:
        raise PreconditionFailed("a super stream needs as many binding keys as partitions")
    if len(set(partitions)) != len(partitions):
        raise PreconditionFailed("partition names must be distinct")
    if name in vhost.exchanges:
        raise PreconditionFailed(f"exchange '{name}' in vhost '{vhost.name}' exists")
    for partition in partitions:
        if partition in vhost.queues:
            raise PreconditionFailed(f"queue '{partition}' in vhost '{vhost.name}' exists")
    queue_arguments = {"x-queue-type": STREAM, **arguments}
    for partition in partitions:
        declare_stream(vhost, partition, queue_arguments)
    vhost.declare_exchange(name, "direct", False, True, False, False, {SUPER_STREAM_ARGUMENT: True})
    for order, (partition, key) in enumerate(zip(partitions, binding_keys, strict=True)):
        vhost.bind(Destination("queue", partition), name, key, {PARTITION_ORDER_ARGUMENT: order})


def delete_super_stream(vhost: VHost, name: str) -> None:
    """Delete the super stream's partition streams and its exchange. Raises NotFound."""
    streams = partitions(vhost, name)
    for stream in streams:
        queue = vhost.queues.get(stream)
        if queue is not None:
            vhost.remove_queue(queue)
    vhost.delete_exchange(name, False)


def partitions(vhost: VHost, name: str) -> list[str]:
    """The super stream's partition streams in partition order. Raises NotFound."""
    exchange = vhost.exchanges.get(name)
    if exchange is None:
        raise NotFound("exchange", name, vhost.name)
    ordered: dict[str, int] = {}
    for binding in exchange.bindings:
        if binding.destination.kind != "queue":
            continue
        order = dict(binding.arguments).get(PARTITION_ORDER_ARGUMENT, len(ordered))
        name_ = binding.destination.name
        if name_ not in ordered:
            ordered[name_] = order if isinstance(order, int) else len(ordered)
    return sorted(ordered, key=lambda n: (ordered[n], n))


def route(vhost: VHost, name: str, routing_key: str) -> list[str]:
    """The streams a direct super stream routes `routing_key` to. Raises NotFound."""
    exchange = vhost.exchanges.get(name)
    if exchange is None:
        raise NotFound("exchange", name, vhost.name)
    order = {stream: i for i, stream in enumerate(partitions(vhost, name))}
    found = {
        b.destination.name
        for b in exchange.bindings
        if b.destination.kind == "queue" and b.routing_key == routing_key
    }
    return sorted(found, key=lambda n: order.get(n, len(order)))
