"""The C accelerator `scan_publishes`: a run of whole publishes split from a buffer.

Its contract is an oracle: repeatedly applying `basic.read_publish` (the Python fast
path) under scan_publishes' added limits (the first message's channel only,
body_bytes_max, count_max) must yield the same messages and the same `end`, for valid
streams, streams cut at any byte or followed by garbage, and random bytes. Each rejection
rule also has its own test, so a regression names the rule it broke.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import operator
import sys
import tracemalloc
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from typing_extensions import Buffer

from amqp_gateway import codec
from amqp_gateway.codec import basic
from amqp_gateway.codec import methods as m
from amqp_gateway.codec.frame import received_payload_max

from .strategies import basic_properties

try:
    from amqp_gateway.codec import _scan
except ImportError as exc:  # pragma: no cover - a setup problem, not a test result
    raise ImportError(
        "amqp_gateway.codec._scan is not built: build it in place (setup.py build_ext "
        "--inplace, or the gcc command in amqp_gateway/codec/_scan.c's header)"
    ) from exc

scan_publishes = _scan.scan_publishes
Message = tuple[bytes, bytes, str, str, int]
Result = tuple[int, int, list[Message]]
Full = tuple[int, int, list[Message], int, int]  # with the ORs of bits and flag words

FRAME_MAX = 131072
PAYLOAD_MAX = received_payload_max(FRAME_MAX)  # what the connection passes: FRAME_MAX
NO_LIMIT = 2**70  # past any Py_ssize_t: the C code clamps it


def test_the_module_is_the_in_place_build() -> None:
    # The lead's build and the gcc command both put the .so next to basic.py; a copy
    # installed elsewhere would test stale code.
    assert Path(_scan.__file__ or "").parent == Path(basic.__file__).parent
    assert Path(_scan.__file__ or "").suffix == ".so"


def publish(
    body: bytes = b"body",
    channel: int = 1,
    exchange: str = "amq.direct",
    routing_key: str = "rk",
    bits: int = 0,
    properties: codec.BasicProperties | None = None,
    frame_max: int = FRAME_MAX,
) -> bytes:
    """The frames of one publish, written by the project's codec; `bits` may set any of
    the 8 bits of the last method octet, which the encoder alone would not."""
    out = bytearray()
    method = m.BasicPublish(
        exchange=exchange,
        routing_key=routing_key,
        mandatory=bool(bits & 1),
        immediate=bool(bits & 2),
    )
    raw = codec.encode_properties(properties or codec.BasicProperties())
    codec.append_content_frames(out, codec.ChannelId(channel), method, raw, body, frame_max)
    out[method_end(out) - 2] = bits
    return bytes(out)


def method_end(data: bytes | bytearray, at: int = 0) -> int:
    """The offset after the frame at `at` (its frame-end octet included)."""
    return at + 7 + int.from_bytes(data[at + 3 : at + 7], "big") + 1


def oracle(
    data: bytes, position: int, payload_max: int, body_bytes_max: int, count_max: int
) -> Full:
    """What scan_publishes must return, from read_publish applied message by message."""
    messages: list[Message] = []
    channel = bits = flags = 0
    end = position
    while len(messages) < count_max:
        message = basic.read_publish(data, end, payload_max)
        if message is None or len(message.body) > body_bytes_max:
            break
        if messages and (
            message.channel != channel
            or message.exchange != messages[0][2]
            or message.routing_key != messages[0][3]
        ):
            break  # a run has one channel, exchange and routing key
        channel = message.channel
        fields = (message.properties_raw, message.body, message.exchange, message.routing_key)
        messages.append((*fields, message.bits))
        bits |= message.bits
        flags |= int.from_bytes(message.properties_raw[:2], "big")
        end = message.end
    return channel, end, messages, bits, flags


def run_of(result: Full) -> Result:
    """The run of a scan result, after checking its ORs of bits and flag words."""
    channel, end, messages, bits, flags = result
    assert bits == functools.reduce(operator.or_, (m[4] for m in messages), 0)
    words = (int.from_bytes(m[0][:2], "big") for m in messages)
    assert flags == functools.reduce(operator.or_, words, 0)
    return channel, end, messages


def check_shared_objects(messages: list[Message]) -> None:
    """Equal exchange, routing key or properties in consecutive messages are one object."""
    for before, after in pairwise(messages):
        for index in (0, 2, 3):
            if before[index] == after[index]:
                assert before[index] is after[index]


def scan(data: bytes, position: int = 0, count_max: int = 1000) -> Result:
    return run_of(scan_publishes(data, position, PAYLOAD_MAX, NO_LIMIT, count_max))


def message(
    body: bytes = b"body", exchange: str = "amq.direct", routing_key: str = "rk"
) -> Message:
    return (codec.encode_properties(codec.BasicProperties()), body, exchange, routing_key, 0)


# -- the oracle over generated streams --------------------------------------------------


def mostly(value: int, other: st.SearchStrategy[int]) -> st.SearchStrategy[int]:
    """`value` two times in three, so that most generated runs are long."""
    return st.one_of(st.just(value), st.just(value), other)


names = st.sampled_from(["", "amq.direct", "журнал.событий", "x" * 255]) | st.text(max_size=60)
properties = (
    st.sampled_from([codec.BasicProperties(), codec.BasicProperties(delivery_mode=2)])
    | basic_properties
)
publishes = st.builds(
    publish,
    body=st.binary(max_size=64),
    channel=mostly(1, st.integers(0, 65535)),
    exchange=names,
    routing_key=names,
    bits=st.integers(0, 3) | st.integers(0, 255),
    properties=properties,
)


GUARDED_BYTES = 16 * mmap.PAGESIZE
PROT_NONE = 0  # <sys/mman.h>; the mmap module exports PROT_READ and PROT_WRITE only


def _guarded_region() -> mmap.mmap:
    """Memory followed by a page that may not be read: a read past the end of a buffer
    placed at its end faults at once, where bytes objects would hide it (they end in a
    NUL byte and sit inside larger allocations)."""
    region = mmap.mmap(-1, GUARDED_BYTES + mmap.PAGESIZE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    if libc.mprotect(address + GUARDED_BYTES, mmap.PAGESIZE, PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect of the guard page failed")
    return region


_GUARDED = _guarded_region()


def guarded(data: bytes) -> memoryview:
    """A view of a copy of `data` that ends just before the guard page."""
    assert len(data) <= GUARDED_BYTES
    start = GUARDED_BYTES - len(data)
    _GUARDED[start:GUARDED_BYTES] = data
    return memoryview(_GUARDED)[start:GUARDED_BYTES]


containers: st.SearchStrategy[Callable[[bytes], Buffer]] = st.sampled_from(
    [bytes, bytearray, memoryview, guarded]
)


@settings(max_examples=300)
@given(
    stream=st.lists(publishes, min_size=1, max_size=8).map(b"".join),
    prefix=st.binary(max_size=10),
    garbage=st.binary(max_size=20),
    cut=st.one_of(st.none(), st.none(), st.integers(0, 1000)),
    payload_max=mostly(PAYLOAD_MAX, st.integers(0, 200)),
    body_bytes_max=mostly(NO_LIMIT, st.integers(0, 70)),
    count_max=mostly(NO_LIMIT, st.integers(1, 9)),
    container=containers,
)
def test_scan_agrees_with_read_publish_message_by_message(
    stream: bytes,
    prefix: bytes,
    garbage: bytes,
    cut: int | None,
    payload_max: int,
    body_bytes_max: int,
    count_max: int,
    container: Callable[[bytes], Buffer],
) -> None:
    buffer = prefix + stream + garbage
    if cut is not None:  # anywhere after the prefix, as a socket read may end
        buffer = buffer[: len(prefix) + cut % (len(buffer) - len(prefix) + 1)]
    limits = (payload_max, body_bytes_max, count_max)
    full = scan_publishes(container(buffer), len(prefix), *limits)
    assert full == oracle(buffer, len(prefix), *limits)
    result = run_of(full)
    check_shared_objects(result[2])
    event(f"messages: {min(len(result[2]), 3)}")


@given(
    bodies=st.lists(st.binary(max_size=64), min_size=1, max_size=8),
    exchange=names,
    routing_key=names,
    channel=st.integers(0, 65535),
)
def test_a_valid_stream_on_one_channel_and_route_is_read_whole(
    bodies: list[bytes], exchange: str, routing_key: str, channel: int
) -> None:
    stream = b"".join(publish(body, channel, exchange, routing_key) for body in bodies)
    assert scan(stream) == (
        channel,
        len(stream),
        [message(body, exchange, routing_key) for body in bodies],
    )


def test_a_run_ends_where_the_exchange_or_routing_key_changes() -> None:
    a1, a2 = publish(b"1", exchange="a"), publish(b"2", exchange="a")
    b3, b4 = publish(b"3", exchange="b"), publish(b"4", exchange="b", routing_key="other")
    data = a1 + a2 + b3 + b4
    assert [m[1] for m in scan(data)[2]] == [b"1", b"2"]
    assert scan(data, len(a1 + a2))[1:] == (len(a1 + a2 + b3), [message(b"3", "b")])
    assert [m[1] for m in scan(data, len(a1 + a2 + b3))[2]] == [b"4"]


# -- one test per rule -------------------------------------------------------------------

FIRST = publish(b"first")
FIRST_RESULT: Result = (1, len(FIRST), [message(b"first")])


def mutated(data: bytes, at: int, value: int) -> bytes:
    changed = bytearray(data)
    changed[at] = value
    return bytes(changed)


def frame_starts(data: bytes) -> list[int]:
    """The offsets of the method, header and (if any) body frames of one publish."""
    header = method_end(data)
    body = method_end(data, header)
    return [0, header] + ([body] if body < len(data) else [])


def test_a_frame_of_another_type_stops_the_scan() -> None:
    assert scan(FIRST + codec.HEARTBEAT_FRAME + FIRST) == FIRST_RESULT
    assert scan(FIRST + mutated(FIRST, 0, 2)) == FIRST_RESULT  # a header, not a method


@pytest.mark.parametrize(
    ("at", "value"),
    [(7, 1), (8, 50), (9, 1), (10, 41)],
    ids=["class-high", "class-50", "method-high", "method-41"],
)
def test_a_method_other_than_basic_publish_stops_the_scan(at: int, value: int) -> None:
    assert scan(FIRST + mutated(FIRST, at, value)) == FIRST_RESULT


@pytest.mark.parametrize("frame", [0, 1, 2], ids=["method", "header", "body"])
def test_a_bad_frame_end_stops_the_scan(frame: int) -> None:
    second = publish(b"second")
    starts = frame_starts(second)
    end = method_end(second, starts[frame]) - 1
    assert second[end] == codec.FRAME_END
    assert scan(FIRST + mutated(second, end, 0)) == FIRST_RESULT


def test_a_routing_key_that_does_not_end_one_octet_before_the_frame_end_stops_the_scan() -> None:
    second = publish(b"second", routing_key="rk")
    rk_length_at = 7 + 6 + 1 + len("amq.direct")
    assert second[rk_length_at] == 2
    for routing_key_size in (0, 1, 3, 255):  # ends elsewhere inside or past the frame
        assert scan(FIRST + mutated(second, rk_length_at, routing_key_size)) == FIRST_RESULT
    # A method frame one byte longer (a second octet after the bits) does not fit either.
    end = method_end(second)
    longer = bytearray(second)
    longer[3:7] = (end - 8 + 1).to_bytes(4, "big")
    longer[end - 1 : end - 1] = b"\x00"
    assert scan(FIRST + bytes(longer)) == FIRST_RESULT


@pytest.mark.parametrize("frame", [1, 2], ids=["header", "body"])
def test_content_on_another_channel_stops_the_scan(frame: int) -> None:
    second = publish(b"second")
    at = frame_starts(second)[frame]
    assert scan(FIRST + mutated(second, at + 2, 2)) == FIRST_RESULT


def test_a_header_of_another_class_or_too_short_stops_the_scan() -> None:
    second = publish(b"second")
    header = frame_starts(second)[1]
    assert scan(FIRST + mutated(second, header + 8, 50)) == FIRST_RESULT
    # 12 payload bytes: class, weight and body-size but no property flag word.
    short = b"\x02\x00\x01\x00\x00\x00\x0c\x00\x3c\x00\x00" + bytes(8) + b"\xce"
    assert scan(FIRST + second[:header] + short) == FIRST_RESULT


def test_a_body_size_other_than_the_body_frame_size_stops_the_scan() -> None:
    second = publish(b"second")
    body_size_at = frame_starts(second)[1] + 7 + 4 + 7  # the low octet of body-size
    assert second[body_size_at] == len(b"second")
    assert scan(FIRST + mutated(second, body_size_at, 5)) == FIRST_RESULT
    assert scan(FIRST + mutated(second, body_size_at, 7)) == FIRST_RESULT
    assert scan(FIRST + mutated(second, body_size_at, 0)) == (
        1,
        len(FIRST) + frame_starts(second)[2],  # an empty message; the body frame is next
        [message(b"first"), message(b"")],
    )


def test_a_body_over_two_frames_stops_the_scan() -> None:
    body = b"z" * 200
    second = publish(body, frame_max=108)
    assert len(frame_starts(second)) == 3 and method_end(second, frame_starts(second)[2]) < len(
        second
    )
    assert scan(FIRST + second) == FIRST_RESULT
    assert scan(FIRST + publish(body)) == (
        1,
        len(FIRST) + len(publish(body)),
        [
            message(b"first"),
            message(body),
        ],
    )


def test_a_frame_over_payload_max_stops_the_scan() -> None:
    body = b"z" * 100
    data = FIRST + publish(body)
    assert scan_publishes(data, 0, 100, NO_LIMIT, 10)[2] == [message(b"first"), message(body)]
    assert run_of(scan_publishes(data, 0, 99, NO_LIMIT, 10)) == FIRST_RESULT
    # The method and header frames are checked too.
    method_size = method_end(FIRST) - 8
    header_size = method_end(FIRST, method_end(FIRST)) - method_end(FIRST) - 8
    for payload_max in (method_size - 1, header_size - 1):
        assert run_of(scan_publishes(FIRST, 0, payload_max, NO_LIMIT, 10)) == (0, 0, [])


def test_a_body_frame_of_frame_max_payload_bytes_passes_the_scan_and_one_more_does_not() -> None:
    """The connection passes received_payload_max(frame_max), frame_max itself (RabbitMQ
    accepts a received payload of frame_max bytes): a body frame of that size is
    scanned, one byte more is left to the frame path, which reports the FRAME_ERROR."""
    frame_max = 4096
    payload_max = received_payload_max(frame_max)
    fits = publish(b"z" * frame_max, frame_max=frame_max + 8)
    assert len(frame_starts(fits)) == 3  # method, header, one body frame of frame_max
    assert scan_publishes(FIRST + fits, 0, payload_max, NO_LIMIT, 10)[2] == [
        message(b"first"),
        message(b"z" * frame_max),
    ]
    over = publish(b"z" * (frame_max + 1), frame_max=frame_max + 9)
    assert run_of(scan_publishes(FIRST + over, 0, payload_max, NO_LIMIT, 10)) == FIRST_RESULT


@pytest.mark.parametrize("field", ["exchange", "routing_key"])
def test_invalid_utf8_stops_the_scan(field: str) -> None:
    second = publish(b"second", exchange="ab", routing_key="cd")
    at = 14 if field == "exchange" else 17
    assert second[at] == ord("a" if field == "exchange" else "c")
    for invalid in (0xFF, 0x80, 0xC3):  # not a lead byte, a lone continuation, cut short
        assert scan(FIRST + mutated(second, at, invalid)) == FIRST_RESULT
    surrogate = (
        publish(b"", exchange="abc")[:14] + b"\xed\xa0\x80" + publish(b"", exchange="abc")[17:]
    )
    assert scan(FIRST + surrogate) == FIRST_RESULT  # strict UTF-8 refuses surrogates


def test_a_body_over_body_bytes_max_stops_the_scan() -> None:
    data = FIRST + publish(b"123456") + FIRST
    assert run_of(scan_publishes(data, 0, PAYLOAD_MAX, 5, 10)) == FIRST_RESULT
    assert scan_publishes(data, 0, PAYLOAD_MAX, 6, 10)[2] == [
        message(b"first"),
        message(b"123456"),
        message(b"first"),
    ]


def test_count_max_bounds_the_run() -> None:
    data = FIRST * 5
    for count_max in range(1, 7):
        count = min(count_max, 5)
        assert scan(data, count_max=count_max) == (
            1,
            count * len(FIRST),
            [message(b"first")] * count,
        )


def test_a_message_on_another_channel_ends_the_run() -> None:
    second = publish(b"second", channel=2)
    assert scan(FIRST + second + FIRST) == FIRST_RESULT
    assert scan(FIRST + second + FIRST, len(FIRST)) == (
        2,
        len(FIRST) + len(second),
        [message(b"second")],
    )


def test_a_message_cut_at_any_byte_leaves_the_earlier_messages_only() -> None:
    cases = [
        (publish(b"second"), 2),
        (publish(b""), 2),
        (publish(b"x", exchange="é", routing_key=""), 1),  # another route: a run of its own
    ]
    for second, run_length in cases:
        for cut in range(len(second)):
            assert scan(FIRST + second[:cut]) == FIRST_RESULT
        assert len(scan(FIRST + second)[2]) == run_length


def test_nothing_accepted_returns_the_position() -> None:
    assert scan(b"") == (0, 0, [])
    assert scan(b"xx" + FIRST[:-1], 2) == (0, 2, [])
    assert scan(FIRST, len(FIRST)) == (0, len(FIRST), [])


def test_every_field_is_read() -> None:
    props = codec.BasicProperties(content_type="text/plain", headers={"k": "v"}, priority=3)
    data = publish(b"\x00body", 7, "ex \u00e9", "rk/\U0001f600", 0xA3, props)
    channel, end, [(properties_raw, body, exchange, routing_key, bits)] = scan(data)
    assert (channel, end) == (7, len(data))
    assert codec.decode_properties(properties_raw) == props
    assert (body, exchange, routing_key, bits) == (b"\x00body", "ex \u00e9", "rk/\U0001f600", 0xA3)


# -- allocation sharing ------------------------------------------------------------------


def test_repeated_names_and_properties_share_one_object() -> None:
    props = codec.BasicProperties(delivery_mode=2)
    data = b"".join(publish(body, properties=props) for body in (b"a", b"b", b"", b""))
    _, _, messages = scan(data)
    first, *rest = messages
    for other in rest:
        assert other[0] is first[0]
        assert other[2] is first[2]
        assert other[3] is first[3]
    assert messages[2][1] is bytes(0)  # the shared empty bytes
    # Properties that differ in between are allocated anew, then shared again.
    other = codec.BasicProperties(delivery_mode=1)
    data = b"".join(publish(b"x", properties=p) for p in (props, other, other))
    _, _, (one, two, three) = scan(data)
    assert one[0] != two[0] and three[0] is two[0]


def test_the_scan_keeps_no_references_and_releases_the_buffer() -> None:
    # Goal: reference counting is right on the success and error paths. Method: objects
    # returned are owned by the result alone, a bytearray can be resized after every
    # call (a buffer still exported refuses that), and repeated calls do not grow memory.
    data = bytearray(FIRST * 3)
    _, _, messages, _, _ = scan_publishes(data, 0, PAYLOAD_MAX, NO_LIMIT, 10)
    # One reference from the getrefcount argument, one per message tuple holding it.
    references = sys.getrefcount(messages[0][2])  # outside `assert`, which pytest rewrites
    assert references == 1 + 3
    del messages
    for arguments in [(0, PAYLOAD_MAX, 1, 1), (len(data) + 1, 1, 1, 1), (0, 1, 1, 0)]:
        with contextlib.suppress(ValueError):
            scan_publishes(data, *arguments)
        data += b"\x00"
        del data[-1]
    tracemalloc.start()
    try:
        scan_publishes(bytes(data), 0, PAYLOAD_MAX, NO_LIMIT, 10)
        before = _here(tracemalloc.take_snapshot())
        for _ in range(2000):
            scan_publishes(data, 0, PAYLOAD_MAX, NO_LIMIT, 10)
            scan_publishes(data, 1, PAYLOAD_MAX, NO_LIMIT, 10)
        growth = _here(tracemalloc.take_snapshot()) - before
    finally:
        tracemalloc.stop()
    assert growth < 20_000  # a leaked tuple per call would be over 100 kB


# -- fuzzing -----------------------------------------------------------------------------


@given(
    data=st.binary(max_size=300),
    position=st.integers(0, 300),
    payload_max=st.integers(0, 2**33) | st.just(NO_LIMIT),
    body_bytes_max=st.integers(0, 2**33) | st.just(NO_LIMIT),
    count_max=st.integers(1, 2**63),
)
def test_random_bytes_never_crash_and_agree_with_the_oracle(
    data: bytes, position: int, payload_max: int, body_bytes_max: int, count_max: int
) -> None:
    position = min(position, len(data))
    result = scan_publishes(guarded(data), position, payload_max, body_bytes_max, count_max)
    assert result == oracle(data, position, payload_max, body_bytes_max, count_max)


@given(
    stream=st.lists(publishes, min_size=1, max_size=4).map(b"".join),
    changes=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    container=containers,
)
def test_mutated_streams_never_crash_and_agree_with_the_oracle(
    stream: bytes, changes: list[tuple[int, int]], container: Callable[[bytes], Buffer]
) -> None:
    changed = bytearray(stream)
    for at, value in changes:
        changed[at % len(changed)] = value
    data = bytes(changed)
    result = scan_publishes(container(data), 0, PAYLOAD_MAX, NO_LIMIT, NO_LIMIT)
    assert result == oracle(data, 0, PAYLOAD_MAX, NO_LIMIT, NO_LIMIT)


# -- arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ((b"", -1, 1, 1, 1), ValueError, "position must be >= 0"),
        ((b"ab", 3, 1, 1, 1), ValueError, "position 3 is past the end"),
        ((b"", NO_LIMIT, 1, 1, 1), ValueError, "past the end"),
        ((b"", 0, -1, 1, 1), ValueError, "payload_max must be >= 0"),
        ((b"", 0, 1, -(2**70), 1), ValueError, "body_bytes_max must be >= 0"),
        ((b"", 0, 1, 1, 0), ValueError, "count_max must be >= 1"),
        (("text", 0, 1, 1, 1), TypeError, "bytes-like object is required"),
        ((None, 0, 1, 1, 1), TypeError, "bytes-like object is required"),
        ((b"", 0.0, 1, 1, 1), TypeError, "integer"),
        ((b"", "0", 1, 1, 1), TypeError, "integer"),
        ((b"", 0, 1, 1), TypeError, "takes 5 arguments"),
    ],
)
def test_bad_arguments_raise(
    arguments: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as caught:
        scan_publishes(*arguments)
    assert caught.type is error


def _here(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes held by allocations made from this file (the scanner's, called from here),
    not by threads that other tests left running, which tracemalloc traces too."""
    mine = snapshot.filter_traces([tracemalloc.Filter(True, __file__)])
    return sum(stat.size for stat in mine.statistics("filename"))
