"""Run delivery (`streamq.broker.delivery`): the size of a consumer's turn among
several (`run_size`), and runs of a queue with per-message expirations, which end at the
first message that has expired. The vhost is driven directly with recording consumers
and its rounds (`drain`) run by hand."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from amqp_gateway.codec import BasicProperties, encode_properties
from amqp_gateway.deaths import AmqpPropertiesCodec
from streamq.broker.delivery import RUN_BACKLOG_MIN, RUN_MAX, RUN_TURN_MIN, run_size
from streamq.broker.queue import Queue
from streamq.broker.vhost import VHost
from streamq.log.syncer import Syncer
from tests.unit.broker.consumers import RecordingConsumer

PLAIN = encode_properties(BasicProperties())
EXPIRED = encode_properties(BasicProperties(expiration="1"))
LATER = encode_properties(BasicProperties(expiration="600000"))


def test_one_each_under_the_backlog_minimum() -> None:
    assert run_size(RUN_BACKLOG_MIN - 1, 2, 1000, 4096) == 1


def test_a_turn_takes_at_least_the_turn_minimum_past_the_backlog_minimum() -> None:
    assert run_size(RUN_BACKLOG_MIN, 64, 1000, 4096) == RUN_TURN_MIN
    assert run_size(RUN_BACKLOG_MIN, 64, 5, 4096) == 5  # credit still bounds it


def test_a_run_is_the_share_of_the_backlog() -> None:
    assert run_size(400, 4, 1000, 4096) == 100


def test_a_run_is_capped_by_run_max_credit_and_budget() -> None:
    assert run_size(100_000, 4, 1000, 4096) == RUN_MAX
    assert run_size(100_000, 4, 7, 4096) == 7
    assert run_size(100_000, 4, 1000, 3) == 3


def test_a_consumer_alone_in_the_turns_takes_what_its_credit_allows() -> None:
    assert run_size(10, 1, 1000, 4096) == 1000
    assert run_size(10, 1, 5, 4096) == 5


@pytest.fixture
def vhost(tmp_path: Path):  # type: ignore[no-untyped-def]
    host = VHost("/", str(tmp_path), Syncer())
    host.properties_codec = AmqpPropertiesCodec()
    yield host
    host.close()


def declare(vhost: VHost, **arguments: object) -> Queue:
    vhost.declare_queue("dlq", False, True, False, False, {}, owner=None)
    dead = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq", **arguments}
    return vhost.declare_queue("q", False, True, False, False, dead, owner=None)


def publish(vhost: VHost, body: bytes, properties: bytes) -> None:
    vhost.publish("", "q", properties, body, vhost.route("", "q", None))


@pytest.mark.parametrize("queue_ttl", [None, 600_000])
def test_runs_of_an_expiring_backlog_stop_before_each_expired_message(
    vhost: VHost, queue_ttl: int | None
) -> None:
    arguments = {} if queue_ttl is None else {"x-message-ttl": queue_ttl}
    queue = declare(vhost, **arguments)
    kinds = [EXPIRED if n % 7 == 3 else LATER if n % 2 else PLAIN for n in range(300)]
    for n, properties in enumerate(kinds):
        publish(vhost, b"%d" % n, properties)
    time.sleep(0.01)  # the expirations of 1 ms pass
    consumer = RecordingConsumer(0)
    vhost.add_consumer(queue, consumer)
    vhost.drain()
    live = [b"%d" % n for n, p in enumerate(kinds) if p is not EXPIRED]
    assert consumer.bodies == live
    # Runs, each ending before an expired message; the one after it goes singly, with
    # the expired one dead-lettered on the way (`VHost.take`): 0-2, 4, 5-9, 11, 12-16...
    assert consumer.runs[:3] == [3, 5, 5]
    assert max(consumer.runs) == 5
    assert consumer.received and not any(m.redelivered for m in consumer.received)
    assert vhost.queues["dlq"].message_count == len(kinds) - len(live)
    assert queue.message_count == 0
