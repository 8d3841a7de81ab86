"""MQTT 5.0 PUBLISH properties <-> AMQP basic properties (mqtt_gateway/message_properties.py),
cross-checked with the AMQP gateway's own decoder (what pika's consumers are sent) and
the stream conversion (what rstream's consumers are sent)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_gateway.codec.properties import BasicProperties, decode_properties, encode_properties
from mqtt_gateway import mapping, message_properties
from mqtt_gateway.codec import (
    NO_PROPERTIES,
    Decoder,
    Properties,
    ProtocolLevel,
    Publish,
    encode,
)
from mqtt_gateway.message_properties import to_amqp, to_mqtt
from streamq.log import amqp10_types as t
from streamq.log.amqp091 import encode_properties as encode_tagged
from streamq.log.amqp10 import to_amqp10

FULL = Properties(
    payload_format_indicator=1,
    message_expiry_interval_s=30,
    content_type="application/json",
    response_topic="replies/dev-1",
    correlation_data=b"req-42",
    user_properties=(("site", "lyon"), ("x-trace", "abc"), ("n", "1")),
)


def test_no_properties_store_as_before() -> None:
    assert to_amqp(1, False, NO_PROPERTIES) == mapping.publish_properties(1, False)
    assert to_mqtt(mapping.publish_properties(1, True), 0, 0) is NO_PROPERTIES
    assert to_mqtt(b"\x00\x00", 0, 0) is NO_PROPERTIES
    assert to_mqtt(b"\xff", 0, 0) is NO_PROPERTIES  # malformed: nothing


def test_every_property_as_amqp() -> None:
    raw = to_amqp(1, False, FULL)
    decoded = decode_properties(raw)
    assert decoded.delivery_mode == 2
    assert decoded.content_type == "application/json"
    assert decoded.correlation_id == "req-42"
    assert decoded.expiration == "30000"
    assert decoded.headers == {
        "x-mqtt-publish-qos": 1,
        "x-mqtt-dup": False,
        "x-mqtt-payload-format-indicator": 1,
        "x-reply-to-topic": "replies.dev-1",
        "site": "lyon",
        "x-trace": "abc",
        "n": "1",
    }
    assert mapping.published_qos(raw) == 1


def test_every_property_back_to_mqtt_with_the_interval_left() -> None:
    raw = to_amqp(1, False, FULL)
    stored_ms = 1_000_000
    assert to_mqtt(raw, stored_ms, stored_ms) == FULL
    left = to_mqtt(raw, stored_ms, stored_ms + 12_500)
    assert left.message_expiry_interval_s == 18  # 17.5 s left, rounded up (MQTT-3.3.2-6)
    assert to_mqtt(raw, stored_ms, stored_ms + 60_000).message_expiry_interval_s == 0


def test_binary_correlation_data_goes_to_x_correlation_id() -> None:
    """As RabbitMQ's mc_mqtt: correlation_id only holds a valid short string."""
    for data in (b"\x00\xff\x01", b"a" * 256, b"nul\x00"):
        raw = to_amqp(0, False, Properties(correlation_data=data))
        decoded = decode_properties(raw)
        assert decoded.correlation_id is None
        assert decoded.headers is not None and "x-correlation-id" in decoded.headers
        assert to_mqtt(raw, 0, 0).correlation_data == data


def test_content_types_amqp_cannot_hold_stay_for_mqtt() -> None:
    raw = to_amqp(0, False, Properties(content_type="text/plain; charset=é"))
    assert decode_properties(raw).content_type is None
    assert to_mqtt(raw, 0, 0).content_type == "text/plain; charset=é"


def test_repeated_user_properties_keep_their_order_for_mqtt() -> None:
    pairs = (("k", "1"), ("other", "x"), ("k", "2"), ("x-mqtt-dup", "mine"))
    raw = to_amqp(0, False, Properties(user_properties=pairs))
    headers = decode_properties(raw).headers
    assert headers is not None
    assert headers["k"] == "1" and headers["other"] == "x"  # AMQP: the first of a name
    assert headers["x-mqtt-dup"] is False  # ours, not the client's
    assert to_mqtt(raw, 0, 0).user_properties == pairs


