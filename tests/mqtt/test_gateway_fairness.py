"""A fast QoS 0 publisher does not starve the subscribers of what it publishes.

The event loop hands a connection's reads to the gateway back to back while its socket
stays readable, and deliveries wait for the drain on the loop's next turn; the gateway
therefore holds a read of publishes until the drain of what it routed has run
(`ReadGate.hold_for_drain`, mqtt_gateway/read_gate.py). Method: one raw connection
subscribes to a topic, then
writes a burst of QoS 0 publishes to it and a PINGREQ in one write. Its deliveries and
the PINGRESP come back on the same TCP stream, in the order the broker wrote them: held
reads put most deliveries before the PINGRESP; reads back to back put the PINGRESP first
(all reads, then the drain).
"""

from __future__ import annotations

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    PingReq,
    PingResp,
    ProtocolLevel,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)
from tests.mqtt.clients import RawClient
from tests.mqtt.conftest import MqttBroker

LEVEL = ProtocolLevel.MQTT_3_1_1
BURST = 30_000  # about 0.9 MB: more than a few of the event loop's reads


def test_a_burst_of_publishes_is_delivered_while_it_is_read(mqtt_broker: MqttBroker) -> None:
    client = RawClient(mqtt_broker.mqtt_port)
    client.send(Connect(LEVEL, "fair-burst", username="guest", password=b"guest"))
    assert client.read() == ConnAck(0)
    client.send(Subscribe(1, (Subscription("fair/t", 0),)))
    assert client.read() == SubAck(1, (0,))
    publish = encode(Publish("fair/t", b"0123456789abcdef"), LEVEL)
    client.send_bytes(publish * BURST + encode(PingReq(), LEVEL))
    before_pingresp = 0
    while (packet := client.read()) != PingResp():
        assert isinstance(packet, Publish), packet
        before_pingresp += 1
    after_pingresp = 0
    while before_pingresp + after_pingresp < BURST:
        assert isinstance(client.read(), Publish)
        after_pingresp += 1
    # Held reads: all but the last read's publishes go out before the PINGRESP.
    assert before_pingresp > BURST // 2, (before_pingresp, after_pingresp)
