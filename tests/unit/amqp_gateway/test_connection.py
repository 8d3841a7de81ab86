"""The connection state machine, driven byte by byte by a minimal client built from the
codec: handshake, tuning limits, content assembly, error closes and heartbeats."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.connection import CHANNEL_MAX, FRAME_MAX, Connection
from amqp_gateway.errors import AccessRefused, NotFound
from amqp_gateway.events import (
    ChannelClosed,
    ConnectionClosed,
    Event,
    LoginRequested,
    MethodReceived,
    OpenRequested,
    Publish,
    PublishRun,
)
from amqp_gateway.states import State


class Client:
    """Encodes client frames and decodes what the server sent."""

    def __init__(self) -> None:
        self.server = Connection({"product": "streamq"}, now_s=0.0)
        self.received = bytearray()

    def send(self, data: bytes, now_s: float = 0.0) -> list[Event]:
        """Feed `data`; its events count as handled at once, so parsing goes on past
        every pause (rule 3; test_answer_order.py handles them in between)."""
        events = self.server.receive_data(data, now_s)
        while self.server.parse_paused:
            events += self.server.resume_parse()
        self.received += self.server.take_outgoing(now_s)
        return events

    def send_method(self, channel: int, method: m.Method) -> list[Event]:
        return self.send(codec.encode_method_frame(codec.ChannelId(channel), method))

    def methods(self) -> list[tuple[int, m.Method]]:
        self.received += self.server.take_outgoing(0.0)
        frames, used = codec.split_frames(self.received, FRAME_MAX)
        del self.received[:used]
        return [
            (f.channel, codec.decode_method(f.payload))
            for f in frames
            if f.frame_type == codec.FRAME_METHOD
        ]

    def open(self, frame_max: int = FRAME_MAX) -> None:
        self.send(b"AMQP\x00\x00\x09\x01")
        events = self.send_method(
            0, m.ConnectionStartOk(mechanism="PLAIN", response=b"\x00guest\x00secret")
        )
        assert events == [LoginRequested("PLAIN", "guest", "secret", {})]
        self.server.accept_login("guest")
        assert self.send_method(0, m.ConnectionTuneOk(CHANNEL_MAX, frame_max, 60)) == []
        assert self.send_method(0, m.ConnectionOpen(virtual_host="/")) == [OpenRequested("/")]
        self.server.accept_open("/")
        self.send_method(1, m.ChannelOpen())
        self.methods()


def test_handshake_advertises_capabilities_and_negotiates_limits() -> None:
    client = Client()
    assert client.send(b"AMQP\x00\x00\x09") == []  # a partial header waits
    client.send(b"\x01")
    [(channel, start)] = client.methods()
    assert channel == 0 and isinstance(start, m.ConnectionStart)
    assert start.mechanisms == b"PLAIN AMQPLAIN"
    client.send_method(0, m.ConnectionStartOk(mechanism="PLAIN", response=b"\x00u\x00p"))
    client.server.accept_login("u")
    [(_, tune)] = client.methods()
    assert isinstance(tune, m.ConnectionTune)
    # RabbitMQ 3.10's defaults, which clients adopt.
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    client.send_method(0, m.ConnectionTuneOk(CHANNEL_MAX, FRAME_MAX, 30))
    assert (client.server.channel_max, client.server.frame_max) == (CHANNEL_MAX, FRAME_MAX)
    assert client.server.heartbeat_s == 30


def test_amqplain_credentials_are_read_from_the_table() -> None:
    client = Client()
    client.send(b"AMQP\x00\x00\x09\x01")
    table = codec.encode_table({"LOGIN": "alice", "PASSWORD": "pw"})[4:]
    events = client.send_method(0, m.ConnectionStartOk(mechanism="AMQPLAIN", response=table))
    assert events == [LoginRequested("AMQPLAIN", "alice", "pw", {})]


def test_a_wrong_protocol_header_gets_ours_back() -> None:
    client = Client()
    events = client.send(b"GET / HTTP/1.1\r\n")
    assert any(isinstance(e, ConnectionClosed) for e in events)
    assert bytes(client.received) == b"AMQP\x00\x00\x09\x01"


@pytest.mark.parametrize(
    ("tune", "text"),
    [
        (m.ConnectionTuneOk(4000, FRAME_MAX, 0), "channel_max = 4000 is higher"),
        (m.ConnectionTuneOk(0, FRAME_MAX, 0), "channel_max = 0 is higher"),
        (m.ConnectionTuneOk(10, 200000, 0), "frame_max = 200000 is higher"),
        (m.ConnectionTuneOk(10, 0, 0), "frame_max = 0 is higher"),
        (m.ConnectionTuneOk(10, 1000, 0), "frame_max = 1000 is lower"),
    ],
)
def test_tune_beyond_the_server_limits_closes_the_socket_without_a_word(
    tune: m.ConnectionTuneOk, text: str
) -> None:
    """Spec (tune-ok): "the server MUST close the connection without attempting a
    negotiated close", as RabbitMQ 3.10 does; 0 ("no limit") is above our limits."""
    client = Client()
    client.send(b"AMQP\x00\x00\x09\x01")
    client.send_method(0, m.ConnectionStartOk(response=b"\x00u\x00p"))
    client.server.accept_login("u")
    client.methods()
    [closed] = client.send_method(0, tune)
    assert isinstance(closed, ConnectionClosed)
    assert closed.reply_code == 530 and text in closed.reply_text
    assert client.methods() == []
    assert client.server.state is State.CLOSED


