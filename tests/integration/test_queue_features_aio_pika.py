"""The queue features first tested with pika, driven by aio-pika: TTL with dead-lettering
and x-death, length limits with reject-publish (a nack under confirms) and drop-head,
consumer priorities, single active consumer with failover, and the error cases of their
arguments. Every wait has a timeout; TTLs are tens of milliseconds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aio_pika
import aiormq
import pytest

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10
Handler = Callable[[aio_pika.abc.AbstractIncomingMessage], Awaitable[None]]


async def _connect(broker: RunningBroker) -> aio_pika.abc.AbstractConnection:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    return await aio_pika.connect(url, timeout=TIMEOUT_S)


async def _get_eventually(queue: aio_pika.abc.AbstractQueue) -> aio_pika.abc.AbstractMessage:
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while True:
        message = await queue.get(fail=False, no_ack=True)
        if message is not None:
            return message
        assert asyncio.get_running_loop().time() < deadline, "nothing arrived"
        await asyncio.sleep(0.02)


async def test_expired_messages_are_dead_lettered_with_x_death(broker: RunningBroker) -> None:
    async with await _connect(broker) as connection:
        channel = await connection.channel()
        dead = await channel.declare_queue("aio-dead")
        source = await channel.declare_queue(
            "aio-ttl",
            arguments={
                "x-message-ttl": 30,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "aio-dead",
            },
        )
        await channel.default_exchange.publish(
            aio_pika.Message(b"late", headers={"app": "x"}), routing_key="aio-ttl"
        )
        message = await _get_eventually(dead)
        assert message.body == b"late"
        death = message.headers["x-death"][0]
        assert death["queue"] == "aio-ttl" and death["reason"] == "expired"
        assert death["count"] == 1 and death["routing-keys"] == ["aio-ttl"]
        assert message.headers["x-first-death-reason"] == "expired"
        assert message.headers["app"] == "x"
        assert (await source.declare()).message_count == 0


async def test_a_per_message_expiration_shorter_than_the_queue_ttl_wins(
    broker: RunningBroker,
) -> None:
    async with await _connect(broker) as connection:
        channel = await connection.channel()
        dead = await channel.declare_queue("aio-dead2")
        await channel.declare_queue(
            "aio-ttl2",
            arguments={
                "x-message-ttl": 60_000,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "aio-dead2",
            },
        )
        await channel.default_exchange.publish(
            aio_pika.Message(b"short", expiration=0.03), routing_key="aio-ttl2"
        )
        message = await _get_eventually(dead)
        assert message.body == b"short"
        assert message.headers["x-death"][0]["original-expiration"] == "30"


async def test_reject_publish_nacks_under_confirms(broker: RunningBroker) -> None:
    async with await _connect(broker) as connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(
            "aio-full", arguments={"x-max-length": 2, "x-overflow": "reject-publish"}
        )
        for body in (b"1", b"2"):
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key="aio-full")
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await channel.default_exchange.publish(aio_pika.Message(b"3"), routing_key="aio-full")
        assert (await queue.declare()).message_count == 2


async def test_drop_head_keeps_the_newest(broker: RunningBroker) -> None:
    async with await _connect(broker) as connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("aio-head", arguments={"x-max-length": 2})
        for body in (b"1", b"2", b"3"):
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key="aio-head")
        bodies = [(await queue.get(no_ack=True)).body for _ in range(2)]
        assert bodies == [b"2", b"3"]


async def test_bad_limit_arguments_are_406(broker: RunningBroker) -> None:
    async with await _connect(broker) as connection:
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="x-overflow"):
            await channel.declare_queue("aio-bad", arguments={"x-overflow": "sideways"})
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="x-message-ttl"):
            await channel.declare_queue("aio-bad", arguments={"x-message-ttl": -1})


async def test_a_higher_priority_consumer_gets_the_messages(broker: RunningBroker) -> None:
    async with await _connect(broker) as connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=100)
        queue = await channel.declare_queue("aio-cprio")
        got: dict[str, list[bytes]] = {"low": [], "high": []}
        done = asyncio.Event()

        def collect(name: str) -> Handler:
            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                got[name].append(message.body)
                await message.ack()
                if len(got["low"]) + len(got["high"]) == 10:
                    done.set()

            return on_message

        await queue.consume(collect("low"), arguments={"x-priority": 1})
        await queue.consume(collect("high"), arguments={"x-priority": 5})
        for i in range(10):
            await channel.default_exchange.publish(
                aio_pika.Message(str(i).encode()), routing_key="aio-cprio"
            )
        await asyncio.wait_for(done.wait(), TIMEOUT_S)
        assert got["low"] == [] and len(got["high"]) == 10


async def test_single_active_consumer_fails_over(broker: RunningBroker) -> None:
    async with await _connect(broker) as connection:
        first_channel = await connection.channel()
        second_channel = await connection.channel()
        queue = await first_channel.declare_queue(
            "aio-sac", arguments={"x-single-active-consumer": True}
        )
        second_queue = await second_channel.get_queue("aio-sac")
        got: list[tuple[str, bytes]] = []
        arrived = asyncio.Event()

        def collect(name: str) -> Handler:
            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                got.append((name, message.body))
                await message.ack()
                arrived.set()

            return on_message

        await queue.consume(collect("first"))
        await second_queue.consume(collect("second"))
        await first_channel.default_exchange.publish(aio_pika.Message(b"a"), routing_key="aio-sac")
        await asyncio.wait_for(arrived.wait(), TIMEOUT_S)
        arrived.clear()
        await first_channel.close()  # the active consumer goes: the next takes over
        await second_channel.default_exchange.publish(aio_pika.Message(b"b"), routing_key="aio-sac")
        await asyncio.wait_for(arrived.wait(), TIMEOUT_S)
        assert got == [("first", b"a"), ("second", b"b")]
