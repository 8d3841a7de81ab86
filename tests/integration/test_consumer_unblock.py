"""A consumer of a queue with several consumers that had no credit comes back into the
turns when its credit does (streamq/broker/turns.py, `Queue.unblock`): a delivery
round no longer asks the consumers without credit, so each way credit comes back must
say so. Here, the connection whose socket filled (the broker stopped writing to it,
asyncio's pause_writing) and drains again, with pika over real sockets.

Method: consumer A (no prefetch limit) stops reading its socket; a first batch of
large messages fills it, so the broker pauses writing to A. Consumer B holds one
message at prefetch 1. A second batch then waits in the queue (A is paused, B has no
credit: both parked); once A reads again, the broker resumes writing and A must get the
second batch. Before `resume_writing` unblocked A, it stayed parked forever."""

from __future__ import annotations

import time

import pika

from tests.integration.conftest import RunningBroker
from tests.integration.test_work_queue_runs import Worker, publish_at_once, publisher

TIMEOUT_S = 30
QUEUE = "unblock"
BODY_BYTES = 256 * 1024
FIRST_BATCH = 128  # 32 MiB: more than loopback's socket buffers take unread


def queued(channel: pika.adapters.blocking_connection.BlockingChannel) -> int:
    return int(channel.queue_declare(QUEUE, passive=True).method.message_count)


def test_a_consumer_whose_socket_drains_again_gets_the_messages_that_waited(
    broker: RunningBroker,
) -> None:
    connection, channel = publisher(broker)
    channel.queue_declare(QUEUE)
    stalled = Worker(broker, QUEUE, 0, ack=False)
    holder = Worker(broker, QUEUE, 1, ack=False)
    channel.tx_select()
    for index in range(FIRST_BATCH):  # the Worker reads its number (padded)
        channel.basic_publish("", QUEUE, b"%*d" % (BODY_BYTES, 1000 + index))
    channel.tx_commit()
    deadline = time.monotonic() + TIMEOUT_S
    while len(holder.got) < 1:  # B takes its one; A's socket fills, unread
        assert time.monotonic() < deadline
        holder.connection.process_data_events(time_limit=0.05)
    assert queued(channel) == 0
    publish_at_once(channel, QUEUE, range(10))
    # Both parked: A's writes are paused, B holds its one. The batch waits.
    time.sleep(0.3)
    holder.connection.process_data_events(time_limit=0.05)
    assert queued(channel) == 10
    assert len(holder.got) == 1
    # A reads again: the broker resumes writing to it, A rejoins the turns.
    while len(stalled.got) < FIRST_BATCH - 1 + 10:
        assert time.monotonic() < deadline, len(stalled.got)
        stalled.connection.process_data_events(time_limit=0.05)
    assert stalled.indexes[-10:] == list(range(10))
    assert queued(channel) == 0
    for worker in (stalled, holder):
        worker.close()
    connection.close()
