"""Stream queues with aio-pika (asyncio): every x-stream-offset form and offset tracking."""

from __future__ import annotations

import asyncio
import datetime

import aio_pika
import pytest

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10
STREAM = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}


async def read(
    channel: aio_pika.abc.AbstractChannel,
    offset: object,
    count: int,
    tag: str | None = None,
    tracking: bool = False,
) -> list[int]:
    queue = await channel.get_queue("aio-events")
    arguments: dict[str, object] = {"x-stream-offset": offset}
    if tracking:
        arguments["x-stream-automatic-offset-tracking"] = True
    got: list[int] = []
    async with queue.iterator(arguments=arguments, consumer_tag=tag) as messages:
        async for message in messages:
            await message.ack()
            got.append(int(message.headers["x-stream-offset"]))
            if len(got) == count:
                break
    return got


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        ("first", list(range(40))),
        (30, list(range(30, 40))),
        (-4, list(range(36, 40))),
        ("1h", list(range(40))),
        (datetime.datetime.now(tz=datetime.UTC) - datetime.timedelta(hours=1), None),
    ],
)
async def test_offset_forms_with_aio_pika(
    broker: RunningBroker, offset: object, expected: list[int] | None
) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=50)
        await channel.declare_queue("aio-events", durable=True, arguments=STREAM)
        for n in range(40):
            await channel.default_exchange.publish(
                aio_pika.Message(f"{n:04d}".encode() + b"." * 100), routing_key="aio-events"
            )
        want = expected if expected is not None else list(range(40))
        got = await asyncio.wait_for(read(channel, offset, len(want)), TIMEOUT_S)
        assert got == want


async def test_tracking_with_aio_pika(broker: RunningBroker) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=50)
        await channel.declare_queue("aio-events", durable=True, arguments=STREAM)
        for n in range(10):
            await channel.default_exchange.publish(
                aio_pika.Message(str(n).encode()), routing_key="aio-events"
            )
        first = await asyncio.wait_for(read(channel, "first", 6, "t1", True), TIMEOUT_S)
        assert first == list(range(6))
        rest = await asyncio.wait_for(read(channel, "first", 4, "t1", True), TIMEOUT_S)
        assert rest == list(range(6, 10))
