"""The C `deliver_stream_records` against the per-record Python path as its oracle.

For a run of segment-log records, the C function must append exactly what the stream's
per-record path appends: `encode_deliver` with the properties that `with_long_header`
gives (`x-stream-offset` spliced in), delivery tags counting up, redelivered false. A
record it leaves to Python (the name already there, properties it cannot splice simply,
or too large for one frame after the splice) stops the run before it, and from that
record on the Python path is what runs. Hypothesis drives properties with and without
headers, with content-type and content-encoding before the table and other properties
after it, raw property bytes of any shape, bodies over several frames and small
frame_max values.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_gateway import codec
from amqp_gateway.channels import with_long_header
from amqp_gateway.codec.properties import BasicProperties, encode_properties
from streamq.log import format as fmt

from .strategies import basic_properties

TAG = b"ctag"
CHANNEL = 3
FIRST_TAG = 41
PREFIX = b"earlier frames"


def records_of(first: int, messages: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The records, offsets from `first` (exchange and routing key vary)."""
    return [
        fmt.encode_record_parts(first + i, 1000 + i, b"ex" * (i % 2), b"rk%d" % i, props, body)
        for i, (props, body) in enumerate(messages)
    ]


def segment(first: int, messages: list[tuple[bytes, bytes]]) -> bytes:
    """Records back to back."""
    return b"".join(records_of(first, messages))


def python_deliveries(
    first: int, messages: list[tuple[bytes, bytes]], frame_max: int, skip: int = 0
) -> list[bytes]:
    """What the per-record path appends for each message from index `skip` on, delivery
    tags from FIRST_TAG (its bytes, or b"" where it raises)."""
    frames = []
    for i, (props, body) in enumerate(messages):
        if i < skip:
            continue
        out = bytearray()
        try:
            spliced = with_long_header(props, "x-stream-offset", first + i)
            codec.encode_deliver(
                out, CHANNEL, TAG, FIRST_TAG + i - skip, False, b"ex" * (i % 2), b"rk%d" % i,
                spliced, body, frame_max,
            )  # fmt: skip
        except Exception:  # the per-record path's own outcome: not the run's to reproduce
            out = bytearray()
        frames.append(bytes(out))
    return frames


def c_run(
    records: bytes, position: int, first: int, count: int, frame_max: int, out_max: int = 0
) -> tuple[bytes, tuple[int, int, int, bool]]:
    out = bytearray(PREFIX)
    result = codec.deliver_stream_records(
        out, records, position, first, count, CHANNEL, TAG, FIRST_TAG, frame_max, out_max
    )
    assert out.startswith(PREFIX)
    return bytes(out[len(PREFIX) :]), result


def check_against_python(
    messages: list[tuple[bytes, bytes]], first: int, frame_max: int
) -> tuple[int, bool]:
    records = segment(first, messages)
    written, (delivered, position, next_offset, stopped) = c_run(
        records, 0, first, len(messages), frame_max
    )
    expected = python_deliveries(first, messages, frame_max)
    assert written == b"".join(expected[:delivered])
    # Where it stopped: the position and offset of the first record not delivered.
    ends = [0]
    for record in records_of(first, messages):
        ends.append(ends[-1] + len(record))
    assert position == ends[delivered]
    assert next_offset == (first + delivered if delivered or stopped else -1)
    assert stopped == (delivered < len(messages))
    return delivered, stopped


table_free_names = st.text(max_size=20).filter(lambda s: "x-stream-offset" not in s)
properties = st.one_of(
    basic_properties,
    st.builds(
        BasicProperties,
        content_type=st.none() | table_free_names,
        content_encoding=st.none() | table_free_names,
        headers=st.none() | st.dictionaries(table_free_names, st.integers(-5, 5), max_size=3),
        delivery_mode=st.none() | st.integers(1, 2),
        message_id=st.none() | table_free_names,
        app_id=st.none() | table_free_names,
    ),
).map(encode_properties)


@settings(max_examples=400, deadline=None)
@given(
    messages=st.lists(st.tuples(properties, st.binary(max_size=300)), min_size=1, max_size=6),
    first=st.integers(0, 2**40),
    frame_max=st.sampled_from([4096, 200, 131072]),
)
def test_well_formed_properties_frame_as_python_frames_them(
    messages: list[tuple[bytes, bytes]], first: int, frame_max: int
) -> None:
    delivered, stopped = check_against_python(messages, first, frame_max)
    # Only a record that names x-stream-offset (a header or a value may) or that no
    # longer fits one frame is left to Python.
    if stopped:
        props = messages[delivered][0]
        spliced = with_long_header(props, "x-stream-offset", first + delivered)
        assert b"x-stream-offset" in props or len(spliced) + 12 > frame_max - 8


