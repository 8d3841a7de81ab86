"""Priority queues (`x-max-priority`) with pika and aio-pika: delivery order by priority
and FIFO within one, priorities above the maximum, requeue to the message's own place,
restart, TTL, length limits, consumers, and RabbitMQ's 406s for bad arguments. The
expected orders were checked against RabbitMQ 3.10 with the same client calls."""

from __future__ import annotations

import time

import aio_pika
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker, broker_on, drain_bodies

TIMEOUT_S = 10
ORDER_PUBLISHED = [("none", None), ("p1", 1), ("p5a", 5), ("p10", 10), ("p5b", 5), ("p20", 20)]
ORDER_EXPECTED = ["p10", "p20", "p5a", "p5b", "p1", "none"]  # p20 counts as the maximum, 10


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))


def publish(channel: BlockingChannel, queue: str, body: str, priority: int | None) -> None:
    channel.basic_publish(
        "", queue, body.encode(), pika.BasicProperties(priority=priority, delivery_mode=2)
    )


def get_all(channel: BlockingChannel, queue: str) -> list[str]:
    return [body.decode() for body in drain_bodies(channel, queue)]


def test_higher_priority_first_and_fifo_within_a_priority(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("pq", arguments={"x-max-priority": 10})
    for body, priority in [*ORDER_PUBLISHED, ("p0", 0)]:
        publish(channel, "pq", body, priority)
    assert get_all(channel, "pq") == [*ORDER_EXPECTED, "p0"]  # no priority is priority 0
    conn.close()


def test_a_requeued_message_goes_back_to_its_priority(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("pq", arguments={"x-max-priority": 10})
    for body, priority in [("a5", 5), ("b1", 1), ("c5", 5)]:
        publish(channel, "pq", body, priority)
    method, _, body = channel.basic_get("pq")
    assert body == b"a5"
    publish(channel, "pq", "d9", 9)
    channel.basic_nack(method.delivery_tag, requeue=True)
    got = []
    while (reply := channel.basic_get("pq", auto_ack=True))[0] is not None:
        got.append((reply[2].decode(), reply[0].redelivered))
    assert got == [("d9", False), ("a5", True), ("c5", False), ("b1", False)]
    conn.close()


def test_a_consumer_gets_messages_by_priority(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("pq", arguments={"x-max-priority": 3})
    for n in range(30):
        publish(channel, "pq", f"{n % 4}-{n}", n % 4)
    channel.basic_qos(prefetch_count=5)
    got: list[str] = []

    def on_message(ch: BlockingChannel, method: object, properties: object, body: bytes) -> None:
        got.append(body.decode())
        ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

    channel.basic_consume("pq", on_message)
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < 30 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    expected = [f"{p}-{n}" for p in (3, 2, 1, 0) for n in range(30) if n % 4 == p]
    assert got == expected
    conn.close()


def test_priority_order_survives_a_restart(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("durable-pq", durable=True, arguments={"x-max-priority": 10})
    channel.confirm_delivery()
    for body, priority in ORDER_PUBLISHED:
        publish(channel, "durable-pq", body, priority)
    _, _, body = channel.basic_get("durable-pq")  # in flight at the restart
    assert body == b"p10"
    conn.close()  # p10 goes back to its place
    broker.stop()
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        channel = conn.channel()
        declared = channel.queue_declare(
            "durable-pq", durable=True, arguments={"x-max-priority": 10}
        )
        assert declared.method.message_count == len(ORDER_PUBLISHED)
        publish(channel, "durable-pq", "p7", 7)
        assert get_all(channel, "durable-pq") == ["p10", "p20", "p7", "p5a", "p5b", "p1", "none"]
        conn.close()


def test_message_ttl_applies_to_every_priority(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.exchange_declare("dlx", "fanout")
    channel.queue_declare("dead")
    channel.queue_bind("dead", "dlx")
    channel.queue_declare(
        "pq",
        arguments={"x-max-priority": 5, "x-message-ttl": 100, "x-dead-letter-exchange": "dlx"},
    )
    for n in range(6):
        publish(channel, "pq", str(n), n)
    deadline = time.monotonic() + TIMEOUT_S
    dead: list[str] = []
    while len(dead) < 6 and time.monotonic() < deadline:
        dead += get_all(channel, "dead")
        conn.process_data_events(time_limit=0.05)
    assert sorted(dead) == [str(n) for n in range(6)]
    assert get_all(channel, "pq") == []
    conn.close()


def test_drop_head_drops_the_highest_priority_as_rabbitmq(broker: RunningBroker) -> None:
    """RabbitMQ's priority queue drops from the head it would deliver next."""
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("pq", arguments={"x-max-priority": 10, "x-max-length": 2})
    for body, priority in [("p1", 1), ("p5", 5), ("p3", 3)]:
        publish(channel, "pq", body, priority)
    assert get_all(channel, "pq") == ["p3", "p1"]
    conn.close()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (256, "{max_value_exceeded,256}"),
        (-1, "{value_negative,-1}"),
        ("x", '"expected integer, got longstr"'),
    ],
)
def test_bad_max_priority_is_406_in_rabbitmqs_words(
    broker: RunningBroker, value: object, problem: str
) -> None:
    conn = connect(broker)
    channel = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.queue_declare("pq", arguments={"x-max-priority": value})
    assert raised.value.reply_code == 406
    assert raised.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'pq' in vhost '/': {problem}"
    )
    conn.close()


def test_max_priority_0_and_255_are_accepted_and_a_redeclare_must_match(
    broker: RunningBroker,
) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("zero", arguments={"x-max-priority": 0})  # RabbitMQ accepts 0
    publish(channel, "zero", "a", 9)
    publish(channel, "zero", "b", 0)
    assert get_all(channel, "zero") == ["a", "b"]  # one level: FIFO
    channel.queue_declare("big", arguments={"x-max-priority": 255})
    publish(channel, "big", "low", 1)
    publish(channel, "big", "high", 255)
    assert get_all(channel, "big") == ["high", "low"]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.queue_declare("big", arguments={"x-max-priority": 10})
    assert raised.value.reply_code == 406
    assert "inequivalent arg 'x-max-priority'" in raised.value.reply_text
    conn.close()


def test_no_policy_sets_a_max_priority(broker: RunningBroker) -> None:
    """As RabbitMQ: priorities come from the argument only ("max-priority" is no key)."""
    status = broker.put_policy(
        "prio", {"pattern": "^pq$", "definition": {"max-priority": 10}, "apply-to": "queues"}
    )
    assert status == 400


async def test_aio_pika_priority_queue_with_consumer_and_requeue(broker: RunningBroker) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("aio-pq", arguments={"x-max-priority": 10})
        for body, priority in ORDER_PUBLISHED:
            await channel.default_exchange.publish(
                aio_pika.Message(body.encode(), priority=priority), routing_key="aio-pq"
            )
        first = await queue.get(timeout=TIMEOUT_S)
        assert first is not None and first.body == b"p10"
        await first.nack(requeue=True)  # back ahead of p20, its equal
        await channel.set_qos(prefetch_count=2)
        received: list[tuple[str, bool]] = []
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    received.append((message.body.decode(), message.redelivered))
                if len(received) == len(ORDER_EXPECTED):
                    break
        assert received == [(body, body == "p10") for body in ORDER_EXPECTED]


def test_expired_low_priorities_go_while_higher_ones_wait(broker: RunningBroker) -> None:
    """As RabbitMQ, every priority's head is checked for expiry, not only the overall
    head: short-lived low-priority messages are dead-lettered behind long-lived high ones."""
    conn = connect(broker)
    channel = conn.channel()
    channel.exchange_declare("dlx", "fanout")
    channel.queue_declare("dead")
    channel.queue_bind("dead", "dlx")
    channel.queue_declare("pq", arguments={"x-max-priority": 5, "x-dead-letter-exchange": "dlx"})
    channel.basic_publish("", "pq", b"high", pika.BasicProperties(priority=5))
    for n in range(3):
        properties = pika.BasicProperties(priority=1, expiration="50")
        channel.basic_publish("", "pq", f"low{n}".encode(), properties)
    deadline = time.monotonic() + TIMEOUT_S
    dead: list[str] = []
    while len(dead) < 3 and time.monotonic() < deadline:
        dead += get_all(channel, "dead")
        conn.process_data_events(time_limit=0.05)
    assert dead == ["low0", "low1", "low2"]
    assert get_all(channel, "pq") == ["high"]
    conn.close()