def test_an_amqp_publishers_properties_for_mqtt() -> None:
    """pika's message: headers convertible to strings become User Properties (as
    RabbitMQ's amqpl_header_to_user_property), the rest is left out."""
    raw = encode_properties(
        BasicProperties(
            content_type="text/plain",
            correlation_id="c-1",
            expiration="5000",
            delivery_mode=2,
            headers={
                "x-reply-to-topic": "answers.here",
                "count": 3,
                "ok": True,
                "ratio": 0.5,
                "none": None,
                "list": [1, 2],
                "table": {"a": 1},
                "raw": b"\x00\xff",
            },
        )
    )
    got = to_mqtt(raw, 1000, 3000)
    assert got == Properties(
        content_type="text/plain",
        correlation_data=b"c-1",
        response_topic="answers/here",
        message_expiry_interval_s=3,
        user_properties=(("count", "3"), ("ok", "true"), ("ratio", "0.5"), ("none", "")),
    )
    # whatever came out encodes (and a 5.0 client's codec takes it)
    encode(Publish("t", b"", 0, False, False, None, got), ProtocolLevel.MQTT_5)


def test_what_mqtt_cannot_send_is_left_out() -> None:
    raw = encode_properties(
        BasicProperties(
            headers={
                "x-reply-to-topic": "a.*.b",  # a wildcard: no topic name
                "nul": "a\x00b",
                "bytes": b"\xff".decode("utf-8", "surrogateescape"),
            }
        )
    )
    assert to_mqtt(raw, 0, 0) is NO_PROPERTIES


def test_expiry_is_capped_at_rabbitmqs_ten_years() -> None:
    raw = to_amqp(1, False, Properties(message_expiry_interval_s=0xFFFFFFFF))
    assert decode_properties(raw).expiration == str(message_properties.EXPIRY_MS_MAX)


def test_a_stream_consumer_sees_amqp_10_properties() -> None:
    """The stream conversion of what an MQTT publish stored (rstream's view): content
    type and correlation id in properties, the user properties in application
    properties (x- ones in message annotations, as RabbitMQ)."""
    raw = to_amqp(1, False, FULL)
    message = to_amqp10(b"amq.topic", b"a.b", raw, b"{}")
    sections = {code: value for code, value, _s, _e in t.decode_sections(message)}
    properties = sections[t.SECTION_PROPERTIES][1]
    assert properties[5] == ("string", "req-42")  # correlation-id
    assert properties[6] == ("symbol", "application/json")  # content-type
    application = dict(sections[t.SECTION_APPLICATION_PROPERTIES][1])
    assert application == {("string", "site"): ("string", "lyon"), ("string", "n"): ("string", "1")}
    annotations = dict(sections[t.SECTION_MESSAGE_ANNOTATIONS][1])
    assert annotations[("symbol", "x-trace")] == ("string", "abc")
    assert annotations[("symbol", "x-reply-to-topic")] == ("string", "replies.dev-1")


@pytest.mark.parametrize(
    ("payload", "indicator", "valid"),
    [(b"\xff", 1, False), ("é".encode(), 1, True), (b"\xff", 0, True), (b"\xff", None, True)],
)
def test_payload_format(payload: bytes, indicator: int | None, valid: bool) -> None:
    properties = Properties(payload_format_indicator=indicator)
    assert message_properties.payload_valid(payload, properties) is valid


def _short_text(max_bytes: int = 255) -> st.SearchStrategy[str]:
    """Any short string as the log's codec decodes it (bytes not UTF-8 as surrogates)."""
    return st.binary(max_size=max_bytes).map(lambda b: b.decode("utf-8", "surrogateescape"))


