"""What an MQTT session does on the broker core: login, subscriptions, publishes, clean-up.

Owns the mapping of each MQTT operation onto the broker as RabbitMQ's MQTT plugin makes
it (rabbit_mqtt_processor): CONNECT logs in with the broker's users (`vhost:user` picks
the vhost, else `default_vhost`), takes over a session with the same client id, and
finds a persistent session's queues; SUBSCRIBE declares the session's queue of the
granted QoS (`mapping.queue_name`: durable for a persistent session, auto-delete for a
clean one), binds it to `amq.topic` with the mapped filter and consumes from it, with
RabbitMQ's permission checks (configure on the queue to declare it, write on the queue
and read on the exchange to bind, read on the queue to consume, the topic permission
"read" on the routing key); PUBLISH routes through `amq.topic` after the checks "write"
on the exchange and the topic permission "write", and stores into the vhost's log;
retained messages and wills; and what a closing connection leaves: its deliveries in
flight back to their queues, its clean session's queues deleted.

A persistent session's subscriptions are its queues' bindings to `amq.topic`, which the
vhost's definitions journal keeps across restarts (docs/mqtt.md): nothing more is stored.
Functions take the session they work for, as amqp_gateway/publishing.py's do; none
touches a socket.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import time
from typing import TYPE_CHECKING, Final

from mqtt_gateway import mapping, message_properties
from mqtt_gateway.codec import (
    NO_PROPERTIES,
    ConnAck,
    ConnackReturnCode,
    Connect,
    Properties,
    ProtocolLevel,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    ReasonCode,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    parse_shared,
)
from mqtt_gateway.codec.reason_codes import SUBACK_FAILURE_V311
from mqtt_gateway.consumer import MqttConsumer
from mqtt_gateway.topic_aliases import TopicAliases
from streamq.broker.accounts import PermissionKind
from streamq.broker.errors import BrokerError
from streamq.broker.exchange import Destination
from streamq.broker.stats import MessageStats
from streamq.broker.users import login_allowed
from streamq.tls_peer import certificate_cn

if TYPE_CHECKING:
    from mqtt_gateway.session import MqttSession
    from streamq.broker.queue import Queue
    from streamq.broker.vhost import VHost

logger = logging.getLogger(__name__)

_V5: Final = ProtocolLevel.MQTT_5
VHOST_SEPARATOR: Final = ":"
CLIENT_ID_ASSIGNED_PREFIX: Final = "streamq-"
SESSION_EXPIRY_NEVER: Final = 0xFFFFFFFF
QOS_GRANTED_MAX: Final = 1
"""Subscriptions are granted QoS 1 at most (deliveries at QoS 2 are not implemented;
a QoS 2 publish is received with its full handshake)."""


def _refusal(s: MqttSession, v5: ReasonCode, v3: ConnackReturnCode) -> int:
    return int(v5) if s.level is _V5 else int(v3)


def connect(s: MqttSession, packet: Connect) -> int | None:
    """Log in and open the session; the CONNACK code refusing it, or None when the
    CONNACK went out."""
    gateway = s.gateway
    will = packet.will
    if will is not None and not message_properties.payload_valid(will.payload, will.properties):
        return int(ReasonCode.PAYLOAD_FORMAT_INVALID)  # 5.0 only: 3.x wills have no properties
    user_vhost = _login(s, packet)
    if isinstance(user_vhost, int):
        return user_vhost
    user, vhost = user_vhost
    s.user, s.vhost = user, vhost
    s.connect = packet  # from here on, the connection's end releases what it holds
    client_id = packet.client_id
    assigned = None
    if not client_id:
        client_id = assigned = CLIENT_ID_ASSIGNED_PREFIX + secrets.token_hex(12)
    s.client_id = client_id
    if packet.protocol_level is _V5:
        # The client's Receive Maximum bounds its QoS 1 deliveries in flight (3.1.2.11.3).
        receive_maximum = packet.properties.receive_maximum
        if receive_maximum is not None:
            s.inflight_max = min(s.inflight_max, receive_maximum)
        expiry = packet.properties.session_expiry_interval_s or 0
        s.session_expiry_s = expiry
        s.persistent = expiry > 0
        # Ours toward the client: its maximum, within our own (as RabbitMQ 3.13).
        outbound = min(packet.properties.topic_alias_maximum or 0, gateway.topic_alias_maximum)
        s.topic_aliases = TopicAliases(gateway.topic_alias_maximum, outbound)
    else:
        s.persistent = not packet.clean_start
    gateway.take_over(s)
    forgotten = False
    if packet.clean_start:
        _delete_session_queues(s, vhost)
        forgotten = gateway.qos2(vhost).drop(client_id)
    present = _resume(s, vhost)
    if s.persistent:
        s.qos2_received = gateway.qos2(vhost).of(client_id)
    properties = Properties()
    if s.level is _V5:
        properties = Properties(
            assigned_client_identifier=assigned,
            receive_maximum=None,
            maximum_qos=None,
            topic_alias_maximum=gateway.topic_alias_maximum or None,  # absent: 0
            shared_subscription_available=0,
            subscription_identifier_available=0,
            wildcard_subscription_available=None,
            retain_available=None,
            maximum_packet_size=gateway.packet_bytes_max,
        )
    connack = ConnAck(0, present and s.level is not ProtocolLevel.MQTT_3_1, properties)
    # A clean start that dropped a previous session's QoS 2 identifiers answers once that
    # is on disk: after a restart, a stale one would drop the client's next publish.
    s.reply(connack, durable=forgotten)
    logger.info(
        "accepted MQTT connection %s: client id '%s', user '%s', vhost '%s'",
        s.peer,
        client_id,
        user,
        vhost.name,
    )
    gateway.register(s)
    return None


def _login(s: MqttSession, packet: Connect) -> tuple[str, VHost] | int:
    """The user and vhost of CONNECT's credentials, or the refusal's CONNACK code."""
    gateway = s.gateway
    username = packet.username
    if username is None and packet.password is None and gateway.ssl_cert_login:
        # RabbitMQ's mqtt.ssl_cert_login: no credentials, a verified client certificate.
        return _certificate_login(s)
    if username is None or packet.password is None:
        return _refusal(
            s, ReasonCode.BAD_USER_NAME_OR_PASSWORD, ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD
        )
    vhost_name = gateway.default_vhost
    if VHOST_SEPARATOR in username:
        vhost_name, username = username.split(VHOST_SEPARATOR, 1)
    try:
        password = packet.password.decode()
    except UnicodeDecodeError:
        password = None
    accounts = s.broker.accounts
    found = accounts.authenticate(username, password) if password is not None else None
    if found is None or not login_allowed(found.name, _is_loopback(s)):
        logger.warning("MQTT login refused for user %r from %s", username, s.peer)
        return _refusal(
            s, ReasonCode.BAD_USER_NAME_OR_PASSWORD, ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD
        )
    return _open_vhost(s, found.name, vhost_name)


def _certificate_login(s: MqttSession) -> tuple[str, VHost] | int:
    """Log in as the common name of the client's verified TLS certificate (MQTTS with
    tls_verify_peer), into `default_vhost`: the user must exist, no password is checked,
    as AMQP's EXTERNAL (amqp_gateway/external_auth.py)."""
    name = certificate_cn(s.transport)
    found = s.broker.accounts.user(name) if name else None
    if found is None or not login_allowed(found.name, _is_loopback(s)):
        logger.warning("MQTT certificate login refused for %r from %s", name, s.peer)
        return _refusal(
            s, ReasonCode.BAD_USER_NAME_OR_PASSWORD, ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD
        )
    s.auth_mechanism = "EXTERNAL"
    return _open_vhost(s, found.name, s.gateway.default_vhost)


