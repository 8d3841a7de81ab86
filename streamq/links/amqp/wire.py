"""The client's sans-IO hot path: whole receive buffers to events, publishes to bytes.

Owns what every message costs a link (STYLE.md section 11):
- `scan`, one loop over every complete frame of a read with `struct.unpack_from`: a
  basic.deliver whose content header and single body frame are all in the buffer
  becomes a `Delivery` at once (the common case), consecutive deliveries of one consumer
  become one `DeliveryRun`, confirms (basic.ack/nack from the broker) become `Confirm`s,
  and any other method stays a `MethodFrame` for the codec to decode. Content split over
  reads or over several body frames is assembled per channel (`Assembly`), within
  `BODY_BYTES_MAX`.
- `PublishWriter`, basic.publish method frames encoded once per (exchange, routing key,
  mandatory) by the codec, then per message one header frame and the body frames.

Malformed input raises the codec's typed errors: `FrameError` (501) for framing,
`UnexpectedFrame` (505) for content out of order, `AMQPSyntaxError` (502) for fields.
No sockets, clock or asyncio here; the protocol in `client.py` feeds it.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.errors import AMQPSyntaxError, FrameError, UnexpectedFrame

BODY_BYTES_MAX: Final = 128 << 20
"""The largest message body accepted (RabbitMQ's default max_message_size)."""
PUBLISH_METHODS_CACHED_MAX: Final = 1024
"""Encoded basic.publish method frames kept for reuse, by destination."""

_ENVELOPE = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_TAG_BITS = struct.Struct(">QB")
_HEADER = struct.Struct(">BHIHHQ")  # envelope, class, weight, body size
_BODY_ENVELOPE = struct.Struct(">BHI")
# basic.deliver up to its consumer tag: envelope, class and method ids, the tag's length.
_DELIVER_HEAD = struct.Struct(">BHIIB")
_DELIVER_HEAD_BYTES: Final = 12
_DELIVER_FIELDS = struct.Struct(">QBB")  # delivery tag, redelivered, exchange's length
_new_tuple = tuple.__new__  # builds a NamedTuple without its constructor's overhead
_DELIVER_IDS: Final = 60 << 16 | 60
_RETURN_IDS: Final = 60 << 16 | 50
_ACK_IDS: Final = 60 << 16 | 80
_NACK_IDS: Final = 60 << 16 | 120
_HEADER_FIXED_BYTES: Final = 12  # class, weight, body size
_PROPERTY_FLAGS_BYTES: Final = 2
_BASIC: Final = 60
_FRAME_END_BYTES: Final = b"\xce"


class Delivery(NamedTuple):
    """One message from basic.deliver: `properties` are the encoded basic properties (as
    `amqp_gateway.codec.encode_properties` writes them), ready to publish again."""

    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes


class DeliveryRun(NamedTuple):
    """Consecutive deliveries to one consumer, in order."""

    channel: int
    consumer_tag: str
    deliveries: list[Delivery]


class Confirm(NamedTuple):
    """basic.ack (ack=True) or basic.nack from the broker: a publisher confirm."""

    channel: int
    delivery_tag: int
    multiple: bool
    ack: bool


class MethodFrame(NamedTuple):
    """Any other method, for the codec's `decode_method`."""

    channel: int
    payload: bytes


class Returned(NamedTuple):
    """basic.return with its message: a mandatory publish that no queue took."""

    channel: int
    method: m.BasicReturn
    properties: bytes
    body: bytes


Event = DeliveryRun | Confirm | MethodFrame | Returned


class _Partial:
    """A message whose content is still arriving on one channel."""

    __slots__ = ("body", "body_size", "consumer_tag", "delivery", "properties", "returned")

    def __init__(self, consumer_tag: str, delivery: Delivery | None, returned: m.Method | None):
        self.consumer_tag = consumer_tag
        self.delivery = delivery  # the method fields, body empty
        self.returned = returned
        self.properties: bytes | None = None  # None until the header frame came
        self.body_size = 0
        self.body = bytearray()


class Assembly:
    """Content assembly across reads: the message each channel is in the middle of."""

    def __init__(self) -> None:
        self.partial: dict[int, _Partial] = {}


def scan(
    data: bytearray, position: int, end: int, payload_max: int, assembly: Assembly
) -> tuple[list[Event], int]:
    """Every complete frame of `data[position:end]` as events, and where the first
    incomplete frame starts. Raises FrameError, UnexpectedFrame or AMQPSyntaxError."""
    # Hot path: one loop over the buffer, no object per frame, deliveries taken whole.
    events: list[Event] = []
    run: list[Delivery] | None = None
    run_key: tuple[int, str] = (0, "")
    envelope = _ENVELOPE.unpack_from
    u32 = _U32.unpack_from
    partial = assembly.partial
    while end - position >= 8:
        frame_type, channel, size = envelope(data, position)
        if size > payload_max:
            raise FrameError(f"frame of {size} payload bytes exceeds frame_max {payload_max}")
        frame_end = position + 7 + size
        if frame_end >= end:
            break
        if data[frame_end] != codec.FRAME_END:
            raise FrameError("missing frame-end octet")
        payload = position + 7
        if frame_type == codec.FRAME_METHOD and channel not in partial:
            ids = u32(data, payload)[0] if size >= 4 else 0
            if ids == _DELIVER_IDS:
                consumer_tag, whole, next_position = _deliver_run(data, position, end, payload_max)
                if whole:
                    if run is None or run_key != (channel, consumer_tag):
                        run, run_key = [], (channel, consumer_tag)
                        events.append(DeliveryRun(channel, consumer_tag, run))
                    run.extend(whole)
                    position = next_position
                    continue
                # Content not all here yet (or malformed): the frame-by-frame path.
                consumer_tag, delivery = _read_deliver(data, payload, frame_end)
                partial[channel] = _Partial(consumer_tag, delivery, None)
                run = None
                position = frame_end + 1
                continue
            run = None
            if ids in (_ACK_IDS, _NACK_IDS):
                tag, bits = _TAG_BITS.unpack_from(data, payload + 4)
                events.append(Confirm(channel, tag, bool(bits & 1), ids == _ACK_IDS))
            elif ids == _RETURN_IDS:
                method = codec.decode_method(bytes(data[payload:frame_end]))
                partial[channel] = _Partial("", None, method)
            else:
                events.append(MethodFrame(channel, bytes(data[payload:frame_end])))
        elif frame_type == codec.FRAME_HEARTBEAT:
            if channel != 0:
                raise UnexpectedFrame("heartbeat frame on a channel other than 0")
        else:
            done = _content_frame(partial, frame_type, channel, data, payload, frame_end)
            if done is not None:
                run = _take_done(events, channel, done, run, run_key)
                if run is not None:
                    run_key = (channel, done.consumer_tag)
        position = frame_end + 1
    return events, position


def _take_done(
    events: list[Event],
    channel: int,
    done: _Partial,
    run: list[Delivery] | None,
    run_key: tuple[int, str],
) -> list[Delivery] | None:
    """Emit an assembled message; the delivery run it continues or starts, if any."""
    properties = done.properties or codec.EMPTY_PROPERTIES_RAW
    body = bytes(done.body)
    if done.delivery is None:
        assert isinstance(done.returned, m.BasicReturn), "content is either kind"
        events.append(Returned(channel, done.returned, properties, body))
        return None
    delivery = done.delivery._replace(properties=properties, body=body)
    if run is None or run_key != (channel, done.consumer_tag):
        run = []
        events.append(DeliveryRun(channel, done.consumer_tag, run))
    run.append(delivery)
    return run


def _read_deliver(data: bytearray, payload: int, frame_end: int) -> tuple[str, Delivery]:
    """basic.deliver's fields: consumer tag, then a Delivery without content."""
    try:
        tag_end = payload + 5 + data[payload + 4]
        consumer_tag = data[payload + 5 : tag_end].decode()
        delivery_tag, redelivered = _TAG_BITS.unpack_from(data, tag_end)
        exchange_at = tag_end + 9
        exchange_end = exchange_at + 1 + data[exchange_at]
        exchange = data[exchange_at + 1 : exchange_end].decode()
        routing_key_end = exchange_end + 1 + data[exchange_end]
        routing_key = data[exchange_end + 1 : routing_key_end].decode()
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise AMQPSyntaxError("basic.deliver: truncated or invalid", 60, 60) from exc
    if routing_key_end != frame_end:
        raise AMQPSyntaxError("basic.deliver: bytes after the fields", 60, 60)
    return consumer_tag, Delivery(delivery_tag, bool(redelivered), exchange, routing_key, b"", b"")


def _deliver_run(
    data: bytearray, position: int, end: int, payload_max: int
) -> tuple[str, list[Delivery], int]:
    """The run of whole deliveries at `position`: consecutive basic.deliver methods of one
    consumer on one channel, each with its content header and at most one body frame,
    complete and well formed. Returns (consumer tag, deliveries, next position); no
    deliveries when the first is not such a one, and the frame-by-frame path then reads
    it, which validates it and reports any error with the right code. Never raises."""
    # Hot path (STYLE.md section 11): measured by benchmarks/links_client_bench.py; the
    # layout is fixed by the spec, so each message is a few unpack_from calls and slices.
    deliveries: list[Delivery] = []
    append = deliveries.append
    head = _DELIVER_HEAD.unpack_from
    fields = _DELIVER_FIELDS.unpack_from
    content = _HEADER.unpack_from
    body_envelope = _BODY_ENVELOPE.unpack_from
    new = _new_tuple
    first_channel = -1
    tag_raw = b""
    consumer_tag = ""
    try:
        while end - position >= _DELIVER_HEAD_BYTES:
            kind, channel, size, ids, tag_size = head(data, position)
            frame_end = position + 7 + size
            if (
                kind != codec.FRAME_METHOD
                or ids != _DELIVER_IDS
                or size > payload_max
                or frame_end >= end
                or data[frame_end] != codec.FRAME_END
            ):
                break
            tag_end = position + _DELIVER_HEAD.size + tag_size
            if first_channel < 0:
                first_channel = channel
                tag_raw = bytes(data[position + _DELIVER_HEAD.size : tag_end])
                consumer_tag = tag_raw.decode()
            elif (
                channel != first_channel or data[position + _DELIVER_HEAD.size : tag_end] != tag_raw
            ):
                break
            delivery_tag, redelivered, exchange_size = fields(data, tag_end)
            exchange_end = tag_end + 10 + exchange_size
            routing_key_end = exchange_end + 1 + data[exchange_end]
            if routing_key_end != frame_end:
                break
            header = frame_end + 1
            if end - header < 8 + _HEADER_FIXED_BYTES + _PROPERTY_FLAGS_BYTES:
                break
            kind, header_channel, size, class_id, _weight, body_size = content(data, header)
            header_end = header + 7 + size
            if (
                kind != codec.FRAME_HEADER
                or header_channel != channel
                or class_id != _BASIC
                or size > payload_max
                or size < _HEADER_FIXED_BYTES + _PROPERTY_FLAGS_BYTES
                or header_end >= end
                or data[header_end] != codec.FRAME_END
            ):
                break
            body_at = header_end + 1
            if body_size:
                if end - body_at < 8:
                    break
                kind, body_channel, size = body_envelope(data, body_at)
                body_end = body_at + 7 + size
                if (
                    kind != codec.FRAME_BODY
                    or body_channel != channel
                    or size != body_size
                    or body_end >= end
                    or data[body_end] != codec.FRAME_END
                ):
                    break
                body = bytes(data[body_at + 7 : body_end])
                next_position = body_end + 1
            else:
                body = b""
                next_position = body_at
            append(
                new(
                    Delivery,
                    (
                        delivery_tag,
                        redelivered != 0,
                        data[tag_end + 10 : exchange_end].decode(),
                        data[exchange_end + 1 : routing_key_end].decode(),
                        bytes(data[header + 7 + _HEADER_FIXED_BYTES : header_end]),
                        body,
                    ),
                )
            )
            position = next_position
    except (struct.error, IndexError, UnicodeDecodeError):
        pass  # the frame-by-frame path reports it
    return consumer_tag, deliveries, position


def _content_frame(
    partial: dict[int, _Partial],
    frame_type: int,
    channel: int,
    data: bytearray,
    payload: int,
    frame_end: int,
) -> _Partial | None:
    """Add a header, body or method frame to the message `channel` is assembling; the
    message once complete. Raises UnexpectedFrame (505) for a frame out of order."""
    pending = partial.get(channel)
    if pending is None:
        raise UnexpectedFrame(f"content frame of type {frame_type} on channel {channel}")
    if frame_type == codec.FRAME_HEADER and pending.properties is None:
        if frame_end - payload < _HEADER_FIXED_BYTES + _PROPERTY_FLAGS_BYTES:
            raise FrameError("content header frame too short")
        pending.body_size = _U64.unpack_from(data, payload + 4)[0]
        if pending.body_size > BODY_BYTES_MAX:
            raise FrameError(f"message body of {pending.body_size} bytes over {BODY_BYTES_MAX}")
        pending.properties = bytes(data[payload + _HEADER_FIXED_BYTES : frame_end])
    elif frame_type == codec.FRAME_BODY and pending.properties is not None:
        pending.body += data[payload:frame_end]
        if len(pending.body) > pending.body_size:
            raise FrameError("body frames longer than the content header says")
    else:
        raise UnexpectedFrame(f"frame of type {frame_type} in the middle of content")
    if len(pending.body) < pending.body_size:
        return None
    del partial[channel]
    return pending


class PublishWriter:
    """basic.publish, content header and body frames appended to an output buffer."""

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max
        self._methods: dict[tuple[int, str, str, bool], bytes] = {}

    def append(
        self,
        out: bytearray,
        channel: int,
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes,
        mandatory: bool,
    ) -> None:
        """Raises ValueError for a name over 255 bytes or properties over one frame."""
        key = (channel, exchange, routing_key, mandatory)
        method = self._methods.get(key)
        if method is None:
            publish = m.BasicPublish(
                exchange=exchange, routing_key=routing_key, mandatory=mandatory
            )
            method = codec.encode_method_frame(codec.ChannelId(channel), publish)
            if len(self._methods) >= PUBLISH_METHODS_CACHED_MAX:
                self._methods.clear()
            self._methods[key] = method
        out += method
        header_size = _HEADER_FIXED_BYTES + len(properties)
        if header_size + codec.FRAME_OVERHEAD_BYTES > self.frame_max:
            raise ValueError("basic properties do not fit one frame")
        out += _HEADER.pack(codec.FRAME_HEADER, channel, header_size, _BASIC, 0, len(body))
        out += properties
        out += _FRAME_END_BYTES
        codec.append_body_frames(out, codec.ChannelId(channel), body, self.frame_max)
