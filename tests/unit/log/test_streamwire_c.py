"""The C module `streamq.log._streamwire` against Python references, and on hostile input.

Publish payloads: random and mutated bytes either parse or raise ValueError, never crash
(tools/sanitize.sh runs this file under ASan and UBSan); parsed records equal
`format.encode_record_parts` of the same message. Chunks: every damaged byte of a record
is reported, never read past; the 0-9-1 filter header is found however the properties
are laid out.
"""

from __future__ import annotations

import contextlib
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_gateway.codec.properties import BasicProperties, encode_properties
from streamq.log import _streamwire, amqp10
from streamq.log import format as fmt

BIG = 1 << 30


def message(publishing_id: int, body: bytes, filter_value: bytes | None, v2: bool) -> bytes:
    head = struct.pack(">Q", publishing_id)
    if v2:
        fv = filter_value
        head += struct.pack(">h", -1) if fv is None else struct.pack(">h", len(fv)) + fv
    return head + struct.pack(">I", len(body)) + body


messages_strategy = st.lists(
    st.tuples(
        st.integers(0, (1 << 64) - 1),
        st.binary(max_size=40),
        st.one_of(st.none(), st.binary(max_size=20)),
    ),
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(messages=messages_strategy, v2=st.booleans(), reference=st.binary(max_size=8))
def test_records_equal_the_python_encoder(
    messages: list[tuple[int, bytes, bytes | None]], v2: bool, reference: bytes
) -> None:
    data = struct.pack(">I", len(messages)) + b"".join(
        message(i, body, fv, v2) for i, body, fv in messages
    )
    records, count, appended, ids, sequence = _streamwire.encode_publish(
        2 if v2 else 1, data, 100, 7, reference, 0, BIG
    )
    expected: list[bytes] = []
    seq = 0
    for i, body, fv in messages:
        if reference and i <= seq:
            continue
        seq = i if reference else seq
        routing_key = (fv or b"") if v2 else b""
        props = amqp10.native_properties(i)
        expected.append(
            fmt.encode_record_parts(100 + len(expected), 7, reference, routing_key, props, body)
        )
    assert records == b"".join(expected)
    assert (count, appended, sequence) == (len(messages), len(expected), seq)
    assert ids == b"".join(struct.pack(">Q", i) for i, _, _ in messages)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200), version=st.integers(0, 3))
def test_random_payloads_parse_or_raise(data: bytes, version: int) -> None:
    with contextlib.suppress(ValueError):
        _streamwire.encode_publish(version, data, 0, 0, b"r", 5, BIG)


@settings(max_examples=300, deadline=None)
@given(
    messages=messages_strategy,
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=4),
)
def test_mutated_payloads_parse_or_raise(
    messages: list[tuple[int, bytes, bytes | None]], flips: list[tuple[int, int]]
) -> None:
    data = bytearray(
        struct.pack(">I", len(messages)) + b"".join(message(*m, v2=True) for m in messages)
    )
    for at, mask in flips:
        if data:
            data[at % len(data)] ^= mask
    with contextlib.suppress(ValueError):
        _streamwire.encode_publish(2, bytes(data), 0, 0, b"", 0, BIG)


def native(offset: int, body: bytes, filter_value: bytes = b"") -> bytes:
    props = amqp10.native_properties(offset)
    return fmt.encode_record_parts(offset, 1, b"", filter_value, props, body)


def add(data: bytes, values: tuple[bytes, ...] | None = None, unfiltered: bool = False) -> tuple:
    out = bytearray(48)
    result = _streamwire.chunk_add(
        out, data, 0, 0, 0, 1 << 40, 100, BIG, fail_convert, values, unfiltered, 0, -1, 0, False
    )
    return (bytes(out[48:]), *result)


def fail_convert(exchange: bytes, routing_key: bytes, properties: bytes, body: bytes) -> bytes:
    raise AssertionError("no 0-9-1 record here")


