"""The pure parts of benchmarks/compare.py: statistics, tables, arguments, parsing.

No brokers, sockets or subprocesses: the runners are exercised against real brokers by
running the script; here only what turns their output into the report is checked.
"""

from __future__ import annotations

import pytest

from benchmarks.compare import Peaks, brokers_from, parse_args, record, select, settings_from
from benchmarks.compare_report import (
    Metric,
    Row,
    cell,
    error_lines,
    format_ratio,
    format_value,
    markdown_table,
    median,
    ratio,
    reported,
    row_summary,
    verdict,
)
from benchmarks.perf_process import ScenarioError, last_line, parse_json_summary
from benchmarks.rss import is_steady, parse_status_kib
from benchmarks.scenarios import CONSUME, PUBLISH, Scenario, matrix, summary_metrics

RATE = Metric("publish_rate", "publish", "msgs/s", higher_is_better=True)
LATENCY = Metric("latency_p99_ms", "latency p99", "ms", higher_is_better=False, target=1.0)
URLS = ["amqp://guest:guest@127.0.0.1:5710/%2f", "amqp://guest:guest@127.0.0.1:5711/%2f"]
PERF_JSON = (
    '{"elapsed_s": 5.0, "publishers": 1, "consumers": 1, "body_bytes": 16, '
    '"published": 500000, "confirmed": 400000, "consumed": 450000, "avg_pub_rate": 100000.0, '
    '"avg_consume_rate": 90000.0, "latency_ms": {"p50": 0.1, "p95": 0.2, "p99": 0.3, '
    '"max": 1.0, "samples": 10}}'
)


def test_median_of_odd_and_even_counts_and_of_nothing() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([1.0, 2.0, 3.0, 10.0]) == 2.5
    assert median([]) is None


def test_ratio_is_a_over_b_and_none_when_undefined() -> None:
    assert ratio(150.0, 100.0) == 1.5
    assert ratio(None, 100.0) is None
    assert ratio(100.0, None) is None
    assert ratio(100.0, 0.0) is None


P50 = Metric("latency_p50_ms", "latency p50", "ms", higher_is_better=False, target=None)
MEMORY = Metric("kib_per_connection", "RSS each", "KiB", False, target=1.0, largest=True)


@pytest.mark.parametrize(
    ("a_over_b", "metric", "expected"),
    [
        (1.5, RATE, "≥1.5: met"),
        (1.49, RATE, "≥1.5: not met"),
        (1.0, MEMORY, "≤1: met"),
        (1.05, MEMORY, "≤1: not met"),
        (0.5, P50, "-"),
        (None, RATE, "n/a"),
    ],
)
def test_verdict_reads_the_ratio_by_the_metrics_target(
    a_over_b: float | None, metric: Metric, expected: str
) -> None:
    assert verdict(a_over_b, metric) == expected


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        (139_012.0, "msgs/s", "139.0k msgs/s"),
        (1_415_845.0, "msgs/s", "1.42M msgs/s"),
        (512.0, "msgs/s", "512 msgs/s"),
        (0.1564, "ms", "0.156 ms"),
        (1832.46, "B", "1,832.5 B"),
        (None, "KiB", "n/a"),
    ],
)
def test_format_value_by_unit(value: float | None, unit: str, expected: str) -> None:
    assert format_value(value, unit) == expected


def test_format_ratio() -> None:
    assert format_ratio(1.234) == "1.23"
    assert format_ratio(None) == "n/a"


def test_cell_says_not_supported_only_when_every_run_failed() -> None:
    assert cell([1.0, 3.0, 2.0], ["one failure"], LATENCY) == "2.000 ms"
    assert cell([], ["NOT_FOUND"], LATENCY) == "n/a (not supported)"
    assert cell([], [], LATENCY) == "n/a"


def test_memory_reports_the_largest_repetition_and_rates_the_median() -> None:
    assert reported([6.7, 0.1, 0.0], MEMORY) == 6.7
    assert reported([6.7, 0.1, 0.0], LATENCY) == 0.1
    assert reported([], MEMORY) is None
    row = Row("1,000 idle connections", "connections 1000", MEMORY, [6.7, 0.1, 0.0])
    row.values_b.extend([92.5, 65.0, 61.8])
    assert markdown_table([row], "streamq", "RabbitMQ").splitlines()[2] == (
        "| 1,000 idle connections: RSS each | `connections 1000` | 6.7 KiB | 92.5 KiB | 0.07 "
        "| ≤1: met |"
    )
    summary = row_summary(row)
    assert (summary["median_a"], summary["reported_a"], summary["reported_b"]) == (0.1, 6.7, 92.5)


