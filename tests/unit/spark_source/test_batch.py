"""Batch reads without a JVM: the reader classes are called as Spark's planner and
executors would call them, over logs written by the broker's SegmentLog."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from spark_source.arrow import arrow_schema
from spark_source.logdir import stream_directory
from spark_source.options import parse_options
from spark_source.planning import DataLoss, StreamNotFound
from spark_source.source import BatchReader, StreamqPartition, spark_schema
from streamq.log import format as fmt
from streamq.log.errors import SegmentCorrupted
from tests.unit.spark_source.conftest import StreamWriter, message


def read_all(tmp_path: Path, **options: str) -> tuple[list[StreamqPartition], pa.Table]:
    reader = BatchReader(parse_options({"path": str(tmp_path), **options}))
    parts = list(reader.partitions())
    batches = [batch for part in parts for batch in reader.read(part)]
    schema = arrow_schema(options.get("includeHeaders") == "true")
    return parts, pa.Table.from_batches(batches, schema=schema)


@pytest.mark.parametrize("include_headers", [False, True])
def test_arrow_schema_is_what_spark_derives(include_headers: bool) -> None:
    expected = to_arrow_schema(spark_schema(include_headers), timezone="UTC")
    assert arrow_schema(include_headers).equals(expected)


def test_reads_every_record_with_its_fields(tmp_path: Path, write_stream: StreamWriter) -> None:
    write_stream("events", 120)
    parts, table = read_all(
        tmp_path, stream="events", includeHeaders="true", maxRecordsPerPartition="20"
    )
    assert len(parts) == 6  # 120 records, 20 per partition across small segments
    rows = table.to_pylist()
    assert [r["offset"] for r in rows] == list(range(120))
    assert [r["body"] for r in rows] == [message(i).body for i in range(120)]
    first = rows[7]
    assert first["routing_key"] == "key.7"
    assert first["exchange"] == "amq.direct"
    assert first["stream"] == "events"
    assert first["timestamp"].timestamp() == pytest.approx(1.007)
    assert first["properties"]["content_type"] == "text/plain"
    assert first["properties"]["delivery_mode"] == 2
    assert first["headers"] == [{"key": "k", "value": b"v"}, {"key": "n", "value": b"7"}]


def test_json_offsets_bound_the_read(tmp_path: Path, write_stream: StreamWriter) -> None:
    write_stream("events", 120)
    _, table = read_all(
        tmp_path,
        stream="events",
        startingOffsets='{"events": 30}',
        endingOffsets='{"events": 75}',
    )
    assert table.column("offset").to_pylist() == list(range(30, 75))


def test_min_partitions_splits_one_segment(tmp_path: Path, write_stream: StreamWriter) -> None:
    write_stream("events", 10)
    parts, table = read_all(tmp_path, stream="events", minPartitions="4")
    assert len(parts) == 4
    assert [(p.part.start, p.part.end) for p in parts] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert table.column("offset").to_pylist() == list(range(10))


def test_timestamps_select_by_append_time(tmp_path: Path, write_stream: StreamWriter) -> None:
    write_stream("events", 120, 1_000)  # record i appended at 1000 + i ms
    _, table = read_all(tmp_path, stream="events", startingTimestamp="1050", endingTimestamp="1090")
    assert table.column("offset").to_pylist() == list(range(50, 90))
    _, none = read_all(tmp_path, stream="events", startingTimestamp="99999")
    assert none.num_rows == 0


def test_reads_only_durable_records(tmp_path: Path, write_stream: StreamWriter) -> None:
    # Records on disk past the `durable` marker (a crash between write and fsync) must
    # not be read: rewind the marker of a synced log and read again.
    write_stream("events", 50)
    marker = os.path.join(stream_directory(str(tmp_path), "/", "events"), fmt.DURABLE_FILE)
    with open(marker, "wb") as f:
        f.write(fmt.encode_durable(42))
    _, table = read_all(tmp_path, stream="events")
    assert table.column("offset").to_pylist() == list(range(42))
    with pytest.raises(ValueError, match="past the end of the log \\(42 durable\\)"):
        read_all(tmp_path, stream="events", endingOffsets='{"events": 45}')


def test_stale_index_is_ignored(tmp_path: Path, write_stream: StreamWriter) -> None:
    write_stream("events", 120)
    directory = stream_directory(str(tmp_path), "/", "events")
    index = os.path.join(directory, fmt.index_name(0))
    with open(index, "r+b") as f:
        f.seek(60)
        f.write(b"\xff\xff\xff\xff")  # entry bytes: the CRC no longer matches
    _, table = read_all(tmp_path, stream="events", startingOffsets='{"events": 5}')
    assert table.column("offset").to_pylist() == list(range(5, 120))


def test_several_streams(tmp_path: Path, write_stream: StreamWriter) -> None:
    write_stream("a", 30)
    write_stream("b", 20)
    _, table = read_all(tmp_path, streams="a, b")
    rows = table.to_pylist()
    assert sorted((r["stream"], r["offset"]) for r in rows) == sorted(
        [("a", i) for i in range(30)] + [("b", i) for i in range(20)]
    )


def test_unknown_stream_is_an_error(tmp_path: Path, write_stream: StreamWriter) -> None:
    write_stream("events", 1)
    with pytest.raises(StreamNotFound, match="stream 'nope' not found in vhost '/'"):
        read_all(tmp_path, stream="nope")


def test_retention_before_planning(tmp_path: Path, write_stream: StreamWriter) -> None:
    log = write_stream("events", 120)
    assert log.drop_segments_before(50) > 0
    earliest = log.start_offset
    with pytest.raises(DataLoss, match="offsets 0\\.\\.") as lost:
        read_all(tmp_path, stream="events", startingOffsets='{"events": 0}')
    assert "failOnDataLoss=false" in str(lost.value)
    _, table = read_all(
        tmp_path, stream="events", startingOffsets='{"events": 0}', failOnDataLoss="false"
    )
    assert table.column("offset").to_pylist() == list(range(earliest, 120))
    _, table = read_all(tmp_path, stream="events")  # earliest is what is retained
    assert table.column("offset").to_pylist() == list(range(earliest, 120))


@pytest.mark.parametrize("fail", [True, False])
def test_retention_between_planning_and_read(
    tmp_path: Path, write_stream: StreamWriter, fail: bool
) -> None:
    log = write_stream("events", 120)
    options = parse_options(
        {"path": str(tmp_path), "stream": "events", "failOnDataLoss": str(fail)}
    )
    # One partition per segment, so that retention removes whole partitions' ranges.
    reader = BatchReader(dataclasses.replace(options, max_records_per_partition=None))
    parts = list(reader.partitions())
    log.drop_segments_before(parts[1].part.end)
    if fail:
        with pytest.raises(DataLoss, match=r"stream 'events': offsets 0\.\..* are gone"):
            list(reader.read(parts[0]))
    else:
        assert list(reader.read(parts[0])) == []
    later = [b for p in parts[2:] for b in reader.read(p)]
    assert pa.Table.from_batches(later).column("offset").to_pylist() == list(
        range(parts[2].part.start, 120)
    )


def test_reads_seek_with_the_index(tmp_path: Path, write_stream: StreamWriter) -> None:
    # Method: damage the first record of a sealed segment. A read that starts at a later
    # indexed record must not touch it (it seeks); a read from the start must fail on it.
    write_stream("events", 120)
    directory = stream_directory(str(tmp_path), "/", "events")
    with open(os.path.join(directory, fmt.index_name(0)), "rb") as f:
        index = fmt.decode_index(f.read())
    assert index is not None and len(index.entries) > 1
    later = index.entries[1][0]
    with open(os.path.join(directory, fmt.segment_name(0)), "r+b") as f:
        f.seek(fmt.SEGMENT_HEADER_BYTES + fmt.RECORD_HEADER_BYTES + 2)
        f.write(b"\x00\x00")  # inside record 0: its CRC no longer matches
    _, table = read_all(tmp_path, stream="events", startingOffsets=f'{{"events": {later}}}')
    assert table.column("offset").to_pylist() == list(range(later, 120))
    with pytest.raises(SegmentCorrupted, match="record checksum mismatch"):
        read_all(tmp_path, stream="events")


def test_invalid_utf8_routing_key_is_replaced(tmp_path: Path, write_stream: StreamWriter) -> None:
    log = write_stream("events", 1)
    log.append([fmt.Message(b"x", b"bad\xff", b"\x00\x00", b"body")], 2_000)
    log.sync_blocking()
    _, table = read_all(tmp_path, stream="events")
    assert table.column("routing_key").to_pylist() == ["key.0", "bad\ufffd"]
    assert table.column("properties").to_pylist()[1]["content_type"] is None


def test_max_records_per_partition_groups_segments(
    tmp_path: Path, write_stream: StreamWriter
) -> None:
    write_stream("events", 120)
    _, per_segment = read_all(tmp_path, stream="events")
    parts, table = read_all(tmp_path, stream="events", maxRecordsPerPartition="50")
    assert [sum(r.end - r.start for r in p.ranges) for p in parts] == [50, 50, 20]
    assert len(parts[0].ranges) > 1  # the small segments share a partition
    assert table.equals(per_segment)
    parts, table = read_all(
        tmp_path, stream="events", maxRecordsPerPartition="1000", minPartitions="3"
    )
    assert [sum(r.end - r.start for r in p.ranges) for p in parts] == [40, 40, 40]
    assert table.equals(per_segment)


def test_max_records_per_partition_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="maxRecordsPerPartition must be a positive integer"):
        parse_options({"path": str(tmp_path), "stream": "s", "maxRecordsPerPartition": "0"})
