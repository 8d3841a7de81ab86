"""Bytes paho-mqtt 2.2 and MQTT.js 5.16 sent (recorded by tests/mqtt/capture.py): they
decode to the packets each client was asked for, fed whole and one byte at a time. Our
encoder writes paho's bytes back byte for byte; MQTT.js orders 5.0 properties its own way
and writes the long forms of DISCONNECT, so its packets are checked by re-decoding."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from mqtt_gateway.codec import (
    Connect,
    Decoder,
    Disconnect,
    Properties,
    ProtocolLevel,
    Publish,
    Subscribe,
    encode,
)

DATA = Path(__file__).parent.parent.parent / "data" / "mqtt"
LEVELS = {
    "3.1": ProtocolLevel.MQTT_3_1,
    "3.1.1": ProtocolLevel.MQTT_3_1_1,
    "5.0": ProtocolLevel.MQTT_5,
}
PUBLISH_SESSION = [
    "Connect", "Subscribe", "Publish", "Publish", "Publish", "PubAck", "PubRel", "PubRec",
    "PubComp", "Unsubscribe", "Disconnect",
]  # fmt: skip
CAPTURES = sorted(DATA.glob("*.bin"))


def test_every_client_version_and_session_was_captured() -> None:
    names = {path.name for path in CAPTURES}
    paho = {f"paho-{v}-{s}.bin" for v in LEVELS for s in ("connect", "publish")}
    assert names == paho | {f"mqttjs-{v}.bin" for v in LEVELS}


@pytest.mark.parametrize("path", CAPTURES, ids=[path.stem for path in CAPTURES])
def test_capture_decodes_and_re_encodes_to_the_same_bytes(path: Path) -> None:
    client, version, *session = path.stem.split("-")
    level = LEVELS[version]
    data = path.read_bytes()
    decoder = Decoder()
    packets = decoder.feed(data)
    assert decoder.buffered == 0
    # The order of the acks of the two directions depends on timing; their count does not.
    kinds = Counter(type(packet).__name__ for packet in packets)
    assert kinds == Counter(
        ["Connect", "Disconnect"] if session == ["connect"] else PUBLISH_SESSION
    )
    connect = packets[0]
    assert isinstance(connect, Connect) and connect.protocol_level is LEVELS[version]
    assert connect.client_id in (f"paho-{version}", f"mqttjs-{int(LEVELS[version])}")
    assert packets[-1] == Disconnect()
    ours = b"".join(encode(packet, level) for packet in packets)
    if client == "paho":
        assert ours == data
    assert Decoder().feed(ours) == packets
    one_by_one = Decoder()
    assert [p for i in range(len(data)) for p in one_by_one.feed(data[i : i + 1])] == packets


def test_the_5_0_capture_carries_its_properties() -> None:
    packets = Decoder().feed((DATA / "paho-5.0-publish.bin").read_bytes())
    subscribe = packets[1]
    assert isinstance(subscribe, Subscribe)
    assert subscribe.properties == Properties(subscription_identifiers=(7,))
    publish = packets[4]
    assert isinstance(publish, Publish) and publish.qos == 2
    assert publish.properties.user_properties == (("n", "2"),)
    assert publish.properties.correlation_data == b"\x00\x01"
    assert publish.properties.message_expiry_interval_s == 30
