"""What the RabbitMQ compatibility tests of the AMQP gateway share
(tests/integration/test_amqp_compat.py and test_amqp_rules.py): a pika connection with
bounded waits, a queue's message count, waiting on a connection's events, and the channel
or connection error an action provokes."""

from __future__ import annotations

from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10
SETTLE_S = 0.3  # how long to wait for deliveries that must not come
VHOST_TEXT = "in vhost '/'"


def connect(broker: RunningBroker, **kwargs: object) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        "127.0.0.1",
        broker.amqp_port,
        blocked_connection_timeout=TIMEOUT_S,
        socket_timeout=TIMEOUT_S,
        **kwargs,
    )
    return pika.BlockingConnection(params)


def message_count(channel: BlockingChannel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def wait_until(
    connection: pika.BlockingConnection,
    done: Callable[[], bool],
    timeout_s: float = TIMEOUT_S,
    what: str = "deliveries",
) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if done():
            return
        connection.process_data_events(time_limit=0.05)
    raise AssertionError(f"timed out waiting for {what}")


def channel_error(
    connection: pika.BlockingConnection, action: Callable[[BlockingChannel], object]
) -> pika.exceptions.ChannelClosedByBroker:
    """Run `action` on a new channel, then a round trip; return the channel close."""
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        action(channel)
        channel.basic_qos(prefetch_count=0)  # a round trip, so an asynchronous close arrives
    assert connection.is_open
    return closed.value


def connection_error(
    connection: pika.BlockingConnection, action: Callable[[BlockingChannel], object]
) -> pika.exceptions.ConnectionClosedByBroker:
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        action(channel)
        channel.basic_qos(prefetch_count=0)
    assert not connection.is_open
    return closed.value
