"""Runs of PUBLISH packets: consecutive QoS 0 and 1 publishes to one topic, read in one step.

Owns `RunForm` (what the caller stores a run's messages with: the AMQP property lists by
QoS and DUP, the exchange, the topic's routing key), `PublishRun` (a run: its messages
ready for the broker's `publish_run`, the PUBACKs of its QoS 1 packets already encoded)
and `scan_run`, the C scanner `_scan.scan_publishes` behind `Decoder.pop`. A run holds
only packets the decoder itself would decode, to the same `Publish` (`PublishRun.packets`
gives them back, for the paths that handle publishes one by one): QoS 0 or 1, no RETAIN,
no MQTT 5 properties, the run's one topic name. Everything else is the decoder's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mqtt_gateway.codec import _scan
from mqtt_gateway.codec.constants import ProtocolLevel
from mqtt_gateway.codec.packets import Publish
from mqtt_gateway.codec.properties import NO_PROPERTIES

RUN_MESSAGES_MAX: Final = 4096
"""Packets in one run at most: a run is routed and stored in one step."""
KIND_DUP: Final = 1  # a kind is QoS << 1 | DUP
KIND_QOS_SHIFT: Final = 1
_PUBACK_BYTES: Final = 4
_PACKET_ID_AT: Final = 2

RunMessage = tuple[bytes, bytes, str, str, int]
"""(properties_raw, payload, exchange, routing_key, 0): the broker's run message."""


@dataclass(frozen=True, slots=True)
class RunForm:
    """How a run's messages are stored: `properties[QoS << 1 | DUP]` (index 1, QoS 0 with
    DUP, is never used), `exchange`, and the routing key of a topic name."""

    properties: tuple[bytes, bytes, bytes, bytes]
    exchange: str
    routing_key_of: Callable[[str], str]

    @property
    def flags_byte0(self) -> int:
        """The OR of the property lists' first bytes (each at least two flag bytes)."""
        first, second, third, fourth = self.properties
        return first[0] | second[0] | third[0] | fourth[0]


@dataclass(slots=True)
class PublishRun:
    """Consecutive PUBLISH packets to `topic` (module docstring)."""

    topic: str
    routing_key: str
    messages: list[RunMessage]
    acks: bytes  # the PUBACKs of the QoS 1 packets, in order, 4 bytes each
    kinds: bytes  # one QoS << 1 | DUP per packet
    flags_byte0: int  # `RunForm.flags_byte0` of the form it was read with

    @property
    def ack_count(self) -> int:
        return len(self.acks) // _PUBACK_BYTES

    def packets(self) -> list[Publish]:
        """The `Publish` packets the decoder reads from the run's bytes."""
        packets = []
        acked = 0
        for message, kind in zip(self.messages, self.kinds, strict=True):
            qos = kind >> KIND_QOS_SHIFT
            packet_id = None
            if qos:
                at = acked * _PUBACK_BYTES + _PACKET_ID_AT
                packet_id = int.from_bytes(self.acks[at : at + 2], "big")
                acked += 1
            dup = bool(kind & KIND_DUP)
            packets.append(
                Publish(self.topic, message[1], qos, False, dup, packet_id, NO_PROPERTIES)
            )
        return packets


def scan_run(
    buffer: bytearray, position: int, level: ProtocolLevel, packet_bytes_max: int, form: RunForm
) -> tuple[PublishRun, int] | None:
    """The run of PUBLISH packets at `position` and the offset after it; None when the
    packet there is not one a run takes (the decoder reads it)."""
    end, topic, routing_key, messages, acks, kinds = _scan.scan_publishes(
        buffer,
        position,
        level is ProtocolLevel.MQTT_5,
        packet_bytes_max,
        RUN_MESSAGES_MAX,
        form.properties,
        form.exchange,
        form.routing_key_of,
    )
    if not messages:
        return None
    return PublishRun(topic, routing_key, messages, acks, kinds, form.flags_byte0), end
