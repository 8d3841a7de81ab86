"""The channel class: open and close both ways, channel.flow, channel_max, methods on
channels that are not open, and what a channel the server is closing does with the
frames that were already on their way."""

from __future__ import annotations

from collections.abc import Callable

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from tests.differential.harness import Session, scenario
from tests.differential.scenarios.connection import method_frame, until_close


def publish_frames(channel: int, exchange: str, routing_key: str, body: bytes = b"x") -> bytes:
    """basic.publish with its header and body frames, as bytes to send with others."""
    out = bytearray()
    method = m.BasicPublish(exchange=exchange, routing_key=routing_key)
    raw = codec.encode_properties(codec.BasicProperties())
    codec.append_content_frames(out, codec.ChannelId(channel), method, raw, body, 4096)
    return bytes(out)


@scenario("channel: open, close, reopen the same number")
def _open_close(s: Session) -> None:
    c = s.channel(1)
    c.call(1, m.ChannelClose(reply_code=200, reply_text="done"))
    c.open(1)
    c.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))


@scenario("channel: close from the client with an error code")
def _close_with_code(s: Session) -> None:
    c = s.channel(1)
    c.call(1, m.ChannelClose(reply_code=406, reply_text="mine", class_id=50, method_id=10))
    c.open(2)
    c.call(2, m.QueueDeclare(queue=s.name(), exclusive=True))


@scenario("channel: open twice is a channel error")
def _open_twice(s: Session) -> None:
    c = s.channel(1)
    c.send(1, m.ChannelOpen())
    until_close(c)


_UNOPENED: dict[str, m.Method] = {
    "queue.declare": m.QueueDeclare(queue="q"),
    "channel.close": m.ChannelClose(reply_code=200, reply_text="bye"),
    "channel.close-ok": m.ChannelCloseOk(),
    "channel.flow": m.ChannelFlow(active=True),
    "basic.ack": m.BasicAck(delivery_tag=1),
}


def _on_unopened(method: m.Method) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel(1)
        c.send(7, method)
        until_close(c)

    return run


for _label, _method in _UNOPENED.items():
    scenario(f"channel: {_label} on a channel never opened")(_on_unopened(_method))


@scenario("channel: basic.publish on a channel never opened")
def _publish_unopened(s: Session) -> None:
    c = s.connect()
    c.publish(3, "", s.name(), b"body")
    until_close(c)


@scenario("channel: close-ok on an open channel")
def _close_ok_unasked(s: Session) -> None:
    c = s.channel(1)
    c.send(1, m.ChannelCloseOk())
    until_close(c)


def _content_on_unopened(frame_type: int) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel(1)
        payload = b"\x00\x3c\x00\x00" + bytes(7) + b"\x01\x00\x00"
        c.client.send_raw(codec.encode_frame(frame_type, codec.ChannelId(5), payload))
        until_close(c)

    return run


scenario("channel: content header on a channel never opened")(_content_on_unopened(2))
scenario("channel: body frame on a channel never opened")(_content_on_unopened(3))


@scenario("channel: method on a channel after its close-ok")
def _after_close(s: Session) -> None:
    c = s.channel(1)
    c.call(1, m.ChannelClose(reply_code=200, reply_text="bye"))
    c.send(1, m.QueueDeclare(queue=s.name(), exclusive=True))
    until_close(c)


@scenario("channel: flow active=true")
def _flow_on(s: Session) -> None:
    c = s.channel(1)
    c.call(1, m.ChannelFlow(active=True))
    c.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))


@scenario("channel: flow active=false")
def _flow_off(s: Session) -> None:
    c = s.channel(1)
    c.call(1, m.ChannelFlow(active=False))


@scenario("channel: unsolicited flow-ok from the client")
def _flow_ok(s: Session) -> None:
    c = s.channel(1)
    c.send(1, m.ChannelFlowOk(active=True))
    c.sync(1)


@scenario("channel: close with a consumer and unacked deliveries requeues them")
def _close_with_consumer(s: Session) -> None:
    c = s.channel(1)
    c.open(2)
    c.call(1, m.QueueDeclare(queue=s.name(), exclusive=True))
    c.call(1, m.BasicConsume(queue=s.name(), consumer_tag="ctag"))
    for body in (b"a", b"b"):
        c.publish(2, "", s.name(), body)
    c.expect(2, "basic.deliver")
    c.call(1, m.ChannelClose(reply_code=200, reply_text="bye"))
    c.call(2, m.QueueDeclare(queue=s.name(), passive=True))


