"""Length limits against requeues and bursts, as RabbitMQ's queue process applies them:
a drop-head limit after a requeued batch (requeue_and_run), and a publish handed to a
consumer with credit before it counts against the limit (attempt_delivery). The
differential scenarios of tests/differential/scenarios/deliveries.py compare the same
with RabbitMQ over the wire."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from amqp_gateway.codec import BasicProperties, encode_properties
from amqp_gateway.deaths import AmqpPropertiesCodec
from streamq.broker.queue import Queue
from streamq.broker.vhost import VHost
from streamq.log.syncer import Syncer
from tests.unit.broker.consumers import RecordingConsumer

PLAIN = encode_properties(BasicProperties())
LIMIT = 2


@pytest.fixture
def vhost(tmp_path: Path) -> Iterator[VHost]:
    host = VHost("/", str(tmp_path / "vh"), Syncer())
    host.properties_codec = AmqpPropertiesCodec()
    host.declare_queue("dead", False, True, False, False, {}, owner=None)
    yield host
    host.close()


def limited(vhost: VHost) -> Queue:
    arguments = {"x-max-length": LIMIT, "x-dead-letter-exchange": ""}
    arguments["x-dead-letter-routing-key"] = "dead"
    return vhost.declare_queue("q", False, True, False, False, arguments, owner=None)


def publish(vhost: VHost, queue: Queue, *bodies: bytes) -> None:
    for body in bodies:
        vhost.publish("", queue.name, PLAIN, body, [queue], 1_000)


def bodies(vhost: VHost, name: str) -> list[bytes]:
    """Every message of queue `name`, taken and settled in order."""
    queue, taken = vhost.queues[name], []
    while (got := vhost.get(queue, 0)) is not None:
        taken.append(got[1].body)
        vhost.settle(queue, got[0].offset)
    return taken


def test_a_requeued_batch_over_the_limit_drops_from_the_head_after_the_batch(
    vhost: VHost,
) -> None:
    queue = limited(vhost)
    publish(vhost, queue, b"m0", b"m1")
    first, second = vhost.get(queue, 0), vhost.get(queue, 0)
    assert first is not None and second is not None
    vhost.requeue(queue, first[0].offset)
    again = vhost.get(queue, 0)  # m0 once more, now after m1 in delivery order
    assert again is not None and again[1].body == b"m0"
    publish(vhost, queue, b"m2", b"m3")
    # Given back second then first: back in queue order, then the head is dropped.
    vhost.requeue_many(
        [(queue, second[0].offset, None), (queue, again[0].offset, None)], deliver=False
    )
    assert queue.cursor.message_count == LIMIT
    assert bodies(vhost, "dead") == [b"m0", b"m1"]
    assert bodies(vhost, "q") == [b"m2", b"m3"]


def test_a_single_requeue_over_the_limit_dead_letters_the_head(vhost: VHost) -> None:
    queue = limited(vhost)
    publish(vhost, queue, b"m0", b"m1")
    taken = vhost.get(queue, 0)
    assert taken is not None
    publish(vhost, queue, b"m2")
    vhost.requeue(queue, taken[0].offset)
    assert bodies(vhost, "dead") == [b"m0"]
    assert bodies(vhost, "q") == [b"m1", b"m2"]


def test_a_burst_goes_to_a_consumer_with_credit_before_the_limit_counts(vhost: VHost) -> None:
    queue = limited(vhost)
    consumer = RecordingConsumer(prefetch=3)
    vhost.add_consumer(queue, consumer)
    publish(vhost, queue, b"m0", b"m1", b"m2", b"m3", b"m4", b"m5")
    # Three for the consumer, then the limit keeps the last two of the rest.
    assert consumer.bodies == [b"m0", b"m1", b"m2"]
    assert bodies(vhost, "dead") == [b"m3"]
    assert bodies(vhost, "q") == [b"m4", b"m5"]