@settings(max_examples=400, deadline=None)
@given(
    messages=st.lists(
        st.tuples(
            st.one_of(
                st.binary(max_size=40),
                st.tuples(st.sampled_from([0xE000, 0x2000, 0xA000, 0x6004]), st.binary()).map(
                    lambda fb: struct.pack(">H", fb[0]) + fb[1]
                ),
            ),
            st.binary(max_size=20),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_any_property_bytes_frame_as_python_or_stop_the_run(
    messages: list[tuple[bytes, bytes]],
) -> None:
    """Malformed property lists: the C walk either splices as add_long_header does or
    leaves the record to the per-record path; it never reads past the properties."""
    check_against_python(messages, 7, 4096)


def test_a_table_with_properties_before_and_after_it() -> None:
    props = encode_properties(
        BasicProperties(
            content_type="text/plain",
            content_encoding="gzip",
            headers={"a": 1, "b": "two"},
            delivery_mode=2,
            correlation_id="c",
            timestamp=5,
            cluster_id="x",
        )
    )
    assert check_against_python([(props, b"body")] * 3, 10, 4096) == (3, False)


def test_no_headers_gets_a_new_table_after_content_type_and_encoding() -> None:
    props = encode_properties(
        BasicProperties(content_type="a", content_encoding="b", priority=3, app_id="z")
    )
    assert check_against_python([(props, b"")] * 2, 0, 4096) == (2, False)
    decoded = codec.decode_properties(with_long_header(props, "x-stream-offset", 0))
    assert decoded.headers == {"x-stream-offset": 0}


def test_an_offset_header_already_there_stops_the_run_before_it() -> None:
    plain = encode_properties(BasicProperties())
    carrying = encode_properties(BasicProperties(headers={"x-stream-offset": 99}))
    messages = [(plain, b"a"), (plain, b"b"), (carrying, b"c"), (plain, b"d")]
    assert check_against_python(messages, 5, 4096) == (2, True)


def test_a_record_that_no_longer_fits_a_frame_stops_the_run() -> None:
    frame_max = 100
    fits = encode_properties(BasicProperties(content_type="t" * 40))  # 44 bytes
    too_big = encode_properties(BasicProperties(content_type="t" * 60))  # 64 + 29 > 92
    messages = [(fits, b"x" * 300), (too_big, b"y")]
    assert check_against_python(messages, 0, frame_max) == (1, True)


def test_records_before_first_are_passed_over_and_a_stop_right_away_says_where() -> None:
    plain = encode_properties(BasicProperties())
    carrying = encode_properties(BasicProperties(headers={"x-stream-offset": 1}))
    messages = [(plain, b"a"), (plain, b"b"), (carrying, b"c")]
    records = segment(10, messages)
    second = len(segment(10, [(plain, b"a")]))
    third = len(segment(10, [(plain, b"a"), (plain, b"b")]))
    written, result = c_run(records, 0, 11, 5, 4096)
    assert result == (1, third, 12, True)
    assert written == python_deliveries(10, messages, 4096, skip=1)[0]
    written, result = c_run(records, third, 12, 5, 4096)
    assert (written, result) == (b"", (0, third, 12, True))
    # Offsets are counted from first_offset; delivery tags from FIRST_TAG.
    written, result = c_run(records, second, 11, 1, 4096)
    assert result == (1, third, 12, False)


def test_count_output_limit_and_a_partial_record_end_the_run() -> None:
    plain = encode_properties(BasicProperties())
    each = records_of(0, [(plain, b"z" * 100)] * 4)
    records = b"".join(each)
    ends = [sum(map(len, each[:n])) for n in range(5)]
    assert c_run(records, 0, 0, 2, 4096)[1] == (2, ends[2], 2, False)
    assert c_run(records, 0, 0, 4, 4096, out_max=1)[1] == (1, ends[1], 1, False)
    assert c_run(records[:-1], 0, 0, 4, 4096)[1] == (3, ends[3], 3, False)
    assert c_run(b"", 0, 0, 4, 4096)[1] == (0, 0, -1, False)


def test_damaged_records_raise_and_append_nothing() -> None:
    plain = encode_properties(BasicProperties())
    records = bytearray(segment(0, [(plain, b"a"), (plain, b"b")]))
    out = bytearray(PREFIX)
    gap = segment(0, [(plain, b"a")]) + segment(2, [(plain, b"b")])
    with pytest.raises(ValueError, match=r"offset 2 at .* where 1 was expected"):
        codec.deliver_stream_records(out, gap, 0, 0, 2, 1, TAG, 1, 4096, 0)
    bad_flags = bytearray(records)
    bad_flags[26] = 1
    with pytest.raises(ValueError, match="bad record at 0"):
        codec.deliver_stream_records(out, bad_flags, 0, 0, 2, 1, TAG, 1, 4096, 0)
    short = bytearray(records)
    short[0:4] = (3).to_bytes(4, "little")
    with pytest.raises(ValueError, match="bad record length 3"):
        codec.deliver_stream_records(out, short, 0, 0, 2, 1, TAG, 1, 4096, 0)
    fields_too_long = bytearray(records)
    fields_too_long[28:32] = (1000).to_bytes(4, "little")
    with pytest.raises(ValueError, match="bad record at 0"):
        codec.deliver_stream_records(out, fields_too_long, 0, 0, 2, 1, TAG, 1, 4096, 0)
    with pytest.raises(ValueError, match="out of range"):
        codec.deliver_stream_records(out, records, 0, 0, 2, 70000, TAG, 1, 4096, 0)
    with pytest.raises(ValueError, match="shortstr"):
        codec.deliver_stream_records(out, records, 0, 0, 2, 1, b"t" * 256, 1, 4096, 0)
    with pytest.raises(TypeError):
        codec.deliver_stream_records(out, records, 0, 0, 2, 1, TAG, 1, 4096)  # type: ignore[call-arg]  # the arity check
    assert out == PREFIX
