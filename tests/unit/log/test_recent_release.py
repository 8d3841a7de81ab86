"""The log's in-memory tail at rest: the written buffers it keeps for readers right behind
the appenders go when no read has used them since the last check, reads are served from
the files then, and the tail fills and serves reads again with the next appends; its
size is capped by `limit_recent`. Real segment files on a real event loop.

Method: `read_record` reads through `read_at` (memory first, then the file), and
`recent_reads` counts the reads the kept buffers served. The checks are made by calling
`release_recent_if_unread` (the timer's period set to an hour, so that a loaded machine
cannot run one in between); one test lets the real timer, its period shortened, do it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path

import pytest

from streamq.log import log as log_module
from streamq.log import recent
from streamq.log.format import Message
from streamq.log.index import SparseIndex
from streamq.log.log import LogConfig, SegmentLog
from streamq.log.recent import RecentWrites
from streamq.log.segment import Segment
from tests.unit.log.conftest import message

HOUR_S = 3600.0
IDLE_S = 0.05
WAIT_TIMEOUT_S = 10.0
POLL_S = 0.01
KIB = 1024
CONFIG = LogConfig(
    segment_bytes_max=1 << 20, write_buffer_bytes_max=4 * KIB, recent_bytes_max=256 * KIB
)


@pytest.fixture
def no_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "IDLE_RELEASE_S", HOUR_S)


async def _append_and_sync(log: SegmentLog, messages: list[Message]) -> int:
    first = log.append(messages, 1000)
    await log.sync()
    return first


async def _wait_until_released(log: SegmentLog) -> float:
    """Seconds until the log keeps no buffer; fails after WAIT_TIMEOUT_S."""
    started = time.monotonic()
    while log.recent_bytes:
        assert time.monotonic() - started < WAIT_TIMEOUT_S, "the tail was never released"
        await asyncio.sleep(POLL_S)
    return time.monotonic() - started


def _body(log: SegmentLog, offset: int) -> bytes:
    return log.read_record(offset).body


async def test_the_tail_goes_when_unread_and_serves_again_after_appends(
    tmp_path: Path, no_timer: None
) -> None:
    log = SegmentLog.open(str(tmp_path / "log"), CONFIG)
    try:
        batch = [message(i, size=200) for i in range(200)]  # about 50 KiB: a dozen buffers
        await _append_and_sync(log, batch)
        assert log.recent_bytes > 0
        reads = log.recent_reads
        assert _body(log, 199) == batch[199].body
        assert log.recent_reads > reads  # served from memory

        # A reader near the tail keeps it, check after check.
        for offset in (150, 180, 199):
            assert log.release_recent_if_unread() == 0
            assert _body(log, offset) == batch[offset].body
        assert log.release_recent_if_unread() == 0
        kept = log.recent_bytes

        # No read since the last check: all of it goes.
        assert log.release_recent_if_unread() == kept
        assert log.recent_bytes == 0
        reads = log.recent_reads
        for offset in (0, 57, 150, 199):
            assert _body(log, offset) == batch[offset].body
        assert log.recent_reads == reads  # from the files
        assert [r.body for r in log.read(0, 300)] == [m.body for m in batch]

        # The next appends fill it again, and it serves them.
        more = [message(i, size=200) for i in range(200, 260)]
        first = await _append_and_sync(log, more)
        assert first == 200
        assert log.recent_bytes > 0
        for i, expected in enumerate(more):
            assert _body(log, first + i) == expected.body
        assert log.recent_reads > reads
        assert log.release_recent_if_unread() == 0  # those reads count
        assert log.release_recent_if_unread() > 0
        assert _body(log, 259) == more[-1].body
    finally:
        await log.close()


async def test_the_timer_releases_an_unread_tail_and_gives_its_memory_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_module, "IDLE_RELEASE_S", IDLE_S)
    trims: list[bool] = []
    trim = log_module.return_freed_memory
    monkeypatch.setattr(log_module, "return_freed_memory", lambda: trims.append(trim()))
    config = LogConfig(write_buffer_bytes_max=64 * KIB, recent_bytes_max=8 << 20)
    log = SegmentLog.open(str(tmp_path / "log"), config)
    try:
        for round_ in range(2):  # released, then filled and released again
            offsets = range(100 * round_, 100 * round_ + 100)
            batch = [message(i, size=20_000) for i in offsets]  # 2 MB, 30 buffers
            await _append_and_sync(log, batch)
            await _wait_until_released(log)
            deadline = time.monotonic() + WAIT_TIMEOUT_S
            while log._recent_timer is not None:  # until the memory is given back
                assert time.monotonic() < deadline, "the timer never stopped"
                await asyncio.sleep(POLL_S)
            assert trims == [True] * (round_ + 1)
            assert [r.body for r in log.read(100 * round_, 100)] == [m.body for m in batch]
    finally:
        await log.close()


async def test_a_release_leaves_buffers_being_written(tmp_path: Path, no_timer: None) -> None:
    log = SegmentLog.open(str(tmp_path / "log"), CONFIG)
    try:
        gate = concurrent.futures.Future[None]()
        # The Syncer thread runs writes in order: one held here holds the later ones.
        log._syncer.submit_write(lambda: gate.result(WAIT_TIMEOUT_S))
        log.append([message(i, size=500) for i in range(30)], 1000)  # flushes, not written
        held = log.recent_bytes
        assert held > 0
        assert log.release_recent_if_unread() == 0  # nothing of it is on disk yet
        assert log.recent_bytes == held
        gate.set_result(None)
        await log.sync()  # flushes the rest too
        written = log.recent_bytes
        assert written > held
        assert log.release_recent_if_unread() == written
        assert log.recent_bytes == 0
        assert [r.offset for r in log.read(0, 100)] == list(range(30))
    finally:
        await log.close()


async def test_limit_recent_caps_the_kept_bytes(tmp_path: Path, no_timer: None) -> None:
    # The written buffers beyond the limit go at the next flush (those still being
    # written at a flush stay until the one after) and at once on `limit_recent`.
    log = SegmentLog.open(str(tmp_path / "log"), CONFIG)
    slack = 2 * CONFIG.write_buffer_bytes_max
    try:
        assert log.recent_bytes_max == 256 * KIB
        await _append_and_sync(log, [message(i, size=1000) for i in range(600)])
        await _append_and_sync(log, [message(600)])
        assert 256 * KIB - slack <= log.recent_bytes <= 256 * KIB + slack
        log.limit_recent(32 * KIB)
        assert log.recent_bytes_max == 32 * KIB
        assert 32 * KIB <= log.recent_bytes <= 32 * KIB + slack
        await _append_and_sync(log, [message(i, size=1000) for i in range(601, 700)])
        await _append_and_sync(log, [message(700)])
        assert 32 * KIB <= log.recent_bytes <= 32 * KIB + slack
        log.limit_recent(1 << 30)  # never above the config's
        assert log.recent_bytes_max == 256 * KIB
        assert [r.offset for r in log.read(650, 100)] == list(range(650, 701))
    finally:
        await log.close()


async def test_a_closed_log_has_no_release_pending(tmp_path: Path, no_timer: None) -> None:
    log = SegmentLog.open(str(tmp_path / "log"), CONFIG)
    await _append_and_sync(log, [message(i, size=1000) for i in range(20)])
    assert log._recent_timer is not None
    await log.close()
    assert log._recent_timer is None


def test_without_an_event_loop_no_timer_is_armed(tmp_path: Path) -> None:
    log = SegmentLog.open(str(tmp_path / "log"), CONFIG)
    try:
        log.append([message(i, size=1000) for i in range(100)], 1000)
        log.sync_blocking()
        assert log.recent_bytes > 0
        assert log._recent_timer is None  # none armed: kept up to the limit
    finally:
        log.close_blocking()


def _done() -> concurrent.futures.Future[None]:
    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    future.set_result(None)
    return future


def test_release_if_unread_counts_reads_between_calls() -> None:
    trims: list[int] = []
    writes = RecentWrites(bytes_max=1 << 30, at_rest=lambda: trims.append(1))
    segment = Segment("/nonexistent/0", 0, SparseIndex(4096))
    big = recent.TRIM_AFTER_BYTES_MIN
    writes.add(segment, 64, bytearray(big), _done())
    writes.add(segment, 64 + big, bytearray(10), _done())
    assert writes.find(segment, 70)[0] is not None  # a read since the start
    assert writes.release_if_unread(writes_parked=False) == 0
    assert writes.release_if_unread(writes_parked=True) == 0  # none since: but parked
    assert len(writes) == 2
    assert writes.release_if_unread(writes_parked=False) == big + 10
    assert (len(writes), writes.bytes, trims) == (0, 0, [1])
    assert writes.find(segment, 70) == (None, -1)
    writes.add(segment, 74 + big, bytearray(10), _done())  # kept again after a release
    assert writes.find(segment, 80 + big)[1] == 74 + big
    assert writes.release_if_unread(writes_parked=False) == 0  # that read counted
    assert writes.release_if_unread(writes_parked=False) == 10
    assert trims == [1]  # 10 bytes are not worth a trim
    assert writes.release_if_unread(writes_parked=False) == 0
    assert trims == [1]  # nothing owed
    writes.add(segment, 84 + big, bytearray(big), _done())
    assert writes.release_if_unread(writes_parked=False) == big
    assert trims == [1] and writes.rest_owed  # added since the last call: appends go on
    writes.add(segment, 84 + 2 * big, bytearray(big), _done())
    assert writes.release_if_unread(writes_parked=False) == big
    assert trims == [1]  # still appending
    assert writes.release_if_unread(writes_parked=False) == 0
    assert trims == [1, 1] and not writes.rest_owed  # the appends stopped: paid now
    assert writes.release_if_unread(writes_parked=False) == 0
    assert trims == [1, 1]


def _shmem_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * KIB
    raise AssertionError("no RssShmem in /proc/self/status")


async def test_a_log_at_rest_gives_back_the_syncers_staging_buffer(
    tmp_path: Path, no_timer: None
) -> None:
    config = LogConfig(write_buffer_bytes_max=256 * KIB, recent_bytes_max=8 << 20)
    log = SegmentLog.open(str(tmp_path / "log"), config)
    syncer = log._syncer
    try:
        await _append_and_sync(log, [message(i, size=4000) for i in range(1000)])  # 4 MB
        syncer.staging[: 4 << 20] = b"x" * (4 << 20)  # as a 4 MiB direct write leaves it
        await asyncio.wrap_future(syncer.submit_write(lambda: None))
        resident = _shmem_bytes()
        assert _body(log, 999) == message(999, size=4000).body  # a reader near the tail
        assert log.release_recent_if_unread() == 0
        assert log.release_recent_if_unread() > recent.TRIM_AFTER_BYTES_MIN  # none since
        await asyncio.wrap_future(syncer.submit_write(lambda: None))
        assert _shmem_bytes() <= resident - (3 << 20)
        assert syncer.staging[:4096] == bytes(4096)  # (a read maps its pages again)
        assert [r.offset for r in log.read(990, 100)] == list(range(990, 1000))
    finally:
        await log.close()
