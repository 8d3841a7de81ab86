"""Framing: split_frames gives the same frames whether bytes arrive one at a time, in
random pieces or all at once; bad framing raises FrameError as early as it can; the
protocol header accepts 0-9-1 and 0-9 and nothing else."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import frame as pamqp_frame
from pamqp import heartbeat as pamqp_heartbeat

from amqp_gateway.codec.frame import (
    FRAME_MIN_SIZE,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER_0_9,
    PROTOCOL_HEADER_0_9_1,
    Frame,
    FrameType,
    ProtocolVersion,
    append_frame,
    check_heartbeat_frame,
    encode_frame,
    encode_heartbeat_frame,
    parse_protocol_header,
    read_frame,
    received_payload_max,
    split_frames,
)
from amqp_gateway.codec.ids import ChannelId
from amqp_gateway.codec.method_frame import append_content_frames
from amqp_gateway.codec.methods import BasicDeliver
from amqp_gateway.errors import FrameError, ProtocolHeaderMismatch, UnexpectedFrame

FRAME_MAX = 512

frames_strategy = st.lists(
    st.builds(
        Frame,
        st.sampled_from(list(FrameType)).map(int),
        st.integers(0, 65535).map(ChannelId),
        st.binary(max_size=FRAME_MAX - 8),
    ),
    max_size=8,
)


def stream_of(frames: list[Frame]) -> bytes:
    return b"".join(encode_frame(f.frame_type, f.channel, f.payload) for f in frames)


def receive(pieces: list[bytes], frame_max: int = FRAME_MAX) -> tuple[list[Frame], bytes]:
    """Drive split_frames as the server will: append each read, drop what was consumed."""
    buffer = bytearray()
    frames: list[Frame] = []
    for piece in pieces:
        buffer += piece
        new, consumed = split_frames(buffer, frame_max)
        frames += new
        del buffer[:consumed]
    return frames, bytes(buffer)


@given(frames_strategy)
def test_one_byte_at_a_time_equals_all_at_once(frames: list[Frame]) -> None:
    stream = stream_of(frames)
    at_once, consumed = split_frames(stream, FRAME_MAX)
    assert at_once == frames
    assert consumed == len(stream)
    one_by_one, rest = receive([stream[i : i + 1] for i in range(len(stream))])
    assert one_by_one == frames
    assert rest == b""


@given(frames_strategy, st.lists(st.integers(0, 5000), max_size=10))
def test_any_chunking_gives_the_same_frames(frames: list[Frame], cuts: list[int]) -> None:
    stream = stream_of(frames)
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    pieces = [stream[a:b] for a, b in itertools.pairwise(points)]
    assert receive(pieces) == (frames, b"")


@given(frames_strategy, st.integers(1, 50))
def test_a_partial_frame_waits_and_consumes_nothing_of_it(frames: list[Frame], cut: int) -> None:
    stream = stream_of(frames)
    cut = min(cut, len(stream))
    got, consumed = split_frames(stream[:-cut] if cut else stream, FRAME_MAX)
    assert got == frames[: len(got)]
    assert consumed == len(stream_of(got))


def test_split_accepts_bytes_bytearray_and_memoryview() -> None:
    stream = encode_frame(1, ChannelId(7), b"abc") + b"\x01"
    for buffer in (stream, bytearray(stream), memoryview(stream)):
        assert split_frames(buffer, FRAME_MAX) == ([Frame(1, ChannelId(7), b"abc")], 11)


def test_frame_layout_matches_pamqp() -> None:
    assert (
        HEARTBEAT_FRAME
        == encode_heartbeat_frame()
        == pamqp_frame.marshal(pamqp_heartbeat.Heartbeat(), 0)
    )
    out = bytearray(b"prefix")
    append_frame(out, 3, ChannelId(258), b"body")
    assert out == b"prefix" + b"\x03\x01\x02\x00\x00\x00\x04body\xce"
    consumed, channel, body = pamqp_frame.unmarshal(bytes(out[6:]))
    assert (consumed, channel, body.value) == (12, 258, b"body")


def test_frame_headers_out_of_range_are_programmer_errors() -> None:
    with pytest.raises(ValueError, match="cannot encode a frame header"):
        encode_frame(1, ChannelId(65536), b"")
    out = bytearray()
    with pytest.raises(ValueError, match="cannot encode a frame header"):
        append_frame(out, 256, ChannelId(0), b"")
    assert out == b""


def test_a_payload_of_exactly_frame_max_is_accepted_and_one_more_byte_is_not() -> None:
    """As RabbitMQ 3.10: a received frame may carry frame_max payload bytes (frame_max - 8
    plus 8 of slack, rabbit_reader's FRAME_SIZE_FUDGE), fed whole or a byte at a time, by
    split_frames and by read_frame; frame_max + 1 is a FRAME_ERROR from the header on."""
    payload = b"x" * FRAME_MIN_SIZE
    fits = encode_frame(3, ChannelId(1), payload)
    expected = Frame(3, ChannelId(1), payload)
    assert received_payload_max(FRAME_MIN_SIZE) == FRAME_MIN_SIZE
    assert split_frames(fits, FRAME_MIN_SIZE) == ([expected], FRAME_MIN_SIZE + 8)
    assert read_frame(fits, 0, FRAME_MIN_SIZE) == (expected, FRAME_MIN_SIZE + 8)
    one_by_one = [fits[i : i + 1] for i in range(len(fits))]
    assert receive(one_by_one, FRAME_MIN_SIZE) == ([expected], b"")
    too_big = encode_frame(3, ChannelId(1), payload + b"x")
    for cut in (7, len(too_big)):  # the header alone is enough
        with pytest.raises(FrameError) as caught:
            split_frames(too_big[:cut], FRAME_MIN_SIZE)
        assert caught.value.reply_code == 501
        # RabbitMQ's text names the payload and the spec's limit, frame_max - 8.
        assert caught.value.reply_text == ("type 3, all octets = <<>>: {frame_too_large,4097,4088}")
        with pytest.raises(FrameError, match="frame_too_large,4097,4088"):
            read_frame(too_big[:cut], 0, FRAME_MIN_SIZE)
    with pytest.raises(FrameError, match="frame_too_large"):
        receive([too_big[i : i + 1] for i in range(len(too_big))], FRAME_MIN_SIZE)


def test_what_we_send_stays_within_frame_max_minus_8() -> None:
    """The slack is for receiving only: the spec's limit holds for every frame we send."""
    out = bytearray()
    method = BasicDeliver("ctag", 1, False, "", "q")
    append_content_frames(out, ChannelId(1), method, b"\x00\x00", b"b" * 10000, FRAME_MIN_SIZE)
    frames, used = split_frames(out, FRAME_MIN_SIZE)
    assert used == len(out)
    assert max(len(f.payload) for f in frames) == FRAME_MIN_SIZE - 8


def test_an_oversize_frame_fails_on_its_header_before_the_payload_arrives() -> None:
    """The receive buffer stays capped at frame_max (STYLE.md section 2)."""
    header_only = b"\x03\x00\x01\x7f\xff\xff\xff"
    with pytest.raises(FrameError, match="frame_too_large"):
        split_frames(header_only, FRAME_MAX)
    with pytest.raises(FrameError, match="frame_too_large"):
        split_frames(encode_frame(1, ChannelId(1), b"") + header_only, FRAME_MAX)


@pytest.mark.parametrize("frame_type", [0, 4, 7, 9, 65, 255])
def test_an_unknown_frame_type_is_a_frame_error_once_the_frame_is_in(frame_type: int) -> None:
    """As RabbitMQ, which judges the type of a whole frame and quotes its payload."""
    frame = bytes([frame_type]) + b"\x00\x01\x00\x00\x00\x02ab\xce"
    assert split_frames(frame[:-1], FRAME_MAX) == ([], 0)
    assert read_frame(frame[:-1], 0, FRAME_MAX) == (None, 0)
    expected = f'type {frame_type}, all octets = <<"ab">>: unknown_frame'
    with pytest.raises(FrameError) as caught:
        split_frames(frame, FRAME_MAX)
    assert caught.value.reply_text == expected
    with pytest.raises(FrameError) as caught:
        read_frame(frame, 0, FRAME_MAX)
    assert caught.value.reply_text == expected


@pytest.mark.parametrize("end", [0x00, 0xCD, 0xCF, 0xFF])
def test_a_bad_frame_end_octet_is_a_frame_error(end: int) -> None:
    good = encode_frame(1, ChannelId(1), b"payload")
    bad = good[:-1] + bytes([end])
    expected = f'type 1, all octets = <<"payload">>: {{invalid_frame_end_marker,{end}}}'
    with pytest.raises(FrameError) as caught:
        split_frames(good + bad, FRAME_MAX)
    assert caught.value.reply_text == expected
    with pytest.raises(FrameError) as caught:
        read_frame(good + bad, len(good), FRAME_MAX)
    assert caught.value.reply_text == expected


def test_after_a_frame_error_the_callers_bytearray_can_still_be_resized() -> None:
    buffer = bytearray(b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with pytest.raises(FrameError):
        split_frames(buffer, FRAME_MAX)
    buffer.clear()  # would raise BufferError if split_frames kept a view exported
    assert buffer == b""


@pytest.mark.parametrize(
    ("header", "version"),
    [
        (PROTOCOL_HEADER_0_9_1, ProtocolVersion(0, 9, 1)),
        (PROTOCOL_HEADER_0_9, ProtocolVersion(0, 9, 0)),
    ],
)
def test_protocol_headers_of_0_9_1_and_0_9_are_accepted_byte_by_byte(
    header: bytes, version: ProtocolVersion
) -> None:
    for length in range(8):
        assert parse_protocol_header(header[:length]) == (None, 0)
    assert parse_protocol_header(header + b"\x01\x00") == (version, 8)


@pytest.mark.parametrize(
    ("data", "bad_at"),
    [
        (b"GET / HTTP/1.1\r\n", 0),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01", 0),
        (b"AMQP\x00\x00\x09\x00", 7),
        (b"AMQP\x00\x00\x08\x00", 6),
        (b"AMQP\x03\x01\x00\x00", 4),
        (b"AMQP\x01\x01\x00\x0a", 7),
    ],
)
def test_other_protocol_headers_fail_on_their_first_wrong_byte(data: bytes, bad_at: int) -> None:
    for length in range(bad_at + 1):
        assert parse_protocol_header(data[:length]) == (None, 0)
    with pytest.raises(ProtocolHeaderMismatch, match="unsupported protocol header") as caught:
        parse_protocol_header(data[: bad_at + 1])
    assert caught.value.received == data[: bad_at + 1]
    assert caught.value.supported_header == PROTOCOL_HEADER_0_9_1
    assert caught.value.reply_code == 501
    with pytest.raises(ProtocolHeaderMismatch):
        parse_protocol_header(data)


def test_heartbeat_checks_follow_rabbitmq() -> None:
    check_heartbeat_frame(Frame(8, ChannelId(0), b""))
    with pytest.raises(FrameError, match='type 8, all octets = <<"x">>: unknown_frame'):
        check_heartbeat_frame(Frame(8, ChannelId(0), b"x"))
    with pytest.raises(UnexpectedFrame, match="type 8, all octets = <<>>"):
        check_heartbeat_frame(Frame(8, ChannelId(3), b""))
