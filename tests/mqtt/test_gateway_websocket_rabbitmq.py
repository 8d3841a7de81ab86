"""Differential checks of MQTT over WebSocket against RabbitMQ 3.10's rabbitmq_web_mqtt
(its listener on a loopback port of its own, `web_mqtt.ws_path = /mqtt`) and streamq's
`/mqtt` on the HTTP port: the same paho calls over ws on both, the same observations
(CONNACK codes, session present, granted QoS, deliveries, the subprotocol chosen, the
connection listed with its MQTT protocol name and client id)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mqtt_gateway.codec import ConnAck, Connect, ProtocolLevel, encode
from tests.differential.peers import RabbitMQServer, free_port
from tests.integration.conftest import RunningBroker
from tests.mqtt.clients import eventually
from tests.mqtt.test_gateway_rabbitmq import _accepts
from tests.mqtt.websocket_clients import raw_ws, ws_paho


@dataclass(frozen=True)
class WebMqttPeer:
    name: str
    ws_port: int
    http_port: int

    def connections(self) -> list[dict[str, object]]:
        helper = RunningBroker.__new__(RunningBroker)
        helper.http_port = self.http_port
        status, body, _ = helper.http("GET", "/api/connections")
        assert status == 200 and isinstance(body, list)
        return body


@pytest.fixture(scope="module")
def rabbitmq_web_mqtt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebMqttPeer]:
    port = free_port()
    server = RabbitMQServer(
        tmp_path_factory.mktemp("rabbitmq-web-mqtt"),
        plugins=("rabbitmq_mqtt", "rabbitmq_web_mqtt"),
        extra_config=(
            f"mqtt.listeners.tcp.1 = 127.0.0.1:{free_port()}\nmqtt.allow_anonymous = false\n"
            f"web_mqtt.tcp.ip = 127.0.0.1\nweb_mqtt.tcp.port = {port}\n"
            "web_mqtt.ws_path = /mqtt\n"
        ),
    )
    try:
        assert eventually(lambda: _accepts(port), timeout_s=60), server.log_tail()
        yield WebMqttPeer("rabbitmq", port, server.http_port)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def streamq_web_mqtt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebMqttPeer]:
    running = RunningBroker(Path(tmp_path_factory.mktemp("streamq-web-mqtt")) / "data")
    try:
        yield WebMqttPeer("streamq", running.http_port, running.http_port)
    finally:
        running.stop()


@pytest.fixture(params=["rabbitmq", "streamq"])
def peer(request: pytest.FixtureRequest) -> WebMqttPeer:
    found: WebMqttPeer = request.getfixturevalue(f"{request.param}_web_mqtt")
    return found


def test_pubsub_and_persistent_session(peer: WebMqttPeer) -> None:
    sub = ws_paho(peer.ws_port, "web-diff-sub", clean=False)
    assert sub.connect() == (False, 0)
    assert sub.subscribe("web/+/x", 1) == [1]
    pub = ws_paho(peer.ws_port, "web-diff-pub")
    assert pub.connect() == (False, 0)
    pub.publish("web/a/x", b"one", 1)
    pub.publish("web/b/x", b"two", 0)
    got = sorted((m.topic, m.payload, m.qos) for m in sub.receive(2))
    assert got == [("web/a/x", b"one", 1), ("web/b/x", b"two", 0)]
    # RabbitMQ lists connections after its statistics interval (5 s).
    assert eventually(lambda: _listed(peer, "web-diff-sub") == "Web MQTT 3.1.1", timeout_s=20)
    sub.disconnect()
    again = ws_paho(peer.ws_port, "web-diff-sub", clean=False)
    assert again.connect() == (True, 0)  # the session is present
    again.disconnect()
    cleaned = ws_paho(peer.ws_port, "web-diff-sub")  # clean: the session goes
    assert cleaned.connect() == (False, 0)
    cleaned.disconnect()
    pub.disconnect()


def _listed(peer: WebMqttPeer, client_id: str) -> str | None:
    for connection in peer.connections():
        properties = connection.get("client_properties")
        if isinstance(properties, dict) and properties.get("client_id") == client_id:
            return str(connection["protocol"])
    return None


def test_bad_password_and_subprotocols(peer: WebMqttPeer) -> None:
    level = ProtocolLevel.MQTT_3_1_1
    url = f"ws://127.0.0.1:{peer.ws_port}/mqtt"

    def connect(password: bytes) -> bytes:
        return encode(Connect(level, "web-raw", username="guest", password=password), level)

    for offered in (("mqtt",), ("mqttv3.1",), ()):
        result = raw_ws(url, [connect(b"guest")], want=1, protocols=offered)
        assert (result.protocol, result.packets) == (next(iter(offered), None), [ConnAck()])
    wrong = raw_ws(url, [connect(b"nope")], wait_close=True)
    # The one difference: RabbitMQ 3.10's web_mqtt closes the socket (1002) with no
    # CONNACK; streamq answers CONNACK 4 as over TCP, which MQTT-3.2.2-5 asks for
    # (docs/mqtt.md, "Differences").
    if peer.name == "rabbitmq":
        assert (wrong.packets, wrong.close_code) == ([], 1002)
    else:
        assert (wrong.packets, wrong.close_code) == ([ConnAck(4)], 1000)
