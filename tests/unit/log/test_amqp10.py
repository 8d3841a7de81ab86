"""The AMQP 0-9-1 <-> 1.0 conversion (streamq.log.amqp10) against the real rstream client's
AMQP 1.0 codec: what we encode decodes there with the body and every mapped field, what
rstream encodes converts back, and no input makes either direction raise."""

from __future__ import annotations

import random
import uuid
from decimal import Decimal

import pytest
from rstream._pyamqp.message import Header, Properties
from rstream.amqp import AMQPMessage, amqp_decoder

from amqp_gateway.codec.properties import BasicProperties, decode_properties, encode_properties
from amqp_gateway.codec.values import Float32, Int8, Int16, Timestamp, UInt8, UInt16, UInt32
from streamq.log import _amqp10, amqp091, amqp10
from streamq.log import amqp10_types as t
from streamq.log.amqp10 import (
    AMQP10_TYPE,
    NATIVE_MARK,
    as_amqp091,
    filter_properties,
    is_native,
    native_properties,
    to_amqp091,
    to_amqp091_reference,
    to_amqp10,
)
from streamq.log.format import Record

UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")
FULL = BasicProperties(
    content_type="application/json",
    content_encoding="gzip",
    headers={
        "s": "text",
        "n": 7,
        "big": 1 << 40,
        "flag": True,
        "raw": b"\x00\xff",
        "f": 1.5,
        "i8": Int8(-3),
        "u8": UInt8(200),
        "i16": Int16(-300),
        "u16": UInt16(60000),
        "u32": UInt32(4_000_000_000),
        "f32": Float32(0.5),
        "ts": Timestamp(1_700_000_000),
        "void": None,
        "x-custom": "annotation",
        "nested": {"a": 1},
        "CC": ["q1", "q2"],
    },
    delivery_mode=2,
    priority=4,
    correlation_id=f"urn:uuid:{UUID}",
    reply_to="replies",
    expiration="60000",
    message_id="m-1",
    timestamp=1_700_000_001,
    type="order.created",
    user_id="guest",
    app_id="shop",
)


def native(body: bytes, filter_value: bytes = b"", offset: int = 5) -> Record:
    return Record(offset, 1000, b"", filter_value, native_properties(offset), body)


def test_native_mark() -> None:
    props = native_properties(2**64 - 1)
    assert props == NATIVE_MARK + b"\xff" * 8
    assert is_native(props)
    assert not is_native(encode_properties(BasicProperties(content_type="x")))
    assert not is_native(b"\x00\x00")
    assert not is_native(b"")


def test_to_amqp10_decodes_in_rstream_with_every_field() -> None:
    data = to_amqp10(b"amq.topic", b"orders.eu", encode_properties(FULL), b"payload")
    m = amqp_decoder(data)
    assert m.body == b"payload"
    assert m.header == Header(durable=True, priority=4, ttl=60000)
    p = m.properties
    assert p.message_id == b"m-1"
    assert p.correlation_id == UUID
    assert p.user_id == b"guest"
    assert p.reply_to == b"replies"
    assert p.content_type == b"application/json"
    assert p.content_encoding == b"gzip"
    assert p.creation_time == 1_700_000_001_000
    assert p.group_id == b"shop"
    app = m.application_properties
    assert app[b"s"] == b"text"
    assert app[b"n"] == 7 and app[b"big"] == 1 << 40 and app[b"flag"] is True
    assert app[b"raw"] == b"\x00\xff" and app[b"f"] == 1.5 and app[b"f32"] == 0.5
    assert (app[b"i8"], app[b"u8"], app[b"i16"], app[b"u16"]) == (-3, 200, -300, 60000)
    assert app[b"u32"] == 4_000_000_000
    assert app[b"ts"] == 1_700_000_000_000
    assert app[b"void"] is None
    assert b"nested" not in app and b"CC" not in app and b"x-custom" not in app
    ann = m.message_annotations
    assert ann[b"x-exchange"] == b"amq.topic"
    assert ann[b"x-routing-key"] == b"orders.eu"
    assert ann[b"x-custom"] == b"annotation"
    assert ann[b"x-cc"] == [b"q1", b"q2"]
    assert ann[b"x-basic-type"] == b"order.created"