def _open_vhost(s: MqttSession, user: str, vhost_name: str) -> tuple[str, VHost] | int:
    """The user and the vhost it may open, or the refusal's CONNACK code."""
    accounts = s.broker.accounts
    vhost = s.broker.vhosts.get(vhost_name)
    if vhost is not None and accounts.vhost_access(user, vhost_name):
        limit = s.broker.tracking.open_refusal(vhost_name, user)
        if limit is not None:
            # The vhost's or the user's max-connections, as RabbitMQ 3.10's MQTT plugin
            # checks them: "not authorized" (5.0: quota exceeded).
            logger.warning("MQTT connection %s refused: %s", s.peer, limit)
            return _refusal(s, ReasonCode.QUOTA_EXCEEDED, ConnackReturnCode.NOT_AUTHORIZED)
    if vhost is None or not accounts.vhost_access(user, vhost_name):
        logger.warning(
            "MQTT access to vhost '%s' refused for user '%s' from %s",
            vhost_name,
            user,
            s.peer,
        )
        return _refusal(s, ReasonCode.NOT_AUTHORIZED, ConnackReturnCode.NOT_AUTHORIZED)
    return user, vhost


def _is_loopback(s: MqttSession) -> bool:
    if s.endpoints is None or s.cross_origin:
        return False
    host = s.endpoints[0]
    if host == "unix":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _delete_session_queues(s: MqttSession, vhost: VHost) -> None:
    for qos in (0, 1):
        queue = vhost.queues.get(mapping.queue_name(s.client_id, qos))
        if queue is not None:
            vhost.remove_queue(queue)


