"""Several consumers of one queue, each on a connection of its own (as worker processes
are), with pika: a backlog goes out in runs, a run per consumer per turn, fair over any
window of the publish order; a small burst goes one message each in RabbitMQ's order;
consumer priorities, single active consumer, requeue order and TTLs (the queue's and
per-message expirations) are kept. The backlog is published in one transaction, so that
it reaches the queue at once (one delivery round sees all of it)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from streamq.broker.delivery import RUN_BACKLOG_MIN, RUN_MAX
from tests.integration.conftest import RunningBroker, dead_letter_setup

TIMEOUT_S = 20
QUEUE = "work"


class Worker:
    """A consumer on its own connection: what it got, in order, as (index, redelivered),
    the index being the body's number in publish order."""

    def __init__(
        self,
        broker: RunningBroker,
        queue: str,
        prefetch: int,
        *,
        ack: bool = True,
        arguments: dict[str, object] | None = None,
    ) -> None:
        self.connection = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
        )
        self.channel = self.connection.channel()
        self.channel.basic_qos(prefetch_count=prefetch)
        self.ack = ack
        self.got: list[tuple[int, bool]] = []
        self.tags: list[int] = []
        self.tag = self.channel.basic_consume(queue, self._on_message, arguments=arguments)

    def _on_message(
        self,
        channel: BlockingChannel,
        method: pika.spec.Basic.Deliver,
        _: pika.BasicProperties,
        body: bytes,
    ) -> None:
        self.got.append((int(body), bool(method.redelivered)))
        if self.ack:
            channel.basic_ack(method.delivery_tag)
        else:
            self.tags.append(method.delivery_tag)

    @property
    def indexes(self) -> list[int]:
        return [index for index, _ in self.got]

    def ack_held(self) -> None:
        for tag in self.tags:
            self.channel.basic_ack(tag)
        self.tags.clear()

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()


def publisher(broker: RunningBroker) -> tuple[pika.BlockingConnection, BlockingChannel]:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )
    return connection, connection.channel()


def publish_at_once(
    channel: BlockingChannel,
    queue: str,
    indexes: range,
    properties: Callable[[int], pika.BasicProperties | None] = lambda _: None,
) -> None:
    """Publish the numbers in `indexes` as bodies, in one transaction."""
    channel.tx_select()
    for index in indexes:
        channel.basic_publish("", queue, str(index).encode(), properties(index))
    channel.tx_commit()


def pump(workers: list[Worker], done: Callable[[], bool]) -> None:
    """Process every worker's events until `done`, then a little longer (nothing more
    must arrive); fails after TIMEOUT_S."""
    deadline = time.monotonic() + TIMEOUT_S
    while not done():
        assert time.monotonic() < deadline, [len(w.got) for w in workers]
        for worker in workers:
            worker.connection.process_data_events(time_limit=0.01)
    for worker in workers:
        worker.connection.process_data_events(time_limit=0.1)


def total(workers: list[Worker]) -> Callable[[], int]:
    return lambda: sum(len(w.got) for w in workers)


def longest_run(indexes: list[int]) -> int:
    """The longest stretch of consecutive numbers in `indexes`."""
    longest = current = 1
    for before, after in itertools.pairwise(indexes):
        current = current + 1 if after == before + 1 else 1
        longest = max(longest, current)
    return longest


@pytest.fixture
def queue(broker: RunningBroker) -> BlockingChannel:
    _, channel = publisher(broker)
    channel.queue_declare(QUEUE)
    return channel


@pytest.mark.parametrize("consumers", [4, 16])
def test_a_backlog_goes_out_in_runs_fair_over_every_window(
    broker: RunningBroker, queue: BlockingChannel, consumers: int
) -> None:
    count = 4000
    workers = [Worker(broker, QUEUE, 1000, ack=False) for _ in range(consumers)]
    publish_at_once(queue, QUEUE, range(count))
    pump(workers, lambda: total(workers)() == count)
    assert sorted(i for w in workers for i in w.indexes) == list(range(count))
    share = count / consumers
    for worker in workers:
        indexes = worker.indexes
        assert indexes == sorted(indexes)  # each consumer sees the queue's order
        assert abs(len(indexes) - share) <= RUN_MAX
        assert 1 < longest_run(indexes) <= RUN_MAX  # runs, none longer than the cap
        # Over every window of the publish order, each consumer had its share of it,
        # give or take a run.
        for end in range(100, count + 1, 100):
            below = sum(1 for i in indexes if i < end)
            assert abs(below - end / consumers) <= RUN_MAX, (end, below)
    for worker in workers:
        worker.close()


def test_a_small_burst_goes_one_message_each_in_turn(
    broker: RunningBroker, queue: BlockingChannel
) -> None:
    count = RUN_BACKLOG_MIN - 1
    workers = [Worker(broker, QUEUE, 1000, ack=False) for _ in range(3)]
    publish_at_once(queue, QUEUE, range(count))
    pump(workers, lambda: total(workers)() == count)
    for position, worker in enumerate(workers):
        assert worker.indexes == list(range(position, count, 3))
        worker.close()


def test_runs_are_sized_by_credit_and_acks_bring_the_rest(
    broker: RunningBroker, queue: BlockingChannel
) -> None:
    workers = [Worker(broker, QUEUE, 50, ack=False) for _ in range(4)]
    publish_at_once(queue, QUEUE, range(1000))
    pump(workers, lambda: total(workers)() == 200)
    assert [len(w.got) for w in workers] == [50, 50, 50, 50]
    for worker in workers:
        worker.ack = True
        worker.ack_held()
    pump(workers, lambda: total(workers)() == 1000)
    assert sorted(i for w in workers for i in w.indexes) == list(range(1000))
    for worker in workers:
        assert worker.indexes == sorted(worker.indexes)
        worker.close()


