"""A 0-9-1 publish run to a stream in chunks (`converted_run.append_converted`) stores
byte for byte what appending each message's `_converted` entry stores: AMQP 1.0
conversions, filter values from the header (as runs), native records in the record form
kept as their bodies, across the chunk limit; an entry over `record_bytes_max` falls
back to the per-entry path and its RecordTooLarge."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from amqp_gateway.codec.properties import BasicProperties, encode_properties
from streamq.log import amqp10
from streamq.log.errors import RecordTooLarge
from streamq.log.log import LogConfig, RunMessage, SegmentLog
from streamq.queues.converted_run import append_converted
from streamq.queues.stream import _converted

PLAIN = encode_properties(BasicProperties(delivery_mode=2))
EU = encode_properties(BasicProperties(headers={"x-stream-filter-value": "eu"}))
US = encode_properties(BasicProperties(content_type="a/b", headers={"x-stream-filter-value": "us"}))


def messages() -> list[RunMessage]:
    out: list[RunMessage] = []
    for n in range(300):
        properties = (PLAIN, EU, EU, US, amqp10.native_properties(0))[n % 5]
        out.append((properties, b"body %05d " % n * (1 + n % 7), "", "", 0))
    return out


def stored(directory: Path, config: LogConfig, convert: bool) -> bytes:
    log = SegmentLog.open(str(directory), config)
    run = messages()
    for start in range(0, len(run), 100):
        part = run[start : start + 100]
        if convert:
            first = append_converted(log, b"ex", b"native-value", part, 1_000 + start)
            assert first == start
        else:
            log.append_entries([_converted(b"ex", b"native-value", m[0], m[1]) for m in part],
                               1_000 + start)  # fmt: skip
        log.sync_blocking()
    log.close_blocking()
    return b"".join(
        (directory / name).read_bytes() for name in sorted(os.listdir(directory))
        if name.endswith(".seg")
    )  # fmt: skip


def test_the_run_stores_what_the_per_entry_path_stores(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes_max=8192, format_version=2, chunk_data_bytes_max=3000)
    by_run = stored(tmp_path / "run", config, True)
    by_entry = stored(tmp_path / "entry", config, False)
    assert by_run == by_entry
    assert len(by_run) > 4 * 8192  # several segments, several chunks each


def test_an_entry_over_the_limit_falls_back_to_the_per_entry_path(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes_max=64 * 1024, format_version=2, record_bytes_max=1000)
    log = SegmentLog.open(str(tmp_path / "log"), config)
    run: list[RunMessage] = [(PLAIN, b"small", "", "", 0), (PLAIN, b"x" * 2000, "", "", 0)]
    assert append_converted(log, b"", b"q", run, 1) is None
    assert log.next_offset == 0
    with pytest.raises(RecordTooLarge):
        log.append_entries([_converted(b"", b"q", m[0], m[1]) for m in run], 1)
    log.close_blocking()