@pytest.mark.parametrize(
    "method",
    [
        m.ConnectionOpen(virtual_host="/"),
        m.ConnectionTuneOk(10, FRAME_MAX, 0),
        m.ConnectionStartOk(mechanism="CRAM-MD5", response=b"u"),
        m.ConnectionStartOk(mechanism="PLAIN", response=b"no nuls"),
    ],
)
def test_an_error_before_tune_ok_closes_the_socket_without_a_word(method: m.Method) -> None:
    """As RabbitMQ 3.10 (rabbit_reader:handle_exception/3 in its starting and tuning
    states); the spec asks it of an unknown mechanism."""
    client = Client()
    client.send(b"AMQP\x00\x00\x09\x01")
    client.methods()
    events = client.send_method(0, method)
    assert [type(e) for e in events] == [ConnectionClosed]
    assert client.methods() == []
    assert client.server.state is State.CLOSED


@pytest.mark.parametrize("told", [True, False])
def test_a_refused_login_is_told_only_to_a_client_that_announced_it(told: bool) -> None:
    client = Client()
    client.send(b"AMQP\x00\x00\x09\x01")
    client.methods()
    properties: codec.FieldTable = {"capabilities": {"authentication_failure_close": told}}
    client.send_method(0, m.ConnectionStartOk(properties, "PLAIN", b"\x00u\x00p"))
    events: list[Event] = []
    client.server.fail(AccessRefused("Login was refused"), 0, events)
    if told:  # the close handshake, as RabbitMQ with authentication_failure_close
        assert events == []
        [(_, close)] = client.methods()
        assert isinstance(close, m.ConnectionClose) and close.reply_code == 403
        assert client.server.state is State.CLOSING
    else:
        assert [type(e) for e in events] == [ConnectionClosed]
        assert client.methods() == []


def test_a_method_out_of_order_after_tune_ok_is_504() -> None:
    """RabbitMQ's "opening" state answers with connection.close."""
    client = Client()
    client.send(b"AMQP\x00\x00\x09\x01")
    client.send_method(0, m.ConnectionStartOk(response=b"\x00u\x00p"))
    client.server.accept_login("u")
    client.send_method(0, m.ConnectionTuneOk(10, FRAME_MAX, 0))
    client.methods()
    client.send_method(0, m.ConnectionClose(200, "bye", 0, 0))
    [(_, close)] = client.methods()
    assert isinstance(close, m.ConnectionClose)
    assert (close.reply_code, close.class_id, close.method_id) == (504, 10, 50)
    assert close.reply_text == "CHANNEL_ERROR - unexpected method in connection state opening"