def _resume(s: MqttSession, vhost: VHost) -> bool:
    """Consume from the session's queues that exist; True if any did (session present)."""
    present = False
    for qos in (0, 1):
        queue = vhost.queues.get(mapping.queue_name(s.client_id, qos))
        if queue is not None and queue.failed is None:
            present = True
            _consume(s, vhost, queue, qos)
    return present


def _consume(s: MqttSession, vhost: VHost, queue: Queue, qos: int) -> None:
    if qos in s.consumers:
        return
    consumer = MqttConsumer(s, queue, qos)
    s.consumers[qos] = consumer
    vhost.add_consumer(queue, consumer)


def _permitted(s: MqttSession, kind: PermissionKind, resource: str) -> bool:
    vhost = s.vhost
    assert vhost is not None
    return s.broker.accounts.permitted(s.user, vhost.name, kind, resource)


def _topic_permitted(s: MqttSession, kind: str, routing_key: str) -> bool:
    vhost = s.vhost
    assert vhost is not None
    grants = s.broker.accounts.topic_grants(s.user, vhost.name)
    if grants is None:
        return True
    variables = {"username": s.user, "vhost": vhost.name, "client_id": s.client_id}
    return grants.permitted(mapping.EXCHANGE, kind, routing_key, variables)  # type: ignore[arg-type]  # "read" or "write"


# -- SUBSCRIBE and UNSUBSCRIBE ---------------------------------------------------------------


def subscribe(s: MqttSession, packet: Subscribe) -> None:
    """Bind each filter to the session's queue of its granted QoS; SUBACK once the
    bindings of a persistent session are durable, then the retained messages."""
    vhost = s.vhost
    assert vhost is not None
    codes: list[int] = []
    durable = False
    granted: list[tuple[str, int]] = []
    for subscription in packet.subscriptions:
        code = _subscribe_one(s, vhost, subscription.topic_filter, subscription.qos)
        codes.append(code)
        if code <= QOS_GRANTED_MAX:
            durable = durable or s.persistent
            if subscription.retain_handling != 2:  # 5.0: 2 sends no retained messages
                granted.append((subscription.topic_filter, code))
    s.reply(SubAck(packet.packet_id, tuple(codes)), definitions=durable)
    for topic_filter, qos in granted:
        send_retained(s, vhost, topic_filter, qos)


