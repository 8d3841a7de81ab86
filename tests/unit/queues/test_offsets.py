"""Stored stream offsets: the ack watermark, the file, torn and damaged records,
compaction. (Writes that fail, and the rounds a store starts: test_offset_writes.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamq.log.versions import NewerFormat
from streamq.queues.offset_file import (
    COMPACT_RECORDS_MIN,
    HEADER,
    OffsetsCorrupted,
    encode_file,
    encode_record,
)
from streamq.queues.offsets import AckWatermark, OffsetStore


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


def test_a_torn_last_record_is_cut_and_the_tag_keeps_its_previous_offset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A write cut short at any byte of the last record: the record before it holds."""
    path = tmp_path / "s.offsets"
    whole = encode_file({"a": 1}) + encode_record("a", 2)
    last = len(encode_record("a", 2))
    for cut in range(1, last):
        path.write_bytes(whole[:-cut])
        caplog.clear()
        store = OffsetStore.open(str(path))
        assert store.get("a") == 1, cut
        store.close()
        assert "torn last record" in caplog.text, cut
        assert path.read_bytes() == whole[:-last]  # cut off at open


def test_a_damaged_record_is_skipped_and_reported_and_the_rest_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bad record followed by valid ones is damage: only it is lost, the tag it held
    keeps its older value, and the file is rewritten without it."""
    path = tmp_path / "s.offsets"
    records = [encode_record("a", 1), encode_record("b", 2), encode_record("a", 3)]
    damaged = bytearray(encode_file({}) + b"".join(records) + encode_record("c", 4))
    damaged[HEADER.size + len(records[0]) + len(records[1]) + 9] ^= 0x10  # a's 3
    path.write_bytes(bytes(damaged))
    store = OffsetStore.open(str(path))
    assert (store.get("a"), store.get("b"), store.get("c")) == (1, 2, 4)
    store.close()
    position = HEADER.size + len(records[0]) + len(records[1])
    assert f"damaged record at byte {position}" in caplog.text
    caplog.clear()
    again = OffsetStore.open(str(path))
    assert (again.get("a"), again.get("b"), again.get("c")) == (1, 2, 4)
    again.close()
    assert "damaged" not in caplog.text  # repaired at the first open


def test_a_damaged_length_field_is_passed_over_to_the_next_valid_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.offsets"
    first = encode_record("a", 1)
    damaged = bytearray(encode_file({}) + first + encode_record("b", 2))
    damaged[HEADER.size + 1] ^= 0x40  # a's length: 16K, past the end
    path.write_bytes(bytes(damaged))
    store = OffsetStore.open(str(path))
    assert (store.get("a"), store.get("b")) == (None, 2)
    store.close()
    assert f"damaged record at byte {HEADER.size}" in caplog.text


def test_a_damaged_header_is_reported_and_the_records_after_it_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.offsets"
    damaged = bytearray(encode_file({"a": 1, "b": 2}))
    damaged[1] ^= 0x01  # the magic
    path.write_bytes(bytes(damaged))
    store = OffsetStore.open(str(path))
    assert (store.get("a"), store.get("b")) == (1, 2)
    store.close()
    assert "damaged header" in caplog.text
    assert path.read_bytes() == encode_file({"a": 1, "b": 2})  # replaced at open


@settings(max_examples=300, deadline=None)
@given(
    history=st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 2**40)), max_size=30),
    flip=st.integers(0, 10**6),
    bit=st.integers(0, 7),
)
def test_a_flipped_bit_loses_at_most_the_record_it_hit(
    tmp_path_factory: pytest.TempPathFactory, history: list[tuple[str, int]], flip: int, bit: int
) -> None:
    """One bit flipped anywhere in an offsets file: the restart gives each tag the newest
    value of its records the flip left intact (the damaged record alone is lost, and
    reported), never a value that was not stored. A flip in the version field refuses the
    file instead (a format this code does not know: loud, not a silent reset)."""
    records = [encode_record(tag, value) for tag, value in history]
    data = bytearray(encode_file({}) + b"".join(records))
    position = flip % len(data)
    data[position] ^= 1 << bit
    path = tmp_path_factory.mktemp("flip") / "s.offsets"
    path.write_bytes(bytes(data))
    if 4 <= position < 6:
        with pytest.raises((OffsetsCorrupted, NewerFormat), match="version"):
            OffsetStore.open(str(path))
        return
    want: dict[str, int] = {}
    start = HEADER.size
    for (tag, value), record in zip(history, records, strict=True):
        if not start <= position < start + len(record):
            want[tag] = value
        start += len(record)
    store = OffsetStore.open(str(path))
    assert {tag: store.get(tag) for tag in "abcde"} == {tag: want.get(tag) for tag in "abcde"}
    store.close()


def test_a_file_of_an_unknown_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.offsets"
    path.write_bytes(HEADER.pack(b"SQOF", 2, 0) + encode_record("a", 1))
    with pytest.raises(NewerFormat, match=r"stream offsets format version 2 .* up to 1"):
        OffsetStore.open(str(path))


def test_a_round_compacts_a_file_with_many_more_records_than_tags(tmp_path: Path) -> None:
    """64 tags move in every round (one fdatasync each): past COMPACT_RECORDS_MIN records
    more than tags, a round replaces the file with one record per tag."""
    path = tmp_path / "s.offsets"
    store = OffsetStore.open(str(path))
    tags = [f"busy-{n}" for n in range(64)]
    rounds = COMPACT_RECORDS_MIN // len(tags) + 2
    for n in range(rounds):
        for tag in tags:
            store.store(tag, n)
        apply(store)
    store.close()
    record = len(encode_record(tags[0], 0))
    assert path.stat().st_size <= HEADER.size + 2 * len(tags) * record
    again = OffsetStore.open(str(path))
    assert {again.get(tag) for tag in tags} == {rounds - 1}
    again.close()