def publish_frames(
    channel: int,
    body: bytes,
    frame_max: int = FRAME_MAX,
    *,
    exchange: str = "amq.direct",
    routing_key: str = "rk",
) -> bytes:
    out = bytearray()
    method = m.BasicPublish(exchange=exchange, routing_key=routing_key, mandatory=True)
    codec.append_content_frames(
        out, codec.ChannelId(channel), method, codec.EMPTY_PROPERTIES_RAW, body, frame_max
    )
    return bytes(out)


def publishes(events: list[Event]) -> list[Publish]:
    """The publishes among `events`, those of runs as if each came alone."""
    found: list[Publish] = []
    for event in events:
        if isinstance(event, PublishRun):
            found += [
                Publish(event.channel, e, k, bool(b & 1), bool(b & 2), p, body)
                for p, body, e, k, b in event.messages
            ]
        elif isinstance(event, Publish):
            found.append(event)
    return found


@pytest.mark.parametrize("body", [b"", b"x", b"y" * 20000])
def test_publishes_are_assembled_from_frames_fed_one_byte_at_a_time(body: bytes) -> None:
    client = Client()
    client.open(frame_max=4096)
    data = publish_frames(1, body, 4096) * 2
    events: list[Event] = []
    for i in range(len(data)):
        events += client.send(data[i : i + 1])
    expected = Publish(1, "amq.direct", "rk", True, False, codec.EMPTY_PROPERTIES_RAW, body)
    assert publishes(events) == [expected, expected]


@pytest.mark.parametrize("one_byte_at_a_time", [False, True])
def test_a_received_payload_of_frame_max_bytes_is_accepted(one_byte_at_a_time: bool) -> None:
    """RabbitMQ 3.10 accepts received payloads up to frame_max bytes (8 bytes of slack
    over the spec's frame_max - 8): a body frame of 4096 payload bytes under frame_max
    4096 is a publish, through the C scanner (whole) and read_frame (byte by byte)."""
    client = Client()
    client.open(frame_max=4096)
    body = b"x" * 4096
    data = publish_frames(1, body, 4096 + 8)  # one body frame of 4096 payload bytes
    assert len(data) - len(publish_frames(1, b"", 4096 + 8)) == 4096 + 8
    pieces = [data[i : i + 1] for i in range(len(data))] if one_byte_at_a_time else [data]
    events = [e for piece in pieces for e in client.send(piece)]
    expected = Publish(1, "amq.direct", "rk", True, False, codec.EMPTY_PROPERTIES_RAW, body)
    assert publishes(events) == [expected]
    assert client.methods() == []
    assert client.server.state is State.OPEN


@pytest.mark.parametrize("one_byte_at_a_time", [False, True])
def test_a_received_payload_of_frame_max_plus_one_bytes_is_501(one_byte_at_a_time: bool) -> None:
    client = Client()
    client.open(frame_max=4096)
    data = publish_frames(1, b"x" * 4097, 4097 + 8)
    pieces = [data[i : i + 1] for i in range(len(data))] if one_byte_at_a_time else [data]
    events = [e for piece in pieces for e in client.send(piece)]
    assert publishes(events) == []
    [(channel, close)] = client.methods()
    assert channel == 0 and isinstance(close, m.ConnectionClose)
    assert close.reply_code == 501
    assert "4097" in close.reply_text  # the payload's size (the wording is RabbitMQ's)


