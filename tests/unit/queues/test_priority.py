"""The priority cursor alone: order by priority then publish order, requeues back to
their level, runs per level, clamping, purge, low-water mark, and the raw `priority` reader (checked
against the gateway's property encoder)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from amqp_gateway import codec
from streamq.broker.priority import message_priority
from streamq.queues.classic import ReadyMessage
from streamq.queues.priority import PriorityQueue


def take_all(queue: PriorityQueue, size: int = 1) -> list[int]:
    """Take and deliver (each message of `size` bytes) until nothing is ready."""
    taken = []
    while (ready := queue.take()) is not None:
        queue.delivered(ready.offset, size)
        taken.append(ready.offset)
    return taken


def take_one(queue: PriorityQueue, size: int = 1) -> ReadyMessage:
    ready = queue.take()
    assert ready is not None
    queue.delivered(ready.offset, size)
    return ready


def test_order_is_priority_then_publish_order_with_clamping() -> None:
    queue = PriorityQueue(5)
    for offset, priority in enumerate([0, 3, 9, 3, 5, 0]):
        queue.enqueue(offset, 10, priority)
    assert queue.message_count == 6 and queue.bytes_ready == 60
    assert queue.peek() == 2
    assert take_all(queue, 10) == [2, 4, 1, 3, 0, 5]  # 9 counts as 5, before the 5 after it
    assert queue.message_count == 0 and queue.bytes_ready == 0 and queue.bytes_unacked == 60


def test_a_requeue_goes_to_the_head_of_its_level_in_publish_order() -> None:
    queue = PriorityQueue(10)
    for offset, priority in enumerate([1, 5, 5, 5]):
        queue.enqueue(offset, 1, priority)
    first, second = take_one(queue), take_one(queue)
    queue.requeue(second.offset)
    queue.requeue(first.offset)
    assert queue.ready_runs() == [(1, 1), (2, 1), (3, 1), (0, 1)]
    assert take_one(queue) == ReadyMessage(1, True, 1)
    assert take_all(queue) == [2, 3, 0]
    assert queue.delivery_count(2) == 2 and queue.delivery_count(3) == 1


def test_ack_purge_held_runs_and_low_water_mark() -> None:
    queue = PriorityQueue(3)
    for offset, priority in enumerate([0, 3, 1, 2]):
        queue.enqueue(offset, 4, priority)
    assert take_one(queue, 4).offset == 1
    assert queue.held_runs() == [(0, 4)]
    assert queue.ready_runs() == [(3, 1), (2, 1), (0, 1)]  # by priority
    assert queue.low_water_offset() == 0
    assert queue.purge() == 3
    assert queue.message_count == 0 and queue.held_runs() == [(1, 1)]
    assert queue.bytes_ready == 0 and queue.bytes_unacked == 4
    assert queue.low_water_offset() == 1
    snapshot = queue.live_snapshot(False)
    assert (snapshot.runs, snapshot.counts, snapshot.size_bytes) == ([(1, 1)], {1: 1}, 4)
    assert queue.ack(1) == 4
    assert queue.low_water_offset() is None
    snapshot = queue.live_snapshot(False)
    assert (snapshot.runs, snapshot.counts, snapshot.size_bytes) == ([], {}, 0)


def test_runs_go_out_per_level_and_a_requeue_returns_to_its_level() -> None:
    """`take_run` takes consecutive offsets of the top level only; the priority of a
    message in flight is kept for its requeue."""
    queue = PriorityQueue(5)
    queue.enqueue_run(0, 6, 6, [5, 5, 5, 0, 0, 5])
    assert queue.take_run(10) == (0, 3)
    queue.delivered_run(0, [1, 1])
    queue.untake_run(2, 1)
    assert queue.ready_runs() == [(2, 1), (5, 1), (3, 2)]
    queue.requeue(1)
    queue.requeue(0)
    assert queue.ready_runs() == [(0, 1), (1, 1), (2, 1), (5, 1), (3, 2)]
    assert queue.take_run(10) == (0, 0)  # requeued ones go singly
    assert [take_one(queue).offset for _ in range(3)] == [0, 1, 2]
    assert queue.take_run(10) == (5, 1)
    queue.untake_run(5, 1)
    assert take_all(queue) == [5, 3, 4]
    assert queue.bytes_ready == 0 and queue.bytes_unacked == 6


def test_restore_keeps_delivery_counts_and_priorities() -> None:
    queue = PriorityQueue(9)
    queue.restore(7, 2, 1)
    queue.restore(8, 0, 9)
    queue.restore(9, 0, 1)
    assert take_one(queue) == ReadyMessage(8, False, 0)
    assert take_one(queue) == ReadyMessage(7, True, 2)  # requeued ones first in a level
    assert take_one(queue) == ReadyMessage(9, False, 0)
    queue.requeue(7)
    assert queue.ready_runs() == [(7, 1)] and queue.delivery_count(7) == 3


@given(
    priority=st.none() | st.integers(0, 255),
    content_type=st.none() | st.text(max_size=20),
    headers=st.none() | st.dictionaries(st.text(max_size=5), st.integers(0, 100), max_size=3),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    expiration=st.none() | st.just("100"),
)
def test_message_priority_reads_what_the_encoder_wrote(
    priority: int | None,
    content_type: str | None,
    headers: dict[str, object] | None,
    delivery_mode: int | None,
    expiration: str | None,
) -> None:
    properties = codec.BasicProperties(
        content_type=content_type,
        content_encoding="gzip" if content_type else None,
        headers=headers,
        delivery_mode=delivery_mode,
        priority=priority,
        expiration=expiration,
    )
    assert message_priority(codec.encode_properties(properties)) == (priority or 0)


def test_message_priority_of_short_or_empty_properties_is_0() -> None:
    assert message_priority(b"") == 0
    assert message_priority(b"\x08\x00") == 0  # the flag without its octet


def test_take_expired_looks_at_the_head_of_every_priority() -> None:
    queue = PriorityQueue(5)
    for offset, priority in enumerate([5, 1, 1, 5, 0]):
        queue.enqueue(offset, 1, priority)
    expired = {1, 2, 4}  # the heads of levels 1 and 0, behind a live level 5
    assert queue.take_expired(expired.__contains__) == [1, 2, 4]
    for offset in expired:
        queue.dropped(offset, 1)
    assert queue.message_count == 2 and queue.unacked == {} and queue.bytes_ready == 2
    assert take_all(queue) == [0, 3]
