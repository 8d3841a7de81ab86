"""QoS 2 deliveries to subscribers: PUBLISH QoS 2 -> PUBREC -> PUBREL -> PUBCOMP, the
message acked on its queue at PUBREC, the PUBREL state of a persistent session on disk
and sent again after a reconnection and after a broker restart (MQTT-4.3.3, -4.4.0-1).

Method: a raw client (our codec over a socket) plays the subscriber so that it can stop
at any step of the handshake; pika publishes into amq.topic (an AMQP message is
delivered at the subscription's QoS), paho 3.1.1 and 5.0 subscribe at QoS 2 for the
whole handshake as a real client runs it. Queue counts come from the management API."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pika
import pytest

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    Properties,
    ProtocolLevel,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.integration.broker_process import BrokerProcess
from tests.mqtt.clients import Paho, RawClient, eventually
from tests.mqtt.conftest import MqttBroker
from tests.mqtt.test_gateway_interop import _mqtt_port

V311 = ProtocolLevel.MQTT_3_1_1
QUEUE = "mqtt-subscription-receiverqos2"


def hello(clean: bool = False) -> Connect:
    return Connect(V311, "receiver", clean, username="guest", password=b"guest")


def persistent_v5(client_id: str) -> Connect:
    expiry = Properties(session_expiry_interval_s=600)
    return Connect(ProtocolLevel.MQTT_5, client_id, False, 0, "guest", b"guest", None, expiry)


def amqp_publish(port: int, *bodies: bytes, routing_key: str = "jobs.a") -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("amq.topic", routing_key, body, pika.BasicProperties(delivery_mode=2))
    connection.close()


def queue_counts(broker: MqttBroker, name: str = QUEUE) -> tuple[int, int]:
    """(ready, unacknowledged) of a queue, from the management API."""
    status, queue, _ = broker.http("GET", f"/api/queues/%2F/{name}")
    assert status == 200 and isinstance(queue, dict)
    return queue["messages_ready"], queue["messages_unacknowledged"]


def subscribed(port: int, clean: bool = False) -> RawClient:
    raw = RawClient(port)
    raw.send(hello(clean))
    connack = raw.read()
    assert isinstance(connack, ConnAck) and connack.reason_code == 0
    raw.send(Subscribe(1, (Subscription("jobs/#", 2),)))
    assert raw.read() == SubAck(1, (2,))
    return raw


@pytest.mark.parametrize("version", ["3.1.1", "5.0"])
def test_paho_receives_qos_2_exactly_once(mqtt_broker: MqttBroker, version: str) -> None:
    sub = Paho(mqtt_broker.mqtt_port, f"sub-{version}", version=version)
    pub = Paho(mqtt_broker.mqtt_port, f"pub-{version}", version=version)
    sub.connect()
    pub.connect()
    assert sub.subscribe("jobs/#", 2) == [2]
    for n in range(20):
        pub.publish("jobs/a", str(n).encode(), 2)
    amqp_publish(mqtt_broker.amqp_port, b"from amqp")
    got = sub.receive(21)
    assert [(m.payload, m.qos) for m in got] == [
        *((str(n).encode(), 2) for n in range(20)),
        (b"from amqp", 2),
    ]
    assert sub.nothing_more()
    name = f"mqtt-subscription-sub-{version}qos2"
    assert eventually(lambda: queue_counts(mqtt_broker, name) == (0, 0))
    sub.disconnect()
    pub.disconnect()


def test_the_handshake_settles_the_message_at_pubrec(mqtt_broker: MqttBroker) -> None:
    raw = subscribed(mqtt_broker.mqtt_port, clean=True)
    amqp_publish(mqtt_broker.amqp_port, b"one")
    publish = raw.read()
    assert isinstance(publish, Publish)
    assert (publish.qos, publish.payload, publish.dup) == (2, b"one", False)
    assert publish.packet_id is not None
    assert queue_counts(mqtt_broker) == (0, 1)  # in flight until PUBREC
    raw.send(PubRec(publish.packet_id))
    assert raw.read() == PubRel(publish.packet_id)
    assert queue_counts(mqtt_broker) == (0, 0)  # acked at PUBREC
    raw.send(PubComp(publish.packet_id))
    # A repeated PUBREC gets the same PUBREL; after PUBCOMP an unknown one gets one too.
    raw.send(PubRec(publish.packet_id))
    assert raw.read() == PubRel(publish.packet_id)
    with pytest.raises(TimeoutError):
        raw.read(timeout_s=0.3)
    raw.close()


def test_a_crash_before_pubrec_sends_the_message_again_with_dup(
    mqtt_broker: MqttBroker,
) -> None:
    raw = subscribed(mqtt_broker.mqtt_port)
    amqp_publish(mqtt_broker.amqp_port, b"again")
    first = raw.read()
    assert isinstance(first, Publish) and not first.dup
    raw.close()  # crashes without PUBREC
    raw = RawClient(mqtt_broker.mqtt_port)
    raw.send(hello())
    assert raw.read() == ConnAck(session_present=True)
    second = raw.read()
    assert isinstance(second, Publish)
    assert (second.payload, second.qos, second.dup) == (b"again", 2, True)
    assert second.packet_id is not None
    raw.send(PubRec(second.packet_id))
    assert raw.read() == PubRel(second.packet_id)
    raw.send(PubComp(second.packet_id))
    assert eventually(lambda: queue_counts(mqtt_broker) == (0, 0))
    raw.close()


def test_a_crash_between_pubrec_and_pubrel_and_a_restart(tmp_path: Path) -> None:
    """The subscriber sends PUBREC and crashes before PUBREL comes; the broker restarts.
    On reconnection the broker sends PUBREL (not the message again); after PUBCOMP and
    another restart, nothing is left: the message went out exactly once."""
    data = tmp_path / "data"
    running = MqttBroker(data)
    try:
        raw = subscribed(running.mqtt_port)
        amqp_publish(running.amqp_port, b"exactly once", b"next")
        publish = raw.read()
        assert isinstance(publish, Publish) and publish.payload == b"exactly once"
        assert publish.packet_id is not None
        packet_id = publish.packet_id
        raw.send(PubRec(packet_id))
        raw.close()  # crashes before PUBREL
    finally:
        running.stop()
    running = MqttBroker(data)
    try:
        raw = RawClient(running.mqtt_port)
        raw.send(hello())
        assert raw.read() == ConnAck(session_present=True)
        assert raw.read() == PubRel(packet_id)
        nxt = raw.read()  # the next message, not the released one again
        assert isinstance(nxt, Publish) and nxt.payload == b"next"
        assert nxt.dup  # it had gone out before the restart (unacknowledged)
        assert nxt.packet_id is not None and nxt.packet_id != packet_id
        raw.send(PubComp(packet_id), PubRec(nxt.packet_id))
        assert raw.read() == PubRel(nxt.packet_id)
        raw.send(PubComp(nxt.packet_id))
        assert eventually(lambda: queue_counts(running) == (0, 0))
        assert eventually(lambda: not _pubrel_state(data))
        raw.close()
    finally:
        running.stop()
    running = MqttBroker(data)
    try:
        raw = RawClient(running.mqtt_port)
        raw.send(hello())
        assert raw.read() == ConnAck(session_present=True)
        with pytest.raises(TimeoutError):
            raw.read(timeout_s=0.5)  # no PUBREL, no PUBLISH left
        raw.close()
    finally:
        running.stop()


def test_pubrel_state_survives_sigkill(tmp_path: Path) -> None:
    """PUBREL is sent only once its state is on disk: SIGKILL right after it, and the
    restarted broker sends it again, and not the message."""
    data = tmp_path / "data"
    broker = BrokerProcess(data, "--mqtt-port", "0")
    port = _mqtt_port(broker.stderr)
    raw = subscribed(port)
    amqp_publish(broker.amqp_port, *(f"m{n}".encode() for n in range(5)))
    released = []
    for _ in range(5):
        publish = raw.read()
        assert isinstance(publish, Publish) and publish.packet_id is not None
        raw.send(PubRec(publish.packet_id))
        released.append(publish.packet_id)
    assert [raw.read() for _ in range(5)] == [PubRel(p) for p in released]
    broker.stop(signal.SIGKILL)
    raw.close()
    broker = BrokerProcess(data, "--mqtt-port", "0")
    try:
        raw = RawClient(_mqtt_port(broker.stderr))
        raw.send(hello())
        assert raw.read() == ConnAck(session_present=True)
        got = [raw.read() for _ in range(5)]
        assert all(isinstance(p, PubRel) for p in got)
        assert sorted(p.packet_id for p in got if isinstance(p, PubRel)) == sorted(released)
        with pytest.raises(TimeoutError):
            raw.read(timeout_s=0.5)  # none of the five again
        raw.close()
    finally:
        broker.stop()


def test_a_released_message_offered_again_is_skipped(tmp_path: Path) -> None:
    """The state the order of writes allows after a crash: the PUBREL entry on disk but
    the ack not (the message ready in its queue again). The session sends the PUBREL and
    settles the message without sending it."""
    data = tmp_path / "data"
    running = MqttBroker(data)
    try:
        raw = subscribed(running.mqtt_port)
        raw.close()
        amqp_publish(running.amqp_port, b"had it", b"new")
        assert eventually(lambda: queue_counts(running) == (2, 0))
        assert running.broker is not None
        queue = running.broker.vhosts["/"].queues[QUEUE]
        first, _count = queue.cursor.ready_runs()[0]
        vhost_dir = Path(running.broker.vhost_directory("/"))
    finally:
        running.stop()
    (vhost_dir / "mqtt_pubrel").write_text(json.dumps({"receiver": {"7": [QUEUE, first]}}))
    running = MqttBroker(data)
    try:
        raw = RawClient(running.mqtt_port)
        raw.send(hello())
        assert raw.read() == ConnAck(session_present=True)
        assert raw.read() == PubRel(7)
        publish = raw.read()
        assert isinstance(publish, Publish) and publish.payload == b"new"
        assert publish.packet_id is not None and publish.packet_id != 7
        raw.send(PubComp(7), PubRec(publish.packet_id))
        assert raw.read() == PubRel(publish.packet_id)
        raw.send(PubComp(publish.packet_id))
        assert eventually(lambda: queue_counts(running) == (0, 0))
        raw.close()
    finally:
        running.stop()


def test_a_clean_start_forgets_the_pubrel_state(mqtt_broker: MqttBroker) -> None:
    raw = subscribed(mqtt_broker.mqtt_port)
    amqp_publish(mqtt_broker.amqp_port, b"x")
    publish = raw.read()
    assert isinstance(publish, Publish) and publish.packet_id is not None
    raw.send(PubRec(publish.packet_id))
    assert raw.read() == PubRel(publish.packet_id)
    raw.close()
    raw = RawClient(mqtt_broker.mqtt_port)
    raw.send(hello(clean=True))
    assert raw.read() == ConnAck()
    with pytest.raises(TimeoutError):
        raw.read(timeout_s=0.3)
    raw.close()


def _pubrel_state(data: Path) -> dict[str, object]:
    files = list(data.rglob("mqtt_pubrel"))
    if not files:
        return {}
    document = json.loads(files[0].read_text())
    assert isinstance(document, dict)
    return document


def test_a_retained_message_goes_out_at_qos_2(mqtt_broker: MqttBroker) -> None:
    pub = Paho(mqtt_broker.mqtt_port, "pub")
    pub.connect()
    pub.publish("jobs/kept", b"retained", 2, retain=True)
    raw = subscribed(mqtt_broker.mqtt_port)
    publish = raw.read()
    assert isinstance(publish, Publish)
    assert (publish.payload, publish.qos, publish.retain) == (b"retained", 2, True)
    assert publish.packet_id is not None
    raw.send(PubRec(publish.packet_id))
    assert raw.read() == PubRel(publish.packet_id)
    raw.send(PubComp(publish.packet_id))
    with pytest.raises(TimeoutError):
        raw.read(timeout_s=0.3)
    raw.close()
    pub.disconnect()


def test_a_takeover_between_pubrel_and_pubcomp(mqtt_broker: MqttBroker) -> None:
    """The session's client id connects again while a PUBCOMP is owed: the new
    connection gets the PUBREL again (MQTT-4.4.0-1), never the message."""
    raw = subscribed(mqtt_broker.mqtt_port)
    amqp_publish(mqtt_broker.amqp_port, b"owned", b"after")
    publish = raw.read()
    assert isinstance(publish, Publish) and publish.payload == b"owned"
    assert publish.packet_id is not None
    raw.send(PubRec(publish.packet_id))
    pending = [raw.read(), raw.read()]  # PUBREL and the next PUBLISH, in either order
    assert PubRel(publish.packet_id) in pending
    other = RawClient(mqtt_broker.mqtt_port)
    other.send(hello())
    assert other.read() == ConnAck(session_present=True)
    assert raw.closed_by_peer()
    assert other.read() == PubRel(publish.packet_id)
    again = other.read()  # the unacknowledged next one, with DUP
    assert isinstance(again, Publish) and again.payload == b"after" and again.dup
    assert again.packet_id is not None
    other.send(PubComp(publish.packet_id), PubRec(again.packet_id))
    assert other.read() == PubRel(again.packet_id)
    other.send(PubComp(again.packet_id))
    with pytest.raises(TimeoutError):
        other.read(timeout_s=0.3)
    assert eventually(lambda: queue_counts(mqtt_broker) == (0, 0))
    other.close()
    raw.close()


def test_a_refusing_pubrec_ends_the_exchange(mqtt_broker: MqttBroker) -> None:
    """MQTT 5.0: a PUBREC with a reason code of 0x80 or more settles the message and
    needs no PUBREL (section 4.3.3); the identifier is free again."""
    raw = RawClient(mqtt_broker.mqtt_port, ProtocolLevel.MQTT_5)
    raw.send(Connect(ProtocolLevel.MQTT_5, "receiver", username="guest", password=b"guest"))
    connack = raw.read()
    assert isinstance(connack, ConnAck) and connack.reason_code == 0
    raw.send(Subscribe(1, (Subscription("jobs/#", 2),)))
    assert raw.read() == SubAck(1, (2,))
    amqp_publish(mqtt_broker.amqp_port, b"unwanted")
    publish = raw.read()
    assert isinstance(publish, Publish) and publish.packet_id is not None
    raw.send(PubRec(publish.packet_id, 0x80))
    with pytest.raises(TimeoutError):
        raw.read(timeout_s=0.3)  # no PUBREL
    assert eventually(lambda: queue_counts(mqtt_broker) == (0, 0))
    raw.close()


def test_a_filter_moves_between_the_qos_1_and_qos_2_queues(mqtt_broker: MqttBroker) -> None:
    raw = subscribed(mqtt_broker.mqtt_port, clean=True)  # jobs/# at QoS 2
    raw.send(Subscribe(2, (Subscription("jobs/#", 1),)))  # replaces it (MQTT-3.8.4-3)
    assert raw.read() == SubAck(2, (1,))
    amqp_publish(mqtt_broker.amqp_port, b"once")
    publish = raw.read()
    assert isinstance(publish, Publish) and (publish.payload, publish.qos) == (b"once", 1)
    with pytest.raises(TimeoutError):
        raw.read(timeout_s=0.3)  # not a second copy from the QoS 2 queue
    status, bindings, _ = mqtt_broker.http("GET", "/api/exchanges/%2F/amq.topic/bindings/source")
    assert status == 200 and isinstance(bindings, list)
    assert [(b["destination"], b["routing_key"]) for b in bindings] == [
        ("mqtt-subscription-receiverqos1", "jobs.#")
    ]
    raw.close()


def test_a_released_message_is_skipped_for_another_shared_member(tmp_path: Path) -> None:
    """As above, in a shared group: the message one member PUBREC'd before the restart
    is offered again, and the other member, connecting first, does not get it."""
    data = tmp_path / "data"
    shared = "mqtt-shared-g"
    running = MqttBroker(data)
    try:
        for member in ("first", "second"):
            raw = RawClient(running.mqtt_port, ProtocolLevel.MQTT_5)
            raw.send(persistent_v5(member))
            assert isinstance(raw.read(), ConnAck)
            raw.send(Subscribe(1, (Subscription("$share/g/jobs/#", 2),)))
            assert raw.read() == SubAck(1, (2,))
            raw.close()
        amqp_publish(running.amqp_port, b"had it", b"new")
        assert eventually(lambda: queue_counts(running, shared) == (2, 0))
        assert running.broker is not None
        first, _count = running.broker.vhosts["/"].queues[shared].cursor.ready_runs()[0]
        vhost_dir = Path(running.broker.vhost_directory("/"))
    finally:
        running.stop()
    (vhost_dir / "mqtt_pubrel").write_text(json.dumps({"first": {"7": [shared, first]}}))
    running = MqttBroker(data)
    try:
        raw = RawClient(running.mqtt_port, ProtocolLevel.MQTT_5)
        raw.send(persistent_v5("second"))
        connack = raw.read()
        assert isinstance(connack, ConnAck) and connack.session_present
        publish = raw.read()
        assert isinstance(publish, Publish) and publish.payload == b"new"
        with pytest.raises(TimeoutError):
            raw.read(timeout_s=0.5)
        raw.close()
    finally:
        running.stop()