def open_with_channel_max(channel_max: int) -> Client:
    """A client open with `channel_max` negotiated and no channel open yet."""
    client = Client()
    client.send(b"AMQP\x00\x00\x09\x01")
    client.send_method(0, m.ConnectionStartOk(mechanism="PLAIN", response=b"\x00u\x00p"))
    client.server.accept_login("u")
    client.send_method(0, m.ConnectionTuneOk(channel_max, FRAME_MAX, 0))
    client.send_method(0, m.ConnectionOpen(virtual_host="/"))
    client.server.accept_open("/")
    client.methods()
    return client


def test_channel_max_limits_how_many_channels_are_open_not_their_numbers() -> None:
    """As RabbitMQ 3.10 (rabbit_reader:create_channel): any channel number opens while
    fewer than channel_max channels are open, closing one makes room, and the open beyond
    the limit closes the connection with 530 and RabbitMQ's text."""
    client = open_with_channel_max(3)
    for channel in (65535, 7, 3):
        client.send_method(channel, m.ChannelOpen())
    assert client.methods() == [(c, m.ChannelOpenOk()) for c in (65535, 7, 3)]
    assert client.send_method(7, m.ChannelClose(200, "", 0, 0)) == [ChannelClosed(7)]
    client.send_method(4, m.ChannelOpen())
    assert client.methods() == [(7, m.ChannelCloseOk()), (4, m.ChannelOpenOk())]
    events = client.send_method(9, m.ChannelOpen())
    assert [e for e in events if isinstance(e, ChannelClosed)] == [
        ChannelClosed(c) for c in (65535, 3, 4)
    ]
    [(channel, close)] = client.methods()
    assert channel == 0 and isinstance(close, m.ConnectionClose)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 0, 0)
    assert close.reply_text == (
        "NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)"
    )


def test_the_channel_gate_refuses_a_channel_open_with_its_text() -> None:
    """A user's max-channels (streamq/broker/connection_tracking.py): the server's gate
    is asked at each channel.open after channel_max; its text closes the connection with
    530 and no method to blame, as rabbit_reader:create_channel/2 does."""
    client = open_with_channel_max(10)
    refusals: list[str | None] = [None, "over the user's limit"]
    client.server.channel_gate = lambda: refusals.pop(0)
    client.send_method(1, m.ChannelOpen())
    assert client.methods() == [(1, m.ChannelOpenOk())]
    assert client.server.open_channel_count() == 1
    client.send_method(2, m.ChannelOpen())
    [(channel, close)] = client.methods()
    assert channel == 0 and isinstance(close, m.ConnectionClose)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 0, 0)
    assert close.reply_text == "NOT_ALLOWED - over the user's limit"


def test_channel_max_is_ours_at_most() -> None:
    client = open_with_channel_max(CHANNEL_MAX)
    for channel in range(1, CHANNEL_MAX + 1):
        client.send_method(channel, m.ChannelOpen())
    assert len(client.methods()) == CHANNEL_MAX
    client.send_method(CHANNEL_MAX + 1, m.ChannelOpen())
    [(_, close)] = client.methods()
    assert isinstance(close, m.ConnectionClose) and close.reply_code == 530
    assert f"number of channels opened ({CHANNEL_MAX}) has reached" in close.reply_text


@pytest.mark.parametrize(
    "method",
    [
        m.ChannelOpen(),
        m.BasicQos(0, 1, False),
        m.ConnectionOpen(virtual_host="/"),
        m.ConnectionStartOk(response=b"\x00u\x00p"),
        m.ConnectionTuneOk(10, FRAME_MAX, 0),
        m.ConnectionCloseOk(),
    ],
)
def test_a_method_that_does_not_belong_on_channel_0_is_504(method: m.Method) -> None:
    """As RabbitMQ's rabbit_reader:handle_method0/2 once running."""
    client = open_with_channel_max(10)
    client.send_method(0, method)
    [(_, close)] = client.methods()
    assert isinstance(close, m.ConnectionClose)
    assert (close.reply_code, close.class_id, close.method_id) == (
        504,
        method.CLASS_ID,
        method.METHOD_ID,
    )
    assert close.reply_text == "CHANNEL_ERROR - unexpected method in connection state running"
    assert client.server.state is State.CLOSING


