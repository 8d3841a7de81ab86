"""`streamq` as a user runs it: a real process, real sockets on loopback, real signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamq import __version__
from tests.integration.broker_process import STARTUP_TIMEOUT_S, BrokerProcess, streamq

Broker = BrokerProcess


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    running = Broker(tmp_path / "data")
    yield running
    if running.process.poll() is None:
        running.process.kill()
        running.process.wait(timeout=STARTUP_TIMEOUT_S)


def test_version() -> None:
    result = subprocess.run(streamq("--version"), capture_output=True, timeout=30, check=True)
    assert result.stdout.decode().strip() == f"streamq {__version__}"


def test_bad_port_is_a_clear_usage_error() -> None:
    result = subprocess.run(
        streamq("serve", "--amqp-port", "70000"), capture_output=True, timeout=30, check=False
    )
    assert result.returncode == 2
    assert b"port out of range 0-65535: 70000" in result.stderr
    assert b"Traceback" not in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_listens_and_stops_cleanly_on_a_signal(
    broker: Broker, tmp_path: Path, signum: int
) -> None:
    assert (tmp_path / "data" / ".lock").read_text().strip() == str(broker.process.pid)
    with socket.create_connection(("127.0.0.1", broker.amqp_port), timeout=5) as amqp:
        amqp.sendall(b"AMQP\x00\x00\x09\x01")
        head = b""  # a method frame on channel 0 carrying connection.start (10, 10)
        while len(head) < 11:
            head += amqp.recv(11 - len(head))
        assert head[:3] == b"\x01\x00\x00" and head[7:11] == b"\x00\x0a\x00\x0a"
    with socket.create_connection(("127.0.0.1", broker.http_port), timeout=5) as http:
        http.sendall(b"GET /api/policies HTTP/1.1\r\nHost: x\r\n\r\n")
        assert http.recv(100).startswith(b"HTTP/1.1 401")  # the API wants credentials
    assert broker.stop(signum) == 0
    assert b"INFO streamq: stopped" in broker.stderr
    assert b"Traceback" not in broker.stderr


def test_a_second_broker_on_the_same_data_dir_is_refused(broker: Broker, tmp_path: Path) -> None:
    result = subprocess.run(
        streamq("serve", "--data-dir", str(tmp_path / "data"), "--amqp-port", "0"),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert (
        f"data directory '{tmp_path / 'data'}' is in use by another streamq process "
        f"(pid {broker.process.pid})"
    ).encode() in result.stderr


def test_a_port_in_use_is_a_clear_error(broker: Broker, tmp_path: Path) -> None:
    result = subprocess.run(
        streamq(
            "serve",
            "--data-dir",
            str(tmp_path / "other"),
            "--amqp-port",
            str(broker.amqp_port),
        ),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert f"cannot listen for AMQP on 127.0.0.1:{broker.amqp_port}".encode() in result.stderr
    assert b"Traceback" not in result.stderr


def test_the_lock_is_released_after_a_stop(broker: Broker, tmp_path: Path) -> None:
    assert broker.stop() == 0
    again = Broker(tmp_path / "data")
    assert again.stop() == 0
    assert os.path.exists(tmp_path / "data" / ".lock")


@pytest.mark.parametrize(
    "command",
    [
        ["serve"],
        ["ctl"],
        ["ctl", "add_user"],
        ["ctl", "set_policy"],
        ["perf", "throughput"],
        ["perf", "sink"],
        ["perf", "connections"],
        ["perf", "queues"],
    ],
)
def test_every_help_page_prints(command: list[str]) -> None:
    done = subprocess.run(streamq(*command, "--help"), capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert b"usage: streamq" in done.stdout
