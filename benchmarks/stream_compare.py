"""Stream protocol: streamq's stream port against RabbitMQ's stream plugin, one run.

Usage: python benchmarks/stream_compare.py STREAMQ_HOST:PORT RABBITMQ_HOST:PORT
           [--quick] [--json FILE] [--credit N] [--batch N] [--window N]
       python benchmarks/stream_compare.py --start [--quick] ...

Per body size (16 B, 1 KiB) one scenario on each broker in turn, A B A B A B: a fresh
stream filled by one publisher under confirms (`--batch` messages per Publish frame, at
most `--window` unconfirmed), then read back from first by one subscriber with credit
(`--credit` chunks, one more granted per chunk); confirmed msgs/s and consumed msgs/s,
medians, the ratio and the issue's target (2x RabbitMQ). It also reports what the client
alone can do: messages per second of the client process's own CPU time, the ceiling it
would reach against an infinitely fast broker. The client is `benchmarks/stream_client.py`.

`--start` starts both brokers itself on free loopback ports, each with a fresh directory
(streamq: `streamq serve --stream-port`; RabbitMQ: tests/differential/peers.py with the
rabbitmq_stream plugin), and stops them afterwards. `benchmarks/compare.py --stream-a
--stream-b` runs the same scenarios beside the AMQP ones (`stream_scenarios`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Final

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compare_report import Metric, Row, error_lines, markdown_table, row_summary
from benchmarks.machine import cpu_model
from benchmarks.perf_process import ScenarioError
from benchmarks.scenarios import Broker, Run, Scenario, Settings
from benchmarks.stream_client import StreamClient, StreamProtocolError, amqp10_data
from tests.differential.peers import RabbitMQServer, free_port
from tests.integration.broker_process import BrokerProcess

STREAM_TARGET: Final = 2.0
"""Issue 23's target: streamq's stream rates at least twice RabbitMQ's."""
COUNTS: Final = {16: 1_000_000, 1024: 300_000}
QUICK_COUNTS: Final = {16: 200_000, 1024: 50_000}
BATCH: Final = 100  # messages per Publish frame: the Java client's default batch size
WINDOW: Final = 10_000  # unconfirmed messages at most
CREDIT: Final = 10  # rstream's and the Java client's initial credit
RUN_TIMEOUT_S: Final = 300.0

PUBLISH: Final = Metric("stream_publish_rate", "publish, confirmed", "msgs/s", True, STREAM_TARGET)
CONSUME: Final = Metric("stream_consume_rate", "consume from first", "msgs/s", True, STREAM_TARGET)
CONSUME_WARM: Final = Metric(
    "stream_consume_warm_rate", "consume from first again (warm)", "msgs/s", True, STREAM_TARGET
)
CLIENT_PUBLISH: Final = Metric(
    "stream_client_publish", "publish, client alone (its CPU)", "msgs/s", True, target=None
)
CLIENT_CONSUME: Final = Metric(
    "stream_client_consume", "consume, client alone (its CPU)", "msgs/s", True, target=None
)


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"HOST:PORT expected, got {text!r}")
    return host, int(port)


async def publish_then_consume(
    address: tuple[str, int], stream: str, body_bytes: int, count: int, shape: argparse.Namespace
) -> dict[str, float]:
    """Fill a fresh `stream` under confirms, read it back from first, delete it."""
    client = await StreamClient.connect(*address)
    try:
        await client.create(stream)
        message = amqp10_data(b"x" * body_bytes)
        cpu, started = time.process_time(), time.perf_counter()
        await client.publish(stream, message, count, shape.batch, shape.window)
        publish_s, publish_cpu_s = time.perf_counter() - started, time.process_time() - cpu
        cpu, started = time.process_time(), time.perf_counter()
        await client.consume(stream, count, shape.credit)
        consume_s, consume_cpu_s = time.perf_counter() - started, time.process_time() - cpu
        started = time.perf_counter()  # the same stream read again: the page cache is warm
        await client.consume(stream, count, shape.credit)
        warm_s = time.perf_counter() - started
        await client.delete(stream)
    finally:
        await client.close()
    return {
        PUBLISH.key: count / publish_s,
        CONSUME.key: count / consume_s,
        CONSUME_WARM.key: count / warm_s,
        CLIENT_PUBLISH.key: count / max(publish_cpu_s, 1e-9),
        CLIENT_CONSUME.key: count / max(consume_cpu_s, 1e-9),
    }


