"""Stream deliveries in runs (one C call frames a chunk of records) seen from pika and
aio-pika: every message comes once, in order, with its own x-stream-offset, whether it
went out in a run or on the per-record path, across segment and chunk boundaries, from
first, an offset and next, with per-message acks; tracked offsets are stored from acks
that settle as a run.

Method: a few thousand messages in small segments (4 KiB) with properties of every
shape the splice meets (none, headers, properties before and after headers), some
already carrying an x-stream-offset header of their own (the run stops before those
and the per-record path replaces the value), read back and compared message by message.
"""

from __future__ import annotations

import asyncio

import aio_pika
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker, broker_on

TIMEOUT_S = 10
SMALL_SEGMENTS = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}
COUNT = 3000


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def properties_for(n: int) -> pika.BasicProperties:
    """Properties of every shape the splice meets, by message number."""
    kind = n % 5
    if kind == 0:
        return pika.BasicProperties()
    if kind == 1:
        return pika.BasicProperties(headers={"n": n, "s": "x" * (n % 7)})
    if kind == 2:
        return pika.BasicProperties(
            content_type="text/plain",
            content_encoding="utf-8",
            headers={"n": n},
            delivery_mode=2,
            message_id=str(n),
            app_id="runs",
        )
    if kind == 3:
        return pika.BasicProperties(content_type="application/json", priority=3, app_id="r")
    if n % 50 == 4:  # its own x-stream-offset: the per-record path replaces it
        return pika.BasicProperties(headers={"x-stream-offset": -1, "n": n})
    return pika.BasicProperties(correlation_id=str(n))


def publish(channel: BlockingChannel, name: str, first: int, count: int) -> None:
    for n in range(first, first + count):
        channel.basic_publish("", name, f"{n:05d}".encode() + b"." * (n % 300), properties_for(n))


def declare(connection: pika.BlockingConnection, name: str, count: int) -> None:
    channel = connection.channel()
    channel.queue_declare(name, durable=True, arguments=SMALL_SEGMENTS)
    channel.confirm_delivery()
    publish(channel, name, 0, count)
    channel.close()


def check(n: int, offset: int, properties: pika.BasicProperties, body: bytes) -> None:
    """Message `n` arrived as published, at offset `n`, with that offset to show."""
    assert offset == n
    assert body == f"{n:05d}".encode() + b"." * (n % 300)
    want = properties_for(n)
    headers = dict(properties.headers)
    assert headers.pop("x-stream-offset") == n
    assert headers == {k: v for k, v in (want.headers or {}).items() if k != "x-stream-offset"}
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "app_id"):
        assert getattr(properties, name) == getattr(want, name), name
    assert properties.correlation_id == want.correlation_id
    assert properties.message_id == want.message_id


def consume(
    connection: pika.BlockingConnection,
    name: str,
    arguments: dict[str, object],
    count: int,
    prefetch: int = 200,
    tag: str | None = None,
) -> list[int]:
    """`count` deliveries, each acked with its own basic.ack; their offsets."""
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    got: list[int] = []
    for method, properties, body in channel.consume(
        name, arguments=arguments, inactivity_timeout=TIMEOUT_S, consumer_tag=tag
    ):
        assert method is not None, f"only {len(got)} of {count} deliveries came"
        assert not method.redelivered
        offset = properties.headers["x-stream-offset"]
        check(int(body[:5]), offset, properties, body)
        got.append(offset)
        channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    channel.close()
    return got


def test_from_first_every_message_once_in_order_with_its_offset(
    connection: pika.BlockingConnection,
) -> None:
    declare(connection, "runs", COUNT)
    assert consume(connection, "runs", {"x-stream-offset": "first"}, COUNT) == list(range(COUNT))


@pytest.mark.parametrize("prefetch", [1, 7, 1000])
def test_from_an_offset_with_any_prefetch(
    connection: pika.BlockingConnection, prefetch: int
) -> None:
    declare(connection, "runs", 600)
    got = consume(connection, "runs", {"x-stream-offset": 250}, 350, prefetch)
    assert got == list(range(250, 600))


