"""The C conversion of stream-native records (`streamq.log._amqp10`) against the Python
reference `amqp10.to_amqp091_reference`, differentially.

Method: generate AMQP 1.0 messages three ways (the rstream client's encoder with random
header, properties, annotations and application properties; our own `amqp10_types`
encoder over every value kind, sections in any order, repeated or with symbolic
descriptors; and byte mutations of both), then require the C result to equal the
reference exactly, or be None (the C's "the Python does this one"). A second check pins
that the common messages, those real clients send, are the C's and not left to Python.
`convert_records` is held to `convert` record by record. Runs under ASan/UBSan too
(tools/sanitize.sh, tests/test_c_sanitizers.py).
"""

from __future__ import annotations

import os
import struct
import uuid

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from rstream._pyamqp.message import Header, Properties
from rstream.amqp import AMQPMessage

from streamq.log import _amqp10, amqp10
from streamq.log import amqp10_types as t
from streamq.log import format as fmt
from streamq.log.amqp10 import native_properties, to_amqp091_reference
from streamq.log.format import Record

STREAM = "orders-é"
STREAM_KEY = STREAM.encode()
# Fewer under the sanitizers (tools/sanitize.sh preloads them), which run ~5x slower.
SANITIZED = "libasan" in os.environ.get("LD_PRELOAD", "")
_SETTINGS = settings(
    max_examples=60 if SANITIZED else 300, deadline=None, suppress_health_check=list(HealthCheck)
)


def reference(body: bytes, filter_value: bytes) -> tuple[bytes, bytes, bytes, bytes]:
    record = Record(7, 1000, b"", filter_value, native_properties(7), body)
    return to_amqp091_reference(STREAM, record)


def check(body: bytes, filter_value: bytes) -> bool:
    """C == reference, or C declines; returns whether the C took the message."""
    converted = _amqp10.convert(body, STREAM_KEY, filter_value)
    if converted is not None:
        assert converted == reference(body, filter_value)
    return converted is not None


# --- rstream's encoder ---------------------------------------------------------------------

