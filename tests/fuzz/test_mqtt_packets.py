"""Fuzz the MQTT codec (mqtt_gateway/codec): the incremental decoder, every packet
family's decoder at each protocol level, and the encoder on what the decoder accepts.

An input is `level | split | bytes`. `level` 3, 4 or 5 starts the decoder at MQTT 3.1,
3.1.1 or 5.0 (a client reading a server's packets, or a server after CONNECT); any other
value starts it as a server before CONNECT, so the bytes must begin with one (a decoded
CONNECT sets the level for what follows). `split` is how the bytes arrive: 0, one feed;
n, feeds of n bytes. The decoder's maximum packet size is PACKET_BYTES_MAX, small enough
for mutations to cross it.

The property: only the codec's own errors (`MqttCodecError`), each with a reason code a
CONNACK or DISCONNECT may carry; after every feed the buffer holds less than one maximum
packet; the bytes fed whole and fed in pieces give the same packets and the same error;
and every decoded packet encodes at its level (the encoder accepts what the decoder does)
and decodes back to itself.

Run: pytest tests/fuzz/test_mqtt_packets.py (bounded), or
python -m tests.fuzz.soak mqtt_packets -runs=1000000 (atheris soak, tools/fuzz.sh).
"""

from __future__ import annotations

from typing import Final

from mqtt_gateway.codec import Connect, Decoder, MqttCodecError, Packet, ProtocolLevel, encode
from mqtt_gateway.codec.constants import PacketType
from mqtt_gateway.codec.reason_codes import REASON_CODES_V5
from tests.fuzz.harness import bounded_run

CORPUS: Final = "mqtt"
EXAMPLES: Final = 4000
PACKET_BYTES_MAX: Final = 512
CLOSE_CODES: Final = REASON_CODES_V5[PacketType.CONNACK] | REASON_CODES_V5[PacketType.DISCONNECT]
LEVELS: Final = {int(level): level for level in ProtocolLevel}

Outcome = tuple[list[Packet], type[MqttCodecError] | None]


def decode(level: ProtocolLevel | None, chunks: list[bytes]) -> Outcome:
    decoder = Decoder(level, PACKET_BYTES_MAX)
    packets: list[Packet] = []
    for chunk in chunks:
        try:
            packets += decoder.feed(chunk)
        except MqttCodecError as exc:
            assert exc.reason_code in CLOSE_CODES, exc.reason_code
            packets += exc.packets_before
            return packets, type(exc)
        assert decoder.buffered < PACKET_BYTES_MAX, decoder.buffered
    return packets, None


def check_round_trip(level: ProtocolLevel | None, packets: list[Packet]) -> None:
    for packet in packets:
        if isinstance(packet, Connect):
            level = packet.protocol_level
        assert level is not None
        data = encode(packet, level)
        assert Decoder(level, len(data)).feed(data) == [packet], packet


def fuzz_one(data: bytes) -> None:
    if len(data) < 2:
        return
    level = LEVELS.get(data[0])
    step = data[1]
    body = data[2:]
    whole = decode(level, [body])
    if step:
        pieces = decode(level, [body[i : i + step] for i in range(0, len(body), step)])
        assert pieces == whole, (pieces, whole)
    check_round_trip(level, whole[0])


def test_mqtt_packets_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)
