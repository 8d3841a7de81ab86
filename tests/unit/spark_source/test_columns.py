"""The bulk decoder against the per-record one.

Goal: `decode_columns` and `columns_to_batch` are a faster form of `decode_records` and
`to_batch`, never a different one. Method: hypothesis builds runs of random records
(fixed-size runs, which take the vectorised walk, and mixed sizes, which take the
per-record walk), optionally damages one byte or cuts the buffer, and picks random read
bounds; both decoders must then return the same records and DecodeResult, or raise the
same SegmentCorrupted.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqp_gateway.codec.properties import BasicProperties, encode_properties
from spark_source.arrow import arrow_schema, columns_to_batch, to_batch
from spark_source.columns import RUN_RECORDS_MIN, RecordColumns, decode_columns
from streamq.log import format as fmt
from streamq.log.errors import SegmentCorrupted

BASE = 1_000
DECODED = ("properties", "headers")
UNDECODED = ["offset", "timestamp", "stream", "exchange", "routing_key", "body"]
PROPERTIES = [
    b"\x00\x00",
    encode_properties(BasicProperties(content_type="application/json")),
    encode_properties(
        BasicProperties(
            content_type="text/plain",
            headers={"k": "v", "n": 7, "nested": {"a": [1, b"x"]}},
            delivery_mode=2,
            priority=3,
            timestamp=1_700_000_000,
            message_id="m-1",
        )
    ),
]

short = st.binary(max_size=12)
messages = st.builds(fmt.Message, short, short, st.sampled_from(PROPERTIES), st.binary(max_size=40))


@st.composite
def logs(draw: st.DrawFn) -> list[fmt.Message]:
    """Mixed sizes, or a run of one size long enough for the vectorised walk."""
    if draw(st.booleans()):
        return draw(st.lists(messages, max_size=40))
    one = draw(messages)
    count = draw(st.integers(RUN_RECORDS_MIN, 3 * RUN_RECORDS_MIN))
    return [one] * count + draw(st.lists(messages, max_size=3))


def encode(messages: list[fmt.Message]) -> bytes:
    return b"".join(fmt.encode_record(BASE + i, 5_000 + i, m) for i, m in enumerate(messages))


def as_records(columns: RecordColumns) -> list[fmt.Record]:
    out = []
    buffer = columns.buffer
    for i in range(columns.record_count):
        a = int(columns.positions[i]) + fmt.RECORD_HEADER_BYTES
        b = a + int(columns.exchange_lens[i])
        c = b + int(columns.routing_key_lens[i])
        d = c + int(columns.properties_lens[i])
        end = int(columns.ends[i])
        out.append(
            fmt.Record(
                int(columns.offsets[i]),
                int(columns.timestamps_ms[i]),
                buffer[a:b],
                buffer[b:c],
                buffer[c:d],
                buffer[d:end],
            )
        )
    return out


Decoded = tuple[list[fmt.Record], fmt.DecodeResult] | tuple[str, str]


def both(buffer: bytes, *args: int) -> tuple[Decoded, Decoded]:
    """(records, result) or the error, from each decoder with the same arguments."""
    start, expected, offset_end, records_max, skip_before = args
    try:
        out: list[fmt.Record] = []
        result = fmt.decode_records(
            buffer, 32, start, expected, offset_end, out, records_max, "seg", skip_before
        )
        reference: Decoded = (out, result)
    except SegmentCorrupted as exc:
        reference = ("raised", str(exc))
    try:
        columns, result = decode_columns(
            buffer, 32, start, expected, offset_end, records_max, "seg", skip_before
        )
        bulk: Decoded = (as_records(columns), result)
    except SegmentCorrupted as exc:
        bulk = ("raised", str(exc))
    return reference, bulk


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    log=logs(),
    damage=st.none() | st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)),
    cut=st.none() | st.integers(0, 1 << 20),
    bounds=st.tuples(st.integers(0, 60), st.integers(1, 300), st.integers(0, 250)),
)
def test_bulk_decode_equals_per_record_decode(
    log: list[fmt.Message],
    damage: tuple[int, int] | None,
    cut: int | None,
    bounds: tuple[int, int, int],
) -> None:
    buffer = bytearray(encode(log))
    if damage is not None and buffer:
        at, xor = damage
        buffer[at % len(buffer)] ^= xor
    if cut is not None and buffer:
        del buffer[cut % len(buffer) :]
    end_after, records_max, skip_after = bounds
    args = (0, BASE, BASE + end_after, records_max, BASE + skip_after)
    reference, bulk = both(bytes(buffer), *args)
    assert bulk == reference


def test_every_damaged_byte_is_reported_as_the_per_record_decoder_does() -> None:
    # Exhaustive over one record in the middle of a fixed-size run: each byte flipped.
    log = [fmt.Message(b"ex", b"rk", PROPERTIES[1], b"body-0123")] * (2 * RUN_RECORDS_MIN)
    clean = encode(log)
    size = len(clean) // len(log)
    for at in range(RUN_RECORDS_MIN * size, (RUN_RECORDS_MIN + 1) * size):
        buffer = bytearray(clean)
        buffer[at] ^= 0x40
        reference, bulk = both(bytes(buffer), 0, BASE, BASE + len(log), len(log), 0)
        assert bulk == reference, at
        # A grown length field reads as a record cut by the end of the buffer.
        assert reference[0] == "raised" or not reference[1].complete, at


def test_a_bad_crc_raises_the_per_record_error() -> None:
    log = [fmt.Message(b"", b"events", PROPERTIES[0], b"x" * 16)] * 200
    buffer = bytearray(encode(log))
    size = len(buffer) // 200
    buffer[150 * size + 40] ^= 1  # inside record 150's payload
    with pytest.raises(SegmentCorrupted, match="record checksum mismatch") as raised:
        decode_columns(bytes(buffer), 32, 0, BASE, BASE + 200, 500, "seg")
    assert raised.value.position == 32 + 150 * size


@settings(max_examples=100, deadline=None)
@given(
    log=st.lists(
        st.builds(
            fmt.Message,
            st.sampled_from([b"", b"amq.topic", b"bad\xff"]),
            st.binary(max_size=8),
            st.sampled_from(PROPERTIES),
            st.binary(max_size=30),
        ),
        min_size=1,
        max_size=30,
    ),
    include_headers=st.booleans(),
)
def test_columns_to_batch_equals_to_batch(log: list[fmt.Message], include_headers: bool) -> None:
    buffer = encode(log)
    out: list[fmt.Record] = []
    fmt.decode_records(buffer, 0, 0, BASE, BASE + len(log), out, len(log), "seg")
    columns, _ = decode_columns(buffer, 0, 0, BASE, BASE + len(log), len(log), "seg")
    schema = arrow_schema(include_headers)
    expected = to_batch(out, "events", schema, include_headers)
    actual = columns_to_batch(columns, "events", schema, include_headers)
    assert actual.schema.equals(schema)
    assert actual.equals(expected)
    assert pa.Table.from_batches([actual]).to_pylist() == expected.to_pylist()
    # A read that selects neither properties nor headers leaves them null, undecoded.
    bare = columns_to_batch(columns, "events", schema, include_headers, properties=False)
    assert bare.schema.equals(schema)
    assert bare.select(UNDECODED).equals(expected.select(UNDECODED))
    assert all(bare.column(name).null_count == len(log) for name in DECODED if name in schema.names)
