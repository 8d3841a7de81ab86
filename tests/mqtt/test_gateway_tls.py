"""MQTT over TLS (`--mqtts-port`, `[mqtt] tls_port`): paho with the test CA publishes
and subscribes on the TLS listener, with the AMQPS certificate, and MQTT.js does over
TLS and secure WebSocket, verifying the certificate; the connection is listed
with its TLS fields; a client that does not trust the CA fails its handshake."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from mqtt_gateway.codec import ConnAck, Connect, ProtocolLevel
from tests.integration.conftest import RunningBroker
from tests.integration.tls_setup import Certs, client_context, handshake, pki, port_of
from tests.mqtt.clients import Paho, RawClient
from tests.node_clients import installed, run_script

__all__ = ["pki"]  # the module-scoped certificates fixture

NODE_DIR: Final = Path(__file__).parent / "node"


@pytest.fixture
def broker(tmp_path: Path, pki: Certs) -> Iterator[RunningBroker]:
    running = RunningBroker(
        tmp_path / "data",
        tls_cert=str(pki.server.cert),
        tls_key=str(pki.server.key),
        mqtts_port=0,
    )
    try:
        yield running
    finally:
        running.stop()


def test_paho_over_tls(broker: RunningBroker, pki: Certs) -> None:
    port = port_of(broker, "mqtt/ssl")
    assert not [name for name, _h, _p in broker.listeners if name == "mqtt"]  # mqtt_port -1
    sub = Paho(port, "tls-sub", version="5.0")
    sub.client.tls_set_context(client_context(pki.ca))
    pub = Paho(port, "tls-pub")
    pub.client.tls_set_context(client_context(pki.ca))
    # paho checks the certificate's name against the host it dials: 127.0.0.1 is not
    # "localhost", so the name check is left to the raw client below.
    sub.client.tls_insecure_set(True)
    pub.client.tls_insecure_set(True)
    assert sub.connect() == (False, 0)
    assert pub.connect() == (False, 0)
    assert sub.subscribe("secure/#", 1) == [1]
    pub.publish("secure/a", b"sealed", 1)
    [message] = sub.receive(1)
    assert (message.topic, message.payload) == ("secure/a", b"sealed")
    status, connections, _ = broker.http("GET", "/api/connections")
    assert status == 200 and isinstance(connections, list)
    mqtt = [c for c in connections if str(c["protocol"]).startswith("MQTT")]
    assert len(mqtt) == 2 and all(c["ssl"] is True for c in mqtt)
    sub.disconnect()
    pub.disconnect()


def test_the_certificate_is_the_amqps_one(broker: RunningBroker, pki: Certs) -> None:
    port = port_of(broker, "mqtt/ssl")
    sock = handshake(port, client_context(pki.ca))  # checks "localhost" against the cert
    raw = RawClient(0, ProtocolLevel.MQTT_3_1_1, sock)
    raw.send(Connect(ProtocolLevel.MQTT_3_1_1, "raw", username="guest", password=b"guest"))
    assert raw.read() == ConnAck()
    raw.close()
    with pytest.raises(ssl.SSLError):
        handshake(port, client_context(pki.other_ca))


def mqtt_js(url: str, client_id: str, ca: Path | None) -> tuple[int, dict[str, Any]]:
    installed(NODE_DIR, "mqtt")
    args = [url, "5", client_id] + ([str(ca)] if ca is not None else [])
    result = run_script(NODE_DIR / "mqtt_ws_client.js", *args, timeout=60)
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout.strip().splitlines()[-1])


def test_mqtt_js_over_tls_and_secure_websocket(tmp_path: Path, pki: Certs) -> None:
    running = RunningBroker(
        tmp_path / "data", tls_cert=str(pki.server.cert), tls_key=str(pki.server.key),
        mqtts_port=0, https_port=0,
    )  # fmt: skip
    try:
        urls = {
            "mqtts": f"mqtts://127.0.0.1:{port_of(running, 'mqtt/ssl')}",
            "wss": f"wss://127.0.0.1:{port_of(running, 'https')}/mqtt",
        }
        for scheme, url in urls.items():
            code, report = mqtt_js(url, f"js-{scheme}", pki.ca.cert)
            assert code == 0 and report["error"] is None, (scheme, report)
            assert report["granted"] == [1]
            assert sorted((m["topic"], m["payload"], m["qos"]) for m in report["messages"]) == [
                ("ws/js/a", "one", 1),
                ("ws/js/b", "two", 0),
            ]
            # Without our CA, MQTT.js refuses the server's certificate.
            code, report = mqtt_js(url, f"js-{scheme}-untrusted", None)
            assert code == 1 and report["connack"] is None, (scheme, report)
            assert report["error"]["code"] == "UNABLE_TO_VERIFY_LEAF_SIGNATURE", report
    finally:
        running.stop()
