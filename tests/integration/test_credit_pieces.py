"""Credit in pieces (issue 30, item 2) and a crashed consumer's deliveries given back in
one step (item 4).

Method: a raw socket holds a window of deliveries and sends its acks in one `sendall`,
so that the broker reads them together, ending with an unknown tag: the 406 channel
close that tag causes marks how far the broker had got, and what it delivered before
the close shows whether the credit of the first acks went out before the later ones
were settled. pika consumers check that draining with pieces still hands over every
message once, in order. For the crash, the broker's own `requeue_many` and `requeue`
are wrapped (forwarding to themselves) to count the steps while a raw consumer's socket
is dropped with its window unacked.
"""

from __future__ import annotations

import socket
import struct

import pytest
from pika.adapters.blocking_connection import BlockingChannel

from amqp_gateway.channels import piece_of
from amqp_gateway.codec import methods as m
from tests.integration.conftest import RunningBroker, drain_bodies
from tests.integration.test_ack_runs import (
    ack,
    close_raw,
    consume_raw,
    fill,
    frame,
    nack,
    reject,
)
from tests.integration.test_publish_runs import Reader, open_raw, received

TIMEOUT_S = 10
PREFETCH = 400  # a piece of acks and a half fit one TCP segment


def deliveries(methods: list[m.Method]) -> list[m.BasicDeliver]:
    return [x for x in methods if isinstance(x, m.BasicDeliver)]


def hold_window(broker: RunningBroker, queue: str) -> Reader:
    """A raw consumer of `queue` with prefetch PREFETCH, holding its first window
    unacked (tags 1..PREFETCH)."""
    raw = open_raw(broker.amqp_port)
    raw.sock.sendall(
        frame(m.BasicQos(prefetch_count=PREFETCH))
        + frame(m.BasicConsume(queue=queue, consumer_tag="raw"))
    )
    raw.until(lambda ms: len(deliveries(ms)) >= PREFETCH)
    assert len(deliveries(raw.methods)) == PREFETCH  # no more than the window
    raw.methods.clear()
    return raw


def test_the_credit_of_a_first_piece_of_acks_goes_out_before_the_rest_is_settled(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    # A piece and a half of acks and an unknown tag in one read (3 KiB: one segment).
    # Settled all at once (as before pieces), the 406 came before any delivery; in
    # pieces of a quarter of the prefetch, the first piece's credit is delivered, then
    # the rest is settled and the unknown tag closes the channel, after which nothing
    # is delivered on it.
    piece = piece_of(PREFETCH)
    acked = piece + piece // 2
    fill(channel, "q", 2 * PREFETCH)
    raw = hold_window(broker, "q")
    raw.sock.sendall(b"".join(ack(tag) for tag in range(1, acked + 1)) + ack(5000))
    methods = raw.until(received(m.ChannelClose))
    close = methods[-1]
    assert isinstance(close, m.ChannelClose) and close.reply_code == 406
    sent = deliveries(methods)
    assert [d.delivery_tag for d in sent] == list(range(PREFETCH + 1, PREFETCH + 1 + piece))
    close_raw(raw)
    assert not deliveries(raw.methods[raw.methods.index(close) :])
    # The acks applied; what the channel held went back before the rest.
    bodies = drain_bodies(channel, "q")
    assert bodies == [f"m{i}".encode() for i in range(acked + 1, 2 * PREFETCH + 1)]


@pytest.mark.parametrize("ack_each", [True, False], ids=["per-message", "multiple"])
def test_pika_drains_a_backlog_in_pieces_every_message_once_in_order(
    broker: RunningBroker, channel: BlockingChannel, ack_each: bool
) -> None:
    count = 5 * PREFETCH + 7
    fill(channel, "q", count)
    channel.basic_qos(prefetch_count=PREFETCH)
    seen: list[bytes] = []
    for method, _, body in channel.consume("q", inactivity_timeout=TIMEOUT_S):
        assert method is not None, f"timed out after {len(seen)} messages"
        assert not method.redelivered
        seen.append(body)
        if ack_each:
            channel.basic_ack(method.delivery_tag)
        elif len(seen) % 100 == 0 or len(seen) == count:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if len(seen) == count:
            break
    channel.cancel()
    assert seen == [f"m{i}".encode() for i in range(1, count + 1)]
    assert channel.queue_declare("q", passive=True).method.message_count == 0


def test_a_crashed_consumer_gives_its_window_back_in_one_step(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    fill(channel, "q", PREFETCH + 5)
    steps: list[tuple[str, int]] = []

    def spy() -> None:
        assert broker.broker is not None
        vhost = broker.broker.vhosts["/"]
        requeue_many, requeue = vhost.requeue_many, vhost.requeue

        def many(entries, *, deliver):  # type: ignore[no-untyped-def]
            entries = list(entries)
            steps.append(("requeue_many", len(entries)))
            requeue_many(entries, deliver=deliver)

        def one(queue, offset, consumer=None):  # type: ignore[no-untyped-def]
            steps.append(("requeue", 1))
            requeue(queue, offset, consumer)

        vhost.requeue_many, vhost.requeue = many, one  # type: ignore[method-assign]

    raw = hold_window(broker, "q")
    broker.ask(spy)
    # A crash: the socket goes without channel.close or connection.close (SO_LINGER 0
    # sends a reset, as a killed process's socket may).
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.sock.close()
    expected = [f"m{i}".encode() for i in range(1, PREFETCH + 6)]
    redelivered: list[bool] = []
    bodies: list[bytes] = []
    for method, _, body in channel.consume("q", inactivity_timeout=TIMEOUT_S):
        assert method is not None, f"timed out after {len(bodies)} messages"
        bodies.append(body)
        redelivered.append(method.redelivered)
        channel.basic_ack(method.delivery_tag)
        if len(bodies) == len(expected):
            break
    channel.cancel()
    assert bodies == expected  # back in their place, ahead of the ones never delivered
    assert redelivered == [True] * PREFETCH + [False] * 5
    assert steps == [("requeue_many", PREFETCH)]


def test_a_stretch_of_nacks_and_rejects_goes_back_in_place_and_a_repeated_tag_is_406(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    # Consecutive nacks and rejects with requeue are given back as one group
    # (basic_methods.requeue_stretch): the queue must hold what one method after another
    # leaves. A tag named twice in a stretch is unknown the second time, as then.
    fill(channel, "q", 8)
    raw = consume_raw(broker, "q", 8)
    raw.sock.sendall(
        ack(1) + nack(3) + reject(2) + nack(5) + ack(4) + reject(6) + nack(7) + nack(6)
    )
    [close] = raw.until(received(m.ChannelClose))
    assert isinstance(close, m.ChannelClose)
    assert close.reply_text == "PRECONDITION_FAILED - unknown delivery tag 6"
    assert not deliveries(raw.methods)  # the consumer was cancelled: nothing redelivered
    close_raw(raw)
    assert drain_bodies(channel, "q") == [b"m2", b"m3", b"m5", b"m6", b"m7", b"m8"]
