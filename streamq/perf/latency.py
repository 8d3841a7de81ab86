"""End-to-end latency: samples taken by consumers and the percentiles of the summary.

Owns `LatencySamples`, a bounded array of latencies in nanoseconds. A publisher stamps
`time.time_ns()` into the first 8 body bytes when the batch goes to the socket; a
consumer subtracts the stamp from the time its read was scanned. Wall-clock time, not a
monotonic clock, so a publisher and a consumer on two hosts with synchronised clocks
measure too. Past `SAMPLES_MAX` the array keeps every other sample and halves its
sampling rate, so a long run costs bounded memory and stays evenly sampled.
"""

from __future__ import annotations

from array import array
from typing import Final

SAMPLES_MAX: Final = 1 << 20
PERCENTILES: Final = (50, 95, 99)
_NS_PER_MS: Final = 1_000_000


class LatencySamples:
    def __init__(self) -> None:
        self.samples = array("q")
        self._stride = 1
        self._seen = 0

    def add(self, now_ns: int, stamps: list[int]) -> None:
        """Record `now_ns - stamp` for each stamp (every stride-th one past the cap)."""
        start = -self._seen % self._stride
        self.samples.extend([now_ns - stamp for stamp in stamps[start :: self._stride]])
        self._seen += len(stamps)
        if len(self.samples) > SAMPLES_MAX:
            self.samples = self.samples[::2]
            self._stride *= 2

    def to_bytes(self) -> bytes:
        return self.samples.tobytes()


def latency_summary(parts: list[bytes]) -> dict[str, float] | None:
    """p50, p95, p99 and max in milliseconds over every consumer's samples, or None when
    there are none (no consumer, or latency not measured)."""
    merged = array("q")
    for part in parts:
        merged.frombytes(part)
    if not merged:
        return None
    ordered = sorted(merged)
    summary = {f"p{p}": _ms(ordered[_rank(p, len(ordered))]) for p in PERCENTILES}
    summary["max"] = _ms(ordered[-1])
    summary["samples"] = float(len(ordered))
    return summary


def _rank(percentile: int, count: int) -> int:
    """Nearest-rank percentile: the smallest sample with `percentile`% at or below it."""
    return max(0, -(-percentile * count // 100) - 1)


def _ms(nanoseconds: int) -> float:
    return round(nanoseconds / _NS_PER_MS, 3)
