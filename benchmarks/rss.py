"""A broker's resident memory, read from /proc/PID/status, once or sampled in a thread.

Owns reading `VmRSS` (resident now) and `VmHWM` (the peak since the process started),
`RssSampler`, a daemon thread that reads VmRSS every `SAMPLE_INTERVAL_S` while a run goes
on and keeps the peak, and `wait_for_steady_rss`, which polls until the RSS stops moving.
It only reads /proc; it never signals or otherwise touches the process it watches.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Final

SAMPLE_INTERVAL_S: Final = 0.2
JOIN_TIMEOUT_S: Final = 2.0
STEADY_POLL_S: Final = 0.5
STEADY_READINGS: Final = 4
"""Consecutive readings that must agree for the RSS to count as steady."""
STEADY_TOLERANCE_KIB: Final = 2048
STEADY_TIMEOUT_S: Final = 60.0


def parse_status_kib(status: str, field: str) -> int | None:
    """The value in KiB of `field` (e.g. 'VmRSS') in the text of /proc/PID/status."""
    prefix = f"{field}:"
    for line in status.splitlines():
        if line.startswith(prefix):
            return int(line.split()[1])
    return None


def read_status_kib(pid: int | None, field: str) -> int | None:
    """`field` of process `pid` in KiB; None without a pid or when the process is gone."""
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return parse_status_kib(status, field)


def is_steady(readings_kib: list[int], tolerance_kib: int = STEADY_TOLERANCE_KIB) -> bool:
    """True when the last `STEADY_READINGS` readings lie within `tolerance_kib`."""
    last = readings_kib[-STEADY_READINGS:]
    return len(last) == STEADY_READINGS and max(last) - min(last) <= tolerance_kib


def wait_for_steady_rss(pid: int, timeout_s: float = STEADY_TIMEOUT_S) -> bool:
    """Wait until the VmRSS of `pid` stops moving (a broker still freeing the memory of
    the previous run would make a before/after difference meaningless). Returns whether
    it became steady before `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    readings: list[int] = []
    while time.monotonic() < deadline:
        rss_kib = read_status_kib(pid, "VmRSS")
        if rss_kib is None:
            return False
        readings.append(rss_kib)
        if is_steady(readings):
            return True
        time.sleep(STEADY_POLL_S)
    return False


class RssSampler:
    """Samples VmRSS of `pid` in a daemon thread between `start()` and `stop()`."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.peak_kib: int | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        if self.pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(JOIN_TIMEOUT_S)
        self._take()  # one last sample, so even a run shorter than the interval has one

    def _sample(self) -> None:
        while not self._stopped.is_set():
            self._take()
            self._stopped.wait(SAMPLE_INTERVAL_S)

    def _take(self) -> None:
        rss_kib = read_status_kib(self.pid, "VmRSS")
        if rss_kib is not None and (self.peak_kib is None or rss_kib > self.peak_kib):
            self.peak_kib = rss_kib
