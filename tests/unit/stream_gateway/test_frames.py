"""The stream protocol codec: round trips, RabbitMQ's exact bytes, and refused input.

Every command class gets at least one sample; each sample must survive encode -> split ->
decode, byte at a time and all at once, and every strict prefix of its frame must be
refused with the codec's own error, never another exception.
"""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_gateway.codec import (
    FrameTooLarge,
    MalformedFrame,
    StreamCodecError,
    UnknownFrame,
    check_frame_size,
    decode,
    encode,
    split_frames,
)
from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import Key, OffsetType, ResponseCode
from stream_gateway.codec.encoders import ENCODERS

FRAME_MAX = 1 << 20
OK = ResponseCode.OK

SAMPLES: list[c.Command] = [
    c.PeerProperties(1, {"product": "rstream", "version": "0.20"}),
    c.PeerPropertiesResponse(1, OK, {"product": "streamq"}),
    c.SaslHandshake(2),
    c.SaslHandshakeResponse(2, OK, ("PLAIN", "AMQPLAIN")),
    c.SaslAuthenticate(3, "PLAIN", b"\x00guest\x00guest"),
    c.SaslAuthenticate(3, "ANONYMOUS", None),
    c.SaslAuthenticateResponse(3, OK),
    c.SaslAuthenticateResponse(3, ResponseCode.SASL_CHALLENGE, b"challenge"),
    c.Tune(1_048_576, 60),
    c.TuneResponse(1_048_576, 0),
    c.Open(4, "/"),
    c.OpenResponse(4, OK, {"advertised_host": "localhost", "advertised_port": "5552"}),
    c.OpenResponse(4, ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE),
    c.Close(5, 1, "OK"),
    c.Response(Key.CLOSE, 5, OK),
    c.Heartbeat(),
    c.Create(6, "s1", {"max-length-bytes": "1000000", "max-age": "1h"}),
    c.Response(Key.CREATE, 6, ResponseCode.STREAM_ALREADY_EXISTS),
    c.Delete(7, "s1"),
    c.Response(Key.DELETE, 7, OK),
    c.Metadata(8, ("s1", "s2")),
    c.MetadataResponse(
        8,
        (c.Broker(0, "localhost", 5552), c.Broker(1, "other", 5553)),
        (
            c.StreamMetadata("s1", OK, 0, (1,)),
            c.StreamMetadata("s2", ResponseCode.STREAM_DOES_NOT_EXIST, 0xFFFF, ()),
        ),
    ),
    c.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, "s1"),
    c.DeclarePublisher(9, 1, "producer-a", "s1"),
    c.Response(Key.DECLARE_PUBLISHER, 9, OK),
    c.DeletePublisher(10, 1),
    c.Response(Key.DELETE_PUBLISHER, 10, ResponseCode.PUBLISHER_DOES_NOT_EXIST),
    c.Publish(1, (c.PublishedMessage(1, b"hello"), c.PublishedMessage(2, b""))),
    c.Publish(
        1,
        (c.PublishedMessage(3, b"x", "eu"), c.PublishedMessage(4, b"y", None)),
        version=2,
    ),
    c.PublishConfirm(1, (1, 2, 2**64 - 1)),
    c.PublishError(1, (c.PublishingError(5, ResponseCode.STREAM_DOES_NOT_EXIST),)),
    c.QueryPublisherSequence(11, "producer-a", "s1"),
    c.QueryPublisherSequenceResponse(11, OK, 42),
    *[
        c.Subscribe(12, 0, "s1", c.OffsetSpec(offset_type), 10)
        for offset_type in (OffsetType.FIRST, OffsetType.LAST, OffsetType.NEXT)
    ],
    c.Subscribe(12, 1, "s1", c.OffsetSpec(OffsetType.OFFSET, 2**63), 10, {"name": "app"}),
    c.Subscribe(12, 2, "s1", c.OffsetSpec(OffsetType.TIMESTAMP, -1), 1, {"filter.0": "eu"}),
    c.Response(Key.SUBSCRIBE, 12, OK),
    c.Credit(1, 5),
    c.CreditResponse(ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST, 1),
    c.Deliver(1, b"\x50\x00chunk-bytes"),
    c.Deliver(1, b"\x50\x00chunk-bytes", committed_offset=99, version=2),
    c.Unsubscribe(13, 1),
    c.Response(Key.UNSUBSCRIBE, 13, OK),
    c.StoreOffset("app", "s1", 1234),
    c.QueryOffset(14, "app", "s1"),
    c.QueryOffsetResponse(14, ResponseCode.NO_OFFSET, 0),
    c.StreamStats(15, "s1"),
    c.StreamStatsResponse(15, OK, {"first_chunk_id": 0, "committed_chunk_id": -1}),
    c.ExchangeCommandVersions(16, (c.CommandVersion(Key.PUBLISH, 1, 2),)),
    c.ExchangeCommandVersionsResponse(16, OK, (c.CommandVersion(Key.DELIVER, 1, 2),)),
    c.ConsumerUpdate(17, 1, True),
    c.ConsumerUpdate(17, 1, False),
    c.ConsumerUpdateResponse(17, OK, c.OffsetSpec(OffsetType.NEXT)),
    c.ConsumerUpdateResponse(17, OK, c.OffsetSpec(OffsetType.OFFSET, 7)),
    c.ConsumerUpdateResponse(17, OK, c.OffsetSpec(OffsetType.NONE, 0)),
    c.Route(18, "key-1", "super"),
    c.RouteResponse(18, OK, ("super-0",)),
    c.Partitions(19, "super"),
    c.PartitionsResponse(19, OK, ("super-0", "super-1", "super-2")),
    c.CreateSuperStream(20, "super", ("super-eu", "super-us"), ("eu", "us"), {"max-age": "1h"}),
    c.Response(Key.CREATE_SUPER_STREAM, 20, OK),
    c.DeleteSuperStream(21, "super"),
    c.Response(Key.DELETE_SUPER_STREAM, 21, ResponseCode.STREAM_DOES_NOT_EXIST),
]


