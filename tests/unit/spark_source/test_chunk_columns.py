"""The Spark source's columnar read of a stream in chunks (format version 2,
`chunkdir.read_range_columns`): for any range, the same records as the per-record
reader (`read_range_records`), in batches of at most `records_max` rows, whether chunks
are small (joined into one batch) or large (each a batch of its own), with filter values
and with compressed sub-entry batches (decoded in Python, then joined as runs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_source import chunkdir
from spark_source.arrow import _records
from spark_source.logdir import stream_directory
from spark_source.store import LocalStore
from streamq.log import format as fmt
from streamq.log.chunk import SimpleEntry, SubBatch
from streamq.log.log import LogConfig, SegmentLog
from tests.unit.log.test_log_chunk_runs import batch

CHUNK_SIZES = (1, 7, 300, 3)  # entries per chunk, in turn
BIG = 700  # a body this big makes a chunk past JOIN_BYTES_MAX with 400 entries


def write(directory: str, big_every: int) -> int:
    """Chunks of varying sizes, some with filter values, one compressed batch; returns
    the record count."""
    config = LogConfig(format_version=2, segment_bytes_max=64 << 20)
    log = SegmentLog.open(directory, config)
    n = 0
    for round_number in range(24):
        size = CHUNK_SIZES[round_number % len(CHUNK_SIZES)]
        if round_number % big_every == big_every - 1:
            size = 400
        entries: list[SimpleEntry | SubBatch] = []
        for _ in range(size):
            body = (b"b-%06d-" % n).ljust(BIG if size == 400 else 12, b".")
            entries.append(SimpleEntry(body, b"eu" if n % 5 == 0 else b""))
            n += 1
        log.append_entries(entries, 1_000 + round_number)
        log.sync_blocking()
    messages = [b"z-%06d" % k for k in range(n, n + 5)]
    log.append_entries([batch(messages, 1)], 9_000)  # gzip
    log.sync_blocking()
    log.close_blocking()
    return n + len(messages)


def by_columns(store: LocalStore, base: int, start: int, end: int, size: int) -> list[fmt.Record]:
    out: list[fmt.Record] = []
    for part in chunkdir.read_range_columns(store, base, start, end, size):
        rows = part if isinstance(part, list) else _records(part)
        assert 0 < len(rows) <= size
        out += rows
    return out


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> tuple[LocalStore, int, int]:
    root = str(tmp_path_factory.mktemp("columns"))
    directory = stream_directory(root, "/", "chunks")
    count = write(directory, big_every=5)
    names = sorted(name for name in os.listdir(directory) if name.endswith(fmt.SEGMENT_SUFFIX))
    assert len(names) == 1, names
    base = fmt.parse_segment_name(names[0])
    assert base is not None
    return LocalStore(directory), base, count


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_columns_are_the_records_of_any_range(
    stream: tuple[LocalStore, int, int], data: st.DataObject
) -> None:
    store, base, count = stream
    start = data.draw(st.integers(0, count))
    end = data.draw(st.integers(start, count + 3))
    size = data.draw(st.sampled_from((1, 5, 64, 1000, 10_000)))
    expected = [r for batch in chunkdir.read_range_records(store, base, start, end, size)
                for r in batch]  # fmt: skip
    assert [r.offset for r in expected] == list(range(start, min(end, count)))
    assert by_columns(store, base, start, end, size) == expected


def test_a_large_chunk_is_a_batch_of_its_own(stream: tuple[LocalStore, int, int]) -> None:
    """A run of JOIN_BYTES_MAX or more is not joined with its neighbours."""
    store, base, count = stream
    sizes = [len(part) if isinstance(part, list) else part.record_count
             for part in chunkdir.read_range_columns(store, base, 0, count, 10_000)]  # fmt: skip
    assert 400 in sizes
    assert sum(sizes) == count


def test_the_local_store_sees_the_one_segment(tmp_path: Path) -> None:
    directory = stream_directory(str(tmp_path), "/", "one")
    count = write(directory, big_every=100)
    store = LocalStore(directory)
    names = [n for n in os.listdir(directory) if n.endswith(fmt.SEGMENT_SUFFIX)]
    base = fmt.parse_segment_name(names[0])
    assert base is not None
    assert by_columns(store, base, 0, count, 10_000) == [
        r for batch in chunkdir.read_range_records(store, base, 0, count, 10_000) for r in batch
    ]


class CountingFile:
    """A segment file in memory that counts what is read from it."""

    read_bytes = 1 << 20

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.fetched = 0
        self.reads = 0

    def pread(self, length: int, position: int) -> bytes:
        return self.data[position : position + length]

    def pread_into(self, buffer: memoryview, position: int) -> int:
        got = self.data[position : position + len(buffer)]
        buffer[: len(got)] = got
        self.fetched += len(got)
        self.reads += 1
        return len(got)

    def size(self) -> int:
        return len(self.data)

    def close(self) -> None:
        """Nothing held."""


@pytest.mark.parametrize(
    "frame", [100, CountingFile.read_bytes - 30, CountingFile.read_bytes + 4_000]
)
def test_the_window_reads_each_byte_once(frame: int) -> None:
    """Frames read in turn (a head, then the frame from the same place) fetch every byte
    of the segment once, in reads of `read_bytes` or more, whatever the frames' size."""
    data = bytes(range(256)) * (10 * CountingFile.read_bytes // 256)
    file = CountingFile(data)
    window = chunkdir._Window(file, len(data))
    position = 0
    while position < len(data):
        assert bytes(window.read(60, position)) == data[position : position + 60]
        body = window.read(min(frame, len(data) - position), position)
        assert bytes(body) == data[position : position + frame]
        position += len(body)
    assert file.fetched == len(data)
    assert file.reads <= len(data) // CountingFile.read_bytes + 1
