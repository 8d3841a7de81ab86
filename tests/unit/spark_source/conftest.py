"""Logs for the spark_source unit tests, written by the broker's own SegmentLog into the
directory layout the broker uses (`vhosts/<sha1>/streams/<sha1>`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from amqp_gateway.codec.properties import BasicProperties, encode_properties
from spark_source.logdir import stream_directory
from streamq.log.format import Message
from streamq.log.log import LogConfig, SegmentLog

# Encoded by the broker's own codec, which the spark_source decoder must agree with.
PROPERTIES = encode_properties(
    BasicProperties(content_type="text/plain", headers={"k": "v", "n": 7}, delivery_mode=2)
)
SMALL: LogConfig = LogConfig(segment_bytes_max=2048, index_interval_bytes=256)


def message(i: int) -> Message:
    return Message(b"amq.direct", f"key.{i}".encode(), PROPERTIES, f"body-{i:05d}".encode())


StreamWriter = Callable[[str, int, int], SegmentLog]


@pytest.fixture
def write_stream(tmp_path: Path) -> Iterator[StreamWriter]:
    """`write_stream(name, count, first_ms)`: a synced log of `count` messages, timestamps
    first_ms, first_ms + 1, ... in small segments; the log stays open for more appends."""
    opened: list[SegmentLog] = []

    def write(name: str, count: int, first_ms: int = 1_000) -> SegmentLog:
        log = SegmentLog.open(stream_directory(str(tmp_path), "/", name), SMALL)
        opened.append(log)
        for i in range(count):
            log.append([message(log.next_offset)], first_ms + i)
        log.sync_blocking()
        return log

    yield write
    for log in opened:
        if log.failed is None:
            log.close_blocking()
