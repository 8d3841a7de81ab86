"""What an MQTT session does on the broker core: login, publishes, clean-up.

Owns the mapping of each MQTT operation onto the broker as RabbitMQ's MQTT plugin makes
it (rabbit_mqtt_processor): CONNECT logs in with the broker's users (`vhost:user` picks
the vhost, else `default_vhost`), takes over a session with the same client id, and
finds a persistent session's queues (SUBSCRIBE and UNSUBSCRIBE, the queues and their
bindings, are `subscriptions.py`'s); PUBLISH routes through `amq.topic` after the checks "write"
on the exchange and the topic permission "write", and stores into the vhost's log (its
5.0 properties as AMQP ones, `message_properties.py`; the client id for No Local, the
retain flag for Retain As Published);
retained messages and wills; and what a closing connection leaves: its deliveries in
flight back to their queues, its clean session's subscriptions ended.

A persistent session's subscriptions are its queues' bindings to `amq.topic`, which the
vhost's definitions journal keeps across restarts (docs/mqtt.md): nothing more is stored.
Functions take the session they work for, as amqp_gateway/publishing.py's do; none
touches a socket.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import secrets
import time
from typing import TYPE_CHECKING, Final

from mqtt_gateway import mapping, message_properties, qos2_delivery, subscriptions
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
    encode,
)
from mqtt_gateway.codec.runs import PublishRun, RunForm
from mqtt_gateway.topic_aliases import TopicAliases
from streamq.broker.accounts import PermissionKind
from streamq.broker.stats import MessageStats
from streamq.broker.users import login_allowed
from streamq.tls_peer import certificate_cn

if TYPE_CHECKING:
    from mqtt_gateway.session import MqttSession
    from streamq.broker.vhost import VHost

logger = logging.getLogger(__name__)

_V5: Final = ProtocolLevel.MQTT_5
VHOST_SEPARATOR: Final = ":"
CLIENT_ID_ASSIGNED_PREFIX: Final = "streamq-"


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
        # Its Maximum Packet Size bounds what we send it (MQTT-3.1.2-24, -25).
        s.packet_bytes_max_out = packet.properties.maximum_packet_size
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
        subscriptions.forget(s, vhost)
        forgotten = gateway.qos2(vhost).drop(client_id)
        forgotten = gateway.pubrel(vhost).drop(client_id) or forgotten
    s.pubrel_recovered = gateway.pubrel(vhost).recovered  # before the queues deliver
    if s.persistent:
        qos2_delivery.load(s)
    present = subscriptions.resume(s, vhost)
    if s.persistent:
        s.qos2_received = gateway.qos2(vhost).of(client_id)
    properties = Properties()
    if s.level is _V5:
        properties = Properties(
            assigned_client_identifier=assigned,
            receive_maximum=None,
            maximum_qos=None,
            topic_alias_maximum=gateway.topic_alias_maximum or None,  # absent: 0
            shared_subscription_available=None,  # absent: available
            subscription_identifier_available=None,
            wildcard_subscription_available=None,
            retain_available=None,
            maximum_packet_size=gateway.packet_bytes_max,
        )
    connack = ConnAck(0, present and s.level is not ProtocolLevel.MQTT_3_1, properties)
    # A clean start that dropped a previous session's QoS 2 identifiers answers once that
    # is on disk: after a restart, a stale one would drop the client's next publish.
    s.reply(connack, durable=forgotten)
    qos2_delivery.send_pubrels(s)  # after the CONNACK (MQTT-4.4.0-1)
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
    method = packet.properties.authentication_method
    if method is not None:
        # MQTT 5's enhanced authentication (AUTH exchanges): no method is offered, so a
        # CONNECT naming one is refused with 0x8C and closed (MQTT-4.12.0-1).
        logger.warning("MQTT login refused from %s: authentication method %r", s.peer, method)
        return ReasonCode.BAD_AUTHENTICATION_METHOD
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


# -- retained messages on SUBSCRIBE ------------------------------------------------------


def send_retained(
    s: MqttSession, vhost: VHost, topic_filter: str, qos: int, identifier: int | None = None
) -> None:
    """The retained messages `topic_filter` matches, with the retain flag (MQTT-3.3.1-8)
    and the subscription's identifier, behind the SUBACK; QoS 1 and 2 ones are in flight
    until PUBACKed (PUBREC'd), not on any queue. One past the client's Maximum Packet
    Size is not sent (MQTT-3.1.2-25)."""
    store = s.gateway.retained(vhost)
    now_ms = int(time.time() * 1000)
    identifiers = (identifier,) if identifier is not None and s.level is _V5 else ()
    limit = s.packet_bytes_max_out
    for topic, retained_qos, payload in store.matching(topic_filter):
        properties = _retained_properties(s, store.properties.get(topic), now_ms)
        if properties is None:  # its Message Expiry Interval passed (MQTT-3.3.2-5)
            store.retain(topic, retained_qos, b"")
            s.gateway.retained_changed(vhost)
            continue
        if identifiers:
            properties = dataclasses.replace(properties, subscription_identifiers=identifiers)
        out_qos = min(qos, retained_qos)
        packet_id = s.take_packet_id() if out_qos else None
        # By name, never a Topic Alias: this reply may wait behind a sync round while
        # live deliveries, which set and use aliases, go out before it.
        packet = Publish(topic, payload, out_qos, True, False, packet_id, properties)
        if limit is not None and len(encode(packet, s.level)) > limit:
            continue
        if packet_id is not None:
            s.retained_inflight.add(packet_id)
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
    publisher = s.client_id if s.no_local_in_use else None
    store_message(vhost, routing_key, packet.qos, packet.dup, packet.payload, packet.properties,
                  publisher=publisher, retain=packet.retain)  # fmt: skip
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


def run_form(publisher: str | None) -> RunForm:
    """How a session stores its runs of publishes (`Decoder.pop`): the property lists
    `store_message` gives a publish without MQTT 5 properties or retain flag, by QoS and
    DUP, with `publisher` (the client id, for No Local)."""
    properties = tuple(
        mapping.publish_properties(kind >> 1, bool(kind & 1), publisher=publisher)
        for kind in range(4)
    )
    assert len(properties) == 4
    return RunForm(properties, mapping.EXCHANGE, mapping.to_routing_key)


def publish_run(s: MqttSession, run: PublishRun) -> None:
    """`publish` of every packet of a run (QoS 0 and 1, one topic, no properties nor
    retain): checked, routed and stored once, appended to the log in one step, and its
    PUBACKs sent together once the log is synced. A refused run goes one by one (each
    refusal as `publish` answers it), as does one whose route reads properties or
    reaches a queue with a length limit."""
    vhost = s.vhost
    assert vhost is not None
    routing_key = run.routing_key
    if not (_permitted(s, "write", mapping.EXCHANGE) and _topic_permitted(s, "write", routing_key)):
        for packet in run.packets():
            publish(s, packet)
            if s.closed:
                return
        return
    s.note_publish()
    messages = run.messages
    count = len(messages)
    stats = _exchange_stats(vhost)
    queues = vhost.route_run(mapping.EXCHANGE, routing_key)
    now_ms = int(time.time() * 1000)
    if queues is None or (
        queues
        and not vhost.publish_run(
            mapping.EXCHANGE, routing_key, messages, queues, now_ms, run.flags_byte0
        )
    ):
        for properties_raw, payload, _exchange, _key, _bits in messages:
            _store_raw(vhost, routing_key, properties_raw, payload, stats, now_ms)
    else:
        stats.publish_in += count
        if queues:
            stats.publish_out += count
        else:
            vhost.stats.drop_unroutable += count
    if run.acks:
        s.owe_publish_acks(run.acks, run.ack_count)


def store_message(
    vhost: VHost, routing_key: str, qos: int, dup: bool, payload: bytes,
    properties: Properties = NO_PROPERTIES, *, publisher: str | None = None,
    retain: bool = False,
) -> None:  # fmt: skip
    """Route a message through `amq.topic` and append it to the log (buffered: durable
    after the vhost's next sync), its MQTT 5.0 properties as AMQP ones; `publisher` (the
    client id, for No Local) and `retain` (for Retain As Published) as headers."""
    properties_raw = message_properties.to_amqp(
        qos, dup, properties, publisher=publisher, retain=retain
    )
    now_ms = int(time.time() * 1000)
    _store_raw(vhost, routing_key, properties_raw, payload, _exchange_stats(vhost), now_ms)


def _exchange_stats(vhost: VHost) -> MessageStats:
    stats = vhost.exchange_stats.get(mapping.EXCHANGE)
    if stats is None:
        stats = vhost.exchange_stats[mapping.EXCHANGE] = MessageStats()
    return stats


def _store_raw(
    vhost: VHost, routing_key: str, properties_raw: bytes, payload: bytes,
    stats: MessageStats, now_ms: int,
) -> None:  # fmt: skip
    """Route one message with its AMQP properties through `amq.topic` and append it."""
    queues = vhost.route(mapping.EXCHANGE, routing_key, None, properties_raw=properties_raw)
    offset = vhost.publish(mapping.EXCHANGE, routing_key, properties_raw, payload, queues, now_ms)
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
    if s.settling:
        # PUBREC'd, their PUBREL state not yet written: settled once it is.
        gateway.settle_after_flush(vhost, s.settling)
        s.settling = []
    for consumer in list(s.consumers.values()):
        vhost.remove_consumer(consumer.queue, consumer)
    s.consumers.clear()
    gateway.unregister(s)
    if not s.persistent:
        subscriptions.forget(s, vhost)
        if s.connect is not None and not s.connect.clean_start:
            # 5.0 with no session expiry: a session that ends with its connection.
            gateway.qos2(vhost).drop(s.client_id)
            gateway.pubrel(vhost).drop(s.client_id)


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
    publisher = s.client_id if s.no_local_in_use else None
    store_message(vhost, routing_key, will.qos, False, will.payload, will.properties,
                  publisher=publisher, retain=will.retain)  # fmt: skip
