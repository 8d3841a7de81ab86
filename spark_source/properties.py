"""AMQP 0-9-1 basic properties, as the log stores them, decoded into column values.

Owns the mapping from a record's `properties` bytes (the wire form, spec 4.2.6.1) to the
`properties` struct and the `headers` list of the Spark schema. The wire is read by
`streamq.log.amqp091` (the log layer's tagged codec, which an executor can import without
the broker); this module turns its tagged values into column values.

Strings are bytes on the wire and a raw client can put anything in them; the log codec
decodes them with `surrogateescape`, and Spark's string columns hold only UTF-8: a
property string or header key that is not valid UTF-8 (a lone surrogate's encoding
included) is given with each bad byte replaced by U+FFFD (`text`), never an error.
Header values become bytes, as Kafka's headers are: byte arrays (`x`) stay as they are,
strings (`S`) are their UTF-8, booleans `true`/`false`, numbers and decimals their decimal
text, void is null, and nested tables and arrays are JSON of the same conversion.

Rules:
1. Pure functions, no I/O. A malformed property list raises `PropertiesMalformed`.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from streamq.log import amqp091
from streamq.log.amqp091 import PROPERTY_NAMES, PropertiesMalformed

Value = bool | int | float | Decimal | str | bytes | list["Value"] | dict[str, "Value"] | None
PropertyValue = str | int | list[tuple[str, bytes | None]] | None


def decode_properties(raw: bytes) -> dict[str, PropertyValue]:
    """The present properties by name; `headers` as (key, value bytes) pairs in table
    order (a repeated key: its last value, at its first place) and `timestamp` in seconds.
    Raises PropertiesMalformed."""
    values: dict[str, PropertyValue] = amqp091.decode_properties(raw)
    for name, value in values.items():
        if isinstance(value, str):
            values[name] = text(value)
    headers = values.get("headers")
    if headers is not None:
        table = _table(headers)  # type: ignore[arg-type]
        values["headers"] = [(text(key), header_bytes(value)) for key, value in table.items()]
    return values


def text(value: str) -> str:
    """`value` as valid Unicode: the bytes `surrogateescape` kept as lone surrogates (not
    UTF-8 on the wire) become U+FFFD, one per byte. O(1) for ASCII, the common case."""
    if value.isascii():
        return value
    raw = value.encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "replace")


def header_bytes(value: Value) -> bytes | None:
    """A header value as the `headers` column holds it (see the module docstring)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, int | float | Decimal):
        return str(value).encode()
    return json.dumps(_jsonable(value), separators=(",", ":")).encode()


def _jsonable(value: Value) -> object:
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    if isinstance(value, bytes | Decimal):
        raw = header_bytes(value)
        assert raw is not None
        return raw.decode("utf-8", "replace")
    return value


def _table(entries: list[tuple[str, str, Any]]) -> dict[str, Value]:
    return {name: _value(tag, value) for name, tag, value in entries}


def _value(tag: str, value: Any) -> Value:
    """A tagged value of `amqp091` as a plain one: decimals as Decimal, tables as dicts."""
    if tag == "D":
        scale, unscaled = value
        return Decimal(unscaled).scaleb(-scale)
    if tag == "F":
        return _table(value)
    if tag == "A":
        return [_value(item_tag, item) for item_tag, item in value]
    return value  # type: ignore[no-any-return]


__all__ = ["PROPERTY_NAMES", "PropertiesMalformed", "decode_properties", "header_bytes"]
