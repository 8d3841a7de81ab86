"""Ack runs end to end: the acks, nacks and rejects of one read are settled as a run
(amqp_gateway/basic_methods.py `settle_ack_run`), with the outcome of one method after another.

Method: pika acks every message with its own basic.ack, as Celery and kombu do; a raw
socket writes a whole sequence of acks, nacks and rejects in one `sendall`, so that the
broker reads them together, and the queue's contents (by basic.get) and the broker's
answers show the order they were applied in.
"""

from __future__ import annotations

from pika.adapters.blocking_connection import BlockingChannel

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from tests.integration.conftest import RunningBroker, drain_bodies
from tests.integration.test_publish_runs import Reader, open_raw, received

TIMEOUT_S = 10


def frame(method: m.Method) -> bytes:
    return codec.encode_method_frame(codec.ChannelId(1), method)


def ack(tag: int, multiple: bool = False) -> bytes:
    return frame(m.BasicAck(codec.DeliveryTag(tag), multiple))


def nack(tag: int, multiple: bool = False, requeue: bool = True) -> bytes:
    return frame(m.BasicNack(codec.DeliveryTag(tag), multiple, requeue))


def reject(tag: int, requeue: bool = True) -> bytes:
    return frame(m.BasicReject(codec.DeliveryTag(tag), requeue))


def fill(channel: BlockingChannel, queue: str, count: int) -> None:
    channel.queue_declare(queue)
    for i in range(1, count + 1):
        channel.basic_publish("", queue, f"m{i}".encode())


def consume_raw(broker: RunningBroker, queue: str, count: int) -> Reader:
    """A raw consumer of `queue` holding its first `count` deliveries unacked (tag i is
    message m<i>), cancelled so that requeued messages stay in the queue."""
    raw = open_raw(broker.amqp_port)
    raw.sock.sendall(
        frame(m.BasicQos(prefetch_count=count))
        + frame(m.BasicConsume(queue=queue, consumer_tag="raw"))
    )
    raw.until(lambda ms: sum(isinstance(x, m.BasicDeliver) for x in ms) == count)
    raw.sock.sendall(frame(m.BasicCancel(consumer_tag="raw")))
    raw.until(received(m.BasicCancelOk))
    raw.methods.clear()
    return raw


def close_raw(raw: Reader) -> None:
    """Answer a channel.close if one came, then close the connection and wait for its
    close-ok: the broker has requeued what the channel left unacked by then."""
    closed = any(isinstance(x, m.ChannelClose) for x in raw.methods)
    raw.sock.sendall(
        (frame(m.ChannelCloseOk()) if closed else b"")
        + codec.encode_method_frame(codec.ChannelId(0), m.ConnectionClose(200, "bye", 0, 0))
    )
    raw.until(received(m.ConnectionCloseOk))
    raw.sock.close()


def test_pika_acking_each_message_consumes_the_queue(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    count = 3000
    fill(channel, "q", count)
    channel.basic_qos(prefetch_count=1000)
    seen: list[bytes] = []
    for method, _, body in channel.consume("q", inactivity_timeout=TIMEOUT_S):
        assert method is not None, f"timed out after {len(seen)} messages"
        seen.append(body)
        channel.basic_ack(method.delivery_tag)  # one basic.ack frame per message
        if len(seen) == count:
            break
    channel.cancel()
    assert seen == [f"m{i}".encode() for i in range(1, count + 1)]
    assert channel.queue_declare("q", passive=True).method.message_count == 0


def test_an_unknown_tag_mid_run_is_406_with_the_acks_before_it_applied(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    fill(channel, "q", 6)
    raw = consume_raw(broker, "q", 6)
    raw.sock.sendall(ack(1) + ack(2) + ack(99) + ack(3) + ack(4))
    [close] = raw.until(received(m.ChannelClose))
    assert isinstance(close, m.ChannelClose)
    assert (close.reply_code, close.reply_text) == (
        406,
        "PRECONDITION_FAILED - unknown delivery tag 99",
    )
    assert (close.class_id, close.method_id) == (60, 80)
    close_raw(raw)
    # 3 and 4 were not acked: back in the queue, in their order, with 5 and 6.
    assert drain_bodies(channel, "q") == [b"m3", b"m4", b"m5", b"m6"]


def test_a_tag_acked_twice_in_one_run_is_406_the_second_time(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    fill(channel, "q", 4)
    raw = consume_raw(broker, "q", 4)
    raw.sock.sendall(ack(1) + ack(2) + ack(1) + ack(3))
    [close] = raw.until(received(m.ChannelClose))
    assert isinstance(close, m.ChannelClose)
    assert close.reply_text == "PRECONDITION_FAILED - unknown delivery tag 1"
    close_raw(raw)
    assert drain_bodies(channel, "q") == [b"m3", b"m4"]


def test_nacks_and_rejects_take_effect_in_their_place_among_the_acks(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    """A nack with `multiple` after two acks requeues only what they left: applied out of
    order it would requeue m1 and m2 too. The reject drops m6, the last ack takes m5."""
    fill(channel, "q", 7)
    raw = consume_raw(broker, "q", 7)
    raw.sock.sendall(
        ack(1)
        + ack(2)
        + nack(4, multiple=True)  # requeues m3, m4
        + ack(5)
        + reject(6, requeue=False)
        + reject(7)  # requeued
        + frame(m.BasicQos(prefetch_count=1))  # answered after all of the above
    )
    raw.until(received(m.BasicQosOk))
    assert not any(isinstance(x, m.ChannelClose) for x in raw.methods)
    close_raw(raw)
    assert drain_bodies(channel, "q") == [b"m3", b"m4", b"m7"]


def test_an_ack_of_a_nacked_tag_later_in_the_run_is_406(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    fill(channel, "q", 3)
    raw = consume_raw(broker, "q", 3)
    raw.sock.sendall(ack(1) + nack(2, requeue=True) + ack(2) + ack(3))
    [close] = raw.until(received(m.ChannelClose))
    assert isinstance(close, m.ChannelClose)
    assert close.reply_text == "PRECONDITION_FAILED - unknown delivery tag 2"
    close_raw(raw)
    assert drain_bodies(channel, "q") == [b"m2", b"m3"]


def test_acks_in_a_transaction_wait_for_the_commit(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    fill(channel, "q", 4)
    raw = consume_raw(broker, "q", 4)
    raw.sock.sendall(frame(m.TxSelect()) + ack(1) + ack(2) + frame(m.TxRollback()))
    raw.until(received(m.TxRollbackOk))
    raw.sock.sendall(ack(3) + ack(4) + frame(m.TxCommit()))
    raw.until(received(m.TxCommitOk))
    close_raw(raw)
    assert drain_bodies(channel, "q") == [b"m1", b"m2"]
