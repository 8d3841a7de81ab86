"""The C record encoder `streamq.log._records`: its records are byte-identical to
`format.encode_record_parts` and decode with the format's reader, it stops exactly at the
byte limits SegmentLog gives it, it rejects bad arguments without appending anything, and
both of its CRC32C paths agree with the crc32c package."""

from __future__ import annotations

import sys
from collections.abc import Callable

import crc32c as crc32c_package
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamq.log import format as fmt
from streamq.log._records import _crc32c_portable, crc32c, encode_records

U64_MAX = (1 << 64) - 1
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1
NO_LIMIT = sys.maxsize

shortstr = st.binary(max_size=255)
message_parts = st.tuples(st.binary(max_size=300), st.binary(max_size=5000))
CRCS = [("c", crc32c), ("portable", _crc32c_portable)]


def reference(
    first_offset: int,
    timestamp_ms: int,
    exchange: bytes,
    routing_key: bytes,
    messages: list[tuple[bytes, bytes]],
) -> bytes:
    return b"".join(
        fmt.encode_record_parts(first_offset + i, timestamp_ms, exchange, routing_key, p, b)
        for i, (p, b) in enumerate(messages)
    )


def encode_all(
    buffer: bytearray,
    first_offset: int,
    timestamp_ms: int,
    exchange: bytes,
    routing_key: bytes,
    messages: list[tuple[bytes, bytes]],
    start: int = 0,
) -> int:
    return encode_records(
        buffer,
        first_offset,
        timestamp_ms,
        exchange,
        routing_key,
        messages,
        start,
        NO_LIMIT,
        NO_LIMIT,
        NO_LIMIT,
    )


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, int, bytes, bytes, list[tuple[bytes, bytes]]]:
    messages = draw(st.lists(message_parts, max_size=8))
    # Offsets up to the u64 field's maximum for the run's last record.
    first_offset = draw(st.integers(0, U64_MAX - max(len(messages) - 1, 0)))
    timestamp_ms = draw(st.integers(I64_MIN, I64_MAX))
    return first_offset, timestamp_ms, draw(shortstr), draw(shortstr), messages


@given(runs(), st.binary(max_size=64))
def test_records_equal_encode_record_parts_and_decode(
    run: tuple[int, int, bytes, bytes, list[tuple[bytes, bytes]]], prefix: bytes
) -> None:
    first_offset, timestamp_ms, exchange, routing_key, messages = run
    buffer = bytearray(prefix)
    stop = encode_all(buffer, first_offset, timestamp_ms, exchange, routing_key, messages)
    assert stop == len(messages)
    assert buffer[: len(prefix)] == prefix
    assert bytes(buffer[len(prefix) :]) == reference(
        first_offset, timestamp_ms, exchange, routing_key, messages
    )
    records: list[fmt.Record] = []
    result = fmt.decode_records(
        bytes(buffer), 0, len(prefix), first_offset, 1 << 64, records, 1 << 30, "seg"
    )
    assert result == fmt.DecodeResult(len(buffer), first_offset + len(messages), True)
    assert records == [
        fmt.Record(first_offset + i, timestamp_ms, exchange, routing_key, p, b)
        for i, (p, b) in enumerate(messages)
    ]


def test_items_after_the_body_are_ignored_and_start_skips_messages() -> None:
    messages = [(b"p0", b"b0", 1), (b"p1", b"b1", "x", None), (b"p2", b"b2")]
    buffer = bytearray(b"head")
    assert encode_all(buffer, 7, 123, b"ex", b"rk", messages, start=1) == 3  # type: ignore[arg-type]  # mixed tuple lengths on purpose
    assert bytes(buffer) == b"head" + reference(
        7, 123, b"ex", b"rk", [(b"p1", b"b1"), (b"p2", b"b2")]
    )


def test_a_buffer_whose_head_was_deleted() -> None:
    # `del buffer[:n]` moves a bytearray's start inside its allocation; appends still go
    # after its last byte (SegmentLog's flush may leave a buffer like this).
    buffer = bytearray(b"0123456789")
    del buffer[:7]
    assert encode_all(buffer, 1, 2, EX, RK, HUNDRED) == 5
    assert bytes(buffer) == b"789" + reference(1, 2, EX, RK, HUNDRED)


def test_empty_runs_append_nothing() -> None:
    buffer = bytearray(b"x")
    assert encode_all(buffer, 0, 0, b"", b"", []) == 0
    assert encode_all(buffer, 0, 0, b"", b"", [(b"", b"")] * 3, start=3) == 3
    assert buffer == b"x"


