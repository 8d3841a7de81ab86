"""The links' outbound AMQP client (streamq/links/amqp) against a real streamq broker.

Each test runs the client on an event loop of its own (uvloop) against the in-process
broker over loopback TCP, or, for direct connections, on the broker's own loop through
the gateway's DirectConnector. Failures are provoked for real: a wrong password, a port
nobody listens on, a missing queue, a broker frozen past two heartbeats, a memory alarm.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import TypeVar

import pika
import pytest
import uvloop

from amqp_gateway import codec
from amqp_gateway.gateway import Gateway
from streamq.broker.resources import ResourceLimits
from streamq.links.amqp.client import (
    AmqpConnectionError,
    Channel,
    ChannelClosedError,
    Connection,
    Delivery,
)
from streamq.links.amqp.uri import parse_uri
from tests.differential.peers import free_port
from tests.integration.conftest import RunningBroker

TIMEOUT_S = 20.0
PERSISTENT = codec.encode_properties(codec.BasicProperties(delivery_mode=2))
TERABYTE = 1 << 40
T = TypeVar("T")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    running = RunningBroker(tmp_path_factory.mktemp("links-client") / "data")
    yield running
    running.stop()


def run(coro: Coroutine[object, object, T]) -> T:
    """Run `coro` on a uvloop of this thread, within TIMEOUT_S."""

    async def bounded() -> T:
        async with asyncio.timeout(TIMEOUT_S):
            return await coro

    return uvloop.run(bounded())


def on_broker(broker: RunningBroker, make: Callable[[], Awaitable[T]]) -> T:
    """Run the coroutine `make()` on the broker's own event loop and wait for it."""
    loop = broker._loop
    assert loop is not None

    async def bounded() -> T:
        async with asyncio.timeout(TIMEOUT_S):
            return await make()

    return asyncio.run_coroutine_threadsafe(bounded(), loop).result(TIMEOUT_S + 5)


def uri(
    broker: RunningBroker, user: str = "guest", password: str = "guest", query: str = ""
) -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{broker.amqp_port}/%2f{query}"


async def connect(text: str) -> Connection:
    return await Connection.connect(parse_uri(text), name="test link")