def _subscribe_one(s: MqttSession, vhost: VHost, topic_filter: str, qos: int) -> int:
    failure = ReasonCode.NOT_AUTHORIZED if s.level is _V5 else SUBACK_FAILURE_V311
    if parse_shared(topic_filter) is not None:
        return ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED if s.level is _V5 else failure
    granted = min(qos, QOS_GRANTED_MAX)
    name = mapping.queue_name(s.client_id, granted)
    routing_key = mapping.to_routing_key(topic_filter)
    if not (
        _permitted(s, "configure", name)
        and _permitted(s, "write", name)
        and _permitted(s, "read", mapping.EXCHANGE)
        and _permitted(s, "read", name)
        and _topic_permitted(s, "read", routing_key)
    ):
        logger.warning(
            "MQTT subscription to '%s' refused for user '%s' (client id '%s')",
            topic_filter,
            s.user,
            s.client_id,
        )
        return failure
    try:
        queue = _session_queue(s, vhost, name)
        other = vhost.queues.get(mapping.queue_name(s.client_id, 1 - granted))
        if other is not None:
            # The filter moves to the queue of its new QoS (MQTT-3.8.4-3: replaces).
            vhost.unbind(Destination("queue", other.name), mapping.EXCHANGE, routing_key, {})
        vhost.bind(Destination("queue", name), mapping.EXCHANGE, routing_key, {})
    except BrokerError as exc:
        logger.warning("MQTT subscription to '%s' failed: %s", topic_filter, exc)
        return ReasonCode.UNSPECIFIED_ERROR if s.level is _V5 else failure
    _consume(s, vhost, queue, granted)
    return granted


def _session_queue(s: MqttSession, vhost: VHost, name: str) -> Queue:
    existing = vhost.queues.get(name)
    if existing is not None:
        return existing
    arguments: dict[str, object] = {}
    if s.persistent and 0 < s.session_expiry_s < SESSION_EXPIRY_NEVER:
        # MQTT 5's session expiry, as RabbitMQ 3.13 maps it: the queue's own expiry
        # once unused (x-expires counts from the last consumer's leaving).
        arguments["x-expires"] = s.session_expiry_s * 1000
    return vhost.declare_queue(name, False, s.persistent, False, not s.persistent, arguments, None)


def unsubscribe(s: MqttSession, packet: Unsubscribe) -> None:
    vhost = s.vhost
    assert vhost is not None
    codes: list[int] = []
    for topic_filter in packet.topic_filters:
        routing_key = mapping.to_routing_key(topic_filter)
        found = False
        for qos in (0, 1):
            queue = vhost.queues.get(mapping.queue_name(s.client_id, qos))
            if queue is not None and _bound(vhost, queue.name, routing_key):
                vhost.unbind(Destination("queue", queue.name), mapping.EXCHANGE, routing_key, {})
                found = True
        codes.append(ReasonCode.SUCCESS if found else ReasonCode.NO_SUBSCRIPTION_EXISTED)
    reply = UnsubAck(packet.packet_id, tuple(codes) if s.level is _V5 else ())
    s.reply(reply, definitions=s.persistent)


def _bound(vhost: VHost, queue_name: str, routing_key: str) -> bool:
    exchange = vhost.exchanges.get(mapping.EXCHANGE)
    if exchange is None:
        return False
    return exchange.has_binding(Destination("queue", queue_name), routing_key, {})


def subscriptions(vhost: VHost, client_id: str) -> list[tuple[str, int]]:
    """A session's subscriptions (filter, QoS), read back from its queues' bindings."""
    exchange = vhost.exchanges.get(mapping.EXCHANGE)
    if exchange is None:
        return []
    found = []
    for qos in (0, 1):
        name = mapping.queue_name(client_id, qos)
        for binding in exchange.bindings:
            if binding.destination == Destination("queue", name):
                found.append((mapping.to_topic(binding.routing_key), qos))
    return sorted(found)


