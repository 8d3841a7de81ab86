"""x-death by splicing raw properties: the same bytes as decoding and re-encoding, and
what pamqp reads back is RabbitMQ 3.10's x-death.

Method: random properties (every field type, headers or none, expiration or none, a CC
header or none) go through a random history of deaths, some repeating a queue and
reason; after each step the splice (`splice_death`) must equal the decoding path
(`with_death_decoded`) byte for byte, and pamqp, an independent decoder, must find
the entries a model of RabbitMQ's rules predicts.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import header as pamqp_header

from amqp_gateway import codec
from amqp_gateway.deaths import (
    AmqpPropertiesCodec,
    death_keys,
    deaths_decoded,
    splice_death,
    with_death_decoded,
)
from amqp_gateway.errors import AMQPSyntaxError
from streamq.broker.deadletter import Death
from tests.unit.amqp_gateway.strategies import (
    basic_properties,
    field_values,
    pamqp_decodable_properties,
    to_pamqp,
)

with_tables = settings(max_examples=150, deadline=None)

names = st.sampled_from(["q1", "q2", "", "qé", "x-death"])
deaths = st.builds(
    Death,
    queue=names,
    reason=st.sampled_from(["expired", "rejected", "maxlen", "delivery_limit"]),
    exchange=st.sampled_from(["", "ex", "amq.direct"]),
    routing_keys=st.lists(st.text(max_size=8), min_size=1, max_size=3).map(tuple),
    time_s=st.integers(0, 2**32 - 1),
    remove_cc=st.booleans(),
)
cc_values = st.none() | st.lists(st.text(max_size=6) | st.integers(0, 9), max_size=3)


def with_cc(properties: codec.BasicProperties, cc: list[Any] | None) -> codec.BasicProperties:
    if cc is None:
        return properties
    return dataclasses.replace(properties, headers={**(properties.headers or {}), "CC": cc})


# x-death entries written by someone else: RabbitMQ's sorted keys, extra keys, any order.
foreign_entries = st.lists(
    st.fixed_dictionaries(
        {
            "queue": names,
            "reason": st.sampled_from(["expired", "rejected"]),
            "count": st.integers(1, 2**40).map(codec.Int64),
        },
        optional={"time": st.integers(0, 2**32).map(codec.Timestamp), "x": field_values},
    ).flatmap(lambda entry: st.permutations(list(entry.items())).map(dict)),
    max_size=4,
)


@with_tables
@given(
    basic_properties,
    cc_values,
    st.none() | foreign_entries,
    st.lists(deaths, min_size=1, max_size=6),
)
def test_the_splice_equals_decoding_and_encoding(
    properties: codec.BasicProperties,
    cc: list[Any] | None,
    earlier: list[Any] | None,
    history: list[Death],
) -> None:
    if earlier is not None:
        headers = {**(properties.headers or {}), "x-death": earlier}
        properties = dataclasses.replace(properties, headers=headers)
    raw = codec.encode_properties(with_cc(properties, cc))
    for death in history:
        spliced = splice_death(raw, death)
        assert spliced == with_death_decoded(raw, death)
        assert death_keys(spliced) == deaths_decoded(spliced)
        raw = spliced


def _pamqp_headers(raw: bytes) -> tuple[dict[str, Any], Any]:
    header = pamqp_header.ContentHeader()
    header.unmarshal(b"\x00\x3c\x00\x00" + struct.pack(">Q", 0) + raw)
    return header.properties.headers or {}, header.properties.expiration


@with_tables
@given(pamqp_decodable_properties, st.lists(deaths, min_size=1, max_size=6))
def test_pamqp_reads_rabbitmqs_x_death(
    properties: codec.BasicProperties, history: list[Death]
) -> None:
    raw = codec.encode_properties(properties)
    original = dict(properties.headers or {})
    model: list[dict[str, Any]] = []  # RabbitMQ's rules, newest first
    for step, death in enumerate(history):
        raw = splice_death(raw, death)
        match = next(
            (e for e in model if (e["queue"], e["reason"]) == (death.queue, death.reason)), None
        )
        if match is not None:
            model.remove(match)
            match["count"] += 1
        else:
            match = {
                "count": 1,
                "reason": death.reason,
                "queue": death.queue,
                "time": to_pamqp(codec.Timestamp(death.time_s)),
                "exchange": death.exchange,
                "routing-keys": list(death.routing_keys),
            }
            if step == 0 and properties.expiration is not None:
                match["original-expiration"] = properties.expiration
        model.insert(0, match)
    headers, expiration = _pamqp_headers(raw)
    assert expiration is None
    assert headers["x-death"] == model
    first = history[0]
    for key, first_value in (
        ("x-first-death-reason", first.reason),
        ("x-first-death-queue", first.queue),
        ("x-first-death-exchange", first.exchange),
    ):
        assert headers[key] == to_pamqp(original.get(key, first_value))
    for key, value in original.items():
        if key != "x-death" and not key.startswith("x-first-death-"):
            assert headers[key] == to_pamqp(value)


def test_a_repeated_death_raises_the_count_and_keeps_the_first_time_and_keys() -> None:
    properties_codec = AmqpPropertiesCodec()
    raw = codec.encode_properties(codec.BasicProperties(expiration="100000"))
    once = properties_codec.with_death(raw, Death("r1", "rejected", "", ("r1", "zz"), 1000))
    twice = properties_codec.with_death(once, Death("r2", "rejected", "", ("r2",), 1001))
    again = properties_codec.with_death(twice, Death("r1", "rejected", "", ("r2",), 1002))
    headers, _ = _pamqp_headers(again)
    [r1, r2] = headers["x-death"]
    assert (r1["queue"], r1["count"], r1["routing-keys"], r1["original-expiration"]) == (
        "r1",
        2,
        ["r1", "zz"],
        "100000",
    )
    assert int(r1["time"].timestamp()) == 1000  # the first death's time, as RabbitMQ
    assert (r2["queue"], r2["count"], "original-expiration" in r2) == ("r2", 1, False)
    assert properties_codec.deaths(again) == [("r1", "rejected"), ("r2", "rejected")]


def test_cc_is_read_and_removed_only_with_a_dead_letter_routing_key() -> None:
    properties_codec = AmqpPropertiesCodec()
    raw = codec.encode_properties(codec.BasicProperties(headers={"CC": ["k2", 3, "k3"]}))
    assert properties_codec.cc_keys(raw) == ("k2", "k3")
    assert properties_codec.cc_keys(codec.encode_properties(codec.BasicProperties())) == ()
    kept = properties_codec.with_death(raw, Death("q", "expired", "x", ("k1", "k2"), 5))
    removed = properties_codec.with_death(raw, Death("q", "expired", "x", ("k1",), 5, True))
    assert "CC" in _pamqp_headers(kept)[0]
    assert "CC" not in _pamqp_headers(removed)[0]


@pytest.mark.parametrize(
    "x_death",
    [
        "not an array",
        [1, {"queue": "q", "reason": "expired", "count": 3}],  # a non-table entry is dropped
        [{"queue": "q", "reason": "expired", "count": 3}],  # count 'I', not int64
        [{"queue": "q", "reason": "expired"}],  # no count
        [{"queue": b"q", "reason": "expired"}],  # a queue that is not a string
    ],
)
def test_odd_x_death_headers_take_the_decoding_path(x_death: Any) -> None:
    raw = codec.encode_properties(codec.BasicProperties(headers={"x-death": x_death}))
    death = Death("q", "expired", "", ("q",), 7)
    assert splice_death(raw, death) == with_death_decoded(raw, death)
    assert AmqpPropertiesCodec().deaths(raw) == deaths_decoded(raw)


@given(basic_properties, st.data())
def test_malformed_properties_fail_as_the_decoder_does(
    properties: codec.BasicProperties, data: st.DataObject
) -> None:
    raw = codec.encode_properties(properties)
    cut = data.draw(st.integers(0, len(raw) - 1))
    death = Death("q", "expired", "", ("q",), 7)
    with pytest.raises(AMQPSyntaxError):
        codec.decode_properties(raw[:cut])
    with pytest.raises(AMQPSyntaxError):
        splice_death(raw[:cut], death)
