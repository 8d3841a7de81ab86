"""Offset resolution and partition planning: from options and log snapshots to ranges.

Owns the meaning of `earliest`, `latest`, JSON offsets and timestamps against the logs as
they are on disk, the checks for data lost to retention at planning time, and the cut of
offset ranges into `SegmentRange`s (never across a segment, split further for
`minPartitions`). Offsets here are always canonical: dicts sorted by stream name, int
values, so that Spark sees the same JSON for the same position.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from typing import NamedTuple

from spark_source import logdir
from spark_source.options import EARLIEST, LATEST, OffsetSpec, SourceOptions
from spark_source.store import HttpStore, LocalStore, Store

log = logging.getLogger(__name__)

Offsets = dict[str, int]


class DataLoss(Exception):
    """Offsets asked for are gone (deleted by retention) and failOnDataLoss is true."""


class StreamNotFound(Exception):
    """A stream named in the options has no log directory under the data dir."""


class SegmentRange(NamedTuple):
    """Records [start, end) of one stream, all in the segment whose first offset is base."""

    stream: str
    store: Store
    base: int
    start: int
    end: int


def canonical(offsets: Mapping[str, int]) -> Offsets:
    """Offsets sorted by stream with int values: the only form handed to Spark."""
    return {stream: int(offsets[stream]) for stream in sorted(offsets)}


def stream_stores(opts: SourceOptions, names: tuple[str, ...]) -> dict[str, Store]:
    """Where each stream's files are read from. Raises StreamNotFound for a local stream
    without a directory (a remote one is found missing by `snapshot`)."""
    if opts.url is not None:
        return {
            name: HttpStore(opts.url, opts.vhost, name, opts.username, opts.password)
            for name in sorted(names)
        }
    assert opts.path is not None, "parse_options requires path or url"
    stores = {name: LocalStore.of(opts.path, opts.vhost, name) for name in sorted(names)}
    for name, store in stores.items():
        if not os.path.isdir(store.directory):
            raise StreamNotFound(
                f"stream {name!r} not found in vhost {opts.vhost!r} under {opts.path!r} "
                f"(no directory {store.directory})"
            )
    return dict(stores)


def snapshot(stores: Mapping[str, Store]) -> dict[str, logdir.LogView]:
    """The current view of each log. Raises StreamNotFound if a stream is not there."""
    views = {}
    for name, store in sorted(stores.items()):
        try:
            views[name] = logdir.view_log(store)
        except FileNotFoundError as exc:
            raise StreamNotFound(f"stream {name!r} not found ({store.describe()})") from exc
    return views


def resolve(
    spec: OffsetSpec,
    timestamp_ms: int | None,
    views: Mapping[str, logdir.LogView],
    default: int,
    what: str,
) -> Offsets:
    """Offsets for `spec` (or for `timestamp_ms` when given) on each stream. Streams a JSON
    spec leaves out get `default` (EARLIEST or LATEST). Raises ValueError for a JSON spec
    naming a stream that is not read."""
    if timestamp_ms is not None:
        return canonical(
            {name: logdir.first_at_or_after(view, timestamp_ms) for name, view in views.items()}
        )
    if isinstance(spec, dict):
        extra = sorted(set(spec) - set(views))
        if extra:
            raise ValueError(f"{what} names streams that are not read: {extra}")
        wanted = {name: spec.get(name, default) for name in views}
    else:
        wanted = {name: EARLIEST if spec == "earliest" else LATEST for name in views}
    resolved = {}
    for name, offset in wanted.items():
        view = views[name]
        if offset == EARLIEST:
            resolved[name] = view.earliest
        elif offset == LATEST:
            resolved[name] = view.latest
        else:
            resolved[name] = offset
    return canonical(resolved)


def check_ending(end: Mapping[str, int], views: Mapping[str, logdir.LogView]) -> None:
    """Raises ValueError when an ending offset is past the durable end of its log."""
    for name, offset in end.items():
        if offset > views[name].latest:
            raise ValueError(
                f"endingOffsets for stream {name!r} is {offset}, past the end of the log "
                f"({views[name].latest} durable)"
            )


def plan(
    views: Mapping[str, logdir.LogView],
    start: Mapping[str, int],
    end: Mapping[str, int],
    min_partitions: int,
    fail_on_data_loss: bool,
) -> list[SegmentRange]:
    """Ranges covering [start, end) of every stream, none across a segment boundary, cut
    further so that there are at least `min_partitions` when the records allow.

    Raises DataLoss when a start is below what retention kept and fail_on_data_loss is
    true; otherwise the lost offsets are skipped with a warning. Raises ValueError when an
    end is below its start (a planning bug that would silently drop data).
    """
    ranges: list[SegmentRange] = []
    for name in sorted(end):
        view = views[name]
        first, last = start.get(name, view.earliest), end[name]
        if last < first:
            raise ValueError(f"stream {name!r}: end offset {last} is below start {first}")
        if first < view.earliest and first < last:
            lost = f"stream {name!r}: offsets {first}..{min(last, view.earliest) - 1} are gone"
            if fail_on_data_loss:
                raise DataLoss(f"{lost} (deleted by retention); set failOnDataLoss=false to skip")
            log.warning("%s (deleted by retention); skipping them", lost)
            first = view.earliest
        ranges.extend(_segment_ranges(name, view, first, min(last, view.latest)))
    return _split(ranges, min_partitions)


def _segment_ranges(name: str, view: logdir.LogView, first: int, last: int) -> list[SegmentRange]:
    ranges = []
    for i, base in enumerate(view.bases):
        seg_end = view.bases[i + 1] if i + 1 < len(view.bases) else last
        lo, hi = max(first, base), min(last, seg_end)
        if lo < hi:
            ranges.append(SegmentRange(name, view.store, base, lo, hi))
    return ranges


def group(
    ranges: list[SegmentRange], records_max: int | None, min_partitions: int
) -> list[tuple[SegmentRange, ...]]:
    """The ranges of `plan` packed into partitions: with `records_max`, consecutive
    ranges of a stream share a partition of at most that many records (cut at that
    count, across segments), and at most total / min_partitions so that there are still
    at least `min_partitions` when the records allow; without it, one range each.

    Fewer, larger partitions matter: Spark spends tens of milliseconds of fixed cost
    per task, as much as decoding ~50k records (docs/benchmarks.md, Spark section).
    """
    if records_max is None:
        return [(r,) for r in ranges]
    total = sum(r.end - r.start for r in ranges)
    cap = max(1, min(records_max, math.ceil(total / min_partitions)))
    groups: list[tuple[SegmentRange, ...]] = []
    current: list[SegmentRange] = []
    filled = 0
    for r in ranges:
        if current and current[-1].stream != r.stream:
            groups.append(tuple(current))
            current, filled = [], 0
        lo = r.start
        while lo < r.end:
            hi = min(r.end, lo + cap - filled)
            current.append(r._replace(start=lo, end=hi))
            filled += hi - lo
            lo = hi
            if filled == cap:
                groups.append(tuple(current))
                current, filled = [], 0
    if current:
        groups.append(tuple(current))
    return groups


def _split(ranges: list[SegmentRange], min_partitions: int) -> list[SegmentRange]:
    if len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    chunk = max(1, math.ceil(total / min_partitions))
    out = []
    for r in ranges:
        for lo in range(r.start, r.end, chunk):
            out.append(r._replace(start=lo, end=min(lo + chunk, r.end)))
    return out