class Collector:
    """Deliveries of one consumer, and an event set once `count` have come."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.deliveries: list[Delivery] = []
        self.batches = 0
        self.done = asyncio.Event()

    def __call__(self, deliveries: list[Delivery]) -> None:
        self.batches += 1
        self.deliveries.extend(deliveries)
        if len(self.deliveries) >= self.count:
            self.done.set()


class Confirms:
    """Publisher confirms settled so far, by the highest contiguous sequence number."""

    def __init__(self) -> None:
        self.acked: set[int] = set()
        self.upto = 0
        self.nacked = 0
        self.changed = asyncio.Event()

    def __call__(self, seq: int, multiple: bool, ack: bool) -> None:
        if multiple:
            self.upto = max(self.upto, seq)
        else:
            self.acked.add(seq)
        while self.upto + 1 in self.acked:
            self.upto += 1
            self.acked.discard(self.upto)
        self.nacked += not ack
        self.changed.set()

    async def wait_for(self, seq: int) -> None:
        while self.upto < seq:
            self.changed.clear()
            await self.changed.wait()


async def publish_confirmed(channel: Channel, queue: str, bodies: list[bytes]) -> Confirms:
    """Publish `bodies` persistent to `queue` under confirms, in batches as a shovel does
    (one write per batch, then wait until writable), and wait for every confirm."""
    confirms = Confirms()
    channel.on_confirm = confirms
    await channel.confirm_select()
    seq = 0
    for start in range(0, len(bodies), 500):
        for body in bodies[start : start + 500]:
            seq = channel.publish("", queue, PERSISTENT, body)
        await channel.writable()
    await confirms.wait_for(seq)
    return confirms


async def transfer(text: str, queue: str, count: int) -> tuple[Confirms, Collector]:
    connection = await connect(text)
    try:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True)
        bodies = [b"message %06d" % n for n in range(count)]
        confirms = await publish_confirmed(channel, queue, bodies)
        consumer_channel = await connection.channel()
        await consumer_channel.qos(1000)
        collector = Collector(count)

        def take(deliveries: list[Delivery]) -> None:
            collector(deliveries)
            consumer_channel.ack(deliveries[-1].delivery_tag, multiple=True)

        await consumer_channel.consume(queue, take)
        await collector.done.wait()
        assert [d.body for d in collector.deliveries] == bodies
        assert {d.properties for d in collector.deliveries} == {PERSISTENT}
        await channel.delete_queue(queue)
    finally:
        await connection.close()
    return confirms, collector


def test_publish_with_confirms_and_consume_with_acks(broker: RunningBroker) -> None:
    confirms, collector = run(transfer(uri(broker), "links-10k", 10_000))
    assert confirms.upto == 10_000 and confirms.nacked == 0
    # Deliveries come in batches, one call per read, not one per message.
    assert collector.batches < 10_000 // 5


def test_nack_with_requeue_redelivers(broker: RunningBroker) -> None:
    async def scenario() -> list[tuple[bytes, bool]]:
        connection = await connect(uri(broker))
        channel = await connection.channel()
        await channel.declare_queue("links-nack", durable=False, auto_delete=False)
        await publish_confirmed(channel, "links-nack", [b"a", b"b", b"c"])
        await channel.qos(3)
        seen: list[tuple[bytes, bool]] = []
        done = asyncio.Event()

        def take(deliveries: list[Delivery]) -> None:
            for delivery in deliveries:
                seen.append((delivery.body, delivery.redelivered))
                if delivery.redelivered:
                    channel.ack(delivery.delivery_tag)
                else:
                    channel.nack(delivery.delivery_tag, requeue=True)
            if sum(redelivered for _, redelivered in seen) == 3:
                done.set()

        await channel.consume("links-nack", take)
        await done.wait()
        await channel.delete_queue("links-nack")
        await connection.close()
        return seen

    seen = run(scenario())
    assert sorted(body for body, redelivered in seen if redelivered) == [b"a", b"b", b"c"]
    assert sorted(body for body, redelivered in seen if not redelivered) == [b"a", b"b", b"c"]


def test_channel_error_closes_only_that_channel(broker: RunningBroker) -> None:
    async def scenario() -> ChannelClosedError:
        connection = await connect(uri(broker))
        channel = await connection.channel()
        with pytest.raises(ChannelClosedError) as caught:
            await channel.declare_queue("links-missing", passive=True)
        assert channel.closed.done()
        other = await connection.channel()  # the connection goes on
        await other.declare_queue("links-present", durable=False, exclusive=True)
        await connection.close()
        assert connection.closed.result() is None
        return caught.value

    error = run(scenario())
    assert error.reply_code == 404
    assert "NOT_FOUND - no queue 'links-missing' in vhost '/'" in str(error)


def test_wrong_password_is_access_refused(broker: RunningBroker) -> None:
    with pytest.raises(AmqpConnectionError, match="ACCESS_REFUSED - Login was refused") as caught:
        run(connect(uri(broker, password="wrong")))
    assert caught.value.reply_code == 403
    assert "wrong" not in str(caught.value)


def test_missing_vhost_is_refused(broker: RunningBroker) -> None:
    text = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/nowhere"
    with pytest.raises(AmqpConnectionError, match="nowhere") as caught:
        run(connect(text))
    assert caught.value.reply_code in (402, 530)


def test_refused_port() -> None:
    port = free_port()  # bound then closed: nobody listens there
    with pytest.raises(AmqpConnectionError, match=f"connection refused by 127.0.0.1:{port}"):
        run(connect(f"amqp://127.0.0.1:{port}"))


def test_connection_timeout_on_a_silent_listener() -> None:
    """A peer that accepts but never answers: connection_timeout bounds the wait."""

    async def scenario() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            await connect(f"amqp://127.0.0.1:{port}?connection_timeout=300")
        finally:
            server.close()

    started = time.monotonic()
    with pytest.raises(AmqpConnectionError, match="timed out in the handshake with"):
        run(scenario())
    assert time.monotonic() - started < 5


def test_missed_heartbeats_are_detected(broker: RunningBroker) -> None:
    """The broker's event loop is frozen for 4 s: with a 1 s heartbeat the client gives
    up after about 2 s of silence, with a clear reason."""

    async def scenario() -> tuple[str, float]:
        connection = await connect(uri(broker, query="?heartbeat=1"))
        assert connection.heartbeat_s == 1
        await asyncio.sleep(2.5)  # heartbeats flow: still open
        assert not connection.closed.done()
        broker.call(lambda: time.sleep(4))
        started = time.monotonic()
        with pytest.raises(AmqpConnectionError) as caught:
            await connection.closed
        return str(caught.value), time.monotonic() - started

    message, waited_s = run(scenario())
    assert "missed heartbeats from 127.0.0.1" in message
    assert waited_s < 3.9


def test_blocked_under_a_memory_alarm(tmp_path: Path) -> None:
    """A broker with a 1-byte memory limit blocks a connection that publishes: the client
    sees connection.blocked, and `writable()` waits until the alarm clears."""
    alarmed = RunningBroker(tmp_path / "data", ResourceLimits(1, 0))
    try:

        async def scenario() -> tuple[bool, str, bool]:
            connection = await connect(uri(alarmed))
            channel = await connection.channel()
            await channel.declare_queue("links-alarm", durable=False)
            channel.publish("", "links-alarm", PERSISTENT, b"first")
            deadline = time.monotonic() + 10
            while not connection.blocked and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            blocked, reason = connection.blocked, connection.blocked_reason
            waiter = asyncio.ensure_future(channel.writable())
            await asyncio.sleep(0.3)
            waited = not waiter.done()
            assert alarmed.broker is not None
            unlimited = ResourceLimits(TERABYTE, 0)
            alarmed.call(lambda: setattr(alarmed.broker.resources, "limits", unlimited))
            await waiter
            await connection.close()
            return blocked, reason, waited

        blocked, reason, waited = run(scenario())
    finally:
        alarmed.stop()
    assert blocked and reason == "low on memory" and waited


def gateway_of(broker: RunningBroker) -> Gateway:
    """The broker's AMQP gateway, found through a connection it serves."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    try:
        assert broker.broker is not None
        client = next(iter(broker.broker.clients.values()))
        gateway: Gateway = client._session.gateway  # type: ignore[attr-defined]  # test only
        return gateway
    finally:
        connection.close()


