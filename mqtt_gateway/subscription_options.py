"""The options of one MQTT subscription, as a binding's arguments hold them and as a
delivery reads them.

Owns `Options` (MQTT 5.0 section 3.8.3.1 and the Subscription Identifier, 3.8.2.1.2),
their form as arguments of the subscription's binding to `amq.topic` (where RabbitMQ
3.13 and 4.x keep them too, there as one table `x-mqtt-subscription-opts`; here one
argument each, `x-mqtt-subscription-id`, `x-mqtt-no-local`,
`x-mqtt-retain-as-published`, only those set, so a plain subscription's binding is
RabbitMQ 3.10's; a shared queue's bindings name their member and its QoS,
`x-mqtt-client-id` and `x-mqtt-qos`) and `delivery_options`, which a delivery asks what
its subscriptions make of one message. Pure functions: no broker state, no packets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from mqtt_gateway import mapping, message_properties
from mqtt_gateway.retained import topic_matches
from streamq.broker.exchange import Binding

ARG_IDENTIFIER: Final = "x-mqtt-subscription-id"
ARG_NO_LOCAL: Final = "x-mqtt-no-local"
ARG_RETAIN_AS_PUBLISHED: Final = "x-mqtt-retain-as-published"
ARG_MEMBER: Final = "x-mqtt-client-id"
ARG_QOS: Final = "x-mqtt-qos"


@dataclass(frozen=True, slots=True)
class Options:
    """One subscription as the session delivers it (the filter without `$share/...`)."""

    topic_filter: str
    qos: int
    identifier: int | None = None
    no_local: bool = False
    retain_as_published: bool = False

    @property
    def plain(self) -> bool:
        """No option changes a delivery."""
        return self.identifier is None and not self.no_local and not self.retain_as_published


def binding_arguments(options: Options, member: str | None) -> dict[str, object]:
    arguments: dict[str, object] = {}
    if options.identifier is not None:
        arguments[ARG_IDENTIFIER] = options.identifier
    if options.no_local:
        arguments[ARG_NO_LOCAL] = True
    if options.retain_as_published:
        arguments[ARG_RETAIN_AS_PUBLISHED] = True
    if member is not None:
        arguments[ARG_MEMBER] = member
        arguments[ARG_QOS] = options.qos
    return arguments


def options_of(binding: Binding, qos: int) -> Options:
    """The options a binding's arguments hold (its QoS: the queue's, or `x-mqtt-qos`)."""
    arguments = dict(binding.arguments)
    identifier = arguments.get(ARG_IDENTIFIER)
    member_qos = arguments.get(ARG_QOS)
    return Options(
        mapping.to_topic(binding.routing_key),
        member_qos if isinstance(member_qos, int) else qos,
        identifier if isinstance(identifier, int) else None,
        arguments.get(ARG_NO_LOCAL) is True,
        arguments.get(ARG_RETAIN_AS_PUBLISHED) is True,
    )


def delivery_options(
    held: dict[str, Options], topic: str, client_id: str, properties_raw: bytes
) -> tuple[bool, tuple[int, ...], bool]:
    """For a message of `topic` from a queue whose subscriptions are `held`: whether it
    goes out (No Local holds back what this client id published, MQTT-3.8.3-3), the
    subscription identifiers of the subscriptions it matches (MQTT-3.3.4-3, -4), and
    its retain flag (Retain As Published: as published, MQTT-3.3.1-13; else 0, -12).
    A message matching none of them (a `$` topic under a first-level wildcard) goes
    out plainly."""
    matched = [o for o in held.values() if topic_matches(o.topic_filter, topic)]
    if not matched:
        return True, (), False
    if (
        any(o.no_local for o in matched)
        and message_properties.publisher_of(properties_raw) == client_id
    ):
        matched = [o for o in matched if not o.no_local]
        if not matched:
            return False, (), False
    identifiers = tuple(sorted({o.identifier for o in matched if o.identifier is not None}))
    as_published = any(o.retain_as_published for o in matched)
    retain = as_published and message_properties.published_retained(properties_raw)
    return True, identifiers, retain
