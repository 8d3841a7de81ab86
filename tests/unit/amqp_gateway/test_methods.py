"""Method frames: every method of the spec table round-trips through our codec, agrees
with pamqp in both directions, and every kind of malformed payload raises the typed
error RabbitMQ-compatible clients expect; methods.py is what the generator produces."""

from __future__ import annotations

import importlib.util
import struct
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import frame as pamqp_frame

from amqp_gateway.codec import spec
from amqp_gateway.codec.frame import FRAME_METHOD, split_frames
from amqp_gateway.codec.ids import ChannelId, DeliveryTag
from amqp_gateway.codec.method_frame import (
    _PLANS,
    _read_fields,
    decode_method,
    encode_method_frame,
    encode_method_payload,
)
from amqp_gateway.codec.methods import (
    METHOD_TYPES,
    BasicAck,
    BasicPublish,
    BasicQos,
    ExchangeDeclare,
    Method,
    QueueDeclare,
)
from amqp_gateway.errors import AMQPNotImplemented, AMQPSyntaxError, FrameError

from .strategies import (
    methods_of,
    normalize_pamqp_field,
    pamqp_class,
    pamqp_method,
    pamqp_methods_of,
    pamqp_name,
    to_pamqp,
)

ROOT = Path(__file__).resolve().parents[3]
ALL_METHODS = sorted(METHOD_TYPES.values(), key=lambda cls: (cls.CLASS_ID, cls.METHOD_ID))
PAMQP_METHODS = [cls for cls in ALL_METHODS if cls.CLASS_ID != 30]  # pamqp has no access class
per_method = settings(max_examples=10, suppress_health_check=[HealthCheck.too_slow])
# pamqp warns when it builds basic.recover-async, deprecated in 0-9-1; we still speak it.
pamqp_deprecations = pytest.mark.filterwarnings(
    "ignore:This command is deprecated:DeprecationWarning"
)


def load_generator() -> Any:
    module_spec = importlib.util.spec_from_file_location(
        "gen_amqp_methods", ROOT / "tools" / "gen_amqp_methods.py"
    )
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    return module


def test_methods_py_is_what_the_generator_writes() -> None:
    generator = load_generator()
    assert generator.OUTPUT_PATH.read_text(encoding="utf-8") == generator.render()
    assert generator.main(["--check"]) == 0


def test_the_spec_table_has_every_rabbitmq_method() -> None:
    names = {m.full_name for m in spec.METHODS.values()}
    assert len(spec.METHODS) == 66
    assert {c.name: c.class_id for c in spec.CLASSES} == {
        "connection": 10, "channel": 20, "access": 30, "exchange": 40,
        "queue": 50, "basic": 60, "tx": 90, "confirm": 85,
    }  # fmt: skip
    extensions = {
        "exchange.bind", "exchange.unbind", "basic.nack", "confirm.select",
        "connection.blocked", "connection.unblocked", "connection.update-secret",
    }  # fmt: skip
    assert extensions <= names
    assert spec.METHODS[40, 51].full_name == "exchange.unbind-ok"
    assert (40, 41) not in spec.METHODS
    assert {m.full_name for m in spec.METHODS.values() if m.content} == {
        "basic.publish", "basic.return", "basic.deliver", "basic.get-ok",
    }  # fmt: skip
    for method in spec.METHODS.values():
        for response in method.responses:
            assert any(
                m.spec_name == response and m.class_id == method.class_id
                for m in spec.METHODS.values()
            )


def test_dataclasses_follow_the_spec_field_order_and_defaults() -> None:
    for key, cls in METHOD_TYPES.items():
        assert key == (cls.CLASS_ID, cls.METHOD_ID)
        assert [f.name for f in fields(cls)] == [f.name for f in spec.METHODS[key].fields]
    assert BasicQos().global_ is False
    assert ExchangeDeclare().type == "direct"
    assert QueueDeclare(queue="q").arguments == {}


