"""Headers reach every exchange on a message's route, as in RabbitMQ: a headers exchange
bound (exchange-to-exchange) to a direct, fanout or topic exchange, reached as an
alternate exchange, or as a dead-letter exchange, matches on the message's headers. The
plain exchange in front takes the fast path (the headers are decoded only once the route
reaches the headers exchange); the same scenarios ran against RabbitMQ 3.x gave the same
deliveries."""

from __future__ import annotations

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker, poll_messages

TIMEOUT_S = 10


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def get_body(channel: BlockingChannel, queue: str) -> bytes:
    """The next message of `queue`, polling until it comes (or failing after TIMEOUT_S)."""
    [(_, _, body)] = poll_messages(channel, queue, 1, timeout_s=TIMEOUT_S)
    return body


def headers_exchange(channel: BlockingChannel) -> None:
    """`hdr`, a headers exchange with the queues `red` (color=red) and `any-x`
    (x-match any of size=big, color=blue)."""
    channel.exchange_declare("hdr", "headers")
    channel.queue_declare("red")
    channel.queue_declare("any-x")
    channel.queue_bind("red", "hdr", arguments={"x-match": "all", "color": "red"})
    channel.queue_bind("any-x", "hdr", arguments={"x-match": "any", "size": "big", "color": "blue"})


def colored(color: str) -> pika.BasicProperties:
    return pika.BasicProperties(headers={"color": color})


@pytest.mark.parametrize("kind", ["direct", "fanout", "topic"])
def test_headers_exchange_behind_a_plain_exchange(broker: RunningBroker, kind: str) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    headers_exchange(channel)
    channel.exchange_declare("front", kind)
    channel.exchange_bind("hdr", "front", "k.x" if kind != "topic" else "k.*")
    channel.basic_publish("front", "k.x", b"red", colored("red"), mandatory=True)
    channel.basic_publish("front", "k.x", b"blue", colored("blue"), mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("front", "k.x", b"green", colored("green"), mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("front", "k.x", b"none", mandatory=True)
    assert get_body(channel, "red") == b"red"
    assert get_body(channel, "any-x") == b"blue"
    for queue in ("red", "any-x"):
        assert channel.basic_get(queue)[0] is None
    conn.close()


def test_headers_two_hops_away_and_a_plain_queue_beside(broker: RunningBroker) -> None:
    """front (direct) -> mid (fanout) -> hdr (headers), and a queue bound to front: the
    queue gets every message, hdr's queues only the matching ones."""
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    headers_exchange(channel)
    channel.exchange_declare("front", "direct")
    channel.exchange_declare("mid", "fanout")
    channel.exchange_bind("mid", "front", "k")
    channel.exchange_bind("hdr", "mid")
    channel.queue_declare("all")
    channel.queue_bind("all", "front", "k")
    channel.basic_publish("front", "k", b"red", colored("red"))
    channel.basic_publish("front", "k", b"big", pika.BasicProperties(headers={"size": "big"}))
    assert [get_body(channel, "all") for _ in range(2)] == [b"red", b"big"]
    assert get_body(channel, "red") == b"red"
    assert get_body(channel, "any-x") == b"big"
    conn.close()


def test_headers_exchange_as_alternate_exchange(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    headers_exchange(channel)
    channel.exchange_declare("front", "direct", arguments={"alternate-exchange": "hdr"})
    channel.basic_publish("front", "unbound", b"red", colored("red"), mandatory=True)
    assert get_body(channel, "red") == b"red"
    conn.close()


def test_headers_exchange_as_dead_letter_exchange(broker: RunningBroker) -> None:
    """A rejected message goes to a headers dead-letter exchange with its own headers."""
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    headers_exchange(channel)
    channel.queue_declare("work", arguments={"x-dead-letter-exchange": "hdr"})
    channel.basic_publish("", "work", b"red", colored("red"))
    method, _, _ = channel.basic_get("work")
    assert method is not None
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert get_body(channel, "red") == b"red"
    conn.close()


def test_cc_behind_a_plain_exchange_reaches_headers_exchange(broker: RunningBroker) -> None:
    """The slow path (CC) through a plain exchange to a headers one: same result."""
    conn = connect(broker)
    channel = conn.channel()
    channel.confirm_delivery()
    headers_exchange(channel)
    channel.exchange_declare("front", "direct")
    channel.exchange_bind("hdr", "front", "cc-key")
    props = pika.BasicProperties(headers={"color": "red", "CC": ["cc-key"]})
    channel.basic_publish("front", "other", b"red", props, mandatory=True)
    assert get_body(channel, "red") == b"red"
    conn.close()
