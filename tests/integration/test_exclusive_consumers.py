"""Exclusive consumers and consumer cancel notification with aio-pika and pika (pika's
basic cases are in test_amqp_compat.py and test_amqp_pika.py): an exclusive consumer
refuses every other consumer with RabbitMQ's 403 and cannot start beside one, the queue
is free again once it cancels, and deleting a queue cancels its consumers on every
connection with basic.cancel."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import aiormq
import pika
import pytest

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10
REFUSED = "ACCESS_REFUSED - queue 'solo' in vhost '/' in exclusive use"


async def nothing(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    await message.ack()


@pytest.mark.parametrize("exclusive_first", [True, False])
async def test_aio_pika_exclusive_consumer_excludes_others(
    broker: RunningBroker, exclusive_first: bool
) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    first = await aio_pika.connect(url, timeout=TIMEOUT_S)
    second = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with first, second:
        owner = await first.channel()
        queue = await owner.declare_queue("solo")
        tag = await queue.consume(nothing, exclusive=exclusive_first)
        other = await (await second.channel()).get_queue("solo")
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match=REFUSED):
            await other.consume(nothing, exclusive=not exclusive_first)
        await queue.cancel(tag)
        retry = await (await second.channel()).get_queue("solo")
        await retry.consume(nothing, exclusive=True)  # free again after the cancel
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match=REFUSED):
            await (await owner.get_queue("solo")).consume(nothing)


async def test_aio_pika_consumer_is_cancelled_when_its_queue_is_deleted(
    broker: RunningBroker,
) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    consumer_connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    admin_connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with consumer_connection, admin_connection:
        channel = await consumer_connection.channel()
        queue = await channel.declare_queue("doomed")
        await channel.default_exchange.publish(aio_pika.Message(b"one"), routing_key="doomed")
        received: list[bytes] = []

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            received.append(message.body)
            await message.ack()

        cancelled: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def on_cancel(frame: aiormq.spec.Basic.Cancel) -> None:
            cancelled.set_result(frame.consumer_tag)

        underlay = await channel.get_underlay_channel()
        underlay.on_consumer_cancel_callbacks.add(on_cancel)
        tag = await queue.consume(on_message)
        deadline = time.monotonic() + TIMEOUT_S
        while not received and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        admin = await admin_connection.channel()
        await admin.queue_delete("doomed")
        assert await asyncio.wait_for(cancelled, TIMEOUT_S) == tag
        assert received == [b"one"]
        assert not channel.is_closed  # cancelled, not closed


def test_pika_cancel_notification_reaches_a_consumer_on_another_connection(
    broker: RunningBroker,
) -> None:
    params = pika.ConnectionParameters("127.0.0.1", broker.amqp_port)
    consuming, admin = pika.BlockingConnection(params), pika.BlockingConnection(params)
    channel = consuming.channel()
    channel.queue_declare("doomed", durable=True)
    cancelled: list[object] = []
    channel.add_on_cancel_callback(cancelled.append)
    channel.basic_consume("doomed", lambda *args: None, exclusive=True)
    assert admin.channel().queue_delete("doomed").method.message_count == 0
    deadline = time.monotonic() + TIMEOUT_S
    while not cancelled and time.monotonic() < deadline:
        consuming.process_data_events(time_limit=0.05)
    assert len(cancelled) == 1 and channel.is_open
    consuming.close()
    admin.close()
