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
every decoded packet encodes at its level (the encoder accepts what the decoder does)
and decodes back to itself; and the same bytes read with `push` and `pop` with a
`RunForm` (the receive path of mqtt_gateway/session.py, runs of publishes split by the C
scanner `mqtt_gateway.codec._scan`) give the same packets, runs expanded, and error.

Run: pytest tests/fuzz/test_mqtt_packets.py (bounded), or
python -m tests.fuzz.soak mqtt_packets -runs=1000000 (atheris soak, tools/fuzz.sh).
"""

from __future__ import annotations

from typing import Final

from mqtt_gateway.codec import Connect, Decoder, MqttCodecError, Packet, ProtocolLevel, encode
from mqtt_gateway.codec.constants import PacketType
from mqtt_gateway.codec.reason_codes import REASON_CODES_V5
from mqtt_gateway.codec.runs import PublishRun, RunForm
from tests.fuzz.harness import bounded_run

CORPUS: Final = "mqtt"
EXAMPLES: Final = 4000
PACKET_BYTES_MAX: Final = 512
CLOSE_CODES: Final = REASON_CODES_V5[PacketType.CONNACK] | REASON_CODES_V5[PacketType.DISCONNECT]
LEVELS: Final = {int(level): level for level in ProtocolLevel}
RUN_FORM: Final = RunForm((b"q0", b"-", b"q1", b"q1 dup"), "amq.topic", str)

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


def decode_runs(level: ProtocolLevel | None, chunks: list[bytes]) -> Outcome:
    """`decode` through `push` and `pop(RUN_FORM)`, each run as its packets."""
    decoder = Decoder(level, PACKET_BYTES_MAX)
    packets: list[Packet] = []
    for chunk in chunks:
        try:
            decoder.push(chunk)
            while (item := decoder.pop(RUN_FORM)) is not None:
                if isinstance(item, PublishRun):
                    assert item.routing_key == item.topic
                    expanded = item.packets()
                    assert [m[1] for m in item.messages] == [p.payload for p in expanded]
                    packets += expanded
                else:
                    packets.append(item)
        except MqttCodecError as exc:
            assert exc.reason_code in CLOSE_CODES, exc.reason_code
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
    runs = decode_runs(level, [body])
    assert runs == whole, (runs, whole)
    if step:
        chunks = [body[i : i + step] for i in range(0, len(body), step)]
        pieces = decode(level, chunks)
        assert pieces == whole, (pieces, whole)
        assert decode_runs(level, chunks) == whole
    check_round_trip(level, whole[0])


def test_mqtt_packets_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)
