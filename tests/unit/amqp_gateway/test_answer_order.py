"""Rule 3 of the connection state machine: what the client reads follows the order of
the frames it sent, also when the protocol answers one of them itself and the server
answers another frame of the same read.

Method: the frames go in as one read; the test plays the server, handling the events that
come out (a publish to a missing exchange is refused with 404 through `fail`, as
`publishing.publish` does) before it lets the protocol go on with `resume_parse`, as
`AmqpSession._run` does, and reads the methods sent before and after.
"""

from __future__ import annotations

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.errors import NotFound
from amqp_gateway.events import (
    AckRun,
    ChannelClosed,
    ConnectionClosed,
    Event,
    MethodReceived,
    Publish,
    PublishRun,
)
from tests.unit.amqp_gateway.test_connection import Client, publish_frames, publishes

BYE = m.ChannelClose(reply_code=200, reply_text="bye", class_id=0, method_id=0)


def frame(channel: int, method: m.Method) -> bytes:
    return codec.encode_method_frame(codec.ChannelId(channel), method)


def refused_publish(channel: int = 1) -> bytes:
    return publish_frames(channel, b"x", exchange="missing")


def refuse(client: Client, events: list[Event]) -> None:
    """The server's part: each publish goes to a missing exchange."""
    for publish in publishes(events):
        text = f"no exchange '{publish.exchange}' in vhost '/'"
        client.server.fail(NotFound(text, 60, 40), publish.channel, [])


def sent(client: Client, *channels: int) -> list[m.Method]:
    """The methods sent since the last look, which must be on `channels` in this order."""
    methods = client.methods()
    assert [channel for channel, _ in methods] == list(channels)
    return [method for _, method in methods]


def read_stopped_before_its_answer(client: Client, data: bytes) -> list[Event]:
    """`data` as one read: the events before the frame the protocol answers itself come
    out, and nothing is answered yet."""
    events = client.server.receive_data(data, 0.0)
    assert client.server.parse_paused
    assert client.methods() == []
    return events


def test_channel_close_after_a_refused_publish_is_answered_after_the_404() -> None:
    """RabbitMQ's channel process judges the publish (channel.close 404, the channel now
    closing), then answers the client's channel.close with close-ok."""
    client = Client()
    client.open()
    events = read_stopped_before_its_answer(client, refused_publish() + frame(1, BYE))
    assert [p.exchange for p in publishes(events)] == ["missing"]
    refuse(client, events)
    assert client.server.resume_parse() == []
    assert not client.server.parse_paused
    close, close_ok = sent(client, 1, 1)
    assert isinstance(close, m.ChannelClose)
    assert (close.reply_code, close.class_id, close.method_id) == (404, 60, 40)
    assert close.reply_text == "NOT_FOUND - no exchange 'missing' in vhost '/'"
    assert close_ok == m.ChannelCloseOk()
    # The closes crossed: the channel waits for the client's close-ok of the 404.
    assert client.server.is_channel_closing(1)
    assert client.send_method(1, m.ChannelCloseOk()) == [ChannelClosed(1)]


def test_channel_close_after_an_accepted_publish_is_answered_once_it_is_handled() -> None:
    client = Client()
    client.open()
    data = publish_frames(1, b"x") + frame(1, BYE)
    events = read_stopped_before_its_answer(client, data)
    assert [p.body for p in publishes(events)] == [b"x"]
    assert client.server.resume_parse() == [ChannelClosed(1)]
    assert client.methods() == [(1, m.ChannelCloseOk())]


def test_channel_open_after_a_refused_publish_is_504_after_the_404() -> None:
    client = Client()
    client.open()
    events = read_stopped_before_its_answer(client, refused_publish() + frame(1, m.ChannelOpen()))
    refuse(client, events)
    client.server.resume_parse()
    close, connection_close = sent(client, 1, 0)
    assert isinstance(close, m.ChannelClose) and close.reply_code == 404
    assert isinstance(connection_close, m.ConnectionClose)
    assert (connection_close.reply_code, connection_close.class_id) == (504, 20)
    assert connection_close.reply_text == "CHANNEL_ERROR - second 'channel.open' seen"


