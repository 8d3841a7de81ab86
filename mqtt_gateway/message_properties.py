"""MQTT 5.0 PUBLISH properties <-> the AMQP 0-9-1 basic properties a message is stored with.

Owns the translation both ways, as RabbitMQ 3.13/4.x's mc_mqtt converts to and from
mc_amqpl (docs/mqtt.md, "MQTT 5 properties and AMQP properties"):

- QoS (and DUP): delivery mode 2 for QoS 1 and 2, else 1; headers `x-mqtt-publish-qos`
  and `x-mqtt-dup`;
- Content Type: `content_type` (ASCII, at most 255 bytes; else header `x-mqtt-content-type`);
- Correlation Data: `correlation_id` when UTF-8 without U+0000 in at most 255 bytes, else
  header `x-correlation-id`;
- Response Topic: header `x-reply-to-topic`, the topic as a routing key;
- User Property: a header each, in order (the first of a repeated name); header
  `x-mqtt-user-property` keeps the whole list when the headers cannot;
- Payload Format Indicator 1: header `x-mqtt-payload-format-indicator` = 1;
- Message Expiry Interval (s): `expiration` in ms, at most RabbitMQ's ten years;
- and two of the gateway's own, not MQTT properties: the publisher's client id,
  `x-mqtt-client-id`, written only for a session with a No Local subscription, and
  `x-mqtt-retain`, on a publish with the retain flag, for Retain As Published; both
  read back at delivery (`publisher_of`, `published_retained`), neither a User Property.

Back to MQTT, the other headers become User Properties when their values read as
strings (RabbitMQ's amqpl_header_to_user_property), and `expiration` becomes the Message
Expiry Interval left (MQTT-3.3.2-6): what remains of it since the message was stored,
rounded up. Pure functions; the decoded form of a property list is cached by its bytes
(`DECODED_MAX`), as the messages of a topic mostly share them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Final

from mqtt_gateway import mapping
from mqtt_gateway.codec import NO_PROPERTIES, MqttCodecError, Properties, check_topic_name
from mqtt_gateway.codec.constants import STRING_BYTES_MAX, USER_PROPERTIES_MAX
from streamq.log.amqp091 import (
    SHORTSTR_BYTES_MAX,
    Header,
    PropertiesMalformed,
    decode_properties,
    encode_properties,
)

CONTENT_TYPE_HEADER: Final = "x-mqtt-content-type"
CORRELATION_HEADER: Final = "x-correlation-id"  # RabbitMQ's, for what correlation_id cannot hold
REPLY_TO_TOPIC_HEADER: Final = "x-reply-to-topic"  # RabbitMQ's
PAYLOAD_FORMAT_HEADER: Final = "x-mqtt-payload-format-indicator"
USER_PROPERTY_HEADER: Final = "x-mqtt-user-property"
PUBLISHER_HEADER: Final = mapping.PUBLISHER_HEADER.decode()
RETAIN_HEADER: Final = mapping.RETAIN_HEADER.decode()
MQTT_HEADER_PREFIX: Final = "x-mqtt-"
_RABBITMQ_HEADERS: Final = frozenset({CORRELATION_HEADER, REPLY_TO_TOPIC_HEADER})
"""Headers of this gateway's own; they never become User Properties."""
EXPIRY_MS_MAX: Final = 315_360_000_000
"""The largest `expiration` RabbitMQ takes (rabbit_misc:check_expiry, ten years): a longer
Message Expiry Interval is stored as this."""
EXPIRY_INTERVAL_MAX_S: Final = 0xFFFFFFFF  # a Four Byte Integer
DECODED_MAX: Final = 1024
"""Decoded property lists cached by their bytes; past it the cache starts over."""

_DELIVERY_MODE_TRANSIENT: Final = 1
_DELIVERY_MODE_PERSISTENT: Final = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Delivered:
    """What an AMQP property list gives an MQTT 5.0 delivery: the properties, and the
    message's own TTL (`expiration`, ms) to turn into the interval left."""

    properties: Properties
    expiration_ms: int | None
    publisher: str | None = None  # `x-mqtt-client-id`
    retained: bool = False  # `x-mqtt-retain`


_NOTHING: Final = Delivered(NO_PROPERTIES, None)
_PLAIN: Final = {(q, d): mapping.publish_properties(q, d) for q in (0, 1, 2) for d in (False, True)}
"""The properties of a publish without MQTT 5 properties, the common case."""
_decoded: dict[bytes, Delivered] = {}


# -- MQTT -> AMQP ----------------------------------------------------------------------------