def send_retained(s: MqttSession, vhost: VHost, topic_filter: str, qos: int) -> None:
    """The retained messages `topic_filter` matches, with the retain flag (MQTT-3.3.1-8),
    behind the SUBACK; QoS 1 ones are in flight until PUBACKed, not on any queue."""
    store = s.gateway.retained(vhost)
    now_ms = int(time.time() * 1000)
    for topic, retained_qos, payload in store.matching(topic_filter):
        properties = _retained_properties(s, store.properties.get(topic), now_ms)
        if properties is None:  # its Message Expiry Interval passed (MQTT-3.3.2-5)
            store.retain(topic, retained_qos, b"")
            s.gateway.retained_changed(vhost)
            continue
        out_qos = min(qos, retained_qos)
        packet_id = s.take_packet_id() if out_qos else None
        if packet_id is not None:
            s.retained_inflight.add(packet_id)
        packet = Publish(topic, payload, out_qos, True, False, packet_id, properties)
        s.reply(packet)


def _retained_properties(
    s: MqttSession, stored: tuple[bytes, int] | None, now_ms: int
) -> Properties | None:
    """A retained message's 5.0 properties as sent now (3.x: none); None once it expired."""
    if stored is None:
        return NO_PROPERTIES
    raw, retained_ms = stored
    if message_properties.expired(raw, retained_ms, now_ms):
        return None
    if s.level is not _V5:
        return NO_PROPERTIES
    return message_properties.to_mqtt(raw, retained_ms, now_ms)


# -- PUBLISH ---------------------------------------------------------------------------------


def publish(s: MqttSession, packet: Publish) -> None:
    """Route and store a publish; its PUBACK (PUBREC) once the log is synced."""
    vhost = s.vhost
    assert vhost is not None
    topic = s.topic_aliases.resolve(packet.topic, packet.properties.topic_alias)
    if isinstance(topic, ReasonCode):
        s.disconnect(topic)
        return
    if packet.qos == 2 and packet.packet_id in s.qos2_received:
        assert packet.packet_id is not None
        s.owe_publish_ack(PubRec(packet.packet_id))  # a resend: stored once already
        return
    routing_key = mapping.to_routing_key(topic)
    if not (_permitted(s, "write", mapping.EXCHANGE) and _topic_permitted(s, "write", routing_key)):
        _refuse_publish(s, packet, topic, ReasonCode.NOT_AUTHORIZED)
        return
    if not message_properties.payload_valid(packet.payload, packet.properties):
        _refuse_publish(s, packet, topic, ReasonCode.PAYLOAD_FORMAT_INVALID)
        return
    s.note_publish()
    if packet.retain:
        store = s.gateway.retained(vhost)
        kept = message_properties.retained_form(packet.qos, packet.properties)
        now_ms = int(time.time() * 1000)
        if not store.retain(topic, packet.qos, packet.payload, kept, now_ms):
            logger.warning("retained messages of vhost '%s' are full", vhost.name)
        s.gateway.retained_changed(vhost)
    store_message(vhost, routing_key, packet.qos, packet.dup, packet.payload, packet.properties)
    if packet.qos == 1:
        assert packet.packet_id is not None
        s.owe_publish_ack(PubAck(packet.packet_id))
    elif packet.qos == 2:
        assert packet.packet_id is not None
        s.qos2_received.add(packet.packet_id)
        if s.persistent:
            s.gateway.qos2(vhost).add(s.client_id, packet.packet_id)
        s.owe_publish_ack(PubRec(packet.packet_id))


def release_qos2(s: MqttSession, packet_id: int) -> None:
    """PUBREL: the identifier may be used again; PUBCOMP once that is on disk for a
    persistent session (MQTT-4.3.3-9: PUBCOMP with the same identifier)."""
    s.qos2_received.discard(packet_id)
    if s.persistent:
        vhost = s.vhost
        assert vhost is not None
        s.gateway.qos2(vhost).remove(s.client_id, packet_id)
        s.reply(PubComp(packet_id), durable=True)
    else:
        s.reply(PubComp(packet_id))


