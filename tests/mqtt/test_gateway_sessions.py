"""Sessions, retained messages and wills through the MQTT gateway: a persistent session
keeps its subscriptions and messages while its client is away, across a broker restart
too, and gets what it left unacknowledged again with DUP; a clean one leaves nothing;
retained messages (kept on disk, cleared by an empty retained publish, sent on
subscribe to every matching filter, wildcards included); wills on an abnormal end only."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    ProtocolLevel,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)
from tests.mqtt.clients import Paho, RawClient, eventually
from tests.mqtt.conftest import MqttBroker

V311 = ProtocolLevel.MQTT_3_1_1
V5 = ProtocolLevel.MQTT_5


def queue_names(broker: MqttBroker) -> set[str]:
    status, queues, _ = broker.http("GET", "/api/queues/%2F")
    assert status == 200 and isinstance(queues, list)
    return {q["name"] for q in queues}


def test_a_persistent_session_keeps_subscriptions_and_messages(mqtt_broker: MqttBroker) -> None:
    port = mqtt_broker.mqtt_port
    keeper = Paho(port, "keeper", clean=False)
    assert keeper.connect() == (False, 0)
    assert keeper.subscribe("p/#", 1) == [1]
    keeper.disconnect()
    assert queue_names(mqtt_broker) == {"mqtt-subscription-keeperqos1"}
    pub = Paho(port, "pub")
    pub.connect()
    for n in range(3):
        pub.publish(f"p/{n}", str(n).encode(), 1)
    keeper = Paho(port, "keeper", clean=False)
    assert keeper.connect() == (True, 0)  # session present, no SUBSCRIBE again
    assert [m.payload for m in keeper.receive(3)] == [b"0", b"1", b"2"]
    keeper.disconnect()
    # A clean session with the same client id discards it (MQTT-3.1.2-6).
    fresh = Paho(port, "keeper", clean=True)
    assert fresh.connect() == (False, 0)
    fresh.disconnect()
    assert eventually(lambda: queue_names(mqtt_broker) == set())


def test_unacknowledged_deliveries_come_again_with_dup(mqtt_broker: MqttBroker) -> None:
    port = mqtt_broker.mqtt_port
    hello = Connect(V311, "forgetful", clean_start=False, username="guest", password=b"guest")
    raw = RawClient(port)
    raw.send(hello)
    assert raw.read() == ConnAck()
    raw.send(Subscribe(1, (Subscription("d", 1),)))
    assert raw.read() == SubAck(1, (1,))
    pub = Paho(port, "pub")
    pub.connect()
    pub.publish("d", b"first", 1)
    pub.publish("d", b"second", 1)
    got = [raw.read(), raw.read()]
    assert [(p.payload, p.dup) for p in got if isinstance(p, Publish)] == [
        (b"first", False),
        (b"second", False),
    ]
    assert isinstance(got[0], Publish) and got[0].packet_id is not None
    raw.send(PubAck(got[0].packet_id))  # "second" stays unacknowledged
    # wait until the broker has the PUBACK: a PINGREQ's answer comes after it
    raw.send(PingReq())
    assert raw.read() == PingResp()
    raw.close()
    again = RawClient(port)
    again.send(hello)
    assert again.read() == ConnAck(session_present=True)
    redelivered = again.read()
    assert isinstance(redelivered, Publish)
    assert (redelivered.payload, redelivered.qos, redelivered.dup) == (b"second", 1, True)
    with pytest.raises(TimeoutError):
        again.read(timeout_s=0.5)
    again.close()


def test_mqtt5_session_expiry(mqtt_broker: MqttBroker) -> None:
    """5.0: a session lasts past its connection only with a Session Expiry Interval;
    clean start discards the previous one."""
    port = mqtt_broker.mqtt_port
    short = Paho(port, "v5-gone", version="5.0", clean=False, session_expiry_s=0)
    short.connect()
    short.subscribe("x", 1)
    short.disconnect()
    assert eventually(lambda: queue_names(mqtt_broker) == set())
    kept = Paho(port, "v5-kept", version="5.0", clean=True, session_expiry_s=3600)
    assert kept.connect() == (False, 0)
    kept.subscribe("x", 1)
    kept.disconnect()
    again = Paho(port, "v5-kept", version="5.0", clean=False, session_expiry_s=3600)
    assert again.connect() == (True, 0)
    again.disconnect()
    status, queue, _ = mqtt_broker.http("GET", "/api/queues/%2F/mqtt-subscription-v5-keptqos1")
    assert status == 200 and isinstance(queue, dict)
    assert queue["durable"] is True and queue["arguments"] == {"x-expires": 3_600_000}


def test_persistent_sessions_and_retained_messages_survive_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    running = MqttBroker(data)
    try:
        keeper = Paho(running.mqtt_port, "keeper", clean=False)
        keeper.connect()
        assert keeper.subscribe("s/+/v", 1) == [1]
        keeper.disconnect()
        pub = Paho(running.mqtt_port, "pub")
        pub.connect()
        pub.publish("s/1/v", b"while away", 1)
        pub.publish("status/door", b"open", 1, retain=True)
        pub.publish("status/light", b"on", 1, retain=True)
        pub.publish("status/light", b"", 1, retain=True)  # clears it
        pub.disconnect()
    finally:
        running.stop()
    running = MqttBroker(data)
    try:
        pub = Paho(running.mqtt_port, "pub")
        pub.connect()
        pub.publish("s/2/v", b"after restart", 1)
        keeper = Paho(running.mqtt_port, "keeper", clean=False)
        assert keeper.connect() == (True, 0)
        assert [(m.topic, m.payload) for m in keeper.receive(2)] == [
            ("s/1/v", b"while away"),
            ("s/2/v", b"after restart"),
        ]
        assert keeper.subscribe("status/#", 1) == [1]
        retained = keeper.receive(1)
        assert [(m.topic, m.payload, m.retain, m.qos) for m in retained] == [
            ("status/door", b"open", True, 1)
        ]
        assert keeper.nothing_more()
        keeper.disconnect()
    finally:
        running.stop()


def test_retained_messages_go_to_every_matching_filter(mqtt_broker: MqttBroker) -> None:
    port = mqtt_broker.mqtt_port
    pub = Paho(port, "pub")
    pub.connect()
    pub.publish("r/a/x", b"ax", 1, retain=True)
    pub.publish("r/b/x", b"bx", 0, retain=True)
    pub.publish("r/b/y", b"by", 1, retain=True)
    pub.publish("$SYS/r", b"sys", 1, retain=True)
    sub = Paho(port, "sub")
    sub.connect()
    sub.subscribe("r/+/x", 1)
    got = sub.receive(2)
    assert sorted((m.topic, m.payload, m.qos, m.retain) for m in got) == [
        ("r/a/x", b"ax", 1, True),
        ("r/b/x", b"bx", 0, True),
    ]
    sub.subscribe("#", 0)  # not "$SYS/r": wildcards do not match a leading $
    assert sorted(m.topic for m in sub.receive(3)) == ["r/a/x", "r/b/x", "r/b/y"]
    assert sub.nothing_more()
    # A retained publish also reaches the subscribers already there, without the flag.
    pub.publish("r/a/x", b"ax2", 1, retain=True)
    live = sub.receive(2)
    assert {(m.payload, m.retain) for m in live} == {(b"ax2", False)}


@pytest.mark.parametrize("level", [V311, V5])
def test_a_will_goes_out_on_an_abnormal_end_only(
    mqtt_broker: MqttBroker, level: ProtocolLevel
) -> None:
    port = mqtt_broker.mqtt_port
    watcher = Paho(port, "watcher")
    watcher.connect()
    watcher.subscribe("wills/#", 1)
    will = Will("wills/dev", b"dev died", 1)
    polite = RawClient(port, level)
    polite.send(Connect(level, "polite", will=will, username="guest", password=b"guest"))
    assert isinstance(polite.read(), ConnAck)
    polite.send(Disconnect())
    assert polite.closed_by_peer()
    rude = RawClient(port, level)
    rude.send(Connect(level, "rude", will=will, username="guest", password=b"guest"))
    assert isinstance(rude.read(), ConnAck)
    rude.close()  # no DISCONNECT
    got = watcher.receive(1)
    assert [(m.topic, m.payload, m.qos) for m in got] == [("wills/dev", b"dev died", 1)]
    assert watcher.nothing_more()


def test_mqtt5_will_delay(mqtt_broker: MqttBroker) -> None:
    """5.0's Will Delay Interval: the will waits for it (or the session's end), and a
    reconnection of the session before then cancels it (MQTT-3.1.3-9)."""
    port = mqtt_broker.mqtt_port
    watcher = Paho(port, "watcher")
    watcher.connect()
    watcher.subscribe("wills/#", 1)
    will = Will("wills/late", b"late", 1, properties=Properties(will_delay_interval_s=1))
    session = Properties(session_expiry_interval_s=60)

    def hello(client_id: str) -> Connect:
        return Connect(
            V5, client_id, False, will=will, properties=session,
            username="guest", password=b"guest",
        )  # fmt: skip

    back = RawClient(port, V5)
    back.send(hello("comes-back"))
    assert isinstance(back.read(), ConnAck)
    back.close()
    again = RawClient(port, V5)
    again.send(
        Connect(V5, "comes-back", False, properties=session, username="guest", password=b"guest")
    )
    assert isinstance(again.read(), ConnAck)  # within the delay: no will
    gone = RawClient(port, V5)
    gone.send(hello("stays-away"))
    assert isinstance(gone.read(), ConnAck)
    gone.close()
    assert watcher.nothing_more(0.5)  # not at once
    [message] = watcher.receive(1)
    assert (message.topic, message.payload) == ("wills/late", b"late")
    assert watcher.nothing_more(1.5)  # and not the cancelled one
    again.close()
