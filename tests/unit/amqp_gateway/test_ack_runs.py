"""AckRun: the connection hands a read's acks, nacks and rejects to the server as runs,
only where the frame-by-frame path would hand over the same methods in the same order;
`ChannelSession.settle_run` settles a run of plain acks up to its first unknown tag.

Method: each guard is fed the frames that the frame-by-frame path refuses or treats
specially (no channel, a channel being closed, content expected, before open-ok), and
the test checks the answer is the one that path gives; the events of mixed reads are
compared with the methods they stand for.
"""

from __future__ import annotations

from typing import Any

from amqp_gateway import codec
from amqp_gateway.basic_methods import ack_method
from amqp_gateway.channels import ChannelSession, Clock, Unacked
from amqp_gateway.codec import methods as m
from amqp_gateway.errors import NotFound
from amqp_gateway.events import AckRun, Event, MethodReceived, PublishRun
from tests.unit.amqp_gateway.test_connection import Client, publish_frames


def frame(channel: int, method: m.Method) -> bytes:
    return codec.encode_method_frame(codec.ChannelId(channel), method)


def ack(tag: int, channel: int = 1) -> bytes:
    return frame(channel, m.BasicAck(codec.DeliveryTag(tag), False))


def methods_of(events: list[Event]) -> list[tuple[int, m.Method]]:
    """What the events stand for, one method per ack as the frame path has them."""
    out: list[tuple[int, m.Method]] = []
    for event in events:
        if isinstance(event, AckRun):
            out += [
                (event.channel, ack_method(t, k))
                for t, k in zip(event.tags, event.kinds, strict=True)
            ]
        elif isinstance(event, MethodReceived):
            out.append((event.channel, event.method))
    return out


def test_acks_nacks_and_rejects_of_one_read_are_one_run_in_their_order() -> None:
    client = Client()
    client.open()
    sent = [
        m.BasicAck(codec.DeliveryTag(1), False),
        m.BasicNack(codec.DeliveryTag(2), False, True),
        m.BasicReject(codec.DeliveryTag(3), False),
        m.BasicAck(codec.DeliveryTag(4), True),
    ]
    events = client.send(b"".join(frame(1, method) for method in sent) + codec.HEARTBEAT_FRAME)
    assert [type(e) for e in events] == [AckRun]
    assert methods_of(events) == [(1, method) for method in sent]
    assert client.methods() == []


def test_runs_keep_their_place_among_publishes_and_other_methods_and_channels() -> None:
    client = Client()
    client.open()
    client.send_method(2, m.ChannelOpen())
    client.methods()
    qos = m.BasicQos(0, 5, False)
    data = (
        ack(1)
        + ack(2)
        + publish_frames(1, b"a")
        + ack(3)
        + ack(1, channel=2)
        + frame(1, qos)
        + ack(4)
    )
    events = client.send(data)
    assert [type(e) for e in events] == [AckRun, PublishRun, AckRun, AckRun, MethodReceived, AckRun]
    assert [e.channel for e in events if isinstance(e, AckRun)] == [1, 1, 2, 1]
    assert methods_of(events)[-2:] == [(1, qos), (1, m.BasicAck(codec.DeliveryTag(4), False))]


def test_acks_fed_one_byte_at_a_time_stand_for_the_same_methods() -> None:
    client = Client()
    client.open()
    data = ack(1) + codec.HEARTBEAT_FRAME + ack(2) + frame(1, m.BasicNack(3, True, False))
    events: list[Event] = []
    for at in range(len(data)):
        events += client.send(data[at : at + 1])
    expected = [
        (1, m.BasicAck(codec.DeliveryTag(1), False)),
        (1, m.BasicAck(codec.DeliveryTag(2), False)),
        (1, m.BasicNack(codec.DeliveryTag(3), True, False)),
    ]
    assert methods_of(events) == expected


def test_an_ack_on_an_unopened_channel_is_504_as_before() -> None:
    client = Client()
    client.open()
    events = client.send(ack(1, channel=7) + ack(2, channel=7))
    assert not any(isinstance(e, AckRun) for e in events)
    [(_, close)] = client.methods()
    assert isinstance(close, m.ConnectionClose) and close.reply_code == 504
    assert (close.class_id, close.method_id) == (60, 80)


def test_an_ack_where_content_was_expected_is_505_as_before() -> None:
    client = Client()
    client.open()
    method_only = publish_frames(1, b"body")
    method_only = method_only[: method_only.index(b"\xce") + 1]  # the publish's method frame
    events = client.send(method_only + ack(1))
    assert not any(isinstance(e, AckRun) for e in events)
    [(_, close)] = client.methods()
    assert isinstance(close, m.ConnectionClose) and close.reply_code == 505


def test_acks_on_a_channel_being_closed_are_discarded_as_before() -> None:
    client = Client()
    client.open()
    client.server.fail(NotFound("no queue"), 1, [])
    client.methods()
    assert client.send(ack(1) + ack(2)) == []
    assert client.methods() == []


# -- ChannelSession.settle_run --------------------------------------------------------------


class _Owner:
    paused = False

    def __init__(self) -> None:
        self.clock = Clock()

    def note_output(self) -> None:
        pass


def session_with(tags: list[int]) -> tuple[ChannelSession, dict[int, Unacked]]:
    channel = ChannelSession(1, Client().server, _Owner())
    queue: Any = object()  # settle_run reads nothing of the queue
    for tag in tags:
        channel.unacked[tag] = Unacked(queue, tag * 10, None, 0)
    return channel, dict(channel.unacked)


def test_settle_run_takes_every_known_tag() -> None:
    channel, entries = session_with([1, 2, 3, 4])
    assert channel.settle_run([2, 1, 4]) == [entries[2], entries[1], entries[4]]
    assert list(channel.unacked) == [3]


def test_settle_run_stops_at_the_first_unknown_tag_and_keeps_the_rest_in_order() -> None:
    channel, entries = session_with([1, 2, 3, 4, 5])
    assert channel.settle_run([1, 9, 4, 2, 9]) == [entries[1]]
    assert list(channel.unacked.items()) == [(t, entries[t]) for t in (2, 3, 4, 5)]


def test_a_tag_named_twice_is_unknown_the_second_time() -> None:
    channel, entries = session_with([1, 2, 3])
    assert channel.settle_run([2, 3, 2, 1]) == [entries[2], entries[3]]
    assert list(channel.unacked) == [1]
