"""The streamq source in a real local SparkSession: a stream is published through the
broker with pika (confirms make it durable), then read in batch and in micro-batches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration.conftest import RunningBroker

pytestmark = pytest.mark.spark

TIMEOUT_S = 120
SMALL_SEGMENTS = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    running = RunningBroker(tmp_path / "data")
    yield running
    running.stop()


def publish(broker: RunningBroker, stream: str, start: int, count: int) -> None:
    """`count` messages with confirms, body b"msg-<n>" and header n = <n>."""
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )
    try:
        channel = connection.channel()
        channel.queue_declare(stream, durable=True, arguments=SMALL_SEGMENTS)
        channel.confirm_delivery()
        for n in range(start, start + count):
            properties = pika.BasicProperties(
                content_type="text/plain", headers={"n": n, "kind": "test"}
            )
            channel.basic_publish("", stream, f"msg-{n}".encode(), properties)
    finally:
        connection.close()


def test_batch_read_of_a_published_stream(spark: Any, broker: RunningBroker) -> None:
    publish(broker, "events", 0, 300)
    df = (
        spark.read.format("streamq")
        .option("path", str(broker.data_dir))
        .option("stream", "events")
        .option("includeHeaders", "true")
        .option("maxRecordsPerPartition", "100")
        .load()
    )
    assert df.rdd.getNumPartitions() == 3  # 300 records in 4 KiB segments, 100 per task
    rows = sorted(df.collect(), key=lambda row: row.offset)
    assert [row.offset for row in rows] == list(range(300))
    assert [bytes(row.body) for row in rows] == [f"msg-{n}".encode() for n in range(300)]
    assert rows[5].routing_key == "events"
    assert rows[5].exchange == ""
    assert rows[5].properties.content_type == "text/plain"
    headers = {h.key: bytes(h.value) for h in rows[5].headers}
    assert headers == {"n": b"5", "kind": b"test"}
    ranged = (
        spark.read.format("streamq")
        .option("path", str(broker.data_dir))
        .option("stream", "events")
        .option("startingOffsets", '{"events": 100}')
        .option("endingOffsets", '{"events": 150}')
        .load()
    )
    assert ranged.selectExpr("min(offset)", "max(offset)", "count(*)").first() == (100, 149, 50)


def test_a_user_schema_reads_the_columns_it_picks(spark: Any, broker: RunningBroker) -> None:
    publish(broker, "events", 0, 120)

    def reader() -> Any:
        return (
            spark.read.format("streamq")
            .option("path", str(broker.data_dir))
            .option("stream", "events")
            .option("includeHeaders", "true")
        )

    picked = reader().schema("headers array<struct<key:string,value:binary>>, offset long").load()
    assert picked.columns == ["headers", "offset"]
    rows = sorted(picked.collect(), key=lambda row: row.offset)
    assert [row.offset for row in rows] == list(range(120))
    assert {h.key: bytes(h.value) for h in rows[7].headers} == {"n": b"7", "kind": b"test"}
    bodies = reader().schema("body binary").load().collect()
    assert sorted(bytes(row.body) for row in bodies) == sorted(
        f"msg-{n}".encode() for n in range(120)
    )
    with pytest.raises(Exception, match="no column 'value'"):
        reader().schema("value binary").load().collect()
    with pytest.raises(Exception, match="column 'offset' is bigint"):
        reader().schema("offset int").load().collect()


def test_bad_options_fail_at_load(spark: Any, tmp_path: Path) -> None:
    def reader() -> Any:  # a DataFrameReader keeps its options: one per attempt
        return spark.read.format("streamq").option("path", str(tmp_path)).option("stream", "x")

    with pytest.raises(Exception, match="unknown option\\(s\\) \\['subscribe'\\]"):
        reader().option("subscribe", "x").load()
    with pytest.raises(Exception, match="contradict each other"):
        reader().option("startingOffsets", "earliest").option("startingTimestamp", "1").load()


def test_available_now_rate_limit_and_checkpoint_restart(
    spark: Any, broker: RunningBroker, tmp_path: Path
) -> None:
    # Goal: every record exactly once across a restart from the checkpoint, with the
    # rate limit honoured under AvailableNow. Method: two availableNow runs on the same
    # checkpoint with records published in between; foreachBatch records each batch.
    publish(broker, "events", 0, 250)
    checkpoint = str(tmp_path / "checkpoint")
    batches: list[tuple[int, list[int]]] = []

    def collect(df: Any, batch_id: int) -> None:
        batches.append((batch_id, sorted(row.offset for row in df.select("offset").collect())))

    def run() -> None:
        query = (
            spark.readStream.format("streamq")
            .option("path", str(broker.data_dir))
            .option("stream", "events")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "100")
            .load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(TIMEOUT_S), "availableNow query did not finish"
        assert query.exception() is None

    run()
    assert [len(offsets) for _, offsets in batches] == [100, 100, 50]
    publish(broker, "events", 250, 60)
    run()
    non_empty = [(batch_id, offsets) for batch_id, offsets in batches if offsets]
    seen = [offset for _, offsets in non_empty for offset in offsets]
    assert seen == list(range(310))
    assert [batch_id for batch_id, _ in non_empty] == [0, 1, 2, 3]


def test_stream_pattern_reads_matching_streams(spark: Any, broker: RunningBroker) -> None:
    publish(broker, "orders.eu", 0, 20)
    publish(broker, "orders.us", 0, 30)
    publish(broker, "audit", 0, 5)
    df = (
        spark.read.format("streamq")
        .option("path", str(broker.data_dir))
        .option("streamPattern", r"orders\..*")
        .load()
    )
    counts = {row.stream: row["count"] for row in df.groupBy("stream").count().collect()}
    assert counts == {"orders.eu": 20, "orders.us": 30}


def retained_stream(broker: RunningBroker, count: int) -> None:
    """A stream that keeps about its last 100 messages (whole 4 KiB segments go)."""
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )
    try:
        channel = connection.channel()
        channel.queue_declare(
            "events", durable=True, arguments={**SMALL_SEGMENTS, "x-max-length": 100}
        )
        channel.confirm_delivery()
        for n in range(count):
            channel.basic_publish("", "events", f"msg-{n}".encode() + b"." * 100)
    finally:
        connection.close()


def test_retention_between_runs_honours_fail_on_data_loss(
    spark: Any, broker: RunningBroker, tmp_path: Path
) -> None:
    # Goal: offsets a checkpoint still needs, deleted by retention, fail the query when
    # failOnDataLoss is true and are skipped when false. Method: read 50 records with a
    # checkpoint, publish 500 more (retention drops the early segments), and resume.
    retained_stream(broker, 50)
    got: list[int] = []

    def run(checkpoint: Path, fail: bool) -> Any:
        return (
            spark.readStream.format("streamq")
            .option("path", str(broker.data_dir))
            .option("stream", "events")
            .option("failOnDataLoss", str(fail).lower())
            .load()
            .writeStream.foreachBatch(
                lambda df, _: got.extend(row.offset for row in df.select("offset").collect())
            )
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    for checkpoint in (tmp_path / "strict", tmp_path / "lenient"):
        query = run(checkpoint, fail=True)
        assert query.awaitTermination(TIMEOUT_S)
    assert sorted(got) == sorted(list(range(50)) * 2)
    retained_stream(broker, 500)
    got.clear()
    strict = run(tmp_path / "strict", fail=True)
    with pytest.raises(Exception, match=r"offsets 50\.\..* are gone"):
        strict.awaitTermination(TIMEOUT_S)
    lenient = run(tmp_path / "lenient", fail=False)
    assert lenient.awaitTermination(TIMEOUT_S)
    assert got, "the lenient query read nothing"
    assert min(got) > 50
    assert sorted(got) == list(range(min(got), 550))


def test_remote_read_over_http_equals_direct_read(spark: Any, broker: RunningBroker) -> None:
    publish(broker, "events", 0, 200)

    def read(**where: str) -> list[tuple[int, bytes]]:
        reader = spark.read.format("streamq").option("stream", "events")
        for key, value in where.items():
            reader = reader.option(key, value)
        rows = reader.load().select("offset", "body").collect()
        return sorted((row.offset, bytes(row.body)) for row in rows)

    remote = read(url=f"http://127.0.0.1:{broker.http_port}", startingOffsets='{"events": 20}')
    direct = read(path=str(broker.data_dir), startingOffsets='{"events": 20}')
    assert remote == direct
    assert [offset for offset, _ in remote] == list(range(20, 200))
    with pytest.raises(Exception, match="HTTP 401"):
        read(url=f"http://127.0.0.1:{broker.http_port}", password="wrong")


def test_stream_files_endpoint(broker: RunningBroker) -> None:
    # The endpoint alone (no Spark): listing, ranges, and 404 for what is not a stream's
    # log file, so that retention's deletions read as data loss on the client.
    from spark_source.logdir import SegmentGone, read_range, view_log  # noqa: PLC0415
    from spark_source.store import HttpStore  # noqa: PLC0415

    publish(broker, "events", 0, 100)
    url = f"http://127.0.0.1:{broker.http_port}"
    store = HttpStore(url, "/", "events", "guest", "guest")
    view = view_log(store)
    assert (view.earliest, view.latest) == (0, 100)
    assert len(view.bases) > 1
    second = view.bases[1]
    second_end = view.bases[2] if len(view.bases) > 2 else view.latest
    got = [
        r.offset for records in read_range(store, second, second, second_end, 7) for r in records
    ]
    assert got == list(range(second, second_end))
    assert store.get("durable", 0, 4) == store.read_file("durable")[:4]
    with pytest.raises(FileNotFoundError):
        store.get("../definitions", 0, 10)
    with pytest.raises(SegmentGone):
        list(read_range(store, 12345, 12345, 12346, 10))
    with pytest.raises(FileNotFoundError, match="no stream"):
        HttpStore(url, "/", "nope", "guest", "guest").list_files()


def test_memory_sink_while_the_broker_writes(spark: Any, broker: RunningBroker) -> None:
    # Goal: no gap and no duplicate while publishers append and segments roll under the
    # query. Method: a publisher thread writes while a processingTime query feeds a memory
    # sink; once it is done, processAllAvailable() and compare offsets and bodies.
    import threading  # noqa: PLC0415

    publish(broker, "live", 0, 10)
    query = (
        spark.readStream.format("streamq")
        .option("path", str(broker.data_dir))
        .option("stream", "live")
        .option("maxOffsetsPerTrigger", "150")
        .load()
        .select("offset", "body")
        .writeStream.format("memory")
        .queryName("live_rows")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        writer = threading.Thread(target=publish, args=(broker, "live", 10, 600))
        writer.start()
        writer.join(TIMEOUT_S)
        assert not writer.is_alive(), "the publisher did not finish"
        query.processAllAvailable()
        rows = spark.sql("SELECT offset, body FROM live_rows").collect()
    finally:
        query.stop()
    assert sorted(row.offset for row in rows) == list(range(610))
    assert all(bytes(row.body) == f"msg-{row.offset}".encode() for row in rows)