def test_a_refusal_of_the_protocol_waits_for_the_events_before_it() -> None:
    """A message over the size limit, read behind a refused publish on the same channel:
    the 404 comes first, and the channel it closed discards the oversized one (rule 2)
    instead of refusing it with 406."""
    client = Client()
    client.open()
    client.server.message_bytes_max = 10
    data = refused_publish() + publish_frames(1, b"y" * 11)
    events = read_stopped_before_its_answer(client, data)
    refuse(client, events)
    assert client.server.resume_parse() == []
    [close] = sent(client, 1)
    assert isinstance(close, m.ChannelClose) and close.reply_code == 404
    assert client.server.is_channel_closing(1)


def test_a_connection_error_waits_for_the_events_before_it() -> None:
    client = Client()
    client.open()
    data = refused_publish() + frame(7, m.BasicQos(0, 10, False))
    events = read_stopped_before_its_answer(client, data)
    refuse(client, events)
    client.server.resume_parse()
    close, connection_close = sent(client, 1, 0)
    assert isinstance(close, m.ChannelClose) and close.reply_code == 404
    assert isinstance(connection_close, m.ConnectionClose)
    assert connection_close.reply_text == "CHANNEL_ERROR - expected 'channel.open'"


def test_connection_close_after_a_refused_publish_is_answered_after_the_404() -> None:
    client = Client()
    client.open()
    close = m.ConnectionClose(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    events = read_stopped_before_its_answer(client, refused_publish() + frame(0, close))
    refuse(client, events)
    assert client.server.resume_parse() == [ChannelClosed(1), ConnectionClosed(200, "bye")]
    channel_close, close_ok = sent(client, 1, 0)
    assert isinstance(channel_close, m.ChannelClose) and channel_close.reply_code == 404
    assert close_ok == m.ConnectionCloseOk()


def test_bytes_read_during_a_pause_are_parsed_after_the_paused_frame() -> None:
    client = Client()
    client.open()
    qos = m.BasicQos(0, 10, False)
    read_stopped_before_its_answer(client, publish_frames(1, b"x") + frame(2, m.ChannelOpen()))
    assert client.server.receive_data(frame(2, qos), 0.0) == []
    events = client.server.resume_parse()
    assert events == [MethodReceived(2, m.ChannelOpen()), MethodReceived(2, qos)]
    assert client.methods() == [(2, m.ChannelOpenOk())]
    assert client.server.resume_parse() == []  # not paused: nothing to go on with


def test_a_read_into_the_shared_buffer_keeps_what_follows_the_paused_frame() -> None:
    """The rest of the read outlives the shared buffer; each frame answered by the
    protocol waits for the events before it, those of the last resume included."""
    client = Client()
    client.open()
    data = (
        refused_publish()
        + frame(1, BYE)
        + frame(1, m.ChannelCloseOk())  # the client's answer to the 404
        + frame(1, m.ChannelOpen())
    )
    shared = bytearray(8192)
    room = client.server.read_buffer(shared, 4096)
    room[: len(data)] = data
    room.release()
    events = client.server.receive_read(len(data), 0.0)
    shared[:] = b"\xee" * len(shared)  # another connection's read
    assert client.server.parse_paused
    refuse(client, events)
    assert client.server.resume_parse() == [ChannelClosed(1)]  # then channel.open waits
    assert client.server.parse_paused
    assert client.server.resume_parse() == [MethodReceived(1, m.ChannelOpen())]
    close, close_ok, open_ok = sent(client, 1, 1, 1)
    assert isinstance(close, m.ChannelClose) and close.reply_code == 404
    assert (close_ok, open_ok) == (m.ChannelCloseOk(), m.ChannelOpenOk())


def test_publishes_and_methods_for_the_server_never_pause() -> None:
    """The hot path is unchanged: publish runs, acks and other methods the server
    answers all come out of one read."""
    client = Client()
    client.open()
    ack = m.BasicAck(delivery_tag=1, multiple=False)
    data = (
        publish_frames(1, b"a")
        + frame(1, ack)
        + publish_frames(1, b"b")
        + frame(1, m.ChannelFlow(active=True))
        + frame(1, ack)
    )
    events = client.server.receive_data(data, 0.0)
    assert not client.server.parse_paused
    assert [type(e) for e in events] == [
        PublishRun,
        AckRun,
        PublishRun,
        MethodReceived,
        AckRun,
    ]
    assert [p.body for p in publishes(events)] == [b"a", b"b"]
    assert not any(isinstance(e, Publish) for e in events)
