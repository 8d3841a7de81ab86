"""Option validation: every unknown, malformed or contradictory option fails with a
message naming it, before any file is read."""

from __future__ import annotations

import pytest
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from spark_source.options import EARLIEST, LATEST, OptionError, parse_options
from spark_source.source import StreamqDataSource, spark_schema

BASE = {"path": "/data", "stream": "events"}


def test_defaults() -> None:
    opts = parse_options(BASE)
    assert opts.vhost == "/"
    assert opts.streams == ("events",)
    assert (opts.starting, opts.ending) == ("earliest", "latest")
    assert opts.fail_on_data_loss is True
    assert opts.include_headers is False
    assert opts.min_partitions == 1
    assert opts.max_trigger_delay_ms == 15 * 60_000


def test_keys_are_case_insensitive_and_json_is_canonical() -> None:
    opts = parse_options(
        {**BASE, "STARTINGOFFSETS": '{"b": -1, "a": 5, "c": -2}', "maxTriggerDelay": "30s"}
    )
    assert opts.starting == {"a": 5, "b": LATEST, "c": EARLIEST}
    assert list(opts.starting) == ["a", "b", "c"]  # type: ignore[arg-type]  # a dict here
    assert opts.max_trigger_delay_ms == 30_000


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": "e"}, "exactly one of 'path'"),
        ({**BASE, "topic": "x"}, "unknown option\\(s\\) \\['topic'\\]"),
        ({**BASE, "streams": "a,b"}, "exactly one of 'stream', 'streams'"),
        ({"path": "/d"}, "exactly one of"),
        ({"path": "/d", "streams": "a,a"}, "distinct, non-empty"),
        ({"path": "/d", "streamPattern": "("}, "not a valid regular expression"),
        ({**BASE, "startingOffsets": "first"}, "startingOffsets must be 'earliest'"),
        ({**BASE, "startingOffsets": '{"events": -3}'}, "integer >= 0"),
        ({**BASE, "startingOffsets": '{"events": "1"}'}, "integer >= 0"),
        ({**BASE, "startingOffsets": "[]"}, "non-empty object"),
        ({**BASE, "endingOffsets": "earliest"}, "would read nothing"),
        ({**BASE, "startingOffsets": "earliest", "startingTimestamp": "5"}, "contradict"),
        ({**BASE, "endingOffsets": "latest", "endingTimestamp": "5"}, "contradict"),
        ({**BASE, "startingTimestamp": "yesterday"}, "milliseconds since the epoch"),
        ({**BASE, "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be a positive"),
        ({**BASE, "minPartitions": "lots"}, "minPartitions must be a positive"),
        ({**BASE, "minPartitions": "100000"}, "at most 10000"),
        (
            {**BASE, "maxOffsetsPerTrigger": "5", "minOffsetsPerTrigger": "6"},
            "must not exceed",
        ),
        ({**BASE, "maxTriggerDelay": "soon"}, "maxTriggerDelay must look like"),
        ({**BASE, "failOnDataLoss": "yes"}, "failOnDataLoss must be 'true' or 'false'"),
        ({**BASE, "url": "http://h:15672"}, "exactly one of .path. .* and .url."),
        ({"url": "http://h:1", "streamPattern": "a"}, "streamPattern needs .path."),
        ({**BASE, "username": "u"}, "remote reads"),
    ],
)
def test_bad_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options(options)


def test_schema_validates_options_at_load() -> None:
    with pytest.raises(OptionError, match="unknown option"):
        StreamqDataSource({**BASE, "bogus": "1"}).schema()
    assert StreamqDataSource({**BASE, "includeHeaders": "true"}).schema() == spark_schema(True)


def test_streaming_ending_is_refused() -> None:
    with pytest.raises(OptionError, match="batch reads only"):
        StreamqDataSource({**BASE, "endingOffsets": "latest"}).streamReader(spark_schema(False))


def test_a_user_schema_picks_columns_in_its_order() -> None:
    source = StreamqDataSource(BASE)
    assert source.reader(spark_schema(False)).columns is None
    full = spark_schema(True)
    picked = StructType([full["body"], full["offset"]])
    assert source.reader(picked).columns == ("body", "offset")
    assert source.streamReader(picked).columns == ("body", "offset")
    with_headers = StreamqDataSource({**BASE, "includeHeaders": "true"})
    assert with_headers.reader(StructType([full["headers"]])).columns == ("headers",)
    assert with_headers.reader(full).columns is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([], "names no column"),
        ([StructField("value", BinaryType())], "no column 'value'"),
        ([StructField("offset", IntegerType())], "column 'offset' is bigint .nullable., not int"),
        ([StructField("offset", LongType(), nullable=False)], "not bigint NOT NULL"),
        ([StructField("offset", LongType())] * 2, "names a column twice"),
        ([spark_schema(True)["headers"]], "headers column is read with includeHeaders=true"),
    ],
)
def test_other_user_schemas_are_refused(fields: list[StructField], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        StreamqDataSource(BASE).reader(StructType(fields))
    with pytest.raises(OptionError, match=message):
        StreamqDataSource(BASE).streamReader(StructType(fields))
