"""RunSet against a reference model: a plain Python set of offsets, whose sorted runs of
consecutive offsets are what the RunSet must hold, merged as far as they go."""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from streamq.queues import runs as runs_module
from streamq.queues.runs import RunSet

OFFSET_MAX = 120  # small, so that operations meet, overlap and merge runs often


def model_runs(model: set[int]) -> list[tuple[int, int]]:
    """The minimal runs of a set of offsets: sorted, consecutive offsets joined."""
    result: list[tuple[int, int]] = []
    for offset in sorted(model):
        if result and result[-1][0] + result[-1][1] == offset:
            result[-1] = (result[-1][0], result[-1][1] + 1)
        else:
            result.append((offset, 1))
    return result


def check(held: RunSet, model: set[int]) -> None:
    expected_runs = model_runs(model)
    assert len(held) == len(model)
    assert bool(held) == bool(model)
    assert held.runs() == expected_runs
    assert held.run_count == len(expected_runs)  # adjacent runs merged
    assert list(held) == sorted(model)
    assert held.first() == (min(model) if model else None)
    assert held.last() == (max(model) if model else None)
    assert held.head_run() == (expected_runs[0] if expected_runs else (0, 0))
    low = min(model, default=0) - 3
    high = max(model, default=0) + 3
    assert [o for o in range(low, high) if o in held] == sorted(o for o in model if low <= o)


# Each operation is a tag and two small integers whose meaning depends on the tag; the
# test turns them into arguments valid for the current state (add_front below everything,
# append_run past the end or anywhere).
operations = st.lists(
    st.tuples(
        st.sampled_from(["append_end", "append_any", "add", "add_front", "pop_run", "remove_run"]),
        st.integers(0, OFFSET_MAX),
        st.integers(1, 12),
    ),
    max_size=60,
)


def apply(held: RunSet, model: set[int], op: tuple[str, int, int]) -> None:
    tag, a, b = op
    if tag == "append_end":
        first = (max(model) + 1 if model else 0) + a % 3  # right after the end, or a gap
        held.append_run(first, b)
        model.update(range(first, first + b))
    elif tag == "append_any":
        held.append_run(a, b)  # in the middle: overlaps are not counted twice
        model.update(range(a, a + b))
    elif tag == "add":
        held.add(a)
        model.add(a)
    elif tag == "add_front":
        end = (min(model) if model else a) - a % 2  # adjacent to the first run, or not
        held.add_front(end - b, b)
        model.update(range(end - b, end))
    elif tag == "pop_run":
        expected = model_runs(model)[:1]
        got = held.pop_run(b)
        if not expected:
            assert got == (0, 0)
            return
        first, count = expected[0]
        assert got == (first, min(count, b))
        model.difference_update(range(got[0], got[0] + got[1]))
    else:
        removed = held.remove_run(a, b)
        assert removed == len(model & set(range(a, a + b)))
        model.difference_update(range(a, a + b))


@settings(max_examples=300, derandomize=True, deadline=None)
@given(ops=operations, compact_head_min=st.sampled_from([1, 2, runs_module._COMPACT_HEAD_MIN]))
def test_runset_matches_a_set_after_every_operation(
    ops: list[tuple[str, int, int]], compact_head_min: int
) -> None:
    """Small `_COMPACT_HEAD_MIN` values make the head compaction run in most sequences."""
    held = RunSet()
    model: set[int] = set()
    with mock.patch.object(runs_module, "_COMPACT_HEAD_MIN", compact_head_min):
        for op in ops:
            apply(held, model, op)
            check(held, model)


def test_head_compaction_at_the_real_limit_keeps_the_set_right() -> None:
    """Enough single-offset runs popped from the front to pass `_COMPACT_HEAD_MIN`, then
    every kind of change at the front, the middle and the back."""
    limit = runs_module._COMPACT_HEAD_MIN
    held = RunSet()
    model: set[int] = set()
    for offset in range(0, 6 * limit, 2):  # 3 * limit runs of one offset
        held.append_run(offset, 1)
        model.add(offset)
    arrays_before = len(held._starts)
    for popped in range(2 * limit):
        first, count = held.pop_run(5)
        assert (first, count) == (2 * popped, 1)
        model.discard(first)
        assert len(held) == len(model) and held.first() == first + 2
        if popped % 256 == 0 or abs(popped - limit) < 3:  # the whole check is O(n)
            check(held, model)
    check(held, model)
    assert len(held._starts) < arrays_before  # the consumed runs were dropped
    held.add_front(min(model) - 3, 2)
    model.update(range(min(model) - 3, min(model) - 1))
    held.add(min(model) + 1)  # joins two runs
    model.add(min(model) + 1)
    held.remove_run(5 * limit, 3)
    model.difference_update(range(5 * limit, 5 * limit + 3))
    held.append_run(6 * limit + 10, 4)
    model.update(range(6 * limit + 10, 6 * limit + 14))
    check(held, model)
    while model:
        first, count = held.pop_run(1000)
        assert (first, count) == model_runs(model)[0]
        model.difference_update(range(first, first + count))
    check(held, model)
    assert held.pop_run(1) == (0, 0)


def test_empty_and_zero_count_operations_change_nothing() -> None:
    held = RunSet()
    held.append_run(10, 0)
    held.add_front(5, 0)
    assert held.pop_run(3) == (0, 0)
    assert held.remove_run(0, 100) == 0
    check(held, set())
    held.append_run(10, 5)
    assert held.pop_run(0) == (0, 0)
    assert held.remove_run(12, 0) == 0
    check(held, set(range(10, 15)))


def test_emptied_by_remove_run_then_refilled_from_either_end() -> None:
    """A set emptied by `remove_run` after a `pop_run` keeps consumed runs in its arrays;
    new runs must not be confused with them."""
    held = RunSet()
    held.append_run(0, 3)
    held.append_run(10, 3)
    held.pop_run(3)
    assert held.remove_run(10, 3) == 3
    check(held, set())
    held.append_run(2, 2)  # below the consumed run's end
    check(held, {2, 3})
    held.add_front(0, 1)
    check(held, {0, 2, 3})
    held.add(1)
    check(held, {0, 1, 2, 3})


def test_clear() -> None:
    held = RunSet()
    held.append_run(3, 4)
    held.pop_run(1)
    held.clear()
    check(held, set())
    held.append_run(1, 1)
    check(held, {1})
