"""The PySpark data source classes: `StreamqDataSource` (format "streamq") and its readers.

Owns the thin layer Spark calls: option validation at `load()` (in `schema()`), the
fixed schema, batch planning, and the micro-batch offsets of streaming queries (cached
initial offset, read limits, the AvailableNow target). The work is done by `planning`
(offsets and ranges), `admission` (read limits) and `arrow` (decoding on executors).

Rules:
1. Readers are pickled into every task: they hold options and plain data only, never an
   open file (`arrow.read_partition` opens segments inside the task).
2. Offsets handed to Spark are canonical (sorted keys, int values); see `planning`.
3. A user-specified schema may only pick columns of the fixed one (each with its fixed
   type, in any order): Spark's per-row cost grows with the columns, and this Python API
   has no other column pruning. Anything else is refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Final

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_source import admission, planning
from spark_source.arrow import read_partition
from spark_source.catalog import matching_streams
from spark_source.logdir import LogView
from spark_source.options import EARLIEST, LATEST, OptionError, SourceOptions, parse_options
from spark_source.properties import PROPERTY_NAMES

FORMAT_NAME: Final = "streamq"
_PROPERTY_TYPES: Final = {
    "delivery_mode": IntegerType(),
    "priority": IntegerType(),
    "timestamp": TimestampType(),
}


def spark_schema(include_headers: bool) -> StructType:
    """The fixed schema; `arrow.arrow_schema` is its Arrow form."""
    properties = StructType(
        [
            StructField(name, _PROPERTY_TYPES.get(name, StringType()))
            for name in PROPERTY_NAMES
            if name != "headers"
        ]
    )
    fields = [
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("stream", StringType()),
        StructField("exchange", StringType()),
        StructField("routing_key", StringType()),
        StructField("body", BinaryType()),
        StructField("properties", properties),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


class StreamqPartition(InputPartition):
    """`SegmentRange`s to read in order (one, unless maxRecordsPerPartition groups them),
    with the per-read settings (plain, picklable fields)."""

    def __init__(
        self,
        ranges: tuple[planning.SegmentRange, ...],
        include_headers: bool,
        fail: bool,
        columns: tuple[str, ...] | None,
    ) -> None:
        super().__init__(ranges)
        self.ranges = ranges
        self.include_headers = include_headers
        self.fail_on_data_loss = fail
        self.columns = columns  # None: every column of the fixed schema

    @property
    def part(self) -> planning.SegmentRange:
        """The range of a one-range partition (the default planning)."""
        assert len(self.ranges) == 1, "a grouped partition has several ranges"
        return self.ranges[0]


def _partitions(
    opts: SourceOptions, ranges: list[planning.SegmentRange], columns: tuple[str, ...] | None
) -> list[StreamqPartition]:
    groups = planning.group(ranges, opts.max_records_per_partition, opts.min_partitions)
    return [
        StreamqPartition(g, opts.include_headers, opts.fail_on_data_loss, columns) for g in groups
    ]


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, StreamqPartition):
        # Spark turns an empty partition list into one partition of its own: no rows.
        return
    for part in partition.ranges:
        yield from read_partition(
            part, partition.include_headers, partition.fail_on_data_loss, partition.columns
        )


def _stream_names(opts: SourceOptions) -> tuple[str, ...]:
    """The streams to read now; a pattern is matched again at every call, so a streaming
    query picks up streams declared after it started."""
    if opts.stream_pattern is not None:
        assert opts.path is not None, "parse_options refuses streamPattern with url"
        return matching_streams(opts.path, opts.vhost, opts.stream_pattern)
    return opts.streams


class StreamqDataSource(DataSource):
    """`spark.read.format("streamq")` and `spark.readStream.format("streamq")`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def _options(self) -> SourceOptions:
        return parse_options(dict(self.options))

    def schema(self) -> StructType:
        """Runs at `load()`: every option error surfaces here."""
        opts = self._options()
        return spark_schema(opts.include_headers)

    def reader(self, schema: StructType) -> BatchReader:
        opts = self._options()
        return BatchReader(opts, projection(schema, opts))

    def streamReader(self, schema: StructType) -> StreamReader:  # noqa: N802  # Spark's name
        opts = self._options()
        columns = projection(schema, opts)
        if opts.ending_given:
            raise OptionError("endingOffsets and endingTimestamp are for batch reads only")
        return StreamReader(opts, columns)


