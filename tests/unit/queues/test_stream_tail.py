"""A stream's in-memory tail: reads from it equal reads from the log, durable part only."""

from __future__ import annotations

import os

import pytest

from retention.rules import RetentionRules
from streamq.log.format import Record
from streamq.log.log import LogConfig, SegmentLog
from streamq.queues import stream as stream_module
from streamq.queues.offsets import OffsetStore
from streamq.queues.stream import READ_RECORDS_MAX, StreamQueue


def open_stream(directory: str) -> StreamQueue:
    log = SegmentLog.open(os.path.join(directory, "log"), LogConfig(segment_bytes_max=64 * 1024))
    return StreamQueue(log, RetentionRules(), OffsetStore.open(os.path.join(directory, "offsets")))


def append(stream: StreamQueue, i: int, body_bytes: int = 16, timestamp_ms: int = 1000) -> int:
    body = i.to_bytes(4, "little") * (body_bytes // 4)
    return stream.append(b"ex", f"rk{i % 3}".encode(), b"\x00\x00", body, timestamp_ms + i)


def read_all(stream: StreamQueue, offset: int) -> list[Record]:
    out: list[Record] = []
    while batch := stream.read(offset):
        assert len(batch) <= READ_RECORDS_MAX
        out.extend(batch)
        offset = batch[-1].offset + 1
    return out


def test_tail_reads_equal_log_reads_only_once_durable(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    for i in range(1000):
        append(stream, i)
    assert stream.read(0) == []  # not durable yet: not readable, tail or not
    stream.log.sync_blocking()
    for i in range(1000, 1010):
        append(stream, i)  # appended after the sync: not readable yet
    from_tail = read_all(stream, 0)
    assert len(from_tail) == 1000
    assert from_tail == stream.log.read(0, 1000)
    assert stream.read(1000) == [] and stream.read(1005) == []
    stream.log.close_blocking()


def test_tail_trims_and_older_offsets_come_from_the_log(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_module, "TAIL_RECORDS_MAX", 100)
    monkeypatch.setattr(stream_module, "TAIL_BYTES_MAX", 8 * 1024)
    stream = open_stream(str(tmp_path))
    for i in range(700):
        append(stream, i, body_bytes=16 if i % 7 else 1024)  # trims by count and by bytes
    append(stream, 700, body_bytes=16 * 1024)  # larger than the tail's cap: not kept
    append(stream, 701)
    append(stream, 702, timestamp_ms=0)  # an earlier timestamp is raised, in the tail too
    stream.log.sync_blocking()
    expected = stream.log.read(0, 1000)
    assert len(expected) == 703
    assert read_all(stream, 0) == expected
    for offset in (0, 350, 650, 699, 700, 701, 702):
        assert stream.read(offset) == expected[offset : offset + READ_RECORDS_MAX]
    stream.log.close_blocking()


def test_reopened_stream_reads_what_it_had(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    for i in range(300):
        append(stream, i)
    stream.log.close_blocking()
    stream.offsets.close()
    reopened = open_stream(str(tmp_path))
    append(reopened, 300)
    reopened.log.sync_blocking()
    records = read_all(reopened, 0)
    assert [r.offset for r in records] == list(range(301))
    reopened.log.close_blocking()
