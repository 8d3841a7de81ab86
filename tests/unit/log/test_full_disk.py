"""A full disk holds the log's writes back instead of failing the log.

Method: a real tmpfs of 1-2 MiB, mounted for each test, filled by a file the test creates
and later deletes; no mock of our own code. A write that finds no room must leave the
files cut back to their last good position, the log not failed, nothing reported durable
early; once the filler goes, the same bytes land in order, once.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamq.log.errors import LogClosed, OutOfSpace
from streamq.log.log import CompanionWork, LogConfig, SegmentLog
from streamq.log.writer import SegmentWriter, staging_buffer
from tests.small_fs import fill, small_filesystem
from tests.unit.log.conftest import message

WAIT_S = 10
KIB = 1 << 10


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[Path]:
    with small_filesystem(tmp_path / "fs", "2m") as mounted:
        yield mounted


def tight_config() -> LogConfig:
    return LogConfig(
        segment_bytes_max=256 * KIB,
        index_interval_bytes=4096,
        write_buffer_bytes_max=64 * KIB,
        writes_pending_bytes_max=256 * KIB,
    )


def append_until_out_of_space(log: SegmentLog) -> int:
    """Append 1 KiB messages, syncing every 32, until a sync finds no room; returns the
    durable end at that moment."""
    for i in range(10_000):
        log.append([message(i, size=1000)], 1000 + i)
        if i % 32 == 31:
            try:
                log.sync_blocking()
            except OutOfSpace:
                return log.durable_next
    raise AssertionError("the file system never filled")


@pytest.mark.parametrize("direct", [True, False])
def test_a_write_that_finds_no_room_is_cut_back_and_can_be_repeated(fs: Path, direct: bool) -> None:
    path = fs / "segment"
    path.touch()
    staging = staging_buffer()
    writer = SegmentWriter(str(path), 0, direct=direct)
    first = os.urandom(5000)  # ends inside a block: a direct write pads it
    writer.write(0, first, staging)
    filler = fill(fs / "filler", 64 * KIB)
    second = os.urandom(300 * KIB)
    with pytest.raises(OutOfSpace) as caught:
        writer.write(5000, second, staging)
    assert caught.value.errno == errno.ENOSPC and "No space left" in str(caught.value)
    assert writer.end == 5000
    assert os.path.getsize(path) == 5000  # the blocks the write took are given back
    filler.unlink()
    writer.write(5000, second, staging)
    writer.finish(cut_padding=True)
    assert path.read_bytes() == first + second


def test_the_log_holds_its_writes_while_out_of_space_and_resumes(fs: Path) -> None:
    log = SegmentLog.open(str(fs / "log"), tight_config())
    filler = fill(fs / "filler", 512 * KIB)
    durable = append_until_out_of_space(log)
    assert log.out_of_space and log.failed is None
    assert str(fs / "log") in log._syncer.out_of_space
    for i in range(log.next_offset, log.next_offset + 40):  # accepted, held in memory
        log.append([message(i, size=1000)], 1000 + i)
    with pytest.raises(OutOfSpace):
        log.sync_blocking()  # a retry: still no room, nothing more is durable
    assert log.durable_next == durable
    assert [r.offset for r in log.read(0, 100_000)] == list(range(durable))
    filler.unlink()
    end = log.next_offset
    assert log.sync_blocking() == end
    assert not log.out_of_space and str(fs / "log") not in log._syncer.out_of_space
    records = log.read(0, 100_000)
    assert [r.offset for r in records] == list(range(end))
    assert [r.body for r in records] == [message(i, size=1000).body for i in range(end)]
    log.close_blocking()
    again = SegmentLog.open(str(fs / "log"), tight_config())
    assert [r.body for r in again.read(0, 100_000)] == [r.body for r in records]
    again.close_blocking()


def test_a_kill_while_out_of_space_keeps_every_durable_record(fs: Path) -> None:
    log = SegmentLog.open(str(fs / "log"), tight_config())
    filler = fill(fs / "filler", 512 * KIB)
    durable = append_until_out_of_space(log)
    log._release()  # as a kill: the held writes are lost, none was reported durable
    filler.unlink()
    again = SegmentLog.open(str(fs / "log"), tight_config())
    assert again.next_offset >= durable
    records = again.read(0, 100_000)
    assert [r.body for r in records[:durable]] == [
        message(i, size=1000).body for i in range(durable)
    ]
    again.close_blocking()


async def test_sync_waits_for_room_and_the_log_retries_by_itself(fs: Path) -> None:
    log = SegmentLog.open(str(fs / "log"), tight_config())
    filler = fill(fs / "filler", 512 * KIB)
    i = 0
    waiting: asyncio.Task[int] | None = None
    while waiting is None or not log.out_of_space:
        assert i < 10_000, "the file system never filled"
        log.append([message(i, size=1000)], 1000 + i)
        i += 1
        if i % 32 == 0:
            waiting = asyncio.ensure_future(log.sync())
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while not waiting.done() and not log.out_of_space:
                assert asyncio.get_running_loop().time() < deadline, "sync hung"
                await asyncio.sleep(0.001)
            if waiting.done():
                waiting.result()
                waiting = None
    durable = log.durable_next
    await asyncio.sleep(0.3)  # several retries, all finding no room
    assert not waiting.done() and log.durable_next == durable and log.failed is None
    filler.unlink()
    assert await asyncio.wait_for(waiting, WAIT_S) == i  # no call: the timer retried
    assert not log.out_of_space
    assert [r.offset for r in log.read(0, 100_000)] == list(range(i))
    await log.close()


def test_companion_writes_that_find_no_room_are_retried_in_order(fs: Path) -> None:
    """A queue journal's blocks are written by the round: each must land once, in
    order, and the round that could not write them covers no one's companion work."""
    log = SegmentLog.open(str(fs / "log"), tight_config())
    journal = fs / "journal"
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    blocks = [bytes([n]) * (100 * KIB) for n in range(1, 9)]
    handed: list[bytes] = []

    def prepare() -> CompanionWork:
        block = blocks[len(handed)] if len(handed) < len(blocks) else b""
        if block:
            handed.append(block)
            return CompanionWork((), (), [(fd, block)])
        return CompanionWork((fd,))

    log.add_sync_companion(prepare)
    filler = fill(fs / "filler", 256 * KIB)
    refused = 0
    while len(handed) < len(blocks):
        try:
            log.sync_blocking()
        except OutOfSpace:
            refused += 1
            assert log.failed is None
    assert refused > 0
    filler.unlink()
    log.sync_blocking()
    assert not log.out_of_space
    assert journal.read_bytes() == b"".join(blocks)
    log.remove_sync_companion(prepare)
    os.close(fd)
    log.close_blocking()


async def test_close_does_not_wait_for_room(fs: Path) -> None:
    """A shutdown on a full disk must not hang: the held appends (never reported durable)
    are given up, and a sync still waiting is told the log is closed."""
    log = SegmentLog.open(str(fs / "log"), tight_config())
    filler = fill(fs / "filler", 512 * KIB)
    durable = append_until_out_of_space(log)
    log.append([message(log.next_offset, size=1000)], 5000)
    waiting = asyncio.ensure_future(log.sync())
    await asyncio.sleep(0)
    await asyncio.wait_for(log.close(), WAIT_S)
    with pytest.raises(LogClosed):
        await asyncio.wait_for(waiting, WAIT_S)
    assert str(fs / "log") not in log._syncer.out_of_space
    filler.unlink()  # recovery writes (index files): it needs room
    again = SegmentLog.open(str(fs / "log"), tight_config())
    assert [r.offset for r in again.read(0, 100_000)][:durable] == list(range(durable))
    again.close_blocking()
