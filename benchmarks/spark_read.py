"""Rows per second of the streamq Spark source reading a stream's segments directly.

Declares the stream `events` on an in-process broker (loopback, port 0), writes
`--messages` records (content-type and one header) into its log with the broker's
SegmentLog while the broker is stopped, restarts the broker and measures:
- `decode`: the executor's work alone, in this process (BatchReader.read over every
  partition, Arrow batches built), with no Spark, direct and over HTTP (`url`);
- `spark`: `spark.read.format("streamq")...write.format("noop")` on a local[N] session,
  direct with the default partitions (a million records each), and direct and remote
  with `maxRecordsPerPartition` = messages / N (one partition per core); besides wall-clock
  rows/s it reports rows per CPU-second of the JVM and its Python workers (user + system
  time of the process tree), which is rows/s per core and does not depend on what else
  the machine runs;
- `amqp`: one pika consumer reading `--amqp-messages` of them from `first` (prefetch 1000,
  one multiple ack per 1000), the way an AMQP client reads the same stream.
Prints the hardware, message size and fsync mode with the numbers (STYLE.md section 8).

    PYTHONPATH=. .venv/bin/python benchmarks/spark_read.py --messages 1000000

(PYTHONPATH: the in-process broker is the integration tests' `RunningBroker`.)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pika
from rstream._pyamqp.message import Properties
from rstream.amqp import AMQPMessage

from amqp_gateway.codec.properties import BasicProperties, encode_properties
from spark_source.logdir import stream_directory
from spark_source.options import parse_options
from spark_source.source import BatchReader, StreamqDataSource, spark_schema
from streamq.broker.streams import STREAM_FORMAT
from streamq.log.amqp10 import to_amqp10
from streamq.log.chunk import SimpleEntry
from streamq.log.log import LogConfig, SegmentLog
from tests.integration.conftest import RunningBroker

APPEND_BATCH = 10_000
WRITERS = {
    "amqp": "content-type + 1 header",
    "stream": "AMQP 1.0, one data section",
    "stream-props": "AMQP 1.0 with message id, content type, creation time, 2 app properties",
}
PREFETCH = 1000
CONSUME_TIMEOUT_S = 30


def declare(amqp_port: int) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    connection.channel().queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
    connection.close()


def thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of one thread of this process, from /proc."""
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:13]) / os.sysconf("SC_CLK_TCK")


def bench_amqp(amqp_port: int, messages: int) -> tuple[int, float]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=PREFETCH)
    began = time.perf_counter()
    count = 0
    for method, _properties, _body in channel.consume(
        "events", arguments={"x-stream-offset": "first"}, inactivity_timeout=CONSUME_TIMEOUT_S
    ):
        assert method is not None, f"only {count} messages came"
        count += 1
        if count % PREFETCH == 0 or count == messages:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if count == messages:
            break
    elapsed = time.perf_counter() - began
    connection.close()
    return count, elapsed


def write_log(data_dir: str, messages: int, body_bytes: int, writer: str) -> None:
    """`messages` records as `writer` stores them: "amqp", an AMQP 0-9-1 publisher's
    (content-type and one header); "stream", a stream-protocol producer's native record of
    an AMQP 1.0 message that is one data section (as rstream's `send` of bytes in an
    AMQPMessage without properties, and the Java client's `addData`); "stream-props",
    `write_props_log`'s."""
    payload = b"x" * body_bytes
    if writer == "stream-props":
        write_props_log(data_dir, messages, payload)
        return
    if writer == "amqp":
        properties = encode_properties(
            BasicProperties(content_type="application/json", headers={"source": "bench"})
        )
        entry = SimpleEntry(to_amqp10(b"", b"events", properties, payload))
    else:
        size = len(payload)
        length = bytes([0xA0, size]) if size < 256 else b"\xb0" + size.to_bytes(4, "big")
        entry = SimpleEntry(b"\x00\x53\x75" + length + payload)  # one AMQP 1.0 data section
    write_entries(data_dir, messages, lambda first, count: [entry] * count)


def props_message(n: int, payload: bytes) -> bytes:
    """What an rstream or Java producer sends with properties: a message id (unique), a
    content type, a creation time and 2 application properties, then the data section."""
    message = AMQPMessage(
        body=payload,
        properties=Properties(
            message_id=f"m-{n}", content_type="application/json", creation_time=1_700_000_000_000
        ),
        application_properties={"region": ("eu", "us")[n % 2], "kind": "order"},
    )
    return bytes(message)


def write_props_log(data_dir: str, messages: int, payload: bytes) -> None:
    """The "stream-props" writer: native records of `props_message`, as the stream
    protocol stores what such a producer publishes."""
    write_entries(
        data_dir,
        messages,
        lambda first, count: [
            SimpleEntry(props_message(n, payload)) for n in range(first, first + count)
        ],
    )


def write_entries(
    data_dir: str, messages: int, entries: Callable[[int, int], list[SimpleEntry]]
) -> None:
    """Append `messages` entries to the stream's log (format version 2, as the broker
    writes streams: a 0-9-1 publish as its AMQP 1.0 conversion), `APPEND_BATCH` to a
    chunk; `entries(first, count)` makes each batch."""
    config = LogConfig(format_version=STREAM_FORMAT, direct_io=False, write_behind=True)
    log = SegmentLog.open(stream_directory(data_dir, "/", "events"), config)
    now_ms = int(time.time() * 1000)
    for first in range(0, messages, APPEND_BATCH):
        log.append_entries(entries(first, min(APPEND_BATCH, messages - first)), now_ms)
        log.sync_blocking()
    log.close_blocking()