def test_every_command_class_has_a_sample() -> None:
    assert set(ENCODERS) == {type(sample) for sample in SAMPLES}


@pytest.mark.parametrize("command", SAMPLES, ids=lambda cmd: type(cmd).__name__)
def test_round_trip(command: c.Command) -> None:
    wire = encode(command)
    frames, consumed = split_frames(wire, FRAME_MAX)
    assert consumed == len(wire)
    assert [decode(frame) for frame in frames] == [command]


def test_split_byte_at_a_time_and_all_at_once() -> None:
    wire = b"".join(encode(command) for command in SAMPLES)
    frames, consumed = split_frames(wire, FRAME_MAX)
    assert consumed == len(wire)
    assert [decode(frame) for frame in frames] == SAMPLES

    buffer = bytearray()
    decoded: list[c.Command] = []
    for byte in wire:
        buffer.append(byte)
        frames, consumed = split_frames(buffer, FRAME_MAX)
        del buffer[:consumed]
        decoded += [decode(frame) for frame in frames]
    assert decoded == SAMPLES
    assert not buffer


def test_encode_appends_to_a_shared_buffer() -> None:
    out = bytearray()
    first = encode(c.Heartbeat(), out)
    second = encode(c.Credit(1, 1), out)
    assert bytes(out) == first + second


# -- RabbitMQ's exact bytes ----------------------------------------------------------------


def test_heartbeat_bytes() -> None:
    assert encode(c.Heartbeat()) == bytes.fromhex("00000004 0017 0001")


def test_tune_bytes() -> None:
    assert encode(c.Tune(1_048_576, 60)) == bytes.fromhex("0000000c 0014 0001 00100000 0000003c")
    assert encode(c.TuneResponse(0, 0))[4:6] == bytes.fromhex("8014")


def test_stream_stats_request_bytes() -> None:
    # rabbitmq-stream-go-client's stream_stats test: correlation id 3, stream "mystream".
    body = bytes.fromhex("00000003 0008") + b"mystream"
    assert encode(c.StreamStats(3, "mystream")) == (
        struct.pack(">IHH", 4 + len(body), 0x001C, 1) + body
    )


def test_stream_stats_response_bytes() -> None:
    # The same test's response: two statistics, cpu=50 and mem=25.
    body = bytes.fromhex(
        "00000003 0001 00000002 0003 637075 0000000000000032 0003 6d656d 0000000000000019"
    )
    frame = struct.pack(">HH", 0x801C, 1) + body
    assert decode(frame) == c.StreamStatsResponse(3, OK, {"cpu": 50, "mem": 25})


def test_consumer_update_query_bytes() -> None:
    # rabbitmq-stream-go-client: correlation id 123, subscription 3, active.
    frame = struct.pack(">HH", 0x001A, 1) + bytes.fromhex("0000007b 03 01")
    assert decode(frame) == c.ConsumerUpdate(123, 3, True)


