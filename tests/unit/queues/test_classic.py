"""The classic queue cursor: delivery order in runs, partial deliveries, requeues with
their redelivered flag and counts, settlement, byte accounting, purge, low-water mark,
and memory per run rather than per message."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamq.queues.classic import ClassicQueue, ReadyMessage
from streamq.queues.journal import QueueJournal
from streamq.queues.priority import PriorityQueue


def expand(runs: list[tuple[int, int]]) -> list[int]:
    return [offset for first, count in runs for offset in range(first, first + count)]


def deliver_all(queue: ClassicQueue, size: Callable[[int], int]) -> list[ReadyMessage]:
    """Take and deliver singly until nothing is ready."""
    taken = []
    while (ready := queue.take()) is not None:
        queue.delivered(ready.offset, size(ready.offset))
        taken.append(ready)
    return taken


def test_fifo_in_runs_across_enqueue_and_enqueue_run() -> None:
    queue = ClassicQueue()
    queue.enqueue_run(0, 5, 50, None)
    queue.enqueue(5, 10)
    queue.enqueue_run(8, 3, 30, None)  # offsets 6 and 7 went to another queue
    assert queue.ready_runs() == [(0, 6), (8, 3)]
    assert queue.run_count == 2 and queue.message_count == 9 and queue.bytes_ready == 90
    assert queue.peek() == 0
    assert queue.take_run(4) == (0, 4)
    queue.delivered_run(0, [10] * 4)
    assert queue.take_run(100) == (4, 2)  # the rest of the first run only
    queue.delivered_run(4, [10, 10])
    assert queue.take_run(100) == (8, 3)
    queue.delivered_run(8, [10] * 3)
    assert queue.take_run(1) == (0, 0) and queue.take() is None
    assert sorted(queue.unacked) == [0, 1, 2, 3, 4, 5, 8, 9, 10]
    assert queue.bytes_ready == 0 and queue.bytes_unacked == 90
    assert all(queue.delivery_count(o) == 1 for o in queue.unacked)


def test_a_run_delivered_in_part_gives_the_rest_back_to_the_front() -> None:
    queue = ClassicQueue()
    queue.enqueue_run(100, 10, 100, None)
    first, count = queue.take_run(8)
    assert (first, count) == (100, 8)
    assert queue.message_count == 2  # taken, neither ready nor in flight
    queue.delivered_run(first, [10, 10, 10])
    queue.untake_run(first + 3, count - 3)
    assert queue.ready_runs() == [(103, 7)] and queue.run_count == 1
    assert sorted(queue.unacked) == [100, 101, 102]
    assert queue.bytes_ready == 70 and queue.bytes_unacked == 30
    ready = queue.take()
    assert ready == ReadyMessage(103, False, 0)
    queue.untake(ready.offset)
    assert queue.ready_runs() == [(103, 7)] and queue.peek() == 103


def test_offsets_given_back_while_in_flight_or_held_are_left_out_with_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A give-back to the ready messages of an offset in flight (or already ready) would
    deliver it again unflagged: it is refused and named in an ERROR, the rest goes back."""
    queue = ClassicQueue()
    queue.enqueue_run(100, 10, 100, None)
    caplog.set_level(logging.ERROR, logger="streamq.queues.classic")
    first, count = queue.take_run(8)
    queue.delivered_run(first, [10, 10, 10])
    queue.untake_run(first + 3, count - 3)  # as a partial delivery does: no error
    assert not caplog.records
    first, count = queue.take_run(4)
    queue.delivered_run(first, [10, 10])
    queue.untake_run(first, count)  # 103 and 104 went out: a caller that lost track
    assert "offsets 103, 104 (2) given back" in caplog.text
    assert queue.ready_runs() == [(105, 5)] and sorted(queue.unacked) == [100, 101, 102, 103, 104]
    caplog.clear()
    queue.untake_run(105, 2)  # held already
    assert "offsets 105, 106 (2) given back" in caplog.text
    assert queue.ready_runs() == [(105, 5)] and queue.message_count == 5
    for offset in (105, 100):  # a fresh one, then a requeued one
        if offset == 100:
            queue.requeue(100)
        ready = queue.take()
        assert ready is not None and ready.offset == offset
        queue.delivered(offset, 10)
        caplog.clear()
        queue.untake(offset)
        assert f"offsets {offset} (1) given back" in caplog.text
        assert offset in queue.unacked and queue.ready_runs() == [(106, 4)]


