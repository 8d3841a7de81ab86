"""The sparse index finds the entry at or before an offset or a timestamp."""

from __future__ import annotations

import itertools

from streamq.log.index import SparseIndex


def make_index() -> SparseIndex:
    index = SparseIndex(100)
    # (relative offset, position, timestamp): records of 30 bytes, timestamps in steps.
    for i in range(20):
        index.maybe_add(i, 32 + 30 * i, 1000 + 10 * (i // 4))
    return index


def test_entries_are_one_per_interval_and_the_first_record() -> None:
    index = make_index()
    assert index.entries()[0] == (0, 32, 1000)
    positions = [p for _, p, _ in index.entries()]
    assert all(b - a >= 100 for a, b in itertools.pairwise(positions))
    assert len(index) == 5  # records 0, 4, 8, 12, 16 start an interval


def test_floor_offset() -> None:
    index = make_index()
    assert index.floor_offset(0) == (0, 32)
    assert index.floor_offset(3) == (0, 32)
    assert index.floor_offset(4) == (4, 152)
    assert index.floor_offset(19) == (16, 512)


def test_floor_timestamp_is_before_the_first_match() -> None:
    index = make_index()
    assert index.floor_timestamp(0) == (0, 32)
    assert index.floor_timestamp(1010) == (0, 32)  # records 4.. have 1010; entry 0 is before
    assert index.floor_timestamp(1011) == (4, 152)
    assert index.floor_timestamp(99999) == (16, 512)


def test_truncate_after_drops_entries_at_or_past_a_position() -> None:
    index = make_index()
    index.truncate_after(152)
    assert index.entries() == [(0, 32, 1000)]
    index.maybe_add(4, 152, 1010)
    assert len(index) == 2
