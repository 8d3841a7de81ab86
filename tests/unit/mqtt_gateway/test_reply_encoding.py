"""The session's short cut for PUBACK (`mqtt_gateway.session.encode_reply`) writes the
codec's bytes exactly, at every level, and leaves every other reply to the codec."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mqtt_gateway.codec import (
    Decoder,
    PingResp,
    Properties,
    ProtocolLevel,
    PubAck,
    PubRec,
    ReasonCode,
    encode,
)
from mqtt_gateway.session import encode_reply


@given(st.integers(1, 0xFFFF), st.sampled_from(list(ProtocolLevel)))
def test_a_plain_puback_is_the_codec_s(packet_id: int, level: ProtocolLevel) -> None:
    data = encode_reply(PubAck(packet_id), level)
    assert data == encode(PubAck(packet_id), level)
    assert Decoder(protocol_level=level).feed(data) == [PubAck(packet_id)]


def test_other_replies_go_through_the_codec() -> None:
    level = ProtocolLevel.MQTT_5
    refused = PubAck(7, ReasonCode.NOT_AUTHORIZED)
    described = PubAck(7, 0, Properties(reason_string="fine"))
    for packet in (refused, described, PubRec(7), PingResp()):
        data = encode_reply(packet, level)
        assert data == encode(packet, level)
        assert Decoder(protocol_level=level).feed(data) == [packet]