def test_prefetch_1_passes_over_a_busy_consumer(
    broker: RunningBroker, queue: BlockingChannel
) -> None:
    busy = Worker(broker, QUEUE, 1, ack=False)
    workers = [busy, *(Worker(broker, QUEUE, 1) for _ in range(3))]
    publish_at_once(queue, QUEUE, range(300))
    pump(workers, lambda: total(workers)() == 300)
    assert busy.indexes == [0]  # the work-queue tutorial's fair dispatch
    assert sorted(i for w in workers[1:] for i in w.indexes) == list(range(1, 300))
    for worker in workers:
        assert worker.indexes == sorted(worker.indexes)
        worker.close()


def test_consumer_priorities_hold_with_a_backlog(
    broker: RunningBroker, queue: BlockingChannel
) -> None:
    high = [Worker(broker, QUEUE, 100, ack=False, arguments={"x-priority": 5}) for _ in range(2)]
    low = [Worker(broker, QUEUE, 1000, ack=False) for _ in range(2)]
    workers = [*high, *low]
    publish_at_once(queue, QUEUE, range(1000))
    pump(workers, lambda: total(workers)() == 1000)
    # The higher ones fill their credit first, taking turns; the lower ones the rest.
    assert sorted(i for w in high for i in w.indexes) == list(range(200))
    assert [len(w.got) for w in high] == [100, 100]
    assert sorted(i for w in low for i in w.indexes) == list(range(200, 1000))
    for worker in workers:
        worker.close()


def test_single_active_consumer_takes_the_whole_backlog(broker: RunningBroker) -> None:
    _, channel = publisher(broker)
    channel.queue_declare("sac", arguments={"x-single-active-consumer": True})
    workers = [Worker(broker, "sac", 1000) for _ in range(3)]
    publish_at_once(channel, "sac", range(2000))
    pump(workers, lambda: total(workers)() == 2000)
    assert workers[0].indexes == list(range(2000))
    workers[0].close()
    publish_at_once(channel, "sac", range(2000, 2500))
    pump(workers[1:], lambda: total(workers[1:])() == 500)
    assert workers[1].indexes == list(range(2000, 2500))
    assert workers[2].got == []
    for worker in workers:
        worker.close()


def test_requeued_messages_go_first_in_order_then_the_rest(
    broker: RunningBroker, queue: BlockingChannel
) -> None:
    leaving = Worker(broker, QUEUE, 100, ack=False)
    staying = Worker(broker, QUEUE, 100, ack=False)
    workers = [leaving, staying]
    publish_at_once(queue, QUEUE, range(1000))
    pump(workers, lambda: total(workers)() == 200)
    held = leaving.indexes
    leaving.close()  # its 100 go back to the queue, ahead of the 800 never delivered
    staying.ack = True
    staying.ack_held()
    first = len(staying.got)
    pump([staying], lambda: len(staying.got) == 1000)
    after = staying.got[first:]
    assert after[: len(held)] == [(i, True) for i in held]
    rest = [i for i, redelivered in after[len(held) :] if not redelivered]
    assert rest == sorted(set(range(1000)) - set(held) - set(staying.indexes[:first]))
    staying.close()


def test_expired_messages_in_a_backlog_are_dead_lettered_not_delivered(
    broker: RunningBroker,
) -> None:
    _, channel = publisher(broker)
    dead_letter_setup(
        channel,
        "ttl",
        **{"x-message-ttl": 60_000, "x-dead-letter-exchange": "dlx"},
    )
    workers = [Worker(broker, "ttl", 100, ack=False) for _ in range(3)]
    # Every consumer out of credit, then a backlog of which every third message expires.
    publish_at_once(channel, "ttl", range(300))
    pump(workers, lambda: total(workers)() == 300)
    soon = pika.BasicProperties(expiration="1")
    publish_at_once(channel, "ttl", range(300, 1500), lambda i: soon if i % 3 == 0 else None)
    time.sleep(0.05)  # the expirations of 1 ms pass
    for worker in workers:
        worker.ack = True
        worker.ack_held()
    live = [i for i in range(300, 1500) if i % 3]
    pump(workers, lambda: total(workers)() == 300 + len(live))
    assert sorted(i for w in workers for i in w.indexes if i >= 300) == live
    for worker in workers:
        assert worker.indexes == sorted(worker.indexes)
        worker.close()
    deadline = time.monotonic() + TIMEOUT_S
    while channel.queue_declare("dead", passive=True).method.message_count < 400:
        assert time.monotonic() < deadline
        channel.connection.process_data_events(time_limit=0.05)
    assert channel.queue_declare("dead", passive=True).method.message_count == 400


def test_a_backlog_with_expirations_goes_to_one_consumer_in_order(
    broker: RunningBroker,
) -> None:
    _, channel = publisher(broker)
    dead_letter_setup(channel, "ttl1", **{"x-dead-letter-exchange": "dlx"})
    soon = pika.BasicProperties(expiration="1")
    later = pika.BasicProperties(expiration="60000")
    publish_at_once(
        channel, "ttl1", range(1000), lambda i: soon if i % 10 == 3 else later if i % 2 else None
    )
    time.sleep(0.05)
    worker = Worker(broker, "ttl1", 0)
    live = [i for i in range(1000) if i % 10 != 3]
    pump([worker], lambda: len(worker.got) == len(live))
    assert worker.indexes == live
    assert channel.queue_declare("dead", passive=True).method.message_count == 100
    worker.close()
