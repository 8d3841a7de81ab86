"""A node is ready when everything it serves is: the race a client or an orchestrator runs
at start-up. Method: a real `streamq serve` process on fixed free ports; the test dials
the AMQP port in a tight loop from the moment the process starts, and the instant the
port accepts it asks the HTTP API (and dials the stream port): both must answer, never
refuse. Before listeners opened together, the AMQP port accepted 0.15-0.25 s before the
HTTP port was even bound. The restarts recover a data directory with messages in it, so
the listeners also wait for a recovery with something to do. A start that fails on a
taken port must never have accepted on any other port.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import threading
import time
from pathlib import Path

import pika

from tests.differential.peers import free_port
from tests.integration.broker_process import STARTUP_TIMEOUT_S, streamq

STARTS = 2
MESSAGES = 300
DIAL_TIMEOUT_S = 0.05  # one attempt; the loop retries until STARTUP_TIMEOUT_S
DIAL_PAUSE_S = 0.001  # between refused attempts: the broker starting needs the CPU more
HTTP_TIMEOUT_S = 5.0  # the HTTP API's answer, once the AMQP port accepts


def serve(data_dir: Path, amqp: int, http_port: int, stream: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        streamq(
            "serve",
            *("--data-dir", str(data_dir), "--amqp-port", str(amqp)),
            *("--http-port", str(http_port), "--stream-port", str(stream)),
            *("--mqtt-port", "-1"),
        ),
        stderr=subprocess.PIPE,
    )


def accepts(port: int, timeout_s: float = DIAL_TIMEOUT_S) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout_s).close()
    except OSError:
        return False
    return True


def first_accept(process: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not accepts(port):
        assert process.poll() is None, "the broker exited"
        assert time.monotonic() < deadline, "the AMQP port never accepted"
        time.sleep(DIAL_PAUSE_S)


def http_status(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT_S)
    try:
        conn.request("GET", path, headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
        return conn.getresponse().status
    finally:
        conn.close()


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    assert process.wait(STARTUP_TIMEOUT_S) == 0
    assert process.stderr is not None
    process.stderr.close()


def fill(amqp_port: int) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("kept", durable=True)
    for i in range(MESSAGES):
        channel.basic_publish("", "kept", b"%d" % i, pika.BasicProperties(delivery_mode=2))
    connection.close()


def test_the_http_api_answers_as_soon_as_the_amqp_port_accepts(tmp_path: Path) -> None:
    amqp, http_port, stream = free_port(), free_port(), free_port()
    for start in range(STARTS):
        process = serve(tmp_path / "data", amqp, http_port, stream)
        try:
            first_accept(process, amqp)
            # No retry: the first request after the AMQP accept must be answered.
            assert http_status(http_port, f"/api/health/checks/port-listener/{amqp}") == 200
            assert accepts(stream, HTTP_TIMEOUT_S), "the stream port was not open"
            if start == 0:
                fill(amqp)  # the next start recovers these before listening
            else:
                assert kept_count(amqp) == MESSAGES
        finally:
            stop(process)


def kept_count(amqp_port: int) -> int:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    declared = connection.channel().queue_declare("kept", passive=True)
    connection.close()
    count: int = declared.method.message_count
    return count


def test_a_taken_port_stops_the_start_before_any_port_accepts(tmp_path: Path) -> None:
    amqp, stream = free_port(), free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        http_port = taken.getsockname()[1]
        accepted: list[int] = []
        process = serve(tmp_path / "data", amqp, http_port, stream)
        done = threading.Event()

        def dial() -> None:
            while not done.wait(DIAL_PAUSE_S):
                accepted.extend(port for port in (amqp, stream) if accepts(port))

        dialer = threading.Thread(target=dial, daemon=True)
        dialer.start()
        try:
            assert process.wait(STARTUP_TIMEOUT_S) != 0
        finally:
            done.set()
            dialer.join(STARTUP_TIMEOUT_S)
        assert process.stderr is not None
        printed = process.stderr.read()
        process.stderr.close()
    assert f"cannot listen for HTTP on 127.0.0.1:{http_port}".encode() in printed, printed
    assert accepted == [], "a port accepted although the start failed"
