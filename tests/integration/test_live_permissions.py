"""Changes to permissions, topic permissions, users and vhosts apply to connections
already open (as LavinMQ 2.6 fixed: a revoked user must not keep publishing).

Method: user `app` connects (pika over TCP, pika through a WebSocket relay, rstream over
the stream protocol), works, then guest changes its accounts over the HTTP API while the
connection stays open; the next operation of that connection must see the change. Every
publish runs under confirms, so a refused publish shows as a channel closed with 403
rather than a message silently dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from rstream import AMQPMessage, ConfirmationStatus, Producer

from tests.integration.conftest import RunningBroker
from tests.integration.ws_relay import WebSocketRelay

TIMEOUT_S = 10
USER = "app"
PASSWORD = "app-secret"
EVERYTHING = {"configure": ".*", "write": ".*", "read": ".*"}
ACCESS_REFUSED_STREAM = 0x10  # the stream protocol's response code


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    running = RunningBroker(tmp_path / "data", stream_port=0)
    try:
        add_user(running, USER, PASSWORD)
        set_permissions(running, "/", **EVERYTHING)
        yield running
    finally:
        running.stop()


@pytest.fixture(params=["tcp", "websocket"])
def amqp_port(request: pytest.FixtureRequest, broker: RunningBroker) -> Iterator[int]:
    """The port pika dials: the broker's AMQP port, or a relay to its WebSocket endpoint."""
    if request.param == "tcp":
        yield broker.amqp_port
        return
    relay = WebSocketRelay(f"ws://127.0.0.1:{broker.http_port}/")
    try:
        yield relay.port
    finally:
        relay.close()


def http_ok(broker: RunningBroker, method: str, path: str, body: object = None) -> None:
    status, answer, _ = broker.http(method, path, body)
    assert status in (201, 204), (method, path, status, answer)


def add_user(broker: RunningBroker, name: str, password: str) -> None:
    http_ok(broker, "PUT", f"/api/users/{name}", {"password": password, "tags": ""})


def set_permissions(broker: RunningBroker, vhost: str, **regexes: str) -> None:
    http_ok(broker, "PUT", f"/api/permissions/{vhost.replace('/', '%2F')}/{USER}", regexes)


def connect(port: int, password: str = PASSWORD, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            port,
            vhost,
            credentials=pika.PlainCredentials(USER, password),
            blocked_connection_timeout=TIMEOUT_S,
        )
    )