def to_amqp(
    qos: int, dup: bool, properties: Properties, *, publisher: str | None = None,
    retain: bool = False,
) -> bytes:  # fmt: skip
    """The AMQP basic properties (wire form) of an MQTT publish (or will) with `properties`
    (a PUBLISH's Topic Alias is the connection's business and is not stored), `publisher`
    its client id for No Local, `retain` its retain flag for Retain As Published."""
    if not _carried(properties):
        if publisher is None and not retain:
            return _PLAIN[qos, dup]
        return mapping.publish_properties(qos, dup, publisher=publisher, retain=retain)
    headers: list[Header] = [
        (mapping.QOS_HEADER.decode(), "b", qos),
        (mapping.DUP_HEADER.decode(), "t", dup),
    ]
    if publisher is not None:
        headers.append((PUBLISHER_HEADER, "S", publisher))
    if retain:
        headers.append((RETAIN_HEADER, "t", True))
    fields: dict[str, Any] = {
        "delivery_mode": _DELIVERY_MODE_PERSISTENT if qos else _DELIVERY_MODE_TRANSIENT,
        "headers": headers,
    }
    if properties.payload_format_indicator:
        headers.append((PAYLOAD_FORMAT_HEADER, "b", 1))
    content_type = properties.content_type
    if content_type is not None:
        if content_type.isascii() and len(content_type) <= SHORTSTR_BYTES_MAX:
            fields["content_type"] = content_type
        else:
            headers.append((CONTENT_TYPE_HEADER, "S", content_type))
    if properties.response_topic is not None:
        routing_key = mapping.to_routing_key(properties.response_topic)
        headers.append((REPLY_TO_TOPIC_HEADER, "S", routing_key))
    correlation = properties.correlation_data
    if correlation is not None:
        text = _short_string(correlation)
        if text is not None:
            fields["correlation_id"] = text
        else:
            headers.append(
                (CORRELATION_HEADER, "S", correlation.decode("utf-8", "surrogateescape"))
            )
    _user_property_headers(properties.user_properties, headers)
    if properties.message_expiry_interval_s is not None:
        fields["expiration"] = str(min(properties.message_expiry_interval_s * 1000, EXPIRY_MS_MAX))
    return encode_properties(fields)


def retained_form(qos: int, properties: Properties) -> bytes:
    """What a retained message keeps of its properties: `to_amqp`'s form, b"" if none."""
    return to_amqp(qos, False, properties) if _carried(properties) else b""


def _carried(properties: Properties) -> bool:
    """Whether `properties` hold anything stored with the message."""
    return properties is not NO_PROPERTIES and (
        properties.payload_format_indicator is not None
        or properties.message_expiry_interval_s is not None
        or properties.content_type is not None
        or properties.response_topic is not None
        or properties.correlation_data is not None
        or bool(properties.user_properties)
    )


def _short_string(data: bytes) -> str | None:
    """`data` as an AMQP short string RabbitMQ takes for correlation_id (mc_util:
    is_valid_shortstr: at most 255 bytes of UTF-8 without U+0000), else None."""
    if len(data) > SHORTSTR_BYTES_MAX:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def _reserved(name: str) -> bool:
    return name.startswith(MQTT_HEADER_PREFIX) or name in (
        CORRELATION_HEADER,
        REPLY_TO_TOPIC_HEADER,
    )


def _user_property_headers(pairs: tuple[tuple[str, str], ...], headers: list[Header]) -> None:
    """A header per User Property, in order: the first of a repeated name (AMQP tables
    allow one), none for a name past 255 bytes or one of the reserved headers; then, if
    that loses any, the whole list in `x-mqtt-user-property` for MQTT subscribers."""
    seen: set[str] = set()
    lossless = True
    for name, value in pairs:
        if name in seen or _reserved(name) or len(name.encode()) > SHORTSTR_BYTES_MAX:
            lossless = False
            continue
        seen.add(name)
        headers.append((name, "S", value))
    if not lossless:
        listed = [("A", [("S", name), ("S", value)]) for name, value in pairs]
        headers.append((USER_PROPERTY_HEADER, "A", listed))


# -- AMQP -> MQTT ----------------------------------------------------------------------------


def to_mqtt(properties_raw: bytes, stored_ms: int, now_ms: int) -> Properties:
    """The MQTT 5.0 PUBLISH properties of a stored message for a delivery at `now_ms`;
    `stored_ms` is when the broker stored it (its log record's timestamp)."""
    delivered = _decoded_of(properties_raw)
    if delivered.expiration_ms is None:
        return delivered.properties
    left_ms = max(delivered.expiration_ms - (now_ms - stored_ms), 0)
    left_s = min(math.ceil(left_ms / 1000), EXPIRY_INTERVAL_MAX_S)
    return dataclasses.replace(delivered.properties, message_expiry_interval_s=left_s)


def publisher_of(properties_raw: bytes) -> str | None:
    """The client id of the MQTT session that published a message (its `x-mqtt-client-id`
    header, written for No Local); None for a message without it."""
    return _decoded_of(properties_raw).publisher


def published_retained(properties_raw: bytes) -> bool:
    """Whether an MQTT publisher set the retain flag (its `x-mqtt-retain` header)."""
    return _decoded_of(properties_raw).retained


def expired(properties_raw: bytes, stored_ms: int, now_ms: int) -> bool:
    """Whether a message's own expiration has passed (as the broker expires queued ones;
    retained messages are not in a queue)."""
    expiration_ms = _decoded_of(properties_raw).expiration_ms
    return expiration_ms is not None and now_ms >= stored_ms + expiration_ms


