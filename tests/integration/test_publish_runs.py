"""Publish runs end to end: whole publishes of one read with one channel, exchange and
routing key are routed once and stored in one step (amqp_gateway/publishing.py `publish_run`,
streamq/broker/vhost_publish.py `Publisher.publish_run`); anything unusual in a run takes
the per-message path.

Method: a raw socket writes many publishes in one `sendall`, so that the broker reads
them together and splits them into runs, mixing cases that must leave the fast path;
pika then checks every queue's contents and order, as a client sees them.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from tests.integration.conftest import RunningBroker, drain_bodies

TIMEOUT_S = 10
FRAME_MAX = 131072


def open_raw(port: int) -> Reader:
    """A raw connection with channel 1 open."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    reader = Reader(sock)
    sock.sendall(b"AMQP\x00\x00\x09\x01")
    reader.until(received(m.ConnectionStart))
    start_ok = m.ConnectionStartOk(mechanism="PLAIN", response=b"\x00guest\x00guest")
    sock.sendall(codec.encode_method_frame(codec.ChannelId(0), start_ok))
    reader.until(received(m.ConnectionTune))
    tune_ok = m.ConnectionTuneOk(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0)
    sock.sendall(codec.encode_method_frame(codec.ChannelId(0), tune_ok))
    sock.sendall(codec.encode_method_frame(codec.ChannelId(0), m.ConnectionOpen("/")))
    reader.until(received(m.ConnectionOpenOk))
    sock.sendall(codec.encode_method_frame(codec.ChannelId(1), m.ChannelOpen()))
    reader.until(received(m.ChannelOpenOk))
    reader.methods.clear()
    return reader


class Reader:
    """The methods a raw connection receives, in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = b""
        self.methods: list[m.Method] = []

    def until(self, done: Callable[[list[m.Method]], bool]) -> list[m.Method]:
        """Read until `done(methods so far)`; fails after TIMEOUT_S."""
        deadline = time.monotonic() + TIMEOUT_S
        while not done(self.methods):
            assert time.monotonic() < deadline, f"timed out; received {self.methods}"
            chunk = self.sock.recv(65536)
            assert chunk, "the broker closed the socket"
            self.data += chunk
            frames, used = codec.split_frames(self.data, FRAME_MAX)
            self.data = self.data[used:]
            self.methods += [
                codec.decode_method(f.payload)
                for f in frames
                if f.frame_type == codec.FrameType.METHOD
            ]
        return self.methods


def received(kind: type[m.Method]) -> Callable[[list[m.Method]], bool]:
    return lambda methods: any(isinstance(x, kind) for x in methods)


def publishes(
    exchange: str,
    routing_key: str,
    bodies: list[bytes],
    properties: codec.BasicProperties | None = None,
    *,
    mandatory: bool = False,
) -> bytes:
    raw = codec.encode_properties(properties or codec.BasicProperties())
    out = bytearray()
    method = m.BasicPublish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)
    for body in bodies:
        codec.append_content_frames(out, codec.ChannelId(1), method, raw, body, FRAME_MAX)
    return bytes(out)


def numbered(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


def test_a_burst_of_runs_lands_in_order_in_every_queue(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    channel.exchange_declare("fan", "fanout")
    for name in ("a", "b", "f1", "f2"):
        channel.queue_declare(name)
    channel.queue_bind("f1", "fan")
    channel.queue_bind("f2", "fan")
    channel.queue_declare("capped", arguments={"x-max-length": 5})  # the per-message path
    cc = codec.BasicProperties(headers={"CC": ["b"]})  # CC: the per-message path
    raw = open_raw(broker.amqp_port)
    raw.sock.sendall(
        codec.encode_method_frame(codec.ChannelId(1), m.ConfirmSelect())
        + publishes("", "a", numbered("a", 300))  # more than one run's 256
        + publishes("fan", "", numbered("fan", 50))
        + publishes("", "a", [b"cc-to-b"], cc)
        + publishes("", "b", numbered("b", 20))
        + publishes("", "capped", numbered("capped", 8))
        + publishes("", "nowhere", [b"returned"], mandatory=True)
        + publishes("", "a", [b"last"])
    )
    total = 300 + 50 + 1 + 20 + 8 + 1 + 1

    def all_confirmed(methods: list[m.Method]) -> bool:
        return any(isinstance(x, m.BasicAck) and x.delivery_tag == total for x in methods)

    methods = raw.until(all_confirmed)
    raw.sock.close()
    assert isinstance(methods[0], m.ConfirmSelectOk)
    assert not any(isinstance(x, m.BasicNack) for x in methods)
    [returned] = [x for x in methods if isinstance(x, m.BasicReturn)]
    assert (returned.reply_code, returned.routing_key) == (312, "nowhere")
    assert drain_bodies(channel, "a") == [*numbered("a", 300), b"cc-to-b", b"last"]
    assert drain_bodies(channel, "b") == [b"cc-to-b", *numbered("b", 20)]
    assert drain_bodies(channel, "f1") == numbered("fan", 50)
    assert drain_bodies(channel, "f2") == numbered("fan", 50)
    assert drain_bodies(channel, "capped") == numbered("capped", 8)[3:]  # drop-head kept the last 5


def test_publishes_after_a_channel_error_in_the_same_read_are_discarded(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    """As RabbitMQ: once the broker closes the channel (404 here), the frames the client
    sent on it before it saw the close are discarded, even those already read."""
    channel.queue_declare("kept")
    raw = open_raw(broker.amqp_port)
    raw.sock.sendall(
        publishes("", "kept", [b"before"])
        + publishes("no-such-exchange", "k", [b"x", b"y"])
        + publishes("", "kept", numbered("after", 10))
    )
    [close] = [x for x in raw.until(received(m.ChannelClose)) if isinstance(x, m.ChannelClose)]
    assert close.reply_code == 404
    raw.sock.close()
    assert drain_bodies(channel, "kept") == [b"before"]


def test_methods_after_a_channel_error_in_the_same_read_are_discarded(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    """As RabbitMQ: a method read together with the publish that closed its channel is
    neither run nor answered, though the protocol parsed it before the close."""
    raw = open_raw(broker.amqp_port)
    declare = m.QueueDeclare(queue="never-declared")
    raw.sock.sendall(
        publishes("no-such-exchange", "k", [b"x"])
        + codec.encode_method_frame(codec.ChannelId(1), declare)
    )
    raw.until(received(m.ChannelClose))
    raw.sock.sendall(
        codec.encode_method_frame(codec.ChannelId(1), m.ChannelCloseOk())
        + codec.encode_method_frame(codec.ChannelId(1), m.ChannelOpen())
    )
    methods = raw.until(received(m.ChannelOpenOk))
    raw.sock.close()
    assert [type(x) for x in methods] == [m.ChannelClose, m.ChannelOpenOk]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="never-declared"):
        channel.queue_declare("never-declared", passive=True)


def test_publishes_before_the_clients_own_channel_close_are_kept(
    broker: RunningBroker, channel: BlockingChannel
) -> None:
    """The client's channel.close read together with its publishes ends the channel only
    after them: the protocol has seen the close when the server routes the runs."""
    channel.queue_declare("kept")
    raw = open_raw(broker.amqp_port)
    raw.sock.sendall(
        publishes("", "kept", numbered("m", 300))
        + codec.encode_method_frame(codec.ChannelId(1), m.ChannelClose(200, "bye", 0, 0))
    )
    raw.until(received(m.ChannelCloseOk))
    raw.sock.close()
    assert drain_bodies(channel, "kept") == numbered("m", 300)