def test_direct_connection_as_guest(broker: RunningBroker) -> None:
    gateway = gateway_of(broker)

    async def scenario() -> tuple[list[bytes], list[dict[str, object]]]:
        # The URI's password is not checked on a direct connection: only its user is.
        connection = await Connection.connect(
            parse_uri("amqp://"), name="direct link", direct=gateway.direct_connector()
        )
        channel = await connection.channel()
        await channel.declare_queue("links-direct", durable=False)
        await publish_confirmed(channel, "links-direct", [b"one", b"two"])
        collector = Collector(2)
        await channel.consume("links-direct", collector, no_ack=True)
        await collector.done.wait()
        listed = await asyncio.get_running_loop().run_in_executor(
            None, broker.http, "GET", "/api/connections"
        )
        await channel.delete_queue("links-direct")
        await connection.close()
        return [d.body for d in collector.deliveries], listed[1]  # type: ignore[return-value]

    bodies, connections = on_broker(broker, scenario)
    assert bodies == [b"one", b"two"]
    direct = [c for c in connections if c["type"] == "direct"]
    assert len(direct) == 1
    assert direct[0]["peer_host"] == "direct" and direct[0]["user"] == "guest"
    assert direct[0]["client_properties"]["connection_name"] == "direct link"  # type: ignore[index]


def test_direct_connection_applies_the_users_permissions(broker: RunningBroker) -> None:
    assert broker.http("PUT", "/api/users/nobody", {"password": "x", "tags": ""})[0] in (201, 204)
    permissions = {"configure": "^$", "write": "^$", "read": "^$"}
    assert broker.http("PUT", "/api/permissions/%2F/nobody", permissions)[0] in (201, 204)
    gateway = gateway_of(broker)

    async def scenario() -> ChannelClosedError:
        connection = await Connection.connect(
            parse_uri("amqp://nobody:wrong@/"), name="direct", direct=gateway.direct_connector()
        )
        channel = await connection.channel()
        with pytest.raises(ChannelClosedError) as caught:
            await channel.declare_queue("links-forbidden")
        await connection.close()
        return caught.value

    error = on_broker(broker, scenario)
    assert error.reply_code == 403
    assert "ACCESS_REFUSED - access to queue 'links-forbidden'" in str(error)


def test_direct_connection_of_an_unknown_user_is_refused(broker: RunningBroker) -> None:
    gateway = gateway_of(broker)

    async def scenario() -> None:
        await Connection.connect(
            parse_uri("amqp://ghost@"), name="direct", direct=gateway.direct_connector()
        )

    with pytest.raises(AmqpConnectionError, match="ACCESS_REFUSED"):
        on_broker(broker, scenario)


def test_a_network_login_still_needs_the_password(broker: RunningBroker) -> None:
    """Direct sessions log in unchecked; a TCP connection as the same user does not."""
    with pytest.raises(AmqpConnectionError, match="ACCESS_REFUSED"):
        run(connect(uri(broker, user="nobody", password="not-x")))