def test_a_message_over_the_max_size_closes_the_channel_with_406() -> None:
    client = Client()
    client.open()
    client.server.message_bytes_max = 10
    events = client.send(publish_frames(1, b"x" * 11))
    assert events == []
    [(channel, close)] = client.methods()
    assert channel == 1 and isinstance(close, m.ChannelClose)
    assert close.reply_code == 406
    assert "message size 11 is larger than configured max size 10" in close.reply_text
    # Frames on the closing channel are discarded until the close-ok.
    assert client.send(publish_frames(1, b"ok")) == []
    assert client.send_method(1, m.ChannelCloseOk()) == [ChannelClosed(1)]


def test_a_reply_text_over_255_bytes_ends_in_dots_as_rabbitmq_cuts_it() -> None:
    client = Client()
    client.open()
    client.server.fail(NotFound("x" * 300, 50, 10), 1, [])
    [(_, close)] = client.methods()
    assert isinstance(close, m.ChannelClose)
    assert len(close.reply_text.encode()) == 255
    assert close.reply_text == "NOT_FOUND - " + "x" * 240 + "..."


def test_a_method_where_content_was_expected_is_505() -> None:
    client = Client()
    client.open()
    method = m.BasicPublish(exchange="", routing_key="q")
    client.send_method(1, method)
    events = client.send_method(1, m.BasicQos(0, 10, False))
    assert isinstance(events[-1], ChannelClosed)
    [(_, close)] = client.methods()
    assert isinstance(close, m.ConnectionClose) and close.reply_code == 505


PUBLISH = codec.encode_method_frame(
    codec.ChannelId(1), m.BasicPublish(exchange="", routing_key="q")
)
QOS = codec.encode_method_frame(codec.ChannelId(1), m.BasicQos(0, 10, False))


def header_frame(body_size: int, *, class_id: int = 60, weight: int = 0) -> bytes:
    payload = struct.pack(">HHQ", class_id, weight, body_size) + b"\x00\x00"
    return codec.encode_frame(codec.FRAME_HEADER, codec.ChannelId(1), payload)


BODY = codec.encode_frame(codec.FRAME_BODY, codec.ChannelId(1), b"abc")
EXPECTED_METHOD = "expected method frame, got non method frame instead"
EXPECTED_HEADER = "expected content header for class 60, got non content header frame instead"
EXPECTED_BODY = "expected content body, got non content body frame instead"


@pytest.mark.parametrize(
    ("data", "text", "ids"),
    [
        (header_frame(3), EXPECTED_METHOD, (0, 0)),
        (BODY, EXPECTED_METHOD, (0, 0)),
        (PUBLISH + header_frame(0) + BODY, EXPECTED_METHOD, (0, 0)),
        (PUBLISH + QOS, EXPECTED_HEADER, (60, 40)),
        (PUBLISH + PUBLISH, EXPECTED_HEADER, (60, 40)),
        (PUBLISH + BODY, EXPECTED_HEADER, (60, 40)),
        (PUBLISH + header_frame(3, weight=1), EXPECTED_HEADER, (60, 40)),
        (
            PUBLISH + header_frame(3, class_id=50),
            "expected content header for class 60, got one for class 50 instead",
            (60, 40),
        ),
        (PUBLISH + header_frame(3) + QOS, EXPECTED_BODY, (60, 40)),
        (PUBLISH + header_frame(3) + PUBLISH, EXPECTED_BODY, (60, 40)),
        (PUBLISH + header_frame(3) + header_frame(3), EXPECTED_BODY, (60, 40)),
    ],
)
def test_content_frames_out_of_order_are_505_with_rabbitmqs_texts(
    data: bytes, text: str, ids: tuple[int, int]
) -> None:
    """rabbit_command_assembler:process/2's texts, blaming the publish being assembled."""
    for pieces in ([data], [data[i : i + 1] for i in range(len(data))]):
        client = Client()
        client.open()
        for piece in pieces:
            client.send(piece)
        [(_, close)] = client.methods()
        assert isinstance(close, m.ConnectionClose)
        assert (close.reply_code, close.class_id, close.method_id) == (505, *ids)
        assert close.reply_text == f"UNEXPECTED_FRAME - {text}"


