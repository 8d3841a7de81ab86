"""Acknowledgements that promise durability wait for the log's sync round.

Method: the in-process broker's Syncer gets a gate that holds every round (the role a
cluster's replication plays, tests/integration/test_replication_gate.py). While it
holds, a QoS 1 publish's PUBACK, a QoS 2 publish's PUBREC, a persistent session's SUBACK
and a PINGRESP read after them must not arrive (watched for a bounded while), a QoS 0
publish and a clean session's SUBACK need no round; once the gate releases, the held
replies arrive in the order of their packets."""

from __future__ import annotations

import time

import pika
import pytest

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    PingReq,
    PingResp,
    ProtocolLevel,
    PubAck,
    Publish,
    PubRec,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.integration.test_replication_gate import HoldingGate
from tests.mqtt.clients import RawClient
from tests.mqtt.conftest import MqttBroker

HELD_S = 1.0  # how long a held reply is watched for not arriving
ROUND_WAIT_S = 10.0  # for the publish's round to start
POLL_S = 0.01
V311 = ProtocolLevel.MQTT_3_1_1


def connected(broker: MqttBroker, client_id: str, *, clean: bool) -> RawClient:
    raw = RawClient(broker.mqtt_port)
    raw.send(Connect(V311, client_id, clean, username="guest", password=b"guest"))
    assert isinstance(raw.read(), ConnAck)
    return raw


def test_publish_acks_wait_for_the_sync_round(mqtt_broker: MqttBroker) -> None:
    # A durable queue bound to the topic: the messages go to the log (an unroutable one
    # is acknowledged at once, as a confirm of an unroutable AMQP publish).
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", mqtt_broker.amqp_port)
    )
    channel = connection.channel()
    channel.queue_declare("durable", durable=True)
    channel.queue_bind("durable", "amq.topic", "t")
    connection.close()
    raw = connected(mqtt_broker, "held", clean=True)
    assert mqtt_broker.broker is not None
    gate = HoldingGate()
    mqtt_broker.broker.syncer.gate = gate
    try:
        raw.send(Publish("t", b"zero", 0))  # nothing to acknowledge
        raw.send(Publish("t", b"one", 1, packet_id=7))
        raw.send(Publish("t", b"two", 2, packet_id=8))
        raw.send(PingReq())  # behind the held acks
        with pytest.raises(TimeoutError):
            raw.read(timeout_s=HELD_S)
    finally:
        gate.release()
    assert [raw.read(), raw.read(), raw.read()] == [PubAck(7), PubRec(8), PingResp()]
    raw.close()


def test_a_reply_read_while_a_round_is_in_flight_waits_for_it(mqtt_broker: MqttBroker) -> None:
    # The PUBACK is no longer owed but in the round (its task awaits the sync): a PINGREQ
    # read then must not overtake it.
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", mqtt_broker.amqp_port)
    )
    channel = connection.channel()
    channel.queue_declare("durable", durable=True)
    channel.queue_bind("durable", "amq.topic", "t")
    connection.close()
    raw = connected(mqtt_broker, "in-round", clean=True)
    assert mqtt_broker.broker is not None
    gate = HoldingGate()
    mqtt_broker.broker.syncer.gate = gate
    try:
        raw.send(Publish("t", b"one", 1, packet_id=9))
        deadline = time.monotonic() + ROUND_WAIT_S
        while gate.rounds == 0:
            assert time.monotonic() < deadline, "no sync round started"
            time.sleep(POLL_S)
        raw.send(PingReq())
        with pytest.raises(TimeoutError):
            raw.read(timeout_s=HELD_S)
    finally:
        gate.release()
    assert [raw.read(), raw.read()] == [PubAck(9), PingResp()]
    raw.close()


@pytest.mark.parametrize("clean", [False, True])
def test_a_persistent_sessions_suback_waits_for_the_binding(
    mqtt_broker: MqttBroker, clean: bool
) -> None:
    raw = connected(mqtt_broker, f"sub-{clean}", clean=clean)
    assert mqtt_broker.broker is not None
    gate = HoldingGate()
    mqtt_broker.broker.syncer.gate = gate
    try:
        raw.send(Subscribe(1, (Subscription("a/#", 1),)))
        if clean:
            assert raw.read() == SubAck(1, (1,))  # auto-delete queue: nothing durable
        else:
            with pytest.raises(TimeoutError):
                raw.read(timeout_s=HELD_S)
    finally:
        gate.release()
    if not clean:
        assert raw.read() == SubAck(1, (1,))
    raw.close()
