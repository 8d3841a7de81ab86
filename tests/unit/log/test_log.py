"""SegmentLog behaviour: offsets, durability boundary, reads and seeks across segments,
head drops, group commit and reopening."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from pathlib import Path

import pytest

from streamq.log import format as fmt
from streamq.log.errors import LogClosed, OffsetOutOfRange, RecordTooLarge
from streamq.log.log import CompanionWork, LogConfig, SegmentLog
from tests.unit.log.conftest import message


def as_messages(records: list[fmt.Record]) -> list[fmt.Message]:
    return [fmt.Message(r.exchange, r.routing_key, r.properties, r.body) for r in records]


def test_offsets_are_dense_from_zero_and_reads_stop_at_the_durable_end(log: SegmentLog) -> None:
    assert (log.start_offset, log.next_offset, log.durable_next) == (0, 0, 0)
    assert log.append([message(i) for i in range(3)], 1000) == 0
    assert log.append([message(i) for i in range(3, 5)], 1000) == 3
    assert log.next_offset == 5
    assert log.read(0, 100) == []  # appended but not yet durable
    assert log.sync_blocking() == 5
    records = log.read(0, 100)
    assert [r.offset for r in records] == [0, 1, 2, 3, 4]
    assert as_messages(records) == [message(i) for i in range(5)]
    assert log.read(5, 10) == []


def test_reads_across_segment_boundaries_from_every_offset(log: SegmentLog) -> None:
    batch = [message(i, size=i % 97) for i in range(300)]
    log.append(batch, 5)
    log.sync_blocking()
    assert len(log.segments()) > 5
    for start in range(300):
        for records_max in (1, 7, 1000):
            records = log.read(start, records_max)
            assert [r.offset for r in records] == list(range(start, min(300, start + records_max)))
            assert as_messages(records) == batch[start : start + records_max]


def test_segments_roll_at_the_size_limit_and_are_named_by_first_offset(
    log: SegmentLog, tmp_path: Path
) -> None:
    log.append([message(i, size=100) for i in range(100)], 1)
    log.sync_blocking()
    infos = log.segments()
    for info, following in itertools.pairwise(infos):
        assert info.size_bytes <= log.config.segment_bytes_max
        assert info.next_offset == following.base_offset
        assert not info.active
    assert infos[-1].active
    names = sorted(os.listdir(tmp_path / "log"))
    assert fmt.segment_name(infos[1].base_offset) in names
    assert fmt.index_name(infos[1].base_offset) in names  # closed segments have an index
    assert fmt.index_name(infos[-1].base_offset) not in names  # the active one has none


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(log: SegmentLog) -> None:
    log.append([message(0), message(1, size=5000), message(2)], 1)
    log.sync_blocking()
    assert as_messages(log.read(0, 10)) == [message(0), message(1, size=5000), message(2)]
    assert [s.base_offset for s in log.segments()] == [0, 1, 2]


def test_record_too_large_appends_nothing(tmp_path: Path) -> None:
    log = SegmentLog.open(str(tmp_path), LogConfig(record_bytes_max=1000))
    with pytest.raises(RecordTooLarge, match="exceeds 1000"):
        log.append([message(0), message(1, size=2000)], 1)
    assert log.next_offset == 0
    log.close_blocking()


def test_seek_timestamp_finds_the_first_record_at_or_after_it(log: SegmentLog) -> None:
    for ts in range(100, 160):
        log.append([message(ts, size=60) for _ in range(3)], ts)
    log.sync_blocking()
    assert len(log.segments()) > 3
    assert log.seek_timestamp(0) == 0
    for ts in range(100, 160):
        assert log.seek_timestamp(ts) == (ts - 100) * 3
    assert log.seek_timestamp(160) == log.durable_next


def test_timestamps_never_decrease(log: SegmentLog) -> None:
    log.append([message(0)], 500)
    log.append([message(1)], 400)  # the clock stepped back
    log.sync_blocking()
    assert [r.timestamp_ms for r in log.read(0, 2)] == [500, 500]


def test_drop_segments_before_keeps_the_active_segment_and_never_reuses_offsets(
    tmp_path: Path, small_config: LogConfig
) -> None:
    log = SegmentLog.open(str(tmp_path), small_config)
    log.append([message(i, size=200) for i in range(50)], 1)
    log.sync_blocking()
    infos = log.segments()
    assert log.drop_segments_before(infos[2].base_offset + 1) == 2
    assert log.start_offset == infos[2].base_offset
    with pytest.raises(
        OffsetOutOfRange, match=f"before the first retained offset {infos[2].base_offset}"
    ):
        log.read(0, 1)
    assert log.drop_segments_before(1 << 62) == len(infos) - 3
    assert [s.active for s in log.segments()] == [True]
    log.close_blocking()
    reopened = SegmentLog.open(str(tmp_path), small_config)
    assert reopened.next_offset == 50
    assert reopened.append([message(50)], 2) == 50
    reopened.sync_blocking()
    assert reopened.read(reopened.start_offset, 100)[-1].offset == 50
    reopened.close_blocking()


def test_reopen_keeps_every_synced_record_and_the_indexes(
    tmp_path: Path, small_config: LogConfig
) -> None:
    log = SegmentLog.open(str(tmp_path), small_config)
    batch = [message(i, size=i % 50) for i in range(200)]
    log.append(batch, 7)
    log.close_blocking()
    reopened = SegmentLog.open(str(tmp_path), small_config)
    assert reopened.next_offset == reopened.durable_next == 200
    assert as_messages(reopened.read(0, 1000)) == batch
    assert reopened.segments() == log.segments()
    with pytest.raises(LogClosed):
        log.append([message(0)], 1)
    reopened.close_blocking()


def test_durable_marker_file_follows_sync(log: SegmentLog) -> None:
    path = os.path.join(log.directory, fmt.DURABLE_FILE)
    log.append([message(0), message(1)], 1)
    with open(path, "rb") as f:
        assert fmt.decode_durable(f.read()) == 0
    log.sync_blocking()
    with open(path, "rb") as f:
        assert fmt.decode_durable(f.read()) == 2


async def test_sync_group_commits_concurrent_callers_off_the_loop_thread(
    log: SegmentLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fifty writers append and await sync at once: far fewer fsync rounds than writers run,
    all on the Syncer thread, and every writer sees its own records durable."""
    threads: set[int] = set()
    calls = 0
    real = os.fdatasync

    def counting_fdatasync(fd: int) -> None:
        nonlocal calls
        calls += 1
        threads.add(threading.get_ident())
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)

    async def writer(i: int) -> tuple[int, int]:
        offset = log.append([message(i)], 1)
        return offset, await log.sync()

    results = await asyncio.gather(*(writer(i) for i in range(50)))
    assert all(durable > offset for offset, durable in results)
    assert log.durable_next == 50
    assert 1 <= calls <= 4
    assert threading.get_ident() not in threads


