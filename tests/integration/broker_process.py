"""A broker in its own process, as a user runs it, for tests that signal or SIGKILL it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

STARTUP_TIMEOUT_S = 20
LISTENING = re.compile(rb"listening amqp=127\.0\.0\.1:(\d+) http=127\.0\.0\.1:(\d+)")


def streamq(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamq", *args]


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
                *options,
            ),
            stderr=subprocess.PIPE,
        )
        self.stderr = b""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        assert self.process.stderr is not None
        while (match := LISTENING.search(self.stderr)) is None:
            assert time.monotonic() < deadline, f"broker did not start: {self.stderr!r}"
            line = self.process.stderr.readline()
            assert line, f"broker exited: {self.stderr!r}"
            self.stderr += line
        self.amqp_port, self.http_port = int(match[1]), int(match[2])

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