def bench_decode(
    where: dict[str, str], columns: tuple[str, ...] | None
) -> tuple[int, float, float]:
    """(rows, wall s, CPU s of this process) for every partition read in this process."""
    reader = BatchReader(parse_options({**where, "stream": "events"}), columns)
    began, cpu = time.perf_counter(), time.process_time()
    rows = sum(batch.num_rows for part in reader.partitions() for batch in reader.read(part))
    return rows, time.perf_counter() - began, time.process_time() - cpu


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of `root` and its descendants (children that exited
    count through their parent's cutime/cstime), from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(v) for v in fields[11:15]) / tick
    total, frontier = 0.0, [root]
    while frontier:
        pid = frontier.pop()
        total += times.get(pid, 0.0)
        frontier.extend(child for child, parent in parents.items() if parent == pid)
    return total


def schema_ddl(columns: tuple[str, ...]) -> str:
    """The user schema that picks `columns` of the source's fixed schema."""
    fixed = spark_schema(False)
    return ", ".join(f"{name} {fixed[name].dataType.simpleString()}" for name in columns)


def bench_spark(
    wheres: dict[str, dict[str, str]], cores: int, runs: int, columns: tuple[str, ...] | None
) -> list[tuple[str, int, float, float]]:
    """(label, rows, wall s, CPU s of the JVM and Python workers) per run; `columns`: a
    user schema picking those columns (None: the fixed schema)."""
    from pyspark.sql import SparkSession  # noqa: PLC0415  # the decode bench needs no JVM

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(StreamqDataSource)
    results = []
    for label, where in wheres.items():
        for _ in range(runs):
            reader = spark.read.format("streamq").option("stream", "events")
            for key, value in where.items():
                reader = reader.option(key, value)
            if columns is not None:
                reader = reader.schema(schema_ddl(columns))
            df = reader.option("minPartitions", str(cores)).load()
            cpu = tree_cpu_s(os.getpid())
            began = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            elapsed = time.perf_counter() - began
            cpu = tree_cpu_s(os.getpid()) - cpu
            results.append((label, df.count(), elapsed, cpu))
    spark.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body-bytes", type=int, default=16)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--amqp-messages", type=int, default=200_000)
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument(
        "--writer",
        choices=("amqp", "stream", "stream-props"),
        default="amqp",
        help="who wrote the stream",
    )
    parser.add_argument(
        "--columns",
        help="read only these columns of the fixed schema (comma-separated; a user schema)",
    )
    args = parser.parse_args()
    columns = tuple(args.columns.split(",")) if args.columns else None
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}; "
        f"{args.messages} messages, {args.body_bytes}-byte bodies, "
        f"{WRITERS[args.writer]}; columns {args.columns or 'all'}; "
        "log written with fsync at the end (reads are from the page cache)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = os.path.join(tmp, "data")
        broker = RunningBroker(Path(data_dir))
        declare(broker.amqp_port)
        broker.stop()
        began = time.perf_counter()
        write_log(data_dir, args.messages, args.body_bytes, args.writer)
        print(f"write: {time.perf_counter() - began:.1f} s")
        broker = RunningBroker(Path(data_dir))
        try:
            wheres = {
                "direct": {"path": data_dir},
                "remote": {"url": f"http://127.0.0.1:{broker.http_port}"},
            }
            for label, where in wheres.items():
                rows, elapsed, cpu = bench_decode(where, columns)
                print(
                    f"decode {label} (1 process, no Spark): {rows} rows in {elapsed:.2f} s, "
                    f"{rows / elapsed:,.0f} rows/s, {rows / cpu:,.0f} rows per CPU-second"
                )
            grouped = str(-(-args.messages // args.cores))
            sparks = {
                "direct default": wheres["direct"],
                "direct grouped": {**wheres["direct"], "maxRecordsPerPartition": grouped},
                "remote grouped": {**wheres["remote"], "maxRecordsPerPartition": grouped},
            }
            if not args.no_spark:
                runs = bench_spark(sparks, args.cores, args.runs, columns)
                for label, rows, elapsed, cpu in runs:
                    print(
                        f"spark {label} local[{args.cores}] noop write: {rows} rows in "
                        f"{elapsed:.2f} s, {rows / elapsed:,.0f} rows/s, "
                        f"{rows / elapsed / args.cores:,.0f} rows/s/core (wall), "
                        f"{rows / cpu:,.0f} rows per CPU-second (JVM, workers, this process)"
                    )
            thread = broker._thread.native_id  # the broker's event loop (RunningBroker)
            assert thread is not None
            cpu = thread_cpu_s(thread)
            rows, elapsed = bench_amqp(broker.amqp_port, min(args.amqp_messages, args.messages))
            cpu = thread_cpu_s(thread) - cpu
            print(
                f"amqp consumer (pika): {rows} messages in {elapsed:.2f} s, "
                f"{rows / elapsed:,.0f}/s; broker thread {cpu:.2f} CPU s, "
                f"{rows / max(cpu, 1e-9):,.0f} messages per broker CPU-second"
            )
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
