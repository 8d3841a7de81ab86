"""AMQP 1.0 messages in stream logs: the native-record mark and the 0-9-1 <-> 1.0 conversion.

A message published by a stream-protocol client is stored verbatim as one record whose
`properties` field is `NATIVE_MARK` followed by the u64 publishing id (docs/log-format.md);
every other record holds AMQP 0-9-1 basic properties in wire encoding. This module owns
that mark and the conversion between the two message models, which follows RabbitMQ's
(mc_amqpl.erl, rabbit_stream_queue.erl) and is specified in the "Message conversion"
section of docs/stream-protocol.md. Pure and stdlib only, besides its C twin
`_amqp10` (the common messages' 1.0 -> 0-9-1 conversion): the Spark source imports it.

Rules:
1. Neither direction raises: what cannot be converted is left out (to_amqp10) or the body
   is delivered as it is with no properties (to_amqp091).
2. `is_native` is the only per-record cost on the AMQP delivery path: a 2-byte compare.
"""

from __future__ import annotations

import functools
import struct
import uuid
from typing import Any, Final

from streamq.log import _amqp10
from streamq.log import amqp10_types as t
from streamq.log.amqp091 import (
    Fields,
    Header,
    PropertiesMalformed,
    decode_properties,
    encode_properties,
)
from streamq.log.amqp10_types import Amqp10Malformed, Value
from streamq.log.format import Record

# An AMQP 0-9-1 property-flags word with only bit 1 set: a reserved bit no 0-9-1 client sends.
NATIVE_MARK: Final = b"\x00\x02"
AMQP10_TYPE: Final = "amqp-1.0"  # basic.type of a 0-9-1 message whose body is 1.0 sections
FILTER_VALUE_HEADER: Final = "x-stream-filter-value"
SHORTSTR_BYTES_MAX: Final = 255
_PUBLISHING_ID: Final = struct.Struct("<Q")
_U32: Final = struct.Struct(">I")
_EMPTY_PROPERTIES: Final = b"\x00\x00"
_URN_UUID: Final = "urn:uuid:"
_INT64_MAX: Final = (1 << 63) - 1
# Message annotations that become 0-9-1 fields rather than headers.
_ANNOTATIONS_AS_FIELDS: Final = frozenset(
    {"x-exchange", "x-routing-key", "x-basic-type", "x-basic-priority"}
    | {"x-basic-delivery-mode", "x-basic-expiration", "x-stream-offset"}
)


def is_native(properties: bytes) -> bool:
    """Whether a record's properties field marks a stream-native (AMQP 1.0) record."""
    return properties[:2] == NATIVE_MARK


def native_properties(publishing_id: int) -> bytes:
    """The properties field of a native record published with `publishing_id`."""
    return NATIVE_MARK + _PUBLISHING_ID.pack(publishing_id)


# --- 0-9-1 -> 1.0 -------------------------------------------------------------------------


def to_amqp10(exchange: bytes, routing_key: bytes, properties: bytes, body: bytes) -> bytes:
    """An AMQP 0-9-1 record -> one AMQP 1.0 message, as RabbitMQ converts for stream clients:
    header, message annotations (x-exchange, x-routing-key, the x- headers, x-basic-type),
    properties, application properties (the other headers) and one data section."""
    key = (exchange, routing_key, properties)
    prefix = _PREFIXES.get(key)
    if prefix is None:
        prefix, amqp10_body = _prefix(exchange, routing_key, properties)
        if amqp10_body:  # the body decides: not cached
            if _is_message(body):
                return prefix + body  # already 1.0 sections (a 1.0 message through 0-9-1)
        elif len(_PREFIXES) < PREFIXES_MAX:
            _PREFIXES[key] = prefix
        else:
            _PREFIXES.clear()  # a stream with ever-new properties: start over
    size = len(body)
    if size < 256:
        return b"".join((prefix, _DATA_SMALL, size.to_bytes(1, "big"), body))
    return b"".join((prefix, _DATA_LARGE, size.to_bytes(4, "big"), body))


def sections_before_body(exchange: bytes, routing_key: bytes, properties: bytes) -> bytes | None:
    """What `to_amqp10` puts before a data section of the body for these properties
    (cached as it caches them), or None when the body decides (basic.type amqp-1.0): the
    publish run's C loop (`_streamwire.converted_entries`) then calls `to_amqp10`."""
    key = (exchange, routing_key, properties)
    prefix = _PREFIXES.get(key)
    if prefix is None:
        prefix, amqp10_body = _prefix(exchange, routing_key, properties)
        if amqp10_body:
            return None
        if len(_PREFIXES) >= PREFIXES_MAX:
            _PREFIXES.clear()  # a stream with ever-new properties: start over
        _PREFIXES[key] = prefix
    return prefix


