"""The C `deliver_stream_records` over stream clients' native records (AMQP 1.0 messages),
converted inside the run, against the per-record Python path over the Python reference.

Method: Hypothesis draws runs mixing native records (rstream's encoder with random header,
properties, annotations and application properties; filter values or none) with AMQP
0-9-1 records, frames them with the C run (stream key given), and requires the bytes to
equal what the per-record path writes for each record: `to_amqp091_reference`, then
`with_long_header` and `encode_deliver`. A record the C leaves to Python stops the run
before it; the common messages must not.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rstream._pyamqp.message import Properties
from rstream.amqp import AMQPMessage

from amqp_gateway import codec
from amqp_gateway.channels import with_long_header
from streamq.log import format as fmt
from streamq.log.amqp10 import native_properties, to_amqp091_reference
from streamq.log.format import Record
from tests.unit.log.test_amqp10_c import SANITIZED, rstream_messages

STREAM = "orders-é"
TAG = b"ctag"
CHANNEL = 3
FIRST_TAG = 41
PROPS_091 = b"\x90\x00\x0atext/plain\x02"  # content type, delivery mode 2


def python_delivery(record: Record, tag: int, frame_max: int) -> bytes:
    if record.properties[:2] == b"\x00\x02":
        exchange, routing_key, props, body = to_amqp091_reference(STREAM, record)
    else:
        exchange, routing_key, props, body = record[2:]
    out = bytearray()
    spliced = with_long_header(props, "x-stream-offset", record.offset)
    codec.encode_deliver(
        out, CHANNEL, TAG, tag, False, exchange, routing_key, spliced, body, frame_max
    )
    return bytes(out)


def run(records: list[Record], frame_max: int) -> tuple[int, bool]:
    """Frames `records` with the C run and checks its bytes; returns (delivered, stopped)."""
    data = b"".join(fmt.encode_record_parts(*r) for r in records)
    out = bytearray()
    delivered, _position, _next, stopped = codec.deliver_stream_records(
        out, data, 0, records[0].offset, len(records), CHANNEL, TAG, FIRST_TAG, frame_max, 0,
        STREAM.encode(),
    )  # fmt: skip
    expected = b"".join(
        python_delivery(r, FIRST_TAG + i, frame_max) for i, r in enumerate(records[:delivered])
    )
    assert bytes(out) == expected
    assert stopped == (delivered < len(records))
    return delivered, stopped


@settings(
    max_examples=40 if SANITIZED else 200, deadline=None, suppress_health_check=list(HealthCheck)
)
@given(
    st.lists(
        st.tuples(rstream_messages(), st.sampled_from([b"", b"eu"]), st.booleans()),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, 2**40),
    st.sampled_from([4096, 131072, 300]),
)
def test_native_runs_frame_as_the_per_record_path(
    messages: list[tuple[bytes, bytes, bool]], first: int, frame_max: int
) -> None:
    records = [
        Record(first + i, 1, b"", fv, native_properties(i), body)
        if native
        else Record(first + i, 1, b"ex", b"rk", PROPS_091, body)
        for i, (body, fv, native) in enumerate(messages)
    ]
    run(records, frame_max)


def test_rstream_messages_with_properties_go_in_one_run() -> None:
    records = [
        Record(
            10 + i,
            1,
            b"",
            b"eu" if i % 2 else b"",
            native_properties(i),
            bytes(
                AMQPMessage(
                    body=b"p%d" % i,
                    properties=Properties(message_id=f"m-{i}", content_type="application/json"),
                    application_properties={"region": "eu", "kind": "order"},
                )
            ),
        )
        for i in range(20)
    ]
    assert run(records, 131072) == (20, False)


def test_without_a_stream_key_native_records_stop_the_run() -> None:
    record = Record(0, 1, b"", b"", native_properties(0), bytes(AMQPMessage(body=b"x")))
    out = bytearray()
    data = fmt.encode_record_parts(*record)
    result = codec.deliver_stream_records(out, data, 0, 0, 1, CHANNEL, TAG, 1, 4096, 0)
    assert result == (0, 0, 0, True) and out == b""


def test_a_message_only_python_converts_stops_the_run() -> None:
    value = bytes(AMQPMessage(value={"k": 1}))
    records = [
        Record(0, 1, b"", b"", native_properties(0), bytes(AMQPMessage(body=b"a"))),
        Record(1, 1, b"", b"", native_properties(1), value),
    ]
    assert run(records, 4096) == (1, True)