def test_from_next_gets_what_is_published_after(connection: pika.BlockingConnection) -> None:
    declare(connection, "runs", 100)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=300)
    got: list[int] = []
    channel.basic_consume(
        "runs",
        lambda ch, method, properties, body: (
            check(int(body[:5]), properties.headers["x-stream-offset"], properties, body),
            got.append(properties.headers["x-stream-offset"]),
            ch.basic_ack(method.delivery_tag),
        ),
        arguments={"x-stream-offset": "next"},
    )
    connection.process_data_events(0.2)
    publisher = connection.channel()
    publish(publisher, "runs", 100, 1000)
    for _ in range(100):
        if len(got) >= 1000:
            break
        connection.process_data_events(0.1)
    assert got == list(range(100, 1100))


def test_two_consumers_each_read_the_whole_stream(connection: pika.BlockingConnection) -> None:
    """Each consumer has its own window and position; one drain's budget is shared."""
    declare(connection, "runs", COUNT)
    channels = []
    got: dict[str, list[int]] = {"a": [], "b": []}
    for tag in ("a", "b"):
        channel = connection.channel()
        channel.basic_qos(prefetch_count=500)
        channel.basic_consume(
            "runs",
            lambda ch, method, properties, body, tag=tag: (
                got[tag].append(properties.headers["x-stream-offset"]),
                ch.basic_ack(method.delivery_tag),
            ),
            arguments={"x-stream-offset": "first"},
            consumer_tag=tag,
        )
        channels.append(channel)
    for _ in range(200):
        if min(map(len, got.values())) >= COUNT:
            break
        connection.process_data_events(0.1)
    assert got == {"a": list(range(COUNT)), "b": list(range(COUNT))}


def test_tracked_offsets_are_stored_from_acks_settled_as_runs(broker: RunningBroker) -> None:
    conn = connect(broker)
    declare(conn, "tracked", COUNT)
    tracking = {"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True}
    assert consume(conn, "tracked", tracking, 1234, tag="reader") == list(range(1234))
    # Resumes after the last offset acked with everything before it.
    assert consume(conn, "tracked", tracking, 10, tag="reader") == list(range(1234, 1244))
    conn.close()
    broker.stop()
    with broker_on(broker.data_dir) as restarted:
        conn = connect(restarted)
        got = consume(conn, "tracked", tracking, COUNT - 1244, tag="reader")
        assert got == list(range(1244, COUNT))
        conn.close()


def test_a_nack_with_requeue_in_a_run_redelivers_just_that_message(
    connection: pika.BlockingConnection,
) -> None:
    declare(connection, "runs", 300)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    got: list[tuple[int, bool]] = []
    for method, properties, _ in channel.consume(
        "runs", arguments={"x-stream-offset": "first"}, inactivity_timeout=TIMEOUT_S
    ):
        assert method is not None
        offset = properties.headers["x-stream-offset"]
        got.append((offset, method.redelivered))
        if offset == 50 and not method.redelivered:
            channel.basic_nack(method.delivery_tag, requeue=True)
        else:
            channel.basic_ack(method.delivery_tag)
        if len(got) == 301:
            break
    channel.close()
    assert sorted(o for o, _ in got) == sorted([*range(300), 50])
    assert [o for o, redelivered in got if redelivered] == [50]
    assert [o for o, redelivered in got if not redelivered] == list(range(300))


async def test_aio_pika_reads_runs_in_order_with_acks_and_tracking(
    broker: RunningBroker,
) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=300)
        queue = await channel.declare_queue("aio-runs", durable=True, arguments=SMALL_SEGMENTS)
        for n in range(1500):
            await channel.default_exchange.publish(
                aio_pika.Message(f"{n:05d}".encode(), headers={"n": n}), routing_key="aio-runs"
            )

        async def read(count: int) -> list[int]:
            arguments = {"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True}
            got: list[int] = []
            async with queue.iterator(arguments=arguments, consumer_tag="aio") as messages:
                async for message in messages:
                    offset = int(message.headers["x-stream-offset"])  # type: ignore[arg-type]  # a long header
                    assert message.headers["n"] == offset == int(message.body)
                    await message.ack()
                    got.append(offset)
                    if len(got) == count:
                        break
            return got

        assert await asyncio.wait_for(read(1000), TIMEOUT_S) == list(range(1000))
        assert await asyncio.wait_for(read(500), TIMEOUT_S) == list(range(1000, 1500))
