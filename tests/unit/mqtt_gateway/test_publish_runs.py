"""Runs of PUBLISH packets (mqtt_gateway/codec/runs.py and its C scanner `_scan`).

The oracle is the packet-by-packet decoder: `Decoder.pop` with a `RunForm` must give the
same packets (a run expanded by `PublishRun.packets`) and the same error as `feed`, for
valid reads, for every kind of packet a run must not take, and for malformed and
truncated bytes, which the scanner leaves to the decoder (never an error of its own).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqtt_gateway import broker_side, mapping, message_properties
from mqtt_gateway.codec import (
    NO_PROPERTIES,
    Decoder,
    MalformedPacket,
    MqttCodecError,
    Packet,
    PacketTooLarge,
    Properties,
    ProtocolError,
    ProtocolLevel,
    Publish,
    TopicAliasInvalid,
    TopicNameInvalid,
    _scan,
    encode,
)
from mqtt_gateway.codec.runs import RUN_MESSAGES_MAX, PublishRun, RunForm
from tests.unit.mqtt_gateway.strategies import payloads, topic_names

V311 = ProtocolLevel.MQTT_3_1_1
V5 = ProtocolLevel.MQTT_5
FORM = RunForm((b"\x30\x00q0", b"\x30\x00unused", b"\x30\x00q1", b"\x30\x00q1dup"), "ex", str.upper)
BYTES_MAX = 4096

Outcome = tuple[list[Packet], type[MqttCodecError] | None]


def publish(
    topic: str, payload: bytes = b"x", qos: int = 1, packet_id: int | None = 1, *,
    dup: bool = False, retain: bool = False, level: ProtocolLevel = V311,
) -> bytes:  # fmt: skip
    return encode(Publish(topic, payload, qos, retain, dup, packet_id if qos else None), level)


def raw_publish(first_byte: int, body: bytes) -> bytes:
    """A PUBLISH with any first byte and body (one-byte remaining length)."""
    assert len(body) < 128
    return bytes((first_byte, len(body))) + body


def by_decoder(level: ProtocolLevel, chunks: list[bytes], bytes_max: int = BYTES_MAX) -> Outcome:
    decoder = Decoder(level, bytes_max)
    packets: list[Packet] = []
    for chunk in chunks:
        try:
            packets += decoder.feed(chunk)
        except MqttCodecError as exc:
            return packets + list(exc.packets_before), type(exc)
    return packets, None


def by_runs(
    level: ProtocolLevel, chunks: list[bytes], bytes_max: int = BYTES_MAX
) -> tuple[list[Packet | PublishRun], type[MqttCodecError] | None]:
    decoder = Decoder(level, bytes_max)
    items: list[Packet | PublishRun] = []
    for chunk in chunks:
        try:
            decoder.push(chunk)
            while (item := decoder.pop(FORM)) is not None:
                items.append(item)
        except MqttCodecError as exc:
            return items, type(exc)
    return items, None


def expanded(items: list[Packet | PublishRun]) -> list[Packet]:
    packets: list[Packet] = []
    for item in items:
        packets += item.packets() if isinstance(item, PublishRun) else [item]
    return packets


def assert_same(level: ProtocolLevel, data: bytes, bytes_max: int = BYTES_MAX) -> list[object]:
    """Both ways agree, whole and byte by byte; the items of the whole read."""
    items, error = by_runs(level, [data], bytes_max)
    assert (expanded(items), error) == by_decoder(level, [data], bytes_max)
    pieces = [data[i : i + 1] for i in range(len(data))]
    items_pieces, error_pieces = by_runs(level, pieces, bytes_max)
    assert (expanded(items_pieces), error_pieces) == by_decoder(level, pieces, bytes_max)
    return list(items)


def test_a_run_of_one_topic_is_one_item_with_its_pubacks() -> None:
    data = (
        publish("a/b", b"1", packet_id=7)
        + publish("a/b", b"22", packet_id=8, dup=True)
        + publish("a/b", b"", qos=0)
        + publish("a/b", b"4", packet_id=0x1234)
    )
    [run] = assert_same(V311, data)
    assert isinstance(run, PublishRun)
    assert (run.topic, run.routing_key) == ("a/b", "A/B")
    assert run.messages == [
        (b"\x30\x00q1", b"1", "ex", "A/B", 0),
        (b"\x30\x00q1dup", b"22", "ex", "A/B", 0),
        (b"\x30\x00q0", b"", "ex", "A/B", 0),
        (b"\x30\x00q1", b"4", "ex", "A/B", 0),
    ]
    assert run.acks == b"\x40\x02\x00\x07\x40\x02\x00\x08\x40\x02\x12\x34"
    assert run.ack_count == 3
    assert run.kinds == bytes((2, 3, 0, 2))
    assert run.flags_byte0 == 0x30


def test_a_new_topic_starts_a_new_run() -> None:
    data = publish("a", packet_id=1) + publish("b", packet_id=2) + publish("a", packet_id=3)
    items = assert_same(V311, data)
    assert [type(i) for i in items] == [PublishRun] * 3
    assert [i.topic for i in items if isinstance(i, PublishRun)] == ["a", "b", "a"]


@pytest.mark.parametrize(
    "other",
    [
        publish("a", qos=2, packet_id=5),
        publish("a", retain=True),
        encode(Publish("a", b"x", 1, False, False, 5, NO_PROPERTIES), V311).replace(b"a", b"b"),
    ],
    ids=["qos2", "retain", "other-topic"],
)
def test_what_a_run_does_not_take_the_decoder_reads(other: bytes) -> None:
    data = publish("a", packet_id=1) + other + publish("a", packet_id=2)
    items = assert_same(V311, data)
    assert isinstance(items[0], PublishRun) and len(items[0].messages) == 1
    assert len(items) == 3


def test_mqtt5_runs_take_publishes_without_properties_only() -> None:
    plain = publish("t", level=V5, packet_id=1)
    with_alias = encode(Publish("t", b"x", 1, False, False, 2, Properties(topic_alias=1)), V5)
    items = assert_same(V5, plain + plain + with_alias + plain)
    assert [type(i) for i in items] == [PublishRun, Publish, PublishRun]
    assert len(items[0].messages) == 2  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (raw_publish(0x38, b"\x00\x01a"), MalformedPacket),  # DUP with QoS 0
        (raw_publish(0x36, b"\x00\x01a\x00\x01"), MalformedPacket),  # QoS 3
        (raw_publish(0x32, b"\x00\x01a\x00\x00x"), ProtocolError),  # packet id 0
        (raw_publish(0x32, b"\x00\x01a\x00"), MalformedPacket),  # truncated packet id
        (raw_publish(0x32, b"\x00\x05a"), MalformedPacket),  # topic past the packet
        (raw_publish(0x32, b"\x00"), MalformedPacket),  # truncated topic length
        (raw_publish(0x32, b"\x00\x00\x00\x01"), TopicNameInvalid),  # empty topic
        (raw_publish(0x32, b"\x00\x01+\x00\x01"), TopicNameInvalid),  # wildcard
        (raw_publish(0x32, b"\x00\x01#\x00\x01"), TopicNameInvalid),
        (raw_publish(0x32, b"\x00\x02\xc3\x28\x00\x01"), MalformedPacket),  # bad UTF-8
        (raw_publish(0x32, b"\x00\x03\xed\xa0\x80\x00\x01"), MalformedPacket),  # surrogate
        (raw_publish(0x32, b"\x00\x02\xc0\x80\x00\x01"), MalformedPacket),  # overlong NUL
        (raw_publish(0x32, b"\x00\x01\x00\x00\x01"), MalformedPacket),  # U+0000
        (b"\x32\x80\x00", MalformedPacket),  # remaining length not in its shortest form
        (b"\x32\xff\xff\xff\xff\x01", MalformedPacket),  # five length bytes
        (raw_publish(0x32, b"\x00\x01a\x00\x01" + b"x" * 100), PacketTooLarge),
    ],
)
def test_malformed_publishes_get_the_decoders_error(data: bytes, error: type) -> None:
    good = publish("a", packet_id=9)
    items, found = by_runs(V311, [good + data + good], bytes_max=64)
    assert found is error
    assert expanded(items) == [Publish("a", b"x", 1, False, False, 9)]
    assert_same(V311, good + data + good, bytes_max=64)


def test_too_many_levels_go_to_the_decoder() -> None:
    topic = "/".join(["l"] * 129).encode()  # 128 separators: the encoder refuses it
    body = struct.pack(">H", len(topic)) + topic + b"\x00\x01x"
    too_deep = bytes((0x32, len(body) & 0x7F | 0x80, len(body) >> 7)) + body
    data = publish("a") + too_deep + publish("a")
    items, error = by_runs(V311, [data])
    assert error is TopicNameInvalid
    assert len(items) == 1
    assert_same(V311, publish("/".join(["l"] * 128)))  # 127 separators: a run


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"\x00\x01a\x00\x01", MalformedPacket),  # no property length at all
        (b"\x00\x01a\x00\x01\x80\x00x", MalformedPacket),  # length 0 not in shortest form
        (b"\x00\x01a\x00\x01\x03\x23\x00\x00x", TopicAliasInvalid),  # topic alias 0
    ],
)
def test_mqtt5_malformed_properties_get_the_decoders_error(body: bytes, error: type) -> None:
    items, found = by_runs(V5, [publish("a", level=V5) + raw_publish(0x32, body)])
    assert found is error
    assert len(items) == 1


def test_a_truncated_publish_waits_for_its_bytes() -> None:
    data = publish("topic", b"payload", packet_id=3)
    decoder = Decoder(V311, BYTES_MAX)
    decoder.push(data[:-1])
    assert decoder.pop(FORM) is None
    assert decoder.buffered == len(data) - 1
    decoder.push(data[-1:])
    run = decoder.pop(FORM)
    assert isinstance(run, PublishRun) and run.packets() == Decoder(V311).feed(data)
    assert decoder.pop(FORM) is None and decoder.buffered == 0


def test_a_run_stops_at_its_maximum() -> None:
    data = publish("t") * (RUN_MESSAGES_MAX + 5)
    items = assert_same(V311, data)
    assert [len(i.messages) for i in items if isinstance(i, PublishRun)] == [RUN_MESSAGES_MAX, 5]


def test_before_connect_nothing_is_a_run() -> None:
    decoder = Decoder(None, BYTES_MAX)
    decoder.push(publish("t"))
    with pytest.raises(ProtocolError):
        decoder.pop(FORM)


def test_scanner_refuses_bad_arguments() -> None:
    scan = _scan.scan_publishes
    data = bytearray(publish("t"))
    with pytest.raises(ValueError, match="past the end"):
        scan(data, len(data) + 1, False, 100, 1, FORM.properties, "", str)
    with pytest.raises(ValueError, match="count_max"):
        scan(data, 0, False, 100, 0, FORM.properties, "", str)
    with pytest.raises(ValueError, match="position"):
        scan(data, -1, False, 100, 1, FORM.properties, "", str)
    with pytest.raises(TypeError):
        scan(data, 0, False, 100, 1, (b"", b""), "", str)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        scan(data, 0, False, 100, 1, ("", "", "", ""), "", str)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        scan("text", 0, False, 100, 1, FORM.properties, "", str)  # type: ignore[arg-type]
    assert scan(data, len(data), False, 100, 1, FORM.properties, "", str)[3] == []

    def fails(topic: str) -> str:
        raise RuntimeError(topic)

    with pytest.raises(RuntimeError, match=r"^t$"):
        scan(data, 0, False, 100, 1, FORM.properties, "", fails)


def test_run_form_gives_the_properties_a_single_publish_is_stored_with() -> None:
    for publisher in (None, "client-1"):
        form = broker_side.run_form(publisher)
        for qos, dup in ((0, False), (1, False), (1, True)):
            expected = message_properties.to_amqp(qos, dup, NO_PROPERTIES, publisher=publisher)
            assert form.properties[qos << 1 | dup] == expected
        assert form.routing_key_of("a/b.c") == mapping.to_routing_key("a/b.c")


_PACKET = st.one_of(
    st.builds(
        lambda t, p, q, i, d: publish(t, p, q, i, dup=d and q > 0),
        st.sampled_from(["a", "a/b", "é/€"]) | topic_names,
        payloads,
        st.integers(0, 2),
        st.integers(1, 0xFFFF),
        st.booleans(),
    ),
    st.binary(max_size=12),
    st.just(b"\xc0\x00"),  # PINGREQ
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PACKET, max_size=12), st.integers(1, 40), st.sampled_from([V311, V5]))
def test_runs_and_the_decoder_agree(parts: list[bytes], step: int, level: ProtocolLevel) -> None:
    data = b"".join(parts)
    items, error = by_runs(level, [data[i : i + step] for i in range(0, len(data), step)], 256)
    assert (expanded(items), error) == by_decoder(level, [data], 256)


def test_packet_id_is_read_big_endian() -> None:
    data = publish("t", packet_id=0x0102)
    [run] = assert_same(V311, data)
    assert isinstance(run, PublishRun)
    assert struct.unpack(">BBH", run.acks) == (0x40, 2, 0x0102)