# The sections before the body of a converted record, by (exchange, routing key,
# properties): the messages of a stream mostly share them, and encoding them costs 20-50 us.
PREFIXES_MAX: Final = 1024
_PREFIXES: dict[tuple[bytes, bytes, bytes], bytes] = {}
_DATA_SMALL: Final = b"\x00\x53\x75\xa0"  # a data section with a vbin8, then its length
_DATA_LARGE: Final = b"\x00\x53\x75\xb0"  # with a vbin32


def _prefix(exchange: bytes, routing_key: bytes, properties: bytes) -> tuple[bytes, bool]:
    """The encoded sections before the body, and whether the body is 1.0 sections already
    (basic.type amqp-1.0)."""
    try:
        fields = decode_properties(properties)
    except PropertiesMalformed:
        fields = {}
    headers: list[Header] = fields.get("headers") or []
    out = bytearray()
    try:
        _append_sections(out, exchange, routing_key, fields, headers)
    except (Amqp10Malformed, ValueError, TypeError):  # a value 1.0 cannot carry: drop them all
        out.clear()
        _append_annotations(out, exchange, routing_key, {}, [])
        fields = {}
    return bytes(out), fields.get("type") == AMQP10_TYPE


def _append_sections(
    out: bytearray,
    exchange: bytes,
    routing_key: bytes,
    fields: Fields,
    headers: list[Header],
) -> None:
    notes: list[tuple[Value, Value]] = []
    if fields.get("delivery_mode") is not None:
        t.encode_section(out, t.SECTION_HEADER, ("list", _header(fields)))
    else:
        # No header section without a delivery mode (as RabbitMQ 3.10's rabbit_msg_record):
        # its durable would come back as delivery mode 1 where the publisher set none. The
        # priority and expiration go in annotations, which the way back reads then.
        notes = _header_notes(fields)
    _append_annotations(out, exchange, routing_key, fields, headers, notes)
    props = _properties(fields)
    if any(kind != "null" for kind, _ in props):
        t.encode_section(out, t.SECTION_PROPERTIES, ("list", props))
    application = [
        (("string", name), _from_091(tag, value))
        for name, tag, value in headers
        if not name.startswith("x-") and tag not in ("A", "F")
    ]
    if application:
        t.encode_section(out, t.SECTION_APPLICATION_PROPERTIES, ("map", application))


def _header_notes(fields: Fields) -> list[tuple[Value, Value]]:
    """x-basic-priority and x-basic-expiration annotations, for a message without a header."""
    notes: list[tuple[Value, Value]] = []
    priority = fields.get("priority")
    if isinstance(priority, int) and 0 <= priority <= 255:
        notes.append((("symbol", "x-basic-priority"), ("ubyte", priority)))
    expiration = fields.get("expiration")
    if isinstance(expiration, str):
        notes.append((("symbol", "x-basic-expiration"), ("string", expiration)))
    return notes


def _append_annotations(
    out: bytearray,
    exchange: bytes,
    routing_key: bytes,
    fields: Fields,
    headers: list[Header],
    notes: list[tuple[Value, Value]] | None = None,
) -> None:
    entries: list[tuple[Value, Value]] = [
        (("symbol", "x-exchange"), ("string", _text(exchange))),
        (("symbol", "x-routing-key"), ("string", _text(routing_key))),
    ]
    for name, tag, value in headers:
        if name.startswith("x-"):
            entries.append((("symbol", name), _from_091(tag, value)))
        elif name == "CC" and tag == "A":
            entries.append((("symbol", "x-cc"), _from_091(tag, value)))
    kind = fields.get("type")
    if kind is not None and kind != AMQP10_TYPE:
        entries.append((("symbol", "x-basic-type"), ("string", kind)))
    entries += notes or []
    t.encode_section(out, t.SECTION_MESSAGE_ANNOTATIONS, ("map", entries))


def _header(fields: Fields) -> list[Value]:
    """durable, priority, ttl: trailing nulls left out."""
    header: list[Value] = [("bool", fields.get("delivery_mode") == 2)]
    expiration = fields.get("expiration")
    ttl = int(expiration) if isinstance(expiration, str) and expiration.isdigit() else None
    if fields.get("priority") is not None or ttl is not None:
        priority = fields.get("priority")
        header.append(t.NULL if priority is None else ("ubyte", priority))
    if ttl is not None and ttl < 1 << 32:
        header.append(("uint", ttl))
    return header


