"""Draining deep backlogs and requeue-heavy consumers, side by side (issue 30, items 2, 4).

Usage: python benchmarks/drain_compare.py [--streamq NAME=TREE ...] [--rabbitmq]
           [--lavinmq BINARY] [--drain KEYS] [--requeue KEYS] [--rounds N]
           [--prefetch P] [--json FILE]

Starts every broker itself on free loopback ports with a fresh directory under /tmp
(streamq once per `--streamq` tree, run from that tree: `before=/work/main` and
`after=.` compare two commits; RabbitMQ through `tests/differential/peers.py`; LavinMQ
from its binary), runs each shape on each broker in turn (A B C A B C, `--rounds`
times), and stops them by pid. Per run it reports the consumer's rate and the broker's
CPU (utime + stime from /proc over the consuming phase, as a share of one core), and
per shape the median of the rounds and each broker's ratio to the last one named.

- Drain keys `COUNT-SIZE-ACKS`: fill a durable queue with COUNT messages (1M, 3M,
  10M...) of SIZE bytes with `streamq perf`, then one consumer with prefetch P takes
  them all: ACKS `each` acks every delivery with its own basic.ack (`--ack-each`),
  `multiple` acks every read with one basic.ack multiple=true (`-a 100`).
- Requeue keys `SHAPE-PERCENT`: fill with `--requeue-count` 16 B messages, then
  `benchmarks/requeue_consumer.py` acks each delivery but nacks (`nack-1`, `nack-10`)
  or rejects (`reject-1`, `reject-10`) 1% or 10% of them with requeue, or (`recover-10`)
  sends basic.recover instead of the acks of every tenth read; the rate is of messages
  acked (each message once).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.admin import delete_all, wait_for_depth
from benchmarks.perf_process import ScenarioError, StreamqServe, default_streamq, run_perf
from benchmarks.requeue_consumer import consume as requeue_consume
from tests.differential.peers import LavinMQServer, RabbitMQServer

FILL_RATE_MIN: Final = 5_000  # msgs/s a fill's timeout allows (RabbitMQ under load: 10-20k)
DRAIN_RATE_MIN: Final = 10_000
MARGIN_S: Final = 60.0
PAUSE_S: Final = 1.0
REQUEUE_COUNT: Final = 300_000
_SCALE: Final = {"k": 1_000, "M": 1_000_000}
_REQUEUE_EVERY: Final = {"1": 100, "10": 10}


@dataclass
class Broker:
    name: str
    url: str
    pid: int
    stop: Callable[[], None]
    results: dict[str, list[dict[str, float]]] = field(default_factory=dict)


def cpu_s(pid: int) -> float:
    """utime + stime of `pid` and its threads, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count_of(text: str) -> int:
    suffix = text[-1]
    return int(float(text[:-1]) * _SCALE[suffix]) if suffix in _SCALE else int(text)


def fill(broker: Broker, queue: str, count: int, size: int) -> None:
    timeout_s = count / FILL_RATE_MIN + MARGIN_S
    args = ["throughput", "--uri", broker.url, "-u", queue, "-q"]
    # With confirms: a publisher that closes while a loaded broker has not read all it
    # sent loses the rest (RabbitMQ's fills fell short that way).
    args += ["-x", "1", "-y", "0", "-s", str(size), "-C", str(count), "-c", "1000"]
    run_perf(default_streamq(), args, timeout_s)
    wait_for_depth(broker.url, queue, count, timeout_s)


def measured(broker: Broker, run: Callable[[], float], count: int) -> dict[str, float]:
    """Time `run` (returns its seconds) with the broker's CPU over it."""
    before = cpu_s(broker.pid)
    elapsed_s = run()
    cpu = cpu_s(broker.pid) - before
    return {"rate": count / elapsed_s, "cpu_share": cpu / elapsed_s, "load": os.getloadavg()[0]}


def drain(broker: Broker, key: str, prefetch: int) -> dict[str, float]:
    count_text, size, acks = key.split("-")
    count = count_of(count_text)
    queue = f"drain-{key}"
    flags = ["--ack-each"] if acks == "each" else ["-a", "100"]
    try:
        delete_all(broker.url, [queue])
        fill(broker, queue, count, int(size))
        time.sleep(PAUSE_S)

        def run() -> float:
            args = ["throughput", "--uri", broker.url, "-u", queue, "-q", "-x", "0", "-y", "1"]
            args += ["-D", str(count), "-P", str(prefetch), *flags]
            summary = run_perf(default_streamq(), args, count / DRAIN_RATE_MIN + MARGIN_S)
            rate = summary.get("avg_consume_rate")
            if not isinstance(rate, int | float) or rate <= 0:
                raise ScenarioError(f"no consume rate in {summary}")
            return count / float(rate)

        return measured(broker, run, count)
    finally:
        delete_all(broker.url, [queue])


