"""Direct reply-to (`amq.rabbitmq.reply-to`) with pika and aio-pika: an RPC round trip,
the rewritten reply_to, RabbitMQ's errors (ack mode, a second reply consumer, a request
without one), passive declares, mandatory replies and replies to a consumer that left."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10
REPLY_TO = "amq.rabbitmq.reply-to"


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def wait_until(conn: pika.BlockingConnection, done: object) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        conn.process_data_events(time_limit=0.02)


def request(
    broker: RunningBroker,
) -> tuple[pika.BlockingConnection, BlockingChannel, list[tuple], str]:
    """A client consuming its replies that sent one request to queue `rpc`; returns the
    connection, its channel, the replies it gets, and the reply_to the server sees."""
    client = connect(broker)
    channel = client.channel()
    channel.queue_declare("rpc")
    replies: list[tuple] = []
    channel.basic_consume(
        REPLY_TO, lambda ch, m, p, b: replies.append((m, p, b)), auto_ack=True, consumer_tag="me"
    )
    channel.basic_publish("", "rpc", b"ping", pika.BasicProperties(reply_to=REPLY_TO))
    _, properties, body = channel.basic_get("rpc", auto_ack=True)
    assert body == b"ping"
    return client, channel, replies, properties.reply_to


def test_rpc_round_trip(broker: RunningBroker) -> None:
    client, _, replies, reply_to = request(broker)
    assert reply_to.startswith(REPLY_TO + ".") and len(reply_to) > len(REPLY_TO) + 16
    server = connect(broker)
    server.channel().basic_publish(
        "", reply_to, b"pong", pika.BasicProperties(correlation_id="c1", headers={"BCC": ["x"]})
    )
    wait_until(client, lambda: replies)
    method, properties, body = replies[0]
    assert body == b"pong" and properties.correlation_id == "c1"
    assert method.consumer_tag == "me" and method.routing_key == reply_to
    assert method.exchange == "" and not properties.headers  # BCC stripped
    server.close()
    client.close()


def test_reply_consumer_must_not_ack(broker: RunningBroker) -> None:
    channel = connect(broker).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=False)
    assert info.value.reply_code == 406
    assert info.value.reply_text == "PRECONDITION_FAILED - reply consumer cannot acknowledge"


def test_one_reply_consumer_per_channel(broker: RunningBroker) -> None:
    channel = connect(broker).channel()
    channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    assert info.value.reply_code == 406
    assert info.value.reply_text == "PRECONDITION_FAILED - reply consumer already set"


def test_request_without_reply_consumer_is_refused(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("rpc")
    channel.basic_publish("", "rpc", b"ping", pika.BasicProperties(reply_to=REPLY_TO))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_get("rpc")
    assert info.value.reply_code == 406
    assert info.value.reply_text == "PRECONDITION_FAILED - fast reply consumer does not exist"
    assert conn.channel().queue_declare("rpc", passive=True).method.message_count == 0
    conn.close()


def test_passive_declares(broker: RunningBroker) -> None:
    client, _, _, reply_to = request(broker)
    channel = client.channel()
    ok = channel.queue_declare(REPLY_TO, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (REPLY_TO, 0, 1)
    assert channel.queue_declare(reply_to, passive=True).method.consumer_count == 1
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.queue_declare(REPLY_TO + ".nobody", passive=True)
    assert info.value.reply_code == 404
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        client.channel().queue_declare(REPLY_TO)  # not passive: a reserved name
    assert refused.value.reply_code == 403
    client.close()


@pytest.mark.parametrize("leave", ["cancel", "close"])
def test_replies_to_a_gone_consumer_are_dropped_and_mandatory_ones_returned(
    broker: RunningBroker, leave: str
) -> None:
    client, client_channel, replies, reply_to = request(broker)
    server = connect(broker)
    channel = server.channel()
    channel.confirm_delivery()
    # RabbitMQ 3.x: the reply name is no queue, so a mandatory reply comes back even
    # when it was delivered.
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", reply_to, b"delivered", mandatory=True)
    wait_until(client, lambda: replies)
    if leave == "cancel":
        client_channel.basic_cancel("me")
    else:
        client.close()
    channel.basic_publish("", reply_to, b"dropped")  # the consumer is gone: no error
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", reply_to, b"returned", mandatory=True)
    if leave == "cancel":
        client.process_data_events(time_limit=0.1)
        client.close()
    assert [body for _, _, body in replies] == [b"delivered"]
    server.close()


async def test_rpc_with_aio_pika(broker: RunningBroker) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    client = await aio_pika.connect(url, timeout=TIMEOUT_S)
    server = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with client, server:
        server_channel = await server.channel()
        requests = await server_channel.declare_queue("aio-rpc", auto_delete=True)

        async def answer(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            assert message.reply_to is not None
            await server_channel.default_exchange.publish(
                aio_pika.Message(message.body.upper(), correlation_id=message.correlation_id),
                routing_key=message.reply_to,
            )

        await requests.consume(answer, no_ack=True)
        channel = await client.channel()
        replies: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        reply_queue = await channel.get_queue(REPLY_TO, ensure=True)
        await reply_queue.consume(replies.put, no_ack=True)
        for n in range(3):
            await channel.default_exchange.publish(
                aio_pika.Message(f"call {n}".encode(), reply_to=REPLY_TO, correlation_id=str(n)),
                routing_key="aio-rpc",
            )
        for n in range(3):
            reply = await asyncio.wait_for(replies.get(), TIMEOUT_S)
            assert reply.body == f"CALL {n}".encode() and reply.correlation_id == str(n)
