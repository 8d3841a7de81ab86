"""The arithmetic and the tables of `benchmarks/compare.py`: pure functions, no I/O.

Owns what a comparison reports: the median of each broker's repetitions (the largest, for
memory costs), the A/B ratio, whether A meets the target against B (and, with a third
broker C, the A/C ratio and verdict beside them), and the Markdown table that
`compare.py` prints and `docs/benchmarks.md` quotes. It must not start
processes, open sockets or read /proc: everything here is unit-tested without brokers
(tests/unit/test_compare.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

TARGET_RATIO: Final = 1.5
"""The throughput target of issue 4: A's rate at least this many times B's."""
NO_WORSE: Final = 1.0
"""The latency and memory target of issue 4: A no worse than B (A/B at most 1)."""
NOT_AVAILABLE: Final = "n/a"
_THOUSAND: Final = 1000.0
_MILLION: Final = 1_000_000.0


@dataclass(frozen=True, slots=True)
class Metric:
    """One number a scenario yields, e.g. the consume rate, in `unit`."""

    key: str
    label: str
    unit: str
    higher_is_better: bool
    # The A/B ratio A must reach: at least it for rates, at most it where lower is
    # better; None: reported without a target (latency p50).
    target: float | None = TARGET_RATIO
    # The largest repetition stands for the run instead of the median: memory costs, which
    # the repetitions after the first understate, since a broker reuses what the earlier
    # ones freed (streamq's 1,000 connections: 6.7, 0.1 and 0.0 KiB each, 2026-11-24).
    largest: bool = False


@dataclass(slots=True)
class Row:
    """One metric of one scenario: every repetition's value and error for A, B and the
    optional third broker C."""

    scenario: str
    flags: str
    metric: Metric
    values_a: list[float] = field(default_factory=list)
    values_b: list[float] = field(default_factory=list)
    errors_a: list[str] = field(default_factory=list)
    errors_b: list[str] = field(default_factory=list)
    values_c: list[float] = field(default_factory=list)
    errors_c: list[str] = field(default_factory=list)

    def side(self, index: int) -> tuple[list[float], list[str]]:
        """The values and errors of broker `index`: 0 is A, 1 is B, 2 is C."""
        sides = (
            (self.values_a, self.errors_a),
            (self.values_b, self.errors_b),
            (self.values_c, self.errors_c),
        )
        return sides[index]


def median(values: Sequence[float]) -> float | None:
    """The median, or None when no repetition produced a value."""
    return statistics.median(values) if values else None


def reported(values: Sequence[float], metric: Metric) -> float | None:
    """The figure that stands for a broker's repetitions of `metric`: their median, or
    their largest where `metric.largest`; None when no repetition produced a value."""
    if metric.largest:
        return max(values) if values else None
    return median(values)


def ratio(value_a: float | None, value_b: float | None) -> float | None:
    """A / B, or None when either is missing or B is zero."""
    if value_a is None or value_b is None or value_b == 0:
        return None
    return value_a / value_b


def verdict(a_over_b: float | None, metric: Metric) -> str:
    """Whether A meets the metric's target against B, the target first: '≥1.5: met' for
    a rate, '≤1: not met' for latency or memory; '-' without a target."""
    if metric.target is None:
        return "-"
    if a_over_b is None:
        return NOT_AVAILABLE
    if metric.higher_is_better:
        met = a_over_b >= metric.target
        return f"≥{metric.target:g}: {'met' if met else 'not met'}"
    met = a_over_b <= metric.target
    return f"≤{metric.target:g}: {'met' if met else 'not met'}"


def format_value(value: float | None, unit: str) -> str:
    """A number for a person: rates in k or M, milliseconds to three decimals."""
    if value is None:
        return NOT_AVAILABLE
    if unit == "msgs/s":
        return _format_rate(value)
    if unit == "ms":
        return f"{value:.3f} ms"
    return f"{value:,.1f} {unit}"


def _format_rate(value: float) -> str:
    if value >= _MILLION:
        return f"{value / _MILLION:.2f}M msgs/s"
    if value >= _THOUSAND:
        return f"{value / _THOUSAND:.1f}k msgs/s"
    return f"{value:.0f} msgs/s"


def format_ratio(a_over_b: float | None) -> str:
    return NOT_AVAILABLE if a_over_b is None else f"{a_over_b:.2f}"


def cell(values: Sequence[float], errors: Sequence[str], metric: Metric) -> str:
    """The reported figure, or why there is none ('n/a (not supported)' when every run
    failed)."""
    if values:
        return format_value(reported(values, metric), metric.unit)
    if errors:
        return f"{NOT_AVAILABLE} (not supported)"
    return NOT_AVAILABLE


def markdown_table(rows: Sequence[Row], name_a: str, name_b: str, name_c: str | None = None) -> str:
    """The comparison as a Markdown table: the reported figures (medians; the largest for
    memory), A/B and whether A meets the target; with `name_c`, C's figure and A/C with
    its verdict too, so one run shows A against both."""
    header = f"| scenario | flags | {name_a} | {name_b} |"
    header += f" {name_c} |" if name_c else ""
    header += f" {name_a}/{name_b} | target |"
    header += f" {name_a}/{name_c} | target |" if name_c else ""
    columns = 9 if name_c else 6
    lines = [header, "|---" * columns + "|"]
    for row in rows:
        line = (
            f"| {row.scenario}: {row.metric.label} | `{row.flags}` "
            f"| {cell(row.values_a, row.errors_a, row.metric)} "
            f"| {cell(row.values_b, row.errors_b, row.metric)} |"
        )
        if name_c:
            line += f" {cell(row.values_c, row.errors_c, row.metric)} |"
        line += _ratio_cells(row, row.values_b)
        if name_c:
            line += _ratio_cells(row, row.values_c)
        lines.append(line)
    return "\n".join(lines)


def _ratio_cells(row: Row, values_other: Sequence[float]) -> str:
    a_over_other = ratio(reported(row.values_a, row.metric), reported(values_other, row.metric))
    return f" {format_ratio(a_over_other)} | {verdict(a_over_other, row.metric)} |"


def error_lines(
    rows: Sequence[Row], name_a: str, name_b: str, name_c: str | None = None
) -> list[str]:
    """One line per distinct failure, for the notes under the table."""
    seen: dict[str, None] = {}
    names = (name_a, name_b) if name_c is None else (name_a, name_b, name_c)
    for row in rows:
        for index, name in enumerate(names):
            for error in row.side(index)[1]:
                seen.setdefault(f"{row.scenario} on {name}: {error}", None)
    return list(seen)


def row_summary(row: Row) -> dict[str, object]:
    """A row as JSON-ready data: raw values, medians, the reported figures (the medians,
    or the largest values for memory), their ratio and the verdict; the same for C
    (`ratio_c` is A/C) when the row has a third broker's values or errors."""
    reported_a, reported_b = reported(row.values_a, row.metric), reported(row.values_b, row.metric)
    a_over_b = ratio(reported_a, reported_b)
    summary: dict[str, object] = {
        "scenario": row.scenario,
        "flags": row.flags,
        "metric": row.metric.key,
        "unit": row.metric.unit,
        "higher_is_better": row.metric.higher_is_better,
        "values_a": row.values_a,
        "values_b": row.values_b,
        "errors_a": row.errors_a,
        "errors_b": row.errors_b,
        "median_a": median(row.values_a),
        "median_b": median(row.values_b),
        "reported_a": reported_a,
        "reported_b": reported_b,
        "ratio": a_over_b,
        "target": verdict(a_over_b, row.metric),
    }
    if row.values_c or row.errors_c:
        reported_c = reported(row.values_c, row.metric)
        a_over_c = ratio(reported_a, reported_c)
        summary.update(
            values_c=row.values_c,
            errors_c=row.errors_c,
            median_c=median(row.values_c),
            reported_c=reported_c,
            ratio_c=a_over_c,
            target_c=verdict(a_over_c, row.metric),
        )
    return summary


# Issue 20: each TLS scenario and the TCP scenario it repeats over TLS.
TLS_TWINS: Final = (
    ("TLS: publish only, 16 B", "publish only, 16 B"),
    ("TLS: publish only, 1 KiB", "publish only, 1 KiB"),
    ("TLS: 1 pub + 1 cons, manual ack", "1 pub + 1 cons, manual ack"),
)


def tls_lines(rows: Sequence[Row], names: Sequence[str]) -> list[str]:
    """Each broker's rate over TLS as a share of its rate over TCP, per metric of the TLS
    scenarios that ran beside their TCP twins."""
    by_title = {(row.scenario, row.metric.key): row for row in rows}
    lines = []
    for tls_title, tcp_title in TLS_TWINS:
        for (title, key), tls_row in by_title.items():
            tcp_row = by_title.get((tcp_title, key))
            if title != tls_title or tcp_row is None:
                continue
            shares = []
            for index, name in enumerate(names):
                share = ratio(median(tls_row.side(index)[0]), median(tcp_row.side(index)[0]))
                shares.append(f"{name} {NOT_AVAILABLE if share is None else f'{share:.0%}'}")
            lines.append(f"{tls_title}, {tls_row.metric.label}: TLS/TCP " + ", ".join(shares))
    return lines
