"""How MQTT names and messages map onto the broker core, as RabbitMQ's MQTT plugin maps them.

Owns the translations, pure functions all: topic names and filters to routing keys on the
topic exchange and back (`/` <-> `.`, `+` <-> `*`, `#` <-> `#`; rabbit_mqtt_util:mqtt_to_amqp
and amqp_to_mqtt), a session's queue names (`mqtt-subscription-<client id>qos0` and
`...qos1`, rabbit_mqtt_util:subcription_queue_name, and `...qos2`) and a shared group's
(`mqtt-shared-<group>`), the AMQP basic properties an MQTT publish is stored with
(delivery mode 2 for QoS 1 and 2, else 1; headers `x-mqtt-publish-qos` and `x-mqtt-dup`,
as rabbit_mqtt_processor's amqp_pub writes them; `x-mqtt-client-id` and `x-mqtt-retain`
for No Local and Retain As Published) and reading the QoS back at delivery. It must not
touch sockets or broker state.
"""

from __future__ import annotations

import struct
from typing import Final

EXCHANGE: Final = "amq.topic"
"""The topic exchange MQTT topics are routing keys on (RabbitMQ's `mqtt.exchange`)."""

QUEUE_PREFIX: Final = "mqtt-subscription-"
QOS_HEADER: Final = b"x-mqtt-publish-qos"
DUP_HEADER: Final = b"x-mqtt-dup"
SHARED_QUEUE_PREFIX: Final = "mqtt-shared-"
PUBLISHER_HEADER: Final = b"x-mqtt-client-id"
"""The publishing session's client id (for its subscriptions' No Local)."""
RETAIN_HEADER: Final = b"x-mqtt-retain"
"""The publish's retain flag (for Retain As Published), written only when set."""

_PROPERTY_FLAG_HEADERS: Final = 0x2000
_PROPERTY_FLAG_DELIVERY_MODE: Final = 0x1000
_DELIVERY_MODE_TRANSIENT: Final = 1
_DELIVERY_MODE_PERSISTENT: Final = 2
# The header as it stands in an AMQP field table: its short-string length and its name,
# then a field type; RabbitMQ writes a signed byte ('b', {<<"x-mqtt-publish-qos">>, byte,
# Q}), an AMQP client may write any integer type.
_QOS_NAME: Final = bytes((len(QOS_HEADER),)) + QOS_HEADER
_QOS_ENTRY: Final = _QOS_NAME + b"b"
_INTEGER_FIELDS: Final = {
    ord("b"): struct.Struct(">b"),
    ord("B"): struct.Struct(">B"),
    ord("s"): struct.Struct(">h"),
    ord("u"): struct.Struct(">H"),
    ord("I"): struct.Struct(">i"),
    ord("i"): struct.Struct(">I"),
    ord("l"): struct.Struct(">q"),
}

_PUBLISHER_NAME: Final = bytes((len(PUBLISHER_HEADER),)) + PUBLISHER_HEADER
_RETAIN_ENTRY: Final = bytes((len(RETAIN_HEADER),)) + RETAIN_HEADER + b"t\x01"

_TO_AMQP: Final = str.maketrans({"/": ".", "+": "*", ".": "/", "*": "+"})
_TO_MQTT: Final = str.maketrans({".": "/", "*": "+", "/": ".", "+": "*"})


def to_routing_key(topic: str) -> str:
    """The routing key of an MQTT topic name or filter: levels separated by `.`, `+` as
    `*`; a `.` or `*` inside a level swaps the other way, so that the mapping is its own
    inverse (RabbitMQ 3.10 maps `/` and `.` both ways so)."""
    return topic.translate(_TO_AMQP)


def to_topic(routing_key: str) -> str:
    """The MQTT topic of a routing key (an AMQP publisher's, delivered to MQTT)."""
    return routing_key.translate(_TO_MQTT)


def queue_name(client_id: str, qos: int) -> str:
    """The queue holding a session's subscriptions of one QoS (0, 1 or 2; RabbitMQ 3.10
    has the first two, QoS 2 ones being granted 1 there)."""
    return f"{QUEUE_PREFIX}{client_id}qos{qos}"


def shared_queue_name(group: str) -> str:
    """The queue of a shared subscription group (`$share/{group}/...`), which its members
    consume from in turn (RabbitMQ 3.10 and LavinMQ have no shared subscriptions)."""
    return f"{SHARED_QUEUE_PREFIX}{group}"


def publish_properties(
    qos: int, dup: bool, *, publisher: str | None = None, retain: bool = False
) -> bytes:
    """The AMQP basic properties (wire encoding) an MQTT publish is stored with;
    `publisher` (its client id) and `retain` add the headers No Local and Retain As
    Published read back at delivery (message_properties.py's `publisher_of` and
    `published_retained`, which decode the headers: a User Property's value may hold
    these entries' bytes)."""
    table = _QOS_ENTRY + struct.pack(">b", qos)
    table += bytes((len(DUP_HEADER),)) + DUP_HEADER + b"t" + (b"\x01" if dup else b"\x00")
    if publisher is not None:
        encoded = publisher.encode()
        table += _PUBLISHER_NAME + b"S" + struct.pack(">I", len(encoded)) + encoded
    if retain:
        table += _RETAIN_ENTRY
    mode = _DELIVERY_MODE_PERSISTENT if qos else _DELIVERY_MODE_TRANSIENT
    flags = _PROPERTY_FLAG_HEADERS | _PROPERTY_FLAG_DELIVERY_MODE
    return struct.pack(">HI", flags, len(table)) + table + bytes((mode,))


def published_qos(properties_raw: bytes) -> int | None:
    """The QoS an MQTT publisher sent a message with (its `x-mqtt-publish-qos` header);
    None for a message without it (an AMQP publisher's), which RabbitMQ delivers at the
    subscription's QoS. The header is found by its table entry's exact bytes (length,
    name), which no other header's name or value holds unless it holds these 19 bytes
    verbatim; a message without headers is not searched. A value that is no integer
    from 0 to 2 counts as absent."""
    if len(properties_raw) < 2 or not properties_raw[0] & (_PROPERTY_FLAG_HEADERS >> 8):
        return None
    at = properties_raw.find(_QOS_NAME)
    if at < 0:
        return None
    at += len(_QOS_NAME)
    field = _INTEGER_FIELDS.get(properties_raw[at]) if at < len(properties_raw) else None
    if field is None or at + 1 + field.size > len(properties_raw):
        return None
    value = int(field.unpack_from(properties_raw, at + 1)[0])
    return value if 0 <= value <= 2 else None


def delivery_qos(subscription_qos: int, properties_raw: bytes) -> int:
    """The QoS a message goes out with to a subscription: the lower of the two, where a
    message no MQTT client published counts at the subscription's."""
    published = published_qos(properties_raw)
    return subscription_qos if published is None else min(published, subscription_qos)