def _properties(fields: Fields) -> list[Value]:
    """The 1.0 properties list (13 fields, trailing nulls left out)."""
    timestamp = fields.get("timestamp")
    created: Value = t.NULL
    if isinstance(timestamp, int) and timestamp * 1000 <= _INT64_MAX:
        created = ("timestamp", timestamp * 1000)
    values: list[Value] = [
        _message_id(fields.get("message_id")),
        _wrap("binary", fields.get("user_id"), lambda s: s.encode("utf-8", "surrogateescape")),
        t.NULL,  # to
        t.NULL,  # subject
        _wrap("string", fields.get("reply_to")),
        _message_id(fields.get("correlation_id")),
        _wrap("symbol", fields.get("content_type")),
        _wrap("symbol", fields.get("content_encoding")),
        t.NULL,  # absolute-expiry-time
        created,
        _wrap("string", fields.get("app_id")),  # group-id, as RabbitMQ
    ]
    while values and values[-1][0] == "null":
        values.pop()
    return values


def _wrap(kind: str, value: Any, convert: object = None) -> Value:
    if value is None:
        return t.NULL
    return (kind, convert(value) if callable(convert) else value)


def _message_id(value: object) -> Value:
    if not isinstance(value, str):
        return t.NULL
    if value.startswith(_URN_UUID):
        try:
            return ("uuid", uuid.UUID(value[len(_URN_UUID) :]).bytes)
        except ValueError:
            pass
    return ("string", value)


def _from_091(tag: str, value: Any) -> Value:
    """A 0-9-1 field value as the 1.0 type RabbitMQ maps it to (mc_amqpl:from_091)."""
    kind = _SCALAR_091_TO_10.get(tag)
    if kind is not None:
        return (kind, value)
    if tag == "S":
        return _string_or_binary(value)
    if tag == "T":
        return ("timestamp", value * 1000)
    if tag == "D":
        scale, unscaled = value
        return ("string", str(unscaled) if scale == 0 else f"{unscaled}e-{scale}")
    if tag == "A":
        return ("list", [_from_091(item_tag, item) for item_tag, item in value])
    if tag == "F":
        return ("map", [(("symbol", k), _from_091(kt, kv)) for k, kt, kv in value])
    return t.NULL  # V


_SCALAR_091_TO_10: Final = {
    "t": "bool",
    "b": "byte",
    "B": "ubyte",
    "s": "short",
    "u": "ushort",
    "I": "int",
    "i": "uint",
    "l": "long",
    "f": "float",
    "d": "double",
    "x": "binary",
}


def _string_or_binary(value: str) -> Value:
    """A longstr that is valid UTF-8 is a 1.0 string; other bytes stay binary."""
    raw = value.encode("utf-8", "surrogateescape")
    try:
        return ("string", raw.decode("utf-8"))
    except UnicodeDecodeError:
        return ("binary", raw)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _is_message(body: bytes) -> bool:
    try:
        return bool(t.decode_sections(body))
    except Amqp10Malformed:
        return False


# --- 1.0 -> 0-9-1 -------------------------------------------------------------------------


def to_amqp091(stream: str, record: Record) -> tuple[bytes, bytes, bytes, bytes]:
    """A native record -> (exchange, routing_key, 0-9-1 properties, body) for 0-9-1
    consumers: `to_amqp091_reference`'s result, from the C conversion (`_amqp10.convert`)
    where it takes the message, else from the reference itself."""
    body = record.body
    payload = _only_data(body)
    routing_key = stream.encode("utf-8", "surrogateescape")
    if payload is not None:  # the common message: one data section and nothing else
        return b"", routing_key, _filter_only(record.routing_key), payload
    converted = _amqp10.convert(body, routing_key, record.routing_key)
    return to_amqp091_reference(stream, record) if converted is None else converted


def to_amqp091_reference(stream: str, record: Record) -> tuple[bytes, bytes, bytes, bytes]:
    """A native record -> (exchange, routing_key, 0-9-1 properties, body) for 0-9-1
    consumers. Exchange "" and the stream's name as routing key unless the message carries
    x-exchange / x-routing-key annotations (RabbitMQ's "as if through the default
    exchange"); the filter value becomes the `x-stream-filter-value` header. The Python
    reference that the C conversion (`_amqp10.convert`) is tested against."""
    body = record.body
    filter_value = record.routing_key
    routing_key = stream.encode("utf-8", "surrogateescape")
    payload = _only_data(body)
    if payload is not None:  # the common message: one data section and nothing else
        return b"", routing_key, _filter_only(filter_value), payload
    try:
        sections = t.decode_sections(body)
    except Amqp10Malformed:
        sections = []
    if not sections:  # raw bytes: delivered as they are
        return b"", routing_key, _filter_only(filter_value), body
    try:
        return _convert(sections, body, routing_key, filter_value)
    except (PropertiesMalformed, ValueError, TypeError, OverflowError):
        return b"", routing_key, _filter_only(filter_value), body


