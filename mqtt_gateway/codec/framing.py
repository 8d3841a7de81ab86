"""The MQTT envelope: fixed header `type<<4 | flags`, remaining length, body.

This module owns the split of a byte stream into packets (`Decoder.feed`), the fixed
header rules (packet type 0 reserved, AUTH 15 only in 5.0, the fixed flags of every type
but PUBLISH [MQTT-2.1.3-1], the Remaining Length's at most 4 bytes in shortest form),
the maximum packet size, checked on the remaining length alone before any of the body is
buffered, and the dispatch to each packet family's decoder and encoder. Like the other
codecs (STYLE.md section 2) it has no sockets, clock or shared state; peer bytes are
refused only with `MqttCodecError` subclasses.

The maximum packet size counts the whole packet, fixed header included, as MQTT 5's
Maximum Packet Size property does (3.1.2.11.4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from mqtt_gateway.codec import connect, control, publish, subscribe
from mqtt_gateway.codec.constants import (
    FLAGS_REQUIRED,
    PACKET_BYTES_MAX_DEFAULT,
    PACKET_BYTES_MAX_LIMIT,
    PACKET_BYTES_MIN,
    VARINT_MAX,
    PacketType,
    ProtocolLevel,
)
from mqtt_gateway.codec.errors import MalformedPacket, MqttCodecError, PacketTooLarge, ProtocolError
from mqtt_gateway.codec.packets import Connect, Packet, PubAck, PubComp, PubRec, PubRel
from mqtt_gateway.codec.runs import PublishRun, RunForm, scan_run
from mqtt_gateway.codec.wire import Reader, Writer, read_varint, varint_bytes

_TYPE_SHIFT: Final = 4
_FLAGS_MASK: Final = 0x0F
_PUBLISH: Final = int(PacketType.PUBLISH)

Decode = Callable[[int, Reader, ProtocolLevel], Packet]
# Each encoder takes its own packet class; the table is keyed by that class.
Encode = Callable[[Any, ProtocolLevel, Writer], int]

DECODERS: Final[dict[PacketType, Decode]] = {
    PacketType.CONNECT: lambda _flags, reader, _level: connect.decode_connect(reader),
    PacketType.CONNACK: lambda _flags, reader, level: connect.decode_connack(reader, level),
    PacketType.PUBLISH: publish.decode_publish,
    PacketType.PUBACK: publish.ack_decoder(PubAck),
    PacketType.PUBREC: publish.ack_decoder(PubRec),
    PacketType.PUBREL: publish.ack_decoder(PubRel),
    PacketType.PUBCOMP: publish.ack_decoder(PubComp),
    PacketType.SUBSCRIBE: subscribe.decode_subscribe,
    PacketType.SUBACK: subscribe.decode_suback,
    PacketType.UNSUBSCRIBE: subscribe.decode_unsubscribe,
    PacketType.UNSUBACK: subscribe.decode_unsuback,
    PacketType.PINGREQ: control.decode_pingreq,
    PacketType.PINGRESP: control.decode_pingresp,
    PacketType.DISCONNECT: control.decode_disconnect,
    PacketType.AUTH: control.decode_auth,
}


def _encode_connect(packet: Connect, level: ProtocolLevel, writer: Writer) -> int:
    if packet.protocol_level is not level:
        raise ValueError(f"CONNECT of level {packet.protocol_level} encoded at {level}")
    connect.encode_connect(packet, writer)
    return 0


def _encode_connack(packet: Any, level: ProtocolLevel, writer: Writer) -> int:
    connect.encode_connack(packet, level, writer)
    return 0


ENCODERS: Final[dict[PacketType, Encode]] = {
    PacketType.CONNECT: _encode_connect,
    PacketType.CONNACK: _encode_connack,
    PacketType.PUBLISH: publish.encode_publish,
    PacketType.PUBACK: publish.encode_ack,
    PacketType.PUBREC: publish.encode_ack,
    PacketType.PUBREL: publish.encode_ack,
    PacketType.PUBCOMP: publish.encode_ack,
    PacketType.SUBSCRIBE: subscribe.encode_subscribe,
    PacketType.SUBACK: subscribe.encode_suback,
    PacketType.UNSUBSCRIBE: subscribe.encode_unsubscribe,
    PacketType.UNSUBACK: subscribe.encode_unsuback,
    PacketType.PINGREQ: control.encode_empty,
    PacketType.PINGRESP: control.encode_empty,
    PacketType.DISCONNECT: control.encode_disconnect,
    PacketType.AUTH: control.encode_auth,
}


def decode_packet(first_byte: int, body: bytes, level: ProtocolLevel | None) -> Packet:
    """Decode one packet from its fixed header's first byte and its body.

    `level` is the connection's protocol level, None before CONNECT; then only CONNECT
    is accepted (MQTT-3.1.0-1). Raises `MqttCodecError` subclasses."""
    type_value, flags = first_byte >> _TYPE_SHIFT, first_byte & _FLAGS_MASK
    if type_value == 0 or (type_value == PacketType.AUTH and level is not ProtocolLevel.MQTT_5):
        raise MalformedPacket(f"reserved packet type {type_value}")
    packet_type = PacketType(type_value)
    if level is None and packet_type is not PacketType.CONNECT:
        raise ProtocolError(f"{packet_type.name} before CONNECT (MQTT-3.1.0-1)")
    if packet_type is not PacketType.PUBLISH and flags != FLAGS_REQUIRED.get(packet_type, 0):
        raise MalformedPacket(f"{packet_type.name} with fixed-header flags 0b{flags:04b}")
    reader = Reader(body)
    # Before CONNECT only CONNECT gets here, and it reads its level from its own bytes.
    packet = DECODERS[packet_type](flags, reader, level or ProtocolLevel.MQTT_5)
    reader.expect_end(packet_type.name)
    return packet


def encode(packet: Packet, level: ProtocolLevel) -> bytes:
    """Encode one packet at `level`, fixed header included.

    Raises `ValueError` for what the level cannot carry or the decoder would refuse
    (properties before 5.0, a wildcard in a topic name, a packet identifier 0...)."""
    body = Writer(bytearray())
    flags = ENCODERS[packet.type](packet, level, body)
    if len(body.out) > VARINT_MAX:
        raise ValueError(f"packet body of {len(body.out)} bytes exceeds {VARINT_MAX}")
    header = bytes((packet.type << _TYPE_SHIFT | flags,)) + varint_bytes(len(body.out))
    return header + body.out


class Decoder:
    """Splits a connection's received bytes into packets, one connection each.

    Holds at most one incomplete packet, and never more than `packet_bytes_max` of it:
    a remaining length past the limit is refused as soon as its last byte arrives. After
    a refusal the decoder is spent; every further `feed` raises the same error (the
    connection is closing).

    Two ways to read: `feed` returns every packet the bytes complete; `push` then `pop`
    until None hands them out one at a time, so that the caller acts on each before the
    next is decoded, and with a `RunForm`, a run of plain QoS 0 and 1 publishes comes as
    one `PublishRun` (runs.py), split in C."""

    __slots__ = ("_buffer", "_error", "_position", "packet_bytes_max", "protocol_level")

    def __init__(
        self,
        protocol_level: ProtocolLevel | None = None,
        packet_bytes_max: int = PACKET_BYTES_MAX_DEFAULT,
    ) -> None:
        assert PACKET_BYTES_MIN <= packet_bytes_max <= PACKET_BYTES_MAX_LIMIT, packet_bytes_max
        self.protocol_level = protocol_level
        self.packet_bytes_max = packet_bytes_max
        self._buffer = bytearray()
        self._position = 0  # where the next packet starts in `_buffer`
        self._error: MqttCodecError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for packets not yet handed out."""
        return len(self._buffer) - self._position

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Add received bytes; return the packets they complete, in order.

        Raises `MqttCodecError` at the first bad packet; the packets decoded before it in
        this call are on the error's `packets_before` attribute. A decoded CONNECT sets
        `protocol_level` for the packets after it (a second CONNECT is decoded too: refusing
        it is the session's job, MQTT-3.1.0-2)."""
        self.push(data)
        packets: list[Packet] = []
        try:
            while (packet := self.pop()) is not None:
                assert not isinstance(packet, PublishRun)  # no form, no run
                packets.append(packet)
        except MqttCodecError as exc:
            exc.packets_before = tuple(packets)
            raise
        return packets

    def push(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes, for `pop`. Raises the error that spent the decoder."""
        if self._error is not None:
            raise self._error
        self._buffer += data

    def pop(self, form: RunForm | None = None) -> Packet | PublishRun | None:
        """The next complete packet, or with `form` the run of publishes that starts
        there (`runs.scan_run`); None when the bytes held end before one does.

        Raises `MqttCodecError` for a bad packet, and from then on (the decoder is spent)."""
        if self._error is not None:
            raise self._error
        try:
            item = self._next(form)
        except MqttCodecError as exc:
            if exc.protocol_level is None:
                exc.protocol_level = self.protocol_level
            self._error = exc
            self._buffer = bytearray()
            self._position = 0
            raise
        if item is None:
            del self._buffer[: self._position]
            self._position = 0
        return item

    def _next(self, form: RunForm | None) -> Packet | PublishRun | None:
        buffer = self._buffer
        position = self._position
        end = len(buffer)
        if end - position < PACKET_BYTES_MIN:
            return None
        level = self.protocol_level
        if form is not None and level is not None and buffer[position] >> _TYPE_SHIFT == _PUBLISH:
            found = scan_run(buffer, position, level, self.packet_bytes_max, form)
            if found is not None:
                run, self._position = found
                return run
        with memoryview(buffer) as view:
            length = read_varint(view[:end], position + 1)
        if length is None:
            return None
        remaining, body_start = length
        packet_end = body_start + remaining
        if packet_end - position > self.packet_bytes_max:
            raise PacketTooLarge(
                f"packet of {packet_end - position} bytes exceeds {self.packet_bytes_max}"
            )
        if packet_end > end:
            return None
        body = bytes(buffer[body_start:packet_end])
        packet = decode_packet(buffer[position], body, level)
        if isinstance(packet, Connect):
            self.protocol_level = packet.protocol_level
        self._position = packet_end
        return packet
