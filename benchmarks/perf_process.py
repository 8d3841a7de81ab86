"""Running `streamq perf` as a subprocess with a timeout, for `benchmarks/compare.py`, and
`streamq serve` for the benchmarks that start their own brokers.

Owns two things. `StreamqServe`: a broker on free loopback ports, waited for until it
listens, stopped by its pid. `run_perf`: start `streamq perf ARGS` in its own process
group, wait at most the given timeout, and return its JSON summary or raise
`ScenarioError` with the tool's one-line error. On a timeout it kills that process group,
which holds only the perf process it started and the publisher and consumer processes
that one forked; nothing else is signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from tests.differential.peers import free_port

KILL_WAIT_S: Final = 5.0
SERVE_START_TIMEOUT_S: Final = 30.0
SERVE_STOP_TIMEOUT_S: Final = 30.0
LISTENING: Final = re.compile(rb"listening amqp=")
ERROR_CHARS_MAX: Final = 200


class ScenarioError(Exception):
    """A scenario could not run on a broker: the reason, in one line."""


def default_streamq() -> str:
    """The `streamq` script beside this interpreter (the project's venv)."""
    return str(Path(sys.executable).with_name("streamq"))


class StreamqServe:
    """`streamq serve` with its data under `directory`, AMQP and HTTP on free loopback
    ports, and `extra` flags; returns once it listens. Stopped by its pid."""

    def __init__(
        self, command: list[str], directory: Path, *extra: str, env: dict[str, str] | None = None
    ) -> None:
        self.amqp_port, self.http_port = free_port(), free_port()
        argv = [
            *command, "serve", "--data-dir", str(directory / "data"),
            "--amqp-port", str(self.amqp_port), "--http-port", str(self.http_port),
            "--stream-port", "-1", *extra,
        ]  # fmt: skip
        self.process = subprocess.Popen(argv, stderr=subprocess.PIPE, env=env)
        assert self.process.stderr is not None
        deadline = time.monotonic() + SERVE_START_TIMEOUT_S
        while not LISTENING.search(line := self.process.stderr.readline()):
            if not line or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("streamq did not start")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(SERVE_STOP_TIMEOUT_S)


def run_perf(streamq: str, args: list[str], timeout_s: float) -> dict[str, object]:
    """Run `streamq perf ARGS -j` and return its JSON object. Raises `ScenarioError` when
    it fails, prints no JSON object, or runs past `timeout_s`."""
    command = [streamq, "perf", *args, "-j"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        raise ScenarioError(f"timed out after {timeout_s:.0f} s") from None
    if process.returncode != 0:
        raise ScenarioError(last_line(stderr) or f"exit status {process.returncode}")
    return parse_json_summary(stdout)


def _kill_group(process: subprocess.Popen[str]) -> None:
    # The group id is the pid of the perf process started above (start_new_session).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=KILL_WAIT_S)


def last_line(text: str) -> str:
    """The last non-empty line, shortened: the perf tool's one-line error."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:ERROR_CHARS_MAX] if lines else ""


def parse_json_summary(stdout: str) -> dict[str, object]:
    """The last line of stdout as a JSON object. Raises `ScenarioError` otherwise."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        raise ScenarioError(
            f"no JSON summary from streamq perf: {line[:ERROR_CHARS_MAX]!r}"
        ) from None
    if not isinstance(value, dict):
        raise ScenarioError(f"the JSON summary is not an object: {line[:ERROR_CHARS_MAX]!r}")
    return value
