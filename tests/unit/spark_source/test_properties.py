"""The reimplemented property decoder agrees with the broker's codec (amqp_gateway), which
spark_source may not import."""

from __future__ import annotations

import struct
from decimal import Decimal

import pyarrow as pa
import pytest

from amqp_gateway.codec.properties import BasicProperties, encode_properties
from spark_source.properties import PropertiesMalformed, decode_properties


def test_every_property_round_trips() -> None:
    props = BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers={
            "s": "text",
            "i": 42,
            "big": 1 << 40,
            "f": 1.5,
            "t": True,
            "none": None,
            "raw": b"\x00\xff",
            "dec": Decimal("1.25"),
            "nested": {"a": [1, "x"]},
        },
        delivery_mode=2,
        priority=9,
        correlation_id="c",
        reply_to="r",
        expiration="60000",
        message_id="m",
        timestamp=1_700_000_000,
        type="ty",
        user_id="guest",
        app_id="app",
        cluster_id="cl",
    )
    decoded = decode_properties(encode_properties(props))
    assert decoded.pop("headers") == [
        ("s", b"text"),
        ("i", b"42"),
        ("big", b"1099511627776"),
        ("f", b"1.5"),
        ("t", b"true"),
        ("none", None),
        ("raw", b"\x00\xff"),
        ("dec", b"1.25"),
        ("nested", b'{"a":[1,"x"]}'),
    ]
    expected = {k: getattr(props, k) for k in decoded}
    assert decoded == expected
    assert len(decoded) == 13


def test_empty_properties() -> None:
    assert decode_properties(b"\x00\x00") == {}


@pytest.mark.parametrize("raw", [b"", b"\x80\x00\x05ab", b"\x00\x00\x01", b"\x20\x00\x00\x00\x00"])
def test_malformed(raw: bytes) -> None:
    with pytest.raises(PropertiesMalformed, match="properties"):
        decode_properties(raw)


def test_strings_that_are_not_utf8_get_replacement_characters() -> None:
    """Short strings are bytes on the wire: invalid UTF-8 and a lone surrogate's encoding
    (what a raw client may send) come out with U+FFFD per bad byte, valid text as it is,
    header values as their bytes; pyarrow then takes every string (it raised before)."""
    bad = b"\xed\xa0\x80"
    # content-type, app-id and headers flags; shortstrs and a table built by hand.
    flags = (1 << 15) | (1 << 13) | (1 << 3)

    def shortstr(raw: bytes) -> bytes:
        return bytes([len(raw)]) + raw

    table = shortstr(b"k" + bad) + b"S" + struct.pack(">I", 3) + b"v\xff\xfe"
    raw = (
        struct.pack(">H", flags)
        + shortstr(b"caf\xc3\xa9")
        + struct.pack(">I", len(table))
        + table
        + shortstr(b"\xffapp")
    )
    values = decode_properties(raw)
    assert values["content_type"] == "café"
    assert values["app_id"] == "\ufffdapp"
    assert values["headers"] == [("k\ufffd\ufffd\ufffd", b"v\xff\xfe")]
    pa.array([values["app_id"], "k\ufffd"], pa.string())  # no UnicodeEncodeError
