"""CONNECT and the connection's life through the MQTT gateway: login with the broker's
users (`vhost:user`, else `default_vhost`), the CONNACK codes of 3.1.1 and the reason
codes of 5.0, permissions as RabbitMQ's MQTT plugin checks them, a second CONNECT, the
keep-alive, client id takeover, and the listing in the management API."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import quote

import pika
import pytest

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    ProtocolLevel,
    Publish,
    ReasonCode,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)
from tests.mqtt.clients import Paho, RawClient, eventually
from tests.mqtt.conftest import MqttBroker

V311 = ProtocolLevel.MQTT_3_1_1
V5 = ProtocolLevel.MQTT_5


def add_user(broker: MqttBroker, user: str, vhost: str, **permissions: str) -> None:
    assert broker.http("PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})[0] in (201, 204)
    if vhost != "/":
        assert broker.http("PUT", f"/api/vhosts/{vhost}")[0] in (201, 204)
    grant = {"configure": ".*", "write": ".*", "read": ".*"} | permissions
    path = f"/api/permissions/{vhost.replace('/', '%2F')}/{user}"
    assert broker.http("PUT", path, grant)[0] in (201, 204)


def connack(port: int, level: ProtocolLevel, user: str | None, password: bytes | None) -> int:
    raw = RawClient(port, level)
    raw.send(Connect(level, "c1", username=user, password=password))
    answer = raw.read()
    assert isinstance(answer, ConnAck), answer
    assert not answer.session_present
    if answer.reason_code:
        assert raw.closed_by_peer()
    raw.close()
    return answer.reason_code


@pytest.mark.parametrize(
    ("level", "bad_password", "no_vhost_access", "no_credentials"),
    [(V311, 4, 5, 4), (V5, 0x86, 0x87, 0x86)],
)
def test_login_codes(
    mqtt_broker: MqttBroker,
    level: ProtocolLevel,
    bad_password: int,
    no_vhost_access: int,
    no_credentials: int,
) -> None:
    port = mqtt_broker.mqtt_port
    add_user(mqtt_broker, "alice", "devices")
    assert connack(port, level, "guest", b"guest") == 0
    assert connack(port, level, "guest", b"wrong") == bad_password
    assert connack(port, level, "nobody", b"pw") == bad_password
    assert connack(port, level, None, None) == no_credentials
    # alice has permissions in "devices" only: the default vhost "/" is refused
    assert connack(port, level, "alice", b"pw") == no_vhost_access
    assert connack(port, level, "devices:alice", b"pw") == 0
    assert connack(port, level, "nowhere:alice", b"pw") == no_vhost_access


def test_default_vhost_is_the_one_of_a_plain_user_name(tmp_path: Path) -> None:
    running = MqttBroker(tmp_path / "data", mqtt_default_vhost="devices")
    try:
        add_user(running, "alice", "devices")
        add_user(running, "bob", "/")
        assert connack(running.mqtt_port, V311, "alice", b"pw") == 0
        # bob has no permissions in "devices"
        assert connack(running.mqtt_port, V311, "bob", b"pw") == 5
        assert connack(running.mqtt_port, V311, "/:bob", b"pw") == 0
    finally:
        running.stop()


def test_subscribe_and_publish_permissions(mqtt_broker: MqttBroker) -> None:
    """read on amq.topic and the queue to subscribe (SUBACK failure otherwise), write on
    amq.topic to publish (3.1.1 has no way to refuse one: the connection closes, as in
    RabbitMQ 3.10), and topic permissions on the routing key."""
    add_user(mqtt_broker, "reader", "/", write="^mqtt-subscription-")
    add_user(mqtt_broker, "writer", "/", read="^$")
    topic_grant = {"exchange": "amq.topic", "write": "^open\\.", "read": "^open\\."}
    assert mqtt_broker.http("PUT", "/api/topic-permissions/%2F/reader", topic_grant)[0] in (
        201,
        204,
    )
    reader = Paho(mqtt_broker.mqtt_port, "reader", username="reader", password="pw")
    reader.connect()
    assert reader.subscribe("open/#", 1) == [1]
    assert reader.subscribe("closed/#", 1) == [0x80]
    writer = Paho(mqtt_broker.mqtt_port, "writer", username="writer", password="pw")
    writer.connect()
    assert writer.subscribe("open/#", 1) == [0x80]  # no read permission
    writer.publish("open/a", b"x", 1)
    assert [m.payload for m in reader.receive(1)] == [b"x"]
    # reader may not write to amq.topic: its publish closes its connection
    raw = RawClient(mqtt_broker.mqtt_port)
    raw.send(Connect(V311, "r2", username="reader", password=b"pw"))
    assert raw.read() == ConnAck()
    raw.send(Publish("open/b", b"y", 1, packet_id=1))
    assert raw.closed_by_peer()
    assert reader.nothing_more()


def test_a_second_connect_closes_the_connection(mqtt_broker: MqttBroker) -> None:
    for level in (V311, V5):
        raw = RawClient(mqtt_broker.mqtt_port, level)
        hello = Connect(level, "twice", username="guest", password=b"guest")
        raw.send(hello)
        assert isinstance(raw.read(), ConnAck)
        raw.send(hello)
        if level is V5:
            assert raw.read() == Disconnect(ReasonCode.PROTOCOL_ERROR)
        assert raw.closed_by_peer()


def test_keep_alive_closes_a_silent_client_after_one_and_a_half_periods(
    mqtt_broker: MqttBroker,
) -> None:
    raw = RawClient(mqtt_broker.mqtt_port, V5)
    raw.send(Connect(V5, "sleepy", keep_alive_s=2, username="guest", password=b"guest"))
    assert isinstance(raw.read(), ConnAck)
    # Pings within the period keep it open (each 2.5 s before the deadline: a loaded
    # machine's late wake-up must not look like silence)...
    for _ in range(3):
        time.sleep(0.5)
        raw.send(PingReq())
        assert raw.read() == PingResp()
    # ...silence past 1.5 periods (3 s) closes it, with DISCONNECT 0x8D in 5.0.
    started = time.monotonic()
    assert raw.read(timeout_s=8) == Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT)
    assert raw.closed_by_peer()
    assert 2.0 <= time.monotonic() - started < 7.0


def test_a_new_connection_with_the_same_client_id_takes_the_session_over(
    mqtt_broker: MqttBroker,
) -> None:
    first = RawClient(mqtt_broker.mqtt_port, V5)
    first.send(Connect(V5, "same", username="guest", password=b"guest"))
    assert isinstance(first.read(), ConnAck)
    first.send(Subscribe(1, (Subscription("t", 1),)))
    assert first.read() == SubAck(1, (1,))
    second = Paho(mqtt_broker.mqtt_port, "same", version="5.0")
    second.connect()
    assert first.read() == Disconnect(ReasonCode.SESSION_TAKEN_OVER)
    assert first.closed_by_peer()
    # the new connection works, and one session is listed
    assert second.subscribe("t", 1) == [1]
    assert eventually(lambda: len(_mqtt_connections(mqtt_broker)) == 1)
    second.disconnect()


def test_connections_are_listed_as_rabbitmq_lists_them(mqtt_broker: MqttBroker) -> None:
    v311 = Paho(mqtt_broker.mqtt_port, "listed-311", keepalive=30)
    v5 = Paho(mqtt_broker.mqtt_port, "listed-5", version="5.0")
    v311.connect()
    v5.connect()
    connections = _mqtt_connections(mqtt_broker)
    by_client = {c["client_properties"]["client_id"]: c for c in connections}
    assert by_client["listed-311"]["protocol"] == "MQTT 3.1.1"
    assert by_client["listed-5"]["protocol"] == "MQTT 5.0"
    assert by_client["listed-311"]["client_properties"]["keepalive"] == 30
    assert by_client["listed-311"]["user"] == "guest"
    assert by_client["listed-311"]["vhost"] == "/"
    # the management API's close ends the connection
    name = by_client["listed-5"]["name"]
    assert mqtt_broker.http("DELETE", f"/api/connections/{quote(name, safe='')}")[0] == 204
    assert v5.disconnects.get(timeout=10) is not None
    v311.disconnect()
    assert eventually(lambda: _mqtt_connections(mqtt_broker) == [])


def _mqtt_connections(broker: MqttBroker) -> list[dict[str, object]]:
    status, connections, _ = broker.http("GET", "/api/connections")
    assert status == 200 and isinstance(connections, list)
    return [c for c in connections if str(c["protocol"]).startswith("MQTT")]


def test_proxy_protocol_gives_the_clients_address(tmp_path: Path) -> None:
    """With `tcp_proxy_protocol` on, each MQTT connection starts with a PROXY header
    whose source address is the client's: guest from there is not local, and the
    management API shows that address; a connection without a header is closed."""
    running = MqttBroker(tmp_path / "data", tcp_proxy_protocol=1)
    try:
        add_user(running, "alice", "/")
        port = running.mqtt_port
        header = f"PROXY TCP4 203.0.113.7 127.0.0.1 40000 {port}\r\n".encode()
        guest = RawClient(port)
        guest.send_bytes(header)
        guest.send(Connect(V311, "far-guest", username="guest", password=b"guest"))
        assert guest.read() == ConnAck(4)  # guest only from loopback
        alice = RawClient(port, V5)
        alice.send_bytes(header + encode(Connect(V5, "far", username="alice", password=b"pw"), V5))
        answer = alice.read()
        assert isinstance(answer, ConnAck) and answer.reason_code == 0
        [listed] = _mqtt_connections(running)
        assert (listed["peer_host"], listed["peer_port"]) == ("203.0.113.7", 40000)
        bare = RawClient(port)
        bare.send(Connect(V311, "bare", username="guest", password=b"guest"))
        assert bare.closed_by_peer()
        alice.close()
    finally:
        running.stop()


def test_connection_limits_count_and_refuse_mqtt(mqtt_broker: MqttBroker) -> None:
    """A vhost's max-connections counts MQTT connections with AMQP ones and refuses an
    MQTT login over it with CONNACK 5 (5.0: 0x97), as RabbitMQ 3.10's plugin does."""
    limit = {"value": 1}
    assert mqtt_broker.http("PUT", "/api/vhost-limits/%2F/max-connections", limit)[0] == 204
    first = Paho(mqtt_broker.mqtt_port, "first")
    assert first.connect() == (False, 0)
    assert connack(mqtt_broker.mqtt_port, V311, "guest", b"guest") == 5
    assert connack(mqtt_broker.mqtt_port, V5, "guest", b"guest") == 0x97
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", mqtt_broker.amqp_port))
    first.disconnect()
    assert eventually(lambda: connack(mqtt_broker.mqtt_port, V311, "guest", b"guest") == 0)
