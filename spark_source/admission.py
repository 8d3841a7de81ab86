"""Admission control for micro-batches: how far the next batch may read.

Owns the pure arithmetic of Spark 4.2+'s read limits over several streams: `ReadMaxRows`
split across streams in proportion to what each has waiting (as Kafka's
maxOffsetsPerTrigger), `ReadMinRows` with `maxTriggerDelay`, and the AvailableNow target
that a query must never pass. It reads no files and imports no pyspark.
"""

from __future__ import annotations

from collections.abc import Mapping

from spark_source.planning import Offsets, canonical


def cap_rows(start: Mapping[str, int], latest: Mapping[str, int], rows_max: int) -> Offsets:
    """End offsets at most `rows_max` records past `start` in total, shared between the
    streams in proportion to their backlog (floors, then the remainder one record at a
    time in stream order, so the sum is exactly `rows_max` when the backlog exceeds it).
    A stream missing from `start` starts at its `latest` (nothing to read)."""
    assert rows_max > 0, "ReadMaxRows needs a positive limit"
    backlog = {name: max(0, latest[name] - start.get(name, latest[name])) for name in latest}
    total = sum(backlog.values())
    if total <= rows_max:
        return canonical({name: start.get(name, latest[name]) + backlog[name] for name in latest})
    shares = {name: waiting * rows_max // total for name, waiting in backlog.items()}
    remainder = rows_max - sum(shares.values())
    for name in sorted(backlog):
        if remainder == 0:
            break
        if shares[name] < backlog[name]:
            shares[name] += 1
            remainder -= 1
    return canonical({name: start.get(name, latest[name]) + shares[name] for name in latest})


def cap_at(end: Mapping[str, int], target: Mapping[str, int]) -> Offsets:
    """`end` not past `target` (the AvailableNow target) for streams the target knows."""
    return canonical({name: min(offset, target.get(name, offset)) for name, offset in end.items()})


def backlog_rows(start: Mapping[str, int], latest: Mapping[str, int]) -> int:
    """Records waiting between `start` and `latest`, over every stream."""
    return sum(max(0, latest[name] - start.get(name, latest[name])) for name in latest)


def min_rows_met(
    start: Mapping[str, int],
    latest: Mapping[str, int],
    rows_min: int,
    waited_ms: int,
    delay_ms: int,
) -> bool:
    """Whether a batch may run under `ReadMinRows`: enough records wait, or the last batch
    was `delay_ms` or more ago and at least one record waits (Kafka's maxTriggerDelay)."""
    waiting = backlog_rows(start, latest)
    return waiting >= rows_min or (waiting > 0 and waited_ms >= delay_ms)
