"""The sans-IO AMQP 0-9-1 codec: pure bytes <-> frames functions (STYLE.md section 2).

This package owns the wire format and nothing else. It has no sockets, no asyncio, no
clock and no global mutable state; every function takes bytes (or appends to a caller's
bytearray) and reports what it consumed. Connection and channel state, content assembly
and the meaning of methods belong to the protocol layer above it.

Malformed input raises only the typed `ConnectionException`s of `amqp_gateway.errors`:
`FrameError` (501) for framing, `AMQPSyntaxError` (502) for undecodable fields,
`AMQPNotImplemented` (540) for unknown methods, `UnexpectedFrame` (505) for a heartbeat
off channel 0. Encoders raise `ValueError` for values the wire cannot carry.

Modules, by what they own: `frame` (envelope, protocol header, `split_frames`),
`values` (strings, field tables and arrays), `spec` (the protocol table), `methods`
(generated dataclasses), `method_frame` (generic method payloads), `properties` (basic
properties), `content` (content header and body frames), `basic` (the per-message fast
paths) and `ids` (the `NewType`s).
"""

from __future__ import annotations

from amqp_gateway.codec._deliver import deliver_records, deliver_stream_records, encode_deliver
from amqp_gateway.codec._scan import (
    ACK_MULTIPLE,
    ACK_NACK,
    ACK_REJECT,
    ACK_REQUEUE,
    scan_acks,
    scan_publishes,
)
from amqp_gateway.codec.basic import (
    BASIC_PUBLISH_IDS,
    PublishedMessage,
    append_basic_ack,
    decode_basic_ack,
    decode_basic_publish,
    read_basic_publish,
    read_publish,
)
from amqp_gateway.codec.content import (
    ContentHeader,
    append_body_frames,
    append_content_header_frame,
    decode_content_header,
)
from amqp_gateway.codec.frame import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    FRAME_OVERHEAD_BYTES,
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
    split_frames,
)
from amqp_gateway.codec.ids import ChannelId, DeliveryTag
from amqp_gateway.codec.method_frame import (
    append_content_frames,
    append_method_frame,
    decode_method,
    encode_method_frame,
    encode_method_payload,
)
from amqp_gateway.codec.methods import METHOD_TYPES, AnyMethod, Method
from amqp_gateway.codec.properties import (
    EMPTY_PROPERTIES_RAW,
    BasicProperties,
    decode_properties,
    encode_properties,
)
from amqp_gateway.codec.values import (
    FieldArray,
    FieldTable,
    FieldValue,
    Float32,
    Int8,
    Int16,
    Int64,
    Timestamp,
    UInt8,
    UInt16,
    UInt32,
    decode_array,
    decode_table,
    encode_array,
    encode_table,
)

__all__ = [
    "ACK_MULTIPLE",
    "ACK_NACK",
    "ACK_REJECT",
    "ACK_REQUEUE",
    "BASIC_PUBLISH_IDS",
    "EMPTY_PROPERTIES_RAW",
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "FRAME_MIN_SIZE",
    "FRAME_OVERHEAD_BYTES",
    "HEARTBEAT_FRAME",
    "METHOD_TYPES",
    "PROTOCOL_HEADER_0_9",
    "PROTOCOL_HEADER_0_9_1",
    "AnyMethod",
    "BasicProperties",
    "ChannelId",
    "ContentHeader",
    "DeliveryTag",
    "FieldArray",
    "FieldTable",
    "FieldValue",
    "Float32",
    "Frame",
    "FrameType",
    "Int8",
    "Int16",
    "Int64",
    "Method",
    "ProtocolVersion",
    "PublishedMessage",
    "Timestamp",
    "UInt8",
    "UInt16",
    "UInt32",
    "append_basic_ack",
    "append_body_frames",
    "append_content_frames",
    "append_content_header_frame",
    "append_frame",
    "append_method_frame",
    "check_heartbeat_frame",
    "decode_array",
    "decode_basic_ack",
    "decode_basic_publish",
    "decode_content_header",
    "decode_method",
    "decode_properties",
    "decode_table",
    "deliver_records",
    "deliver_stream_records",
    "encode_array",
    "encode_deliver",
    "encode_frame",
    "encode_heartbeat_frame",
    "encode_method_frame",
    "encode_method_payload",
    "encode_properties",
    "encode_table",
    "parse_protocol_header",
    "read_basic_publish",
    "read_frame",
    "read_publish",
    "scan_acks",
    "scan_publishes",
    "split_frames",
]