def _decoded_of(properties_raw: bytes) -> Delivered:
    delivered = _decoded.get(properties_raw)
    if delivered is None:
        delivered = _delivered(properties_raw)
        if len(_decoded) >= DECODED_MAX:
            _decoded.clear()
        _decoded[properties_raw] = delivered
    return delivered


def _delivered(properties_raw: bytes) -> Delivered:
    if len(properties_raw) <= 2 and not any(properties_raw):
        return _NOTHING  # no property at all
    try:
        fields = decode_properties(properties_raw)
    except PropertiesMalformed:
        return _NOTHING
    headers: list[Header] = fields.get("headers") or []
    taken = {name: (tag, value) for name, tag, value in reversed(headers)}  # the first wins
    values: dict[str, Any] = {}
    content_type = fields.get("content_type")
    if content_type is None:
        content_type = _string_header(taken, CONTENT_TYPE_HEADER)
    if content_type is not None and _sendable(content_type):
        values["content_type"] = content_type
    correlation = fields.get("correlation_id")
    if correlation is None:
        # RabbitMQ takes a longstr; a byte array (what pika sends for bytes) too here.
        tag, correlation = taken.get(CORRELATION_HEADER, (None, None))
        correlation = correlation if tag in ("S", "x") else None
    if isinstance(correlation, str):
        correlation = correlation.encode("utf-8", "surrogateescape")
    if correlation is not None and len(correlation) <= STRING_BYTES_MAX:
        values["correlation_data"] = correlation
    reply_to = _string_header(taken, REPLY_TO_TOPIC_HEADER)
    if reply_to is not None:
        topic = mapping.to_topic(reply_to)
        if _topic_name(topic):
            values["response_topic"] = topic
    if taken.get(PAYLOAD_FORMAT_HEADER, (None, 0))[1] == 1:
        values["payload_format_indicator"] = 1
    values["user_properties"] = _user_properties(headers, taken)
    properties = Properties(**values)
    if properties == NO_PROPERTIES:
        properties = NO_PROPERTIES  # the encoder's fast path knows this one
    publisher = _string_header(taken, PUBLISHER_HEADER)
    retained = taken.get(RETAIN_HEADER) == ("t", True)
    return Delivered(properties, _expiration_ms(fields.get("expiration")), publisher, retained)


def _string_header(taken: dict[str, tuple[str, Any]], name: str) -> str | None:
    tag, value = taken.get(name, (None, None))
    return value if tag == "S" else None


def _user_properties(
    headers: list[Header], taken: dict[str, tuple[str, Any]]
) -> tuple[tuple[str, str], ...]:
    listed = taken.get(USER_PROPERTY_HEADER)
    pairs: list[tuple[str, str]] = []
    if listed is not None and listed[0] == "A":
        for tag, pair in listed[1]:
            if tag == "A" and len(pair) == 2 and pair[0][0] == pair[1][0] == "S":
                pairs.append((pair[0][1], pair[1][1]))
    else:
        seen: set[str] = set()
        for name, tag, value in headers:
            text = _as_string(tag, value)
            if text is None or name in seen or _reserved(name):
                continue
            seen.add(name)
            pairs.append((name, text))
    sendable = [(n, v) for n, v in pairs if _sendable(n) and _sendable(v)]
    return tuple(sendable[:USER_PROPERTIES_MAX])


def _as_string(tag: str, value: Any) -> str | None:
    """A header value as RabbitMQ makes it a User Property's: strings, numbers, booleans
    and void; None for arrays, tables, byte arrays and decimals."""
    if tag == "S":
        return value if isinstance(value, str) else None
    if tag in ("b", "B", "s", "u", "I", "i", "l", "T"):
        return str(value)
    if tag in ("f", "d"):
        return repr(float(value))
    if tag == "t":
        return "true" if value else "false"
    if tag == "V":
        return ""
    return None


def _sendable(text: str) -> bool:
    """Whether `text` can go out as an MQTT UTF-8 string (MQTT-1.5.4-1, -2)."""
    if "\x00" in text:
        return False
    try:
        return len(text.encode("utf-8")) <= STRING_BYTES_MAX
    except UnicodeEncodeError:  # a lone surrogate: bytes that were not UTF-8
        return False


def _topic_name(topic: str) -> bool:
    if not topic or not _sendable(topic):
        return False
    try:
        check_topic_name(topic)
    except MqttCodecError:
        return False
    return True


def _expiration_ms(expiration: object) -> int | None:
    """`expiration` as the broker expires it (digits; deadletter.py's PropertiesCodec)."""
    if not isinstance(expiration, str) or not expiration.isdigit():
        return None
    return min(int(expiration), EXPIRY_MS_MAX)


def payload_valid(payload: bytes, properties: Properties) -> bool:
    """Whether a payload is what its Payload Format Indicator says: 1 is UTF-8 (3.3.2.3.2;
    else reason 0x99, Payload format invalid)."""
    if properties.payload_format_indicator != 1:
        return True
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
