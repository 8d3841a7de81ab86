"""`streamq perf mqtt` as a user runs it: a real process against the MQTT gateway of a
broker started in this test process (its MQTT listener on a port from the OS), over
loopback. The runs are short and bounded by counts (-C, -D) or time (-z); the tests
check the counts the summary reports, never the rates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.mqtt.clients import Paho
from tests.mqtt.conftest import MqttBroker

RUN_TIMEOUT_S = 90


def perf(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "streamq", "perf", "mqtt", *args]
    return subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


def uri(broker: MqttBroker, credentials: str = "guest:guest") -> str:
    return f"mqtt://{credentials}@127.0.0.1:{broker.mqtt_port}"


def summary(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("streamq perf: ")
    return lines[0]


def test_qos1_publishers_and_a_consumer_move_every_message(mqtt_broker: MqttBroker) -> None:
    result = perf(
        "throughput", "-u", uri(mqtt_broker), "--qos", "1", "-x", "3", "-y", "1",
        "--max-inflight", "50", "-C", "3000", "-D", "3000", "-s", "100", "-V",
        "--clean-session", "-j", "-t", "perf/q1",
    )  # fmt: skip
    counts = summary(result)
    assert (counts["published"], counts["confirmed"], counts["consumed"]) == (3000, 3000, 3000)
    assert counts["ack_frames"] == 3000  # every QoS 1 delivery got its PUBACK
    assert (counts["publishers"], counts["consumers"], counts["body_bytes"]) == (3, 1, 100)


def test_qos0_reaches_every_consumer(mqtt_broker: MqttBroker) -> None:
    # Two subscribers each get every message: 2,000 published, 4,000 consumed.
    result = perf(
        "throughput", "-u", uri(mqtt_broker), "-x", "1", "-y", "2", "-C", "2000",
        "-D", "4000", "-V", "--clean-session", "-j", "-t", "perf/q0",
    )  # fmt: skip
    counts = summary(result)
    assert (counts["published"], counts["consumed"]) == (2000, 4000)
    assert counts["confirmed"] is None


def test_the_publishes_reach_an_mqtt_subscriber_of_their_own(mqtt_broker: MqttBroker) -> None:
    watcher = Paho(mqtt_broker.mqtt_port, "perf-watcher")
    watcher.connect()
    assert watcher.subscribe("perf/watched", 1) == [1]
    result = perf(
        "throughput", "-u", uri(mqtt_broker), "--qos", "1", "-y", "0", "-C", "20",
        "-s", "5", "--retain", "-j", "-t", "perf/watched",
    )  # fmt: skip
    assert summary(result)["confirmed"] == 20
    bodies = [message.payload for message in watcher.receive(20)]
    assert bodies == [b"@ABCD"] * 20  # lavinmqperf's body pattern
    watcher.disconnect()


def test_a_timed_run_prints_live_lines_and_the_table(mqtt_broker: MqttBroker) -> None:
    result = perf("throughput", "-u", uri(mqtt_broker), "-z", "2", "--clean-session")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("[  1s] publish")
    published = next(line for line in lines if line.lstrip().startswith("published"))
    consumed = next(line for line in lines if line.lstrip().startswith("consumed"))
    assert int(published.split()[1].replace(",", "")) > 0
    assert int(consumed.split()[1].replace(",", "")) > 0


def test_refusals_are_one_line_errors(mqtt_broker: MqttBroker) -> None:
    line = one_line_error(perf("throughput", "-u", uri(mqtt_broker, "guest:wrong"), "-C", "1"))
    assert "login refused, CONNACK 4" in line
    line = one_line_error(perf("throughput", "-u", "amqp://127.0.0.1:1", "-C", "1"))
    assert "mqtt:// or mqtts://" in line
    line = one_line_error(perf("throughput", "-u", uri(mqtt_broker), "-t", "a/#", "-y", "0"))
    assert "cannot publish" in line
    line = one_line_error(perf("throughput", "-V", "--random-bodies"))
    assert "cannot be combined" in line


def test_idle_connections_are_kept_alive_and_measured(mqtt_broker: MqttBroker) -> None:
    # Goal: the connections stay open past 1.5 keep-alives (the broker closes a silent
    # one then), so the pings work; the broker (this process) reports its VmRSS.
    result = perf(
        "connections", "40", "-u", uri(mqtt_broker), "--keepalive", "2", "--hold", "4",
        "--pid", str(os.getpid()), "-j",
    )  # fmt: skip
    counts = summary(result)
    assert counts["connections"] == 40
    assert counts["rss_before_kib"] > 0 and counts["rss_after_kib"] > 0
    assert "kib_each" in counts


def test_rates_hold_publishers_and_consumers_back(mqtt_broker: MqttBroker) -> None:
    # -r caps each publisher at N a second, -R the consumer: neither is ever ahead of
    # its rate times the seconds run (a delivery past it waits unread until it is due).
    result = perf(
        "throughput", "-u", uri(mqtt_broker), "-r", "1000", "-R", "50", "-z", "3",
        "--clean-session", "-j", "-t", "perf/rates",
    )  # fmt: skip
    counts = summary(result)
    assert 0 < counts["published"] <= 1000 * counts["elapsed_s"] + 1
    assert 0 < counts["consumed"] <= 50 * counts["elapsed_s"] + 1