def test_credit_and_credit_response_bytes() -> None:
    assert encode(c.Credit(2, 10)) == bytes.fromhex("00000007 0009 0001 02 000a")
    # Credit's response has no correlation id (rabbit_stream_core's special case).
    assert encode(c.CreditResponse(4, 2)) == bytes.fromhex("00000007 8009 0001 0004 02")


def test_publish_v1_and_v2_bytes() -> None:
    v1 = c.Publish(7, (c.PublishedMessage(1, b"hi"),))
    assert encode(v1) == bytes.fromhex(
        "00000017 0002 0001 07 00000001 0000000000000001 00000002 6869"
    )
    v2 = c.Publish(7, (c.PublishedMessage(1, b"hi", "eu"),), version=2)
    assert encode(v2) == bytes.fromhex(
        "0000001b 0002 0002 07 00000001 0000000000000001 0002 6575 00000002 6869"
    )


def test_subscribe_without_properties_omits_the_map() -> None:
    # rabbit_stream_core writes no property count when there are no properties.
    wire = encode(c.Subscribe(1, 0, "s", c.OffsetSpec(OffsetType.FIRST), 10))
    assert wire == bytes.fromhex("00000010 0007 0001 00000001 00 0001 73 0001 000a")


def test_subscribe_with_timestamp_is_signed() -> None:
    wire = encode(c.Subscribe(1, 0, "s", c.OffsetSpec(OffsetType.TIMESTAMP, -2), 1))
    assert wire[-10:-2] == struct.pack(">q", -2)


def test_open_response_without_properties_omits_the_map() -> None:
    assert encode(c.OpenResponse(4, ResponseCode.ACCESS_REFUSED)) == bytes.fromhex(
        "0000000a 8015 0001 00000004 0010"
    )


def test_null_publisher_reference_reads_as_empty() -> None:
    frame = struct.pack(">HHIBh", 0x0001, 1, 9, 1, -1) + b"\x00\x01s"
    assert decode(frame) == c.DeclarePublisher(9, 1, "", "s")


# -- refused input -------------------------------------------------------------------------


@pytest.mark.parametrize("command", SAMPLES, ids=lambda cmd: type(cmd).__name__)
def test_every_truncation_is_refused(command: c.Command) -> None:
    frame = encode(command)[4:]
    for cut in range(len(frame)):
        if isinstance(command, c.Deliver) and cut >= (13 if command.version == 2 else 5):
            continue  # the chunk is opaque bytes: any length of it is a valid Deliver
        if (
            isinstance(command, c.OpenResponse | c.Subscribe)
            and command.properties
            and cut == len(frame) - _map_bytes(command.properties)
        ):
            continue  # the map is optional: cutting it off exactly leaves a valid frame
        if isinstance(command, c.SaslAuthenticateResponse) and cut == 10:
            continue  # the challenge is optional
        if (
            isinstance(command, c.ConsumerUpdateResponse)
            and cut == 12
            and command.offset_spec.offset_type not in (OffsetType.OFFSET, OffsetType.TIMESTAMP)
        ):
            continue  # clients differ on sending 8 value bytes after FIRST/LAST/NEXT/NONE
        with pytest.raises(StreamCodecError):
            decode(frame[:cut])


def _map_bytes(values: dict[str, str]) -> int:
    return 4 + sum(4 + len(k.encode()) + len(v.encode()) for k, v in values.items())


@pytest.mark.parametrize("command", SAMPLES, ids=lambda cmd: type(cmd).__name__)
def test_trailing_bytes_are_refused(command: c.Command) -> None:
    if isinstance(command, c.Deliver):
        return  # the chunk runs to the end of the frame
    frame = encode(command)[4:] + b"\x00\x00\x00\x00\x00"
    # After an optional part, the extra bytes start that part and fall short of it.
    with pytest.raises(MalformedFrame, match=r"trailing|truncated"):
        decode(frame)


def test_unknown_key_is_refused() -> None:
    with pytest.raises(UnknownFrame, match="0x0063"):
        decode(struct.pack(">HH", 0x63, 1))
    with pytest.raises(UnknownFrame, match="0x8002"):
        decode(struct.pack(">HH", 0x8002, 1))  # Publish has no response


def test_unsupported_version_is_refused() -> None:
    with pytest.raises(UnknownFrame, match="version 2"):
        decode(struct.pack(">HH", Key.HEARTBEAT, 2))
    with pytest.raises(UnknownFrame, match="version 3"):
        decode(struct.pack(">HHB", Key.DELIVER, 3, 0))
    with pytest.raises(UnknownFrame, match="version 0"):
        decode(struct.pack(">HH", Key.TUNE, 0) + bytes(8))


