"""systemd's notifications with a real NOTIFY_SOCKET, as systemd runs a `Type=notify`
service. Method: the test binds a unix datagram socket (a path, or an abstract name) as
systemd does, starts `streamq serve` in its own process with NOTIFY_SOCKET (and
WATCHDOG_USEC) naming it, and reads what arrives: STATUS=recovering first, READY=1 only
once every port accepts (checked the moment it arrives), then watchdog pings at half of
WATCHDOG_USEC, a STATUS= line that follows the counts, and STOPPING=1 at SIGTERM. The
unit file's own test is test_systemd_unit.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from streamq.sd_notify import STATUS_REFRESH_S
from tests.differential.peers import free_port
from tests.integration.broker_process import STARTUP_TIMEOUT_S, streamq

WATCHDOG_USEC = 400_000  # pings every 0.2 s
PINGS_WITHIN_S = 2.0
PINGS_MIN = 4  # of the 10 due in PINGS_WITHIN_S: a loaded machine delays some
DATAGRAM_BYTES_MAX = 4096


@pytest.fixture
def notify_path() -> Iterator[Path]:
    # A short directory: a unix socket path must fit in 108 bytes, tmp_path may not.
    with tempfile.TemporaryDirectory(prefix="sdn-", dir="/tmp") as directory:
        yield Path(directory) / "notify"


def receiver(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    return sock


def messages(sock: socket.socket, deadline: float, until: str = "") -> Iterator[list[str]]:
    """Each datagram as its lines, until the monotonic deadline (or one with the line
    `until`, included)."""
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            lines = sock.recv(DATAGRAM_BYTES_MAX).decode().split("\n")
        except TimeoutError:
            return
        yield lines
        if until and until in lines:
            return


def start(
    data_dir: Path, notify_socket: str, ports: tuple[int, int, int], **env: str
) -> subprocess.Popen[bytes]:
    amqp, http_port, stream = ports
    return subprocess.Popen(
        streamq(
            "serve",
            *("--data-dir", str(data_dir), "--amqp-port", str(amqp)),
            *("--http-port", str(http_port), "--stream-port", str(stream)),
            *("--mqtt-port", "-1"),
        ),
        env={**os.environ, "NOTIFY_SOCKET": notify_socket, **env},
        stderr=subprocess.DEVNULL,
    )


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 1.0).close()
    except OSError:
        return False
    return True


def wait_ready(sock: socket.socket, ports: tuple[int, int, int]) -> list[list[str]]:
    """The datagrams up to READY=1 (included); asserts every port accepts at READY."""
    seen = []
    for lines in messages(sock, time.monotonic() + STARTUP_TIMEOUT_S):
        seen.append(lines)
        if "READY=1" in lines:
            assert all(accepts(port) for port in ports), "READY=1 before every port accepts"
            return seen
    raise AssertionError(f"no READY=1 within {STARTUP_TIMEOUT_S} s: {seen}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
    process.wait(STARTUP_TIMEOUT_S)


def test_ready_status_watchdog_and_stopping(tmp_path: Path, notify_path: Path) -> None:
    ports = (free_port(), free_port(), free_port())
    with receiver(str(notify_path)) as sock:
        process = start(
            tmp_path / "data", str(notify_path), ports, WATCHDOG_USEC=str(WATCHDOG_USEC)
        )
        try:
            before = wait_ready(sock, ports)
            assert before[0][0].startswith("STATUS=recovering "), before
            ready = before[-1]
            assert ready[0] == "READY=1"
            assert ready[1] == "STATUS=serving 0 connections, 0 queues in 1 vhosts", ready
            pings = 0
            for lines in messages(sock, time.monotonic() + PINGS_WITHIN_S):
                pings += lines == ["WATCHDOG=1"]
            assert pings >= PINGS_MIN, f"{pings} watchdog pings in {PINGS_WITHIN_S} s"
            # The status follows the counts: a client connects, a queue is declared.
            client = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", ports[0]))
            client.channel().queue_declare("counted")
            wanted = "STATUS=serving 1 connections, 1 queues in 1 vhosts"
            deadline = time.monotonic() + STATUS_REFRESH_S + STARTUP_TIMEOUT_S
            assert any(wanted in lines for lines in messages(sock, deadline, until=wanted))
            client.close()
            process.terminate()
            after = next(
                m for m in messages(sock, time.monotonic() + STARTUP_TIMEOUT_S)
                if m != ["WATCHDOG=1"]
            )  # fmt: skip
            assert after == ["STOPPING=1", "STATUS=stopping"]
            assert process.wait(STARTUP_TIMEOUT_S) == 0
        finally:
            stop(process)


def test_abstract_socket_and_no_watchdog_unless_asked(tmp_path: Path) -> None:
    name = f"@streamq-test-{os.getpid()}-{time.monotonic_ns()}"
    ports = (free_port(), free_port(), free_port())
    with receiver(b"\0" + name[1:].encode()) as sock:
        # WATCHDOG_PID names another process: the pings are not this one's to send.
        process = start(
            tmp_path / "data", name, ports, WATCHDOG_USEC=str(WATCHDOG_USEC), WATCHDOG_PID="1"
        )
        try:
            wait_ready(sock, ports)
            later = list(messages(sock, time.monotonic() + PINGS_WITHIN_S))
            assert ["WATCHDOG=1"] not in later, later
        finally:
            stop(process)