def test_frames_on_an_unopened_channel_are_504() -> None:
    client = Client()
    client.open()
    client.send_method(7, m.BasicQos(0, 10, False))
    [(_, close)] = client.methods()
    assert isinstance(close, m.ConnectionClose) and close.reply_code == 504
    assert close.reply_text == "CHANNEL_ERROR - expected 'channel.open'"
    assert (close.class_id, close.method_id) == (60, 10)


def test_channel_open_on_a_channel_being_closed_is_504() -> None:
    """RabbitMQ's closing channel discards other methods, but not this one."""
    client = Client()
    client.open()
    client.server.fail(NotFound("no queue"), 1, [])
    client.send_method(1, m.ChannelOpen())
    [(_, channel_close), (_, close)] = client.methods()
    assert isinstance(channel_close, m.ChannelClose) and isinstance(close, m.ConnectionClose)
    assert close.reply_text == "CHANNEL_ERROR - second 'channel.open' seen"


def test_after_a_frame_error_the_close_ok_of_a_later_read_is_taken() -> None:
    client = Client()
    client.open()
    events = client.send(codec.encode_frame(5, codec.ChannelId(1), b"x") + b"rest of the read")
    [(_, close)] = client.methods()
    assert isinstance(close, m.ConnectionClose) and close.reply_code == 501
    assert not any(isinstance(e, ConnectionClosed) for e in events)
    events = client.send_method(0, m.ConnectionCloseOk())
    assert [type(e) for e in events] == [ConnectionClosed]


def test_other_methods_are_handed_to_the_server() -> None:
    client = Client()
    client.open()
    qos = m.BasicQos(0, 10, False)
    assert client.send_method(1, qos) == [MethodReceived(1, qos)]


def test_client_close_is_answered_and_reported() -> None:
    client = Client()
    client.open()
    events = client.send_method(0, m.ConnectionClose(200, "bye", 0, 0))
    assert events == [ChannelClosed(1), ConnectionClosed(200, "bye")]
    [(_, close_ok)] = client.methods()
    assert isinstance(close_ok, m.ConnectionCloseOk)


def test_heartbeats_are_sent_when_quiet_and_a_silent_peer_times_out() -> None:
    client = Client()
    client.open()  # heartbeat 60 s
    assert client.server.check_heartbeat(31.0)
    assert bytes(client.server.outgoing) == codec.HEARTBEAT_FRAME
    client.server.take_outgoing(31.0)
    client.send(codec.HEARTBEAT_FRAME, now_s=100.0)
    assert client.server.check_heartbeat(219.0)
    assert not client.server.check_heartbeat(221.0)


def test_a_batch_of_publishes_between_other_frames_keeps_its_order() -> None:
    """Whole publishes take the fast path and other frames the frame-by-frame one; the
    events come out in the order of the input, across both paths."""
    client = Client()
    client.open(frame_max=4096)
    qos = bytearray()
    codec.append_method_frame(qos, codec.ChannelId(1), m.BasicQos(prefetch_count=5))
    big = b"b" * 5000  # two body frames: the frame-by-frame path
    data = (
        publish_frames(1, b"one", 4096)
        + bytes(qos)
        + publish_frames(1, big, 4096)
        + publish_frames(1, b"", 4096)
        + publish_frames(1, b"two", 4096)
    )
    events = client.send(data)
    # Consecutive whole publishes with one exchange and routing key make one run.
    assert [type(e).__name__ for e in events] == [
        "PublishRun",
        "MethodReceived",
        "Publish",
        "PublishRun",
    ]
    assert [p.body for p in publishes(events)] == [b"one", big, b"", b"two"]