async def test_a_cancelled_sync_waiter_does_not_cancel_the_round(log: SegmentLog) -> None:
    log.append([message(0)], 1)
    first = asyncio.ensure_future(log.sync())
    second = asyncio.ensure_future(log.sync())
    await asyncio.sleep(0)
    first.cancel()
    assert await asyncio.wait_for(second, 10) == 1
    assert log.durable_next == 1


async def test_close_syncs_pending_appends(tmp_path: Path, small_config: LogConfig) -> None:
    log = SegmentLog.open(str(tmp_path), small_config)
    log.append([message(i) for i in range(10)], 1)
    await log.close()
    reopened = SegmentLog.open(str(tmp_path), small_config)
    assert reopened.durable_next == 10
    reopened.close_blocking()


async def test_companion_writes_land_on_the_syncer_before_their_fdatasync(
    log: SegmentLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A companion hands the round bytes to append (a journal block): the Syncer thread
    writes them, then fdatasyncs that file; the event loop's thread writes nothing."""
    path = tmp_path / "journal"
    companion = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    loop_thread = threading.get_ident()
    blocks = [b"first block", b"second"]

    def prepare() -> CompanionWork:
        return CompanionWork((), (), [(companion, blocks.pop(0))])

    sizes_at_sync: list[int] = []
    writers: list[int] = []
    real_fdatasync, real_write = os.fdatasync, os.write

    def recording_fdatasync(fd: int) -> None:
        if os.fstat(fd).st_ino == os.fstat(companion).st_ino:
            sizes_at_sync.append(os.fstat(fd).st_size)
        real_fdatasync(fd)

    def recording_write(fd: int, data: bytes) -> int:
        if os.fstat(fd).st_ino == os.fstat(companion).st_ino:
            writers.append(threading.get_ident())
        return real_write(fd, data)

    monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
    monkeypatch.setattr(os, "write", recording_write)
    log.add_sync_companion(prepare)
    await log.sync(companions=True)
    await log.sync(companions=True)
    log.remove_sync_companion(prepare)
    os.close(companion)  # the rounds wrote through duplicates
    assert path.read_bytes() == b"first blocksecond"
    assert sizes_at_sync == [11, 17], "each block is on the file before its fdatasync"
    assert writers and loop_thread not in writers


async def test_companion_files_are_synced_in_the_same_round(
    log: SegmentLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue's ack file has new data but the log has none: sync(companions=True) still
    runs a round that fdatasyncs it, and a plain sync with nothing pending runs none."""
    companion = os.open(tmp_path / "acks", os.O_WRONLY | os.O_CREAT)
    prepared = 0
    acted: list[int] = []

    def prepare() -> CompanionWork:
        nonlocal prepared
        prepared += 1
        os.write(companion, b"ack")
        # The action runs on the Syncer thread after the fdatasyncs of the round.
        return CompanionWork([companion], [lambda: acted.append(len(synced))])

    synced: list[int] = []
    real = os.fdatasync

    def recording_fdatasync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
    log.add_sync_companion(prepare)
    assert await log.sync() == 0
    assert prepared == 0 and synced == []
    await log.sync(companions=True)
    assert prepared == 1
    assert os.fstat(companion).st_ino in synced
    assert acted == [len(synced)]
    log.remove_sync_companion(prepare)
    os.close(companion)  # the round worked on a duplicate; closing ours is safe
    log.append([message(0)], 1)
    await log.sync()
    assert prepared == 1


def test_timestamps_never_decrease_across_a_reopen_after_a_roll(
    tmp_path: Path, small_config: LogConfig
) -> None:
    """Found by the state machine: a crash right after a roll leaves the new active segment
    empty, and the reopened log must still remember the newest timestamp of older ones."""
    log = SegmentLog.open(str(tmp_path), small_config)
    log.append([message(0, size=1500)], 900)
    log.sync_blocking()
    log.append([message(1, size=1500)], 950)  # rolls: segment 1 exists, its record buffered
    log._release()  # a kill: the buffered record is lost, the new segment file stays
    again = SegmentLog.open(str(tmp_path), small_config)
    assert [(s.base_offset, s.next_offset) for s in again.segments()] == [(0, 1), (1, 1)]
    again.append([message(1)], 700)  # a clock that stepped back
    again.sync_blocking()
    assert [r.timestamp_ms for r in again.read(0, 10)] == [900, 900]
    assert again.seek_timestamp(900) == 0
    again.close_blocking()


@pytest.mark.timeout(20)
async def test_sync_yields_while_a_finished_rounds_callback_is_pending(log: SegmentLog) -> None:
    """Regression: a sync() that found the round's future done but its completion callback
    not yet run awaited the done future (which does not yield) in a loop forever; the
    broker hung when its periodic journal flush met a confirm's round that way.

    Method: start a round, wait on the fsync thread (without yielding) until the round's
    work is over, then yield once: the future becomes done and its callback is queued
    behind this task, which then calls sync()."""
    log.append([message(0)], 1)
    inflight = log._inflight = log._start_round()  # as sync() does
    log._syncer.submit(lambda: None).result(timeout=10)
    await asyncio.sleep(0)
    log.append([message(1)], 2)
    assert await log.sync() == 2  # in this task: a new task would start after the callback
    assert inflight.done()


def test_timestamps_never_decrease_after_every_older_segment_was_dropped(
    tmp_path: Path, small_config: LogConfig
) -> None:
    """Found by the state machine: a crash right after a roll leaves the new active segment
    empty; retention then drops every older segment, and the broker crashes again. Only
    the empty segment's header still knows the newest timestamp the log had."""
    log = SegmentLog.open(str(tmp_path), small_config)
    log.append([message(0, size=1500)], 900)
    log.sync_blocking()
    log.append([message(1, size=1500)], 950)  # rolls; the record is lost in the kill
    log._release()
    again = SegmentLog.open(str(tmp_path), small_config)
    assert again.drop_segments_before(1) == 1  # only the empty segment 1 is left
    again._release()
    third = SegmentLog.open(str(tmp_path), small_config)
    third.append([message(1)], 700)  # a clock that stepped back
    third.sync_blocking()
    assert [r.timestamp_ms for r in third.read(1, 10)] == [900]
    third.close_blocking()
