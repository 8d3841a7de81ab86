"""rstream consumes over the stream protocol from each offset specification (first, last,
next, offset, timestamp) with credit-based flow, and stores and queries offsets on the
broker: the same tracked offsets as the AMQP side's (x-stream-automatic-offset-tracking
with the reference as the consumer tag)."""

from __future__ import annotations

import asyncio
import time

import pytest
from rstream import Consumer, OffsetNotFound, OffsetType, Producer

from tests.integration.conftest import RunningBroker
from tests.stream.conftest import (
    TIMEOUT_S,
    Clients,
    in_thread,
    numbered,
    pika_channel,
    send_confirmed,
    subscribe,
)


async def fill(clients: Clients, stream: str, batches: int, size: int) -> Producer:
    """`batches` confirmed batches of `size` messages b"m<n>", one after the other; the
    producer, to publish more."""
    sender = await clients.producer()
    await sender.create_stream(stream)
    for batch in range(batches):
        await send_confirmed(sender, stream, numbered(size, batch * size))
    return sender


async def test_from_first_with_little_credit_gets_everything_in_order(
    clients: Clients,
) -> None:
    await fill(clients, "events", 4, 500)
    reader = await clients.consumer()
    received = await subscribe(reader, "events", OffsetType.FIRST, initial_credit=1)
    await received.wait(2000)
    assert received.offsets() == list(range(2000))
    assert received.bodies() == [b"m%d" % n for n in range(2000)]
    assert all(message.application_properties == {b"n": n} for n, message in received.items)


async def test_from_an_offset_and_from_one_not_yet_written(clients: Clients) -> None:
    sender = await fill(clients, "events", 5, 100)
    reader = await clients.consumer()
    received = await subscribe(reader, "events", OffsetType.OFFSET, 342)
    await received.wait(158)
    assert received.offsets()[0] == 342
    await received.quiet()
    assert received.offsets() == list(range(342, 500))
    # Past the end: the subscription waits for the offset to be written.
    await sender.create_stream("later")
    await send_confirmed(sender, "later", numbered(10))
    later = await subscribe(reader, "later", OffsetType.OFFSET, 15)
    await send_confirmed(sender, "later", numbered(10, 10))
    await later.wait(5)
    assert later.offsets() == list(range(15, 20))


async def test_from_last_starts_in_the_last_chunk_and_follows(clients: Clients) -> None:
    sender = await fill(clients, "events", 10, 50)
    reader = await clients.consumer()
    received = await subscribe(reader, "events", OffsetType.LAST)
    await received.wait(1)
    # The last chunk holds at most the last confirmed batch (450..499).
    assert 450 <= received.offsets()[0] <= 499
    await send_confirmed(sender, "events", numbered(10, 500))
    await received.wait(received.offsets().index(499) + 11)
    first = received.offsets()[0]
    assert received.offsets() == list(range(first, 510))


async def test_from_next_gets_only_what_comes_after(clients: Clients) -> None:
    sender = await fill(clients, "events", 3, 100)
    reader = await clients.consumer()
    received = await subscribe(reader, "events", OffsetType.NEXT)
    assert await received.quiet() == []
    await send_confirmed(sender, "events", numbered(25, 300))
    await received.wait(25)
    assert received.offsets() == list(range(300, 325))
    assert received.bodies() == [b"m%d" % n for n in range(300, 325)]


async def test_from_a_timestamp(clients: Clients) -> None:
    sender = await fill(clients, "events", 2, 100)
    await asyncio.sleep(0.05)
    since_ms = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    await send_confirmed(sender, "events", numbered(50, 200))
    reader = await clients.consumer()
    received = await subscribe(reader, "events", OffsetType.TIMESTAMP, since_ms)
    await received.wait(50)
    await received.quiet()
    assert received.offsets() == list(range(200, 250))
    assert all(since_ms <= stamp <= time.time() * 1000 for stamp in received.timestamps)


async def test_stored_offsets_are_queried_and_resumed_from(clients: Clients) -> None:
    await fill(clients, "events", 1, 100)
    reader = await clients.consumer()
    with pytest.raises(OffsetNotFound):
        await reader.query_offset("events", "app")
    await reader.store_offset("events", "app", 41)
    assert await _query_soon(reader, "events", "app", 41) == 41
    await reader.store_offset("events", "app", 63)
    assert await _query_soon(reader, "events", "app", 63) == 63
    resumed = await reader.query_offset("events", "app") + 1
    received = await subscribe(reader, "events", OffsetType.OFFSET, resumed)
    await received.wait(36)
    assert received.offsets() == list(range(64, 100))


async def _query_soon(reader: Consumer, stream: str, reference: str, want: int) -> int:
    """QueryOffset until it gives `want` (a StoreOffset has no response: the query on
    another path may come first) or TIMEOUT_S passed; the last answer."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            got = await reader.query_offset(stream, reference)
        except OffsetNotFound:
            got = -1
        if got == want or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.02)


async def test_an_amqp_consumer_resumes_after_the_offset_rstream_stored(
    broker: RunningBroker, clients: Clients
) -> None:
    await fill(clients, "events", 1, 100)
    reader = await clients.consumer()
    await reader.store_offset("events", "app", 41)
    assert await _query_soon(reader, "events", "app", 41) == 41

    def consume_tracked() -> list[int]:
        connection, channel = pika_channel(broker)
        arguments = {"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True}
        channel.basic_qos(prefetch_count=100)
        offsets = []
        for method, properties, _ in channel.consume(
            "events", arguments=arguments, consumer_tag="app", inactivity_timeout=TIMEOUT_S
        ):
            assert method is not None, f"only {offsets}"
            offsets.append(properties.headers["x-stream-offset"])
            channel.basic_ack(method.delivery_tag)
            if len(offsets) == 10:
                break
        connection.close()
        return offsets

    assert await in_thread(consume_tracked) == list(range(42, 52))


async def test_rstream_queries_the_offset_an_amqp_consumer_tracked(
    broker: RunningBroker, clients: Clients
) -> None:
    await fill(clients, "events", 1, 100)

    def consume_tracked() -> None:
        connection, channel = pika_channel(broker)
        arguments = {"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True}
        channel.basic_qos(prefetch_count=10)
        deliveries = channel.consume(
            "events", arguments=arguments, consumer_tag="app", inactivity_timeout=TIMEOUT_S
        )
        for count, (method, _, _) in enumerate(deliveries, 1):
            assert method is not None
            channel.basic_ack(method.delivery_tag)
            if count == 30:
                break
        connection.close()

    await in_thread(consume_tracked)
    reader = await clients.consumer()
    # The last offset processed, 29: a stream client resumes at query + 1.
    assert await _query_soon(reader, "events", "app", 29) == 29