def as_amqp091(stream: str, record: Record) -> Record:
    """`record` as AMQP 0-9-1 consumers get it: itself, or converted when it is native."""
    if record.properties[:2] != NATIVE_MARK:
        return record
    exchange, routing_key, properties, body = to_amqp091(stream, record)
    return Record(record.offset, record.timestamp_ms, exchange, routing_key, properties, body)


@functools.lru_cache(maxsize=1024)  # a stream's publishers share a few property lists
def filter_value_of(properties: bytes) -> bytes:
    """The `x-stream-filter-value` header of 0-9-1 `properties` (a string, or bytes), as
    the filter value a chunk stores; b"" when there is none (or another type)."""
    if FILTER_VALUE_HEADER.encode() not in properties:
        return b""
    try:
        headers = decode_properties(properties).get("headers") or []
    except PropertiesMalformed:
        return b""
    for name, _kind, value in headers:
        if name == FILTER_VALUE_HEADER:
            if isinstance(value, bytes):
                return value
            return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else b""
    return b""


def filter_properties(filter_value: bytes) -> bytes:
    """0-9-1 properties holding only the `x-stream-filter-value` header (none when
    empty): what an AMQP stream filter checks for a native record, before converting it."""
    return _filter_only(filter_value)


def _only_data(body: bytes) -> bytes | None:
    """The payload of a message that is exactly one data section, else None."""
    if body[:4] == _DATA_SMALL and len(body) >= 5 and body[4] == len(body) - 5:
        return body[5:]
    if body[:4] == _DATA_LARGE and len(body) >= 8 and _U32.unpack_from(body, 4)[0] == len(body) - 8:
        return body[8:]
    return None


@functools.lru_cache(maxsize=1024)  # filter values repeat: a few per stream
def _filter_only(filter_value: bytes) -> bytes:
    if not filter_value:
        return _EMPTY_PROPERTIES
    header = (FILTER_VALUE_HEADER, "S", _text(filter_value))
    return encode_properties({"headers": [header]})


def _convert(
    sections: list[tuple[int, Value, int, int]],
    body: bytes,
    routing_key: bytes,
    filter_value: bytes,
) -> tuple[bytes, bytes, bytes, bytes]:
    by_code = {code: value for code, value, _start, _end in sections}
    annotations = _string_keyed(by_code.get(t.SECTION_MESSAGE_ANNOTATIONS))
    payload, is_amqp10 = _payload(sections, body)
    fields: Fields = {}
    _apply_header(fields, by_code.get(t.SECTION_HEADER), annotations)
    headers = _headers(by_code.get(t.SECTION_APPLICATION_PROPERTIES), annotations)
    _apply_properties(fields, headers, by_code.get(t.SECTION_PROPERTIES))
    if filter_value:
        headers.append((FILTER_VALUE_HEADER, "S", _text(filter_value)))
    fields["type"] = AMQP10_TYPE if is_amqp10 else _shortstr(annotations.get("x-basic-type"))
    fields["headers"] = headers or None
    exchange = annotations.get("x-exchange")
    key = annotations.get("x-routing-key")
    return (
        _utf8(exchange[1]) if exchange and exchange[0] == "string" else b"",
        _utf8(key[1]) if key and key[0] == "string" else routing_key,
        encode_properties(fields),
        payload,
    )


def _payload(sections: list[tuple[int, Value, int, int]], body: bytes) -> tuple[bytes, bool]:
    """The 0-9-1 body: the data sections' bytes joined, or else the 1.0-encoded body
    sections (amqp-value, amqp-sequence) and footer as they are, with type amqp-1.0."""
    bodies = [s for s in sections if s[0] >= t.SECTION_DATA]
    if all(code == t.SECTION_DATA for code, *_ in bodies):
        return b"".join(value[1] for _, value, _s, _e in bodies), False
    return b"".join(body[start:end] for _, _, start, end in bodies), True


def _string_keyed(section: Value | None) -> dict[str, Value]:
    if section is None or section[0] != "map":
        return {}
    return {key[1]: value for key, value in section[1] if key[0] in ("symbol", "string")}


