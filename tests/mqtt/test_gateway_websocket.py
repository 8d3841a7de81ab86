"""MQTT over WebSocket on the HTTP and HTTPS ports (path `/mqtt`, subprotocol `mqtt`;
mqtt_gateway/websocket.py, http_gateway/websocket_api.py): paho-mqtt (3.1.1 and 5.0)
and MQTT.js over ws, paho over wss, meeting TCP clients on the same broker; packets
split across messages and several in one message; the refusals (subprotocol, text,
a message too large, guest from another site's page); the connections listed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    PingReq,
    PingResp,
    ProtocolLevel,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)
from mqtt_gateway.codec.packets import Disconnect
from tests.integration.conftest import RunningBroker
from tests.integration.tls_setup import Certs, client_context, pki, port_of
from tests.mqtt.clients import Paho, eventually
from tests.mqtt.conftest import MqttBroker
from tests.mqtt.websocket_clients import raw_ws, ws_paho
from tests.node_clients import installed, run_script

__all__ = ["pki"]  # the module-scoped certificates fixture

NODE_DIR: Final = Path(__file__).parent / "node"
V311: Final = ProtocolLevel.MQTT_3_1_1
V5: Final = ProtocolLevel.MQTT_5
PACKET_BYTES_MAX: Final = 4096


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MqttBroker]:
    running = MqttBroker(tmp_path / "data", mqtt_max_packet_size=PACKET_BYTES_MAX)
    yield running
    running.stop()


def ws_url(broker: RunningBroker, path: str = "/mqtt") -> str:
    return f"ws://127.0.0.1:{broker.http_port}{path}"


def connect_bytes(client_id: str, level: ProtocolLevel = V311) -> bytes:
    return encode(Connect(level, client_id, username="guest", password=b"guest"), level)


def mqtt_connections(broker: RunningBroker) -> list[dict[str, object]]:
    status, connections, _ = broker.http("GET", "/api/connections")
    assert status == 200 and isinstance(connections, list)
    return [c for c in connections if "MQTT" in str(c["protocol"])]


@pytest.mark.parametrize("version", ["3.1.1", "5.0"])
def test_paho_over_websocket_meets_tcp(broker: MqttBroker, version: str) -> None:
    sub = ws_paho(broker.http_port, f"ws-sub-{version}", version=version)
    assert sub.connect() == (False, 0)
    assert sub.subscribe("room/+/temp", 1) == [1]
    tcp = Paho(broker.mqtt_port, "tcp-pub")
    tcp.connect()
    tcp.publish("room/kitchen/temp", b"21", 1)
    ws_pub = ws_paho(broker.http_port, "ws-pub", version=version)
    ws_pub.connect()
    ws_pub.publish("room/hall/temp", b"19", 1)
    ws_pub.publish("room/hall/temp", b"x" * 3000, 0)  # QoS 0, a larger payload
    got = sub.receive(3)
    assert [(m.topic, m.payload, m.qos) for m in got] == [
        ("room/kitchen/temp", b"21", 1),
        ("room/hall/temp", b"19", 1),
        ("room/hall/temp", b"x" * 3000, 0),
    ]
    listed = {c["client_properties"]["client_id"]: c for c in mqtt_connections(broker)}  # type: ignore[index]
    protocol = "Web MQTT 5.0" if version == "5.0" else "Web MQTT 3.1.1"  # as RabbitMQ
    assert listed[f"ws-sub-{version}"]["protocol"] == protocol
    assert listed["tcp-pub"]["protocol"] == "MQTT 3.1.1"
    assert listed["ws-pub"]["peer_host"] == "127.0.0.1"
    assert listed["ws-pub"]["port"] == broker.http_port  # arrived on the HTTP port
    assert listed["tcp-pub"]["port"] == broker.mqtt_port
    for client in (sub, tcp, ws_pub):
        client.disconnect()


def test_packets_split_across_messages_and_joined_in_one(broker: MqttBroker) -> None:
    """CONNECT one byte per message; then SUBSCRIBE, a QoS 1 PUBLISH to it and PINGREQ
    in one message: the session answers each, PINGRESP behind the PUBACK (MQTT-4.6.0-2)."""
    connect = connect_bytes("raw-ws")
    together = b"".join(
        encode(packet, V311)
        for packet in (
            Subscribe(1, (Subscription("raw/#", 1),)),
            Publish("raw/a", b"hello", 1, packet_id=2),
            PingReq(),
        )
    )
    result = raw_ws(
        ws_url(broker), [connect[i : i + 1] for i in range(len(connect))] + [together], want=5
    )
    assert result.protocol == "mqtt"
    assert result.packets[0] == ConnAck()
    kinds = [type(packet) for packet in result.packets]
    assert sorted(kind.__name__ for kind in kinds) == [
        "ConnAck", "PingResp", "PubAck", "Publish", "SubAck",
    ]  # fmt: skip
    assert SubAck(1, (1,)) in result.packets and PubAck(2) in result.packets
    assert kinds.index(PingResp) > kinds.index(PubAck)
    [delivery] = [p for p in result.packets if isinstance(p, Publish)]
    assert (delivery.topic, delivery.payload, delivery.qos) == ("raw/a", b"hello", 1)


def test_subprotocol_and_path(broker: MqttBroker) -> None:
    refused = raw_ws(ws_url(broker), [], protocols=("stomp",))
    assert refused.status == 400
    # Any path offering "mqtt" (LavinMQ chooses by subprotocol), and 3.1's "mqttv3.1".
    for path, protocols in (("/", ("mqtt",)), ("/mqtt", ("mqttv3.1",))):
        result = raw_ws(ws_url(broker, path), [connect_bytes(f"p{len(path)}")], want=1,
                        protocols=protocols)  # fmt: skip
        assert (result.protocol, result.packets) == (protocols[0], [ConnAck()])
    # On another path, no subprotocol or "amqp" is still AMQP over WebSocket.
    amqp = raw_ws(ws_url(broker, "/"), [b"AMQP\x00\x00\x09\x01"], protocols=("amqp",))
    assert amqp.protocol == "amqp"


def test_text_and_oversized_messages_close(broker: MqttBroker) -> None:
    text = raw_ws(ws_url(broker), ["CONNECT"], wait_close=True)
    assert text.packets == [] and text.close_code == 1003
    huge = raw_ws(ws_url(broker), [b"\x00" * (2 * PACKET_BYTES_MAX + 1)], wait_close=True)
    assert huge.close_code == 1009
    # A packet over the maximum packet size within a message: the codec's refusal, as
    # over TCP (5.0: DISCONNECT 0x95).
    big = encode(Publish("big", b"x" * PACKET_BYTES_MAX, 0), V5)
    v5 = raw_ws(ws_url(broker), [connect_bytes("big", V5), big], level=V5, wait_close=True)
    connack, disconnect = v5.packets
    assert isinstance(connack, ConnAck) and connack.reason_code == 0
    assert disconnect == Disconnect(0x95)


def test_guest_from_another_sites_page_is_refused(broker: MqttBroker) -> None:
    evil = raw_ws(ws_url(broker), [connect_bytes("evil")], want=1,
                  headers={"Origin": "http://evil.example"})  # fmt: skip
    assert evil.packets == [ConnAck(4)]  # bad user name or password, as from afar
    own = f"http://127.0.0.1:{broker.http_port}"
    local = raw_ws(ws_url(broker), [connect_bytes("own")], want=1, headers={"Origin": own})
    assert local.packets == [ConnAck()]


def test_pingreq_alone_and_clean_close(broker: MqttBroker) -> None:
    messages = [connect_bytes("ping"), encode(PingReq(), V311), encode(Disconnect(), V311)]
    result = raw_ws(ws_url(broker), messages, want=2, wait_close=True)
    assert result.packets == [ConnAck(), PingResp()]
    assert result.close_code == 1000
    assert eventually(lambda: mqtt_connections(broker) == [])


@pytest.mark.parametrize("level", [3, 4, 5])
def test_mqtt_js_over_websocket(broker: MqttBroker, level: int) -> None:
    installed(NODE_DIR, "mqtt")
    script = NODE_DIR / "mqtt_ws_client.js"
    result = run_script(script, ws_url(broker), str(level), f"js-ws-{level}", timeout=60)
    assert result.stdout.strip(), result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0 and report["error"] is None, report
    assert report["granted"] == [1]
    assert sorted((m["topic"], m["payload"], m["qos"]) for m in report["messages"]) == [
        ("ws/js/a", "one", 1),
        ("ws/js/b", "two", 0),
    ]


def test_paho_over_wss_on_the_https_port(tmp_path: Path, pki: Certs) -> None:
    running = RunningBroker(
        tmp_path / "data", tls_cert=str(pki.server.cert), tls_key=str(pki.server.key),
        https_port=0,
    )  # fmt: skip
    try:
        # No MQTT listener of its own (mqtt_port -1): WebSocket is the way in.
        assert not [name for name, _h, _p in running.listeners if name.startswith("mqtt")]
        port = port_of(running, "https")
        sub = ws_paho(port, "wss-sub", version="5.0", tls=client_context(pki.ca))
        pub = ws_paho(port, "wss-pub", tls=client_context(pki.ca))
        assert sub.connect() == (False, 0)
        assert pub.connect() == (False, 0)
        assert sub.subscribe("secure/#", 1) == [1]
        pub.publish("secure/ws", b"sealed", 1)
        [message] = sub.receive(1)
        assert (message.topic, message.payload) == ("secure/ws", b"sealed")
        listed = mqtt_connections(running)
        assert len(listed) == 2 and all(c["ssl"] is True for c in listed)
        sub.disconnect()
        pub.disconnect()
    finally:
        running.stop()


def test_a_broker_shutdown_disconnects_websocket_clients(tmp_path: Path) -> None:
    running = MqttBroker(tmp_path / "data")
    client = ws_paho(running.http_port, "ws-shutdown", version="5.0")
    assert client.connect() == (False, 0)
    running.stop()
    # 5.0's DISCONNECT "server shutting down" (0x8B) came before the socket closed.
    assert int(client.disconnects.get(timeout=10).value) == 0x8B
    client.stop()
