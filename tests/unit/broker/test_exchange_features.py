"""Consistent hash rings, deduplication caches and delayed exchange declarations."""

from __future__ import annotations

import collections

import pytest

from streamq.broker.consistent_hash import HashRing, jump_hash, weight_of
from streamq.broker.dedup import Deduper, deduper_for
from streamq.broker.errors import CommandInvalid, PreconditionFailed
from streamq.broker.exchange import Destination, Exchange


def test_jump_hash_moves_few_keys_when_a_bucket_is_added() -> None:
    moved = sum(jump_hash(key * 7919, 10) != jump_hash(key * 7919, 11) for key in range(5000))
    assert 300 < moved < 700  # about 1/11 of the keys


def test_ring_weights_and_stability() -> None:
    ring = HashRing({})
    ring.rebuild([("a", 1), ("b", 4)])
    got = collections.Counter(ring.pick(f"k{n}", None, None) for n in range(5000))
    assert 800 < got["a"] < 1200
    assert ring.pick("same", None, None) == ring.pick("same", None, None)
    by_header = HashRing({"hash-header": "h"})
    by_header.rebuild([("a", 1), ("b", 1)])
    assert len({by_header.pick(str(n), {"h": "x"}, None) for n in range(50)}) == 1


def test_weights() -> None:
    assert weight_of("10") == 10
    with pytest.raises(PreconditionFailed, match="must be an integer"):
        weight_of("x")
    with pytest.raises(PreconditionFailed, match="greater than 0"):
        weight_of("-1")


def test_exchange_unbind_rebuilds_the_ring() -> None:
    exchange = Exchange("h", "x-consistent-hash", False, False, False, {})
    a, b = Destination("queue", "a"), Destination("queue", "b")
    exchange.bind(a, "1", {})
    exchange.bind(b, "1", {})
    exchange.unbind(a, "1", {})
    out: set[Destination] = set()
    for n in range(20):
        exchange.route(str(n), None, out)
    assert out == {b}


def test_delayed_exchange_declarations() -> None:
    exchange = Exchange("d", "x-delayed-message", True, False, False, {"x-delayed-type": "topic"})
    assert exchange.delayed and exchange.route_type == "topic" and exchange.reads_properties
    with pytest.raises(PreconditionFailed, match="must be an existing exchange type"):
        Exchange("d", "x-delayed-message", True, False, False, {})
    with pytest.raises(CommandInvalid, match="unknown exchange type 'nope'"):
        Exchange("d", "x-delayed-message", True, False, False, {"x-delayed-type": "nope"})
    plain = Exchange("p", "direct", True, False, False, {})
    assert not plain.reads_properties and plain.deduper is None


def test_deduper_size_ttl_and_keys() -> None:
    deduper = Deduper(2, 100, "id")
    assert not deduper.duplicate({"id": "a"}, 0)
    assert deduper.duplicate({"id": "a"}, 50)
    assert not deduper.duplicate({"id": "a"}, 100)  # expired: remembered again
    assert not deduper.duplicate({"id": ["x", {"y": 1}]}, 100)
    assert deduper.duplicate({"id": ["x", {"y": 1}]}, 100)
    assert not deduper.duplicate({"id": "c"}, 100)  # size 2: "a" goes
    assert not deduper.duplicate({"id": "a"}, 150)
    assert not deduper.duplicate(None, 0) and not deduper.duplicate({"other": 1}, 0)
    assert len(deduper) == 2


def test_deduper_for_arguments() -> None:
    assert deduper_for({}) is None
    assert deduper_for({"x-message-deduplication": False}) is None
    made = deduper_for({"x-message-deduplication": True})
    assert made is not None and made.size_max == 128 and made.ttl_ms is None
    assert made.header == "x-deduplication-header"
    with pytest.raises(PreconditionFailed, match="x-cache-size header not a Int"):
        deduper_for({"x-message-deduplication": True, "x-cache-size": 1.5})


def test_hash_bindings_keep_their_order_for_snapshots() -> None:
    exchange = Exchange("h", "x-consistent-hash", True, False, False, {})
    names = [f"q{n}" for n in range(30)]
    for name in names:
        exchange.bind(Destination("queue", name), "2", {})
    assert [b.destination.name for b in exchange.bindings_in_order()] == names
