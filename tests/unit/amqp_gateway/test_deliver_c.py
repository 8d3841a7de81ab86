"""The C `encode_deliver` (amqp_gateway/codec/_deliver.c) against its two oracles.

It replaced the Python `encode_deliver` (kept in `deliver_reference.py`), so for any
arguments both must append the same bytes or raise the same exception type; the C one
must then leave `out` as it was. pamqp, an independent decoder, must read the frames
back to the values given. Hypothesis drives both checks over channels, tags, names
(str, non-ASCII, bytes), properties and bodies of zero to three frames at small
frame_max values; each error has its own case too.
"""

from __future__ import annotations

import inspect
import mmap
import sys
from collections.abc import Callable
from dataclasses import fields
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands as pamqp_commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from amqp_gateway.codec import basic
from amqp_gateway.codec.frame import FRAME_OVERHEAD_BYTES
from amqp_gateway.codec.ids import ChannelId, DeliveryTag
from amqp_gateway.codec.properties import BasicProperties, encode_properties
from tests.unit.amqp_gateway import deliver_reference

from .strategies import pamqp_decodable_properties, to_pamqp

try:
    from amqp_gateway.codec import _deliver
except ImportError as exc:  # pragma: no cover - a setup problem, not a test result
    raise ImportError(
        "amqp_gateway.codec._deliver is not built: build it in place (the gcc command in "
        "amqp_gateway/codec/_deliver.c's header)"
    ) from exc

c_encode_deliver = _deliver.encode_deliver
python_encode_deliver = deliver_reference.encode_deliver
Encoder = Callable[..., None]

PREFIX = b"earlier frames"
EMPTY_PROPERTIES = b"\x00\x00"
# (channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
#  properties_raw, body, frame_max): everything after `out`.
GOOD_ARGS: tuple[Any, ...] = (1, "ctag", 7, False, "ex", "rk", EMPTY_PROPERTIES, b"hi", 4096)
ARG_INDEX = {name: i for i, name in enumerate(inspect.signature(python_encode_deliver).parameters)}


def with_arg(**changes: object) -> tuple[Any, ...]:
    """GOOD_ARGS with some arguments replaced, by parameter name."""
    args = list(GOOD_ARGS)
    for name, value in changes.items():
        args[ARG_INDEX[name] - 1] = value
    return tuple(args)


def outcome(encoder: Encoder, args: tuple[Any, ...]) -> tuple[bytes, type[BaseException] | None]:
    """What `encoder` leaves in an output buffer that already holds PREFIX, and the type
    of the exception it raised (None when it returned)."""
    out = bytearray(PREFIX)
    try:
        encoder(out, *args)
    except Exception as exc:  # the exception's type is the result compared
        return bytes(out), type(exc)
    return bytes(out), None


def short_id(value: object) -> str:
    return repr(value)[:50]


def pattern(size: int, seed: int) -> bytes:
    """`size` bytes that differ from frame to frame, so a misplaced piece shows."""
    return bytes((seed + i * 7) & 0xFF for i in range(size))


def test_the_module_is_the_in_place_build() -> None:
    # The gcc command puts the .so next to basic.py; a copy installed elsewhere would
    # test stale code.
    assert Path(_deliver.__file__ or "").parent == Path(basic.__file__).parent
    assert Path(_deliver.__file__ or "").suffix == ".so"


def test_the_signature_is_the_python_one() -> None:
    python = inspect.signature(python_encode_deliver).parameters
    c = inspect.signature(c_encode_deliver).parameters
    assert list(c) == list(python)
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in c.values())


# Names in every form a caller may pass: text (any Unicode, so non-ASCII and 4-byte
# characters, sometimes over 255 bytes once encoded), the same pre-encoded, raw bytes.
names = st.one_of(
    st.text(max_size=90),
    st.text(max_size=90).map(str.encode),
    st.binary(max_size=260),
)
# One value past each end of the range: hypothesis draws bounds often, so these
# sometimes fall outside.
channels = st.integers(-1, 65536)
delivery_tags = st.integers(-1, 2**64)