def test_bad_offset_type_is_refused() -> None:
    frame = bytearray(encode(c.Subscribe(1, 0, "s", c.OffsetSpec(OffsetType.FIRST), 10))[4:])
    frame[12:14] = struct.pack(">H", 9)
    with pytest.raises(MalformedFrame, match="offset type 9"):
        decode(bytes(frame))
    frame[12:14] = struct.pack(">H", 0)  # NONE is only for a ConsumerUpdate response
    with pytest.raises(MalformedFrame, match="offset type 0"):
        decode(bytes(frame))


def test_bad_utf8_and_negative_lengths_are_refused() -> None:
    with pytest.raises(MalformedFrame, match="UTF-8"):
        decode(struct.pack(">HHIH", Key.OPEN, 1, 1, 1) + b"\xff")
    with pytest.raises(MalformedFrame, match="negative string"):
        decode(struct.pack(">HHIh", Key.OPEN, 1, 1, -2))
    with pytest.raises(MalformedFrame, match="array count"):
        decode(struct.pack(">HHIi", Key.METADATA, 1, 1, -5))
    with pytest.raises(MalformedFrame, match="null message"):
        decode(struct.pack(">HHBiQi", Key.PUBLISH, 1, 1, 1, 1, -1))


def test_huge_array_count_is_refused_before_allocating() -> None:
    with pytest.raises(MalformedFrame, match="array count"):
        decode(struct.pack(">HHBi", Key.PUBLISH_CONFIRM, 1, 1, 2**31 - 1))


def test_consumer_update_active_must_be_boolean() -> None:
    with pytest.raises(MalformedFrame, match="active"):
        decode(struct.pack(">HHIBB", Key.CONSUMER_UPDATE, 1, 1, 1, 2))


def test_oversized_frame_refused_from_its_header() -> None:
    # Only the 4-byte size header has arrived: the refusal must not wait for the body.
    header = struct.pack(">I", 1025)
    with pytest.raises(FrameTooLarge, match="1029 bytes exceeds frame_max 1024") as info:
        split_frames(header, 1024)
    assert info.value.response_code == ResponseCode.FRAME_TOO_LARGE
    frames, consumed = split_frames(struct.pack(">I", 1020) + bytes(1020), 1024)
    assert consumed == 1024
    assert len(frames) == 1


def test_size_too_small_for_a_header_is_refused() -> None:
    with pytest.raises(MalformedFrame, match="frame size 3"):
        split_frames(struct.pack(">I", 3) + bytes(3), FRAME_MAX)
    with pytest.raises(MalformedFrame):
        check_frame_size(0, FRAME_MAX)
    with pytest.raises(MalformedFrame, match="cannot hold"):
        decode(b"\x00")


def test_partial_frame_waits() -> None:
    wire = encode(c.Open(1, "/"))
    assert split_frames(wire[:-1], FRAME_MAX) == ([], 0)
    assert split_frames(wire[:3], FRAME_MAX) == ([], 0)


def test_encode_refuses_values_the_wire_cannot_carry() -> None:
    with pytest.raises(ValueError, match="int16"):
        encode(c.Open(1, "v" * 40_000))
    with pytest.raises(ValueError, match="Credit"):
        encode(c.Credit(256, 1))


@given(st.binary(max_size=64))
def test_random_frames_raise_only_codec_errors(frame: bytes) -> None:
    with contextlib.suppress(StreamCodecError):
        decode(frame)


@given(st.sampled_from(list(ENCODERS)), st.binary(max_size=48))
def test_random_bodies_raise_only_codec_errors(cls: type[c.Command], body: bytes) -> None:
    key = ENCODERS[cls][0] or (Key.SUBSCRIBE | 0x8000)
    for version in (1, 2):
        with contextlib.suppress(StreamCodecError):
            decode(struct.pack(">HH", key, version) + body)


@given(st.binary(max_size=256), st.integers(min_value=9, max_value=512))
def test_random_buffers_split_or_raise_codec_errors(buffer: bytes, frame_max: int) -> None:
    try:
        frames, consumed = split_frames(buffer, frame_max)
    except StreamCodecError:
        return
    assert 0 <= consumed <= len(buffer)
    assert sum(len(frame) + 4 for frame in frames) == consumed
