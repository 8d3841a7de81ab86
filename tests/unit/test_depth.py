"""The pure parts of benchmarks/depth.py: its flags and its table (no broker starts)."""

from __future__ import annotations

import pytest

from benchmarks.depth import parse_args, table


def test_defaults_are_the_issue_s() -> None:
    args = parse_args(["streamq"])
    assert (args.messages, args.idle_s, args.json) == (1_000_000, 60.0, None)
    assert parse_args(["lavinmq", "--messages", "10000000"]).messages == 10_000_000


def test_too_few_messages_for_ten_queues_are_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["streamq", "--messages", "9"])


def test_table_formats_each_unit_and_missing_values() -> None:
    result: dict[str, object] = {
        "broker": "streamq",
        "messages": 200_000,
        "start_accept_s": 2.5,
        "rss_empty_mib": 49.17,
        "confirmed_one_queue": 200_000,
        "rss_one_queue_mib": None,
    }
    lines = table(result).splitlines()
    assert lines[0] == "| streamq, N = 200,000 | value |"
    assert "| fresh start: AMQP port accepting | 2.50 s |" in lines
    assert "| RSS, empty | 49.2 MiB |" in lines
    assert "| confirmed into one queue | 200,000 |" in lines
    assert "| RSS, N queued in one queue | n/a |" in lines
