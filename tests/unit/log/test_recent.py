"""RecentWrites: the lookup of the kept buffer holding a position agrees with a plain scan
(the code it replaced) for every position, across segments, trims and compactions."""

from __future__ import annotations

import concurrent.futures

import pytest

from streamq.log import recent
from streamq.log.index import SparseIndex
from streamq.log.recent import RecentWrites
from streamq.log.segment import Segment


def _segment(base: int) -> Segment:
    return Segment(f"/nonexistent/{base}", base, SparseIndex(4096))


def _done() -> concurrent.futures.Future[None]:
    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    future.set_result(None)
    return future


def _scan(
    kept: list[tuple[Segment, int, bytearray]], segment: Segment, position: int
) -> tuple[bytearray | None, int]:
    first = -1
    for owner, start, data in kept:
        if owner is segment:
            if start <= position < start + len(data):
                return data, start
            if first < 0:
                first = start
    return None, first


def test_find_agrees_with_a_scan_over_segments_and_trims(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recent, "COMPACT_ENTRIES_MIN", 4)
    writes = RecentWrites()
    kept: list[tuple[Segment, int, bytearray]] = []
    segments = [_segment(base) for base in (0, 100, 250)]
    for segment in segments:
        position = 64
        for size in (10, 1, 30, 7, 12):
            data = bytearray(bytes([size]) * size)
            writes.add(segment, position, data, _done())
            kept.append((segment, position, data))
            position += size
    for keep_bytes in (10**9, 150, 100, 40, 0):
        writes.trim(keep_bytes, writes_parked=False)
        while kept and sum(len(d) for _, _, d in kept) - len(kept[0][2]) >= keep_bytes:
            kept.pop(0)
        assert len(writes) == len(kept)
        assert writes.bytes == sum(len(d) for _, _, d in kept)
        for segment in [*segments, _segment(100)]:  # an equal base, another segment
            assert writes.holds(segment) == any(owner is segment for owner, _, _ in kept)
            for position in range(0, 140):
                found, start = writes.find(segment, position)
                expected, expected_start = _scan(kept, segment, position)
                assert start == expected_start, (keep_bytes, position)
                assert found is expected


def test_unwritten_buffers_are_kept_whatever_the_limit() -> None:
    writes = RecentWrites()
    segment = _segment(0)
    pending: concurrent.futures.Future[None] = concurrent.futures.Future()
    writes.add(segment, 64, bytearray(b"a" * 10), _done())
    writes.add(segment, 74, bytearray(b"b" * 10), pending)
    writes.add(segment, 84, bytearray(b"c" * 10), _done())
    writes.trim(0, writes_parked=False)
    assert len(writes) == 2  # stops at the write in flight
    assert writes.find(segment, 80) == (bytearray(b"b" * 10), 74)
    writes.trim(0, writes_parked=True)
    assert len(writes) == 2
    pending.set_result(None)
    writes.trim(0, writes_parked=True)  # a full disk parks writes: nothing goes
    assert len(writes) == 2
    writes.trim(6, writes_parked=False)
    assert len(writes) == 1  # what is left holds at least 6 bytes
    assert writes.find(segment, 70) == (None, 84)
    assert writes.find(segment, 90) == (bytearray(b"c" * 10), 84)