def test_a_run_of_one_message_at_the_last_offset() -> None:
    buffer = bytearray()
    assert encode_all(buffer, U64_MAX, I64_MIN, b"e" * 255, b"r" * 255, [(b"p", b"b")]) == 1
    assert bytes(buffer) == reference(U64_MAX, I64_MIN, b"e" * 255, b"r" * 255, [(b"p", b"b")])


# Limits. Records of these messages are 100 bytes each: 32 header + 2 + 2 + 4 + 60.
EX, RK, PROPS = b"ex", b"rk", b"prop"
HUNDRED = [(PROPS, bytes([i]) * 60) for i in range(5)]


def encode_limited(
    messages: list[tuple[bytes, bytes]],
    start: int = 0,
    start_limit: int = NO_LIMIT,
    end_limit: int = NO_LIMIT,
    record_bytes_max: int = NO_LIMIT,
    prefix: bytes = b"",
) -> tuple[int, bytes]:
    buffer = bytearray(prefix)
    stop = encode_records(
        buffer, 10, 5, EX, RK, messages, start, start_limit, end_limit, record_bytes_max
    )
    assert buffer[: len(prefix)] == prefix
    appended = bytes(buffer[len(prefix) :])
    assert appended == reference(10, 5, EX, RK, messages[start:stop])
    return stop, appended


def test_message_sizes_used_by_the_limit_tests() -> None:
    assert {len(fmt.encode_record_parts(0, 0, EX, RK, p, b)) for p, b in HUNDRED} == {100}


@pytest.mark.parametrize(
    ("end_limit", "stop"), [(0, 0), (99, 0), (100, 1), (299, 2), (300, 3), (301, 3), (500, 5)]
)
def test_end_limit_includes_a_record_that_ends_exactly_there(end_limit: int, stop: int) -> None:
    assert encode_limited(HUNDRED, end_limit=end_limit)[0] == stop


@pytest.mark.parametrize(
    ("start_limit", "stop"), [(0, 0), (1, 1), (100, 1), (101, 2), (200, 2), (201, 3), (401, 5)]
)
def test_start_limit_excludes_a_record_that_starts_exactly_there(
    start_limit: int, stop: int
) -> None:
    assert encode_limited(HUNDRED, start_limit=start_limit)[0] == stop


@pytest.mark.parametrize(("record_bytes_max", "stop"), [(0, 0), (99, 0), (100, 5)])
def test_record_bytes_max_includes_a_record_of_exactly_that_size(
    record_bytes_max: int, stop: int
) -> None:
    assert encode_limited(HUNDRED, record_bytes_max=record_bytes_max)[0] == stop


def test_an_oversized_record_stops_the_run_even_if_later_ones_fit() -> None:
    messages = [*HUNDRED[:2], (PROPS, b"x" * 61), *HUNDRED[2:]]
    assert encode_limited(messages, record_bytes_max=100)[0] == 2
    assert encode_limited(messages, start=2, record_bytes_max=100)[0] == 2
    assert encode_limited(messages, start=3, record_bytes_max=100)[0] == 6


def test_limits_count_from_the_buffer_length_at_the_call_and_from_start() -> None:
    stop, appended = encode_limited(
        HUNDRED, start=1, start_limit=201, end_limit=250, prefix=b"z" * 1000
    )
    assert (stop, len(appended)) == (3, 200)


def test_messages_past_the_stop_are_not_examined() -> None:
    messages: list[object] = [*HUNDRED[:2], "not a tuple"]
    buffer = bytearray()
    stop = encode_records(buffer, 0, 0, EX, RK, messages, 0, 200, NO_LIMIT, NO_LIMIT)  # type: ignore[type-var]  # a bad item on purpose
    assert stop == 2


def reference_stop(
    sizes: list[int], start: int, start_limit: int, end_limit: int, record_bytes_max: int
) -> int:
    position = 0
    for i in range(start, len(sizes)):
        size = sizes[i]
        if position >= start_limit or size > record_bytes_max or position + size > end_limit:
            return i
        position += size
    return len(sizes)


@given(
    st.lists(st.integers(0, 200), max_size=12),
    st.data(),
    st.integers(0, 2000),
    st.integers(0, 2000),
    st.integers(0, 300),
)
def test_limits_match_a_python_model(
    body_sizes: list[int],
    data: st.DataObject,
    start_limit: int,
    end_limit: int,
    record_bytes_max: int,
) -> None:
    messages = [(PROPS, b"b" * n) for n in body_sizes]
    sizes = [len(fmt.encode_record_parts(0, 0, EX, RK, p, b)) for p, b in messages]
    start = data.draw(st.integers(0, len(messages)))
    stop, _ = encode_limited(messages, start, start_limit, end_limit, record_bytes_max)
    assert stop == reference_stop(sizes, start, start_limit, end_limit, record_bytes_max)