def test_to_amqp10_minimal_and_large() -> None:
    m = amqp_decoder(to_amqp10(b"", b"s", b"\x00\x00", b""))
    # No delivery mode: no header section (as RabbitMQ 3.10), so that none comes back.
    assert m.header is None
    assert m.properties is None and m.application_properties is None
    transient = encode_properties(BasicProperties(delivery_mode=1))
    assert amqp_decoder(to_amqp10(b"", b"s", transient, b"")).header.durable is False
    body = bytes(range(256)) * 300
    headers = {f"h{i}": "v" * 300 for i in range(40)}  # str32 values, map32
    props = encode_properties(BasicProperties(headers=headers))
    m = amqp_decoder(to_amqp10(b"e" * 255, b"r" * 255, props, body))
    assert m.body == body
    assert m.application_properties[b"h39"] == b"v" * 300
    assert m.message_annotations[b"x-exchange"] == b"e" * 255


def test_to_amqp10_never_raises_on_bad_properties() -> None:
    for properties in (b"", b"\x80", b"\x80\x00\x05ab", NATIVE_MARK + b"junk"):
        m = amqp_decoder(to_amqp10(b"x", b"y", properties, b"body"))
        assert m.body == b"body"
        assert m.message_annotations[b"x-routing-key"] == b"y"


def test_to_amqp10_keeps_invalid_utf8_as_binary() -> None:
    props = encode_properties(BasicProperties(headers={"bad": "\udcff\udcfe"}))
    m = amqp_decoder(to_amqp10(b"", b"", props, b""))
    sections = t.decode_sections(to_amqp10(b"", b"", props, b""))
    app = next(v for code, v, _, _ in sections if code == t.SECTION_APPLICATION_PROPERTIES)
    assert app[1][0][1] == ("binary", b"\xff\xfe")
    assert m.application_properties[b"bad"] == b"\xff\xfe"


def test_rstream_message_to_amqp091() -> None:
    message = AMQPMessage(
        body=b"hello",
        application_properties={"region": "eu", "n": 3, "big": 1 << 40, "ok": False},
        properties=Properties(
            message_id="id-1",
            correlation_id=UUID,
            content_type="text/plain",
            reply_to="r",
            creation_time=1_700_000_000_123,
            group_id="grp",
            user_id=b"guest",
        ),
        header=Header(durable=True, priority=7, ttl=5000),
        message_annotations={"x-note": "n"},
    )
    exchange, routing_key, properties, body = to_amqp091("events", native(bytes(message), b"blue"))
    assert (exchange, routing_key, body) == (b"", b"events", b"hello")
    p = decode_properties(properties)
    assert p.headers == {
        "region": "eu",
        "n": 3,
        "big": 1 << 40,
        "ok": False,
        "x-note": "n",
        "x-stream-filter-value": "blue",
    }
    assert (p.message_id, p.correlation_id) == ("id-1", f"urn:uuid:{UUID}")
    assert (p.content_type, p.reply_to, p.app_id, p.user_id) == ("text/plain", "r", "grp", "guest")
    assert (p.timestamp, p.delivery_mode, p.priority, p.expiration) == (1_700_000_000, 2, 7, "5000")
    assert p.type is None


def test_amqp_value_body_is_delivered_encoded_with_type_amqp10() -> None:
    message = AMQPMessage(value={"k": [1, 2]}, application_properties={"a": "b"})
    raw = bytes(message)
    _, _, properties, body = to_amqp091("s", native(raw))
    p = decode_properties(properties)
    assert p.type == AMQP10_TYPE
    assert p.headers == {"a": "b"}
    assert amqp_decoder(body).value == {b"k": [1, 2]}
    # and back to a stream client as it was
    again = amqp_decoder(to_amqp10(b"", b"s", properties, body))
    assert again.value == {b"k": [1, 2]}


def test_raw_and_malformed_bodies_are_delivered_as_they_are() -> None:
    good = bytes(AMQPMessage(body=b"x", application_properties={"a": "b"}))
    for body in (b"", b"plain text", b"\x00\x53\x75", good[:-1], b"\x00\x53\x99\x40"):
        exchange, routing_key, properties, out = to_amqp091("s", native(body))
        assert (exchange, routing_key, properties, out) == (b"", b"s", b"\x00\x00", body)
    _, _, properties, _ = to_amqp091("s", native(b"raw", b"red"))
    assert decode_properties(properties).headers == {"x-stream-filter-value": "red"}
    assert properties == filter_properties(b"red")
    assert filter_properties(b"") == b"\x00\x00"


