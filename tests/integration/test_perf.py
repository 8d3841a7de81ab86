"""`streamq perf` as a user runs it: a real process against a real broker (started in
this test process on port 0) and against `streamq perf sink`, on loopback only.

The throughput tests publish and consume fixed counts (-C, -D) and check the JSON
summary's counts exactly; rates and timings are never asserted.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from tests.integration.conftest import RunningBroker

RUN_TIMEOUT_S = 60
SINK_START_TIMEOUT_S = 20


def perf(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "streamq", "perf", *args]
    return subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


def uri(port: int, credentials: str = "guest:guest") -> str:
    return f"amqp://{credentials}@127.0.0.1:{port}/%2f"


def summary(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def assert_one_line_error(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("streamq perf: ")
    assert text in lines[0]


@pytest.fixture
def sink_port() -> Iterator[int]:
    command = [sys.executable, "-m", "streamq", "perf", "sink", "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        # The sink prints its port first: "streamq perf sink: listening on 127.0.0.1:N".
        line = process.stdout.readline()
        assert "listening on" in line, line
        yield int(line.rsplit(":", 1)[1])
    finally:
        process.terminate()
        process.wait(timeout=SINK_START_TIMEOUT_S)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- throughput ------------------------------------------------------------------------


def test_throughput_counts_are_exact_with_confirms_and_acks(broker: RunningBroker) -> None:
    result = perf(
        "throughput", "--uri", uri(broker.amqp_port), "-C", "2000", "-D", "2000",
        "-c", "100", "-a", "10", "-P", "100", "-l", "-j", "-u", "perf-confirm",
    )  # fmt: skip
    counts = summary(result)
    assert (counts["published"], counts["confirmed"], counts["consumed"]) == (2000, 2000, 2000)
    assert counts["latency_ms"]["samples"] == 2000
    assert counts["latency_ms"]["p50"] <= counts["latency_ms"]["max"]


def test_throughput_splits_the_budget_over_processes_in_transactions(
    broker: RunningBroker,
) -> None:
    result = perf(
        "throughput", "--uri", uri(broker.amqp_port), "-x", "2", "-y", "2",
        "-C", "1000", "-D", "1000", "-t", "50", "-T", "100", "-P", "200", "-j", "-u", "perf-tx",
    )  # fmt: skip
    counts = summary(result)
    assert (counts["published"], counts["consumed"]) == (1000, 1000)
    assert counts["confirmed"] is None


def test_throughput_routes_through_an_exchange(broker: RunningBroker) -> None:
    result = perf(
        "throughput", "--uri", uri(broker.amqp_port), "-e", "amq.direct", "-k", "perf-key",
        "-u", "perf-routed", "-C", "500", "-D", "500", "-s", "200000", "-j",
    )  # fmt: skip
    counts = summary(result)
    assert (counts["published"], counts["consumed"]) == (500, 500)


def test_throughput_against_the_sink(sink_port: int) -> None:
    result = perf(
        "throughput", "--uri", uri(sink_port), "-C", "2000", "-D", "2000", "-c", "100",
        "-a", "10", "-P", "100", "-l", "-j",
    )  # fmt: skip
    counts = summary(result)
    assert (counts["published"], counts["confirmed"], counts["consumed"]) == (2000, 2000, 2000)


def test_the_live_line_and_the_table_are_printed(sink_port: int) -> None:
    result = perf("throughput", "--uri", uri(sink_port), "-z", "1", "-y", "0")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("[  1s] publish")
    assert any(line.lstrip().startswith("published") for line in lines)


# -- connections and queues ------------------------------------------------------------


def test_connections_reports_count_and_broker_memory(broker: RunningBroker) -> None:
    # The broker runs in this test process, so its pid is ours.
    pid = str(os.getpid())
    result = perf("connections", "20", "--uri", uri(broker.amqp_port), "--pid", pid, "-j")
    report = summary(result)
    assert report["connections"] == 20
    assert report["rss_before_kib"] > 0
    assert report["rss_after_kib"] > 0


def test_queues_are_deleted_unless_kept(broker: RunningBroker) -> None:
    port = broker.amqp_port
    report = summary(perf("queues", "10", "--uri", uri(port), "--prefix", "gone-", "-j"))
    assert report["queues"] == 10
    assert "delete_s" in report
    kept = summary(perf("queues", "3", "--uri", uri(port), "--prefix", "kept-", "--keep", "-j"))
    assert "delete_s" not in kept
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        channel = connection.channel()
        assert channel.queue_declare("kept-2", passive=True).method.message_count == 0
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="NOT_FOUND"):
            channel.queue_declare("gone-9", passive=True)
    finally:
        connection.close()


def test_connections_against_the_sink(sink_port: int) -> None:
    report = summary(perf("connections", "5", "--uri", uri(sink_port), "-j"))
    assert report["connections"] == 5
    assert report["rss_before_kib"] is None


# -- errors ----------------------------------------------------------------------------


def test_refused_connection_is_one_line() -> None:
    port = free_port()
    result = perf("throughput", "--uri", uri(port), "-C", "10")
    assert_one_line_error(result, f"connection refused by 127.0.0.1:{port}")


def test_bad_uri_is_one_line() -> None:
    assert_one_line_error(perf("queues", "1", "--uri", "http://127.0.0.1/"), "bad URI")
    assert_one_line_error(perf("connections", "1", "--uri", "amqp://h:port/"), "bad URI")


def test_a_close_from_the_broker_is_one_line(broker: RunningBroker) -> None:
    result = perf("connections", "1", "--uri", uri(broker.amqp_port, "guest:wrong"))
    assert_one_line_error(result, "connection closed by the broker: 403")
    result = perf("throughput", "--uri", uri(broker.amqp_port), "-e", "no-such", "-C", "1")
    assert_one_line_error(result, "channel closed by the broker: 404")


def test_bad_flags_are_one_line() -> None:
    assert_one_line_error(perf("throughput", "-x", "0", "-y", "0"), "nothing to run")
    assert_one_line_error(perf("throughput", "-c", "5", "-t", "5"), "cannot be combined")
    assert_one_line_error(perf("throughput", "--queue-args", "[1]"), "JSON object")
