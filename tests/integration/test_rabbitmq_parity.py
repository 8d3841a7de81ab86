"""Places where streamq answered clients differently from RabbitMQ 3.10, each pinned by
what RabbitMQ does: confirms after a refused publish, the frame size a peer may send,
what channel_max limits, the default exchange, the order of queue.delete-ok and the
basic.cancel it causes, and topic routing of the empty routing key.

Driven by unmodified pika and py-amqp clients, or by raw frames over a socket where the
order of frames or a frame's exact size is what is tested."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10


def connect(broker: RunningBroker, **kwargs: object) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        "127.0.0.1",
        broker.amqp_port,
        blocked_connection_timeout=TIMEOUT_S,
        socket_timeout=TIMEOUT_S,
        **kwargs,
    )
    return pika.BlockingConnection(params)


@pytest.fixture
def connection(broker: RunningBroker) -> Iterator[pika.BlockingConnection]:
    conn = connect(broker)
    yield conn
    if conn.is_open:
        conn.close()


# -- 1. a refused publish does not nack the next one ---------------------------------------


def refuse_one(channel: BlockingChannel) -> None:
    """Publish to `full` (one message at most, reject-publish, declared and filled with
    `declare_full`): nacked."""
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "full", b"refused")


def declare_full(channel: BlockingChannel) -> None:
    channel.queue_declare("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.basic_publish("", "full", b"first")


def test_a_refused_publish_leaves_the_next_unroutable_or_stream_publish_acked(
    broker: RunningBroker, connection: pika.BlockingConnection
) -> None:
    """RabbitMQ nacks only the publish a full queue refused. The flag that told the
    gateway to nack once stayed set for the next publish that reached no classic queue
    (none at all, or only streams), on any channel of any connection of the vhost."""
    channel = connection.channel()
    channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    declare_full(channel)
    refuse_one(channel)
    channel.basic_publish("", "nowhere", b"unroutable")  # acked: no NackError
    refuse_one(channel)
    channel.basic_publish("", "events", b"to a stream only")
    refuse_one(channel)
    other = connect(broker)
    try:
        other_channel = other.channel()
        other_channel.confirm_delivery()
        other_channel.basic_publish("", "nowhere", b"from another connection")
        refuse_one(channel)
        other_channel.basic_publish("", "events", b"to a stream from another connection")
    finally:
        other.close()
    refuse_one(channel)
    # Returned, then acked (pika raises NackError for a nack, returned or not).
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", "nowhere", b"returned", mandatory=True)
    refuse_one(channel)
    # A delayed message is held, stored in no queue yet: acked as well.
    channel.exchange_declare("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    channel.basic_publish("later", "k", b"held", pika.BasicProperties(headers={"x-delay": 60000}))
    refuse_one(channel)  # and the queue still refuses