def test_round_trip_091_to_10_and_back() -> None:
    data = to_amqp10(b"amq.topic", b"orders.eu", encode_properties(FULL), b"payload")
    exchange, routing_key, properties, body = to_amqp091("s", native(data))
    assert (exchange, routing_key, body) == (b"amq.topic", b"orders.eu", b"payload")
    p = decode_properties(properties)
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "reply_to"):
        assert getattr(p, name) == getattr(FULL, name), name
    for name in ("expiration", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(p, name) == getattr(FULL, name), name
    assert p.correlation_id == FULL.correlation_id
    assert p.headers is not None and FULL.headers is not None
    lost = {"nested"}  # tables are not application properties (as RabbitMQ)
    assert p.headers == {k: v for k, v in FULL.headers.items() if k not in lost}


@pytest.mark.parametrize(
    "given",
    [
        BasicProperties(),
        BasicProperties(priority=3, content_type="application/json"),
        BasicProperties(expiration="5000"),
        BasicProperties(expiration="soon", priority=0),
        BasicProperties(delivery_mode=1, priority=9, expiration="7"),
    ],
)
def test_delivery_mode_priority_and_expiration_come_back_as_given(given: BasicProperties) -> None:
    """No delivery mode set: none comes back (the priority and expiration travel as
    annotations then), through the Python and the C conversion alike."""
    data = to_amqp10(b"", b"s", encode_properties(given), b"x")
    python = decode_properties(to_amqp091_reference("s", native(data))[2])
    c_converted = _amqp10.convert(data, b"s", b"")
    assert c_converted is not None
    for p in (python, decode_properties(c_converted[2])):
        for name in ("delivery_mode", "priority", "expiration", "content_type"):
            assert getattr(p, name) == getattr(given, name), name


def test_as_amqp091_leaves_091_records_alone() -> None:
    record = Record(1, 2, b"e", b"k", b"\x00\x00", b"b")
    assert as_amqp091("s", record) is record
    converted = as_amqp091("s", native(bytes(AMQPMessage(body=b"z"))))
    assert (converted.offset, converted.body, converted.routing_key) == (5, b"z", b"s")


def test_long_and_binary_ids_go_to_headers() -> None:
    message = AMQPMessage(
        body=b"", properties=Properties(message_id="m" * 300, correlation_id=b"\x01\x02")
    )
    _, _, properties, _ = to_amqp091("s", native(bytes(message)))
    p = decode_properties(properties)
    assert p.message_id is None and p.correlation_id is None
    assert p.headers == {"x-message-id": "m" * 300, "x-correlation-id": b"\x01\x02"}


# --- the type codec -------------------------------------------------------------------


VALUES: list[t.Value] = [
    ("null", None),
    ("bool", True),
    ("bool", False),
    ("ubyte", 255),
    ("ushort", 65535),
    ("uint", 0),
    ("uint", 7),
    ("uint", 2**32 - 1),
    ("ulong", 0),
    ("ulong", 9),
    ("ulong", 2**64 - 1),
    ("byte", -128),
    ("short", -32768),
    ("int", -1),
    ("int", -(2**31)),
    ("long", 5),
    ("long", -(2**63)),
    ("float", 0.25),
    ("double", -1e300),
    ("timestamp", -5),
    ("char", "é"),
    ("uuid", UUID.bytes),
    ("decimal64", b"\x01" * 8),
    ("binary", b""),
    ("binary", b"b" * 300),
    ("string", "ünïcode"),
    ("string", "s" * 70000),
    ("symbol", "sym"),
    ("list", []),
    ("list", [("int", 1), ("string", "x" * 300)]),
    ("map", [(("symbol", "k"), ("list", [("null", None)]))]),
    ("described", (("ulong", 0x75), ("binary", b"d"))),
]


@pytest.mark.parametrize("value", VALUES, ids=[v[0] for v in VALUES])
def test_types_round_trip(value: t.Value) -> None:
    out = bytearray()
    t.encode_value(out, value)
    decoded, end = t.decode_value(bytes(out), 0, len(out))
    assert end == len(out)
    assert decoded == value


def test_decodes_arrays_and_symbolic_descriptors() -> None:
    array8 = bytes((0xE0, 1 + 1 + 6, 3, 0xA3, 1, 97, 1, 98, 1, 99))
    value, _ = t.decode_value(array8, 0, len(array8))
    assert value == ("array", [("symbol", "a"), ("symbol", "b"), ("symbol", "c")])
    data = b"\x00\xa3\x10amqp:data:binary\xa0\x02hi"
    assert [code for code, *_ in t.decode_sections(data)] == [t.SECTION_DATA]
    assert amqp_decoder(b"\x00\x53\x75\xa0\x02hi").body == b"hi"


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\x53",  # descriptor without a value
        b"\x00\x53\x75\xa0\x05ab",  # binary past the end
        b"\x00\x53\x75\xff",  # unknown constructor
        b"\x00\x53\x42\x40",  # not a section descriptor
        b"\x00\x53\x74\xd1\xff\xff\xff\xff\xff\xff\xff\xff",  # a huge map
        b"\x00\x53\x76\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40",  # 4 G nulls in 5 bytes
        b"\x00\x53\x77" + b"\xc0\x01\x01" * 100,  # nested past its sizes
        b"\x00\x53\x77" + b"\x00\x53\x01" * 100 + b"\x40",  # described 100 deep
        b"\x00\x53\x74\xc1\x03\x01\x40",  # a map with an odd count
        b"\x40",  # not described
    ],
)
def test_malformed_messages_raise_amqp10_malformed(data: bytes) -> None:
    with pytest.raises(t.Amqp10Malformed):
        t.decode_sections(data)
    assert to_amqp091("s", native(data))[3] == data