_SCALARS = st.one_of(
    st.tuples(st.just("S"), _short_text(40)),
    st.tuples(st.just("x"), st.binary(max_size=8)),
    st.tuples(st.just("b"), st.integers(-128, 127)),
    st.tuples(st.just("l"), st.integers(-(1 << 63), (1 << 63) - 1)),
    st.tuples(st.just("d"), st.floats(allow_nan=True)),
    st.tuples(st.just("t"), st.booleans()),
    st.tuples(st.just("V"), st.none()),
    st.tuples(st.just("D"), st.tuples(st.integers(0, 255), st.integers(0, 2**32 - 1))),
)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    entries = st.lists(st.tuples(_short_text(8), inner), max_size=3)
    table = entries.map(lambda pairs: [(name, tag, value) for name, (tag, value) in pairs])
    return st.one_of(
        st.tuples(st.just("A"), st.lists(inner, max_size=3)),
        st.tuples(st.just("F"), table),
    )


_VALUES = st.recursive(_SCALARS, _containers, max_leaves=6)
_NAMES = st.one_of(
    _short_text(12),
    st.sampled_from(["x-correlation-id", "x-reply-to-topic", "x-mqtt-user-property"]),
    st.sampled_from(["x-mqtt-payload-format-indicator", "x-mqtt-content-type"]),
)


@given(
    headers=st.lists(st.tuples(_NAMES, _VALUES), max_size=8),
    content_type=st.none() | _short_text(),
    correlation_id=st.none() | _short_text(),
    expiration=st.none() | st.sampled_from(["0", "1500", "99999999999999", "x", "-1", ""]),
)
def test_any_amqp_properties_give_sendable_mqtt_ones(
    headers: list[tuple[str, tuple[str, object]]],
    content_type: str | None,
    correlation_id: str | None,
    expiration: str | None,
) -> None:
    """Whatever an AMQP publisher (or a stream conversion) stored, a 5.0 delivery's
    properties encode, and a 5.0 peer's decoder reads them back unchanged."""
    table = [(name, tag, value) for name, (tag, value) in headers]
    fields = {"headers": table, "content_type": content_type}
    fields |= {"correlation_id": correlation_id, "expiration": expiration}
    raw = encode_tagged(fields)
    got = to_mqtt(raw, 10_000, 11_000)
    packet = Publish("t", b"", 0, False, False, None, got)
    wire = encode(packet, ProtocolLevel.MQTT_5)
    (back,) = Decoder(protocol_level=ProtocolLevel.MQTT_5).feed(wire)
    assert back == packet


_MQTT_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))


@given(
    content_type=st.none() | _MQTT_TEXT,
    correlation=st.none() | st.binary(max_size=300),
    response_topic=st.none() | st.text(alphabet="ab/.é", min_size=1, max_size=10),
    pairs=st.lists(st.tuples(_MQTT_TEXT, _MQTT_TEXT), max_size=6),
    indicator=st.sampled_from([None, 1]),
    expiry_s=st.none() | st.integers(0, 100_000),
    qos=st.integers(0, 2),
)
def test_any_mqtt_properties_come_back(
    content_type: str | None,
    correlation: bytes | None,
    response_topic: str | None,
    pairs: list[tuple[str, str]],
    indicator: int | None,
    expiry_s: int | None,
    qos: int,
) -> None:
    """MQTT -> AMQP -> MQTT keeps every property (the expiry interval, delivered at once)."""
    sent = Properties(
        payload_format_indicator=indicator,
        message_expiry_interval_s=expiry_s,
        content_type=content_type,
        response_topic=response_topic,
        correlation_data=correlation,
        user_properties=tuple(pairs),
    )
    raw = to_amqp(qos, False, sent)
    decode_properties(raw)  # what pika's consumers get decodes
    assert mapping.published_qos(raw) == qos
    assert to_mqtt(raw, 5_000, 5_000) == sent


@given(st.binary(max_size=200))
def test_any_bytes_as_properties_never_raise(raw: bytes) -> None:
    got = to_mqtt(raw, 0, 0)
    encode(Publish("t", b"", 0, False, False, None, got), ProtocolLevel.MQTT_5)
    message_properties.expired(raw, 0, 0)