def requeue(broker: Broker, key: str, prefetch: int, count: int) -> dict[str, float]:
    shape, percent = key.split("-")
    queue = f"requeue-{key}"
    try:
        delete_all(broker.url, [queue])
        fill(broker, queue, count, 16)
        time.sleep(PAUSE_S)
        every = _REQUEUE_EVERY[percent]
        return measured(
            broker,
            lambda: requeue_consume(broker.url, queue, count, prefetch, shape, every),
            count,
        )
    finally:
        delete_all(broker.url, [queue])


def start_brokers(args: argparse.Namespace, base: Path) -> list[Broker]:
    brokers: list[Broker] = []
    for spec in args.streamq:
        name, _, tree = spec.partition("=")
        env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
        server = StreamqServe([sys.executable, "-m", "streamq"], base / name, env=env)
        url = f"amqp://guest:guest@127.0.0.1:{server.amqp_port}/%2f"
        brokers.append(Broker(name, url, server.process.pid, server.stop))
    if args.lavinmq:
        lavin = LavinMQServer(Path(args.lavinmq), base / "lavinmq")
        url = f"amqp://guest:guest@127.0.0.1:{lavin.amqp_port}/%2f"
        brokers.append(Broker("LavinMQ", url, lavin.process.pid, lavin.stop))
    if args.rabbitmq:
        rabbit = RabbitMQServer(base / "rabbitmq")
        beam = rabbit._beam_pid()  # the VM's pid, for its CPU
        url = f"amqp://guest:guest@127.0.0.1:{rabbit.amqp_port}/%2f"
        brokers.append(Broker("RabbitMQ", url, beam or rabbit.process.pid, rabbit.stop))
    return brokers


def report(brokers: list[Broker], keys: list[str]) -> list[str]:
    """A markdown table: per shape each broker's median rate, CPU share and CPU per
    message (the steadier figure on a shared machine), and its ratio to the last
    broker."""
    names = [b.name for b in brokers]
    head = "| shape | " + " | ".join(f"{n} msgs/s (CPU, µs/msg; runs)" for n in names)
    head += " | " + " | ".join(f"{n}/{names[-1]}" for n in names[:-1]) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(names) - 1)]
    for key in keys:
        medians: list[float | None] = []
        cells = []
        for broker in brokers:
            runs = broker.results.get(key, [])
            if not runs:
                medians.append(None)
                cells.append("n/a")
                continue
            rate = statistics.median(r["rate"] for r in runs)
            cpu = statistics.median(r["cpu_share"] for r in runs)
            us = statistics.median(r["cpu_share"] / r["rate"] * 1e6 for r in runs)
            each = ", ".join(f"{r['rate'] / 1000:.0f}k" for r in runs)
            medians.append(rate)
            cells.append(f"{rate / 1000:.0f}k ({cpu:.0%}, {us:.2f}; {each})")
        last = medians[-1]
        ratios = [f"{m / last:.2f}" if m is not None and last else "n/a" for m in medians[:-1]]
        lines.append(f"| {key} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return lines


FAILURES: Final = (ScenarioError, RuntimeError, OSError, subprocess.SubprocessError)


def run_all(
    args: argparse.Namespace, brokers: list[Broker], drains: list[str], requeues: list[str]
) -> None:
    """Every shape on every broker in turn, `args.rounds` times."""
    for key in drains + requeues:
        for _ in range(args.rounds):
            for broker in brokers:
                try:
                    if key in drains:
                        result = drain(broker, key, args.prefetch)
                    else:
                        result = requeue(broker, key, args.prefetch, args.requeue_count)
                except FAILURES as exc:
                    print(f"{key} {broker.name}: failed: {exc}", flush=True)
                    continue
                broker.results.setdefault(key, []).append(result)
                us = result["cpu_share"] / result["rate"] * 1e6
                print(
                    f"{key} {broker.name}: {result['rate']:,.0f} msgs/s, broker CPU "
                    f"{result['cpu_share']:.0%} ({us:.2f} µs/msg), load {result['load']:.1f}",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streamq", action="append", default=[], help="NAME=TREE")
    parser.add_argument("--lavinmq", help="the LavinMQ binary")
    parser.add_argument("--rabbitmq", action="store_true", help="Debian's rabbitmq-server")
    parser.add_argument("--drain", default="", help="e.g. 1M-16-each,3M-16-multiple")
    parser.add_argument("--requeue", default="", help="e.g. nack-1,reject-10,recover-10")
    parser.add_argument("--requeue-count", type=int, default=REQUEUE_COUNT)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    drains = [k for k in args.drain.split(",") if k]
    requeues = [k for k in args.requeue.split(",") if k]
    with tempfile.TemporaryDirectory(prefix="drain-compare-") as base:
        brokers = start_brokers(args, Path(base))
        try:
            print(f"started: {', '.join(f'{b.name} pid {b.pid}' for b in brokers)}", flush=True)
            run_all(args, brokers, drains, requeues)
        finally:
            for broker in brokers:
                broker.stop()
    print("\n".join(report(brokers, drains + requeues)))
    if args.json:
        args.json.write_text(json.dumps({b.name: b.results for b in brokers}, indent=1))


if __name__ == "__main__":
    main()