def test_a_requeue_goes_ahead_of_fresh_messages_in_original_order() -> None:
    queue = ClassicQueue()
    queue.enqueue_run(0, 6, 60, None)
    taken = deliver_all(queue, lambda _: 10)
    assert [t.offset for t in taken] == [0, 1, 2, 3, 4, 5]
    queue.ack(0)
    for offset in (3, 1):  # out of order
        queue.requeue(offset)
    queue.enqueue(6, 10)
    assert queue.ready_runs() == [(1, 1), (3, 1), (6, 1)]
    assert queue.bytes_ready == 30 and queue.bytes_unacked == 30
    again = queue.take()
    assert again == ReadyMessage(1, True, 1)
    queue.delivered(1, 10)
    assert queue.delivery_count(1) == 2
    queue.requeue(1)
    assert queue.delivery_count(1) == 2  # ready again after two deliveries
    order = deliver_all(queue, lambda _: 10)
    assert order == [ReadyMessage(1, True, 2), ReadyMessage(3, True, 1), ReadyMessage(6, False, 0)]
    assert [queue.delivery_count(o) for o in (1, 3, 6)] == [3, 2, 1]


def test_a_requeued_message_taken_and_given_back_keeps_its_place_and_flag() -> None:
    queue = ClassicQueue()
    queue.enqueue_run(0, 4, 4, None)
    for offset in (0, 1):
        queue.take()
        queue.delivered(offset, 1)
    queue.requeue(1)
    queue.requeue(0)
    ready = queue.take()
    assert ready == ReadyMessage(0, True, 1)
    queue.untake(ready.offset)
    assert queue.ready_runs() == [(0, 1), (1, 1), (2, 2)]
    assert queue.take_run(5) == (0, 0)
    assert [queue.take() for _ in range(3)] == [
        ReadyMessage(0, True, 1),
        ReadyMessage(1, True, 1),
        ReadyMessage(2, False, 0),
    ]


def test_take_run_leaves_requeued_messages_to_take() -> None:
    queue = ClassicQueue()
    queue.enqueue_run(0, 3, 3, None)
    ready = queue.take()
    assert ready is not None
    queue.delivered(ready.offset, 1)
    queue.requeue(ready.offset)
    assert queue.take_run(10) == (0, 0)
    assert queue.take() == ReadyMessage(0, True, 1)


def test_dropped_and_take_expired() -> None:
    queue = ClassicQueue()
    queue.enqueue_run(0, 4, 40, None)
    assert queue.take_expired(lambda offset: offset < 2) == [0, 1]
    for offset in (0, 1):
        queue.dropped(offset, 10)
    assert queue.message_count == 2 and queue.bytes_ready == 20 and not queue.unacked
    ready = queue.take()
    assert ready is not None
    queue.delivered(ready.offset, 10)
    queue.requeue(ready.offset)
    again = queue.take()
    assert again == ReadyMessage(2, True, 1)
    queue.dropped(again.offset, 10)  # a redelivered one expires at the head
    assert queue.delivery_count(2) == 0 and queue.ready_runs() == [(3, 1)]
    assert queue.bytes_ready == 10 and queue.low_water_offset() == 3


def test_purge_drops_ready_messages_and_keeps_those_in_flight() -> None:
    queue = ClassicQueue()
    queue.enqueue_run(0, 10, 100, None)
    deliver_all(queue, lambda _: 10)
    for offset in range(3, 10):
        queue.requeue(offset)
    queue.requeue(1)
    assert queue.purge() == 8
    assert queue.purge() == 0
    assert queue.message_count == 0 and queue.ready_runs() == []
    assert queue.bytes_ready == 0 and queue.bytes_unacked == 20
    assert sorted(queue.unacked) == [0, 2]
    assert queue.delivery_count(1) == 0 and queue.delivery_count(0) == 1
    assert queue.low_water_offset() == 0
    queue.enqueue(10, 5)
    assert deliver_all(queue, lambda _: 5) == [ReadyMessage(10, False, 0)]


def test_low_water_offset_is_the_smallest_offset_held() -> None:
    queue = ClassicQueue()
    assert queue.low_water_offset() is None
    queue.enqueue_run(5, 5, 5, None)
    assert queue.low_water_offset() == 5
    assert queue.take_run(2) == (5, 2)
    queue.delivered_run(5, [1, 1])
    assert queue.low_water_offset() == 5  # in flight
    queue.ack(6)
    assert queue.low_water_offset() == 5
    queue.requeue(5)
    assert queue.low_water_offset() == 5  # ready again
    ready = queue.take()
    assert ready is not None
    queue.delivered(ready.offset, 1)
    queue.ack(5)
    assert queue.low_water_offset() == 7
    queue.purge()
    assert queue.low_water_offset() is None


def test_a_million_consecutive_offsets_are_one_run() -> None:
    """Memory per run: a million messages published in reads of 1000 and delivered in
    part leave one run of never-delivered offsets."""
    queue = ClassicQueue()
    for first in range(0, 1_000_000, 1000):
        queue.enqueue_run(first, 1000, 1000, None)
    assert queue.message_count == 1_000_000 and queue.run_count == 1
    assert queue.ready_runs() == [(0, 1_000_000)] and queue.bytes_ready == 1_000_000
    first, count = queue.take_run(500)
    queue.delivered_run(first, [1] * 200)
    queue.untake_run(first + 200, count - 200)
    queue.ack_many(list(range(200)))
    assert queue.run_count == 1 and queue.ready_runs() == [(200, 999_800)]
    assert queue.bytes_ready == 999_800 and queue.live_entries() == 1


