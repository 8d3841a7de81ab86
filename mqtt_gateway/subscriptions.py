"""A session's subscriptions on the broker: its queues, their bindings and their options.

Owns SUBSCRIBE and UNSUBSCRIBE on the broker core, as RabbitMQ's MQTT plugin maps them
and past it: a session's subscriptions of QoS q are bindings of its queue
`mqtt-subscription-<client id>qos<q>` (q = 0, 1, 2) to `amq.topic`; a shared
subscription `$share/{group}/{filter}` is a binding of the group's queue
`mqtt-shared-<group>`, which every member consumes from, so the broker core hands its
messages to them in turn (round robin). MQTT 5's options of each subscription are its
binding's arguments (as RabbitMQ 3.13 keeps them in the binding; here
`x-mqtt-subscription-id`, `x-mqtt-no-local`, `x-mqtt-retain-as-published`; a shared
queue's bindings also name their member, `x-mqtt-client-id`, and its QoS,
`x-mqtt-qos`), so a persistent session's options survive a restart in the vhost's
definitions journal with nothing else stored.
The session keeps them in memory too (`MqttSession.subscriptions`, by queue and filter),
read at each delivery by `delivery_options`: which subscription identifiers a PUBLISH
carries, whether No Local holds it back, and its retain flag under Retain As Published.

Permission checks are RabbitMQ's (configure, write and read on the queue, read on the
exchange, the topic permission read). It touches no socket and parses no packet.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from mqtt_gateway import mapping
from mqtt_gateway.binding_index import BindingIndex
from mqtt_gateway.codec import (
    ProtocolLevel,
    ReasonCode,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    parse_shared,
)
from mqtt_gateway.codec.reason_codes import SUBACK_FAILURE_V311
from mqtt_gateway.consumer import MqttConsumer
from mqtt_gateway.subscription_options import (
    ARG_MEMBER,
    Options,
    binding_arguments,
    options_of,
)
from streamq.broker.errors import BrokerError
from streamq.broker.exchange import Binding, Destination, freeze_arguments

if TYPE_CHECKING:
    from mqtt_gateway.session import MqttSession
    from streamq.broker.accounts import PermissionKind
    from streamq.broker.queue import Queue
    from streamq.broker.vhost import VHost

logger = logging.getLogger(__name__)

_V5: Final = ProtocolLevel.MQTT_5
QOS_GRANTED_MAX: Final = 2
SESSION_EXPIRY_NEVER: Final = 0xFFFFFFFF
OWN_QUEUE_QOS: Final = (0, 1, 2)


# -- SUBSCRIBE and UNSUBSCRIBE ---------------------------------------------------------------


def subscribe(s: MqttSession, packet: Subscribe) -> list[tuple[str, int, int | None]]:
    """Bind each filter to the queue of its granted QoS (or its group's); SUBACK once
    the bindings of a persistent session are durable. Returns the (filter, QoS,
    identifier) whose retained messages to send after it (Retain Handling 0, or 1 for
    a new subscription; never for a shared one: MQTT 5.0 section 3.8.4 sends them to
    non-shared ones)."""
    vhost = s.vhost
    assert vhost is not None
    identifier = packet.properties.subscription_identifiers
    codes: list[int] = []
    durable = False
    retained: list[tuple[str, int, int | None]] = []
    for subscription in packet.subscriptions:
        options = Options(
            subscription.topic_filter,
            min(subscription.qos, QOS_GRANTED_MAX),
            identifier[0] if identifier else None,
            subscription.no_local,
            subscription.retain_as_published and s.level is _V5,
        )
        code, existed = _subscribe_one(s, vhost, subscription, options)
        codes.append(code)
        if code > QOS_GRANTED_MAX:
            continue
        durable = durable or s.persistent
        shared = parse_shared(subscription.topic_filter) is not None
        handling = subscription.retain_handling
        if not shared and (handling == 0 or (handling == 1 and not existed)):
            retained.append((subscription.topic_filter, code, options.identifier))
    s.reply(SubAck(packet.packet_id, tuple(codes)), definitions=durable)
    return retained


def _subscribe_one(
    s: MqttSession, vhost: VHost, subscription: Subscription, options: Options
) -> tuple[int, bool]:
    """The SUBACK code and whether the subscription existed already."""
    failure = ReasonCode.NOT_AUTHORIZED if s.level is _V5 else SUBACK_FAILURE_V311
    shared = parse_shared(subscription.topic_filter)
    member = None
    if shared is not None:
        if s.level is not _V5:
            return failure, False  # `$share` is MQTT 5's; a 3.x filter cannot start so
        options = Options(shared.topic_filter, *_rest(options))
        name, member = mapping.shared_queue_name(shared.share_name), s.client_id
    else:
        name = mapping.queue_name(s.client_id, options.qos)
    routing_key = mapping.to_routing_key(options.topic_filter)
    if not _allowed(s, name, routing_key):
        logger.warning(
            "MQTT subscription to '%s' refused for user '%s' (client id '%s')",
            subscription.topic_filter,
            s.user,
            s.client_id,
        )
        return failure, False
    try:
        queue = _queue(s, vhost, name, shared=member is not None)
        existed = _unbind_filter(s, vhost, routing_key, member, name if member else None)
        _bind(s, vhost, name, routing_key, binding_arguments(options, member))
    except BrokerError as exc:
        logger.warning("MQTT subscription to '%s' failed: %s", subscription.topic_filter, exc)
        return (ReasonCode.UNSPECIFIED_ERROR if s.level is _V5 else failure), False
    _hold(s, name, options)
    consume(s, vhost, queue, options.qos)
    return options.qos, existed


def _hold(s: MqttSession, name: str, options: Options) -> None:
    s.subscriptions.setdefault(name, {})[options.topic_filter] = options
    s.options_in_use = s.options_in_use or not options.plain
    s.no_local_in_use = s.no_local_in_use or options.no_local


def _rest(options: Options) -> tuple[int, int | None, bool, bool]:
    return options.qos, options.identifier, options.no_local, options.retain_as_published


def _allowed(s: MqttSession, name: str, routing_key: str) -> bool:
    return (
        _permitted(s, "configure", name)
        and _permitted(s, "write", name)
        and _permitted(s, "read", mapping.EXCHANGE)
        and _permitted(s, "read", name)
        and _topic_read_permitted(s, routing_key)
    )


def _permitted(s: MqttSession, kind: PermissionKind, resource: str) -> bool:
    vhost = s.vhost
    assert vhost is not None
    return s.broker.accounts.permitted(s.user, vhost.name, kind, resource)


def _topic_read_permitted(s: MqttSession, routing_key: str) -> bool:
    vhost = s.vhost
    assert vhost is not None
    grants = s.broker.accounts.topic_grants(s.user, vhost.name)
    if grants is None:
        return True
    variables = {"username": s.user, "vhost": vhost.name, "client_id": s.client_id}
    return grants.permitted(mapping.EXCHANGE, "read", routing_key, variables)


def _queue(s: MqttSession, vhost: VHost, name: str, *, shared: bool) -> Queue:
    existing = vhost.queues.get(name)
    if existing is not None:
        return existing
    arguments: dict[str, object] = {}
    if shared:
        # A group outlives its members' connections: durable, deleted with its last
        # binding (`_drop_if_unbound`).
        return vhost.declare_queue(name, False, True, False, False, arguments, None)
    if s.persistent and 0 < s.session_expiry_s < SESSION_EXPIRY_NEVER:
        # MQTT 5's session expiry, as RabbitMQ 3.13 maps it: the queue's own expiry
        # once unused (x-expires counts from the last consumer's leaving).
        arguments["x-expires"] = s.session_expiry_s * 1000
    return vhost.declare_queue(name, False, s.persistent, False, not s.persistent, arguments, None)


def _index(s: MqttSession, vhost: VHost) -> BindingIndex:
    return s.gateway.binding_index(vhost)


def _bind(
    s: MqttSession, vhost: VHost, name: str, routing_key: str, arguments: dict[str, object]
) -> None:
    vhost.bind(Destination("queue", name), mapping.EXCHANGE, routing_key, arguments)
    _index(s, vhost).add(
        Binding(Destination("queue", name), routing_key, freeze_arguments(arguments))
    )


def _unbind(s: MqttSession, vhost: VHost, binding: Binding) -> None:
    vhost.unbind(binding.destination, mapping.EXCHANGE, binding.routing_key,
                 dict(binding.arguments))  # fmt: skip
    _index(s, vhost).remove(binding)


def _unbind_filter(
    s: MqttSession, vhost: VHost, routing_key: str, member: str | None, shared_name: str | None
) -> bool:
    """Remove the session's subscription to the filter, before it is bound again with
    its new QoS and options (MQTT-3.8.4-3: a subscription replaces the one it repeats);
    whether there was one."""
    found = False
    if shared_name is not None and member is not None:
        index = _index(s, vhost)
        for binding in index.of(vhost, shared_name, routing_key):
            if dict(binding.arguments).get(ARG_MEMBER) == member:
                _unbind(s, vhost, binding)
                found = True
        return found
    for qos in OWN_QUEUE_QOS:
        name = mapping.queue_name(s.client_id, qos)
        for binding in _index(s, vhost).of(vhost, name, routing_key):
            _unbind(s, vhost, binding)
            s.subscriptions.get(name, {}).pop(mapping.to_topic(routing_key), None)
            found = True
    return found


def unsubscribe(s: MqttSession, packet: Unsubscribe) -> None:
    vhost = s.vhost
    assert vhost is not None
    codes: list[int] = []
    for topic_filter in packet.topic_filters:
        shared = parse_shared(topic_filter)
        if shared is None:
            found = _unbind_filter(s, vhost, mapping.to_routing_key(topic_filter), None, None)
        else:
            name = mapping.shared_queue_name(shared.share_name)
            routing_key = mapping.to_routing_key(shared.topic_filter)
            found = _unbind_filter(s, vhost, routing_key, s.client_id, name)
            held = s.subscriptions.get(name, {})
            held.pop(shared.topic_filter, None)
            if not held:
                _leave_group(s, vhost, name)
        codes.append(ReasonCode.SUCCESS if found else ReasonCode.NO_SUBSCRIPTION_EXISTED)
    reply = UnsubAck(packet.packet_id, tuple(codes) if s.level is _V5 else ())
    s.reply(reply, definitions=s.persistent)


def _leave_group(s: MqttSession, vhost: VHost, name: str) -> None:
    """The session has no subscription left in a shared queue: it stops consuming, and
    the queue goes with its last binding."""
    s.subscriptions.pop(name, None)
    consumer = s.consumers.pop(name, None)
    if consumer is not None:
        held = [entry for entry in s.inflight.items() if entry[1][2] is consumer]
        for packet_id, _entry in held:
            del s.inflight[packet_id]
        vhost.requeue_many([entry for _id, entry in held], deliver=False)
        vhost.remove_consumer(consumer.queue, consumer)
    _drop_if_unbound(s, vhost, name)


def _drop_if_unbound(s: MqttSession, vhost: VHost, name: str) -> None:
    queue = vhost.queues.get(name)
    index = _index(s, vhost)
    if queue is not None and not index.of(vhost, name) and not queue.consumers:
        vhost.remove_queue(queue)
        index.drop_queue(name)


# -- a session's start and end ---------------------------------------------------------------


def consume(s: MqttSession, vhost: VHost, queue: Queue, qos: int) -> None:
    """Consume from `queue` at `qos`. A shared queue's member consumes with acks
    whatever its QoS, at the highest of its subscriptions there (one consumer per
    member and queue: a member's filters in one group share it)."""
    shared = queue.name.startswith(mapping.SHARED_QUEUE_PREFIX)
    existing = s.consumers.get(queue.name)
    if existing is not None:
        if shared:
            existing.qos = max(o.qos for o in s.subscriptions.get(queue.name, {}).values())
        return
    consumer = MqttConsumer(s, queue, qos, acks=shared or qos > 0)
    s.consumers[queue.name] = consumer
    vhost.add_consumer(queue, consumer)


def resume(s: MqttSession, vhost: VHost) -> bool:
    """Consume from the session's queues that exist and the shared queues it is a
    member of, with their subscriptions' options; True if any (session present)."""
    present = False
    index = _index(s, vhost)
    for qos in OWN_QUEUE_QOS:
        name = mapping.queue_name(s.client_id, qos)
        queue = vhost.queues.get(name)
        if queue is None:
            index.drop_queue(name)  # expired, or deleted by an operator
        elif queue.failed is None:
            present = True
            for binding in index.of(vhost, name):
                _hold(s, name, options_of(binding, qos))
            consume(s, vhost, queue, qos)
    for name, binding in index.memberships(vhost, s.client_id):
        queue = vhost.queues.get(name)
        if queue is None or queue.failed is not None:
            continue
        present = True
        options = options_of(binding, 0)
        _hold(s, name, options)
        consume(s, vhost, queue, options.qos)
    return present


def forget(s: MqttSession, vhost: VHost) -> None:
    """End a session's subscriptions (a clean start, or a session ending with its
    connection): its own queues deleted, its shared memberships unbound."""
    index = _index(s, vhost)
    for qos in OWN_QUEUE_QOS:
        name = mapping.queue_name(s.client_id, qos)
        queue = vhost.queues.get(name)
        if queue is not None:
            vhost.remove_queue(queue)
        index.drop_queue(name)
    for name, binding in index.memberships(vhost, s.client_id):
        _unbind(s, vhost, binding)
        if name not in s.consumers:
            _drop_if_unbound(s, vhost, name)
    s.subscriptions.clear()
