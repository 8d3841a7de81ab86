"""Stored stream offsets: the ack watermark, the file, torn and corrupt records,
compaction."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamq.queues.offsets import (
    COMPACT_RECORDS_MIN,
    HEADER,
    AckWatermark,
    OffsetsCorrupted,
    OffsetStore,
    encode_file,
    encode_record,
)


def test_the_watermark_is_the_highest_offset_acked_with_all_before_it() -> None:
    """Not the read position: 12 acked before 11 does not count until 11 is acked."""
    mark = AckWatermark(10)
    assert mark.done(10) and mark.next == 11
    assert not mark.done(12) and mark.next == 11
    assert not mark.done(5)  # below the start: already done
    assert mark.done(11) and mark.next == 13


@given(
    start=st.integers(0, 50),
    runs=st.lists(st.lists(st.integers(0, 80), max_size=20), max_size=6),
)
def test_a_run_moves_the_watermark_as_its_acks_one_by_one_do(
    start: int, runs: list[list[int]]
) -> None:
    """done_run of each run (any order, repeats, offsets below the start) leaves the
    watermark where `done` of each offset leaves it, and says whether it moved."""
    by_run, one_by_one = AckWatermark(start), AckWatermark(start)
    for run in runs:
        moved = [one_by_one.done(offset) for offset in run]
        assert by_run.done_run(run) == any(moved)
        assert by_run.next == one_by_one.next
    # The acks above a gap are remembered alike: acking everything below closes it.
    rest = list(range(start, 81))
    assert by_run.done_run(rest) == any([one_by_one.done(offset) for offset in rest])
    assert by_run.next == one_by_one.next


def test_a_run_from_the_watermark_without_gaps_moves_it_in_one_step() -> None:
    mark = AckWatermark(100)
    assert mark.done_run(list(range(100, 1100)))
    assert mark.next == 1100
    assert not mark.done_run([5, 1099])  # all below the watermark: already done
    assert not mark.done_run([1101, 1102])  # above a gap
    assert mark.done_run([1100]) and mark.next == 1103


def apply(store: OffsetStore) -> None:
    work = store.prepare_sync()
    for action in work.actions:
        action()


def test_offsets_persist_and_the_newest_record_wins(tmp_path: Path) -> None:
    path = str(tmp_path / "s.offsets")
    store = OffsetStore.open(path)
    store.store("reader-a", 5)
    store.store("reader-b", 7)
    apply(store)
    store.store("reader-a", 9)
    apply(store)
    store.close()
    again = OffsetStore.open(path)
    assert (again.get("reader-a"), again.get("reader-b"), again.get("nobody")) == (9, 7, None)
    again.close()


def test_a_torn_last_record_is_cut_and_a_bad_one_before_it_is_corruption(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.offsets"
    data = encode_file({"a": 1}) + encode_record("a", 2)
    path.write_bytes(data[:-2])
    store = OffsetStore.open(str(path))
    assert store.get("a") == 1
    store.close()
    damaged = bytearray(encode_file({"a": 1, "b": 2}))
    damaged[HEADER.size + 9] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with pytest.raises(OffsetsCorrupted, match="at byte 8"):
        OffsetStore.open(str(path))


def test_a_round_compacts_a_file_with_many_more_records_than_tags(tmp_path: Path) -> None:
    path = tmp_path / "s.offsets"
    store = OffsetStore.open(str(path))
    for n in range(COMPACT_RECORDS_MIN + 2):
        store.store("busy", n)
        apply(store)
    store.close()
    assert path.stat().st_size < 100  # one record left
    again = OffsetStore.open(str(path))
    assert again.get("busy") == COMPACT_RECORDS_MIN + 1
    again.close()