def test_markdown_table_has_medians_ratio_and_verdict() -> None:
    rate = Row("publish only, 16 B", "-x 1 -y 0 -s 16", RATE, [300.0, 200.0, 310.0], [100.0])
    latency = Row("stream", "-l", LATENCY, [0.1], [], [], ["stream queues not supported"])

    lines = markdown_table([rate, latency], "streamq", "RabbitMQ").splitlines()

    assert lines[0].startswith("| scenario | flags | streamq | RabbitMQ | streamq/RabbitMQ |")
    assert lines[2] == (
        "| publish only, 16 B: publish | `-x 1 -y 0 -s 16` | 300 msgs/s | 100 msgs/s | 3.00 "
        "| ≥1.5: met |"
    )
    assert lines[3] == (
        "| stream: latency p99 | `-l` | 0.100 ms | n/a (not supported) | n/a | n/a |"
    )


def test_error_lines_name_the_broker_once_per_distinct_error() -> None:
    row = Row("stream", "-l", LATENCY, errors_b=["not supported", "not supported"])
    assert error_lines([row], "A", "B") == ["stream on B: not supported"]


def test_row_summary_keeps_raw_values_and_the_verdict() -> None:
    summary = row_summary(Row("s", "f", RATE, [2.0, 4.0, 3.0], [2.0, 2.0, 2.0]))
    assert summary["median_a"] == 3.0
    assert summary["ratio"] == 1.5
    assert summary["target"] == "≥1.5: met"
    assert summary["values_a"] == [2.0, 4.0, 3.0]


def test_parse_args_defaults_and_settings() -> None:
    args = parse_args(URLS)
    settings = settings_from(args)
    assert (args.url_a, args.url_b) == tuple(URLS)
    assert args.pid_a is None and args.json is None
    assert (settings.duration_s, settings.repetitions) == (5, 3)
    assert settings.queued_count == 1_000_000


def test_parse_args_quick_full_and_pids() -> None:
    args = parse_args([*URLS, "--pid-a", "12", "--pid-b", "34", "--quick", "--full"])
    settings = settings_from(args)
    assert (args.pid_a, args.pid_b) == (12, 34)
    assert (settings.duration_s, settings.repetitions) == (2, 1)
    assert settings.queued_count == 10_000_000


def test_select_picks_keys_and_refuses_unknown_ones() -> None:
    scenarios = matrix(settings_from(parse_args(URLS)))
    assert [s.key for s in select(scenarios, "stream, fanout")] == ["stream", "fanout"]
    assert select(scenarios, None) == scenarios
    with pytest.raises(SystemExit, match="unknown scenario nope"):
        select(scenarios, "nope")


def test_matrix_keys_are_unique_and_memory_scenarios_run_first() -> None:
    scenarios = matrix(settings_from(parse_args(URLS)))
    keys = [scenario.key for scenario in scenarios]
    assert len(keys) == len(set(keys)) == 19  # 16, and issue 20's three TLS rows
    assert {s.key for s in scenarios if s.runs_first} == {"connections", "queues", "queued"}
    assert [s.key for s in scenarios if s.runs_last] == ["idle"]
    assert [s.key for s in sorted(scenarios, key=Scenario.order)][-1] == "idle"
    # The memory scenarios, and only they, report their largest repetition.
    largest = {s.key for s in scenarios for metric in s.metrics if metric.largest}
    assert largest == {"connections", "queues", "queued", "idle"}
    assert {"ack-each", "consume-ack-each", "stream-ack-each"} <= set(keys)
    per_message_acks = [s for s in scenarios if "per-message acks" in s.title]
    assert len(per_message_acks) == 3
    assert all("--ack-each -P 1000" in s.flags for s in per_message_acks)


