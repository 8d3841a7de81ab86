"""kombu, and the py-amqp client under it, against the broker on loopback: producers and
consumers on direct and topic exchanges, SimpleQueue, ack/requeue/reject, heartbeat
negotiation, consumer tag reuse, channel errors and an exclusive queue whose connection
drops without a close.

Every expected code and text here was checked against a RabbitMQ 3.10 server."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import amqp
import amqp.exceptions
import kombu
import pytest
from kombu.simple import SimpleQueue

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10
SETTLE_S = 0.3  # how long to wait for deliveries that must not come


def url(broker: RunningBroker) -> str:
    return f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}//"


@pytest.fixture
def conn(broker: RunningBroker) -> Iterator[kombu.Connection]:
    connection = kombu.Connection(url(broker), connect_timeout=TIMEOUT_S)
    connection.connect()
    yield connection
    connection.release()


def py_amqp(broker: RunningBroker, **kwargs: object) -> amqp.Connection:
    connection = amqp.Connection(
        f"127.0.0.1:{broker.amqp_port}",
        connect_timeout=TIMEOUT_S,
        read_timeout=TIMEOUT_S,
        write_timeout=TIMEOUT_S,
        **kwargs,
    )
    connection.connect()
    return connection


def drain_until(conn: kombu.Connection, done: object) -> None:
    """Call drain_events until `done()` holds; every wait is bounded."""
    deadline = time.monotonic() + TIMEOUT_S
    while not done():  # type: ignore[operator]
        remaining = deadline - time.monotonic()
        assert remaining > 0, "timed out waiting for messages"
        conn.drain_events(timeout=remaining)


def drain_nothing(conn: kombu.Connection) -> None:
    """Wait SETTLE_S for events that must not come."""
    with pytest.raises(socket.timeout):
        conn.drain_events(timeout=SETTLE_S)


def ready_count(conn: kombu.Connection, queue: str) -> int:
    return conn.default_channel.queue_declare(queue, passive=True).message_count


@pytest.mark.parametrize(
    ("exchange_type", "binding_key", "routed", "dropped"),
    [
        ("direct", "orders", ["orders"], ["orders.eu", "other"]),
        ("topic", "orders.*", ["orders.eu", "orders.us"], ["orders", "orders.eu.x"]),
    ],
)
def test_producer_and_consumer(
    conn: kombu.Connection,
    exchange_type: str,
    binding_key: str,
    routed: list[str],
    dropped: list[str],
) -> None:
    exchange = kombu.Exchange(f"k-{exchange_type}", type=exchange_type, durable=False)
    queue = kombu.Queue(f"kq-{exchange_type}", exchange, routing_key=binding_key)
    producer = kombu.Producer(conn.default_channel, exchange=exchange, serializer="json")
    queue(conn.default_channel).declare()
    for key in routed + dropped:
        producer.publish({"key": key}, routing_key=key, headers={"k": key})
    got: list[tuple[dict, str, str]] = []

    def on_message(body: dict, message: kombu.Message) -> None:
        got.append((body, message.delivery_info["routing_key"], message.headers["k"]))
        message.ack()

    with kombu.Consumer(conn, [queue], callbacks=[on_message], accept=["json"]):
        drain_until(conn, lambda: len(got) == len(routed))
        drain_nothing(conn)
    assert got == [({"key": key}, key, key) for key in routed]
    assert ready_count(conn, queue.name) == 0


def test_simple_queue_put_and_get(conn: kombu.Connection) -> None:
    simple: SimpleQueue = conn.SimpleQueue("simple")
    try:
        for i in range(3):
            simple.put({"n": i})
        for i in range(3):
            message = simple.get(block=True, timeout=TIMEOUT_S)
            assert message.payload == {"n": i}
            message.ack()
        with pytest.raises(SimpleQueue.Empty):
            simple.get_nowait()
        with pytest.raises(SimpleQueue.Empty):
            simple.get(block=True, timeout=SETTLE_S)
        assert len(simple) == 0  # a passive declare's message_count
    finally:
        simple.close()


def test_ack_requeue_and_reject(conn: kombu.Connection) -> None:
    queue = kombu.Queue("settle", kombu.Exchange("settle-x", type="direct"), routing_key="s")
    with conn.Producer() as producer:
        for body in ("ack me", "requeue me", "reject me"):
            producer.publish(
                body, exchange=queue.exchange, routing_key="s", declare=[queue], serializer="json"
            )
    got: list[tuple[str, bool]] = []

    def on_message(body: str, message: kombu.Message) -> None:
        got.append((body, message.delivery_info["redelivered"]))
        if body == "ack me":
            message.ack()
        elif body == "requeue me" and not message.delivery_info["redelivered"]:
            message.requeue()
        elif body == "requeue me":
            message.ack()
        else:
            message.reject()  # requeue=False: the message is dropped

    with kombu.Consumer(conn, [queue], callbacks=[on_message], accept=["json"]):
        drain_until(conn, lambda: len(got) == 4)
        drain_nothing(conn)
    assert got == [
        ("ack me", False),
        ("requeue me", False),
        ("reject me", False),
        ("requeue me", True),
    ]
    assert ready_count(conn, "settle") == 0


def test_heartbeat_option_is_negotiated(broker: RunningBroker) -> None:
    """kombu's heartbeat=10 is the client's proposal; the broker proposes its own interval
    in connection.tune, and the lower non-zero value wins, so the link runs at 10 s."""
    with kombu.Connection(url(broker), heartbeat=10, connect_timeout=TIMEOUT_S) as conn:
        conn.connect()
        assert conn.connection.heartbeat == 10
        assert conn.connection.server_heartbeat > 0
        assert conn.get_heartbeat_interval() == 10
        conn.heartbeat_check()  # sends a heartbeat when one is due; must not raise
        conn.connection.send_heartbeat()
        simple = conn.SimpleQueue("hb")
        simple.put("alive")
        assert simple.get(timeout=TIMEOUT_S).payload == "alive"
        simple.close()


def test_consumer_tag_reuse_closes_the_connection_with_530(broker: RunningBroker) -> None:
    connection = py_amqp(broker)
    channel = connection.channel()
    channel.queue_declare("tags")
    channel.basic_consume("tags", consumer_tag="mine", callback=lambda m: None)
    with pytest.raises(amqp.exceptions.NotAllowed) as refused:
        channel.basic_consume("tags", consumer_tag="mine", callback=lambda m: None)
        connection.drain_events(timeout=TIMEOUT_S)
    assert refused.value.reply_code == 530
    assert refused.value.reply_text == "NOT_ALLOWED - attempt to reuse consumer tag 'mine'"
    connection.collect()


def test_a_refused_consume_gets_no_consume_ok(broker: RunningBroker) -> None:
    connection = py_amqp(broker)
    try:
        owner = connection.channel()
        owner.queue_declare("solo")
        owner.basic_consume("solo", callback=lambda m: None, exclusive=True)
        with pytest.raises(amqp.exceptions.AccessRefused) as refused:
            connection.channel().basic_consume("solo", callback=lambda m: None)
        assert refused.value.reply_code == 403
        assert refused.value.reply_text == (
            "ACCESS_REFUSED - queue 'solo' in vhost '/' in exclusive use"
        )
    finally:
        connection.close()


def test_a_channel_error_leaves_the_connection_usable(conn: kombu.Connection) -> None:
    broken = conn.channel()
    with pytest.raises(amqp.exceptions.NotFound) as missing:
        broken.queue_declare("absent", passive=True)
    assert missing.value.reply_code == 404
    assert missing.value.reply_text == "NOT_FOUND - no queue 'absent' in vhost '/'"
    simple = conn.SimpleQueue("after-error", channel=conn.channel())
    simple.put("still working")
    assert simple.get(timeout=TIMEOUT_S).payload == "still working"
    simple.close()


def test_an_exclusive_queue_goes_when_its_socket_drops(broker: RunningBroker) -> None:
    """The owner's socket is shut without a connection.close; the broker must still delete
    the exclusive queue (RabbitMQ does once it sees the TCP close)."""
    owner = py_amqp(broker)
    owner.channel().queue_declare("dropped-owner", exclusive=True)
    owner.sock.shutdown(socket.SHUT_RDWR)
    owner.sock.close()
    observer = py_amqp(broker)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            channel = observer.channel()
            try:
                channel.queue_declare("dropped-owner", passive=True)
            except amqp.exceptions.NotFound as gone:
                assert gone.reply_text == "NOT_FOUND - no queue 'dropped-owner' in vhost '/'"
                break
            except amqp.exceptions.ResourceLocked:
                pass  # the broker has not seen the close yet
            assert time.monotonic() < deadline, "exclusive queue outlived its connection"
            time.sleep(0.05)
    finally:
        observer.close()
