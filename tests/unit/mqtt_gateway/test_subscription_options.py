"""Subscription options (mqtt_gateway/subscription_options.py): as binding arguments and
back, and what a delivery makes of them (No Local, identifiers, Retain As Published)."""

from __future__ import annotations

from amqp_gateway.codec.properties import decode_properties
from mqtt_gateway import mapping, message_properties
from mqtt_gateway.codec import Properties
from mqtt_gateway.subscription_options import (
    Options,
    binding_arguments,
    delivery_options,
    options_of,
)
from streamq.broker.exchange import Binding, Destination, freeze_arguments


def binding(options: Options, member: str | None = None) -> Binding:
    arguments = freeze_arguments(binding_arguments(options, member))
    return Binding(
        Destination("queue", "q"), mapping.to_routing_key(options.topic_filter), arguments
    )


def test_options_round_trip_through_binding_arguments() -> None:
    plain = Options("a/+", 1)
    assert binding_arguments(plain, None) == {}  # RabbitMQ 3.10's bindings, unchanged
    full = Options("a/#", 2, 7, True, True)
    assert options_of(binding(full), 2) == full
    member = Options("jobs/#", 1, 3)
    assert binding_arguments(member, "w1")["x-mqtt-client-id"] == "w1"
    assert options_of(binding(member, "w1"), 0) == member  # its QoS from x-mqtt-qos


def test_delivery_options() -> None:
    mine = mapping.publish_properties(1, False, publisher="me")
    theirs = mapping.publish_properties(1, False, publisher="you", retain=True)
    amqp = b""  # an AMQP publisher's message without properties
    held = {"a/#": Options("a/#", 1, 5, no_local=True), "a/b": Options("a/b", 1, 9)}
    assert delivery_options(held, "a/b", "me", mine) == (True, (9,), False)
    assert delivery_options(held, "a/c", "me", mine) == (False, (), False)
    assert delivery_options(held, "a/b", "me", theirs) == (True, (5, 9), False)
    assert delivery_options(held, "a/c", "me", amqp) == (True, (5,), False)
    assert delivery_options(held, "x", "me", mine) == (True, (), False)  # matches none
    kept = {"a/#": Options("a/#", 1, retain_as_published=True)}
    assert delivery_options(kept, "a/b", "me", theirs) == (True, (), True)
    assert delivery_options(kept, "a/b", "me", mine) == (True, (), False)


def test_publisher_and_retain_headers_are_read_back() -> None:
    raw = mapping.publish_properties(2, True, publisher="dev-ü", retain=True)
    assert message_properties.publisher_of(raw) == "dev-ü"
    assert message_properties.published_retained(raw)
    assert mapping.published_qos(raw) == 2
    plain = mapping.publish_properties(0, False)
    assert message_properties.publisher_of(plain) is None
    assert not message_properties.published_retained(plain)


def test_the_headers_beside_mqtt5_properties_are_no_user_properties() -> None:
    """With MQTT 5 properties (message_properties.to_amqp): the two headers read back,
    never turned into User Properties, and a User Property's value holding their table
    entries' bytes sets neither (the headers are decoded, not searched for)."""
    forged = "\rx-mqtt-retaint\x01"  # `x-mqtt-retain` = true as table entry bytes
    properties = Properties(content_type="text/plain", user_properties=(("k", forged),))
    raw = message_properties.to_amqp(1, False, properties, publisher="dev", retain=True)
    assert message_properties.publisher_of(raw) == "dev"
    assert message_properties.published_retained(raw)
    assert message_properties.to_mqtt(raw, 0, 0) == properties
    anonymous = message_properties.to_amqp(1, False, properties)
    assert message_properties.publisher_of(anonymous) is None
    assert not message_properties.published_retained(anonymous)
    held = {"a/#": Options("a/#", 1, no_local=True, retain_as_published=True)}
    assert delivery_options(held, "a/b", "me", anonymous) == (True, (), False)
    assert delivery_options(held, "a/b", "me", raw) == (True, (), True)
    assert delivery_options(held, "a/b", "dev", raw) == (False, (), False)


def test_the_headers_decode_as_amqp() -> None:
    raw = mapping.publish_properties(1, False, publisher="dev", retain=True)
    headers = decode_properties(raw).headers
    assert headers is not None
    assert headers["x-mqtt-client-id"] in ("dev", b"dev")
    assert headers["x-mqtt-retain"] is True
