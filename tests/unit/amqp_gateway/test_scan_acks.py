"""The C accelerator `scan_acks`: a run of basic.ack, basic.nack and basic.reject methods
on one channel split from a buffer.

Its contract is an oracle: reading frame after frame with `read_frame` and
`decode_method` (the frame-by-frame path) and taking acks, nacks and rejects of the first
one's channel, with empty heartbeats skipped between two of them, must give the same
tags, kinds and `end`, for valid streams, for every byte of a valid stream changed to
other values, for streams cut at any byte and for random bytes. The rules also have tests
of their own, so a regression names the rule it broke.
"""

from __future__ import annotations

import struct
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.codec.frame import received_payload_max
from amqp_gateway.errors import AMQPError

FRAME_MAX = 131072
PAYLOAD_MAX = received_payload_max(FRAME_MAX)
HEARTBEAT = codec.HEARTBEAT_FRAME
ACK_FRAME_BYTES = 21
_FRAME = struct.Struct(">BHIHHQB")
_METHOD_IDS = {"ack": 80, "reject": 90, "nack": 120}
Scan = tuple[int, int, list[int], bytes, int]


def ack_frame(tag: int, channel: int = 1, kind: str = "ack", bits: int = 0) -> bytes:
    """One method frame; `bits` may set any of the 8 bits of the last octet."""
    return _FRAME.pack(1, channel, 13, 60, _METHOD_IDS[kind], tag, bits) + b"\xce"


def kind_of(method: m.Method) -> int:
    if isinstance(method, m.BasicAck):
        return codec.ACK_MULTIPLE if method.multiple else 0
    if isinstance(method, m.BasicNack):
        return (
            codec.ACK_NACK
            | (codec.ACK_MULTIPLE if method.multiple else 0)
            | (codec.ACK_REQUEUE if method.requeue else 0)
        )
    assert isinstance(method, m.BasicReject)
    return codec.ACK_REJECT | (codec.ACK_REQUEUE if method.requeue else 0)


def oracle(data: bytes, position: int = 0, count_max: int = 1000) -> Scan:
    """What the frame-by-frame path reads: frames accepted by read_frame and
    decode_method, acks, nacks and rejects on the first one's channel."""
    channel, end, tags, kinds = 0, position, [], bytearray()
    at = position
    while len(tags) < count_max:
        try:
            frame, after = codec.read_frame(data, at, PAYLOAD_MAX)
            if frame is None:
                break
            if frame.frame_type == codec.FRAME_HEARTBEAT and tags:
                codec.check_heartbeat_frame(frame)
                at = after
                continue
            if frame.frame_type != codec.FRAME_METHOD or (tags and frame.channel != channel):
                break
            method = codec.decode_method(frame.payload)
        except AMQPError:
            break
        if not isinstance(method, m.BasicAck | m.BasicNack | m.BasicReject):
            break
        channel = frame.channel
        tags.append(method.delivery_tag)
        kinds.append(kind_of(method))
        at = end = after
    flags = 0
    for kind in kinds:
        flags |= kind
    return (channel if tags else 0), end, tags, bytes(kinds), flags


def scan(data: bytes, position: int = 0, count_max: int = 1000) -> Scan:
    return codec.scan_acks(data, position, PAYLOAD_MAX, count_max)


def test_a_run_of_acks_nacks_and_rejects_keeps_their_order_and_bits() -> None:
    data = (
        ack_frame(1)
        + ack_frame(2, bits=1)
        + ack_frame(3, kind="nack", bits=3)
        + ack_frame(4, kind="nack", bits=0)
        + ack_frame(5, kind="reject", bits=1)
        + ack_frame(6, kind="reject", bits=0)
        + ack_frame(2**64 - 1, bits=0xFE)  # undefined bits are ignored, as decode does
    )
    mult, req, nack, rej = codec.ACK_MULTIPLE, codec.ACK_REQUEUE, codec.ACK_NACK, codec.ACK_REJECT
    kinds = bytes([0, mult, nack | mult | req, nack, rej | req, rej, 0])
    expected = (1, len(data), [1, 2, 3, 4, 5, 6, 2**64 - 1], kinds, mult | req | nack | rej)
    assert scan(data) == expected
    assert oracle(data) == expected


def test_nothing_accepted_returns_the_position() -> None:
    data = b"\x00" * 5 + ack_frame(1, channel=0)[:-1]
    assert scan(data, 5) == (0, 5, [], b"", 0)
    assert scan(b"") == (0, 0, [], b"", 0)


def test_a_frame_on_another_channel_ends_the_run() -> None:
    data = ack_frame(1, channel=1) + ack_frame(2, channel=2) + ack_frame(3, channel=1)
    assert scan(data) == (1, ACK_FRAME_BYTES, [1], b"\x00", 0)
    assert scan(data, ACK_FRAME_BYTES) == (2, 2 * ACK_FRAME_BYTES, [2], b"\x00", 0)


def test_count_max_bounds_the_run() -> None:
    data = b"".join(ack_frame(tag) for tag in range(1, 11))
    assert scan(data, count_max=3)[:3] == (1, 3 * ACK_FRAME_BYTES, [1, 2, 3])
    assert scan(data, 3 * ACK_FRAME_BYTES, count_max=100)[2] == list(range(4, 11))


