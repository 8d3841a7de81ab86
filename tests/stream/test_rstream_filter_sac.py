"""rstream's filtering (Publish v2 filter values, a subscription's filter values and
match-unfiltered) and single active consumer (ConsumerUpdate when a consumer becomes the
active one) over the stream protocol."""

from __future__ import annotations

import asyncio
from typing import Any

from rstream import AMQPMessage, EventContext, FilterConfiguration, OffsetSpecification, OffsetType

from tests.integration.conftest import RunningBroker
from tests.stream.conftest import (
    TIMEOUT_S,
    Clients,
    in_thread,
    pika_channel,
    send_confirmed,
    subscribe,
)

COLOURS = ("red", "blue", "green")


async def colour(message: AMQPMessage) -> str:
    return str(message.application_properties["colour"])  # as sent: str keys


def painted(count: int) -> list[AMQPMessage]:
    """Messages b"<n> <colour>", the colours in turn, the colour an application property."""
    return [
        AMQPMessage(
            body=b"%d %s" % (n, COLOURS[n % 3].encode()),
            application_properties={"colour": COLOURS[n % 3]},
        )
        for n in range(count)
    ]


async def fill_painted(clients: Clients) -> None:
    """300 filtered messages (Publish v2) in three batches, then 30 unfiltered (v1)."""
    sender = await clients.producer(filter_value_extractor=colour)
    await sender.create_stream("paint")
    for batch in range(3):
        await send_confirmed(sender, "paint", painted(300)[batch * 100 : batch * 100 + 100])
    plain = await clients.producer()
    await send_confirmed(plain, "paint", [b"plain %d" % n for n in range(30)])


async def test_subscriptions_get_only_their_filter_values(clients: Clients) -> None:
    await fill_painted(clients)
    # One value, without the unfiltered messages.
    only_red = FilterConfiguration(["red"])
    red = await subscribe(await clients.consumer(), "paint", filter_input=only_red)
    # Two values, and the messages published without one.
    wanted = FilterConfiguration(["blue", "green"], match_unfiltered=True)
    others = await subscribe(await clients.consumer(), "paint", filter_input=wanted)
    await red.wait(100)
    await others.wait(230)
    await others.quiet()
    assert red.bodies() == [b"%d red" % n for n in range(0, 300, 3)]
    assert red.offsets() == list(range(0, 300, 3))
    painted_ones = [b"%d %s" % (n, COLOURS[n % 3].encode()) for n in range(300) if n % 3]
    assert others.bodies() == painted_ones + [b"plain %d" % n for n in range(30)]


async def test_an_amqp_consumer_filters_on_the_values_stream_clients_published(
    broker: RunningBroker, clients: Clients
) -> None:
    await fill_painted(clients)

    def consume_green() -> list[tuple[bytes, Any]]:
        connection, channel = pika_channel(broker)
        channel.basic_qos(prefetch_count=200)
        arguments = {"x-stream-offset": "first", "x-stream-filter": "green"}
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

    got = await in_thread(consume_green)
    assert [body for body, _ in got] == [b"%d green" % n for n in range(2, 300, 3)]
    assert all(headers["x-stream-filter-value"] == "green" for _, headers in got)


class Listener:
    """A consumer_update_listener: notes each ConsumerUpdate and answers with the offset
    after the one the group stored (or first)."""

    def __init__(self, name: str, calls: list[tuple[str, bool]]) -> None:
        self.name = name
        self.calls = calls

    async def __call__(self, active: bool, context: EventContext) -> OffsetSpecification:
        self.calls.append((self.name, active))
        try:
            stored = await context.consumer.query_offset(context.stream, context.reference)
        except Exception:
            return OffsetSpecification(OffsetType.FIRST, 0)
        return OffsetSpecification(OffsetType.OFFSET, stored + 1)


async def test_one_active_consumer_and_the_next_takes_over(clients: Clients) -> None:
    calls: list[tuple[str, bool]] = []
    sac = {"single-active-consumer": "true", "name": "app"}
    sender = await clients.producer()
    first_reader, second_reader = await clients.consumer(), await clients.consumer()
    await sender.create_stream("work")
    first = await subscribe(
        first_reader, "work", properties=dict(sac), subscriber_name="app",
        consumer_update_listener=Listener("first", calls),
    )  # fmt: skip
    second = await subscribe(
        second_reader, "work", properties=dict(sac), subscriber_name="app",
        consumer_update_listener=Listener("second", calls),
    )  # fmt: skip
    await send_confirmed(sender, "work", [b"job %d" % n for n in range(20)])
    await first.wait(20)
    assert await second.quiet() == []
    assert ("first", True) in calls
    assert ("second", True) not in calls
    await first_reader.store_offset("work", "app", 19)
    await asyncio.sleep(0.1)  # StoreOffset has no response
    await first_reader.unsubscribe(first.subscriber_id)
    await _until(lambda: ("second", True) in calls)
    await send_confirmed(sender, "work", [b"job %d" % n for n in range(20, 30)])
    await second.wait(10)
    await second.quiet()
    assert second.offsets() == list(range(20, 30))
    assert first.offsets() == list(range(20))


async def _until(condition: Any) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), TIMEOUT_S)
