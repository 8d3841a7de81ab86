"""One stream, two protocols: what pika publishes over AMQP 0-9-1 rstream reads as AMQP
1.0 messages (body, application properties from the headers, properties), and what
rstream publishes pika reads with its body and its application properties as headers
(docs/stream-protocol.md, "Message conversion")."""

from __future__ import annotations

import struct
from typing import Any

import pika
import pytest
from rstream import AMQPMessage, CompressionType, OffsetType, Properties

from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import Key
from streamq.queues import sub_entries
from tests.integration.conftest import RunningBroker
from tests.stream.conftest import (
    TIMEOUT_S,
    Clients,
    in_thread,
    pika_channel,
    send_confirmed,
    subscribe,
)
from tests.stream.test_gateway_protocol import RawClient


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


async def test_pika_reads_rstreams_gzip_sub_entry_batches(
    broker: RunningBroker, clients: Clients
) -> None:
    """A compressed batch's messages reach an AMQP consumer one by one, with their
    properties and offsets, as an uncompressed batch's do."""
    sender = await clients.producer()
    await sender.create_stream("mixed")
    for batch in range(3):
        messages = [
            AMQPMessage(body=b"gz %d.%d" % (batch, n), application_properties={"n": n})
            for n in range(4)
        ]
        await sender.send_sub_entry("mixed", messages, CompressionType.Gzip)
    got = await in_thread(lambda: consume_over_amqp(broker, 12))
    assert [body for _, body in got] == [b"gz %d.%d" % (b, n) for b in range(3) for n in range(4)]
    assert [dict(p.headers) for p, _ in got] == [
        {"n": n, "x-stream-offset": b * 4 + n} for b in range(3) for n in range(4)
    ]


@pytest.mark.parametrize("codec", [sub_entries.SNAPPY, sub_entries.LZ4, sub_entries.ZSTD])
def test_batches_of_every_codec_over_the_wire_reach_pika(broker: RunningBroker, codec: int) -> None:
    """The codecs rstream lacks, in Publish frames built by hand (the Java and Go clients'
    formats: framed snappy, an LZ4 frame, a zstd frame), through the gateway."""
    client = RawClient(broker.stream_port)
    try:
        client.login()
        client.request(c.Create(1, "mixed", {}))
        client.request(c.DeclarePublisher(2, 0, "", "mixed"))
        bodies = [b"%s %d" % (sub_entries.NAMES[codec].encode(), n) for n in range(5)]
        encoded = [bytes(AMQPMessage(body=body)) for body in bodies]
        payload = struct.pack(">BiQ", 0, 1, 10) + sub_entries.compress(codec, encoded)
        client.send_raw(struct.pack(">IHH", 4 + len(payload), Key.PUBLISH, 1) + payload)
        assert client.read_until(c.PublishConfirm) == c.PublishConfirm(0, (10,))
    finally:
        client.close()
    got = consume_over_amqp(broker, 5)
    assert [body for _, body in got] == bodies
