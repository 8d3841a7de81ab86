"""Native records (stream clients' AMQP 1.0 messages with properties, annotations and
application properties) take the column-wise C conversion in `columns_to_batch`, and its
batches equal `to_batch` over the Python reference's conversion, every column and the
headers included.

Method: Hypothesis draws runs of messages from rstream's encoder (random header,
properties, annotations, application properties; some 0-9-1 records mixed in), encodes
them as log records, decodes them with the executor's `decode_columns`, and compares the
fast batch with `to_batch` of records converted beforehand by `to_amqp091_reference`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rstream._pyamqp.message import Properties
from rstream.amqp import AMQPMessage

from amqp_gateway.codec.properties import BasicProperties, encode_properties
from spark_source import arrow
from spark_source import properties as spark_properties
from spark_source.arrow import arrow_schema, columns_to_batch, to_batch
from spark_source.columns import RecordColumns, decode_columns
from streamq.log import amqp091
from streamq.log import format as fmt
from streamq.log.amqp091 import PropertiesMalformed
from streamq.log.amqp10 import native_properties, to_amqp091_reference, to_amqp10
from streamq.log.format import Record
from tests.unit.log.test_amqp10_c import SANITIZED, rstream_messages

STREAM = "events"
T = TypeVar("T")


def columns_of(records: list[Record]) -> RecordColumns:
    buffer = b"".join(fmt.encode_record_parts(*r) for r in records)
    columns, _ = decode_columns(buffer, 0, 0, 0, len(records), len(records), "test")
    return columns


def reference_batch(records: list[Record], include_headers: bool) -> pa.RecordBatch:
    converted = [
        Record(r.offset, r.timestamp_ms, *to_amqp091_reference(STREAM, r))
        if r.properties[:2] == b"\x00\x02"
        else r
        for r in records
    ]
    return to_batch(converted, STREAM, arrow_schema(include_headers), include_headers)


@settings(
    max_examples=40 if SANITIZED else 150, deadline=None, suppress_health_check=list(HealthCheck)
)
@given(
    st.lists(st.tuples(rstream_messages(), st.sampled_from([b"", b"eu"])), min_size=1, max_size=8),
    st.booleans(),
    st.booleans(),
)
def test_native_batches_equal_the_reference(
    messages: list[tuple[bytes, bytes]], mixed: bool, include_headers: bool
) -> None:
    records = [
        Record(i, 1_000 + i, b"", fv, native_properties(i), body)
        for i, (body, fv) in enumerate(messages)
    ]
    if mixed:
        props = b"\x90\x00\x0atext/plain\x02"  # content type and delivery mode
        records.insert(0, Record(0, 999, b"ex", b"rk", props, b"091"))
        records = [Record(i, *r[1:]) for i, r in enumerate(records)]
    schema = arrow_schema(include_headers)
    fast = outcome(lambda: columns_to_batch(columns_of(records), STREAM, schema, include_headers))
    expected = outcome(lambda: reference_batch(records, include_headers))
    if isinstance(expected, pa.RecordBatch):
        assert isinstance(fast, pa.RecordBatch) and fast.equals(expected)
        undecoded = [f.name for f in schema if f.name not in ("properties", "headers")]
        bare = columns_to_batch(
            columns_of(records), STREAM, schema, include_headers, properties=False
        )
        assert bare.select(undecoded).equals(expected.select(undecoded))
    else:  # a property that is not UTF-8 fails both (pyarrow strings): the same error
        assert type(fast) is type(expected)


def outcome(make: Callable[[], T]) -> T | Exception:
    try:
        return make()
    except (UnicodeEncodeError, PropertiesMalformed, OverflowError) as exc:
        return exc


def test_messages_with_properties_take_the_c_columns() -> None:
    """The rstream/Java producers' messages (ids, content type, application properties)
    are converted column-wise, not record by record."""
    records = [
        Record(
            i,
            1_000,
            b"",
            b"",
            native_properties(i),
            bytes(
                AMQPMessage(
                    body=b"p%d" % i,
                    properties=Properties(message_id=i, content_type="application/json"),
                    application_properties={"region": "eu", "seq": i},
                )
            ),
        )
        for i in range(50)
    ]
    columns = columns_of(records)
    assert arrow._data_only_payloads(columns) is None
    converted = arrow._converted(columns, STREAM)
    assert converted is not None
    assert arrow._split_properties(converted[2], 50, True) is not None
    assert converted[3].to_pylist() == [b"p%d" % i for i in range(50)]
    fast = columns_to_batch(columns, STREAM, arrow_schema(True), True)
    assert fast.equals(reference_batch(records, True))
    assert fast.column("properties").to_pylist()[7]["message_id"] == "7"


@pytest.mark.parametrize("include_headers", [True, False])
def test_one_publishers_properties_are_decoded_once_per_distinct_value(
    include_headers: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages whose properties repeat (an AMQP 0-9-1 publisher's, stored as AMQP 1.0)
    take the per-distinct decode, not the per-row split, and give the reference batch."""

    def message(i: int) -> bytes:
        properties = BasicProperties(content_type="a/b", headers={"h": i % 3})
        return to_amqp10(b"x", b"k%d" % (i % 2), encode_properties(properties), b"p%d" % i)

    records = [Record(i, 1_000, b"", b"", native_properties(i), message(i)) for i in range(64)]
    monkeypatch.setattr(arrow, "_split_properties", None)  # never called
    batch = columns_to_batch(columns_of(records), STREAM, arrow_schema(include_headers),
                             include_headers)  # fmt: skip
    assert batch.equals(reference_batch(records, include_headers))
    assert batch.column("routing_key").to_pylist()[:2] == ["k0", "k1"]


