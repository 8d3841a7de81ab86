"""Unmodified pika clients against a real broker on loopback: routing, consuming, acks,
prefetch, requeue order, confirms, returns, transactions and the error codes."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10


def connect(broker: RunningBroker, **kwargs: object) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        "127.0.0.1", broker.amqp_port, blocked_connection_timeout=TIMEOUT_S, **kwargs
    )
    return pika.BlockingConnection(params)


def consume_n(channel: BlockingChannel, queue: str, count: int, ack: bool = True) -> list[tuple]:
    got = []
    for method, properties, body in channel.consume(queue, inactivity_timeout=TIMEOUT_S):
        assert method is not None, f"timed out after {len(got)} of {count} messages"
        got.append((method, properties, body))
        if ack:
            channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    channel.cancel()
    return got


def test_publish_and_consume_with_a_body_larger_than_frame_max(channel: BlockingChannel) -> None:
    channel.queue_declare("q")
    bodies = [b"small", b"x" * 300_000, b""]
    for body in bodies:
        channel.basic_publish("", "q", body, pika.BasicProperties(content_type="text/plain"))
    got = consume_n(channel, "q", 3)
    assert [body for _, _, body in got] == bodies
    assert all(props.content_type == "text/plain" for _, props, _ in got)
    assert channel.queue_declare("q", passive=True).method.message_count == 0


def test_prefetch_is_honoured_exactly(connection: pika.BlockingConnection) -> None:
    publisher = connection.channel()
    publisher.queue_declare("work")
    for i in range(10):
        publisher.basic_publish("", "work", str(i).encode())
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=3)
    delivered: list[int] = []
    consumer.basic_consume("work", lambda ch, m, p, b: delivered.append(m.delivery_tag))
    connection.process_data_events(time_limit=0.5)
    assert delivered == [1, 2, 3]
    consumer.basic_ack(2)
    connection.process_data_events(time_limit=0.5)
    assert delivered == [1, 2, 3, 4]


def test_unacked_messages_return_in_order_with_redelivered_on_channel_close(
    connection: pika.BlockingConnection,
) -> None:
    first = connection.channel()
    first.queue_declare("orders")
    for i in range(5):
        first.basic_publish("", "orders", str(i).encode())
    first.basic_qos(prefetch_count=3)  # so that only three are ever delivered
    got = consume_n(first, "orders", 3, ack=False)
    assert [b for _, _, b in got] == [b"0", b"1", b"2"]
    first.close()
    second = connection.channel()
    again = consume_n(second, "orders", 5)
    assert [b for _, _, b in again] == [b"0", b"1", b"2", b"3", b"4"]
    assert [m.redelivered for m, _, _ in again] == [True, True, True, False, False]


def test_nack_and_reject(channel: BlockingChannel) -> None:
    channel.queue_declare("nq")
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", "nq", body)
    a = channel.basic_get("nq")[0]
    b = channel.basic_get("nq")[0]
    channel.basic_nack(a.delivery_tag, requeue=False)  # dropped
    channel.basic_reject(b.delivery_tag, requeue=True)  # back in front of c
    method, _, body = channel.basic_get("nq", auto_ack=True)
    assert (body, method.redelivered) == (b"b", True)
    assert channel.basic_get("nq", auto_ack=True)[2] == b"c"
    assert channel.basic_get("nq") == (None, None, None)


def test_confirms_and_mandatory_returns(channel: BlockingChannel) -> None:
    channel.confirm_delivery()
    channel.queue_declare("cq")
    for i in range(50):
        channel.basic_publish("", "cq", str(i).encode())  # raises unless acked
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", "no-such-queue", b"lost", mandatory=True)
    assert channel.queue_declare("cq", passive=True).method.message_count == 50


def test_exchange_types_and_exchange_to_exchange_bindings(channel: BlockingChannel) -> None:
    channel.exchange_declare("logs", "topic")
    channel.exchange_declare("fan", "fanout")
    channel.exchange_declare("hdr", "headers")
    for q in ("all", "errors", "kern", "h-any", "fan-q"):
        channel.queue_declare(q)
    channel.queue_bind("all", "logs", "#")
    channel.queue_bind("errors", "logs", "*.error")
    channel.queue_bind("kern", "logs", "kern.#")
    channel.exchange_bind("fan", "logs", "kern.*")  # destination fan, source logs
    channel.queue_bind("fan-q", "fan", "")
    channel.queue_bind("h-any", "hdr", "", {"x-match": "any", "a": 1, "b": 2})
    for key in ("kern.error", "app.error", "kern", "app.info.x"):
        channel.basic_publish("logs", key, key.encode())
    channel.basic_publish("hdr", "", b"h1", pika.BasicProperties(headers={"b": 2}))
    channel.basic_publish("hdr", "", b"h2", pika.BasicProperties(headers={"c": 3}))

    def count(q: str) -> int:
        return channel.queue_declare(q, passive=True).method.message_count

    assert [count(q) for q in ("all", "errors", "kern", "fan-q", "h-any")] == [4, 2, 2, 1, 1]


@pytest.mark.parametrize(
    ("action", "code", "text"),
    [
        (lambda ch: ch.queue_declare("missing", passive=True), 404, "no queue 'missing'"),
        (lambda ch: ch.exchange_declare("missing", passive=True), 404, "no exchange 'missing'"),
        (lambda ch: ch.queue_declare("amq.mine"), 403, "reserved prefix 'amq.*'"),
        (lambda ch: ch.queue_bind("dq", "", "x"), 403, "default exchange"),
        (lambda ch: ch.queue_declare("dq", durable=False), 406, "inequivalent arg 'durable'"),
        (lambda ch: ch.basic_ack(99) or ch.basic_get("dq"), 406, "unknown delivery tag 99"),
        (lambda ch: ch.basic_publish("nowhere", "k", b""), 404, "no exchange 'nowhere'"),
    ],
)
def test_channel_errors_carry_rabbitmq_codes(
    connection: pika.BlockingConnection, action: object, code: int, text: str
) -> None:
    setup = connection.channel()
    setup.queue_declare("dq", durable=True)
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        action(channel)  # type: ignore[operator]
        channel.basic_get("dq")  # a round trip, so an asynchronous close arrives
    assert closed.value.reply_code == code
    assert text in closed.value.reply_text
    assert connection.is_open  # a channel error leaves the connection open


def test_exclusive_queues_are_locked_to_their_connection(broker: RunningBroker) -> None:
    owner = connect(broker)
    owner.channel().queue_declare("mine", exclusive=True)
    other = connect(broker)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        other.channel().queue_declare("mine", passive=True)
    assert closed.value.reply_code == 405
    owner.close()
    check = other.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        check.queue_declare("mine", passive=True)
    assert gone.value.reply_code == 404  # deleted with its connection
    other.close()


def test_transactions_commit_and_rollback(channel: BlockingChannel) -> None:
    channel.queue_declare("txq")
    channel.tx_select()
    channel.basic_publish("", "txq", b"rolled back")
    channel.tx_rollback()
    channel.basic_publish("", "txq", b"committed")
    assert channel.queue_declare("txq", passive=True).method.message_count == 0
    channel.tx_commit()
    assert channel.queue_declare("txq", passive=True).method.message_count == 1
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.confirm_delivery()
    assert closed.value.reply_code == 406


def test_purge_and_delete(channel: BlockingChannel) -> None:
    channel.queue_declare("pq")
    for _ in range(4):
        channel.basic_publish("", "pq", b"m")
    assert channel.queue_purge("pq").method.message_count == 4
    channel.basic_publish("", "pq", b"m")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_delete("pq", if_empty=True)
    assert closed.value.reply_code == 406


def test_wrong_password_is_refused(broker: RunningBroker) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        connect(broker, credentials=pika.PlainCredentials("guest", "wrong"))
    assert "ACCESS_REFUSED" in str(refused.value)


def test_consumers_are_cancelled_when_their_queue_is_deleted(
    connection: pika.BlockingConnection,
) -> None:
    consumer = connection.channel()
    consumer.queue_declare("doomed")
    cancelled: list[object] = []
    consumer.basic_consume("doomed", lambda *args: None)
    consumer.add_on_cancel_callback(cancelled.append)
    connection.channel().queue_delete("doomed")
    connection.process_data_events(time_limit=0.5)
    assert len(cancelled) == 1
