"""The data source's options: parsing and validation, in the manner of Spark's Kafka source.

Owns the option names, their defaults and every rule that makes a set of options invalid.
`DataSource.schema()` calls `parse_options`, so a bad option fails at `load()` with a
message naming it. Spark lower-cases option keys, so lookups here are lower-case.

Offsets in `startingOffsets` / `endingOffsets` are `earliest`, `latest`, or a JSON object
`{"stream": offset}`, where -2 means earliest and -1 latest (Kafka's convention).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

EARLIEST: Final = -2
LATEST: Final = -1
PARTITIONS_MAX: Final = 10_000  # minPartitions beyond this is a typo, not a plan
# Spark's fixed cost per task (tens of ms) makes one task per 8 MiB segment half as fast
# as tasks of a million records or more (docs/spark.md, Measured).
RECORDS_PER_PARTITION_DEFAULT: Final = 1_000_000
DELAY_UNITS_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
TRIGGER_DELAY_DEFAULT_MS: Final = 15 * 60_000  # Kafka's maxTriggerDelay default

KNOWN: Final = frozenset(
    {
        "path",
        "url",
        "username",
        "password",
        "vhost",
        "stream",
        "streams",
        "streampattern",
        "startingoffsets",
        "endingoffsets",
        "startingtimestamp",
        "endingtimestamp",
        "maxoffsetspertrigger",
        "minoffsetspertrigger",
        "maxtriggerdelay",
        "minpartitions",
        "maxrecordsperpartition",
        "failondataloss",
        "includeheaders",
    }
)

# The spec of a starting or ending position: "earliest", "latest", or offsets per stream.
OffsetSpec = str | dict[str, int]


class OptionError(ValueError):
    """The options are unknown, malformed or contradictory."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Validated options. Exactly one of `streams` and `stream_pattern` is set."""

    path: str | None
    url: str | None
    username: str
    password: str
    vhost: str
    streams: tuple[str, ...]
    stream_pattern: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp_ms: int | None
    ending_timestamp_ms: int | None
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    min_partitions: int
    fail_on_data_loss: bool
    include_headers: bool
    ending_given: bool  # endingOffsets or endingTimestamp was set (batch only)
    # Partitions span segments, up to this many records each (None: one per segment,
    # for callers that build Options directly).
    max_records_per_partition: int | None = None


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate `options` (keys in any case). Raises OptionError naming the bad option."""
    opts = {key.lower(): str(value) for key, value in options.items()}
    unknown = sorted(set(opts) - KNOWN)
    if unknown:
        raise OptionError(f"unknown option(s) {unknown}; known: {sorted(KNOWN)}")
    if bool(opts.get("path")) == bool(opts.get("url")):
        raise OptionError(
            "exactly one of 'path' (the broker's data directory) and 'url' (the broker's "
            "HTTP address, for remote reads) is required"
        )
    streams, pattern = _subscription(opts)
    if pattern is not None and "url" in opts:
        raise OptionError("streamPattern needs 'path'; over 'url' name the streams")
    if ("username" in opts or "password" in opts) and "url" not in opts:
        raise OptionError("'username' and 'password' are for remote reads ('url') only")
    _exclusive(opts, "startingoffsets", "startingtimestamp")
    _exclusive(opts, "endingoffsets", "endingtimestamp")
    starting = _offset_spec(opts.get("startingoffsets", "earliest"), "startingOffsets")
    ending = _offset_spec(opts.get("endingoffsets", "latest"), "endingOffsets")
    if ending == "earliest":
        raise OptionError("endingOffsets 'earliest' is not allowed: it would read nothing")
    max_per_trigger = _positive(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger")
    min_per_trigger = _positive(opts, "minoffsetspertrigger", "minOffsetsPerTrigger")
    if max_per_trigger and min_per_trigger and min_per_trigger > max_per_trigger:
        raise OptionError("minOffsetsPerTrigger must not exceed maxOffsetsPerTrigger")
    min_partitions = _positive(opts, "minpartitions", "minPartitions") or 1
    if min_partitions > PARTITIONS_MAX:
        raise OptionError(f"minPartitions must be at most {PARTITIONS_MAX}")
    return SourceOptions(
        path=opts.get("path"),
        url=opts.get("url"),
        username=opts.get("username", "guest"),
        password=opts.get("password", "guest"),
        vhost=opts.get("vhost", "/"),
        streams=streams,
        stream_pattern=pattern,
        starting=starting,
        ending=ending,
        starting_timestamp_ms=_timestamp(opts, "startingtimestamp", "startingTimestamp"),
        ending_timestamp_ms=_timestamp(opts, "endingtimestamp", "endingTimestamp"),
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=_delay(opts.get("maxtriggerdelay")),
        min_partitions=min_partitions,
        fail_on_data_loss=_boolean(opts, "failondataloss", "failOnDataLoss", default=True),
        include_headers=_boolean(opts, "includeheaders", "includeHeaders", default=False),
        ending_given="endingoffsets" in opts or "endingtimestamp" in opts,
        max_records_per_partition=_positive(
            opts, "maxrecordsperpartition", "maxRecordsPerPartition"
        )
        or RECORDS_PER_PARTITION_DEFAULT,
    )


def _subscription(opts: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    given = [name for name in ("stream", "streams", "streampattern") if name in opts]
    if len(given) != 1:
        raise OptionError(
            "exactly one of 'stream', 'streams' (comma-separated) and 'streamPattern' "
            f"must be given, got {given or 'none'}"
        )
    if given[0] == "streampattern":
        try:
            re.compile(opts["streampattern"])
        except re.error as exc:
            raise OptionError(f"streamPattern is not a valid regular expression: {exc}") from exc
        return (), opts["streampattern"]
    names = tuple(name.strip() for name in opts[given[0]].split(","))
    if given[0] == "stream":
        names = (opts["stream"],)
    if not all(names) or len(set(names)) != len(names):
        raise OptionError(f"option '{given[0]}' must name distinct, non-empty streams")
    return names, None


def _exclusive(opts: Mapping[str, str], first: str, second: str) -> None:
    if first in opts and second in opts:
        raise OptionError(f"options '{first}' and '{second}' contradict each other: give one")


def _offset_spec(value: str, name: str) -> OffsetSpec:
    if value.strip().lower() in ("earliest", "latest"):
        return value.strip().lower()
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise OptionError(
            f"{name} must be 'earliest', 'latest' or a JSON object of offsets, got {value!r}"
        ) from exc
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"{name} JSON must be a non-empty object {{stream: offset}}")
    for stream, offset in parsed.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
            raise OptionError(
                f"{name}: offset of stream {stream!r} must be an integer >= 0, "
                f"or -2 (earliest) or -1 (latest), got {offset!r}"
            )
    return {str(stream): int(offset) for stream, offset in sorted(parsed.items())}


def _positive(opts: Mapping[str, str], key: str, name: str) -> int | None:
    if key not in opts:
        return None
    try:
        value = int(opts[key])
    except ValueError as exc:
        raise OptionError(f"{name} must be a positive integer, got {opts[key]!r}") from exc
    if value <= 0:
        raise OptionError(f"{name} must be a positive integer, got {value}")
    return value


def _timestamp(opts: Mapping[str, str], key: str, name: str) -> int | None:
    if key not in opts:
        return None
    try:
        value = int(opts[key])
    except ValueError as exc:
        raise OptionError(
            f"{name} must be milliseconds since the epoch, got {opts[key]!r}"
        ) from exc
    if value < 0:
        raise OptionError(f"{name} must not be negative, got {value}")
    return value


def _boolean(opts: Mapping[str, str], key: str, name: str, *, default: bool) -> bool:
    value = opts.get(key)
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false"):
        raise OptionError(f"{name} must be 'true' or 'false', got {value!r}")
    return value.strip().lower() == "true"


def _delay(value: str | None) -> int:
    """`maxTriggerDelay` such as `15m`, `30s`, `500ms` in milliseconds."""
    if value is None:
        return TRIGGER_DELAY_DEFAULT_MS
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)\s*", value.lower())
    if match is None:
        raise OptionError(f"maxTriggerDelay must look like '15m', '30s' or '500ms', got {value!r}")
    return int(match.group(1)) * DELAY_UNITS_MS[match.group(2)]
