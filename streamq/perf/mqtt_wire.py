"""The MQTT load generator's hot path: pre-encoded publishes and a bulk packet scan.

Owns the bytes each message costs `streamq perf mqtt` (STYLE.md section 11), at MQTT
3.1.1 only:
- `PublishBatch`, one PUBLISH encoded once by the project's codec and repeated to fill
  one socket write, each QoS 1 copy with its own packet identifier patched in;
- `Incoming`, a hand-rolled walk over received bytes that counts PUBLISH packets, keeps
  the packet identifiers of QoS 1 ones (to PUBACK), counts PUBACKs and PINGREQs and
  checks bodies (`-V`) without building a packet object per message; the rare other
  packets (CONNACK, SUBACK...) go to the codec's `decode_packet`;
- `pubacks`, the PUBACKs of a read's QoS 1 deliveries, in one buffer.

It does no I/O, reads no clock and knows nothing about processes or reporting.
"""

from __future__ import annotations

import os
import struct
from typing import Final

from mqtt_gateway.codec import (
    MqttCodecError,
    Packet,
    ProtocolLevel,
    PubAck,
    Publish,
    decode_packet,
    encode,
)
from streamq.perf.errors import PerfError

LEVEL: Final = ProtocolLevel.MQTT_3_1_1
PUBLISH_BATCH_BYTES_MAX: Final = 256 << 10
"""One socket write of publishes; bigger writes gain nothing on loopback."""
PACKET_ID_MAX: Final = 0xFFFF
INCOMING_PACKET_BYTES_MAX: Final = 256 << 20
"""The largest packet accepted from the broker (LavinMQ's default maximum)."""
_BODY_PATTERN_MODULUS: Final = 27
_BODY_PATTERN_BASE: Final = 64
_U16 = struct.Struct(">H")
_PUBLISH: Final = 3
_PUBACK: Final = 4
_PINGREQ: Final = 12
_PINGRESP: Final = 13
_PUBACK_BYTES: Final = encode(PubAck(1), LEVEL)[:2]  # 0x40 0x02, then the identifier
_VARINT_BYTES_MAX: Final = 4


def body_pattern(size: int) -> bytes:
    """The body lavinmqperf sends and checks with `-V`: bytes 64 + i % 27."""
    return bytes(_BODY_PATTERN_BASE + i % _BODY_PATTERN_MODULUS for i in range(size))


class PublishBatch:
    """Copies of one PUBLISH for one socket write; QoS 1 copies numbered in turn."""

    def __init__(self, topic: str, size: int, qos: int, *, retain: bool, random: bool) -> None:
        self.qos = qos
        self.random = random
        self.body_bytes = size
        packet_id = 1 if qos else None
        try:
            self.packet = encode(
                Publish(topic, body_pattern(size), qos, retain, False, packet_id), LEVEL
            )
        except ValueError as exc:
            raise PerfError(f"cannot publish to {topic!r}: {exc}") from None
        self.packet_bytes = len(self.packet)
        self.body_offset = self.packet_bytes - size
        self.id_offset = self.body_offset - 2  # the identifier precedes the payload
        self.count_max = max(1, PUBLISH_BATCH_BYTES_MAX // self.packet_bytes)
        self.next_id = 1

    def take(self, count: int) -> bytearray:
        """`count` (at most `count_max`) publishes in one buffer."""
        assert 0 < count <= self.count_max, count
        out = bytearray(self.packet * count)
        step = self.packet_bytes
        if self.qos:
            packet_id, offset = self.next_id, self.id_offset
            for _ in range(count):
                _U16.pack_into(out, offset, packet_id)
                packet_id = packet_id % PACKET_ID_MAX + 1
                offset += step
            self.next_id = packet_id
        if self.random and self.body_bytes:
            size, noise = self.body_bytes, os.urandom(self.body_bytes * count)
            for index in range(count):
                start = index * step + self.body_offset
                out[start : start + size] = noise[index * size : (index + 1) * size]
        return out


def pubacks(packet_ids: list[int]) -> bytes:
    """One PUBACK per identifier, in order, in one buffer."""
    out = bytearray(4 * len(packet_ids))
    for index, packet_id in enumerate(packet_ids):
        position = 4 * index
        out[position : position + 2] = _PUBACK_BYTES
        _U16.pack_into(out, position + 2, packet_id)
    return bytes(out)


class Incoming:
    """What a connection received, scanned in bulk; the caller takes the counts."""

    __slots__ = (
        "_buffer",
        "bad_bodies",
        "expected_body",
        "others",
        "packet_ids",
        "pingreqs",
        "pubacks",
        "publishes",
    )

    def __init__(self, expected_body: bytes | None = None) -> None:
        self._buffer = bytearray()
        self.expected_body = expected_body  # -V: every PUBLISH must carry this body
        self.publishes = 0
        self.packet_ids: list[int] = []  # QoS 1 deliveries to acknowledge
        self.pubacks = 0
        self.pingreqs = 0
        self.bad_bodies = 0
        self.others: list[Packet] = []  # CONNACK, SUBACK, DISCONNECT...

    def feed(self, data: bytes | bytearray | memoryview, publishes_max: int = -1) -> None:
        """Scan `data` after what an earlier feed left unscanned, stopping once
        `publishes` reaches `publishes_max` (-1: no limit; what is left stays for the next
        feed, `feed(b"")`). Raises `PerfError` for bytes no MQTT 3.1.1 broker sends."""
        buffer = self._buffer
        buffer += data
        end = len(buffer)
        position = 0
        while end - position >= 2 and self.publishes != publishes_max:
            first = buffer[position]
            remaining, shift, cursor = 0, 0, position + 1
            while cursor < end:
                byte = buffer[cursor]
                cursor += 1
                remaining |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
                if shift >= 7 * _VARINT_BYTES_MAX:
                    raise PerfError("the broker sent a malformed remaining length")
            else:
                break  # the remaining length is not complete yet
            if remaining > INCOMING_PACKET_BYTES_MAX:
                raise PerfError(f"the broker sent a packet of {remaining} bytes")
            packet_end = cursor + remaining
            if packet_end > end:
                break
            self._packet(first, buffer, cursor, packet_end)
            position = packet_end
        del buffer[:position]

    @property
    def buffered(self) -> int:
        """Bytes received and not scanned yet."""
        return len(self._buffer)

    def _packet(self, first: int, buffer: bytearray, start: int, end: int) -> None:
        kind = first >> 4
        if kind == _PUBLISH:
            self.publishes += 1
            topic_end = start + 2 + (buffer[start] << 8 | buffer[start + 1])
            body_start = topic_end
            if first & 0x06:  # QoS 1 (or 2): a packet identifier follows the topic
                self.packet_ids.append(buffer[topic_end] << 8 | buffer[topic_end + 1])
                body_start += 2
            expected = self.expected_body
            if expected is not None and buffer[body_start:end] != expected:
                self.bad_bodies += 1
        elif kind == _PUBACK:
            self.pubacks += 1
        elif kind == _PINGREQ:
            self.pingreqs += 1
        elif kind != _PINGRESP:
            try:
                self.others.append(decode_packet(first, bytes(buffer[start:end]), LEVEL))
            except MqttCodecError as exc:
                raise PerfError(f"the broker sent a bad packet: {exc}") from None
