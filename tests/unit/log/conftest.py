from __future__ import annotations

from collections.abc import Iterator

import pytest

from streamq.log.format import Message
from streamq.log.log import LogConfig, SegmentLog


def message(i: int, size: int = 20) -> Message:
    body = (f"body-{i}-".encode() * (size // 8 + 1))[:size]
    return Message(b"amq.direct", f"key.{i}".encode(), b"\x80\x00\x00\x00\x00\x01", body)


@pytest.fixture
def small_config() -> LogConfig:
    return LogConfig(segment_bytes_max=2048, index_interval_bytes=256)


@pytest.fixture
def log(tmp_path: pytest.TempPathFactory, small_config: LogConfig) -> Iterator[SegmentLog]:
    opened = SegmentLog.open(str(tmp_path / "log"), small_config)
    yield opened
    if opened.failed is None:
        opened.close_blocking()