def test_a_run_ends_where_the_exchange_routing_key_or_channel_changes() -> None:
    client = Client()
    client.open()
    client.send_method(2, m.ChannelOpen())
    data = b"".join(
        publish_frames(channel, body, exchange=exchange, routing_key=routing_key)
        for channel, exchange, routing_key, body in [
            (1, "amq.direct", "a", b"1"),
            (1, "amq.direct", "a", b"2"),
            (1, "amq.direct", "b", b"3"),
            (1, "amq.topic", "b", b"4"),
            (2, "amq.topic", "b", b"5"),
            (2, "amq.topic", "b", b"6"),
        ]
    )
    events = client.send(data)
    runs = [(e.channel, [p[1] for p in e.messages]) for e in events if isinstance(e, PublishRun)]
    assert runs == [(1, [b"1", b"2"]), (1, [b"3"]), (1, [b"4"]), (2, [b"5", b"6"])]
    [run] = [e for e in events if isinstance(e, PublishRun) and e.channel == 2]
    assert run.messages[0][2] is run.messages[1][2]  # one str for the run's exchange


def read_through_shared_buffer(
    client: Client, shared: bytearray, data: bytes, cuts: list[int], room_max: int
) -> list[Event]:
    """Feed `data` as the server's reads do: each read lands in `shared` behind the
    partial frame left by the one before, and the buffer is scribbled over between reads,
    as other connections' reads would."""
    events: list[Event] = []
    position = 0
    for cut in [min(c, len(data)) for c in cuts] + [len(data)]:
        while position < cut:
            room = client.server.read_buffer(shared, room_max)
            size = min(len(room), cut - position)
            room[:size] = data[position : position + size]
            room.release()
            events += client.server.receive_read(size, 0.0)
            position += size
            shared[:] = b"\xee" * len(shared)
    return events


@settings(max_examples=40, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=9000), min_size=1, max_size=8),
    cuts=st.lists(st.integers(0, 60000), max_size=10),
    room_max=st.sampled_from([7, 1000, 5000, 65536]),
)
def test_reads_into_a_shared_buffer_give_the_events_of_one_whole_read(
    bodies: list[bytes], cuts: list[int], room_max: int
) -> None:
    """Reads of any size through the shared read buffer, including a partial frame larger
    than it (which gets a buffer of its own), give the publishes and methods that the same
    bytes give fed whole."""
    qos = bytearray()
    codec.append_method_frame(qos, codec.ChannelId(1), m.BasicQos(prefetch_count=5))
    data = b"".join(publish_frames(1, body, 4096) + bytes(qos) for body in bodies)
    whole = Client()
    whole.open(frame_max=4096)
    expected = whole.send(data)
    pieces = Client()
    pieces.open(frame_max=4096)
    got = read_through_shared_buffer(pieces, bytearray(8192), data, sorted(cuts), room_max)
    assert publishes(got) == publishes(expected)
    assert [e for e in got if isinstance(e, MethodReceived)] == [
        e for e in expected if isinstance(e, MethodReceived)
    ]
    assert [p.body for p in publishes(got)] == bodies


def test_a_read_before_the_connection_is_open_takes_the_copying_path() -> None:
    """The handshake is parsed by `receive_data` whichever way it was read."""
    client = Client()
    shared = bytearray(64)
    events = read_through_shared_buffer(client, shared, b"AMQP\x00\x00\x09\x01", [3], 64)
    assert events == []
    [(channel, start)] = client.methods()
    assert channel == 0 and isinstance(start, m.ConnectionStart)
