"""A message TTL of 0 (`expiration="0"` or `x-message-ttl` 0), as RabbitMQ treats it: it
reaches a consumer that has credit when the message arrives (here: at the first delivery
round after it was enqueued), and otherwise expires, dead-lettered with reason `expired`;
basic.get never returns it. Each test drives the vhost directly with a consumer that
counts its credit, and runs the rounds (`drain`) by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_gateway.codec import BasicProperties, encode_properties
from amqp_gateway.deaths import AmqpPropertiesCodec
from streamq.broker.queue import Queue
from streamq.broker.vhost import VHost
from streamq.broker.vhost_delivery import DRAIN_DELIVERIES_MAX
from streamq.log.syncer import Syncer
from tests.unit.broker.consumers import RecordingConsumer

PLAIN = encode_properties(BasicProperties())
NOW = encode_properties(BasicProperties(expiration="0"))


def Consumer(prefetch: int) -> RecordingConsumer:
    return RecordingConsumer(prefetch)


@pytest.fixture
def vhost(tmp_path: Path):  # type: ignore[no-untyped-def]
    host = VHost("/", str(tmp_path), Syncer())
    host.properties_codec = AmqpPropertiesCodec()
    yield host
    host.close()


def declare(vhost: VHost, **arguments: object) -> Queue:
    """Queue "q", dead-lettering through the default exchange to "dlq"."""
    vhost.declare_queue("dlq", False, True, False, False, {}, owner=None)
    dead = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq", **arguments}
    return vhost.declare_queue("q", False, True, False, False, dead, owner=None)


def publish(vhost: VHost, body: bytes, properties: bytes = NOW) -> None:
    vhost.publish("", "q", properties, body, vhost.route("", "q", None))


def dead_letters(vhost: VHost) -> list[bytes]:
    dlq = vhost.queues["dlq"]
    got = []
    while (taken := vhost.get(dlq, 0)) is not None:
        ready, record = taken
        got.append(record.body)
        vhost.settle(dlq, ready.offset)
    return got


def ack_all(vhost: VHost, queue: Queue, consumer: Consumer) -> None:
    for offset in consumer.unacked:
        vhost.settle(queue, offset)
    consumer.unacked.clear()
    vhost.kick(queue)


def test_ttl_zero_reaches_a_consumer_with_credit_and_expires_past_its_credit(
    vhost: VHost,
) -> None:
    queue = declare(vhost)
    consumer = Consumer(prefetch=2)
    vhost.add_consumer(queue, consumer)
    for body in (b"plain", b"now 1", b"now 2"):
        publish(vhost, body, PLAIN if body == b"plain" else NOW)
    vhost.drain()
    assert consumer.bodies == [b"plain", b"now 1"]
    assert queue.cursor.message_count == 0, "the one it had no credit for expired at once"
    assert dead_letters(vhost) == [b"now 2"]
    ack_all(vhost, queue, consumer)
    vhost.drain()
    assert consumer.bodies == [b"plain", b"now 1"]


def test_ttl_zero_to_a_consumer_at_its_limit_expires_at_the_round(vhost: VHost) -> None:
    queue = declare(vhost)
    consumer = Consumer(prefetch=1)
    vhost.add_consumer(queue, consumer)
    publish(vhost, b"first", PLAIN)
    vhost.drain()
    publish(vhost, b"too late")
    vhost.drain()
    assert dead_letters(vhost) == [b"too late"]
    ack_all(vhost, queue, consumer)
    vhost.drain()
    assert consumer.bodies == [b"first"]


def test_a_round_due_keeps_ttl_zero_from_declare_and_housekeeping_not_from_get(
    vhost: VHost,
) -> None:
    """A passive declare or the housekeeping timer may come between a publish and its
    delivery round: the message waits for the round. basic.get never returns it."""
    queue = declare(vhost)
    consumer = Consumer(prefetch=0)
    vhost.add_consumer(queue, consumer)
    publish(vhost, b"for the consumer")
    assert vhost.expire_head(queue, 1 << 60) == 0
    assert vhost.expire_heads(1 << 60) == 0
    vhost.drain()
    assert consumer.bodies == [b"for the consumer"]
    publish(vhost, b"taken by a get first")
    assert vhost.take(queue, 1 << 60) is None
    assert dead_letters(vhost) == [b"taken by a get first"]


def test_ttl_zero_without_a_consumer_expires_and_a_later_consumer_gets_none(
    vhost: VHost,
) -> None:
    queue = declare(vhost, **{"x-message-ttl": 0})
    publish(vhost, b"nobody", PLAIN)
    consumer = Consumer(prefetch=0)
    vhost.add_consumer(queue, consumer)
    vhost.drain()
    assert consumer.bodies == []
    assert dead_letters(vhost) == [b"nobody"]


def test_queue_ttl_zero_in_a_publish_run_reaches_a_consumer(vhost: VHost) -> None:
    queue = declare(vhost, **{"x-message-ttl": 0})
    consumer = Consumer(prefetch=0)
    vhost.add_consumer(queue, consumer)
    bodies = [b"m%d" % n for n in range(5)]
    now_ms = 1_000
    assert vhost.publish_run("", "q", [(PLAIN, b, "", "q", 0) for b in bodies], [queue], now_ms)
    vhost.drain()
    assert consumer.bodies == bodies


def test_more_than_one_round_of_ttl_zero_all_reaches_a_consumer(vhost: VHost) -> None:
    queue = declare(vhost)
    consumer = Consumer(prefetch=0)
    vhost.add_consumer(queue, consumer)
    count = DRAIN_DELIVERIES_MAX + 10
    for n in range(count):
        publish(vhost, b"%d" % n)
    vhost.drain()
    assert len(consumer.bodies) == DRAIN_DELIVERIES_MAX
    vhost.drain()
    assert len(consumer.bodies) == count and dead_letters(vhost) == []


def test_ttl_zero_behind_a_busy_consumer_expires_when_it_reaches_the_head(
    vhost: VHost,
) -> None:
    queue = declare(vhost)
    consumer = Consumer(prefetch=1)
    vhost.add_consumer(queue, consumer)
    publish(vhost, b"first", PLAIN)
    vhost.drain()
    publish(vhost, b"queued", PLAIN)
    publish(vhost, b"behind")
    vhost.drain()
    vhost.expire_head(queue, 1 << 60)
    assert queue.cursor.message_count == 2, "not at the head: it waits, as in RabbitMQ"
    ack_all(vhost, queue, consumer)
    vhost.drain()
    assert consumer.bodies == [b"first", b"queued"]
    assert queue.cursor.message_count == 0
    assert dead_letters(vhost) == [b"behind"]


def test_ttl_zero_requeued_expires(vhost: VHost) -> None:
    queue = declare(vhost)
    consumer = Consumer(prefetch=0)
    vhost.add_consumer(queue, consumer)
    publish(vhost, b"back")
    vhost.drain()
    [offset] = consumer.unacked
    consumer.unacked.clear()
    vhost.requeue(queue, offset)
    vhost.kick(queue)
    vhost.drain()
    assert consumer.bodies == [b"back"]
    assert dead_letters(vhost) == [b"back"]


def test_a_consumer_that_comes_back_does_not_make_old_messages_fresh(vhost: VHost) -> None:
    queue = declare(vhost)
    first = Consumer(prefetch=0)
    vhost.add_consumer(queue, first)
    vhost.remove_consumer(queue, first)
    publish(vhost, b"while nobody consumed")
    second = Consumer(prefetch=0)
    vhost.add_consumer(queue, second)
    vhost.drain()
    assert second.bodies == []
    assert dead_letters(vhost) == [b"while nobody consumed"]
