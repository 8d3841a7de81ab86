"""Bit rot under the Spark source: a damaged record fails the read by default (as
failOnDataLoss=true fails a Kafka query on lost data) and, with failOnDataLoss=false, is
skipped with a warning while every other record is read, as the broker's consumers skip
it (docs/durability.md, "Bit rot")."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest

from spark_source.arrow import arrow_schema
from spark_source.logdir import stream_directory
from spark_source.options import parse_options
from spark_source.source import BatchReader
from streamq.log.errors import SegmentCorrupted
from tests.unit.spark_source.conftest import StreamWriter

COUNT = 200


def flip_body_of(directory: str, offset: int) -> Path:
    """Flip one byte of the body of the record at `offset` (its body is unique)."""
    body = f"body-{offset:05d}".encode()
    for path in sorted(Path(directory).glob("*.seg")):
        data = bytearray(path.read_bytes())
        at = data.find(body)
        if at >= 0:
            data[at + len(body) - 1] ^= 0x01
            path.write_bytes(bytes(data))
            return path
    raise AssertionError(f"no record {offset} found")


def offsets(tmp_path: Path, fail_on_data_loss: str) -> list[int]:
    options = {"path": str(tmp_path), "stream": "rot", "failOnDataLoss": fail_on_data_loss}
    reader = BatchReader(parse_options(options))
    batches = [batch for part in reader.partitions() for batch in reader.read(part)]
    table = pa.Table.from_batches(batches, schema=arrow_schema(False))
    return [int(v) for v in table.column("offset").to_pylist()]


@pytest.mark.parametrize("damaged", [0, 57, 58, COUNT - 1])
def test_a_damaged_record_fails_the_read_or_is_skipped_with_fail_on_data_loss_false(
    tmp_path: Path, write_stream: StreamWriter, damaged: int, caplog: pytest.LogCaptureFixture
) -> None:
    log = write_stream("rot", COUNT)
    log.close_blocking()
    path = flip_body_of(stream_directory(str(tmp_path), "/", "rot"), damaged)
    with pytest.raises(SegmentCorrupted):
        offsets(tmp_path, "true")
    with caplog.at_level(logging.WARNING, logger="spark_source.logdir"):
        got = offsets(tmp_path, "false")
    assert got == [n for n in range(COUNT) if n != damaged]
    warned = [r.getMessage() for r in caplog.records if "damaged records" in r.getMessage()]
    assert warned and str(path) in warned[0] and f"from offset {damaged} " in warned[0]
