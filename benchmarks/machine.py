"""What every micro-benchmark here reports about the machine, and how it times a loop."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (a VM may hide the number)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def best_seconds(run: Callable[[], object], rounds: int) -> float:
    """The shortest of `rounds` timings of `run()`, in seconds."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best
