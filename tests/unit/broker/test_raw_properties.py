"""Fields found in raw AMQP properties without decoding (streamq/broker/raw_properties.py):
for every combination of the fields before `priority` and `expiration`, the position
`field_position` gives is where the encoder put the field, and short bytes raise."""

from __future__ import annotations

import itertools

import pytest

from amqp_gateway.codec.properties import BasicProperties, encode_properties
from streamq.broker.expiration import expiration_ms
from streamq.broker.priority import message_priority
from streamq.broker.raw_properties import EXPIRATION_FLAG, PRIORITY_FLAG, field_position

BEFORE = {
    "content_type": "text/plain",
    "content_encoding": "gzip",
    "headers": {"a": 1, "bb": "two"},
    "delivery_mode": 2,
    "correlation_id": "c-17",
    "reply_to": "amq.rabbitmq.reply-to",
}


def combinations() -> list[dict[str, object]]:
    names = list(BEFORE)
    return [
        {name: BEFORE[name] for name, on in zip(names, mask, strict=True) if on}
        for mask in itertools.product((False, True), repeat=len(names))
    ]


@pytest.mark.parametrize("fields", combinations())
def test_priority_and_expiration_are_found_after_any_fields(fields: dict[str, object]) -> None:
    raw = encode_properties(BasicProperties(**fields, priority=7, expiration="60000"))  # type: ignore[arg-type]
    assert raw[field_position(raw, PRIORITY_FLAG)] == 7
    position = field_position(raw, EXPIRATION_FLAG)
    assert raw[position : position + 6] == b"\x0560000"
    assert message_priority(raw) == 7
    assert expiration_ms(raw) == 60000


def test_short_properties_raise_and_read_as_absent() -> None:
    raw = encode_properties(BasicProperties(headers={"a": 1}, priority=3, expiration="5"))
    cut = raw[: raw.index(b"\x015")]
    with pytest.raises(IndexError):
        cut[field_position(cut, EXPIRATION_FLAG)]
    assert expiration_ms(cut) is None
    assert message_priority(raw[:4]) == 0
