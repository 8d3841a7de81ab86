"""Segment writes with direct I/O (streamq/log/writer.py) and how the log uses them: the
file always holds exactly what was written, followed while it is open by zeros up to a
block boundary; sealing and closing cut the zeros; a crash leaves them for recovery to cut;
a write that fails fails the log."""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamq.log import format as fmt
from streamq.log import writer as writer_module
from streamq.log.errors import LogError, LogFailed
from streamq.log.log import LogConfig, SegmentLog
from streamq.log.writer import BLOCK_BYTES, SegmentWriter

from .conftest import message

HEADER = b"H" * 37  # a file that already holds some bytes, like a segment's header


def padded(size: int) -> int:
    return -(-size // BLOCK_BYTES) * BLOCK_BYTES


@settings(max_examples=60, deadline=None)
@given(
    chunks=st.lists(st.integers(0, 3 * BLOCK_BYTES + 100), min_size=1, max_size=12),
    direct=st.booleans(),
    staging_blocks=st.integers(1, 4),
)
def test_writes_land_in_order_with_padding_only_past_the_end(
    chunks: list[int], direct: bool, staging_blocks: int
) -> None:
    """Writes of any size, through a staging buffer smaller than some of them, leave the
    file holding the header and every write in order; direct writes pad with zeros to a
    block boundary, which `finish` cuts."""
    directory = tempfile.mkdtemp(prefix="sq-writer-")
    try:
        path = os.path.join(directory, "segment")
        with open(path, "wb") as f:
            f.write(HEADER)
        writer = SegmentWriter(path, len(HEADER), direct=direct)
        staging = mmap.mmap(-1, staging_blocks * BLOCK_BYTES)
        expected = bytearray(HEADER)
        for i, size in enumerate(chunks):
            data = bytes([i % 251 + 1]) * size
            writer.write(len(expected), data, staging)
            expected += data
            on_disk = Path(path).read_bytes()
            assert on_disk[: len(expected)] == expected
            assert len(on_disk) == (padded(len(expected)) if direct else len(expected))
            assert on_disk[len(expected) :] == bytes(len(on_disk) - len(expected))
        writer.finish(cut_padding=True)
        assert Path(path).read_bytes() == expected
        assert writer.fd == -1
    finally:
        shutil.rmtree(directory)


def test_a_write_not_at_the_end_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    path.write_bytes(HEADER)
    writer = SegmentWriter(str(path), len(HEADER), direct=True)
    staging = mmap.mmap(-1, BLOCK_BYTES)
    writer.write(len(HEADER), b"abc", staging)
    with pytest.raises(LogError, match="write at 37, but the segment ends at 40"):
        writer.write(len(HEADER), b"abc", staging)
    writer.finish(cut_padding=True)
    assert path.read_bytes() == HEADER + b"abc"


def active_path(log: SegmentLog) -> str:
    return os.path.join(log.directory, fmt.segment_name(log.segments()[-1].base_offset))


def test_a_synced_segment_is_padded_until_closed(tmp_path: Path) -> None:
    log = SegmentLog.open(str(tmp_path / "log"))
    log.append([message(i) for i in range(10)], 1000)
    log.sync_blocking()
    size = log.segments()[-1].size_bytes
    path = active_path(log)
    assert os.path.getsize(path) == padded(size)
    assert [r.offset for r in log.read(0, 100)] == list(range(10))
    log.close_blocking()
    assert os.path.getsize(path) == size


def test_sealing_cuts_the_padding(tmp_path: Path) -> None:
    log = SegmentLog.open(str(tmp_path / "log"), LogConfig(segment_bytes_max=2048))
    log.append([message(i, size=300) for i in range(20)], 1000)
    log.sync_blocking()
    infos = log.segments()
    assert len(infos) > 2
    for info in infos[:-1]:
        path = os.path.join(log.directory, fmt.segment_name(info.base_offset))
        assert os.path.getsize(path) == info.size_bytes
    log.close_blocking()


def test_a_crash_leaves_padding_that_the_reopen_cuts(tmp_path: Path) -> None:
    directory = str(tmp_path / "log")
    log = SegmentLog.open(directory)
    log.append([message(i) for i in range(10)], 1000)
    log.sync_blocking()
    size = log.segments()[-1].size_bytes
    path = active_path(log)
    log._release()  # a kill: files closed as they are
    assert os.path.getsize(path) == padded(size)
    reopened = SegmentLog.open(directory)
    assert os.path.getsize(path) == size
    assert reopened.next_offset == 10
    assert [r.body for r in reopened.read(0, 100)] == [message(i).body for i in range(10)]
    reopened.append([message(10)], 1001)
    reopened.sync_blocking()
    assert [r.offset for r in reopened.read(0, 100)] == list(range(11))
    reopened.close_blocking()


def test_a_segment_that_cannot_be_opened_for_writes_fails_the_log(tmp_path: Path) -> None:
    """The writer opens the segment by path at the first flush: a directory in its place
    fails the log there, and nothing is reported durable."""
    log = SegmentLog.open(str(tmp_path / "log"))
    path = active_path(log)
    os.remove(path)
    os.mkdir(path)
    log.append([message(0)], 1000)
    with pytest.raises(LogFailed, match="Is a directory"):
        log.sync_blocking()
    assert log.durable_next == 0
    with pytest.raises(LogFailed):
        log.append([message(1)], 1000)
    log.close_blocking()


def test_a_write_that_fails_on_the_syncer_thread_fails_the_log(tmp_path: Path) -> None:
    """A write error on the Syncer thread is raised by the next round: the sync fails the
    log and reports nothing more durable."""
    log = SegmentLog.open(str(tmp_path / "log"))
    log.append([message(0)], 1000)
    log.sync_blocking()
    writer = log._active.writer
    assert writer is not None
    os.close(writer.fd)
    writer.fd = os.open(tmp_path / "elsewhere", os.O_RDONLY | os.O_CREAT)  # not writable
    log.append([message(1)], 1000)
    with pytest.raises(LogFailed, match="Bad file descriptor"):
        log.sync_blocking()
    assert log.durable_next == 1
    log.close_blocking()


def test_appends_wait_for_the_disk_beyond_the_pending_limit(tmp_path: Path) -> None:
    """With a pending limit of one buffer, every flush waits for the one before it: what
    was handed to the Syncer thread never exceeds the limit by more than one buffer."""
    config = LogConfig(write_buffer_bytes_max=4096, writes_pending_bytes_max=4096)
    log = SegmentLog.open(str(tmp_path / "log"), config)
    for i in range(200):
        log.append([message(i, size=1000)], 1000)
        assert log._writes_bytes <= 2 * 4096 + 2000
    log.sync_blocking()
    assert [r.offset for r in log.read(0, 1000)] == list(range(200))
    log.close_blocking()


def test_direct_writes_the_file_system_refuses_fall_back_to_plain_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block size the device does not take (100 bytes here) makes the kernel refuse the
    direct write with EINVAL: the writer goes on with plain writes, losing nothing."""
    monkeypatch.setattr(writer_module, "BLOCK_BYTES", 100)
    path = tmp_path / "segment"
    path.write_bytes(HEADER)
    writer = SegmentWriter(str(path), len(HEADER), direct=True)
    staging = mmap.mmap(-1, 4096)
    writer.write(len(HEADER), b"first", staging)
    assert not writer.direct
    writer.write(len(HEADER) + 5, b"second", staging)
    assert path.read_bytes() == HEADER + b"firstsecond"
    writer.finish(cut_padding=True)
    assert path.read_bytes() == HEADER + b"firstsecond"