@st.composite
def frame_max_and_body(draw: st.DrawFn, frame_max_min: int) -> tuple[int, bytes]:
    """A small frame_max and a body of zero to three frames, often at a boundary."""
    frame_max = draw(st.integers(frame_max_min, 4096))
    piece_max = frame_max - FRAME_OVERHEAD_BYTES
    size = draw(
        st.one_of(
            st.integers(0, 3 * piece_max),
            st.sampled_from([0, 1, piece_max, piece_max + 1, 2 * piece_max, 3 * piece_max]),
        )
    )
    return frame_max, pattern(size, draw(st.integers(0, 255)))


@settings(max_examples=300)
@given(
    channel=channels,
    consumer_tag=names,
    delivery_tag=delivery_tags,
    redelivered=st.booleans(),
    exchange=names,
    routing_key=names,
    properties_raw=st.binary(max_size=100),
    frame_max_body=frame_max_and_body(frame_max_min=8),
)
def test_c_writes_what_python_writes_or_raises_what_it_raises(
    channel: int,
    consumer_tag: str | bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: str | bytes,
    routing_key: str | bytes,
    properties_raw: bytes,
    frame_max_body: tuple[int, bytes],
) -> None:
    # The Python function does not look inside properties_raw, so random bytes cover it;
    # frame_max from 8 up makes some properties too large for a frame.
    frame_max, body = frame_max_body
    args = (
        channel,
        consumer_tag,
        delivery_tag,
        redelivered,
        exchange,
        routing_key,
        properties_raw,
        body,
        frame_max,
    )
    expected = outcome(python_encode_deliver, args)
    event("raised" if expected[1] else "appended")
    assert outcome(c_encode_deliver, args) == expected
    if expected[1] is not None:
        assert expected == (PREFIX, ValueError)


def assert_pamqp_read_properties(decoded: Any, properties: BasicProperties) -> None:
    """pamqp's decoded Basic.Properties against ours (as test_content.py compares them)."""
    for f in fields(BasicProperties):
        ours = getattr(properties, f.name)
        theirs = getattr(decoded, "message_type" if f.name == "type" else f.name)
        if f.name == "timestamp" and theirs is not None:
            theirs = int(theirs.timestamp())
        if f.name == "cluster_id" and theirs == "" and ours is None:
            theirs = None  # pamqp's default for an absent cluster_id
        assert theirs == (to_pamqp(ours) if f.name == "headers" else ours), f.name


def text_or_utf8(text: str, as_bytes: bool) -> str | bytes:
    return text.encode() if as_bytes else text