def stream_scenario(
    body_bytes: int, count: int, addresses: dict[str, tuple[str, int]], shape: argparse.Namespace
) -> Scenario:
    def run_on(run: Run) -> dict[str, float]:
        address = addresses.get(run.broker.name)
        if address is None:
            raise ScenarioError(f"no stream port for {run.broker.name} (--stream-...)")
        coroutine = publish_then_consume(address, run.name(), body_bytes, count, shape)
        try:
            return uvloop.run(asyncio.wait_for(coroutine, RUN_TIMEOUT_S))
        except (OSError, StreamProtocolError, TimeoutError) as exc:
            raise ScenarioError(f"stream run: {type(exc).__name__}: {exc}") from None

    size = "16 B" if body_bytes == 16 else f"{body_bytes // 1024} KiB"
    flags = f"{count:,} msgs, batch {shape.batch}, window {shape.window}, credit {shape.credit}"
    return Scenario(
        f"stream-{body_bytes}",
        f"stream protocol, {size}",
        flags,
        (PUBLISH, CONSUME, CONSUME_WARM, CLIENT_PUBLISH, CLIENT_CONSUME),
        run_on,
    )


def stream_scenarios(
    addresses: dict[str, tuple[str, int]], quick: bool, shape: argparse.Namespace | None = None
) -> list[Scenario]:
    """The stream rows, for this script and for compare.py (broker name -> address)."""
    shape = shape or argparse.Namespace(batch=BATCH, window=WINDOW, credit=CREDIT)
    counts = QUICK_COUNTS if quick else COUNTS
    return [stream_scenario(size, count, addresses, shape) for size, count in counts.items()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("streamq", nargs="?", type=parse_address, help="streamq's stream port")
    parser.add_argument("rabbitmq", nargs="?", type=parse_address, help="RabbitMQ's")
    parser.add_argument("--start", action="store_true", help="start both brokers here")
    parser.add_argument("--quick", action="store_true", help="fewer messages, one repetition")
    parser.add_argument("--batch", type=int, default=BATCH, help="messages per Publish frame")
    parser.add_argument("--window", type=int, default=WINDOW, help="unconfirmed messages")
    parser.add_argument("--credit", type=int, default=CREDIT, help="initial credit (chunks)")
    parser.add_argument("--json", type=Path, help="also write every value to this file")
    parser.add_argument(
        "--streamq-flag",
        action="append",
        default=[],
        help="one more `streamq serve` flag with --start (repeat for more)",
    )
    args = parser.parse_args(argv)
    if not args.start and (args.streamq is None or args.rabbitmq is None):
        parser.error("give both addresses, or --start")
    return args


@contextlib.contextmanager
def started_brokers(
    directory: Path, flags: Sequence[str] = ()
) -> Iterator[tuple[tuple[str, int], tuple[str, int]]]:
    """streamq (with more `streamq serve` flags) and RabbitMQ with stream listeners on
    free loopback ports."""
    streamq_port, rabbitmq_port = free_port(), free_port()
    streamq = BrokerProcess(directory / "streamq", "--stream-port", str(streamq_port), *flags)
    # Its log goes on after the `listening` line: drained, so the pipe never fills.
    threading.Thread(target=_drain, args=(streamq.process.stderr,), daemon=True).start()
    try:
        # In rabbitmq.conf: RabbitMQServer writes its own advanced.config (a stream
        # listener put there first was overwritten, and RabbitMQ's runs were refused).
        listener = (
            f"stream.listeners.tcp.1 = 127.0.0.1:{rabbitmq_port}\n"
            f"stream.advertised_host = 127.0.0.1\nstream.advertised_port = {rabbitmq_port}\n"
        )
        rabbitmq = RabbitMQServer(
            directory / "rabbitmq", plugins=("rabbitmq_stream",), extra_config=listener
        )
        try:
            yield ("127.0.0.1", streamq_port), ("127.0.0.1", rabbitmq_port)
        finally:
            rabbitmq.stop()
    finally:
        streamq.stop()


def _drain(stream: IO[bytes] | None) -> None:
    while stream is not None and stream.readline():
        pass


def run_all(scenarios: list[Scenario], names: tuple[str, str], repetitions: int) -> list[Row]:
    # compare.py imports this module for its stream rows: its runner is imported here.
    from benchmarks.compare import Peaks, run_scenario  # noqa: PLC0415

    brokers = tuple(Broker(name, "", None) for name in names)
    settings = Settings(0, repetitions, 0, 0, "")
    rows: list[Row] = []
    for scenario in scenarios:
        rows += run_scenario(scenario, brokers, settings, Peaks())
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = ("streamq", "RabbitMQ")
    with contextlib.ExitStack() as stack:
        if args.start:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            args.streamq, args.rabbitmq = stack.enter_context(
                started_brokers(directory, args.streamq_flag)
            )
        addresses = dict(zip(names, (args.streamq, args.rabbitmq), strict=True))
        scenarios = stream_scenarios(addresses, args.quick, args)
        print(json.dumps({"cpu": cpu_model(), "cores": os.cpu_count(), "load": os.getloadavg()}))
        rows = run_all(scenarios, names, 1 if args.quick else 3)
    print(markdown_table(rows, *names))
    for line in error_lines(rows, *names):
        print(f"- {line}")
    if args.json:
        args.json.write_text(json.dumps([row_summary(row) for row in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