# Bad arguments: each case replaces some of the arguments of a good call.
GOOD_ARGS: dict[str, object] = {
    "first_offset": 0,
    "timestamp_ms": 0,
    "exchange": EX,
    "routing_key": RK,
    "messages": HUNDRED,
    "start": 0,
    "start_limit": NO_LIMIT,
    "end_limit": NO_LIMIT,
    "record_bytes_max": NO_LIMIT,
}
BAD_ARGS: list[tuple[dict[str, object], type[Exception], str]] = [
    ({"messages": (*HUNDRED,)}, TypeError, "messages must be a list"),
    ({"messages": [*HUNDRED, [b"", b""]]}, TypeError, r"messages\[5\] must be a tuple"),
    ({"messages": [*HUNDRED, (b"",)]}, TypeError, r"messages\[5\] must be a tuple"),
    ({"messages": [*HUNDRED, (b"", "body")]}, TypeError, r"messages\[5\] must hold bytes"),
    ({"messages": [*HUNDRED, (bytearray(), b"")]}, TypeError, r"must hold bytes"),
    ({"messages": [*HUNDRED, (b"", memoryview(b""))]}, TypeError, r"must hold bytes"),
    ({"exchange": "ex"}, TypeError, "exchange must be bytes"),
    ({"routing_key": bytearray(b"rk")}, TypeError, "routing_key must be bytes"),
    ({"exchange": b"e" * 256}, OverflowError, "exchange of 256 bytes"),
    ({"routing_key": b"r" * 256}, OverflowError, "routing_key of 256 bytes"),
    ({"first_offset": 1.0}, TypeError, "must be ints"),
    ({"timestamp_ms": "0"}, TypeError, "must be ints"),
    ({"first_offset": -1}, OverflowError, "negative"),
    ({"first_offset": 1 << 64}, OverflowError, "too big"),
    ({"first_offset": U64_MAX - 3}, OverflowError, r"offset of messages\[4\]"),
    ({"first_offset": U64_MAX - 2, "start": 1}, OverflowError, r"offset of messages\[4\]"),
    ({"timestamp_ms": I64_MAX + 1}, OverflowError, "too big"),
    ({"timestamp_ms": I64_MIN - 1}, OverflowError, "too big"),
    ({"start": -1}, ValueError, "start must not be negative"),
    ({"start": 6}, ValueError, "past the end of messages"),
    ({"start": None}, TypeError, "start must be an int"),
    ({"start_limit": -1}, ValueError, "start_limit must not be negative"),
    ({"end_limit": -5}, ValueError, "end_limit must not be negative"),
    ({"record_bytes_max": -1}, ValueError, "record_bytes_max must not be negative"),
    ({"end_limit": 1 << 63}, OverflowError, "too large"),
    ({"record_bytes_max": 1 << 64}, OverflowError, "too large"),
]


@pytest.mark.parametrize(("change", "error", "match"), BAD_ARGS)
def test_bad_arguments_raise_and_append_nothing(
    change: dict[str, object], error: type[Exception], match: str
) -> None:
    buffer = bytearray(b"before")
    args = {**GOOD_ARGS, **change}
    with pytest.raises(error, match=match):
        encode_records(buffer, *args.values())  # type: ignore[arg-type]  # bad types on purpose
    assert buffer == b"before"


def test_offsets_up_to_the_field_maximum_are_accepted() -> None:
    assert encode_limited(HUNDRED[:1])[0] == 1
    buffer = bytearray()
    assert encode_all(buffer, U64_MAX - 4, I64_MAX, EX, RK, HUNDRED) == 5
    assert bytes(buffer) == reference(U64_MAX - 4, I64_MAX, EX, RK, HUNDRED)


def test_wrong_argument_counts_and_non_bytearray_buffers_raise_type_error() -> None:
    call: Callable[..., int] = encode_records
    with pytest.raises(TypeError, match=r"exactly 10 positional arguments \(9 given\)"):
        call(bytearray(), *list(GOOD_ARGS.values())[:-1])
    with pytest.raises(TypeError, match="positional arguments"):
        call(bytearray(), *GOOD_ARGS.values(), 0)
    with pytest.raises(TypeError, match="buffer must be a bytearray"):
        call(b"", *GOOD_ARGS.values())


