"""Where the basic and tx classes once differed from RabbitMQ 3.10, driven with pika: the
round robin of consumers, a global prefetch freed by an ack on another queue, the checks
of user-id and expiration on publish, basic.get-ok's message_count past expired
messages, and transactions (tags checked at the ack, routes taken at the publish).
tests/differential compares the same against a real RabbitMQ."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def pump(conn: pika.BlockingConnection, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done() and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=0.2)  # and nothing more arrives


def count(channel: BlockingChannel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def test_two_consumers_take_turns_when_messages_come_one_at_a_time(
    broker: RunningBroker,
) -> None:
    """Each message is drained before the next comes: the consumer after the one that
    got the last message gets the next, not the same one again and again."""
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("turns")
    got: list[str] = []
    for tag in ("one", "two"):
        channel.basic_consume(
            "turns", lambda ch, m, p, b: got.append(m.consumer_tag), consumer_tag=tag
        )
    for n in range(5):
        channel.basic_publish("", "turns", str(n).encode())
        pump(conn, lambda n=n: len(got) == n + 1)  # type: ignore[misc]
    assert got == ["one", "two", "one", "two", "one"]
    conn.close()


def test_an_ack_frees_a_global_prefetch_for_a_consumer_of_another_queue(
    broker: RunningBroker,
) -> None:
    conn = connect(broker)
    channel = conn.channel()
    for queue in ("ga", "gb"):
        channel.queue_declare(queue)
    channel.basic_qos(prefetch_count=1, global_qos=True)
    got: list[tuple[int, bytes]] = []
    for queue in ("ga", "gb"):
        channel.basic_consume(queue, lambda ch, m, p, b: got.append((m.delivery_tag, b)))
    channel.basic_publish("", "ga", b"a1")
    pump(conn, lambda: len(got) == 1)
    channel.basic_publish("", "gb", b"b1")
    pump(conn, lambda: False)
    assert got == [(1, b"a1")]  # the channel's one unacked delivery is out
    channel.basic_ack(1)
    pump(conn, lambda: len(got) == 2)
    assert got == [(1, b"a1"), (2, b"b1")]
    conn.close()


@pytest.mark.parametrize(
    ("properties", "text"),
    [
        (
            pika.BasicProperties(user_id="bob"),
            "PRECONDITION_FAILED - user_id property set to 'bob' but authenticated user "
            "was 'guest'",
        ),
        (
            pika.BasicProperties(expiration="1.5"),
            "PRECONDITION_FAILED - invalid expiration '1.5': {leftover_string,\".5\"}",
        ),
        (
            pika.BasicProperties(expiration="-1"),
            "PRECONDITION_FAILED - invalid expiration '-1': {value_negative,-1}",
        ),
        (
            pika.BasicProperties(expiration="soon"),
            "PRECONDITION_FAILED - invalid expiration 'soon': no_integer",
        ),
    ],
)
def test_a_publish_with_a_wrong_user_id_or_expiration_is_406(
    broker: RunningBroker, properties: pika.BasicProperties, text: str
) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("checked")
    channel.basic_publish("", "checked", b"fine", pika.BasicProperties(user_id="guest"))
    channel.basic_publish("", "checked", b"refused", properties)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare("checked", passive=True)
    assert (closed.value.reply_code, closed.value.reply_text) == (406, text)
    assert count(conn.channel(), "checked") == 1  # the one before it was stored
    conn.close()


def test_a_user_tagged_impersonator_may_publish_any_user_id(broker: RunningBroker) -> None:
    assert broker.http("PUT", "/api/users/imp", {"password": "imp", "tags": "impersonator"})[0] in (
        201,
        204,
    )
    permissions = {"configure": ".*", "write": ".*", "read": ".*"}
    assert broker.http("PUT", "/api/permissions/%2F/imp", permissions)[0] in (201, 204)
    conn = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", broker.amqp_port, credentials=pika.PlainCredentials("imp", "imp")
        )
    )
    channel = conn.channel()
    channel.queue_declare("imp")
    channel.basic_publish("", "imp", b"x", pika.BasicProperties(user_id="someone"))
    method, properties, _ = channel.basic_get("imp", auto_ack=True)
    assert method is not None and properties.user_id == "someone"
    conn.close()


def test_basic_get_counts_no_expired_message_left_at_the_head(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("heads")
    channel.basic_publish("", "heads", b"lives", pika.BasicProperties(expiration="60000"))
    channel.basic_publish("", "heads", b"dies", pika.BasicProperties(expiration="0"))
    channel.basic_publish("", "heads", b"lives too")
    method, _, body = channel.basic_get("heads", auto_ack=True)
    assert (body, method.message_count) == (b"lives", 1)
    method, _, body = channel.basic_get("heads", auto_ack=True)
    assert (body, method.message_count) == (b"lives too", 0)
    conn.close()


def test_a_bad_consumer_priority_is_406_in_rabbitmqs_words(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("prio")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.basic_consume("prio", lambda *a: None, arguments={"x-priority": "high"})
    assert closed.value.reply_text == (
        "PRECONDITION_FAILED - invalid arg 'x-priority' for queue 'prio' in vhost '/': "
        '"expected integer, got longstr"'
    )
    conn.close()


def test_an_ack_twice_in_a_transaction_is_406_at_once(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("txq")
    channel.basic_publish("", "txq", b"1")
    method, _, _ = channel.basic_get("txq")
    channel.tx_select()
    channel.basic_ack(method.delivery_tag)
    channel.basic_ack(method.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.tx_commit()
    assert (closed.value.reply_code, closed.value.reply_text) == (
        406,
        "PRECONDITION_FAILED - unknown delivery tag 1",
    )
    assert count(conn.channel(), "txq") == 1  # the channel's end requeued it
    conn.close()


@pytest.mark.parametrize("end", ["rollback", "close"])
def test_what_an_open_transaction_acked_is_unacked_again_after(
    broker: RunningBroker, end: str
) -> None:
    """A rollback gives the acked deliveries back to the channel (they can be acked
    again); a channel closed mid-transaction requeues them with the other unacked."""
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("txq")
    for body in (b"1", b"2"):
        channel.basic_publish("", "txq", body)
    tags = [channel.basic_get("txq")[0].delivery_tag for _ in range(2)]
    channel.tx_select()
    channel.basic_ack(tags[1], multiple=True)
    if end == "rollback":
        channel.tx_rollback()
        channel.basic_ack(tags[0])
        channel.tx_commit()
        channel.close()
        assert count(conn.channel(), "txq") == 1  # message 2: unacked, then requeued
    else:
        channel.close()
        assert count(conn.channel(), "txq") == 2
    conn.close()


def test_a_transaction_routes_its_publishes_when_they_come(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    for queue in ("early", "late"):
        channel.queue_declare(queue)
    channel.queue_bind("early", "amq.direct", "k")
    channel.tx_select()
    channel.basic_publish("amq.direct", "k", b"routed at publish")
    channel.queue_bind("late", "amq.direct", "k")
    channel.queue_unbind("early", "amq.direct", "k")
    assert count(channel, "early") == 0  # not before the commit
    channel.tx_commit()
    assert (count(channel, "early"), count(channel, "late")) == (1, 0)
    conn.close()


def test_a_transaction_refuses_a_publish_to_a_missing_exchange_at_once(
    broker: RunningBroker,
) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.tx_select()
    channel.basic_publish("missing", "k", b"x")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare("anything")
    assert closed.value.reply_code == 404
    conn.close()