def test_a_third_broker_adds_its_column_and_the_ratio_against_it() -> None:
    rate = Row("ack each", "--ack-each", RATE, [300.0], [100.0], values_c=[200.0])
    stream = Row("stream", "-l", LATENCY, [0.1], [0.2], errors_c=["NOT_FOUND"])
    lines = markdown_table([rate, stream], "streamq", "RabbitMQ", "LavinMQ").splitlines()
    assert lines[0] == (
        "| scenario | flags | streamq | RabbitMQ | LavinMQ | streamq/RabbitMQ | target "
        "| streamq/LavinMQ | target |"
    )
    assert lines[1] == "|---" * 9 + "|"
    assert lines[2] == (
        "| ack each: publish | `--ack-each` | 300 msgs/s | 100 msgs/s | 200 msgs/s | 3.00 "
        "| ≥1.5: met | 1.50 | ≥1.5: met |"
    )
    assert lines[3] == (
        "| stream: latency p99 | `-l` | 0.100 ms | 0.200 ms | n/a (not supported) | 0.50 "
        "| ≤1: met | n/a | n/a |"
    )
    assert error_lines([stream], "A", "B", "C") == ["stream on C: NOT_FOUND"]
    assert row_summary(rate)["ratio_c"] == 1.5
    assert "ratio_c" not in row_summary(Row("s", "f", RATE, [1.0], [1.0]))


def test_parse_args_takes_an_optional_third_broker() -> None:
    args = parse_args([*URLS, "amqp://c/", "--pid-c", "56", "--name-c", "LavinMQ"])
    assert (args.url_c, args.pid_c, args.name_c) == ("amqp://c/", 56, "LavinMQ")
    assert [broker.name for broker in brokers_from(args)] == ["A", "B", "LavinMQ"]
    assert parse_args(URLS).url_c is None
    assert len(brokers_from(parse_args(URLS))) == 2
    with pytest.raises(SystemExit, match="distinct names"):
        brokers_from(parse_args([*URLS, "amqp://c/", "--name-c", "A"]))


def test_record_puts_values_and_errors_on_the_right_side() -> None:
    rows = [Row("ack", "-a 100", PUBLISH), Row("ack", "-a 100", CONSUME)]
    record(rows, {"publish_rate": 10.0, "consume_rate": 9.0}, 0)
    record(rows, "connection refused", 1)
    record(rows, {"publish_rate": 8.0}, 1)
    record(rows, {"publish_rate": 5.0, "consume_rate": 4.0}, 2)
    assert (rows[0].values_a, rows[1].values_a) == ([10.0], [9.0])
    assert rows[0].errors_b == ["connection refused"]
    assert rows[1].errors_b == ["connection refused", "no consume_rate in the result"]
    assert rows[0].values_b == [8.0]
    assert (rows[0].values_c, rows[1].values_c, rows[0].errors_c) == ([5.0], [4.0], [])


def test_peaks_keep_the_highest_sample() -> None:
    peaks = Peaks()
    peaks.add("publish", "A", 100)
    peaks.add("publish", "A", 300)
    peaks.add("queues", "A", 200)
    peaks.add("queues", "B", None)
    assert peaks.overall == {"A": 300}
    assert peaks.by_scenario == {"publish": {"A": 300}, "queues": {"A": 200}}


def test_summary_metrics_from_perf_json() -> None:
    metrics = summary_metrics(parse_json_summary(f"[  1s] live line\n{PERF_JSON}\n"))
    assert metrics == {
        "publish_rate": 100000.0,
        "consume_rate": 90000.0,
        "confirm_rate": 80000.0,
        "latency_p50_ms": 0.1,
        "latency_p99_ms": 0.3,
    }


def test_summary_metrics_refuses_a_summary_without_rates() -> None:
    with pytest.raises(ScenarioError, match="avg_pub_rate"):
        summary_metrics({"elapsed_s": 1.0})


def test_parse_json_summary_refuses_anything_but_an_object() -> None:
    with pytest.raises(ScenarioError, match="no JSON summary"):
        parse_json_summary("")
    with pytest.raises(ScenarioError, match="not an object"):
        parse_json_summary("[1, 2]\n")


def test_last_line_skips_blank_lines() -> None:
    assert last_line("first\nstreamq perf: connection refused\n\n") == (
        "streamq perf: connection refused"
    )
    assert last_line("") == ""


def test_parse_status_kib() -> None:
    status = "Name:\tbeam.smp\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
    assert parse_status_kib(status, "VmRSS") == 102400
    assert parse_status_kib(status, "VmHWM") == 204800
    assert parse_status_kib(status, "VmSwap") is None


def test_is_steady_needs_enough_close_readings() -> None:
    assert not is_steady([100, 100, 100])
    assert is_steady([50_000, 100_000, 100_500, 101_000, 100_200])
    assert not is_steady([100_000, 100_500, 110_000, 100_200])