@scenario("channel: a channel error leaves the other channels open")
def _error_isolated(s: Session) -> None:
    c = s.channel(1)
    c.open(2)
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))
    c.call(2, m.QueueDeclare(queue=s.name(), exclusive=True))
    c.open(1)
    c.call(1, m.QueueDeclare(queue=s.name(), passive=True))


@scenario("channel: 200 channels open, each declares, then close")
def _many(s: Session) -> None:
    c = s.connect()
    for number in range(1, 201):
        c.open(number)
    for number in range(1, 201, 20):
        c.call(number, m.QueueDeclare(queue=s.name(f"q{number}"), exclusive=True))
    for number in range(1, 201):
        c.call(number, m.ChannelClose(reply_code=200, reply_text="bye"))


@scenario("channel: channel 65535 opens with the offered channel_max")
def _channel_65535(s: Session) -> None:
    c = s.channel(65535)
    c.call(65535, m.QueueDeclare(queue=s.name(), exclusive=True))


@scenario("channel_max 3: a fourth channel is refused")
def _fourth_channel(s: Session) -> None:
    c = s.connect(channel_max=3)
    for number in (1, 2, 3):
        c.open(number)
    c.send(4, m.ChannelOpen())
    until_close(c)


@scenario("channel_max 3: channel 65535 opens, the count is what is limited")
def _count_not_number(s: Session) -> None:
    c = s.connect(channel_max=3)
    c.open(65535)
    c.open(1000)
    c.call(65535, m.QueueDeclare(queue=s.name(), exclusive=True))


@scenario("channel_max 3: closing a channel frees room for another")
def _close_frees(s: Session) -> None:
    c = s.connect(channel_max=3)
    for number in (1, 2, 3):
        c.open(number)
    c.call(2, m.ChannelClose(reply_code=200, reply_text="bye"))
    c.open(9)
    c.send(10, m.ChannelOpen())
    until_close(c)


@scenario("channel_max 3: a channel the server closed frees room for another")
def _error_frees(s: Session) -> None:
    c = s.connect(channel_max=3)
    for number in (1, 2, 3):
        c.open(number)
    c.call(3, m.QueueDeclare(queue=s.name(), passive=True))
    c.open(4)
    c.call(4, m.QueueDeclare(queue=s.name(), exclusive=True))


# -- a channel the server is closing -----------------------------------------------------------
# The wire client answers channel.close with close-ok as soon as it reads it, so each
# scenario sends the failing publish and what follows in one write, before reading.


def _closing_then(label: str) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        c = s.channel(1)
        c.open(2)
        if label == "queue.declare":
            follow = method_frame(1, m.QueueDeclare(queue=s.name(), exclusive=True))
        elif label == "basic.publish":
            c.call(2, m.QueueDeclare(queue=s.name(), exclusive=True))
            follow = publish_frames(1, "", s.name(), b"dropped")
        elif label == "channel.open":
            follow = method_frame(1, m.ChannelOpen())
        else:
            follow = method_frame(1, m.BasicAck(delivery_tag=99))
        c.client.send_raw(publish_frames(1, s.name("missing"), "k") + follow)
        c.expect(1, "channel.close")
        c.sync(2)
        c.call(2, m.QueueDeclare(queue=s.name(), passive=True))
        c.open(1)
        c.sync(1)

    return run


for _label in ("queue.declare", "basic.publish", "basic.ack of an unknown tag"):
    scenario(f"channel: {_label} after the server's channel.close is discarded")(
        _closing_then(_label)
    )
# RabbitMQ sends the publish's channel.close 404, then connection.close 504 "second
# 'channel.open' seen": its channel process handles both, in order.
scenario("channel: channel.open after the server's channel.close")(_closing_then("channel.open"))


# RabbitMQ sends the publish's channel.close 404, then close-ok for the client's
# channel.close, which its closing channel still answers.
@scenario("channel: channel.close crossing the server's channel.close")
def _close_crossing(s: Session) -> None:
    c = s.channel(1)
    c.client.send_raw(
        publish_frames(1, s.name("missing"), "k")
        + method_frame(1, m.ChannelClose(reply_code=200, reply_text="bye"))
    )
    c.expect(1, "channel.close")
    c.quiet()
