"""`SegmentLog.chunk_run` on a version-2 log: the C path (`chunk_runs.frame_run`) makes
the run of chunks of simple entries and uncompressed batches, equal to the records that
`read` returns; chunks with a compressed batch take the Python path and give the same;
a chunk with a damaged entry has no run, and `read` then loses that entry alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streamq.log import chunk, chunk_runs, frame, reader
from streamq.log import format as fmt
from streamq.log.chunk import SimpleEntry, SubBatch
from streamq.log.chunk_runs import ChunkRun
from streamq.log.log import LogConfig, SegmentLog
from streamq.queues.sub_entries import compress

V2 = LogConfig(segment_bytes_max=1 << 20, index_interval_bytes=256, format_version=2)


@pytest.fixture
def log2(tmp_path: Path) -> Iterator[SegmentLog]:
    opened = SegmentLog.open(str(tmp_path / "log"), V2)
    yield opened
    if opened.failed is None:
        opened.close_blocking()


def batch(messages: list[bytes], compression: int) -> SubBatch:
    raw = compress(compression, messages)
    _kind, records, plain, _length = chunk.BATCH_HEADER.unpack_from(raw)
    return SubBatch(raw[chunk.BATCH_HEADER.size :], records, compression, plain)


def run_records(run: ChunkRun) -> list[fmt.Record]:
    out: list[fmt.Record] = []
    fmt.decode_records(run.data, 0, 0, run.first_offset, 1 << 62, out, 1 << 30, "run")
    return out


def python_path_refused(*_args: object) -> None:
    raise AssertionError("the Python path rendered a chunk the C path should have")


def test_runs_are_made_in_c_and_hold_what_read_returns(
    log2: SegmentLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "chunk_run", python_path_refused)
    entries = [SimpleEntry(b"a" * n, b"red" if n % 3 else b"") for n in range(20)]
    log2.append_entries(entries, 1_000)
    log2.sync_blocking()
    log2.append_entries([SimpleEntry(b"x"), batch([b"p", b"", b"qq"], 0), SimpleEntry(b"")], 1_001)
    log2.sync_blocking()
    for first, end in ((0, 20), (20, 25)):
        run = log2.chunk_run(first + 1)  # any offset of the chunk
        assert run is not None and run.first_offset == first
        assert run_records(run) == log2.read(first, end - first)
        assert [run.data[p + 8 : p + 16] for p in run.positions] == [
            (offset).to_bytes(8, "little") for offset in range(first, end)
        ]


def test_a_compressed_batch_takes_the_python_path(
    log2: SegmentLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[ChunkRun | None] = []
    real = chunk_runs.frame_run

    def spy(*args: object) -> ChunkRun | None:
        made.append(real(*args))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(reader, "frame_run", spy)
    gzip = batch([b"one", b"two"], chunk.COMPRESSION_GZIP)
    log2.append_entries([SimpleEntry(b"before"), gzip, SimpleEntry(b"after")], 5)
    log2.sync_blocking()
    run = log2.chunk_run(0)
    assert made == [None]  # C left it to Python ...
    assert run is not None and run_records(run) == log2.read(0, 4)  # ... which has a run
    assert [r.body for r in run_records(run)] == [b"before", b"one", b"two", b"after"]


def test_a_damaged_entry_has_no_run_and_read_loses_it_alone(
    log2: SegmentLog, tmp_path: Path
) -> None:
    for round_ in range(3):  # three chunks; the newest may still be read from memory
        log2.append_entries([SimpleEntry(b"m%d%d" % (round_, i) * 10) for i in range(4)], 5)
        log2.sync_blocking()
    path = tmp_path / "log" / fmt.segment_name(0)
    data = path.read_bytes()
    at = fmt.SEGMENT_HEADER_BYTES
    at += frame.frame_bytes(frame.check_frame(data, at))  # the second chunk's frame
    header = chunk.decode_header(data, at + frame.FRAME_HEAD_BYTES)
    with open(path, "r+b") as f:  # the second chunk's first body
        f.seek(at + frame.FRAME_HEAD_BYTES + chunk.HEADER_BYTES + header.bloom_size + 4 + 2)
        f.write(b"\xff")
    assert log2.chunk_run(4) is None
    assert [r.offset for r in log2.read(0, 20)] == [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11]
    assert [(s.first_offset, s.end_offset) for s in log2.damage.spans] == [(4, 5)]
    assert log2.chunk_run(0) is not None and log2.chunk_run(8) is not None