def test_fuzzed_bodies_never_raise() -> None:
    rng = random.Random(23)
    seed = bytes(AMQPMessage(body=b"abc", application_properties={"a": 1, "b": "c"}))
    for _ in range(3000):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = data[: rng.randint(0, len(data))]
        to_amqp091("s", native(bytes(data), b"f"))


def test_tagged_091_codec_is_byte_exact_with_the_gateway_codec() -> None:
    raw = encode_properties(FULL)
    fields = amqp091.decode_properties(raw)
    assert amqp091.encode_properties(fields) == raw
    assert ("i16", "s", -300) in fields["headers"]
    decimal = encode_properties(BasicProperties(headers={"d": Decimal("1.25")}))
    assert amqp091.encode_properties(amqp091.decode_properties(decimal)) == decimal
    with pytest.raises(amqp091.PropertiesMalformed):
        amqp091.decode_properties(b"\x20\x00\x00\x00\x00\x09")


def test_cached_prefixes_give_the_same_messages() -> None:
    props = encode_properties(FULL)
    bodies = [b"", b"a", b"b" * 255, b"c" * 256, b"d" * 70000]
    for body in bodies * 2:  # the second round from the cache
        m = amqp_decoder(to_amqp10(b"amq.topic", b"k", props, body))
        assert m.body == body and m.properties.message_id == b"m-1"
    amqp10_props = encode_properties(BasicProperties(type=AMQP10_TYPE))
    value = bytes(AMQPMessage(value="v"))
    for _ in range(2):  # basic.type amqp-1.0: the body decides each time
        assert amqp_decoder(to_amqp10(b"", b"k", amqp10_props, value)).value == b"v"
        assert amqp_decoder(to_amqp10(b"", b"k", amqp10_props, b"not 1.0")).body == b"not 1.0"
    for n in range(amqp10.PREFIXES_MAX + 5):  # past the bound: the cache starts over
        key = str(n).encode()
        assert (
            amqp_decoder(to_amqp10(b"", key, b"\x00\x00", b"x")).message_annotations[
                b"x-routing-key"
            ]
            == key
        )
    assert len(amqp10._PREFIXES) <= amqp10.PREFIXES_MAX


def test_single_data_section_fast_path_checks_the_length() -> None:
    for body in (b"", b"z" * 300):
        data = bytes(AMQPMessage(body=body))
        assert to_amqp091("s", native(data))[3] == body
        assert to_amqp091("s", native(data + b"\x40"))[3] == data + b"\x40"  # trailing junk
        assert to_amqp091("s", native(data[:-1]))[3] == data[:-1]  # short
