"""MethodMemo: a payload seen before decodes to what the decoder gives, never shared."""

from __future__ import annotations

from decimal import Decimal

import pytest

from amqp_gateway.codec import method_frame
from amqp_gateway.codec import methods as m
from amqp_gateway.codec.method_memo import MEMO_ENTRIES_MAX, MEMO_PAYLOAD_MAX, MethodMemo
from amqp_gateway.errors import AMQPSyntaxError

KOMBU_REDECLARE = m.QueueDeclare(
    queue="celery-reply-9f0c2a51",
    durable=False,
    auto_delete=True,
    arguments={"x-expires": 86400000, "x-queue-mode": "lazy", "flag": True, "d": Decimal("1.5")},
)


def payload_of(method: m.Method) -> bytes:
    return method_frame.encode_method_payload(method)


def test_a_payload_sent_again_decodes_to_the_same_method_with_a_table_of_its_own() -> None:
    memo = MethodMemo()
    payload = payload_of(KOMBU_REDECLARE)
    first = memo.decode(payload)
    first.arguments["x-expires"] = 1  # a handler that keeps and changes the table
    second = memo.decode(bytes(payload))
    third = memo.decode(payload)
    assert first is not second
    assert second == third == method_frame.decode_method(payload) == KOMBU_REDECLARE
    assert second.arguments is not third.arguments


def test_a_table_holding_tables_or_arrays_is_never_shared() -> None:
    declare = m.QueueDeclare(queue="q", arguments={"nested": {"a": 1}, "list": [1, 2]})
    memo = MethodMemo()
    payload = payload_of(declare)
    first = memo.decode(payload)
    assert isinstance(first, m.QueueDeclare)
    nested = first.arguments["nested"]
    assert isinstance(nested, dict)
    nested["a"] = 2
    assert memo.decode(payload) == declare


def test_methods_without_tables_and_without_fields_decode_as_the_decoder_does() -> None:
    memo = MethodMemo()
    for method in (m.BasicQos(prefetch_count=4), m.ChannelFlowOk(active=True), m.TxSelect()):
        payload = payload_of(method)
        assert memo.decode(payload) == memo.decode(payload) == method


def test_a_payload_that_does_not_decode_raises_every_time() -> None:
    memo = MethodMemo()
    payload = payload_of(KOMBU_REDECLARE) + b"\x00"  # a byte after the fields
    for _ in range(3):
        with pytest.raises(AMQPSyntaxError, match="1 bytes after the fields"):
            memo.decode(payload)


def test_the_memo_stays_within_its_bounds_and_keeps_decoding() -> None:
    memo = MethodMemo()
    declares = [m.QueueDeclare(queue=f"q{n}", arguments={"n": n}) for n in range(40)]
    for _ in range(2):
        for declare in declares:
            assert memo.decode(payload_of(declare)) == declare
            assert len(memo._kept or {}) <= MEMO_ENTRIES_MAX
    large = m.QueueDeclare(queue="q" * 200, arguments={"k": "v" * 100})
    assert len(payload_of(large)) > MEMO_PAYLOAD_MAX
    assert memo.decode(payload_of(large)) == large
    assert payload_of(large) not in (memo._kept or {})
