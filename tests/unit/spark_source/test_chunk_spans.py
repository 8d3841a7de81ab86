"""Large chunks of data sections alone (what stream clients publish without properties)
are read straight from the frame (`chunkdir.MessageSpans`, `arrow._spans_batches`): the
batches equal those of the record path, for any range, with and without the properties
and headers columns, next to chunks that must take the record path (a message with
properties, small chunks, a compressed batch) and chunks with filter values.

Method: one version-2 segment of such chunks; every read is made twice, once as it is
and once with SPANS_RECORDS_MIN past any chunk (the record path for all), and the two
tables compared."""

from __future__ import annotations

import os

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs
import pytest

from spark_source import arrow, chunkdir
from spark_source.arrow import read_partition
from spark_source.planning import SegmentRange
from spark_source.store import LocalStore
from streamq.log.amqp10 import to_amqp10
from streamq.log.chunk import SimpleEntry, SubBatch
from streamq.log.log import LogConfig, SegmentLog
from tests.unit.log.test_log_chunk_runs import batch

STREAM = "events"
LARGE = 1_500  # records of a chunk read as spans (at least SPANS_RECORDS_MIN)
HUGE = 12_345  # more than a batch's rows: the chunk's spans are cut into batches


def section(n: int, size: int = 20) -> bytes:
    """A message that is one AMQP 1.0 data section (a one-byte length up to 255)."""
    payload = (b"p-%06d-" % n).ljust(size, b".")
    if size < 256:
        return b"\x00\x53\x75\xa0" + bytes([len(payload)]) + payload
    return b"\x00\x53\x75\xb0" + len(payload).to_bytes(4, "big") + payload


def write(directory: str) -> int:
    """The chunks, in order; returns the record count."""
    log = SegmentLog.open(directory, LogConfig(format_version=2, segment_bytes_max=256 << 20))
    n = 0

    def chunk(entries: list[SimpleEntry | SubBatch]) -> None:
        nonlocal n
        log.append_entries(entries, 1_000 + n)
        log.sync_blocking()
        n += sum(e.records if isinstance(e, SubBatch) else 1 for e in entries)

    chunk([SimpleEntry(section(n + k)) for k in range(LARGE)])  # spans
    chunk([SimpleEntry(section(n + k, 300)) for k in range(LARGE)])  # 4-byte lengths
    chunk([SimpleEntry(section(n + k), b"eu" if k % 3 else b"") for k in range(LARGE)])
    with_properties = to_amqp10(b"x", b"", b"\x80\x00\x0atext/plain", b"body")
    chunk([SimpleEntry(section(n + k) if k != 700 else with_properties) for k in range(LARGE)])
    chunk([SimpleEntry(section(n + k) if k else with_properties) for k in range(LARGE)])
    for _ in range(4):
        chunk([SimpleEntry(section(n + k)) for k in range(3)])  # small: joined records
    chunk([batch([section(n + k) for k in range(5)], 1)])  # gzip: the Python path
    chunk([SimpleEntry(section(n + k)) for k in range(HUGE)])
    log.close_blocking()
    return n


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[LocalStore, int]:
    directory = str(tmp_path_factory.mktemp("spans") / "log")
    count = write(directory)
    assert os.path.exists(os.path.join(directory, "00000000000000000000.seg"))
    return LocalStore(directory), count


def table(part: SegmentRange, include_headers: bool, columns: tuple[str, ...] | None) -> pa.Table:
    batches = list(read_partition(part, include_headers, True, columns))
    assert all(0 < b.num_rows <= arrow.BATCH_RECORDS_MAX for b in batches)
    return pa.Table.from_batches(batches)


@pytest.mark.parametrize("include_headers", [False, True])
@pytest.mark.parametrize("columns", [None, ("offset", "body"), ("body", "properties")])
@pytest.mark.parametrize(
    "bounds", [(0, None), (17, 1_499), (1_400, 4_600), (5_900, 7_700), (7_512, None)]
)
def test_spans_give_the_record_paths_batches(
    store: tuple[LocalStore, int],
    monkeypatch: pytest.MonkeyPatch,
    include_headers: bool,
    columns: tuple[str, ...] | None,
    bounds: tuple[int, int | None],
) -> None:
    local, count = store
    start, end = bounds[0], bounds[1] if bounds[1] is not None else count
    part = SegmentRange(STREAM, local, 0, start, end)
    fast = table(part, include_headers, columns)
    with monkeypatch.context() as patch:
        patch.setattr(chunkdir, "SPANS_RECORDS_MIN", 1 << 62)
        patch.setattr(chunkdir, "JOIN_BYTES_MAX", 1 << 62)
        slow = table(part, include_headers, columns)
    assert fast.num_rows == end - start
    assert fast.equals(slow)


def test_which_chunks_come_as_spans(store: tuple[LocalStore, int]) -> None:
    local, count = store

    def kinds(filter_values_ok: bool) -> list[str]:
        spans = chunkdir.Spans(arrow._frame_payloads, filter_values_ok)
        return [
            "spans" if isinstance(item, chunkdir.MessageSpans) else "records"
            for item in chunkdir.read_range_columns(local, 0, 0, count, 10_000, spans=spans)
        ]

    # The filter values' chunk is spans only where the reader does not build properties;
    # the chunk with one message with properties is records, as are the small ones.
    assert kinds(False)[:3] == ["spans", "spans", "records"]
    assert kinds(False).count("spans") == 3
    every = kinds(True)
    assert every[:4] == ["spans", "spans", "spans", "records"]
    assert every[-1] == "spans"  # the huge chunk: one item, cut into batches later
    assert every.count("spans") == 4