@settings(max_examples=60)  # the property tables are the slow strategy
@given(
    channel=st.integers(0, 65535),
    consumer_tag=st.text(max_size=60),
    delivery_tag=st.integers(0, 2**64 - 1),
    redelivered=st.booleans(),
    exchange=st.text(max_size=60),
    routing_key=st.text(max_size=60),
    as_bytes=st.booleans(),
    properties=pamqp_decodable_properties,
    frame_max_body=frame_max_and_body(frame_max_min=1024),
)
def test_pamqp_reads_back_what_c_writes(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    as_bytes: bool,
    properties: BasicProperties,
    frame_max_body: tuple[int, bytes],
) -> None:
    # 60 characters are at most 240 UTF-8 bytes, so every name fits a shortstr.
    frame_max, body = frame_max_body
    properties_raw = encode_properties(properties)
    if 12 + len(properties_raw) > frame_max - FRAME_OVERHEAD_BYTES:
        frame_max = 12 + len(properties_raw) + FRAME_OVERHEAD_BYTES
    args = (
        ChannelId(channel),
        text_or_utf8(consumer_tag, as_bytes),
        DeliveryTag(delivery_tag),
        redelivered,
        text_or_utf8(exchange, as_bytes),
        text_or_utf8(routing_key, as_bytes),
        properties_raw,
        body,
        frame_max,
    )
    out = bytearray()
    c_encode_deliver(out, *args)
    assert outcome(c_encode_deliver, args) == outcome(python_encode_deliver, args)

    data = bytes(out)
    consumed, frame_channel, deliver = pamqp_frame.unmarshal(data)
    assert frame_channel == channel
    assert isinstance(deliver, pamqp_commands.Basic.Deliver)
    assert (deliver.consumer_tag, deliver.exchange, deliver.routing_key) == (
        consumer_tag,
        exchange,
        routing_key,
    )
    # pamqp reads a longlong as signed.
    assert deliver.delivery_tag is not None
    assert deliver.delivery_tag % 2**64 == delivery_tag
    assert deliver.redelivered is redelivered
    data = data[consumed:]
    consumed, frame_channel, header = pamqp_frame.unmarshal(data)
    assert frame_channel == channel
    assert isinstance(header, pamqp_header.ContentHeader)
    # pamqp's __init__ sets class_id to None, so mypy types it None; unmarshal sets it.
    class_id: object = header.class_id
    assert (class_id, header.weight, header.body_size) == (60, 0, len(body))
    assert_pamqp_read_properties(header.properties, properties)
    data = data[consumed:]
    pieces = []
    while data:
        consumed, frame_channel, piece = pamqp_frame.unmarshal(data)
        assert frame_channel == channel
        assert isinstance(piece, pamqp_body.ContentBody)
        assert consumed <= frame_max
        pieces.append(piece.value)
        data = data[consumed:]
    assert b"".join(pieces) == body
    piece_max = frame_max - FRAME_OVERHEAD_BYTES
    assert len(pieces) == -(-len(body) // piece_max)


@pytest.mark.parametrize("frame_max", [22, 4096, 131072])
@pytest.mark.parametrize("pieces", [0, 1 / 4096, 1, 1.5, 3])
@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_bodies_split_as_python_splits_them(frame_max: int, pieces: float, extra: int) -> None:
    # Sizes around 0, 1, 1.5 and 3 frames' worth; frame_max 22 leaves room for the
    # 14-byte header of empty properties, no more.
    size = max(0, int(pieces * (frame_max - FRAME_OVERHEAD_BYTES)) + extra)
    args = with_arg(body=pattern(size, 3), frame_max=frame_max)
    assert outcome(c_encode_deliver, args) == outcome(python_encode_deliver, args)


def test_properties_that_exactly_fill_a_frame_fit() -> None:
    fits = with_arg(properties_raw=EMPTY_PROPERTIES, frame_max=12 + 2 + FRAME_OVERHEAD_BYTES)
    assert outcome(c_encode_deliver, fits)[1] is None
    assert outcome(c_encode_deliver, fits) == outcome(python_encode_deliver, fits)
    over = with_arg(properties_raw=EMPTY_PROPERTIES, frame_max=12 + 2 + FRAME_OVERHEAD_BYTES - 1)
    assert outcome(c_encode_deliver, over) == (PREFIX, ValueError)


@pytest.mark.parametrize(
    "body",
    [
        memoryview(pattern(10_000, 1))[123:9_000],
        memoryview(bytearray(pattern(5_000, 2))),
        bytearray(pattern(100, 3)),
        memoryview(b""),
    ],
    ids=["memoryview-slice", "memoryview-of-bytearray", "bytearray", "empty-memoryview"],
)
def test_a_bytes_like_body_works(body: memoryview | bytearray) -> None:
    args = with_arg(body=body)
    expected = outcome(python_encode_deliver, args)
    assert expected[1] is None
    assert outcome(c_encode_deliver, args) == expected


def test_names_may_be_any_bytes_like_object() -> None:
    text = outcome(c_encode_deliver, with_arg(consumer_tag="ctag", exchange="é", routing_key="r"))
    for wrap in (bytes, bytearray, memoryview):
        args = with_arg(
            consumer_tag=wrap(b"ctag"), exchange=wrap("é".encode()), routing_key=wrap(b"r")
        )
        assert outcome(c_encode_deliver, args) == outcome(python_encode_deliver, args) == text


class Port(IntEnum):
    CHANNEL = 3


class Index:
    """Not an int, but usable as one through __index__, as struct.pack accepts."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


class Text(str):
    pass


@pytest.mark.parametrize(
    "changes",
    [
        {"redelivered": True},
        {"redelivered": 2},  # packed as an octet by the Python function, so kept
        {"redelivered": 255},
        {"channel": Port.CHANNEL, "delivery_tag": Index(2**64 - 1)},
        {"channel": True, "delivery_tag": 0, "redelivered": Index(1)},
        {"channel": 0, "frame_max": 2**40},
        {"frame_max": 2**100, "body": pattern(200_000, 4)},
        {"consumer_tag": Text("ctag"), "exchange": "", "routing_key": "\U0001f600" * 63},
        {"consumer_tag": "c" * 255, "exchange": b"e" * 255, "routing_key": "é" * 127 + "r"},
    ],
    ids=short_id,
)
def test_unusual_values_python_accepts_give_the_same_bytes(changes: dict[str, object]) -> None:
    args = with_arg(**changes)
    expected = outcome(python_encode_deliver, args)
    assert expected[1] is None
    assert outcome(c_encode_deliver, args) == expected


TOO_BIG_PROPERTIES = encode_properties(BasicProperties(headers={"k": "v" * 5000}))


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"consumer_tag": "c" * 256}, ValueError, "shortstr of 256 bytes exceeds 255"),
        ({"exchange": "é" * 128}, ValueError, "shortstr of 256 bytes exceeds 255"),
        ({"routing_key": b"r" * 256}, ValueError, "shortstr of 256 bytes exceeds 255"),
        ({"routing_key": bytearray(300)}, ValueError, "shortstr of 300 bytes exceeds 255"),
        ({"channel": -1}, ValueError, "channel or delivery tag"),
        ({"channel": 65536}, ValueError, "channel or delivery tag"),
        ({"channel": 2**64}, ValueError, "channel or delivery tag"),
        ({"channel": "1"}, ValueError, "channel or delivery tag"),
        ({"channel": 1.0}, ValueError, "channel or delivery tag"),
        ({"delivery_tag": -1}, ValueError, "channel or delivery tag"),
        ({"delivery_tag": 2**64}, ValueError, "channel or delivery tag"),
        ({"delivery_tag": None}, ValueError, "channel or delivery tag"),
        ({"redelivered": 256}, ValueError, "channel or delivery tag"),
        ({"redelivered": None}, ValueError, "channel or delivery tag"),
        ({"properties_raw": TOO_BIG_PROPERTIES}, ValueError, "exceeds frame_max 4096"),
        ({"frame_max": 21}, ValueError, "content header of 14 bytes exceeds frame_max 21"),
        ({"frame_max": -(2**100)}, ValueError, "exceeds frame_max"),
        ({"frame_max": True}, ValueError, "exceeds frame_max True"),
        ({"consumer_tag": 5}, TypeError, "can't concat int"),
        ({"exchange": None}, TypeError, "can't concat NoneType"),
        ({"routing_key": "\ud800"}, UnicodeEncodeError, "surrogates not allowed"),
    ],
    ids=short_id,
)
def test_errors_are_python_s_and_append_nothing(
    changes: dict[str, object], error: type[Exception], match: str
) -> None:
    args = with_arg(**changes)
    assert outcome(python_encode_deliver, args) == (PREFIX, error)
    out = bytearray(PREFIX)
    with pytest.raises(error, match=match):
        c_encode_deliver(out, *args)
    assert out == PREFIX


@pytest.mark.parametrize(
    "changes",
    [
        {"properties_raw": "not bytes"},
        {"properties_raw": None},
        {"body": "not bytes"},
        {"body": None},
        {"frame_max": None},
        {"frame_max": "4096"},
        {"frame_max": Index(4096)},
    ],
    ids=short_id,
)
def test_type_errors_python_raises_late_append_nothing_here(changes: dict[str, object]) -> None:
    # The Python function raises the same TypeError only after it has appended the
    # method frame (it catches only ValueError); the C one checks first.
    args = with_arg(**changes)
    assert outcome(python_encode_deliver, args)[1] is TypeError
    assert outcome(c_encode_deliver, args) == (PREFIX, TypeError)


def test_a_float_frame_max_is_a_type_error() -> None:
    # Python computes with a float frame_max until range() needs it for a second body
    # frame; the C function wants an int, as the annotation says, in every case.
    assert outcome(python_encode_deliver, with_arg(frame_max=4096.0))[1] is None
    two_frames = with_arg(frame_max=4096.0, body=bytes(5000))
    assert outcome(python_encode_deliver, two_frames)[1] is TypeError
    assert outcome(c_encode_deliver, two_frames) == (PREFIX, TypeError)
    assert outcome(c_encode_deliver, with_arg(frame_max=4096.0)) == (PREFIX, TypeError)


def test_a_body_frame_over_4_gib_is_refused() -> None:
    # The frame size field is a u32 (spec 4.2.3). The Python function raises struct.error
    # after appending the other frames; the C one a ValueError, before. An anonymous map
    # is only address space: the check runs before any page of it is read.
    with mmap.mmap(-1, 2**32) as huge, memoryview(huge) as body:
        out = bytearray(PREFIX)
        with pytest.raises(ValueError, match="body frame of over 4294967295 bytes"):
            c_encode_deliver(out, *with_arg(body=body, frame_max=2**40))
        assert out == PREFIX


def test_an_exported_out_is_a_buffer_error() -> None:
    out = bytearray(PREFIX)
    with memoryview(out):
        with pytest.raises(BufferError):
            python_encode_deliver(out, *GOOD_ARGS)
        with pytest.raises(BufferError):
            c_encode_deliver(out, *GOOD_ARGS)
    assert out == PREFIX


@pytest.mark.parametrize("name", ["body", "properties_raw", "consumer_tag", "routing_key"])
def test_a_non_contiguous_buffer_is_a_type_error(name: str) -> None:
    # `bytearray += view` refuses it with TypeError; Python raises that after appending
    # the frames before it, the C function before appending anything.
    args = with_arg(**{name: memoryview(pattern(100, 6))[::2]})
    assert outcome(python_encode_deliver, args)[1] is TypeError
    out = bytearray(PREFIX)
    with pytest.raises(TypeError, match="can't concat memoryview to bytearray"):
        c_encode_deliver(out, *args)
    assert out == PREFIX


def test_out_must_be_a_bytearray() -> None:
    with pytest.raises(TypeError, match="out must be a bytearray, not bytes"):
        c_encode_deliver(b"", *GOOD_ARGS)  # type: ignore[arg-type]  # the wrong type tested


def test_keyword_arguments_bind_as_in_python() -> None:
    names = list(ARG_INDEX)
    positional = bytearray()
    c_encode_deliver(positional, *GOOD_ARGS)
    by_keyword = bytearray()
    c_encode_deliver(**dict(reversed(list(zip(names, (by_keyword, *GOOD_ARGS), strict=True)))))
    mixed = bytearray()
    c_encode_deliver(mixed, *GOOD_ARGS[:4], **dict(zip(names[5:], GOOD_ARGS[4:], strict=True)))
    assert positional == by_keyword == mixed
    python = bytearray()
    python_encode_deliver(python, *GOOD_ARGS)
    assert positional == python


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda f: f(bytearray(), *GOOD_ARGS, 1), "takes 10 positional arguments but 11"),
        (lambda f: f(bytearray(), *GOOD_ARGS[:-1]), "missing .*'frame_max'"),
        (lambda f: f(bytearray(), *GOOD_ARGS, channel=1), "multiple values for argument 'channel'"),
        (lambda f: f(bytearray(), *GOOD_ARGS, nope=1), "unexpected keyword argument 'nope'"),
    ],
    ids=["too-many", "missing", "twice", "unknown"],
)
def test_binding_errors_are_type_errors(call: Callable[[Encoder], None], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        call(python_encode_deliver)
    with pytest.raises(TypeError, match=match):
        call(c_encode_deliver)


def test_buffers_and_references_are_released_on_every_path() -> None:
    # A buffer the C code kept would make the bytearray below impossible to resize and
    # the memoryview impossible to release; a lost reference would show in refcounts.
    name = bytearray(b"ctag")
    body = memoryview(pattern(9_000, 7))
    properties = bytearray(EMPTY_PROPERTIES)
    tag = 2**63 + 5
    calls = [
        with_arg(consumer_tag=name, properties_raw=properties, body=body, delivery_tag=tag),
        with_arg(consumer_tag=name, properties_raw=properties, body=body, frame_max=20),
        with_arg(consumer_tag=name, body=body, routing_key="r" * 300),
        with_arg(consumer_tag=name, body=body, delivery_tag=-tag),
        with_arg(consumer_tag=name, body=body, channel=Index(70000)),
    ]
    counted = (name, body, properties, tag)
    before = [sys.getrefcount(obj) for obj in counted]
    for _ in range(1000):
        for args in calls:
            outcome(c_encode_deliver, args)
    assert [sys.getrefcount(obj) for obj in counted] == before
    name += b"x"  # raises BufferError while an export is held
    body.release()
