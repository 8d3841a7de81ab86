"""The Spark source over a stream holding records that stream clients published (AMQP 1.0
messages stored as native records): their columns are what an AMQP 0-9-1 consumer gets,
body, properties and headers from the application properties, routing key the stream's
name, beside the 0-9-1 records of the same stream."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from rstream._pyamqp.message import Properties
from rstream.amqp import AMQPMessage

from spark_source.arrow import arrow_schema
from spark_source.logdir import stream_directory
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
