"""The consumers' turns of a queue (`streamq.broker.turns`, `Queue.unblock`): RabbitMQ's
round robin, where a consumer found without credit is parked and rejoins the tail only
when its gateway reports credit that may have grown, so a delivery round never walks
the consumers without credit; and `x-priority` levels, each with turns of its own.

Method: a vhost driven directly with recording consumers (prefetch limits, acks by
hand: `settle` empties a consumer's unacked list and calls `Queue.unblock`, as the
gateway's release does), rounds run by hand with `drain`."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_gateway.codec import BasicProperties, encode_properties
from amqp_gateway.deaths import AmqpPropertiesCodec
from streamq.broker.queue import Queue
from streamq.broker.turns import Turns
from streamq.broker.vhost import VHost
from streamq.log.syncer import Syncer
from tests.unit.broker.consumers import RecordingConsumer

PLAIN = encode_properties(BasicProperties())


class CountingConsumer(RecordingConsumer):
    """Counts how often a round asks its credit."""

    def __init__(self, prefetch: int, tag: str, priority: int = 0) -> None:
        super().__init__(prefetch, tag)
        self.priority = priority
        self.credit_asked = 0

    def credit(self) -> int:
        self.credit_asked += 1
        return super().credit()


@pytest.fixture
def vhost(tmp_path: Path):  # type: ignore[no-untyped-def]
    host = VHost("/", str(tmp_path), Syncer())
    host.properties_codec = AmqpPropertiesCodec()
    yield host
    host.close()


def publish(vhost: VHost, queue: Queue, numbers: range) -> None:
    for n in numbers:
        vhost.publish("", queue.name, PLAIN, b"%d" % n, [queue])


def settle(vhost: VHost, queue: Queue, consumer: RecordingConsumer) -> None:
    """The consumer acks everything it holds; its gateway reports the credit and asks
    for a round."""
    consumer.unacked.clear()
    queue.unblock(consumer)
    vhost.kick(queue)


def test_turns_park_the_head_and_unblock_to_the_tail_in_unblock_order() -> None:
    a, b, c = (RecordingConsumer(1, tag) for tag in "abc")
    turns = Turns(0)
    for consumer in (a, b, c):
        turns.add(consumer)
    turns.park()
    turns.park()
    assert list(turns.active) == [c] and list(turns.parked) == [a, b] and len(turns) == 3
    turns.unblock(b)
    turns.unblock(b)  # not parked any more: nothing happens
    turns.unblock(c)  # never parked: nothing happens
    assert list(turns.active) == [c, b] and list(turns.parked) == [a]
    turns.remove(a)
    turns.remove(c)
    assert list(turns.active) == [b] and not turns.parked and len(turns) == 1
    turns.park()
    assert turns.parked_at(b) is not None and not turns.active
    turns.unblock(b)
    assert list(turns.active) == [b] and turns.parked_at(b) is None


def test_a_round_does_not_ask_parked_consumers_for_credit(vhost: VHost) -> None:
    queue = vhost.declare_queue("q", False, True, False, False, {}, owner=None)
    consumers = [CountingConsumer(1, f"c{n}") for n in range(64)]
    for consumer in consumers:
        vhost.add_consumer(queue, consumer)
    publish(vhost, queue, range(0, 200))
    vhost.drain()
    assert [len(c.bodies) for c in consumers] == [1] * 64
    asked = [c.credit_asked for c in consumers]
    publish(vhost, queue, range(200, 210))
    vhost.kick(queue)
    vhost.drain()  # every consumer is parked: none is asked
    assert [c.credit_asked for c in consumers] == asked
    settle(vhost, queue, consumers[5])
    vhost.drain()
    assert len(consumers[5].bodies) == 2
    assert [c.credit_asked for c in consumers[6:]] == asked[6:]


def test_a_consumer_given_credit_rejoins_after_those_still_taking_turns(vhost: VHost) -> None:
    queue = vhost.declare_queue("q", False, True, False, False, {}, owner=None)
    a, b, c = (RecordingConsumer(2, tag) for tag in "abc")
    for consumer in (a, b, c):
        vhost.add_consumer(queue, consumer)
    a.prefetch = 1
    publish(vhost, queue, range(0, 4))
    vhost.drain()  # one each (under RUN_BACKLOG_MIN), then b; a and c ...
    assert (a.bodies, b.bodies, c.bodies) == ([b"0"], [b"1", b"3"], [b"2"])
    settle(vhost, queue, a)  # a was parked at its second turn: it rejoins at the tail
    publish(vhost, queue, range(4, 7))
    vhost.kick(queue)
    vhost.drain()
    # c still had credit and its turn came first; b is out of credit; then a.
    assert c.bodies == [b"2", b"4"]
    assert a.bodies == [b"0", b"5"]
    assert queue.cursor.message_count == 1  # everyone is out of credit


def test_parked_consumers_come_back_in_the_order_their_credit_came(vhost: VHost) -> None:
    queue = vhost.declare_queue("q", False, True, False, False, {}, owner=None)
    a, b, c = (RecordingConsumer(1, tag) for tag in "abc")
    for consumer in (a, b, c):
        vhost.add_consumer(queue, consumer)
    publish(vhost, queue, range(0, 3))
    vhost.drain()
    publish(vhost, queue, range(3, 6))
    vhost.kick(queue)
    vhost.drain()  # all three parked, in turn order
    for consumer in (c, a, b):  # acks came from c, then a, then b (RabbitMQ's unblock)
        settle(vhost, queue, consumer)
    vhost.drain()
    assert [a.bodies[1], b.bodies[1], c.bodies[1]] == [b"4", b"5", b"3"]


def test_a_higher_priority_level_takes_turns_before_a_lower_one(vhost: VHost) -> None:
    queue = vhost.declare_queue("q", False, True, False, False, {}, owner=None)
    low = CountingConsumer(10, "low", priority=1)
    high = [CountingConsumer(2, f"high{n}", priority=5) for n in range(2)]
    for consumer in (low, *high):
        vhost.add_consumer(queue, consumer)
    assert [level.priority for level in queue.levels] == [5, 1]
    publish(vhost, queue, range(0, 6))
    vhost.drain()
    assert [h.bodies for h in high] == [[b"0", b"2"], [b"1", b"3"]]  # in turns, one each
    assert low.bodies == [b"4", b"5"]  # only once every higher one was out of credit
    settle(vhost, queue, high[1])
    publish(vhost, queue, range(6, 7))
    vhost.kick(queue)
    vhost.drain()
    assert high[1].bodies[-1] == b"6" and low.bodies == [b"4", b"5"]
    vhost.remove_consumer(queue, high[0])
    vhost.remove_consumer(queue, high[1])
    assert [level.priority for level in queue.levels] == [1]
    publish(vhost, queue, range(7, 8))
    vhost.kick(queue)
    vhost.drain()
    assert low.bodies[-1] == b"7"


def test_a_parked_consumer_that_leaves_is_out_of_the_turns(vhost: VHost) -> None:
    queue = vhost.declare_queue("q", False, True, False, False, {}, owner=None)
    a, b = RecordingConsumer(1, "a"), RecordingConsumer(1, "b")
    vhost.add_consumer(queue, a)
    vhost.add_consumer(queue, b)
    publish(vhost, queue, range(0, 3))
    vhost.drain()
    vhost.remove_consumer(queue, a)  # parked, with one unacked
    settle(vhost, queue, b)
    vhost.drain()
    assert b.bodies == [b"1", b"2"]
    [level] = queue.levels
    assert list(level.active) == [b] and not level.parked
