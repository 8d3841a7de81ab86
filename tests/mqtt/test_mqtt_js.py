"""Our codec against MQTT.js 5.16 (npm `mqtt`), the client of issue 33's browsers and
Node services, at MQTT 3.1, 3.1.1 and 5.0.

Method as in test_paho.py: MQTT.js (tests/mqtt/node/mqtt_client.js) talks over loopback
TCP to `Responder`, which is only our decoder and encoder. What MQTT.js sent must decode
to what the script asked for, and MQTT.js must accept our CONNACK, SUBACK, PUBACK,
PUBREC/PUBREL/PUBCOMP, PUBLISH (with 5.0 properties) and UNSUBACK: its report says what
its callbacks saw.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import pytest

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    Disconnect,
    Properties,
    ProtocolLevel,
    Publish,
    ReasonCode,
    Subscribe,
    Subscription,
    Will,
)
from tests.mqtt.responder import Responder
from tests.node_clients import installed, run_script

NODE_DIR: Final = Path(__file__).parent / "node"
SCRIPT: Final = NODE_DIR / "mqtt_client.js"
LEVELS: Final = list(ProtocolLevel)
TOPICS: Final = ("js/0", "js/1", "js/2")


def run(responder: Responder, level: ProtocolLevel, mode: str) -> tuple[int, dict[str, Any]]:
    installed(NODE_DIR, "mqtt")
    result = run_script(SCRIPT, str(responder.port), str(int(level)), mode, timeout=60)
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout.strip().splitlines()[-1])


def expected_connect(level: ProtocolLevel) -> Connect:
    will_properties = properties = Properties()
    if level is ProtocolLevel.MQTT_5:
        will_properties = Properties(
            will_delay_interval_s=2, content_type="text/plain", message_expiry_interval_s=90,
            user_properties=(("why", "lost"),),
        )  # fmt: skip
        properties = Properties(
            session_expiry_interval_s=120, receive_maximum=16, maximum_packet_size=100000,
            topic_alias_maximum=4, request_problem_information=1,
            user_properties=(("client", "mqtt.js"),),
        )  # fmt: skip
    will = Will("devices/device-2/status", b"offline", 1, True, will_properties)
    return Connect(level, f"mqttjs-{int(level)}", True, 30, "device-2", b"secret", will, properties)


@pytest.mark.parametrize("level", LEVELS, ids=[level.name for level in LEVELS])
def test_mqtt_js_session(level: ProtocolLevel) -> None:
    v5 = level is ProtocolLevel.MQTT_5
    with Responder() as responder:
        status, report = run(responder, level, "session")
    assert responder.errors == []
    assert status == 0 and report["error"] is None, report
    assert report["granted"] == [0, 1, 2]
    assert report["published"] == 3 and report["unsubscribed"]
    messages = sorted(report["messages"], key=lambda message: message["topic"])
    assert [(m["topic"], m["qos"], m["payload"]) for m in messages] == [
        (topic, qos, json.dumps({"n": qos}, separators=(",", ":")))
        for qos, topic in enumerate(TOPICS)
    ]
    if v5:
        for message in messages:
            assert message["properties"]["contentType"] == "application/json"
            assert message["properties"]["userProperties"] == {"n": str(message["qos"])}
            assert message["properties"]["correlationData"]["data"] == [0, 2]
    (connection,) = responder.connections
    packets = connection.packets
    assert packets[0] == expected_connect(level)
    subscribe = next(p for p in packets if isinstance(p, Subscribe))
    assert subscribe.subscriptions == tuple(Subscription(t, q) for q, t in enumerate(TOPICS))
    assert subscribe.properties.subscription_identifiers == ((9,) if v5 else ())
    publishes = [p for p in packets if isinstance(p, Publish)]
    assert [(p.topic, p.qos) for p in publishes] == [(t, q) for q, t in enumerate(TOPICS)]
    if v5:
        assert publishes[1].properties == Properties(
            payload_format_indicator=1, message_expiry_interval_s=45,
            content_type="application/json", response_topic="replies/js",
            correlation_data=b"\x00\x02", user_properties=(("n", "1"),),
        )  # fmt: skip
    assert packets[-1] == Disconnect()


@pytest.mark.parametrize(
    ("level", "code"),
    [
        (ProtocolLevel.MQTT_3_1, 5),
        (ProtocolLevel.MQTT_3_1_1, 4),
        (ProtocolLevel.MQTT_5, ReasonCode.NOT_AUTHORIZED),
        (ProtocolLevel.MQTT_5, ReasonCode.SERVER_BUSY),
    ],
)
def test_mqtt_js_reports_our_refusal(level: ProtocolLevel, code: int) -> None:
    with Responder(connack=lambda _connect: ConnAck(code)) as responder:
        status, report = run(responder, level, "refused")
    assert responder.errors == []
    assert status == 0, report
    assert report["error"]["code"] == code
