"""MQTT 5.0 PUBLISH properties <-> AMQP basic properties (mqtt_gateway/message_properties.py),
cross-checked with the AMQP gateway's own decoder (what pika's consumers are sent) and
the stream conversion (what rstream's consumers are sent)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_gateway.codec.properties import BasicProperties, decode_properties, encode_properties
from mqtt_gateway import mapping, message_properties
from mqtt_gateway.codec import NO_PROPERTIES, Properties, ProtocolLevel, Publish, encode
from mqtt_gateway.message_properties import to_amqp, to_mqtt
from streamq.log import amqp10_types as t
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


@given(
    st.lists(
        st.tuples(st.text(max_size=8), st.text(max_size=8)).filter(
            lambda p: "\x00" not in p[0] + p[1]
        ),
        max_size=10,
    )
)
def test_user_properties_round_trip(pairs: list[tuple[str, str]]) -> None:
    pairs = [(n, v) for n, v in pairs if _utf8(n) and _utf8(v)]
    raw = to_amqp(1, False, Properties(user_properties=tuple(pairs)))
    assert to_mqtt(raw, 0, 0).user_properties == tuple(pairs)


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


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
