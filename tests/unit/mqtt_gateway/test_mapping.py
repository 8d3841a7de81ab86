"""The gateway's translations (mqtt_gateway/mapping.py): topics to routing keys and back,
queue names, and the AMQP properties of an MQTT publish, cross-checked with the AMQP
codec's own decoder (the one pika's bytes go through)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_gateway.codec.properties import BasicProperties, decode_properties, encode_properties
from mqtt_gateway import mapping


@pytest.mark.parametrize(
    ("topic", "routing_key"),
    [
        ("a/b/c", "a.b.c"),
        ("a/+/c", "a.*.c"),
        ("a/#", "a.#"),
        ("#", "#"),
        ("v/1.5", "v.1/5"),  # a dot inside a level swaps with the separator
        ("/leading", ".leading"),
    ],
)
def test_topic_and_routing_key(topic: str, routing_key: str) -> None:
    assert mapping.to_routing_key(topic) == routing_key
    assert mapping.to_topic(routing_key) == topic


@given(st.text(alphabet="ab/.+*#", max_size=20))
def test_the_mapping_is_its_own_inverse(topic: str) -> None:
    assert mapping.to_topic(mapping.to_routing_key(topic)) == topic


def test_queue_names_are_rabbitmqs() -> None:
    assert mapping.queue_name("dev", 0) == "mqtt-subscription-devqos0"
    assert mapping.queue_name("dev", 1) == "mqtt-subscription-devqos1"
    assert mapping.queue_name("dev", 2) == "mqtt-subscription-devqos2"
    assert mapping.shared_queue_name("workers") == "mqtt-shared-workers"


@pytest.mark.parametrize(("qos", "dup", "mode"), [(0, False, 1), (1, True, 2), (2, False, 2)])
def test_publish_properties_decode_as_amqp(qos: int, dup: bool, mode: int) -> None:
    raw = mapping.publish_properties(qos, dup)
    decoded = decode_properties(raw)
    assert decoded.delivery_mode == mode
    assert decoded.headers == {"x-mqtt-publish-qos": qos, "x-mqtt-dup": dup}
    assert mapping.published_qos(raw) == qos


def test_the_published_qos_of_other_messages() -> None:
    assert mapping.published_qos(b"") is None
    plain = encode_properties(BasicProperties(content_type="text/plain", delivery_mode=2))
    assert mapping.published_qos(plain) is None
    assert mapping.delivery_qos(1, plain) == 1  # an AMQP publisher's: the subscription's
    assert mapping.delivery_qos(0, plain) == 0
    other = encode_properties(BasicProperties(headers={"app": "x", "x-mqtt-publish-qos": 0}))
    assert mapping.published_qos(other) == 0
    assert mapping.delivery_qos(1, mapping.publish_properties(0, False)) == 0
    assert mapping.delivery_qos(0, mapping.publish_properties(1, False)) == 0
