"""Fuzzing the decoders: whatever bytes arrive, the only exceptions that leave the codec
are the typed ConnectionExceptions (no struct.error, IndexError, UnicodeDecodeError,
RecursionError...). Random bytes reach the framing checks; random payloads behind valid
method ids and mutated valid streams reach the field decoders."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_gateway.codec.basic import read_basic_publish
from amqp_gateway.codec.content import decode_content_header
from amqp_gateway.codec.frame import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    Frame,
    check_heartbeat_frame,
    parse_protocol_header,
    split_frames,
)
from amqp_gateway.codec.ids import ChannelId, DeliveryTag
from amqp_gateway.codec.method_frame import (
    append_content_frames,
    append_method_frame,
    decode_method,
)
from amqp_gateway.codec.methods import METHOD_TYPES, BasicPublish, ConnectionStartOk, QueueDeclare
from amqp_gateway.codec.properties import BasicProperties, decode_properties, encode_properties
from amqp_gateway.codec.values import decode_array, decode_table
from amqp_gateway.errors import ConnectionException

DECODERS: list[Callable[[bytes], object]] = [
    lambda data: split_frames(data, 4096),
    parse_protocol_header,
    decode_method,
    read_basic_publish,
    decode_content_header,
    decode_properties,
    decode_table,
    decode_array,
]


def only_typed_errors(decode: Callable[[bytes], object], data: bytes) -> None:
    with contextlib.suppress(ConnectionException):
        decode(data)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_typed_errors(data: bytes) -> None:
    for decode in DECODERS:
        only_typed_errors(decode, data)


@settings(max_examples=300)
@given(st.sampled_from(sorted(METHOD_TYPES)), st.binary(max_size=120))
def test_random_payloads_behind_valid_method_ids_raise_only_typed_errors(
    key: tuple[int, int], tail: bytes
) -> None:
    only_typed_errors(
        decode_method, bytes([key[0] >> 8, key[0] & 255, key[1] >> 8, key[1] & 255]) + tail
    )


def receive(data: bytes) -> None:
    """The whole receive path a protocol layer runs over one read."""
    frames, _ = split_frames(data, 4096)
    handlers: dict[int, Callable[[Frame], object]] = {
        FRAME_METHOD: lambda f: decode_method(f.payload),
        FRAME_HEADER: lambda f: decode_properties(decode_content_header(f.payload).properties_raw),
        FRAME_BODY: lambda f: f.payload,
        FRAME_HEARTBEAT: check_heartbeat_frame,
    }
    for frame in frames:
        handlers[frame.frame_type](frame)


def valid_stream() -> bytes:
    out = bytearray()
    channel = ChannelId(1)
    append_method_frame(
        out, channel, ConnectionStartOk({"product": "x", "n": [1, 2.5]}, "PLAIN", b"\0u\0p")
    )
    append_method_frame(out, channel, QueueDeclare(queue="q", arguments={"x-queue-type": "stream"}))
    properties = encode_properties(
        BasicProperties(content_type="t", headers={"h": {"a": 1}}, timestamp=5)
    )
    append_content_frames(
        out, channel, BasicPublish(exchange="e", routing_key="r"), properties, b"body", 4096
    )
    out += b"\x08\x00\x00\x00\x00\x00\x00\xce"
    append_method_frame(out, channel, METHOD_TYPES[60, 80](DeliveryTag(9), True))
    return bytes(out)


VALID = valid_stream()


@settings(max_examples=400)
@given(
    st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=4)
)
def test_mutated_valid_streams_raise_only_typed_errors(mutations: list[tuple[int, int]]) -> None:
    data = bytearray(VALID)
    for position, value in mutations:
        data[position] = value
    with contextlib.suppress(ConnectionException):
        receive(bytes(data))


def test_the_unmutated_stream_decodes() -> None:
    receive(VALID)
