"""Field tables and arrays: every RabbitMQ value type round-trips with its Python type,
the byte layouts match the spec, pamqp agrees in both directions, and malformed tables
raise AMQPSyntaxError."""

from __future__ import annotations

import struct
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from amqp_gateway.codec.values import (
    TABLE_DEPTH_MAX,
    FieldTable,
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
from amqp_gateway.errors import AMQPSyntaxError

from .strategies import field_tables, field_values, pamqp_tables, to_pamqp, typed


def entry(name: bytes, tagged_value: bytes) -> bytes:
    return bytes([len(name)]) + name + tagged_value


def table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    ("value", "tagged"),
    [
        (True, b"t\x01"),
        (False, b"t\x00"),
        (Int8(-2), b"b\xfe"),
        (UInt8(254), b"B\xfe"),
        (Int16(-2), b"s\xff\xfe"),
        (UInt16(65534), b"u\xff\xfe"),
        (-2, b"I\xff\xff\xff\xfe"),
        (UInt32(2**32 - 2), b"i\xff\xff\xff\xfe"),
        (Int64(-2), b"l" + b"\xff" * 7 + b"\xfe"),
        (Float32(1.5), b"f" + struct.pack(">f", 1.5)),
        (1.5, b"d" + struct.pack(">d", 1.5)),
        (Decimal("1.50"), b"D\x02\x00\x00\x00\x96"),
        ("héllo", b"S\x00\x00\x00\x06h\xc3\xa9llo"),
        ([Int8(1), "a"], b"A\x00\x00\x00\x08b\x01S\x00\x00\x00\x01a"),
        (Timestamp(1_700_000_000), b"T" + struct.pack(">Q", 1_700_000_000)),
        ({"k": None}, b"F\x00\x00\x00\x03\x01kV"),
        (None, b"V"),
        (b"\x00\xff", b"x\x00\x00\x00\x02\x00\xff"),
    ],
)
def test_each_type_has_the_rabbitmq_layout(value: object, tagged: bytes) -> None:
    wire = table(entry(b"v", tagged))
    assert encode_table({"v": value}) == wire  # type: ignore[dict-item]
    decoded = decode_table(wire)
    assert typed(decoded) == typed({"v": value})


def test_a_plain_int_beyond_int32_travels_as_int64() -> None:
    wire = table(entry(b"n", b"l\x00\x00\x01\x00\x00\x00\x00\x00"))
    assert encode_table({"n": 2**40}) == wire
    assert typed(decode_table(wire)) == typed({"n": Int64(2**40)})


def test_a_decimal_with_a_positive_exponent_travels_with_scale_zero() -> None:
    wire = table(entry(b"d", b"D\x00\x00\x00\x01\x2c"))
    assert encode_table({"d": Decimal("3E+2")}) == wire
    assert typed(decode_table(wire)) == typed({"d": Decimal(300)})


def test_capital_l_is_read_as_int64_like_rabbitmq() -> None:
    decoded = decode_table(table(entry(b"n", b"L" + struct.pack(">q", -5))))
    assert typed(decoded) == typed({"n": Int64(-5)})


# Recursive tables are the slowest strategy here; 50 examples keep the module fast.
tables_settings = settings(max_examples=50)


@tables_settings
@given(field_tables)
def test_tables_round_trip_with_their_python_types(value: FieldTable) -> None:
    wire = encode_table(value)
    decoded = decode_table(wire)
    assert typed(decoded) == typed(value)
    assert encode_table(decoded) == wire


@tables_settings
@given(st.lists(field_values, max_size=6))
def test_arrays_round_trip_with_their_python_types(value: list[object]) -> None:
    wire = encode_array(value)  # type: ignore[arg-type]
    assert typed(decode_array(wire)) == typed(value)


@given(st.binary(max_size=30), st.binary(max_size=30))
def test_any_string_bytes_survive_a_decode_encode_round_trip(name: bytes, text: bytes) -> None:
    """Peer strings in tables need not be UTF-8; they come back byte for byte."""
    wire = table(entry(name, b"S" + struct.pack(">I", len(text)) + text))
    assert encode_table(decode_table(wire)) == wire


@tables_settings
@given(pamqp_tables)
def test_pamqp_decodes_what_we_encode(value: FieldTable) -> None:
    _, decoded = pamqp_decode.field_table(encode_table(value))
    assert decoded == to_pamqp(value)


@tables_settings
@given(pamqp_tables)
def test_we_decode_what_pamqp_encodes(value: FieldTable) -> None:
    assert decode_table(pamqp_encode.field_table(to_pamqp(value))) == value


@pytest.mark.parametrize(
    ("wire", "match"),
    [
        (table(entry(b"k", b"Z\x00")), "unknown field value type 'Z'"),
        (table(entry(b"k", b"\x00")), "unknown field value type"),
        (table(entry(b"k", b"I\x00\x00")), "malformed"),  # truncated int32
        (table(entry(b"k", b"S\x00\x00\x00\x09abc")), "longstr runs past"),
        (struct.pack(">I", 100) + entry(b"k", b"V"), "length runs past"),
        (struct.pack(">I", 2) + entry(b"k", b"t\x01"), "overrun the table length"),
        (table(entry(b"k", b"t\x01")) + b"\x00", "bytes after the end"),
        (table(b"\x05ab"), "shortstr runs past"),
        (table(entry(b"k", b"F\x00\x00\x00\x09\x01kV")), "length runs past"),
        (table(entry(b"k", b"A\x00\x00\x00\x01")), "array length runs past"),
        (b"\x00\x00", "malformed"),
    ],
)
def test_malformed_tables_raise_syntax_error(wire: bytes, match: str) -> None:
    with pytest.raises(AMQPSyntaxError, match=match) as caught:
        decode_table(wire)
    assert caught.value.reply_code == 502


def test_deep_nesting_is_a_syntax_error_not_a_recursion_error() -> None:
    """A hostile frame of nested arrays must hit TABLE_DEPTH_MAX, not the stack limit."""
    inner = b""
    for _ in range(2000):
        inner = b"A" + struct.pack(">I", len(inner)) + inner
    with pytest.raises(AMQPSyntaxError, match="nested deeper"):
        decode_table(table(entry(b"k", inner)))
    ok = b""
    for _ in range(TABLE_DEPTH_MAX):
        ok = b"A" + struct.pack(">I", len(ok)) + ok
    decode_table(table(entry(b"k", ok)))


@pytest.mark.parametrize(
    "value",
    [
        {"k": Int8(200)},
        {"k": UInt32(-1)},
        {"k": 2**64},
        {"k": Decimal("-1.5")},
        {"k": Decimal("NaN")},
        {"k": Decimal("1E-300")},
        {"k": Float32(1e300)},
        {"k": {1, 2}},
        {"x" * 256: 1},
    ],
)
def test_values_the_wire_cannot_carry_raise_value_error(value: FieldTable) -> None:
    with pytest.raises(ValueError, match=r"cannot encode|exceeds"):
        encode_table(value)


def test_markers_behave_as_numbers_and_show_their_tag_in_repr() -> None:
    assert Int8(3) + 1 == 4
    assert UInt16(7) == 7
    assert repr(Timestamp(5)) == "Timestamp(5)"
    assert repr(Float32(0.5)) == "Float32(0.5)"
    assert typed(Int16(1)) != typed(1)