# -- ack and ack_many -------------------------------------------------------------------


@pytest.mark.parametrize(
    "new_cursor",
    [ClassicQueue, lambda journal: PriorityQueue(2, journal)],
    ids=["classic", "priority"],
)
def test_ack_many_leaves_what_acks_one_by_one_leave(
    tmp_path: Path, new_cursor: Callable[[QueueJournal], ClassicQueue]
) -> None:
    """`ack_many` (an ack with `multiple`, or the acks of one read) against `ack` per
    offset: the same cursor state and the same journal words, offsets already gone and a
    run acked in order included."""
    states = []
    for name, bulk in (("one", False), ("many", True)):
        journal = QueueJournal.create(str(tmp_path / f"{name}.journal"), set())
        cursor = new_cursor(journal)
        for offset in range(30):
            cursor.enqueue(offset, 10 + offset, offset % 3)
        in_flight = [ready.offset for ready in deliver_all(cursor, lambda o: 10 + o)]
        for offset in in_flight[20:]:
            cursor.requeue(offset)  # back to ready: only 20 stay in flight
        taken = sorted(in_flight[:20])
        cursor.ack(taken[3])  # gone before the ack that names it again
        groups = [[taken[3], *taken[5:11]], taken[12:17], [taken[19], taken[18]]]
        for acked in groups:
            if bulk:
                cursor.ack_many(acked)
            else:
                for offset in acked:
                    cursor.ack(offset)
        states.append(
            (
                dict(cursor.unacked),
                cursor.ready_runs(),
                [cursor.delivery_count(o) for o in range(30)],
                cursor.bytes_ready,
                cursor.bytes_unacked,
                journal._buffer.tolist(),
            )
        )
        journal.close()
    assert states[0] == states[1]
    assert sorted(states[1][0]) == sorted([*taken[:3], taken[4], taken[11], taken[17]])


# -- a model of the whole cursor --------------------------------------------------------


class Model:
    """What a classic queue holds, the obvious way: lists and dicts per message."""

    def __init__(self) -> None:
        self.next_offset = 0
        self.sizes: dict[int, int] = {}
        self.fresh: list[int] = []  # never delivered, in publish order
        self.requeued: set[int] = set()
        self.counts: dict[int, int] = {}  # deliveries so far
        self.unacked: set[int] = set()

    def ready(self) -> list[int]:
        return sorted(self.requeued) + self.fresh

    def bytes_ready(self) -> int:
        return sum(self.sizes[o] for o in self.ready())

    def bytes_unacked(self) -> int:
        return sum(self.sizes[o] for o in self.unacked)


def size_of(offset: int) -> int:
    return 1 + offset * 7 % 13


steps = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "enqueue",
                "enqueue_run",
                "skip",
                "take_deliver",
                "take_untake",
                "take_drop",
                "run_partly",
                "ack",
                "ack_many",
                "requeue",
                "purge",
            ]
        ),
        st.integers(0, 9),
    ),
    max_size=50,
)


