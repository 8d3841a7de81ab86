"""Record what paho-mqtt sends, and what our codec answers: `python -m tests.mqtt.capture`.

Runs the sessions of tests/mqtt/paho_sessions.py (CONNECT with will, credentials and 5.0
properties; SUBSCRIBE, PUBLISH at QoS 0, 1 and 2 with their handshakes, UNSUBSCRIBE,
DISCONNECT) and MQTT.js's (tests/mqtt/node/mqtt_client.js, the same steps) at MQTT 3.1,
3.1.1 and 5.0 against the loopback `Responder` and writes:

- tests/data/mqtt/paho-<version>-<session>.bin, mqttjs-<version>.bin: the client's bytes, which
  tests/unit/mqtt_gateway/test_captures.py decodes without a socket;
- tests/fuzz/corpus/mqtt/: the same bytes as fuzz seeds (`level | step | bytes`, level 0:
  a server before CONNECT), and the responder's answers as client-side seeds (level 3, 4
  or 5), read by tests/fuzz/test_mqtt_packets.py; and `encoder-5.0.bin`, our encoding
  of 5.0 packets that carry every property each packet may have (paho sends few of them).

Re-run it when paho or the codec changes; the files are a few hundred bytes each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from mqtt_gateway.codec import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    Properties,
    ProtocolLevel,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
    encode,
)
from tests.fuzz.harness import CORPUS_ROOT
from tests.mqtt.paho_sessions import PROTOCOLS, connect_only, subscribe_and_publish
from tests.mqtt.responder import Responder
from tests.mqtt.test_mqtt_js import run as run_mqtt_js

DATA_ROOT: Final = Path(__file__).parent.parent / "data" / "mqtt"
CORPUS: Final = "mqtt"
LEVELS: Final = {"3.1": ProtocolLevel.MQTT_3_1, "3.1.1": ProtocolLevel.MQTT_3_1_1,
                 "5.0": ProtocolLevel.MQTT_5}  # fmt: skip
SERVER_SIDE: Final = 0  # the fuzz module's level byte for "no CONNECT yet"


def connack(connect: Connect) -> ConnAck:
    if connect.protocol_level is ProtocolLevel.MQTT_5:
        return ConnAck(properties=Properties(assigned_client_identifier="assigned-1",
                                             server_keep_alive_s=20, receive_maximum=10,
                                             user_properties=(("server", "streamq"),)))  # fmt: skip
    return ConnAck()


def every_property_packets() -> list[Packet]:
    """5.0 packets with every property their type allows, for the fuzzer to mutate."""
    pairs = (("a", "1"), ("b", "2"))
    will = Will("w/t", b"gone", 1, True, Properties(
        payload_format_indicator=1, message_expiry_interval_s=9, content_type="text/plain",
        response_topic="r/t", correlation_data=b"c", will_delay_interval_s=3,
        user_properties=pairs))  # fmt: skip
    auth = {"authentication_method": "SCRAM-SHA-1", "authentication_data": b"\x01\x02"}
    return [
        Connect(ProtocolLevel.MQTT_5, "every", False, 60, "u", b"p", will, Properties(
            session_expiry_interval_s=60, receive_maximum=5, maximum_packet_size=4096,
            topic_alias_maximum=4, request_response_information=1,
            request_problem_information=0, user_properties=pairs, **auth)),
        ConnAck(0, True, Properties(
            session_expiry_interval_s=60, receive_maximum=5, maximum_qos=1, retain_available=0,
            maximum_packet_size=4096, assigned_client_identifier="x", topic_alias_maximum=4,
            reason_string="ok", user_properties=pairs, wildcard_subscription_available=1,
            subscription_identifier_available=1, shared_subscription_available=0,
            server_keep_alive_s=30, response_information="resp", server_reference="other",
            **auth)),
        Publish("", b"{}", 1, True, True, 9, Properties(
            payload_format_indicator=1, message_expiry_interval_s=9, topic_alias=2,
            response_topic="r/t", correlation_data=b"c", user_properties=pairs,
            subscription_identifiers=(1, 300, 268_435_455), content_type="application/json")),
        Subscribe(3, (Subscription("$share/g/a/+/#", 2, False, True, 2),
                      Subscription("b/#", 1, True, False, 1)),
                  Properties(subscription_identifiers=(5,), user_properties=pairs)),
        SubAck(3, (2, 0x8F), Properties(reason_string="r", user_properties=pairs)),
        Unsubscribe(4, ("a/+", "$share/g/b"), Properties(user_properties=pairs)),
        UnsubAck(4, (0, 0x11), Properties(reason_string="r", user_properties=pairs)),
        Disconnect(0x04, Properties(session_expiry_interval_s=0, reason_string="bye",
                                    server_reference="other", user_properties=pairs)),
        Auth(0x18, Properties(reason_string="more", user_properties=pairs, **auth)),
    ]  # fmt: skip


def main() -> None:
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    corpus = CORPUS_ROOT / CORPUS
    corpus.mkdir(parents=True, exist_ok=True)
    for version in PROTOCOLS:
        for name, session in (("connect", connect_only), ("publish", subscribe_and_publish)):
            with Responder(connack=connack) as responder:
                session(responder, version)
            if responder.errors:
                raise SystemExit(f"{version} {name}: {responder.errors}")
            (connection,) = responder.connections
            stem = f"paho-{version}-{name}"
            (DATA_ROOT / f"{stem}.bin").write_bytes(bytes(connection.sent))
            (corpus / f"{stem}.bin").write_bytes(bytes([SERVER_SIDE, 0]) + connection.sent)
            level = LEVELS[version]
            answers = bytes([level, 0]) + connection.answered
            (corpus / f"answers-{version}-{name}.bin").write_bytes(answers)
            print(f"{stem}: {len(connection.sent)} bytes, answered {len(connection.answered)}")
    for version, level in LEVELS.items():
        with Responder(connack=connack) as responder:
            status, report = run_mqtt_js(responder, level, "session")
        if status or responder.errors:
            raise SystemExit(f"MQTT.js {version}: {report} {responder.errors}")
        (connection,) = responder.connections
        (DATA_ROOT / f"mqttjs-{version}.bin").write_bytes(bytes(connection.sent))
        (corpus / f"mqttjs-{version}.bin").write_bytes(bytes([SERVER_SIDE, 0]) + connection.sent)
        print(f"mqttjs-{version}: {len(connection.sent)} bytes")
    level = ProtocolLevel.MQTT_5
    packets = every_property_packets()
    seed = b"".join(encode(packet, level) for packet in packets)
    (corpus / "encoder-5.0.bin").write_bytes(bytes([level, 0]) + seed)


if __name__ == "__main__":
    main()
