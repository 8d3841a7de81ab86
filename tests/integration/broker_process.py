"""A broker in its own process, as a user runs it, for tests that signal or SIGKILL it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.differential.peers import free_port

STARTUP_TIMEOUT_S = 20
LISTENING = re.compile(rb"listening amqp=127\.0\.0\.1:(\d+) http=127\.0\.0\.1:(\d+)")


def streamq(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamq", *args]


def wait_listening(process: subprocess.Popen[bytes]) -> tuple[bytes, int, int]:
    """Read `process`'s stderr until its `listening` line: (what it printed, the AMQP
    port, the HTTP port). Fails if it exits or does not listen in STARTUP_TIMEOUT_S."""
    printed = b""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    assert process.stderr is not None
    while (match := LISTENING.search(printed)) is None:
        assert time.monotonic() < deadline, f"broker did not start: {printed!r}"
        line = process.stderr.readline()
        assert line, f"broker exited: {printed!r}"
        printed += line
    return printed, int(match[1]), int(match[2])


class BrokerProcess:
    """`streamq serve` on loopback ports chosen by the OS; waits until it listens."""

    def __init__(self, data_dir: Path, *options: str) -> None:
        self.data_dir = data_dir
        self.process = subprocess.Popen(
            streamq(
                "serve",
                "--data-dir",
                str(data_dir),
                "--amqp-port",
                "0",
                "--http-port",
                "0",
                "--stream-port",
                "0",
                "--mqtt-port",  # never 1883 in tests: a test that wants MQTT passes a port
                "-1",
                "--stream-advertised-host",  # as RunningBroker: the tests dial 127.0.0.1
                "127.0.0.1",
                *options,
            ),
            stderr=subprocess.PIPE,
        )
        self.stderr, self.amqp_port, self.http_port = wait_listening(self.process)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        code = self.process.wait(timeout=STARTUP_TIMEOUT_S)
        assert self.process.stderr is not None
        self.stderr += self.process.stderr.read()
        return code

    def kill(self) -> None:
        """SIGKILL: no chance to flush or sync anything."""
        self.stop(signal.SIGKILL)


class RestartableBroker:
    """`streamq serve` on fixed free ports, so that URIs naming it stay valid when it is
    SIGKILLed and started again on the same data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.amqp_port, self.http_port = free_port(), free_port()
        self.process = self._start()

    def _start(self) -> BrokerProcess:
        ports = (
            *("--amqp-port", str(self.amqp_port), "--http-port", str(self.http_port)),
            *("--stream-port", "-1"),
        )
        return BrokerProcess(self.data_dir, *ports)

    def kill_and_restart(self) -> None:
        self.process.kill()
        self.process = self._start()

    def stop(self) -> None:
        self.process.stop(signal.SIGTERM)