def step(queue: ClassicQueue, model: Model, tag: str, n: int) -> None:
    unacked = sorted(model.unacked)
    if tag == "enqueue":
        queue.enqueue(model.next_offset, size_of(model.next_offset))
        model.fresh.append(model.next_offset)
        model.next_offset += 1
    elif tag == "enqueue_run":
        offsets = range(model.next_offset, model.next_offset + n + 1)
        queue.enqueue_run(offsets[0], len(offsets), sum(map(size_of, offsets)), None)
        model.fresh += offsets
        model.next_offset += len(offsets)
    elif tag == "skip":
        model.next_offset += n + 1  # offsets routed to other queues
    elif tag in ("take_deliver", "take_untake", "take_drop"):
        ready = queue.take()
        expected = model.ready()[:1]
        if not expected:
            assert ready is None
            return
        offset = expected[0]
        count = model.counts.get(offset, 0) if offset in model.requeued else 0
        assert ready == ReadyMessage(offset, count > 0, count)
        if tag == "take_untake":
            queue.untake(offset)
            return
        model.requeued.discard(offset)
        if offset in model.fresh:
            model.fresh.remove(offset)
        if tag == "take_deliver":
            queue.delivered(offset, size_of(offset))
            model.unacked.add(offset)
            model.counts[offset] = count + 1
        else:
            queue.dropped(offset, size_of(offset))
            model.counts.pop(offset, None)
            del model.sizes[offset]
    elif tag == "run_partly":
        first, count = queue.take_run(n + 1)
        if model.requeued or not model.fresh:
            assert (first, count) == (0, 0)
            return
        run = [model.fresh[0]]
        while (
            len(run) < n + 1
            and len(run) < len(model.fresh)
            and (model.fresh[len(run)] == run[-1] + 1)
        ):
            run.append(model.fresh[len(run)])
        assert (first, count) == (run[0], len(run))
        sent = run[: (count + 1) // 2]
        queue.delivered_run(first, [size_of(o) for o in sent])
        queue.untake_run(first + len(sent), count - len(sent))
        del model.fresh[: len(sent)]
        model.unacked.update(sent)
        model.counts.update(dict.fromkeys(sent, 1))
    elif tag == "ack" and unacked:
        offset = unacked[n % len(unacked)]
        assert queue.ack(offset) == size_of(offset)
        assert queue.ack(offset) == 0
        model.unacked.discard(offset)
        model.counts.pop(offset)
        del model.sizes[offset]
    elif tag == "ack_many" and unacked:
        acked = unacked[n % len(unacked) :: 2] + unacked[:1]  # a repeat now and then
        queue.ack_many(acked)
        for offset in set(acked):
            model.unacked.discard(offset)
            model.counts.pop(offset)
            del model.sizes[offset]
    elif tag == "requeue" and unacked:
        offset = unacked[n % len(unacked)]
        queue.requeue(offset)
        model.unacked.discard(offset)
        model.requeued.add(offset)
    elif tag == "purge":
        dropped = model.ready()
        assert queue.purge() == len(dropped)
        for offset in dropped:
            model.counts.pop(offset, None)
            del model.sizes[offset]
        model.fresh, model.requeued = [], set()


@settings(max_examples=1000, derandomize=True, deadline=None)
@given(ops=steps)
def test_cursor_matches_a_model_after_every_operation(ops: list[tuple[str, int]]) -> None:
    """Order, counts, flags and the bytes totals after each step, against a model that
    keeps one entry per message."""
    queue = ClassicQueue()
    model = Model()
    for tag, n in ops:
        if tag in ("enqueue", "enqueue_run"):
            first = model.next_offset
            step(queue, model, tag, n)
            model.sizes.update({o: size_of(o) for o in range(first, model.next_offset)})
        else:
            step(queue, model, tag, n)
        assert expand(queue.ready_runs()) == model.ready()
        assert queue.message_count == len(model.ready())
        assert sorted(queue.unacked) == sorted(model.unacked)
        assert queue.unacked_count == len(model.unacked)
        assert queue.bytes_ready == model.bytes_ready()
        assert queue.bytes_unacked == model.bytes_unacked()
        held = set(model.ready()) | model.unacked
        assert expand(queue.held_runs()) == sorted(held)
        assert queue.low_water_offset() == (min(held) if held else None)
        for offset in range(model.next_offset):
            assert queue.delivery_count(offset) == (model.counts.get(offset, 0))
        assert queue.peek() == (model.ready()[0] if model.ready() else None)
        fresh_runs = len(
            [o for i, o in enumerate(model.fresh) if not i or model.fresh[i - 1] != o - 1]
        )
        assert queue.run_count == fresh_runs


def test_after_a_failover_restored_messages_go_out_redelivered_then_new_ones_in_runs() -> None:
    """A promoted leader's queue holds one offset, not an entry per restored message."""
    queue = ClassicQueue()
    queue.restore_runs([(0, 3), (100, 2)], {}, redelivered_below=102)
    queue.enqueue_run(102, 2, 20, None)  # published after the promotion
    assert queue.live_entries() == 2  # the two restored runs and the new one, merged
    assert queue.take_run(10) == (0, 0)  # restored ones go singly, flagged
    assert queue.fresh_head_run() == (0, 0)
    first = queue.take()
    assert first is not None
    assert (first.offset, first.redelivered, first.delivery_count) == (0, True, 1)
    queue.delivered(0, 10)
    assert queue.delivery_count(0) == 2  # the failover's delivery and this one
    queue.requeue(0)
    again = queue.take()
    assert again is not None and (again.offset, again.delivery_count) == (0, 2)
    queue.delivered(0, 10)
    for offset in (1, 2, 100, 101):
        taken = queue.take()
        assert taken is not None and (taken.offset, taken.redelivered) == (offset, True)
        queue.delivered(offset, 10)
    assert queue.take_run(10) == (102, 2)  # new messages: the fast path again
    assert queue.delivery_count(102) == 0  # taken, not yet delivered


def test_restored_messages_without_a_failover_are_fresh() -> None:
    queue = ClassicQueue()
    queue.restore_runs([(5, 3)], {})
    assert queue.take_run(10) == (5, 3)
    assert queue.delivery_count(5) == 0