def projection(schema: StructType, opts: SourceOptions) -> tuple[str, ...] | None:
    """The columns a read builds: None for the fixed schema, else the names of a user
    schema (`.schema("offset long, body binary")`) made of some of its columns, each with
    its fixed type, in the user's order. Raises OptionError for any other schema."""
    full = spark_schema(opts.include_headers)
    if schema == full:
        return None
    fixed = {field.name: field for field in full.fields}
    names = [field.name for field in schema.fields]
    expected = f"expected some of the columns of {full.simpleString()}"
    if not names:
        raise OptionError(f"the schema names no column; {expected}")
    if len(set(names)) != len(names):
        raise OptionError(f"the schema names a column twice: {schema.simpleString()}")
    for field in schema.fields:
        if field.name == "headers" and not opts.include_headers:
            raise OptionError("the headers column is read with includeHeaders=true")
        if field.name not in fixed:
            raise OptionError(f"the streamq source has no column {field.name!r}; {expected}")
        if field != fixed[field.name]:
            want = fixed[field.name]
            raise OptionError(
                f"column {field.name!r} is {want.dataType.simpleString()} (nullable), "
                f"not {field.dataType.simpleString()}" + ("" if field.nullable else " NOT NULL")
            )
    return tuple(names)


class BatchReader(DataSourceReader):
    """Batch reads: resolve the offsets once, on the driver, then one task per range."""

    def __init__(self, opts: SourceOptions, columns: tuple[str, ...] | None = None) -> None:
        self.opts = opts
        self.columns = columns

    def plan(self) -> list[planning.SegmentRange]:
        """The ranges to read. Raises StreamNotFound, DataLoss or ValueError."""
        opts = self.opts
        if opts.starting == "latest":
            raise OptionError("startingOffsets 'latest' is not allowed in batch reads")
        views = planning.snapshot(planning.stream_stores(opts, _stream_names(opts)))
        start = planning.resolve(
            opts.starting, opts.starting_timestamp_ms, views, EARLIEST, "startingOffsets"
        )
        end = planning.resolve(
            opts.ending, opts.ending_timestamp_ms, views, LATEST, "endingOffsets"
        )
        planning.check_ending(end, views)
        # A start past its end reads nothing from that stream, as Kafka's batch reads.
        start = {name: min(start[name], end[name]) for name in start}
        return planning.plan(views, start, end, opts.min_partitions, opts.fail_on_data_loss)

    def partitions(self) -> Sequence[InputPartition]:
        return _partitions(self.opts, self.plan(), self.columns)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches by offset. Spark's checkpoint holds the offsets: `commit` is a no-op."""

    def __init__(self, opts: SourceOptions, columns: tuple[str, ...] | None = None) -> None:
        self.opts = opts
        self.columns = columns
        self._initial: planning.Offsets | None = None
        self._target: planning.Offsets | None = None  # AvailableNow: never read past it
        self._latest: planning.Offsets | None = None
        self._last_batch_ms = _now_ms()

    def _views(self) -> dict[str, LogView]:
        names = _stream_names(self.opts)
        return planning.snapshot(planning.stream_stores(self.opts, names))

    def initialOffset(self) -> planning.Offsets:  # noqa: N802  # Spark's name
        # Spark calls this twice for a new query: resolving `latest` twice would skip
        # the records appended in between, so the first answer is kept.
        if self._initial is None:
            opts = self.opts
            self._initial = planning.resolve(
                opts.starting,
                opts.starting_timestamp_ms,
                self._views(),
                EARLIEST,
                "startingOffsets",
            )
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802  # Spark's name
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802  # Spark's name
        self._target = {name: view.latest for name, view in self._views().items()}

    def latestOffset(self, start: planning.Offsets, limit: ReadLimit) -> planning.Offsets:  # noqa: N802
        views = self._views()
        latest = planning.canonical({name: view.latest for name, view in views.items()})
        self._latest = latest
        # A stream new to the query starts at its earliest offset, as Kafka's new partitions.
        start = {name: int(start.get(name, view.earliest)) for name, view in views.items()}
        if self._target is not None:
            latest = admission.cap_at(latest, self._target)
        elif self.opts.min_offsets_per_trigger is not None and not isinstance(
            limit, ReadAllAvailable
        ):
            waited = _now_ms() - self._last_batch_ms
            rows_min = self.opts.min_offsets_per_trigger
            if not admission.min_rows_met(
                start, latest, rows_min, waited, self.opts.max_trigger_delay_ms
            ):
                return planning.canonical(start)
        end = latest
        if isinstance(limit, ReadMaxRows):
            end = admission.cap_rows(start, latest, limit.max_rows)
        if end != planning.canonical(start):
            self._last_batch_ms = _now_ms()
        return planning.canonical({name: max(end[name], start[name]) for name in end})

    def reportLatestOffset(self) -> planning.Offsets | None:  # noqa: N802  # Spark's name
        return self._latest

    def partitions(
        self, start: planning.Offsets, end: planning.Offsets
    ) -> Sequence[InputPartition]:
        if start == end:
            return []
        # Exactly the streams of the offsets, whatever a pattern matches by now.
        views = planning.snapshot(planning.stream_stores(self.opts, tuple(end)))
        ranges = planning.plan(
            views, start, end, self.opts.min_partitions, self.opts.fail_on_data_loss
        )
        return _partitions(self.opts, ranges, self.columns)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)

    def commit(self, end: planning.Offsets) -> None:
        """Nothing to do: Spark's checkpoint is the source of truth for progress."""


def _now_ms() -> int:
    return int(time.monotonic() * 1000)
