"""`_streamwire.converted_entries` (C) against the Python loop it replaced in
`converted_run.append_converted`: the same entries, sizes and filter value runs for runs
of equal and changing properties, native records, bodies either side of the data
section's small/large boundary, and 0-9-1 messages whose body decides the conversion
(basic.type amqp-1.0); None over the size limit; Python asked once per run of equal
properties; wrong arguments and a list changed by a callback refused cleanly."""

from __future__ import annotations

from array import array

import pytest

from amqp_gateway.codec.properties import BasicProperties, encode_properties
from streamq.log import amqp10
from streamq.log._streamwire import converted_entries
from streamq.log.frame import FilterRun, add_filter_run
from streamq.log.log import RunMessage

EXCHANGE = b"ex"
KEY = b"native-value"
PLAIN = encode_properties(BasicProperties(delivery_mode=2))
EU = encode_properties(BasicProperties(headers={"x-stream-filter-value": "eu"}))
US = encode_properties(BasicProperties(content_type="a/b", headers={"x-stream-filter-value": "us"}))
AMQP10 = encode_properties(BasicProperties(type=amqp10.AMQP10_TYPE))
NATIVE = amqp10.native_properties(0)
LIMIT = 1 << 20


def reference(messages: list[RunMessage], limit: int = LIMIT) -> tuple[bytes, bytes, list] | None:
    """The Python loop that append_converted ran before."""
    parts: list[bytes] = []
    sizes = array("I")
    runs: list[FilterRun] = []
    for number, (properties, body, *_rest) in enumerate(messages):
        if properties[:2] == amqp10.NATIVE_MARK:
            entry, value = body, KEY
        else:
            entry = amqp10.to_amqp10(EXCHANGE, KEY, properties, body)
            value = amqp10.filter_value_of(properties)
        if 4 + len(entry) > limit:
            return None
        parts += [len(entry).to_bytes(4, "big"), entry]
        sizes.append(4 + len(entry))
        if value:
            add_filter_run(runs, number, 1, value)
    return b"".join(parts), sizes.tobytes(), runs


def in_c(messages: list[RunMessage], limit: int = LIMIT) -> tuple[bytes, bytes, list] | None:
    def prefix_of(properties: bytes) -> tuple[bytes | None, bytes]:
        prefix = amqp10.sections_before_body(EXCHANGE, KEY, properties)
        return prefix, amqp10.filter_value_of(properties)

    def convert(properties: bytes, body: bytes) -> bytes:
        return amqp10.to_amqp10(EXCHANGE, KEY, properties, body)

    made = converted_entries(messages, KEY, prefix_of, convert, limit)
    return None if made is None else (made[0], made[1], list(made[2]))


def run_of(properties: list[bytes], sizes: list[int]) -> list[RunMessage]:
    return [(p, (b"%d-" % n * 300)[: sizes[n % len(sizes)]], "", "", 0)
            for n, p in enumerate(properties)]  # fmt: skip


ONE_POINT_OH = amqp10.to_amqp10(EXCHANGE, KEY, PLAIN, b"inner")  # a 1.0 message as a body

SHAPES = {
    "equal properties": run_of([PLAIN] * 50, [16]),
    "changing": run_of([PLAIN, EU, EU, US, NATIVE, EU, PLAIN] * 9, [0, 1, 255, 256, 300]),
    "values merge": run_of([EU, EU, EU, US, US, NATIVE, NATIVE, EU], [5]),
    "native only": run_of([NATIVE] * 7, [3, 256]),
    "body decides": [
        (AMQP10, ONE_POINT_OH, "", "", 0),
        (AMQP10, b"not 1.0", "", "", 0),
        (EU, b"x", "", "", 0),
        (AMQP10, ONE_POINT_OH, "", "", 0),
    ],
    "one": run_of([US], [256]),
    "none": [],
}


@pytest.mark.parametrize("name", SHAPES)
def test_the_c_loop_gives_what_the_python_loop_gave(name: str) -> None:
    messages = SHAPES[name]
    assert in_c(messages) == reference(messages)


def test_an_entry_over_the_limit_gives_none() -> None:
    messages = run_of([PLAIN, PLAIN, EU], [100])
    made = reference(messages)
    assert made is not None
    largest = max(array("I", made[1]))
    assert in_c(messages, largest) == made
    assert in_c(messages, largest - 1) is None is reference(messages, largest - 1)


def test_python_is_asked_once_per_run_of_equal_properties() -> None:
    asked: list[bytes] = []

    def prefix_of(properties: bytes) -> tuple[bytes | None, bytes]:
        asked.append(properties)
        return amqp10.sections_before_body(EXCHANGE, KEY, properties), b""

    copies = [EU[:1] + EU[1:] for _ in range(8)]  # equal, not the same objects
    messages = run_of([PLAIN] * 10 + copies[:5] + [NATIVE] + copies[5:], [4])
    converted_entries(messages, KEY, prefix_of, amqp10.to_amqp10, LIMIT)
    assert asked == [PLAIN, EU]  # equal bytes, not only the same object


def test_bad_arguments_and_callbacks_are_refused() -> None:
    good = run_of([PLAIN], [4])
    with pytest.raises(TypeError):
        converted_entries([(PLAIN,)], KEY, lambda p: (None, b""), amqp10.to_amqp10, LIMIT)
    with pytest.raises(TypeError):
        converted_entries([("str", b"b")], KEY, lambda p: (None, b""), amqp10.to_amqp10, LIMIT)
    with pytest.raises(TypeError):
        converted_entries(good, KEY, lambda p: b"not a pair", amqp10.to_amqp10, LIMIT)
    with pytest.raises(TypeError):
        converted_entries(good, KEY, lambda p: (None, b""), lambda p, b: "str", LIMIT)
    with pytest.raises(ZeroDivisionError):
        converted_entries(good, KEY, lambda p: (1 / 0, b""), amqp10.to_amqp10, LIMIT)
    messages = run_of([PLAIN, EU, US], [4])

    def shrinking(properties: bytes) -> tuple[bytes | None, bytes]:
        messages.clear()
        return b"", b""

    with pytest.raises(RuntimeError):
        converted_entries(messages, KEY, shrinking, amqp10.to_amqp10, LIMIT)
