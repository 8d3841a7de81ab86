"""Filter values and publisher references up to the stream protocol's limit (an int16
length: 32,767 bytes; issue 32, item 2), where they once were refused over 255 bytes.

A stream's chunks (format version 2) keep filter values whole in their trailer; a
publisher reference, and a filter value in a version-1 segment's native record (one-byte
length fields), over 255 bytes is kept as its digest (streamq.queues.filter_values), and
every comparison compares that form too.
Checked with rstream (Publish v2 from its filter_value_extractor, a subscription's
filter, a long publisher_name that deduplicates), with raw frames at the limit itself,
and with an AMQP consumer's x-stream-filter on the same records."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from rstream import AMQPMessage, FilterConfiguration

from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import Key, OffsetType, ResponseCode
from tests.integration.conftest import RunningBroker
from tests.stream.conftest import Clients, in_thread, pika_channel, send_confirmed, subscribe
from tests.stream.test_gateway_protocol import RawClient
from tests.stream.test_rstream_publish import query_sequence, with_id

LONG: dict[str, str] = {colour: colour * 200 for colour in ("red", "blue")}  # 600, 800 B
PROTOCOL_MAX = 32767


async def long_colour(message: AMQPMessage) -> str:
    return LONG[str(message.application_properties["colour"])]


def painted(count: int) -> list[AMQPMessage]:
    colours = ("red", "blue")
    return [
        AMQPMessage(body=b"%d" % n, application_properties={"colour": colours[n % 2]})
        for n in range(count)
    ]


@pytest.fixture
def raw(broker: RunningBroker) -> Iterator[RawClient]:
    client = RawClient(broker.stream_port)
    try:
        client.login()
        yield client
    finally:
        client.close()


async def test_long_filter_values_filter_exactly_for_stream_and_amqp_consumers(
    broker: RunningBroker, clients: Clients
) -> None:
    sender = await clients.producer(filter_value_extractor=long_colour)
    await sender.create_stream("paint")
    await send_confirmed(sender, "paint", painted(100))
    red = await subscribe(
        await clients.consumer(), "paint", filter_input=FilterConfiguration([LONG["red"]])
    )
    await red.wait(50)
    await red.quiet()
    assert red.bodies() == [b"%d" % n for n in range(0, 100, 2)]

    def consume_blue() -> list[tuple[bytes, Any]]:
        connection, channel = pika_channel(broker)
        channel.basic_qos(prefetch_count=200)
        arguments = {"x-stream-offset": "first", "x-stream-filter": LONG["blue"]}
        got = []
        for method, properties, body in channel.consume(
            "paint", arguments=arguments, inactivity_timeout=1
        ):
            if method is None:
                break
            got.append((body, properties.headers))
            channel.basic_ack(method.delivery_tag)
        connection.close()
        return got

    got = await in_thread(consume_blue)
    assert [body for body, _ in got] == [b"%d" % n for n in range(1, 100, 2)]
    # A stream stores chunks (format version 2): the trailer holds the value itself, up
    # to the protocol's limit; only a version-1 segment's record holds its stored form
    # (documented in stream-protocol.md).
    assert {headers["x-stream-filter-value"] for _, headers in got} == {LONG["blue"]}


async def test_a_long_publisher_reference_deduplicates(clients: Clients) -> None:
    reference = "app-" * 250  # 1,000 bytes
    sender = await clients.producer()
    await sender.create_stream("events")
    await send_confirmed(
        sender, "events", [with_id(b"m%d" % n, n) for n in range(1, 11)], reference
    )
    again = [with_id(b"again %d" % n, n) for n in range(6, 16)]
    statuses = await send_confirmed(sender, "events", again, reference)
    assert sorted(status.message_id for status in statuses) == list(range(6, 16))
    assert await query_sequence(sender, "events", reference) == 15
    # Another reference with the same first 255 bytes is another publisher.
    assert await query_sequence(sender, "events", reference + "x") == 0
    reader = await subscribe(await clients.consumer(), "events")
    await reader.wait(15)
    await reader.quiet()
    want = [b"m%d" % n for n in range(1, 11)] + [b"again %d" % n for n in range(11, 16)]
    assert reader.bodies() == want


def test_raw_frames_at_the_protocols_limit(raw: RawClient) -> None:
    longest = "f" * PROTOCOL_MAX
    reference = "r" * PROTOCOL_MAX

    def ok(command: c.Command, key: Key) -> None:
        answer = raw.request(command)
        assert answer == c.Response(key, raw.correlation_id, ResponseCode.OK), answer

    ok(c.Create(raw.next_id(), "s", {}), Key.CREATE)
    ok(c.DeclarePublisher(raw.next_id(), 0, reference, "s"), Key.DECLARE_PUBLISHER)
    batch = (
        c.PublishedMessage(1, b"longest", longest),
        c.PublishedMessage(2, b"short", "short"),
        c.PublishedMessage(3, b"none", None),
    )
    raw.send(c.Publish(0, batch, version=2))
    assert raw.read_until(c.PublishConfirm) == c.PublishConfirm(0, (1, 2, 3))
    sequence = raw.request(c.QueryPublisherSequence(raw.next_id(), reference, "s"))
    assert sequence == c.QueryPublisherSequenceResponse(raw.correlation_id, ResponseCode.OK, 3)
    first = c.OffsetSpec(OffsetType.FIRST)
    properties = {"filter.0": longest, "match-unfiltered": "true"}
    ok(c.Subscribe(raw.next_id(), 1, "s", first, 10, properties), Key.SUBSCRIBE)
    offsets: list[int] = []
    while len(offsets) < 2:
        deliver = raw.read_until(c.Deliver)
        assert isinstance(deliver, c.Deliver)
        entries = int.from_bytes(deliver.chunk[2:4])
        first_offset = int.from_bytes(deliver.chunk[24:32])
        offsets += range(first_offset, first_offset + entries)
    assert offsets == [0, 2]  # the longest value and the unfiltered one, not "short"
