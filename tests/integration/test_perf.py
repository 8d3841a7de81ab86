"""`streamq perf` as a user runs it: a real process against a real broker (started in
this test process on port 0) and against `streamq perf sink`, on loopback only.

The throughput tests publish and consume fixed counts (-C, -D) and check the JSON
summary's counts exactly; rates and timings are never asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from tests.integration.conftest import RunningBroker
from tests.ports import free_port

RUN_TIMEOUT_S = 60
SINK_START_TIMEOUT_S = 20
ACCEPT_POLL_S = 0.1


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


class AckCountingRelay:
    """A loopback TCP relay in front of the broker that splits what clients send into
    frames (with the project's codec) and counts the basic.ack frames, and those among
    them with `multiple`, so a test sees the frames on the wire, not the client's own
    count of them. One thread accepts, two per connection copy bytes."""

    def __init__(self, broker_port: int) -> None:
        self.broker_port = broker_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.acks = 0
        self.multiple_acks = 0
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.connections: list[socket.socket] = []
        self.stopped = threading.Event()
        self._start(self._accept)

    def _start(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _accept(self) -> None:
        self.listener.settimeout(ACCEPT_POLL_S)  # closing does not wake accept(): poll
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            upstream = socket.create_connection(("127.0.0.1", self.broker_port))
            self.connections += [client, upstream]
            self._start(self._copy, client, upstream, True)
            self._start(self._copy, upstream, client, False)

    def _copy(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        pending = bytearray()
        header_left = len(codec.PROTOCOL_HEADER_0_9_1) if from_client else 0
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
                if from_client:
                    pending += data
                    skipped = min(header_left, len(pending))
                    del pending[:skipped]
                    header_left -= skipped
                    self._count(pending)
        except OSError:
            pass  # the other side went away; the test checks the counts
        finally:
            # Each copier shuts both ends down, so the other copier's recv returns too.
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def _count(self, pending: bytearray) -> None:
        frames, used = codec.split_frames(memoryview(pending), 1 << 20)
        del pending[:used]
        for frame in frames:
            if frame.frame_type != codec.FRAME_METHOD or frame.payload[:4] != b"\x00\x3c\x00\x50":
                continue
            method = codec.decode_method(frame.payload)
            assert isinstance(method, m.BasicAck)
            with self.lock:
                self.acks += 1
                self.multiple_acks += method.multiple

    def close(self) -> None:
        """Stop accepting and wait for every connection's copiers to finish."""
        self.stopped.set()
        for thread in self.threads:
            thread.join(RUN_TIMEOUT_S)
            assert not thread.is_alive(), "a relay thread did not finish"
        for connection in [self.listener, *self.connections]:
            connection.close()


def test_ack_each_sends_one_ack_frame_per_message(broker: RunningBroker) -> None:
    # Goal: --ack-each acks each message with a basic.ack frame of its own. Method: run
    # perf through a relay that counts the ack frames on the wire, then compare with
    # perf's own count and with the broker's ack counter for the queue.
    relay = AckCountingRelay(broker.amqp_port)
    try:
        result = perf(
            "throughput", "--uri", uri(relay.port), "-C", "3000", "-D", "3000",
            "--ack-each", "-P", "100", "-j", "-u", "perf-ack-each",
        )  # fmt: skip
    finally:
        relay.close()
    counts = summary(result)
    assert (counts["published"], counts["consumed"], counts["ack_frames"]) == (3000, 3000, 3000)
    assert (relay.acks, relay.multiple_acks) == (3000, 0)
    status, queue, _ = broker.http("GET", "/api/queues/%2f/perf-ack-each")
    assert status == 200
    assert isinstance(queue, dict)
    assert queue["messages"] == 0
    assert queue["message_stats"]["ack"] == 3000


def test_ack_every_n_sends_multiple_acks(broker: RunningBroker) -> None:
    result = perf(
        "throughput", "--uri", uri(broker.amqp_port), "-C", "1000", "-D", "1000",
        "-a", "100", "-P", "1000", "-j", "-u", "perf-ack-multiple",
    )  # fmt: skip
    counts = summary(result)
    assert counts["consumed"] == 1000
    assert 1 <= counts["ack_frames"] <= 1000 // 100 + 1


def test_ack_each_reads_a_stream_from_first(broker: RunningBroker) -> None:
    result = perf(
        "throughput", "--uri", uri(broker.amqp_port), "-C", "2000", "-D", "2000",
        "--ack-each", "-P", "1000", "-c", "1000", "-j", "-u", "perf-ack-each-stream",
        "--queue-args", '{"x-queue-type":"stream"}',
        "--consumer-args", '{"x-stream-offset":"first"}',
    )  # fmt: skip
    counts = summary(result)
    assert (counts["consumed"], counts["ack_frames"], counts["confirmed"]) == (2000, 2000, 2000)


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
