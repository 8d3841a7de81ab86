"""The stream reader's offsets without a JVM: the calls Spark's micro-batch engine makes
(initialOffset, latestOffset with each read limit, partitions, read), in its order."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from spark_source.admission import cap_rows
from spark_source.logdir import stream_directory
from spark_source.options import parse_options
from spark_source.source import StreamReader
from streamq.broker.definitions import encode_file
from tests.unit.spark_source.conftest import StreamWriter, message


def reader(tmp_path: Path, **options: str) -> StreamReader:
    return StreamReader(parse_options({"path": str(tmp_path), **options}))


def offsets_read(stream_reader: StreamReader, start: dict[str, int], end: dict[str, int]) -> list:
    parts = stream_reader.partitions(start, end)
    batches = [b for p in parts for b in stream_reader.read(p)]
    if not batches:
        return []
    table = pa.Table.from_batches(batches)
    return list(
        zip(table.column("stream").to_pylist(), table.column("offset").to_pylist(), strict=True)
    )


def test_initial_latest_is_resolved_once(tmp_path: Path, write_stream: StreamWriter) -> None:
    log = write_stream("events", 10)
    r = reader(tmp_path, stream="events", startingOffsets="latest")
    assert r.initialOffset() == {"events": 10}
    log.append([message(10)], 9_000)
    log.sync_blocking()
    assert r.initialOffset() == {"events": 10}  # Spark asks twice; the answer must not move
    end = r.latestOffset({"events": 10}, ReadAllAvailable())
    assert end == {"events": 11}
    assert offsets_read(r, {"events": 10}, end) == [("events", 10)]


def test_max_rows_batches_cover_the_log_exactly(tmp_path: Path, write_stream: StreamWriter) -> None:
    write_stream("events", 95)
    r = reader(tmp_path, stream="events", maxOffsetsPerTrigger="30")
    limit = r.getDefaultReadLimit()
    assert limit == ReadMaxRows(30)
    start = r.initialOffset()
    seen = []
    sizes = []
    while (end := r.latestOffset(start, limit)) != start:
        got = offsets_read(r, start, end)
        sizes.append(len(got))
        seen.extend(got)
        r.commit(end)
        start = end
    assert sizes == [30, 30, 30, 5]
    assert seen == [("events", i) for i in range(95)]
    assert r.reportLatestOffset() == {"events": 95}
    assert r.partitions(start, start) == []


def test_available_now_stops_at_its_target(tmp_path: Path, write_stream: StreamWriter) -> None:
    log = write_stream("events", 40)
    r = reader(tmp_path, stream="events", maxOffsetsPerTrigger="25")
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    log.append([message(i) for i in range(40, 60)], 9_000)
    log.sync_blocking()
    first = r.latestOffset(start, r.getDefaultReadLimit())
    second = r.latestOffset(first, r.getDefaultReadLimit())
    assert (first, second) == ({"events": 25}, {"events": 40})
    assert r.latestOffset(second, ReadAllAvailable()) == {"events": 40}


def test_min_rows_waits_for_enough_records(tmp_path: Path, write_stream: StreamWriter) -> None:
    log = write_stream("events", 5)
    r = reader(tmp_path, stream="events", minOffsetsPerTrigger="10", maxTriggerDelay="1h")
    assert r.getDefaultReadLimit() == ReadMinRows(10)
    start = r.initialOffset()
    assert r.latestOffset(start, ReadMinRows(10)) == {"events": 0}
    log.append([message(i) for i in range(5, 12)], 9_000)
    log.sync_blocking()
    assert r.latestOffset(start, ReadMinRows(10)) == {"events": 12}
    # Under AvailableNow Spark passes ReadAllAvailable: a small backlog is read too.
    assert r.latestOffset({"events": 12}, ReadAllAvailable()) == {"events": 12}
    r2 = reader(tmp_path, stream="events", minOffsetsPerTrigger="100", maxTriggerDelay="0s")
    assert r2.latestOffset({"events": 10}, ReadMinRows(100)) == {"events": 12}


def test_two_streams_share_the_budget(tmp_path: Path, write_stream: StreamWriter) -> None:
    write_stream("a", 60)
    write_stream("b", 20)
    r = reader(tmp_path, streams="b,a", maxOffsetsPerTrigger="40")
    start = r.initialOffset()
    assert start == {"a": 0, "b": 0}
    assert list(start) == ["a", "b"]
    end = r.latestOffset(start, ReadMaxRows(40))
    assert end == {"a": 30, "b": 10}
    assert len(offsets_read(r, start, end)) == 40


@pytest.mark.parametrize(
    ("start", "latest", "rows", "expected"),
    [
        ({"a": 0, "b": 0}, {"a": 3, "b": 3}, 10, {"a": 3, "b": 3}),
        ({"a": 0, "b": 0, "c": 0}, {"a": 1, "b": 1, "c": 1}, 2, {"a": 1, "b": 1, "c": 0}),
        ({"a": 5}, {"a": 100, "b": 7}, 10, {"a": 15, "b": 7}),
    ],
)
def test_cap_rows(
    start: dict[str, int], latest: dict[str, int], rows: int, expected: dict[str, int]
) -> None:
    assert cap_rows(start, latest, rows) == expected


def test_end_below_start_fails_loudly(tmp_path: Path, write_stream: StreamWriter) -> None:
    write_stream("events", 10)
    r = reader(tmp_path, stream="events")
    with pytest.raises(ValueError, match="end offset 3 is below start 5"):
        r.partitions({"events": 5}, {"events": 3})


def test_pattern_picks_up_new_streams_from_earliest(
    tmp_path: Path, write_stream: StreamWriter
) -> None:
    def declare(*names: str) -> None:
        ops = [{"op": "queue", "name": n, "arguments": {"x-queue-type": "stream"}} for n in names]
        vhost_dir = os.path.dirname(os.path.dirname(stream_directory(str(tmp_path), "/", "x")))
        with open(os.path.join(vhost_dir, "definitions"), "wb") as f:
            f.write(encode_file(ops))

    write_stream("s.a", 10)
    declare("s.a")
    r = reader(tmp_path, streamPattern=r"s\..*")
    start = r.initialOffset()
    assert start == {"s.a": 0}
    first = r.latestOffset(start, ReadAllAvailable())
    assert first == {"s.a": 10}
    write_stream("s.b", 5)
    declare("s.a", "s.b")
    second = r.latestOffset(first, ReadAllAvailable())
    assert second == {"s.a": 10, "s.b": 5}
    assert sorted(offsets_read(r, first, second)) == [("s.b", i) for i in range(5)]
