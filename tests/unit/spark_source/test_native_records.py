"""The Spark source over a stream holding records that stream clients published (AMQP 1.0
messages stored as native records): their columns are what an AMQP 0-9-1 consumer gets,
body, properties and headers from the application properties, routing key the stream's
name, beside the 0-9-1 records of the same stream."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from rstream._pyamqp.message import Properties
from rstream.amqp import AMQPMessage

from spark_source.arrow import _data_only_payloads, arrow_schema, to_batch
from spark_source.logdir import read_range_columns, stream_directory
from spark_source.options import parse_options
from spark_source.source import BatchReader
from streamq.log.amqp10 import native_properties
from streamq.log.format import Message
from streamq.log.log import SegmentLog
from tests.unit.spark_source.conftest import SMALL, message


def native(n: int) -> Message:
    body = bytes(
        AMQPMessage(
            body=f"native-{n}".encode(),
            application_properties={"n": n},
            properties=Properties(message_id=f"id-{n}", content_type="text/plain"),
        )
    )
    return Message(b"", b"blue", native_properties(n), body)


def test_native_records_have_the_columns_amqp_consumers_see(tmp_path: Path) -> None:
    log = SegmentLog.open(stream_directory(str(tmp_path), "/", "mixed"), SMALL)
    for i in range(60):
        log.append([native(i) if i % 3 else message(i)], 1_000 + i)
    log.sync_blocking()
    log.close_blocking()
    reader = BatchReader(
        parse_options({"path": str(tmp_path), "stream": "mixed", "includeHeaders": "true"})
    )
    batches = [batch for part in reader.partitions() for batch in reader.read(part)]
    rows = pa.Table.from_batches(batches, schema=arrow_schema(True)).to_pylist()
    assert [r["offset"] for r in rows] == list(range(60))
    for i, row in enumerate(rows):
        if i % 3 == 0:
            assert row["body"] == message(i).body and row["routing_key"] == f"key.{i}"
            continue
        assert row["body"] == f"native-{i}".encode()
        assert (row["exchange"], row["routing_key"]) == ("", "mixed")
        assert row["properties"]["message_id"] == f"id-{i}"
        assert row["properties"]["content_type"] == "text/plain"
        assert row["headers"] == [
            {"key": "n", "value": str(i).encode()},
            {"key": "x-stream-filter-value", "value": b"blue"},
        ]


def data_only(n: int, size: int) -> Message:
    """A native record whose body is one AMQP 1.0 data section (vbin8 or vbin32)."""
    payload = bytes([n % 251]) * size
    if size < 256:
        body = b"\x00\x53\x75\xa0" + bytes([size]) + payload
    else:
        body = b"\x00\x53\x75\xb0" + size.to_bytes(4, "big") + payload
    return Message(b"", [b"", b"eu", b"us"][n % 3], native_properties(n), body)


def read_rows(directory: Path, stream: str) -> list[dict[str, object]]:
    reader = BatchReader(
        parse_options({"path": str(directory), "stream": stream, "includeHeaders": "true"})
    )
    batches = [batch for part in reader.partitions() for batch in reader.read(part)]
    rows: list[dict[str, object]] = pa.Table.from_batches(
        batches, schema=arrow_schema(True)
    ).to_pylist()
    return rows


def test_data_only_native_records_take_the_vectorised_path_with_the_same_columns(
    tmp_path: Path,
) -> None:
    """A stream of bodies only (what stream clients publish without properties): the
    columns equal the per-record conversion's, vbin8 and vbin32 bodies, filter values
    and none."""
    log = SegmentLog.open(stream_directory(str(tmp_path), "/", "plain"), SMALL)
    sizes = [0, 1, 200, 255, 256, 700]
    for i in range(90):
        log.append([data_only(i, sizes[i % len(sizes)])], 1_000 + i)
    log.sync_blocking()
    records = list(log.read(0, 100))
    log.close_blocking()
    reader = BatchReader(parse_options({"path": str(tmp_path), "stream": "plain"}))
    ranges = [r for part in reader.partitions() for r in part.ranges]
    chunks = [
        columns
        for r in ranges
        for columns in read_range_columns(r.store, r.base, r.start, r.end, 1000)
    ]
    assert chunks and all(_data_only_payloads(columns) is not None for columns in chunks)
    rows = read_rows(tmp_path, "plain")
    expected = to_batch(records, "plain", arrow_schema(True), True).to_pylist()
    assert rows == expected
    assert [r["body"] for r in rows] == [bytes([i % 251]) * sizes[i % 6] for i in range(90)]
    assert {r["routing_key"] for r in rows} == {"plain"}


def test_a_record_with_more_than_a_data_section_leaves_the_data_only_path(
    tmp_path: Path,
) -> None:
    directory = stream_directory(str(tmp_path), "/", "mixed")
    log = SegmentLog.open(directory, SMALL)
    for i in range(30):
        log.append([native(i) if i == 17 else data_only(i, 10 + i)], 1_000 + i)
    log.sync_blocking()
    records = list(log.read(0, 100))
    log.close_blocking()
    reader = BatchReader(parse_options({"path": str(tmp_path), "stream": "mixed"}))
    ranges = [r for part in reader.partitions() for r in part.ranges]
    part = next(r for r in ranges if r.start <= 17 < r.end)
    chunks = read_range_columns(part.store, part.base, part.start, part.end, 1000)
    assert any(_data_only_payloads(columns) is None for columns in chunks)
    rows = read_rows(tmp_path, "mixed")
    assert rows == to_batch(records, "mixed", arrow_schema(True), True).to_pylist()
    assert rows[17]["properties"]["message_id"] == "id-17"
