"""MQTT.js 5.16 (npm `mqtt`) against the MQTT gateway: QoS 2 deliveries, a shared
subscription's members served in turn, a Subscription Identifier and No Local, as an
unmodified MQTT.js sees them (tests/mqtt/node/gateway_subscribers.js)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

from tests.mqtt.conftest import MqttBroker
from tests.node_clients import installed, run_script

NODE_DIR: Final = Path(__file__).parent / "node"
SCRIPT: Final = NODE_DIR / "gateway_subscribers.js"


def test_mqtt_js_qos_2_shared_subscriptions_and_options(mqtt_broker: MqttBroker) -> None:
    installed(NODE_DIR, "mqtt")
    result = run_script(SCRIPT, str(mqtt_broker.mqtt_port), timeout=60)
    assert result.stdout.strip(), result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, report
    members = report["members"]
    shared = sorted(m["payload"] for member in members for m in member)
    # Each of the 20 to exactly one member, both members served, at QoS 2.
    assert shared == sorted([f"w{n}" for n in range(10)] + [f"m{n}" for n in range(10)])
    assert all(member for member in members)
    assert {m["qos"] for member in members for m in member} == {2}
    watcher = report["watcher"]
    # No Local: only the member's messages, with the identifier, at QoS 2.
    assert sorted(m["payload"] for m in watcher) == sorted(f"m{n}" for n in range(10))
    assert all(m["ids"] == [42] and m["qos"] == 2 for m in watcher)