_texts = st.text(max_size=12) | st.sampled_from(["", "x-exchange", "x-cc", "k" * 300])
_simple = (
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 63) - 1)
    | st.floats(allow_nan=False)
    | st.binary(max_size=8)
    | _texts
    | st.uuids()
)
_values = st.recursive(
    _simple,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
_ids = st.none() | _texts | st.binary(max_size=300) | st.uuids() | st.integers(0, (1 << 64) - 1)
_annotation_names = st.sampled_from(
    [
        *("x-exchange", "x-routing-key", "x-basic-type", "x-basic-priority", "x-cc", "x-opt-a"),
        *("x-basic-delivery-mode", "x-basic-expiration", "x-stream-offset", "plain"),
    ]
)


@st.composite
def rstream_messages(draw: st.DrawFn) -> bytes:
    header = draw(
        st.none()
        | st.builds(
            Header,
            durable=st.none() | st.booleans(),
            priority=st.none() | st.integers(0, 255),
            ttl=st.none() | st.integers(0, (1 << 32) - 1),
        )
    )
    properties = draw(
        st.none()
        | st.builds(
            Properties,
            message_id=_ids,
            user_id=st.none() | st.binary(max_size=300),
            reply_to=st.none() | _texts,
            correlation_id=_ids,
            content_type=st.none() | _texts,
            content_encoding=st.none() | _texts,
            creation_time=st.none() | st.integers(0, 1 << 50),
            group_id=st.none() | _texts,
        )
    )
    annotations = draw(st.none() | st.dictionaries(_annotation_names, _values, max_size=4))
    application = draw(st.none() | st.dictionaries(_texts, _values, max_size=4))
    body = draw(st.binary(max_size=300))
    message = AMQPMessage(
        body=body,
        header=header,
        properties=properties,
        message_annotations=annotations,
        application_properties=application,
    )
    try:
        return bytes(message)
    except (ValueError, TypeError, struct.error, OverflowError):
        assume(False)  # rstream's encoder refuses it (e.g. a negative int in a uint field)
        raise


@_SETTINGS
@given(rstream_messages(), st.sampled_from([b"", b"blue", b"\xff"]))
def test_rstream_messages(body: bytes, filter_value: bytes) -> None:
    check(body, filter_value)


# --- our own encoder: every kind, any section order ---------------------------------------

_leaf = st.one_of(
    st.just(t.NULL),
    st.tuples(st.just("bool"), st.booleans()),
    st.tuples(st.just("ubyte"), st.integers(0, 255)),
    st.tuples(st.just("ushort"), st.integers(0, 65535)),
    st.tuples(st.just("uint"), st.integers(0, (1 << 32) - 1) | st.integers(0, 300)),
    st.tuples(st.just("ulong"), st.integers(0, (1 << 64) - 1) | st.integers(0, 300)),
    st.tuples(st.just("byte"), st.integers(-128, 127)),
    st.tuples(st.just("short"), st.integers(-(1 << 15), (1 << 15) - 1)),
    st.tuples(st.just("int"), st.integers(-(1 << 31), (1 << 31) - 1)),
    st.tuples(st.just("long"), st.integers(-(1 << 63), (1 << 63) - 1)),
    st.tuples(st.just("float"), st.floats(width=32)),
    st.tuples(st.just("double"), st.floats()),
    st.tuples(st.just("timestamp"), st.integers(-(1 << 63), (1 << 63) - 1)),
    st.tuples(st.just("uuid"), st.binary(min_size=16, max_size=16)),
    st.tuples(st.just("decimal64"), st.binary(min_size=8, max_size=8)),
    st.tuples(st.just("char"), st.characters(exclude_categories=["Cs"])),
    st.tuples(st.just("binary"), st.binary(max_size=300)),
    st.tuples(st.sampled_from(["string", "symbol"]), _texts),
)
_tagged = st.recursive(
    _leaf,
    lambda inner: (
        st.tuples(st.sampled_from(["list", "array"]), st.lists(inner, max_size=3))
        | st.tuples(st.just("map"), st.lists(st.tuples(inner, inner), max_size=3))
        | st.tuples(st.just("described"), st.tuples(_leaf, inner))
    ),
    max_leaves=8,
)
_keys = st.tuples(st.sampled_from(["symbol", "string"]), _annotation_names | _texts) | _leaf


def _map(pairs: st.SearchStrategy[list[tuple[t.Value, t.Value]]]) -> st.SearchStrategy[t.Value]:
    return st.tuples(st.just("map"), pairs)


_sections = st.one_of(
    st.tuples(st.just(t.SECTION_HEADER), st.tuples(st.just("list"), st.lists(_tagged, max_size=4))),
    st.tuples(st.just(t.SECTION_DELIVERY_ANNOTATIONS), _map(st.lists(st.tuples(_keys, _tagged)))),
    st.tuples(
        st.just(t.SECTION_MESSAGE_ANNOTATIONS),
        _map(st.lists(st.tuples(_keys, _tagged), max_size=4)),
    ),
    st.tuples(
        st.just(t.SECTION_PROPERTIES), st.tuples(st.just("list"), st.lists(_tagged, max_size=13))
    ),
    st.tuples(
        st.just(t.SECTION_APPLICATION_PROPERTIES),
        _map(st.lists(st.tuples(_keys, _tagged), max_size=4)),
    ),
    st.tuples(st.just(t.SECTION_DATA), st.tuples(st.just("binary"), st.binary(max_size=300))),
    st.tuples(st.sampled_from([0x76, 0x77, 0x78, 0x70, 0x73]), _tagged),
)


def _encode(sections: list[tuple[int, t.Value]], symbolic: bool) -> bytes:
    names = {code: name for name, code in t._SECTION_NAMES.items()}
    out = bytearray()
    for code, value in sections:
        if symbolic:
            out.append(0x00)
            t.encode_value(out, ("symbol", names[code]))
            t.encode_value(out, value)
        else:
            t.encode_section(out, code, value)
    return bytes(out)


@_SETTINGS
@given(st.lists(_sections, max_size=6), st.booleans(), st.sampled_from([b"", b"f"]))
def test_own_encoder_messages(
    sections: list[tuple[int, t.Value]], symbolic: bool, filter_value: bytes
) -> None:
    try:
        body = _encode(sections, symbolic)
    except t.Amqp10Malformed:
        return  # a value its kind cannot carry (a char outside UTF-32)
    check(body, filter_value)


# --- byte mutations ------------------------------------------------------------------------


@_SETTINGS
@given(
    rstream_messages(),
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, 1 << 16),
)
def test_mutated_messages(body: bytes, changes: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(body)
    for at, byte in changes:
        if data:
            data[at % len(data)] = byte
    check(bytes(data[: max(cut, len(data) // 2)]), b"f")


# --- what the C must take --------------------------------------------------------------------

UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def test_the_common_messages_are_the_cs() -> None:
    """What rstream and the Java client send (properties with ids, content type and
    creation time, application properties of simple types, annotations, one or more data
    sections) converts in C, equal to the reference."""
    props = Properties(
        message_id=UUID,
        correlation_id=12345,
        content_type="application/json",
        content_encoding="utf-8",
        creation_time=1_700_000_000_123,
        reply_to="r",
        group_id="g",
        user_id=b"guest",
    )
    messages = [
        AMQPMessage(body=b"x" * 40, properties=props, application_properties={"a": "b", "n": 1}),
        AMQPMessage(
            body=b"y",
            header=Header(durable=True, priority=3, ttl=100),
            message_annotations={"x-exchange": "ex", "x-routing-key": "rk", "x-basic-type": "t"},
            application_properties={"f": 1.5, "ok": True, "raw": b"\x00", "none": None},
        ),
        AMQPMessage(
            body=b"z",
            message_annotations={"x-basic-delivery-mode": 2, "x-cc": ["a", "b"], "x-o": {"k": 1}},
            properties=Properties(message_id="m" * 300, correlation_id=b"\x01"),
        ),
    ]
    for message in messages:
        assert check(bytes(message), b"blue")
    two_data = b"\x00\x53\x75\xa0\x02ab" + b"\x00\x53\x75\xb0\x00\x00\x00\x01c"
    assert check(two_data, b"")
    assert _amqp10.convert(two_data, STREAM_KEY, b"")[3] == b"abc"  # type: ignore[index]


def test_amqp_value_and_malformed_are_pythons() -> None:
    assert _amqp10.convert(bytes(AMQPMessage(value={"k": 1})), STREAM_KEY, b"") is None
    assert _amqp10.convert(b"\x00\x53\x75\xa0\x09ab", STREAM_KEY, b"") is None
    record = Record(1, 2, b"", b"", native_properties(1), b"\x00\x53\x77\x41")
    assert amqp10.to_amqp091(STREAM, record) == to_amqp091_reference(STREAM, record)


# --- convert_records -------------------------------------------------------------------------


def _records_buffer(records: list[Record]) -> tuple[bytes, list[np.ndarray]]:
    encoded = b"".join(fmt.encode_record_parts(*r) for r in records)
    positions, ends, lens = [], [], []
    at = 0
    for r in records:
        size = struct.unpack_from("<I", encoded, at)[0] + 4
        positions.append(at)
        ends.append(at + size)
        lens.append((len(r.exchange), len(r.routing_key), len(r.properties)))
        at += size
    arrays = [np.array(positions, np.int64), np.array(ends, np.int64)]
    arrays += [np.array([x[k] for x in lens], np.int64) for k in range(3)]
    return encoded, arrays


@_SETTINGS
@given(st.lists(rstream_messages(), min_size=1, max_size=5), st.booleans())
def test_convert_records_equals_convert(bodies: list[bytes], mixed: bool) -> None:
    records = [Record(i, 1, b"", b"fv", native_properties(i), b) for i, b in enumerate(bodies)]
    if mixed:
        records.append(Record(len(records), 1, b"ex", b"rk", b"\x80\x00\x01t", b"091"))
    buffer, arrays = _records_buffer(records)
    columns = _amqp10.convert_records(buffer, *arrays, STREAM_KEY)
    expected = [amqp10.as_amqp091(STREAM, r) for r in records]
    if columns is None:
        assert any(_amqp10.convert(r.body, STREAM_KEY, b"fv") is None for r in records[:5])
        return
    for k, field in enumerate(("exchange", "routing_key", "properties", "body")):
        data, offsets = columns[k]
        bounds = np.frombuffer(offsets, np.int32)
        values = [data[bounds[i] : bounds[i + 1]] for i in range(len(records))]
        assert values == [getattr(r, field) for r in expected]


def _data_section(payload: bytes) -> bytes:
    size = len(payload)
    length = bytes([0xA0, size]) if size < 256 else b"\xb0" + size.to_bytes(4, "big")
    return b"\x00\x53\x75" + length + payload


@_SETTINGS
@given(
    st.lists(rstream_messages(), min_size=1, max_size=3),
    st.lists(
        st.tuples(st.integers(0, 2), st.binary(max_size=400), st.sampled_from((b"", b"fv", b"fw"))),
        min_size=1,
        max_size=12,
    ),
)
def test_convert_records_equals_convert_for_runs_sharing_a_head(
    messages: list[bytes], picks: list[tuple[int, bytes, bytes]]
) -> None:
    """Records whose messages share everything before one data section (what one
    publisher sends), with other bodies (one- and four-byte sizes) and filter values in
    between: the run's conversion, which copies what a shared head converted to, equals
    the per-record one. A message not ending in one data section keeps its own."""
    records = []
    for i, (which, payload, filter_value) in enumerate(picks):
        message = messages[which % len(messages)]
        tail = message.rfind(b"\x00\x53\x75")
        head = message[:tail] if tail >= 0 else message
        body = head + _data_section(payload) if tail >= 0 else message
        records.append(Record(i, 1, b"", filter_value, native_properties(i), body))
    buffer, arrays = _records_buffer(records)
    columns = _amqp10.convert_records(buffer, *arrays, STREAM_KEY)
    expected = [amqp10.as_amqp091(STREAM, r) for r in records]
    alone = [_amqp10.convert(r.body, STREAM_KEY, r.routing_key) for r in records]
    assert (columns is None) == (None in alone)
    if columns is None:
        return
    for k, field in enumerate(("exchange", "routing_key", "properties", "body")):
        data, offsets = columns[k]
        bounds = np.frombuffer(offsets, np.int32)
        values = [data[bounds[i] : bounds[i + 1]] for i in range(len(records))]
        assert values == [getattr(r, field) for r in expected], field


def test_convert_records_refuses_bad_bounds() -> None:
    buffer, arrays = _records_buffer([Record(0, 1, b"", b"", native_properties(0), b"")])
    arrays[1] = arrays[1] + 100  # ends past the buffer
    assert _amqp10.convert_records(buffer, *arrays, STREAM_KEY) is None
    arrays[1] = np.array([1, 2], np.int64)
    try:
        _amqp10.convert_records(buffer, *arrays, STREAM_KEY)
    except ValueError:
        pass
    else:
        raise AssertionError("arrays of different sizes were accepted")
