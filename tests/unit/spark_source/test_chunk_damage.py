"""The Spark source over a stream in chunks (format version 2) with a damaged entry: the
read fails (failOnDataLoss true), or loses that record alone (false), found by the
entries' own CRC32Cs in the chunk's trailer (`streamq.log.salvage`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_source.logdir import stream_directory
from streamq.log.chunk import SimpleEntry
from streamq.log.errors import SegmentCorrupted
from streamq.log.log import LogConfig, SegmentLog
from tests.unit.spark_source.test_damage import flip_body_of, offsets

COUNT = 200
PER_CHUNK = 20


@pytest.mark.parametrize("damaged", [0, 57, COUNT - 1])
def test_a_damaged_entry_fails_the_read_or_is_skipped_alone(tmp_path: Path, damaged: int) -> None:
    config = LogConfig(segment_bytes_max=4096, format_version=2)
    log = SegmentLog.open(stream_directory(str(tmp_path), "/", "rot"), config)
    for first in range(0, COUNT, PER_CHUNK):
        bodies = [f"body-{n:05d}".encode() for n in range(first, first + PER_CHUNK)]
        log.append_entries([SimpleEntry(body) for body in bodies], 1_000 + first)
        log.sync_blocking()
    log.close_blocking()
    flip_body_of(stream_directory(str(tmp_path), "/", "rot"), damaged)
    with pytest.raises(SegmentCorrupted):
        offsets(tmp_path, "true")
    assert offsets(tmp_path, "false") == [n for n in range(COUNT) if n != damaged]