def _apply_header(fields: Fields, header: Value | None, annotations: dict[str, Value]) -> None:
    items: list[Value] = header[1] if header and header[0] == "list" else []
    items = items + [t.NULL] * (3 - len(items))
    durable, priority, ttl = items[0], items[1], items[2]
    if header is not None:
        fields["delivery_mode"] = 2 if durable == ("bool", True) else 1
    else:
        fields["delivery_mode"] = _octet(annotations.get("x-basic-delivery-mode"))
    fields["priority"] = (
        _octet(priority) if priority[0] != "null" else _octet(annotations.get("x-basic-priority"))
    )
    if ttl[0] == "uint":
        fields["expiration"] = str(ttl[1])
    else:
        fields["expiration"] = _shortstr(annotations.get("x-basic-expiration"))


def _octet(value: Value | None) -> int | None:
    if value is None or not isinstance(value[1], int) or isinstance(value[1], bool):
        return None
    return value[1] if 0 <= value[1] <= 255 else None


def _shortstr(value: Value | None) -> str | None:
    if value is None or value[0] not in ("string", "symbol"):
        return None
    text: str = value[1]
    return text if len(text.encode("utf-8", "surrogateescape")) <= SHORTSTR_BYTES_MAX else None


def _headers(application: Value | None, annotations: dict[str, Value]) -> list[Header]:
    headers: list[Header] = []
    for name, value in _string_keyed(application).items():
        if _fits_name(name):
            headers.append((name, *_to_091(value)))
    for name, value in annotations.items():
        if name == "x-cc":
            headers.append(("CC", *_to_091(value)))
        elif name.startswith("x-") and name not in _ANNOTATIONS_AS_FIELDS and _fits_name(name):
            headers.append((name, *_to_091(value)))
    return headers


def _fits_name(name: str) -> bool:
    return len(name.encode("utf-8", "surrogateescape")) <= SHORTSTR_BYTES_MAX and (
        name != FILTER_VALUE_HEADER
    )


def _apply_properties(fields: Fields, headers: list[Header], section: Value | None) -> None:
    items: list[Value] = section[1] if section and section[0] == "list" else []
    items = items + [t.NULL] * (13 - len(items))
    fields["message_id"] = _id_091(items[0], "x-message-id", headers)
    user_id = items[1]
    if user_id[0] == "binary" and len(user_id[1]) <= SHORTSTR_BYTES_MAX:
        fields["user_id"] = _text(user_id[1])
    fields["reply_to"] = _shortstr(items[4])
    fields["correlation_id"] = _id_091(items[5], "x-correlation-id", headers)
    fields["content_type"] = _shortstr(items[6])
    fields["content_encoding"] = _shortstr(items[7])
    if items[9][0] == "timestamp" and items[9][1] >= 0:
        fields["timestamp"] = items[9][1] // 1000
    fields["app_id"] = _shortstr(items[10])


def _id_091(value: Value, header: str, headers: list[Header]) -> str | None:
    """A message or correlation id as a shortstr; one that does not fit goes in a header."""
    kind, raw = value
    if kind == "uuid":
        return _URN_UUID + str(uuid.UUID(bytes=raw))
    if kind == "ulong":
        return str(raw)
    if kind == "binary":
        headers.append((header, "x", raw))
    elif kind == "string":
        if len(_utf8(raw)) <= SHORTSTR_BYTES_MAX:
            return str(raw)
        headers.append((header, "S", raw))
    return None


def _utf8(text: object) -> bytes:
    return str(text).encode("utf-8", "surrogateescape")


def _to_091(value: Value) -> tuple[str, object]:
    """A 1.0 value as a 0-9-1 field (tag, value), as RabbitMQ maps it (mc_amqpl:to_091)."""
    kind, raw = value
    tag = _SCALAR_10_TO_091.get(kind)
    if tag is not None:
        return tag, raw
    if kind in ("string", "symbol", "char"):
        return "S", raw
    if kind == "ulong":
        return ("l", raw) if raw <= _INT64_MAX else ("S", str(raw))
    if kind == "timestamp":
        return ("T", raw // 1000) if raw >= 0 else ("l", raw)
    if kind == "uuid":
        return "S", _URN_UUID + str(uuid.UUID(bytes=raw))
    if kind.startswith("decimal"):
        return "x", raw
    if kind in ("list", "array"):
        return "A", [_to_091(item) for item in raw]
    if kind == "map":
        return "F", [(str(k[1]), *_to_091(v)) for k, v in raw]
    if kind == "described":
        return _to_091(raw[1])
    return "V", None


_SCALAR_10_TO_091: Final = {
    "bool": "t",
    "byte": "b",
    "ubyte": "B",
    "short": "s",
    "ushort": "u",
    "int": "I",
    "uint": "i",
    "long": "l",
    "float": "f",
    "double": "d",
    "binary": "x",
}
