"""Topic routing as RabbitMQ 3.10 does it (rabbit_exchange_type_topic).

A routing or binding key is split on every "." with empty words kept, except that the
empty key is zero words (split_topic_key/1): "a." is the two words "a" and "", "." is
two empty words, "" is none. `*` matches exactly one word, the empty word included; `#`
matches zero or more. So the empty routing key reaches `#` and the empty binding key,
never `*`.

The first table is RabbitMQ's own (deps/rabbit/test/unit_access_control_SUITE.erl,
topic_matching1, v3.10.25): its bindings and, per routing key, the queues it expects.
The second covers empty words, derived from split_topic_key/1 and trie_match/4."""

from __future__ import annotations

import pytest

from streamq.broker.exchange import Destination, Exchange, topic_match, topic_words

RABBITMQ_BINDINGS = {
    "t1": "a.b.c",
    "t2": "a.*.c",
    "t3": "a.#.b",
    "t4": "a.b.b.c",
    "t5": "#",
    "t6": "#.#",
    "t7": "#.b",
    "t8": "*.*",
    "t9": "a.*",
    "t10": "*.b.c",
    "t11": "a.#",
    "t12": "a.#.#",
    "t13": "b.b.c",
    "t14": "a.b.b",
    "t15": "a.b",
    "t16": "b.c",
    "t17": "",
    "t18": "*.*.*",
    "t19": "vodka.martini",
    "t20": "a.b.c",
    "t21": "*.#",
    "t22": "#.*.#",
    "t23": "*.#.#",
    "t24": "#.#.#",
    "t25": "*",
    "t26": "#.b.#",
}

RABBITMQ_EXPECTED = {
    "a.b.c": "t1 t2 t5 t6 t10 t11 t12 t18 t20 t21 t22 t23 t24 t26",
    "a.b": "t3 t5 t6 t7 t8 t9 t11 t12 t15 t21 t22 t23 t24 t26",
    "a.b.b": "t3 t5 t6 t7 t11 t12 t14 t18 t21 t22 t23 t24 t26",
    "": "t5 t6 t17 t24",
    "b.c.c": "t5 t6 t18 t21 t22 t23 t24 t26",
    "a.a.a.a.a": "t5 t6 t11 t12 t21 t22 t23 t24",
    "vodka.gin": "t5 t6 t8 t21 t22 t23 t24",
    "vodka.martini": "t5 t6 t8 t19 t21 t22 t23 t24",
    "b.b.c": "t5 t6 t10 t13 t18 t21 t22 t23 t24 t26",
    "nothing.here.at.all": "t5 t6 t21 t22 t23 t24",
    "oneword": "t5 t6 t21 t22 t23 t24 t25",
}


@pytest.fixture(scope="module")
def rabbitmq_exchange() -> Exchange:
    exchange = Exchange("topic_matching-exchange", "topic", False, False, False, {})
    for queue, key in RABBITMQ_BINDINGS.items():
        exchange.bind(Destination("queue", queue), key, {})
    return exchange


@pytest.mark.parametrize(("routing_key", "expected"), RABBITMQ_EXPECTED.items())
def test_rabbitmqs_own_topic_table(
    rabbitmq_exchange: Exchange, routing_key: str, expected: str
) -> None:
    out: set[Destination] = set()
    rabbitmq_exchange.route(routing_key, None, out)
    assert sorted(d.name for d in out) == sorted(expected.split())


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("", []),
        ("a", ["a"]),
        ("a.b", ["a", "b"]),
        ("a.", ["a", ""]),
        (".a", ["", "a"]),
        (".", ["", ""]),
        ("a..b", ["a", "", "b"]),
        ("..", ["", "", ""]),
    ],
)
def test_keys_split_as_rabbitmq_splits_them(key: str, words: list[str]) -> None:
    assert topic_words(key) == words


@pytest.mark.parametrize(
    ("binding", "routing_key", "matches"),
    [
        # The empty routing key is zero words.
        ("#", "", True),
        ("#.#", "", True),
        ("", "", True),
        ("*", "", False),
        ("*.#", "", False),
        ("#.*", "", False),
        (".", "", False),
        # The empty binding key matches the empty routing key alone.
        ("", ".", False),
        ("", "a", False),
        # Empty words are words: `*` matches one, a literal empty word matches one.
        ("*", ".", False),
        ("*.*", ".", True),
        (".", ".", True),
        ("a.*", "a.", True),
        ("a", "a.", False),
        ("a.", "a.", True),
        ("a.", "a", False),
        ("#.", "a.", True),
        ("#.", "", False),
        ("*.a", ".a", True),
        ("a..b", "a..b", True),
        ("a.*.b", "a..b", True),
        ("a.#.b", "a..b", True),
        ("a.b", "a..b", False),
        ("*.*", "a..", False),
        ("*.*.*", "a..", True),
        ("#", "..", True),
        # Ordinary words, for contrast.
        ("a.#", "a", True),
        ("#.b", "b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
    ],
)
def test_topic_matching_with_empty_words(binding: str, routing_key: str, matches: bool) -> None:
    assert topic_match(topic_words(binding), topic_words(routing_key)) is matches
    exchange = Exchange("t", "topic", False, False, False, {})
    exchange.bind(Destination("queue", "q"), binding, {})
    out: set[Destination] = set()
    exchange.route(routing_key, None, out)
    assert bool(out) is matches
