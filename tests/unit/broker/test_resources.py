"""Resource limits: sizes as operators write them, and the alarm reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamq.broker.resources import (
    ResourceLimits,
    ResourceMonitor,
    parse_memory_limit,
    parse_size,
    physical_memory_bytes,
    process_memory_bytes,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1048576", 1 << 20), ("512MiB", 512 << 20), ("2GB", 2 * 10**9), ("1.5 KiB", 1536)],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "12XB", "-5", "1e9"])
def test_bad_sizes_say_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_a_memory_limit_may_be_a_fraction_of_ram() -> None:
    assert parse_memory_limit("0.5") == int(0.5 * physical_memory_bytes())
    assert parse_memory_limit("256MiB") == 256 << 20


def test_alarm_reasons(tmp_path: Path) -> None:
    monitor = ResourceMonitor(str(tmp_path), ResourceLimits(1 << 50, 0))
    assert monitor.check(log_out_of_space=False) == ""
    monitor.limits = ResourceLimits(1, 0)
    assert monitor.check(log_out_of_space=False) == "low on memory"
    monitor.limits = ResourceLimits(1 << 50, 1 << 60)
    assert monitor.check(log_out_of_space=False) == "low on disk"
    monitor.limits = ResourceLimits(1, 1 << 60)
    assert monitor.check(log_out_of_space=False) == "low on memory & disk"
    monitor.limits = ResourceLimits(1 << 50, 0)
    assert monitor.check(log_out_of_space=True) == "low on disk"  # a log met a full disk


def test_resident_memory_is_read_afresh_each_time() -> None:
    """The statm descriptor stays open between reads; each read still sees the RSS of
    that moment."""
    before = process_memory_bytes()
    block = bytearray(64 << 20)
    block[::4096] = b"\1" * len(range(0, len(block), 4096))  # touch every page
    grown = process_memory_bytes()
    del block
    assert grown - before >= 60 << 20
    assert process_memory_bytes() < grown