def test_every_damaged_byte_of_a_record_is_reported() -> None:
    data = native(0, b"abc") + native(1, b"defg")
    assert add(data)[0] == b"\x00\x00\x00\x03abc\x00\x00\x00\x04defg"
    second = len(native(0, b"abc"))
    for at in range(second, len(data)):
        damaged = bytearray(data)
        damaged[at] ^= 0x01
        try:
            _entries, position, next_offset, records, *_ = add(bytes(damaged))
        except ValueError as exc:
            assert f"position {second}" in str(exc)
            continue
        # Only a length made larger can read as a partial record: then it stops there.
        assert (position, next_offset, records) == (second, 1, 1)
        assert at < second + 4


def test_partial_data_stops_before_the_partial_record() -> None:
    data = native(0, b"abc") + native(1, b"defg")
    for cut in range(len(data)):
        _, position, next_offset, records, *_ = add(data[:cut])
        assert records == next_offset
        assert position == (0 if next_offset == 0 else len(native(0, b"abc")))


def amqp_record(offset: int, properties: bytes) -> bytes:
    return fmt.encode_record_parts(offset, 1, b"", b"q", properties, b"body")


@pytest.mark.parametrize(
    ("properties", "taken"),
    [
        (BasicProperties(headers={"x-stream-filter-value": "eu"}), True),
        (
            BasicProperties(
                content_type="a",
                content_encoding="b",
                headers={"n": 1, "t": {"x": [1, "y"]}, "x-stream-filter-value": "eu"},
            ),
            True,
        ),
        (BasicProperties(headers={"x-stream-filter-value": "us"}), False),
        (BasicProperties(headers={"other": "eu"}), None),
        (BasicProperties(content_type="x"), None),
    ],
)
def test_amqp_filter_value_is_the_header(properties: BasicProperties, taken: bool | None) -> None:
    raw = encode_properties(properties)
    out = bytearray(48)
    calls: list[bytes] = []

    def convert(exchange: bytes, routing_key: bytes, props: bytes, body: bytes) -> bytes:
        calls.append(props)
        return b"converted"

    for unfiltered in (False, True):
        calls.clear()
        _streamwire.chunk_add(
            out, amqp_record(0, raw), 0, 0, 0, 1, 10, BIG, convert, (b"eu",), unfiltered, 0, -1,
            0, False,
        )  # fmt: skip
        expected = taken if taken is not None else unfiltered
        assert calls == ([raw] if expected else [])


@settings(max_examples=300, deadline=None)
@given(properties=st.binary(max_size=80), unfiltered=st.booleans())
def test_random_properties_never_crash_the_filter(properties: bytes, unfiltered: bool) -> None:
    out = bytearray(48)
    _streamwire.chunk_add(
        out, amqp_record(0, properties), 0, 0, 0, 1, 10, BIG, lambda *a: b"", (b"eu",),
        unfiltered, 0, -1, 0, False,
    )  # fmt: skip


def test_span_indexed_lists_the_due_entries() -> None:
    records = b"".join(native(i, b"x" * 22) for i in range(10))  # 64 bytes each
    end, count, rels, positions, last = _streamwire.span_indexed(records, 0, 1000, 5, 872, 128, BIG)
    assert (end, count) == (640, 10)
    assert struct.unpack("=5I", rels) == (5, 7, 9, 11, 13)
    assert struct.unpack("=5I", positions) == (1000, 1128, 1256, 1384, 1512) and last == 1512
    end, count, *_ = _streamwire.span_indexed(records, 64, 0, 0, 0, 128, 130)
    assert (end, count) == (192, 2)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=5000), st.integers(min_value=0, max_value=40))
def test_crc32_is_zlibs_on_any_length_and_start(data: bytes, start: int) -> None:
    start = min(start, len(data))
    assert _streamwire.crc32(data, start) == zlib.crc32(data[start:])


def test_crc32_of_large_buffers_and_bad_starts() -> None:
    data = bytes(range(256)) * 8192 + b"tail"  # the folding path, then the byte tail
    for start in (0, 1, 15, 16, 63, 64, 65):
        assert _streamwire.crc32(data, start) == zlib.crc32(data[start:])
    assert _streamwire.crc32(bytearray(100), 0) == zlib.crc32(bytes(100))
    for start in (-1, 101):
        with pytest.raises(ValueError, match="start out of the data"):
            _streamwire.crc32(bytes(100), start)
