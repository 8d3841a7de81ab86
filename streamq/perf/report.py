"""What `streamq perf throughput` shows: the live line, the summary table, the JSON.

Owns the formats and nothing else: pure functions from counts to text. The live line
goes out once a second; the summary table (or, with `-j`, one JSON object) at the end.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Final

_MIB: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class Summary:
    elapsed_s: float
    publishers: int
    consumers: int
    body_bytes: int
    published: int
    confirmed: int | None
    consumed: int
    avg_pub_rate: float
    avg_consume_rate: float
    latency_ms: dict[str, float] | None
    # basic.ack frames the consumers sent; None when they consumed with no-ack.
    ack_frames: int | None = None


def summarize(
    elapsed_s: float,
    publishers: int,
    consumers: int,
    body_bytes: int,
    counts: tuple[int, int | None, int],
    latency_ms: dict[str, float] | None,
    ack_frames: int | None = None,
) -> Summary:
    published, confirmed, consumed = counts
    elapsed_s = max(elapsed_s, 1e-9)
    return Summary(
        elapsed_s=round(elapsed_s, 3),
        publishers=publishers,
        consumers=consumers,
        body_bytes=body_bytes,
        published=published,
        confirmed=confirmed,
        consumed=consumed,
        avg_pub_rate=round(published / elapsed_s, 1),
        avg_consume_rate=round(consumed / elapsed_s, 1),
        latency_ms=latency_ms,
        ack_frames=ack_frames,
    )


def live_line(second: int, published: int, consumed: int, unconfirmed: int | None) -> str:
    """One second's rates, e.g. `[  3s] publish  412,330 msgs/s  consume  398,112 msgs/s`."""
    line = f"[{second:3d}s] publish {published:>10,} msgs/s  consume {consumed:>10,} msgs/s"
    if unconfirmed is not None:
        line += f"  unconfirmed {unconfirmed:>8,}"
    return line


def summary_json(summary: Summary) -> str:
    return json.dumps(asdict(summary))


def summary_table(summary: Summary) -> str:
    """The end-of-run table: counts, rates and bandwidth per direction, then latency."""
    workers = f"{_count(summary.publishers, 'publisher')}, {_count(summary.consumers, 'consumer')}"
    lines = [
        f"summary: {summary.elapsed_s:.2f} s, {workers}, {summary.body_bytes}-byte bodies",
        f"  {'':<12}{'messages':>14}{'msgs/s':>14}{'MiB/s':>10}",
        _row("published", summary.published, summary.avg_pub_rate, summary.body_bytes),
    ]
    if summary.confirmed is not None:
        lines.append(f"  {'confirmed':<12}{summary.confirmed:>14,}")
    lines.append(_row("consumed", summary.consumed, summary.avg_consume_rate, summary.body_bytes))
    if summary.ack_frames is not None:
        lines.append(f"  {'ack frames':<12}{summary.ack_frames:>14,}")
    if summary.latency_ms is not None:
        latency = summary.latency_ms
        values = "  ".join(f"{key} {latency[key]:.3f}" for key in ("p50", "p95", "p99", "max"))
        lines.append(f"  {'latency ms':<12}  {values}")
    return "\n".join(lines)


def _row(name: str, count: int, rate: float, body_bytes: int) -> str:
    mib_s = rate * body_bytes / _MIB
    return f"  {name:<12}{count:>14,}{rate:>14,.1f}{mib_s:>10.2f}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