def store_message(
    vhost: VHost,
    routing_key: str,
    qos: int,
    dup: bool,
    payload: bytes,
    properties: Properties = NO_PROPERTIES,
) -> None:
    """Route a message through `amq.topic` and append it to the log (buffered: durable
    after the vhost's next sync), its MQTT 5.0 properties as AMQP ones."""
    properties_raw = message_properties.to_amqp(qos, dup, properties)
    queues = vhost.route(mapping.EXCHANGE, routing_key, None, properties_raw=properties_raw)
    now_ms = int(time.time() * 1000)
    offset = vhost.publish(mapping.EXCHANGE, routing_key, properties_raw, payload, queues, now_ms)
    stats = vhost.exchange_stats.get(mapping.EXCHANGE)
    if stats is None:
        stats = vhost.exchange_stats[mapping.EXCHANGE] = MessageStats()
    stats.publish_in += 1
    if offset is not None:
        stats.publish_out += 1
    else:
        vhost.stats.drop_unroutable += 1


def _refuse_publish(s: MqttSession, packet: Publish, topic: str, reason: ReasonCode) -> None:
    """Not authorized (3.x: the connection closes, as RabbitMQ 3.10 does: there is no
    other way to say no), or a 5.0 payload not in its format: PUBACK or PUBREC with the
    reason; at QoS 0, which has no answer, DISCONNECT with it (3.3.2.3.2)."""
    logger.warning(
        "MQTT publish to '%s' refused for user '%s' (client id '%s'): %s",
        topic,
        s.user,
        s.client_id,
        reason.name,
    )
    if s.level is not _V5:
        s.disconnect(reason)
        return
    if packet.qos == 1:
        assert packet.packet_id is not None
        s.reply(PubAck(packet.packet_id, reason))
    elif packet.qos == 2:
        assert packet.packet_id is not None
        s.reply(PubRec(packet.packet_id, reason))
    elif reason is ReasonCode.PAYLOAD_FORMAT_INVALID:
        s.disconnect(reason)


# -- the end of a connection -----------------------------------------------------------------


def release(s: MqttSession) -> None:
    """What a closed connection leaves: its will (unless it said DISCONNECT), its
    deliveries in flight back to their queues (redelivered with DUP to the session's
    next connection), its consumers, and a clean session's queues."""
    vhost = s.vhost
    assert vhost is not None
    gateway = s.gateway
    connect = s.connect
    if connect is not None and connect.will is not None and not s.graceful:
        delay_s = connect.will.properties.will_delay_interval_s or 0
        if s.persistent:
            # MQTT 5.0 3.1.3.2.2: at the Will Delay Interval's end or the session's,
            # whichever is first, unless the session reconnects before (MQTT-3.1.3-9).
            delay_s = min(delay_s, s.session_expiry_s)
            gateway.delay_will(
                vhost, s.client_id, delay_s, lambda: _publish_will(s, vhost, connect)
            )
        else:
            _publish_will(s, vhost, connect)
    held = list(s.inflight.values())
    s.inflight.clear()
    if held:
        vhost.requeue_many(held, deliver=False)
    for consumer in list(s.consumers.values()):
        vhost.remove_consumer(consumer.queue, consumer)
    s.consumers.clear()
    gateway.unregister(s)
    if not s.persistent:
        _delete_session_queues(s, vhost)
        if s.connect is not None and not s.connect.clean_start:
            # 5.0 with no session expiry: a session that ends with its connection.
            gateway.qos2(vhost).drop(s.client_id)


def _publish_will(s: MqttSession, vhost: VHost, connect: Connect) -> None:
    will = connect.will
    assert will is not None
    routing_key = mapping.to_routing_key(will.topic)
    if not (_permitted(s, "write", mapping.EXCHANGE) and _topic_permitted(s, "write", routing_key)):
        logger.warning("MQTT will to '%s' refused for user '%s'", will.topic, s.user)
        return
    if will.retain:
        kept = message_properties.retained_form(will.qos, will.properties)
        now_ms = int(time.time() * 1000)
        s.gateway.retained(vhost).retain(will.topic, will.qos, will.payload, kept, now_ms)
        s.gateway.retained_changed(vhost)
    store_message(vhost, routing_key, will.qos, False, will.payload, will.properties)