def test_a_message_only_python_converts_sends_the_batch_to_to_batch() -> None:
    value = bytes(AMQPMessage(value={"k": 1}))
    records = [Record(i, 1, b"", b"", native_properties(i), value) for i in range(3)]
    columns = columns_of(records)
    assert arrow._converted(columns, STREAM) is None
    fast = columns_to_batch(columns, STREAM, arrow_schema(True), True)
    assert fast.equals(reference_batch(records, True))


_shortstrs = st.none() | st.text(max_size=5)


@settings(
    max_examples=50 if SANITIZED else 200, deadline=None, suppress_health_check=list(HealthCheck)
)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "content_type": _shortstrs,
                "headers": st.none()
                | st.lists(
                    st.tuples(st.text(max_size=3), st.just("S"), st.text(max_size=3)), max_size=2
                ),
                "delivery_mode": st.none() | st.integers(0, 255),
                "timestamp": st.none() | st.integers(0, 1 << 40) | st.integers(0, (1 << 64) - 1),
                "message_id": _shortstrs,
                "cluster_id": _shortstrs,
            }
        ),
        min_size=1,
        max_size=6,
    ),
    st.just(b"") | st.binary(max_size=6),
)
def test_split_properties_equals_the_dictionary_path(
    fields: list[dict[str, object]], junk: bytes
) -> None:
    """0-9-1 property lists (and junk) split in C give the struct and headers the
    per-distinct decode gives, or the C declines."""
    raws = [amqp091.encode_properties(f) for f in fields] + ([junk] if junk else [])
    properties = pa.array(raws, pa.binary())
    split = outcome(lambda: arrow._split_properties(properties, len(raws), True))
    if split is None:  # malformed, or a timestamp past int64 microseconds: the Python's
        return
    decoded = outcome(lambda: [spark_properties.decode_properties(raw) for raw in raws])
    if isinstance(decoded, Exception) or isinstance(split, Exception):
        assert type(decoded) is type(split)
        return
    struct = arrow._properties_array(decoded)
    headers = pa.array([d.get("headers") for d in decoded], arrow.HEADERS_TYPE)
    assert split[0].equals(struct) and split[1].equals(headers)
