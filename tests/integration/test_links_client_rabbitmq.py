"""The links' client against a real RabbitMQ (Debian's rabbitmq-server, started here on
free loopback ports with a data directory of its own, and stopped by its pid): the same
transfer, errors and confirms as against streamq, so that a shovel or federation link
speaks to RabbitMQ as to streamq."""

from __future__ import annotations

import pytest

from streamq.links.amqp.client import AmqpConnectionError, ChannelClosedError, Connection
from streamq.links.amqp.uri import parse_uri
from tests.differential.peers import RabbitMQServer
from tests.integration.test_links_client import Collector, publish_confirmed, run, transfer


@pytest.fixture
def rabbitmq(rabbitmq_links: RabbitMQServer) -> RabbitMQServer:
    """The session's RabbitMQ (tests/integration/conftest.py)."""
    return rabbitmq_links


def uri(server: RabbitMQServer, password: str = "guest") -> str:
    return f"amqp://guest:{password}@127.0.0.1:{server.amqp_port}/%2f?heartbeat=5"


def test_publish_with_confirms_and_consume_with_acks(rabbitmq: RabbitMQServer) -> None:
    confirms, collector = run(transfer(uri(rabbitmq), "links-10k", 10_000))
    assert confirms.upto == 10_000 and confirms.nacked == 0
    assert len(collector.deliveries) == 10_000


def test_large_messages_span_several_body_frames(rabbitmq: RabbitMQServer) -> None:
    """Bodies over frame_max arrive in several body frames, assembled across reads."""

    async def scenario() -> list[bytes]:
        connection = await Connection.connect(parse_uri(uri(rabbitmq)), name="big")
        channel = await connection.channel()
        await channel.declare_queue("links-big", durable=False)
        bodies = [bytes([n]) * (300_000 + n) for n in range(5)]
        await publish_confirmed(channel, "links-big", bodies)
        collector = Collector(5)
        await channel.consume("links-big", collector, no_ack=True)
        await collector.done.wait()
        await channel.delete_queue("links-big")
        await connection.close()
        assert [d.body for d in collector.deliveries] == bodies
        return bodies

    assert len(run(scenario())) == 5


def test_channel_error(rabbitmq: RabbitMQServer) -> None:
    async def scenario() -> ChannelClosedError:
        connection = await Connection.connect(parse_uri(uri(rabbitmq)), name="errors")
        channel = await connection.channel()
        with pytest.raises(ChannelClosedError) as caught:
            await channel.declare_queue("links-missing", passive=True)
        await (await connection.channel()).declare_queue("ok", durable=False, exclusive=True)
        await connection.close()
        return caught.value

    error = run(scenario())
    assert error.reply_code == 404 and "NOT_FOUND - no queue 'links-missing'" in str(error)


def test_wrong_password(rabbitmq: RabbitMQServer) -> None:
    with pytest.raises(AmqpConnectionError, match="ACCESS_REFUSED - Login was refused"):
        run(Connection.connect(parse_uri(uri(rabbitmq, "wrong")), name="refused"))
