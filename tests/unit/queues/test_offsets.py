"""Stored stream offsets: the ack watermark, the file, torn and corrupt records,
compaction."""

from __future__ import annotations

from pathlib import Path

import pytest

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
