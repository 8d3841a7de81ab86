"""How segment writes use the page cache (docs/durability.md, "The page cache"): a
stream's segments are written through it, with write-back started at each write, so a
reader just behind the writers finds the bytes in memory; a message log's go past it
(O_DIRECT). Residency is asked of the kernel (tests/page_cache.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from streamq.broker.queue import Queue
from streamq.broker.streams import open_stream
from streamq.log import files
from streamq.log import writer as writer_module
from streamq.log.chunk import SimpleEntry
from streamq.log.format import segment_name
from streamq.log.log import LogConfig, SegmentLog
from streamq.log.syncer import Syncer
from tests.page_cache import resident_fraction

from .conftest import message

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="mincore and sync_file_range are Linux's"
)


def segment_paths(log: SegmentLog) -> list[str]:
    return [os.path.join(log.directory, segment_name(s.base_offset)) for s in log.segments()]


def write_and_sync(log: SegmentLog, count: int = 400) -> None:
    log.append([message(i, size=4000) for i in range(count)], 1000)
    log.sync_blocking()


def test_stream_settings_leave_written_segments_in_the_page_cache(tmp_path: Path) -> None:
    """Plain writes with write-back: after the fsync every page of the segments is still
    in memory, where a consumer just behind reads it (and `sendfile` takes it)."""
    log = SegmentLog.open(str(tmp_path / "log"), LogConfig(direct_io=False, write_behind=True))
    write_and_sync(log)
    assert all(resident_fraction(p) == 1.0 for p in segment_paths(log))
    assert [r.offset for r in log.read(0, 1000)] == list(range(400))
    log.close_blocking()


def test_direct_writes_leave_the_page_cache_empty(tmp_path: Path) -> None:
    """The message log's default: the written blocks never enter the page cache (the
    segment's header, written plainly at creation, may)."""
    log = SegmentLog.open(str(tmp_path / "log"), LogConfig(direct_io=True))
    write_and_sync(log)
    active = log._active.writer
    assert active is not None and active.direct, "this file system refuses O_DIRECT"
    assert all(resident_fraction(p) < 0.01 for p in segment_paths(log))
    log.close_blocking()


def test_write_behind_starts_write_back_for_each_plain_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every plain write of a write-behind log asks for its own range's write-back, which
    the kernel accepts; a direct log never asks."""
    asked: list[tuple[int, int, bool]] = []

    def start_writeback(fd: int, offset: int, length: int) -> bool:
        accepted = files.start_writeback(fd, offset, length)
        asked.append((offset, length, accepted))
        return accepted

    monkeypatch.setattr(writer_module, "start_writeback", start_writeback)
    log = SegmentLog.open(str(tmp_path / "behind"), LogConfig(direct_io=False, write_behind=True))
    write_and_sync(log)
    assert asked and all(accepted for _, _, accepted in asked)
    assert sum(length for _, length, _ in asked) >= 400 * 4000  # every byte written
    log.close_blocking()
    asked.clear()
    direct = SegmentLog.open(str(tmp_path / "direct"), LogConfig(direct_io=True))
    write_and_sync(direct)
    assert asked == []
    direct.close_blocking()


def test_start_writeback_refuses_what_is_not_an_open_file(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"x" * 10000)
    assert files.start_writeback(fd, 0, 10000)
    os.close(fd)
    assert not files.start_writeback(fd, 0, 10000)  # EBADF: the write-back is the kernel's


def test_streams_are_written_through_the_page_cache(tmp_path: Path) -> None:
    syncer = Syncer()
    queue = Queue("s", True, None, False, {"x-queue-type": "stream"})
    stream = open_stream(str(tmp_path / "s"), queue, syncer)
    try:
        assert stream.log.config.direct_io is False
        assert stream.log.config.write_behind is True
        entries = [SimpleEntry(bytes(4000)) for _ in range(400)]
        stream.log.append_entries(entries, 1000)
        stream.log.sync_blocking()
        assert stream.log.next_offset == 400
        assert all(resident_fraction(p) == 1.0 for p in segment_paths(stream.log))
    finally:
        stream.log.close_blocking()
        stream.publishers.close()
        stream.offsets.close()
        syncer.close()