def confirming_channel(connection: pika.BlockingConnection) -> BlockingChannel:
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def refused(action: Callable[[], object]) -> str:
    """The reply text of the 403 that closes the channel when `action` runs."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        action()
    assert raised.value.reply_code == 403, raised.value
    return str(raised.value.reply_text)


def forced_close(connection: pika.BlockingConnection) -> str:
    """The reply text of the 320 that the broker closes `connection` with."""
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.05)
    assert raised.value.reply_code == 320, raised.value
    return str(raised.value.reply_text)


def connection_users(broker: RunningBroker) -> list[str]:
    status, body, _ = broker.http("GET", "/api/connections")
    assert status == 200 and isinstance(body, list)
    return [str(c["user"]) for c in body]


def wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- AMQP, over TCP and WebSocket ----------------------------------------------------------


def test_revoked_write_refuses_the_next_publish(broker: RunningBroker, amqp_port: int) -> None:
    connection = connect(amqp_port)
    channel = confirming_channel(connection)
    channel.queue_declare("work")
    channel.basic_publish("", "work", b"before")  # confirmed: cached as allowed
    set_permissions(broker, "/", configure=".*", write="", read=".*")
    text = refused(lambda: channel.basic_publish("", "work", b"after"))
    refusal = "access to exchange 'amq.default' in vhost '/' refused for user 'app'"
    assert text == f"ACCESS_REFUSED - {refusal}"
    # Only the channel closed: the connection goes on, and may still read.
    other = connection.channel()
    method, _, body = other.basic_get("work", auto_ack=True)
    assert method is not None and body == b"before"
    assert other.basic_get("work", auto_ack=True)[0] is None  # "after" was not stored
    connection.close()


def test_granted_write_lets_the_next_publish_through(broker: RunningBroker, amqp_port: int) -> None:
    set_permissions(broker, "/", configure=".*", write="", read=".*")
    connection = connect(amqp_port)
    channel = confirming_channel(connection)
    channel.queue_declare("work")
    refused(lambda: channel.basic_publish("", "work", b"refused"))  # cached as refused
    set_permissions(broker, "/", **EVERYTHING)
    channel = confirming_channel(connection)
    channel.basic_publish("", "work", b"granted")
    assert channel.queue_declare("work", passive=True).method.message_count == 1
    connection.close()


def test_revoked_read_refuses_get_and_consume_but_keeps_consumers(
    broker: RunningBroker, amqp_port: int
) -> None:
    """As RabbitMQ (and LavinMQ): permissions are checked when an operation starts, so a
    consumer that started before the change keeps its deliveries."""
    connection = connect(amqp_port)
    consuming = connection.channel()
    consuming.queue_declare("work")
    delivered: list[bytes] = []
    consuming.basic_consume("work", lambda _ch, _m, _p, body: delivered.append(body), True)
    set_permissions(broker, "/", configure=".*", write=".*", read="")
    publisher = confirming_channel(connection)
    publisher.basic_publish("", "work", b"to the old consumer")
    deadline = time.monotonic() + TIMEOUT_S
    while not delivered and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert delivered == [b"to the old consumer"]
    text = refused(lambda: connection.channel().basic_get("work"))
    assert text == "ACCESS_REFUSED - access to queue 'work' in vhost '/' refused for user 'app'"
    fresh = connection.channel()
    refused(lambda: fresh.basic_consume("work", lambda *_: None))
    connection.close()


def test_revoked_configure_refuses_the_next_declare(broker: RunningBroker, amqp_port: int) -> None:
    connection = connect(amqp_port)
    channel = connection.channel()
    channel.queue_declare("first")
    channel.queue_declare("second")  # cached as allowed
    set_permissions(broker, "/", configure="^first$", write=".*", read=".*")
    channel.queue_declare("first")  # still allowed by the new regex
    text = refused(lambda: channel.queue_declare("second"))
    assert text == "ACCESS_REFUSED - access to queue 'second' in vhost '/' refused for user 'app'"
    connection.close()


def test_cleared_permissions_refuse_everything_but_keep_the_connection(
    broker: RunningBroker, amqp_port: int
) -> None:
    """As LavinMQ 2.6 (and RabbitMQ, which checks vhost access only at connection.open):
    losing every permission on the vhost refuses the next operation with 403; the
    connection itself stays open."""
    connection = connect(amqp_port)
    channel = confirming_channel(connection)
    channel.queue_declare("work")
    channel.basic_publish("", "work", b"before")
    http_ok(broker, "DELETE", f"/api/permissions/%2F/{USER}")
    refused(lambda: channel.basic_publish("", "work", b"after"))
    refused(lambda: connection.channel().queue_declare("other"))
    assert connection.is_open
    connection.channel().close()  # the connection still answers
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        connect(amqp_port)  # a new connection is refused at connection.open
    connection.close()


def test_deleting_the_user_closes_its_connections(broker: RunningBroker, amqp_port: int) -> None:
    connection = connect(amqp_port)
    connection.channel().queue_declare("work")
    guest = connect_guest(broker)
    http_ok(broker, "DELETE", f"/api/users/{USER}")
    assert forced_close(connection) == f"CONNECTION_FORCED - user '{USER}' is deleted"
    assert guest.is_open  # other users' connections stay
    guest.close()


def test_deleting_the_vhost_closes_its_connections(broker: RunningBroker, amqp_port: int) -> None:
    http_ok(broker, "PUT", "/api/vhosts/tenant")
    set_permissions(broker, "tenant", **EVERYTHING)
    connection = connect(amqp_port, vhost="tenant")
    connection.channel().queue_declare("work")
    on_default = connect(amqp_port)
    http_ok(broker, "DELETE", "/api/vhosts/tenant")
    assert forced_close(connection) == "CONNECTION_FORCED - vhost 'tenant' is deleted"
    assert on_default.is_open  # the same user on another vhost stays
    on_default.close()


def test_a_password_change_keeps_open_connections(broker: RunningBroker, amqp_port: int) -> None:
    """As RabbitMQ: the password is checked at login only."""
    connection = connect(amqp_port)
    channel = confirming_channel(connection)
    channel.queue_declare("work")
    add_user(broker, USER, "new-secret")  # PUT with a password replaces it
    channel.basic_publish("", "work", b"after the change")
    assert channel.queue_declare("work", passive=True).method.message_count == 1
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(amqp_port)  # the old password no longer logs in
    connect(amqp_port, "new-secret").close()
    connection.close()


def test_topic_permissions_set_and_cleared_on_an_open_connection(
    broker: RunningBroker, amqp_port: int
) -> None:
    """A topic permission set while the connection is open restricts its next publish to
    amq.topic (answers cached before included); deleting it frees the next one again."""
    connection = connect(amqp_port)
    channel = confirming_channel(connection)
    channel.queue_declare("tenant-a")
    channel.queue_bind("tenant-a", "amq.topic", "#")
    channel.basic_publish("amq.topic", "tenant-b.orders", b"before")  # cached as allowed
    topic = {"exchange": "amq.topic", "write": "^tenant-a\\.", "read": ".*"}
    http_ok(broker, "PUT", f"/api/topic-permissions/%2F/{USER}", topic)
    channel.basic_publish("amq.topic", "tenant-a.orders", b"allowed")
    text = refused(lambda: channel.basic_publish("amq.topic", "tenant-b.orders", b"refused"))
    assert text == (
        "ACCESS_REFUSED - access to topic 'tenant-b.orders' in exchange 'amq.topic' "
        f"in vhost '/' refused for user '{USER}'"
    )
    http_ok(broker, "DELETE", f"/api/topic-permissions/%2F/{USER}")
    channel = confirming_channel(connection)
    channel.basic_publish("amq.topic", "tenant-b.orders", b"after")
    bodies = []
    while (got := channel.basic_get("tenant-a", auto_ack=True))[0] is not None:
        bodies.append(got[2])
    assert bodies == [b"before", b"allowed", b"after"]
    connection.close()


def connect_guest(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))


# -- the stream protocol (rstream) ---------------------------------------------------------


async def send(producer: Producer, stream: str, body: bytes) -> ConfirmationStatus:
    """Publish one message and wait for its confirm or error."""
    done: asyncio.Future[ConfirmationStatus] = asyncio.get_running_loop().create_future()

    async def answered(status: ConfirmationStatus) -> None:
        if not done.done():
            done.set_result(status)

    await producer.send_batch(stream, [AMQPMessage(body=body)], on_publish_confirm=answered)
    return await asyncio.wait_for(done, TIMEOUT_S)


def stream_producer(broker: RunningBroker) -> Producer:
    return Producer("127.0.0.1", broker.stream_port, username=USER, password=PASSWORD)


async def test_stream_publisher_sees_revoked_and_granted_write(broker: RunningBroker) -> None:
    """As RabbitMQ 3.10, every Publish frame is checked: once write is revoked, the
    messages of an already declared publisher get PublishError ACCESS_REFUSED."""
    producer = stream_producer(broker)
    await producer.start()
    try:
        await producer.create_stream("events")
        assert (await send(producer, "events", b"before")).is_confirmed
        await asyncio.to_thread(set_permissions, broker, "/", configure=".*", write="", read=".*")
        status = await send(producer, "events", b"revoked")
        assert not status.is_confirmed
        assert status.response_code == ACCESS_REFUSED_STREAM
        await asyncio.to_thread(set_permissions, broker, "/", **EVERYTHING)
        assert (await send(producer, "events", b"granted")).is_confirmed
    finally:
        await producer.close()
    status, body, _ = await asyncio.to_thread(broker.http, "GET", "/api/queues/%2F/events")
    assert status == 200 and isinstance(body, dict)
    assert body["messages"] == 2  # "revoked" was not stored


@pytest.mark.parametrize("deleted", ["user", "vhost"])
async def test_stream_connections_close_when_their_user_or_vhost_goes(
    broker: RunningBroker, deleted: str
) -> None:
    await asyncio.to_thread(http_ok, broker, "PUT", "/api/vhosts/tenant")
    await asyncio.to_thread(set_permissions, broker, "tenant", **EVERYTHING)
    closed = asyncio.Event()

    async def on_close(_info: object) -> None:
        closed.set()

    producer = Producer(
        "127.0.0.1",
        broker.stream_port,
        vhost="tenant",
        username=USER,
        password=PASSWORD,
        on_close_handler=on_close,
    )
    await producer.start()
    try:
        await producer.create_stream("events")  # on a connection of its own, closed after
        assert (await send(producer, "events", b"m")).is_confirmed  # the publishing one
        assert await asyncio.to_thread(connection_users, broker) == [USER]
        path = f"/api/users/{USER}" if deleted == "user" else "/api/vhosts/tenant"
        await asyncio.to_thread(http_ok, broker, "DELETE", path)
        await asyncio.to_thread(wait_until, lambda: USER not in connection_users(broker))
        await asyncio.wait_for(closed.wait(), TIMEOUT_S)
    finally:
        await producer.close()
