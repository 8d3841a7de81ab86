"""One stream, two protocols: what pika publishes over AMQP 0-9-1 rstream reads as AMQP
1.0 messages (body, application properties from the headers, properties), and what
rstream publishes pika reads with its body and its application properties as headers
(docs/stream-protocol.md, "Message conversion")."""

from __future__ import annotations

from typing import Any

import pika
from rstream import AMQPMessage, OffsetType, Properties

from tests.integration.conftest import RunningBroker
from tests.stream.conftest import (
    TIMEOUT_S,
    Clients,
    in_thread,
    pika_channel,
    send_confirmed,
    subscribe,
)


def publish_over_amqp(broker: RunningBroker, count: int) -> None:
    connection, channel = pika_channel(broker)
    channel.queue_declare("mixed", durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    for n in range(count):
        properties = pika.BasicProperties(
            content_type="text/plain",
            message_id=f"id-{n}",
            correlation_id="corr",
            headers={"n": n, "word": "hello", "flag": True},
        )
        channel.basic_publish("", "mixed", b"amqp %d" % n, properties)
    connection.close()


async def test_rstream_reads_what_pika_published(broker: RunningBroker, clients: Clients) -> None:
    await in_thread(lambda: publish_over_amqp(broker, 50))
    received = await subscribe(await clients.consumer(), "mixed", OffsetType.FIRST)
    await received.wait(50)
    assert received.offsets() == list(range(50))
    for n, message in received.items:
        assert message.body == b"amqp %d" % n
        assert message.application_properties == {b"n": n, b"word": b"hello", b"flag": True}
        assert message.properties.message_id == b"id-%d" % n
        assert message.properties.correlation_id == b"corr"
        assert message.properties.content_type == b"text/plain"


def consume_over_amqp(broker: RunningBroker, count: int) -> list[tuple[Any, bytes]]:
    """`count` messages of the stream from first: (properties, body)."""
    connection, channel = pika_channel(broker)
    channel.basic_qos(prefetch_count=100)
    got = []
    for method, properties, body in channel.consume(
        "mixed", arguments={"x-stream-offset": "first"}, inactivity_timeout=TIMEOUT_S
    ):
        assert method is not None, f"only {len(got)} of {count} came"
        got.append((properties, body))
        channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    connection.close()
    return got


async def test_pika_reads_what_rstream_published(broker: RunningBroker, clients: Clients) -> None:
    messages = [
        AMQPMessage(
            body=b"stream %d" % n,
            application_properties={"n": n, "word": "hello"},
            properties=Properties(message_id=f"id-{n}", content_type="text/plain"),
        )
        for n in range(50)
    ]
    sender = await clients.producer()
    await sender.create_stream("mixed")
    await send_confirmed(sender, "mixed", messages)
    await send_confirmed(sender, "mixed", [b"raw, not AMQP 1.0"])
    got = await in_thread(lambda: consume_over_amqp(broker, 51))
    for n, (properties, body) in enumerate(got[:50]):
        assert body == b"stream %d" % n
        headers = dict(properties.headers)
        assert headers.pop("x-stream-offset") == n
        assert headers == {"n": n, "word": "hello"}
        assert properties.message_id == f"id-{n}"
        assert properties.content_type == "text/plain"
    raw_properties, raw_body = got[50]
    assert raw_body == b"raw, not AMQP 1.0"  # delivered as is
    assert raw_properties.headers == {"x-stream-offset": 50}