@pytest.mark.parametrize("cls", ALL_METHODS, ids=lambda cls: cls.NAME)
@per_method
@given(data=st.data())
def test_every_method_round_trips(cls: type[Method], data: st.DataObject) -> None:
    method = data.draw(methods_of(cls))
    frame = encode_method_frame(ChannelId(3), method)
    frames, consumed = split_frames(frame, 1 << 20)
    assert consumed == len(frame)
    assert [(f.frame_type, f.channel) for f in frames] == [(FRAME_METHOD, 3)]
    decoded = decode_method(frames[0].payload)
    assert type(decoded) is cls
    assert decoded == method
    assert encode_method_payload(decoded) == frames[0].payload


@pytest.mark.parametrize("cls", PAMQP_METHODS, ids=lambda cls: cls.NAME)
@pamqp_deprecations
@per_method
@given(data=st.data())
def test_pamqp_decodes_every_method_we_encode(cls: type[Method], data: st.DataObject) -> None:
    method = data.draw(methods_of(cls, pamqp_decodable=True))
    _, channel, decoded = pamqp_frame.unmarshal(encode_method_frame(ChannelId(9), method))
    assert channel == 9
    assert type(decoded) is pamqp_class(cls)
    for f in cls.SPEC.fields:
        expected = getattr(method, f.name)
        actual = getattr(decoded, pamqp_name(f.name))
        if f.kind is spec.Kind.LONGSTR:
            actual = normalize_pamqp_field(actual)
        assert actual == (to_pamqp(expected) if isinstance(expected, dict) else expected), f.name


@pytest.mark.parametrize("cls", PAMQP_METHODS, ids=lambda cls: cls.NAME)
@pamqp_deprecations
@per_method
@given(data=st.data())
def test_we_decode_every_method_pamqp_encodes(cls: type[Method], data: st.DataObject) -> None:
    method = data.draw(pamqp_methods_of(cls))
    wire = pamqp_frame.marshal(pamqp_method(method), 5)
    frames, _ = split_frames(wire, 1 << 20)
    assert [(f.frame_type, f.channel) for f in frames] == [(FRAME_METHOD, 5)]
    assert decode_method(frames[0].payload) == method


@given(methods_of(BasicPublish))
def test_the_publish_fast_path_agrees_with_the_generic_reader(method: Method) -> None:
    payload = encode_method_payload(method)
    values, offset = _read_fields(_PLANS[60, 40], payload)
    assert offset == len(payload)
    assert decode_method(payload) == BasicPublish(*values) == method


@given(st.integers(0, 2**64 - 1), st.booleans())
def test_the_ack_fast_path_agrees_with_the_generic_reader(tag: int, multiple: bool) -> None:
    payload = encode_method_payload(BasicAck(DeliveryTag(tag), multiple))
    values, _ = _read_fields(_PLANS[60, 80], payload)
    assert decode_method(payload) == BasicAck(*values) == BasicAck(DeliveryTag(tag), multiple)


def test_bits_pack_from_the_least_significant_bit() -> None:
    payload = encode_method_payload(QueueDeclare(queue="q", durable=True, nowait=True))
    assert payload == b"\x00\x32\x00\x0a" + b"\x00\x00" + b"\x01q" + bytes([0b10010]) + b"\x00" * 4
    publish = encode_method_payload(BasicPublish(exchange="e", routing_key="r", immediate=True))
    assert publish == b"\x00\x3c\x00\x28\x00\x00\x01e\x01r\x02"


def sample(cls: type[Method]) -> Method:
    """An instance with every field set to something non-empty."""
    values: dict[str, object] = {}
    for f in cls.SPEC.fields:
        values[f.name] = {
            spec.Kind.BIT: True,
            spec.Kind.OCTET: 7,
            spec.Kind.SHORT: 513,
            spec.Kind.LONG: 70000,
            spec.Kind.LONGLONG: 2**40,
            spec.Kind.TIMESTAMP: 2**40,
            spec.Kind.SHORTSTR: "name",
            spec.Kind.LONGSTR: b"secret",
            spec.Kind.TABLE: {"x-max-length": 10, "nested": {"a": [1, "b"]}},
        }[f.kind]
    return cls(**values)  # type: ignore[call-arg]