def test_heartbeats_are_skipped_between_acks_only() -> None:
    one, two = ack_frame(1), ack_frame(2)
    assert scan(one + HEARTBEAT + HEARTBEAT + two) == (1, 58, [1, 2], b"\x00\x00", 0)
    # Before the first ack or after the last, the frame-by-frame path reads it.
    assert scan(HEARTBEAT + one)[1] == 0
    assert scan(one + HEARTBEAT)[1] == ACK_FRAME_BYTES
    assert scan(one + HEARTBEAT + ack_frame(2, channel=2))[1] == ACK_FRAME_BYTES


@pytest.mark.parametrize(
    "heartbeat",
    [
        b"\x08\x00\x01\x00\x00\x00\x00\xce",  # channel 1: UNEXPECTED_FRAME
        b"\x08\x00\x00\x00\x00\x00\x01\x00\xce",  # a payload: FRAME_ERROR
        b"\x08\x00\x00\x00\x00\x00\x00\x00",  # bad frame end
    ],
)
def test_a_heartbeat_the_frame_path_refuses_ends_the_run(heartbeat: bytes) -> None:
    data = ack_frame(1) + heartbeat + ack_frame(2)
    assert scan(data)[1] == ACK_FRAME_BYTES
    assert oracle(data)[1] == ACK_FRAME_BYTES


def test_other_methods_stop_the_run() -> None:
    for method in (m.BasicQos(prefetch_count=1), m.BasicRecover(requeue=True), m.TxCommit()):
        other = codec.encode_method_frame(codec.ChannelId(1), method)
        assert scan(ack_frame(1) + other + ack_frame(2))[1] == ACK_FRAME_BYTES


def test_a_frame_over_payload_max_stops_the_run() -> None:
    data = ack_frame(1) + ack_frame(2)
    assert codec.scan_acks(data, 0, 12, 10)[1] == 0
    assert codec.scan_acks(data, 0, 13, 10)[1] == len(data)


@pytest.mark.parametrize("at", range(ACK_FRAME_BYTES))
def test_every_byte_of_a_frame_changed_agrees_with_the_frame_path(at: int) -> None:
    """Each byte of the middle frame of three, set to each of a spread of values (the
    field edges and their neighbours): the scan stops exactly where the oracle does, so
    every malformed frame falls back, and every still valid one (another tag, other
    bits, nack for ack) is read the same way."""
    data = ack_frame(1) + ack_frame(2) + ack_frame(3)
    for value in (0, 1, 2, 3, 7, 8, 12, 13, 14, 60, 80, 90, 120, 0x7F, 0xCE, 0xFF):
        changed = bytearray(data)
        changed[ACK_FRAME_BYTES + at] = value
        assert scan(bytes(changed)) == oracle(bytes(changed)), (at, value)


def test_a_stream_cut_at_any_byte_keeps_the_whole_frames_only() -> None:
    data = ack_frame(1) + HEARTBEAT + ack_frame(2, kind="nack", bits=2) + ack_frame(3)
    for cut in range(len(data) + 1):
        assert scan(data[:cut]) == oracle(data[:cut]), cut


@settings(max_examples=300)
@given(
    frames=st.lists(
        st.tuples(
            st.sampled_from(["ack", "nack", "reject", "heartbeat"]),
            st.integers(0, 2**64 - 1),
            st.integers(0, 255),
            st.sampled_from([1, 1, 1, 2]),
        ),
        max_size=12,
    ),
    position=st.integers(0, 3),
    count_max=st.integers(1, 14),
)
def test_generated_streams_agree_with_the_frame_path(
    frames: list[tuple[str, int, int, int]], position: int, count_max: int
) -> None:
    data = b"\x00" * position + b"".join(
        HEARTBEAT if kind == "heartbeat" else ack_frame(tag, channel, kind, bits)
        for kind, tag, bits, channel in frames
    )
    assert scan(data, position, count_max) == oracle(data, position, count_max)


@given(st.binary(max_size=200))
def test_random_bytes_never_crash_and_agree_with_the_frame_path(data: bytes) -> None:
    assert scan(data) == oracle(data)


def test_the_scan_keeps_no_references() -> None:
    data = bytearray(ack_frame(1000) + ack_frame(1001))
    before = sys.getrefcount(data)
    tags = scan(data)[2]
    assert sys.getrefcount(data) == before
    data += b"x"  # the buffer export was released, or this raises BufferError
    # Held by the list alone (and getrefcount's argument).
    assert [sys.getrefcount(tags[0]), sys.getrefcount(tags[1])] == [2, 2]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((b"", 0, 13), TypeError, "takes 4 arguments"),
        (("text", 0, 13, 1), TypeError, "bytes-like"),
        ((b"", 1, 13, 1), ValueError, "past the end"),
        ((b"", -1, 13, 1), ValueError, "position must be >= 0"),
        ((b"", 0, 13, 0), ValueError, "count_max must be >= 1"),
        ((b"", 0, 1.5, 1), TypeError, "integer"),
    ],
)
def test_bad_arguments_raise(args: tuple[object, ...], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        codec.scan_acks(*args)  # type: ignore[arg-type]  # wrong on purpose
