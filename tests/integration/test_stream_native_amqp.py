"""Records written by stream clients (AMQP 1.0 messages stored as native records, C1 of
issue 23) read over AMQP 0-9-1 with pika and over the HTTP stream read: body kept,
application properties as headers, 1.0 properties mapped, the filter value seen by
x-stream-filter, in order with the 0-9-1 records around them and their x-stream-offset.

The records are appended through the stream's own `StreamQueue.append` on the broker's
loop with `native_properties`, as the stream gateway's Publish does, so that this test
does not depend on that gateway.
"""

from __future__ import annotations

import asyncio
import time

import pika
from rstream._pyamqp.message import Properties
from rstream.amqp import AMQPMessage

from streamq.log.amqp10 import native_properties
from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10
STREAM = {"x-queue-type": "stream"}
NATIVE_COUNT = 700  # more than one per-record read (256) and more than the prefetch


def native_message(n: int) -> bytes:
    if n % 100 == 7:
        return f"raw-{n}".encode()  # a client may send bytes that are not AMQP 1.0
    return bytes(
        AMQPMessage(
            body=f"native-{n}".encode(),
            application_properties={"n": n, "colour": "blue" if n % 2 else "red"},
            properties=Properties(message_id=f"id-{n}", content_type="text/plain"),
        )
    )


def append_native(broker: RunningBroker, name: str, first_id: int, count: int) -> int:
    """Append `count` native records on the broker's loop; wait until they are durable.
    Returns the offset after them."""
    tasks: list[asyncio.Task[int]] = []  # holds the sync task until it is done

    def append() -> int:
        stream = broker.broker.vhosts["/"].queues[name].stream
        assert stream is not None
        now = int(time.time() * 1000)
        for n in range(first_id, first_id + count):
            filter_value = (b"blue" if n % 2 else b"red") if n % 3 else b""
            stream.append(b"", filter_value, native_properties(n), native_message(n), now)
        tasks.append(asyncio.get_running_loop().create_task(stream.log.sync()))
        return stream.log.next_offset

    end = broker.ask(append)
    deadline = time.monotonic() + TIMEOUT_S
    while broker.ask(lambda: broker.broker.vhosts["/"].queues[name].stream.log.durable_next) < end:
        assert time.monotonic() < deadline, "native records did not become durable"
        time.sleep(0.01)
    return end


def consume(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    name: str,
    count: int,
    arguments: dict[str, object],
) -> list[tuple[pika.spec.Basic.Deliver, pika.BasicProperties, bytes]]:
    channel.basic_qos(prefetch_count=100)
    got: list[tuple[pika.spec.Basic.Deliver, pika.BasicProperties, bytes]] = []
    for method, properties, body in channel.consume(
        name, arguments={"x-stream-offset": "first", **arguments}, inactivity_timeout=TIMEOUT_S
    ):
        assert method is not None, f"only {len(got)} of {count} deliveries came"
        channel.basic_ack(method.delivery_tag)
        got.append((method, properties, body))
        if len(got) == count:
            break
    channel.cancel()
    return got


def test_native_records_reach_pika_converted(broker: RunningBroker) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    channel = connection.channel()
    channel.queue_declare("mixed", durable=True, arguments=STREAM)
    channel.confirm_delivery()
    channel.basic_publish("", "mixed", b"amqp-0", pika.BasicProperties(headers={"a": 1}))
    append_native(broker, "mixed", 0, NATIVE_COUNT)
    channel.basic_publish("", "mixed", b"amqp-1", pika.BasicProperties(content_type="x/y"))
    got = consume(channel, "mixed", NATIVE_COUNT + 2, {})
    offsets = [p.headers["x-stream-offset"] for _, p, _ in got]
    assert offsets == list(range(NATIVE_COUNT + 2))
    assert got[0][2] == b"amqp-0" and got[0][1].headers["a"] == 1
    assert got[-1][2] == b"amqp-1" and got[-1][1].content_type == "x/y"
    for n, (method, properties, body) in enumerate(got[1:-1]):
        assert method.exchange == "" and method.routing_key == "mixed"
        if n % 100 == 7:
            assert body == f"raw-{n}".encode()
            continue
        assert body == f"native-{n}".encode()
        assert properties.message_id == f"id-{n}"
        assert properties.content_type == "text/plain"
        assert properties.headers["n"] == n
        assert properties.headers["colour"] == (b"blue" if n % 2 else b"red").decode()
        if n % 3:
            assert properties.headers["x-stream-filter-value"] == properties.headers["colour"]
        else:
            assert "x-stream-filter-value" not in properties.headers
    connection.close()


def test_amqp_filter_sees_native_filter_values(broker: RunningBroker) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    channel = connection.channel()
    channel.queue_declare("filtered", durable=True, arguments=STREAM)
    append_native(broker, "filtered", 0, 60)
    blue = [n for n in range(60) if n % 2 and n % 3]
    got = consume(channel, "filtered", len(blue), {"x-stream-filter": "blue"})
    assert [p.headers["x-stream-offset"] for _, p, _ in got] == blue
    assert {p.headers["x-stream-filter-value"] for _, p, _ in got} == {"blue"}
    connection.close()


def test_http_stream_read_converts_native_records(broker: RunningBroker) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    connection.channel().queue_declare("read", durable=True, arguments=STREAM)
    connection.close()
    append_native(broker, "read", 0, 3)
    status, rows, _ = broker.http(
        "POST", "/api/queues/%2F/read/stream", {"offset": "first", "count": 3}
    )
    assert status == 200, rows
    assert [r["payload"] for r in rows] == ["native-0", "native-1", "native-2"]
    assert rows[1]["routing_key"] == "read"
    assert rows[1]["properties"]["message_id"] == "id-1"
    assert rows[1]["properties"]["headers"]["colour"] == "blue"
    assert rows[1]["properties"]["headers"]["x-stream-filter-value"] == "blue"