@pytest.mark.parametrize("cls", ALL_METHODS, ids=lambda cls: cls.NAME)
def test_every_truncation_of_a_method_payload_is_rejected(cls: type[Method]) -> None:
    payload = encode_method_payload(sample(cls))
    for cut in range(len(payload)):
        expected = FrameError if cut < 4 else AMQPSyntaxError
        with pytest.raises(expected) as caught:
            decode_method(payload[:cut])
        if expected is AMQPSyntaxError:
            assert (caught.value.class_id, caught.value.method_id) == (cls.CLASS_ID, cls.METHOD_ID)


@pytest.mark.parametrize("cls", ALL_METHODS, ids=lambda cls: cls.NAME)
def test_trailing_bytes_after_a_method_are_rejected(cls: type[Method]) -> None:
    payload = encode_method_payload(sample(cls))
    with pytest.raises(AMQPSyntaxError, match=r"bytes after the fields") as caught:
        decode_method(payload + b"\x00")
    assert caught.value.reply_code == 502
    assert (caught.value.class_id, caught.value.method_id) == (cls.CLASS_ID, cls.METHOD_ID)


@pytest.mark.parametrize(
    ("class_id", "method_id"), [(60, 200), (60, 41), (40, 41), (99, 10), (0, 0), (65535, 65535)]
)
def test_unknown_methods_are_not_implemented_540(class_id: int, method_id: int) -> None:
    with pytest.raises(
        AMQPNotImplemented, match=f"unknown method {class_id}.{method_id}"
    ) as caught:
        decode_method(struct.pack(">HH", class_id, method_id) + b"\x00" * 8)
    assert caught.value.reply_code == 540
    assert (caught.value.class_id, caught.value.method_id) == (class_id, method_id)


def test_malformed_method_fields_are_syntax_errors() -> None:
    declare = encode_method_payload(QueueDeclare(queue="q", arguments={"k": 1}))
    bad_tag = declare.replace(b"\x01kI", b"\x01kZ")
    with pytest.raises(AMQPSyntaxError, match=r"queue\.declare: unknown field value type 'Z'"):
        decode_method(bad_tag)
    short_table = declare[:9] + struct.pack(">I", 3) + declare[13:]
    with pytest.raises(AMQPSyntaxError, match=r"queue\.declare: field table entries overrun"):
        decode_method(short_table)
    long_table = declare[:9] + struct.pack(">I", 99) + declare[13:]
    with pytest.raises(AMQPSyntaxError, match=r"queue\.declare: field table length runs past"):
        decode_method(long_table)
    bad_utf8 = encode_method_payload(QueueDeclare(queue="qq")).replace(b"\x02qq", b"\x02\xff\xfe")
    with pytest.raises(AMQPSyntaxError, match=r"queue\.declare: truncated or invalid"):
        decode_method(bad_utf8)
    bad_publish = encode_method_payload(BasicPublish(exchange="ex")).replace(
        b"\x02ex", b"\x02\xc3("
    )
    with pytest.raises(AMQPSyntaxError, match=r"basic\.publish: truncated or invalid"):
        decode_method(bad_publish)


def test_values_the_wire_cannot_carry_are_programmer_errors() -> None:
    with pytest.raises(ValueError, match="exceeds 255"):
        encode_method_payload(QueueDeclare(queue="q" * 256))
    with pytest.raises(ValueError, match=r"basic\.qos: cannot encode"):
        encode_method_payload(BasicQos(prefetch_count=70000))
    with pytest.raises(ValueError, match="cannot encode"):
        encode_method_payload(BasicAck(DeliveryTag(-1)))