def test_an_exported_buffer_raises_buffer_error_and_is_unchanged() -> None:
    buffer = bytearray(b"held")
    with memoryview(buffer) as view:
        with pytest.raises(BufferError):
            encode_records(buffer, *GOOD_ARGS.values())  # type: ignore[arg-type]  # the good arguments
        assert view.tobytes() == b"held"
    assert encode_all(buffer, 0, 0, EX, RK, HUNDRED) == 5  # once released, it grows


def test_reference_counts_are_unchanged() -> None:
    properties, body = b"props-refcount", b"body-refcount" * 3
    item = (properties, body)
    messages = [item] * 4
    before = [sys.getrefcount(o) for o in (properties, body, item, messages, EX, RK)]
    buffer = bytearray()
    for _ in range(100):
        encode_all(buffer, 0, 0, EX, RK, messages)
        with pytest.raises(OverflowError):
            encode_all(buffer, U64_MAX, 0, EX, RK, messages)
    after = [sys.getrefcount(o) for o in (properties, body, item, messages, EX, RK)]
    assert after == before


# CRC32C: both paths against the crc32c package.


@pytest.mark.parametrize(("name", "crc"), CRCS)
def test_crc32c_check_value(name: str, crc: Callable[..., int]) -> None:
    assert crc(b"123456789") == 0xE3069283
    assert crc(b"") == 0
    assert crc(b"", 0x12345678) == 0x12345678


@pytest.mark.parametrize(("name", "crc"), CRCS)
def test_crc32c_every_length_and_alignment_up_to_4096(name: str, crc: Callable[..., int]) -> None:
    data = bytes((i * 131 + 7) % 251 for i in range(4096 + 8))
    view = memoryview(data)
    for length in range(4097):
        for skew in (0, 1, 3, 7) if length < 80 else (length % 8,):
            part = view[skew : skew + length]
            assert crc(part) == crc32c_package.crc32c(part), (length, skew)


@pytest.mark.parametrize(("name", "crc"), CRCS)
@given(st.binary(max_size=4096), st.integers(0, 15), st.integers(0, 0xFFFFFFFF))
def test_crc32c_random_data_and_chained_values(
    name: str, crc: Callable[..., int], data: bytes, skew: int, value: int
) -> None:
    part = memoryview(data)[skew:]
    assert crc(part, value) == crc32c_package.crc32c(part, value)
    middle = len(part) // 2
    assert crc(part[middle:], crc(part[:middle], value)) == crc32c_package.crc32c(part, value)


@pytest.mark.parametrize(("name", "crc"), CRCS)
def test_crc32c_of_large_buffers(name: str, crc: Callable[..., int]) -> None:
    # 64 KiB and more: the path that releases the GIL; bytearray and memoryview inputs.
    data = bytearray(bytes(range(256)) * 1024 + b"tail")
    assert crc(data, 99) == crc32c_package.crc32c(bytes(data), 99)
    assert crc(memoryview(data)[5:], 1) == crc32c_package.crc32c(bytes(data[5:]), 1)


@pytest.mark.parametrize(("name", "crc"), CRCS)
@pytest.mark.parametrize("length", [767, 768, 769, 1535, 1536, 24575, 24576, 24577, 49152 + 775])
def test_crc32c_around_the_three_stream_block_sizes(
    name: str, crc: Callable[..., int], length: int
) -> None:
    # The hardware path splits long inputs into three streams of 8192 or 256 bytes.
    data = bytes((i * 7919) & 0xFF for i in range(length + 8))
    for skew in (0, 5):
        part = memoryview(data)[skew : skew + length]
        assert crc(part, 0xDEADBEEF) == crc32c_package.crc32c(part, 0xDEADBEEF)


@pytest.mark.parametrize(("name", "crc"), CRCS)
def test_crc32c_bad_arguments(name: str, crc: Callable[..., int]) -> None:
    with pytest.raises(TypeError):
        crc("text")
    with pytest.raises(TypeError, match="value must be an int"):
        crc(b"", 1.0)
    with pytest.raises(OverflowError):
        crc(b"", -1)
    with pytest.raises(OverflowError, match="below 2"):
        crc(b"", 1 << 32)
    with pytest.raises(TypeError, match="1 or 2 positional arguments"):
        crc()
    with pytest.raises(TypeError, match="1 or 2 positional arguments"):
        crc(b"", 0, 0)
