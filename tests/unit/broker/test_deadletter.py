"""TTL and dead-letter rules, and the x-death header the gateway writes."""

from __future__ import annotations

from amqp_gateway import codec
from amqp_gateway.deaths import AmqpPropertiesCodec
from streamq.broker.deadletter import Death, cycles, dead_letter_target, may_expire, ttl_of


def test_the_smaller_ttl_wins_and_arguments_win_for_the_dead_letter_target() -> None:
    assert ttl_of({"x-message-ttl": 500}, {"message-ttl": 200}) == 200
    assert ttl_of({}, {}) is None
    assert ttl_of({"x-message-ttl": True}, {}) is None  # not an integer
    assert dead_letter_target(
        {"x-dead-letter-exchange": "a"},
        {"dead-letter-exchange": "b", "dead-letter-routing-key": "k"},
    ) == ("a", "k")


def test_a_cycle_is_broken_only_by_a_rejection() -> None:
    assert cycles([("q2", "expired"), ("q1", "expired")], "q1")
    assert not cycles([("q2", "expired"), ("q1", "rejected")], "q1")
    assert not cycles([("q2", "rejected"), ("q1", "expired")], "q1")
    assert not cycles([("q2", "expired")], "q3")


def test_x_death_as_rabbitmq_writes_it() -> None:
    properties_codec = AmqpPropertiesCodec()
    raw = codec.encode_properties(codec.BasicProperties(expiration="100", headers={"a": 1}))
    assert may_expire(raw) and properties_codec.expiration_ms(raw) == 100
    once = properties_codec.with_death(raw, Death("q1", "expired", "ex", ("rk",), 1000))
    twice = properties_codec.with_death(once, Death("q2", "rejected", "", ("q2",), 1001))
    again = properties_codec.with_death(twice, Death("q1", "expired", "ex", ("rk",), 1002))
    properties = codec.decode_properties(again)
    assert properties.expiration is None and not may_expire(again)
    headers = properties.headers or {}
    deaths = headers["x-death"]
    assert isinstance(deaths, list)
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths if isinstance(d, dict)] == [
        ("q1", "expired", 2),
        ("q2", "rejected", 1),
    ]
    assert (headers["x-first-death-queue"], headers["x-first-death-reason"]) == ("q1", "expired")
    assert headers["a"] == 1
    assert properties_codec.deaths(again) == [("q1", "expired"), ("q2", "rejected")]
