"""At-least-once dead letters held by a vhost (`streamq.broker.dead_letters`), driven
without sockets: a backlog behind a full target moves in order, at most
SENDS_PER_TICK_MAX attempts per tick, each released only once its copy is durable;
a queue that is deleted, or leaves at-least-once, lets go of what it held."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqp_gateway.codec import BasicProperties, encode_properties
from amqp_gateway.deaths import AmqpPropertiesCodec
from streamq.broker.dead_letters import (
    HOLDS_PER_EXPIRY_MAX,
    RETRY_INTERVAL_MS,
    SENDS_PER_TICK_MAX,
)
from streamq.broker.queue import Queue
from streamq.broker.vhost import VHost
from streamq.log.syncer import Syncer

PLAIN = encode_properties(BasicProperties())
AT_LEAST_ONCE = {
    "x-queue-type": "quorum",
    "x-dead-letter-exchange": "",
    "x-dead-letter-routing-key": "target",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
}
FULL = {"pattern": "^target$", "definition": {"max-length": 0, "overflow": "reject-publish"}}


@pytest.fixture
def host(tmp_path: Path) -> Iterator[VHost]:
    vhost = VHost("/", str(tmp_path / "vh"), Syncer())
    vhost.properties_codec = AmqpPropertiesCodec()
    yield vhost
    vhost.close()


def now_ms() -> int:
    return int(time.time() * 1000)


def reject_all(host: VHost, source: Queue, count: int) -> None:
    """Publish `count` messages to `source` and reject each (at the clock's time)."""
    for n in range(count):
        host.publish("", source.name, PLAIN, b"%d" % n, [source], 1_000)
    for _ in range(count):
        taken = host.get(source, 1_000)
        assert taken is not None
        host.reject(source, taken[0].offset)


def bodies(host: VHost, queue: Queue) -> list[bytes]:
    got = []
    while (taken := host.get(queue, 0)) is not None:
        got.append(taken[1].body)
        host.settle(queue, taken[0].offset)
    return got


def test_a_backlog_moves_in_order_in_bounded_ticks_once_durable(host: VHost) -> None:
    count = SENDS_PER_TICK_MAX * 2 + 10
    host.set_policy("full", FULL, operator=False)
    target = host.declare_queue("target", False, True, False, False, {}, owner=None)
    source = host.declare_queue("source", False, True, False, False, AT_LEAST_ONCE, owner=None)
    reject_all(host, source, count)
    assert len(source.cursor.dead) == count and source.cursor.message_count == 0
    assert target.cursor.message_count == 0
    host.clear_policy("full", operator=False)  # room in the target now
    now = now_ms() + RETRY_INTERVAL_MS
    assert host.dead_letters.tick(now) == 0
    assert target.cursor.message_count == SENDS_PER_TICK_MAX  # one tick's attempts
    assert len(source.cursor.dead) == count  # not durable yet: still held
    host.log.sync_blocking()
    assert host.dead_letters.tick(now) == SENDS_PER_TICK_MAX
    for _ in range(3):
        host.dead_letters.tick(now)
        host.log.sync_blocking()
    host.dead_letters.tick(now)
    assert not source.cursor.dead and not host.dead_letters.held
    assert bodies(host, target) == [b"%d" % n for n in range(count)]


def test_nothing_is_sent_again_before_its_time(host: VHost) -> None:
    host.set_policy("full", FULL, operator=False)
    target = host.declare_queue("target", False, True, False, False, {}, owner=None)
    source = host.declare_queue("source", False, True, False, False, AT_LEAST_ONCE, owner=None)
    before = now_ms()
    reject_all(host, source, 3)
    after = now_ms()
    host.clear_policy("full", operator=False)
    host.dead_letters.tick(before + RETRY_INTERVAL_MS - 1)
    assert target.cursor.message_count == 0
    host.dead_letters.tick(after + RETRY_INTERVAL_MS)
    assert target.cursor.message_count == 3


def test_a_deleted_source_or_one_leaving_at_least_once_lets_go(host: VHost) -> None:
    host.set_policy("full", FULL, operator=False)
    host.declare_queue("target", False, True, False, False, {}, owner=None)
    source = host.declare_queue("source", False, True, False, False, AT_LEAST_ONCE, owner=None)
    by_policy = {k: v for k, v in AT_LEAST_ONCE.items() if k != "x-dead-letter-strategy"}
    other = host.declare_queue("other", False, True, False, False, by_policy, owner=None)
    strategy = {"pattern": "^other$", "definition": {"dead-letter-strategy": "at-least-once"}}
    host.set_policy("strategy", strategy, operator=False)
    reject_all(host, source, 2)
    reject_all(host, other, 3)
    assert host.dead_letters.count == 5 and len(other.cursor.dead) == 3
    host.delete_queue("source", False, False, owner=None)
    host.dead_letters.tick(0)
    assert host.dead_letters.count == 3
    strategy["definition"] = {"dead-letter-strategy": "at-most-once"}
    host.set_policy("strategy", strategy, operator=False)
    assert host.dead_letters.count == 0 and not other.cursor.dead
    assert other.cursor.low_water_offset() is None  # nothing of them is needed any more


def test_a_large_expired_head_is_held_over_several_passes(host: VHost) -> None:
    count = HOLDS_PER_EXPIRY_MAX * 2 + 5
    target = host.declare_queue("target", False, True, False, False, {}, owner=None)
    arguments = {**AT_LEAST_ONCE, "x-message-ttl": 0}
    source = host.declare_queue("source", False, True, False, False, arguments, owner=None)
    for n in range(count):
        host.publish("", "source", PLAIN, b"%d" % n, [source], 1_000)
    passes = []
    while source.cursor.message_count:
        passes.append(host.expire_head(source, 2_000))
    assert passes == [HOLDS_PER_EXPIRY_MAX, HOLDS_PER_EXPIRY_MAX, 5]
    host.log.sync_blocking()
    host.dead_letters.tick(2_000)
    assert not source.cursor.dead
    assert bodies(host, target) == [b"%d" % n for n in range(count)]
