"""Every packet of every protocol level survives encode -> decode, whole, split at every
byte and fed one byte at a time, and a whole run of packets comes back in order."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqtt_gateway.codec import Auth, Decoder, ProtocolLevel, encode
from mqtt_gateway.codec.packets import PACKET_CLASSES
from tests.unit.mqtt_gateway.strategies import LEVELS, packet_strategies, packets

level_and_packet = st.sampled_from(LEVELS).flatmap(
    lambda level: st.tuples(st.just(level), packets(level))
)
level_and_run = st.sampled_from(LEVELS).flatmap(
    lambda level: st.tuples(st.just(level), st.lists(packets(level), min_size=1, max_size=5))
)


@settings(max_examples=300, deadline=None)
@given(level_and_packet)
def test_every_packet_round_trips(case: tuple[ProtocolLevel, Any]) -> None:
    level, packet = case
    data = encode(packet, level)
    assert Decoder(level).feed(data) == [packet]
    # Bytes too: the encoder's form is canonical (shortest acks, ids in order).
    assert encode(Decoder(level).feed(data)[0], level) == data


@settings(max_examples=60, deadline=None)
@given(level_and_run)
def test_a_run_split_at_every_position_gives_the_same_packets(
    case: tuple[ProtocolLevel, list[Any]],
) -> None:
    level, run = case
    data = b"".join(encode(packet, level) for packet in run)
    assert Decoder(level).feed(data) == run
    for cut in range(len(data) + 1):
        decoder = Decoder(level)
        assert decoder.feed(data[:cut]) + decoder.feed(data[cut:]) == run
        assert decoder.buffered == 0
    decoder = Decoder(level)
    one_by_one = [
        packet for index in range(len(data)) for packet in decoder.feed(data[index : index + 1])
    ]
    assert one_by_one == run


def test_the_strategies_cover_every_packet_type() -> None:
    for level in LEVELS:
        expected = set(PACKET_CLASSES) - (set() if level is ProtocolLevel.MQTT_5 else {Auth})
        assert set(packet_strategies(level)) == expected


PER_CLASS = [(level, cls) for level in LEVELS for cls in packet_strategies(level)]


@pytest.mark.parametrize(
    ("level", "cls"), PER_CLASS, ids=[f"{lv.name}-{c.__name__}" for lv, c in PER_CLASS]
)
def test_each_packet_class_round_trips(level: ProtocolLevel, cls: type) -> None:
    @settings(max_examples=15, deadline=None)
    @given(packet_strategies(level)[cls])
    def round_trip(packet: Any) -> None:
        assert type(packet) is cls
        data = encode(packet, level)
        assert Decoder(level).feed(data) == [packet]

    round_trip()


def test_a_connect_sets_the_decoders_level() -> None:
    from mqtt_gateway.codec import Connect, PingReq, Publish  # noqa: PLC0415

    for level in LEVELS:
        decoder = Decoder()
        data = encode(Connect(level, "c1"), level) + encode(Publish("a/b", b"x"), level)
        assert decoder.feed(data + encode(PingReq(), level)) == [
            Connect(level, "c1"), Publish("a/b", b"x"), PingReq(),
        ]  # fmt: skip
        assert decoder.protocol_level is level
