"""The C `deliver_records` (amqp_gateway/codec/_deliver.c): a run of deliveries framed
straight from segment-log records must be byte for byte what `encode_deliver` writes for
each record's fields, with consecutive delivery tags; records before the run are passed
over, the run stops at a partial record, at `count` and past `out_bytes_max`, and a
damaged record or a gap in the offsets raises with nothing appended."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_gateway.codec import deliver_records, encode_deliver
from amqp_gateway.codec.properties import BasicProperties, encode_properties
from streamq.log import format as fmt

Message = tuple[bytes, bytes, bytes, bytes]  # exchange, routing key, properties, body

PROPERTIES = [
    b"\x00\x00",
    encode_properties(BasicProperties(content_type="text/plain", delivery_mode=2)),
    encode_properties(BasicProperties(headers={"k": "v"}, priority=3, expiration="100")),
]

messages_strategy = st.lists(
    st.tuples(
        st.binary(max_size=20),
        st.binary(max_size=40),
        st.sampled_from(PROPERTIES),
        st.binary(max_size=600),
    ),
    min_size=1,
    max_size=12,
)


def records(first: int, messages: list[Message]) -> bytes:
    return b"".join(
        fmt.encode_record(first + i, 1_700_000_000_000 + i, fmt.Message(*m))
        for i, m in enumerate(messages)
    )


def expected(messages: list[Message], tag: int, frame_max: int) -> bytes:
    out = bytearray()
    for i, (exchange, routing_key, properties, body) in enumerate(messages):
        encode_deliver(
            out, 3, b"ctag", tag + i, False, exchange, routing_key, properties, body, frame_max
        )
    return bytes(out)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    messages=messages_strategy,
    skip=st.integers(0, 3),
    frame_max=st.sampled_from([256, 1000, 131072]),
)
def test_a_run_is_what_encode_deliver_writes_for_each_record(
    messages: list[Message], skip: int, frame_max: int
) -> None:
    skip = min(skip, len(messages) - 1)
    data = records(100, messages)
    out = bytearray(b"before")
    delivered, position, next_offset, sizes = deliver_records(
        out, data, 0, 100 + skip, 1000, 3, b"ctag", 42, frame_max, 0
    )
    assert delivered == len(messages) - skip
    assert position == len(data) and next_offset == 100 + len(messages)
    assert sizes == [len(m[3]) for m in messages[skip:]]
    assert bytes(out) == b"before" + expected(messages[skip:], 42, frame_max)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(messages=messages_strategy, data=st.data())
def test_it_stops_at_a_partial_record_and_goes_on_from_there(
    messages: list[Message], data: st.DataObject
) -> None:
    whole = records(0, messages)
    cut = data.draw(st.integers(0, len(whole)))
    out = bytearray()
    delivered, position, next_offset, _ = deliver_records(
        out, whole[:cut], 0, 0, len(messages), 1, "ctag", 1, 4096, 0
    )
    rest, position_after, _, _ = deliver_records(
        out,
        whole,
        position,
        delivered,
        len(messages) - delivered,
        1,
        "ctag",
        1 + delivered,
        4096,
        0,
    )
    assert delivered + rest == len(messages) and position_after == len(whole)
    assert next_offset == (delivered if delivered else -1)
    out_expected = bytearray()
    for i, (exchange, routing_key, properties, body) in enumerate(messages):
        encode_deliver(
            out_expected, 1, "ctag", 1 + i, False, exchange, routing_key, properties, body, 4096
        )
    assert out == out_expected


def test_count_and_output_limits_stop_the_run() -> None:
    messages = [(b"", b"q", b"\x00\x00", b"x" * 1000)] * 10
    data = records(0, messages)
    out = bytearray()
    assert deliver_records(out, data, 0, 0, 4, 1, "t", 1, 131072, 0)[0] == 4
    out = bytearray()
    delivered, position, next_offset, _ = deliver_records(
        out, data, 0, 0, 10, 1, "t", 1, 131072, 2500
    )
    assert delivered == 3 and next_offset == 3  # stops once 2,500 bytes are out
    assert position == len(records(0, messages[:3]))
    out = bytearray()
    assert deliver_records(out, data, 0, 0, 10, 1, "t", 1, 131072, 1)[0] == 1  # at least one


def test_a_damaged_record_or_a_gap_raises_with_nothing_appended() -> None:
    data = records(5, [(b"", b"q", b"\x00\x00", b"body")] * 3)
    out = bytearray(b"kept")
    gap = records(5, [(b"", b"q", b"\x00\x00", b"a")]) + records(
        7, [(b"", b"q", b"\x00\x00", b"b")]
    )
    with pytest.raises(ValueError, match=r"offset 7 .* where 6 was expected"):
        deliver_records(out, gap, 0, 5, 2, 1, "t", 1, 4096, 0)
    bad_length = bytearray(data)
    bad_length[0:4] = (3).to_bytes(4, "little")
    with pytest.raises(ValueError, match="bad record length"):
        deliver_records(out, bad_length, 0, 5, 3, 1, "t", 1, 4096, 0)
    bad_fields = bytearray(data)
    bad_fields[28:32] = (10_000).to_bytes(4, "little")  # properties past the record
    with pytest.raises(ValueError, match="bad record"):
        deliver_records(out, bad_fields, 0, 5, 3, 1, "t", 1, 4096, 0)
    with pytest.raises(ValueError, match="content header"):
        wide = encode_properties(BasicProperties(content_type="x" * 100))
        big = records(0, [(b"", b"q", wide, b"")])
        deliver_records(out, big, 0, 0, 1, 1, "t", 1, 100, 0)
    assert out == b"kept"


def test_bad_arguments_are_refused() -> None:
    data = records(0, [(b"", b"q", b"\x00\x00", b"x")])
    with pytest.raises(TypeError):
        deliver_records(b"not a bytearray", data, 0, 0, 1, 1, "t", 1, 4096, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        deliver_records(bytearray(), data, 0, 0, 1, 70000, "t", 1, 4096, 0)
    with pytest.raises(ValueError):
        deliver_records(bytearray(), data, 0, 0, 1, 1, "t" * 256, 1, 4096, 0)
    with pytest.raises(TypeError):
        deliver_records(bytearray(), data, 0, 0, 1)  # type: ignore[call-arg]
