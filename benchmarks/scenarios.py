"""The fixed matrix of `benchmarks/compare.py`: what each scenario runs and measures.

Owns the scenarios of the perf issue (publish only at three body sizes, persistent with
confirms, one publisher and one consumer for rate and for latency at a fixed rate,
consume only from a full queue, a stream, a fanout to ten queues, and the memory costs
of idle connections, queues and queued messages), issue 19's rows whose consumers ack
each message with its own basic.ack (`--ack-each`, as pika, kombu and Celery workers
do), the broker's RSS with the queued messages and, last, idle after every run, and one
run of any of them against one broker, and issue 20's runs over TLS (each broker's
`tls_url`, an amqps:// URI). Each run uses queue and exchange names of its own
and deletes them afterwards. A run raises `ScenarioError` when the broker fails it (a
scenario a broker cannot do, such as a stream on LavinMQ, is then n/a); it never aborts
the comparison and never starts or stops a broker.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from benchmarks.admin import declare_fanout, delete_all, require_streams, wait_for_depth
from benchmarks.compare_report import NO_WORSE, Metric
from benchmarks.perf_process import ScenarioError, run_perf
from benchmarks.rss import read_status_kib, wait_for_steady_rss

THROUGHPUT_MARGIN_S: Final = 60.0
"""Added to a timed run's duration for its timeout: connect, declare, drain, close."""
FILL_RATE_MIN: Final = 10_000
"""Slowest fill (msgs/s) a fill's timeout allows before the scenario counts as failed."""
FOOTPRINT_TIMEOUT_S: Final = 600.0
CONNECTIONS: Final = 1000
QUEUES: Final = 10_000
FANOUT_QUEUES: Final = 10
CONNECTION_HOLD_S: Final = 1.0
SETTLE_S: Final = 2.0
"""Wait before reading RSS after a fill, so the broker's buffers have drained."""
_KIB: Final = 1024
_STREAM_ARGS: Final = (
    """--queue-args '{"x-queue-type":"stream"}' --consumer-args '{"x-stream-offset":"first"}'"""
)

PUBLISH: Final = Metric("publish_rate", "publish", "msgs/s", higher_is_better=True)
CONFIRM: Final = Metric("confirm_rate", "confirmed", "msgs/s", higher_is_better=True)
CONSUME: Final = Metric("consume_rate", "consume", "msgs/s", higher_is_better=True)
# Issue 4's targets: rates 1.5x, latency p99 and memory no worse; p50 has none.
LATENCY_P50: Final = Metric("latency_p50_ms", "latency p50", "ms", False, target=None)
LATENCY_P99: Final = Metric("latency_p99_ms", "latency p99", "ms", False, target=NO_WORSE)
PER_CONNECTION: Final = Metric(
    "kib_per_connection", "RSS each", "KiB", False, target=NO_WORSE, largest=True
)
PER_QUEUE: Final = Metric("kib_per_queue", "RSS each", "KiB", False, target=NO_WORSE, largest=True)
PER_MESSAGE: Final = Metric(
    "bytes_per_message", "RSS each", "B", False, target=NO_WORSE, largest=True
)
# Absolute resident memory (issue 19): reported and compared, without a target.
RSS_QUEUED: Final = Metric("rss_queued_mib", "broker RSS", "MiB", False, target=None, largest=True)
RSS_IDLE: Final = Metric("rss_idle_mib", "broker RSS", "MiB", False, target=None, largest=True)
ACK_EACH: Final = "--ack-each -P 1000"
"""Consumers that ack each message with its own basic.ack, prefetch 1000."""


@dataclass(frozen=True, slots=True)
class Broker:
    name: str
    url: str
    pid: int | None
    tls_url: str | None = None  # amqps://...?cacertfile=...: the TLS scenarios' URL


@dataclass(frozen=True, slots=True)
class Settings:
    duration_s: int
    repetitions: int
    consume_count: int
    queued_count: int
    streamq: str


@dataclass(frozen=True, slots=True)
class Run:
    """One scenario on one broker in one repetition; `tag` makes its names unique."""

    broker: Broker
    settings: Settings
    tag: str

    def name(self, suffix: str = "") -> str:
        return f"cmp-{self.tag}{suffix}"


Runner = Callable[[Run], dict[str, float]]


@dataclass(frozen=True, slots=True)
class Scenario:
    """`flags` is what the tables show; `runs_first` marks the memory scenarios, which
    run before the others while the brokers' heaps are still small, `runs_last` the idle
    memory reading after all the others."""

    key: str
    title: str
    flags: str
    metrics: tuple[Metric, ...]
    run: Runner
    runs_first: bool = False
    runs_last: bool = False

    def order(self) -> int:
        """0 for the memory scenarios, 2 for the idle reading, 1 for the rest."""
        return 0 if self.runs_first else 2 if self.runs_last else 1


def summary_metrics(summary: dict[str, object]) -> dict[str, float]:
    """The metrics in a `streamq perf throughput -j` summary: rates, and latency if any."""
    elapsed_s = max(_number(summary, "elapsed_s"), 1e-9)
    metrics = {
        "publish_rate": _number(summary, "avg_pub_rate"),
        "consume_rate": _number(summary, "avg_consume_rate"),
    }
    if summary.get("confirmed") is not None:
        metrics["confirm_rate"] = _number(summary, "confirmed") / elapsed_s
    latency = summary.get("latency_ms")
    if isinstance(latency, dict):
        metrics["latency_p50_ms"] = _number(latency, "p50")
        metrics["latency_p99_ms"] = _number(latency, "p99")
    return metrics


def _number(table: dict[str, object], key: str) -> float:
    value = table.get(key)
    if not isinstance(value, int | float):
        raise ScenarioError(f"the perf summary has no number {key!r}")
    return float(value)


def throughput(
    run: Run, queue: str, flags: list[str], timeout_s: float, url: str | None = None
) -> dict[str, float]:
    """`streamq perf throughput` on `queue`, over `url` (default: the broker's URL)."""
    args = ["throughput", "--uri", url or run.broker.url, "-u", queue, "-q", *flags]
    return summary_metrics(run_perf(run.settings.streamq, args, timeout_s))


def clean_up(run: Run, queues: list[str], exchanges: tuple[str, ...] = ()) -> None:
    for failure in delete_all(run.broker.url, queues, exchanges):
        print(f"warning: {run.broker.name}: {failure}", file=sys.stderr)


def timed(flags: str) -> Runner:
    """A `-z duration` throughput run with `flags` on a queue of its own."""

    def run_timed(run: Run) -> dict[str, float]:
        queue = run.name()
        duration_s = run.settings.duration_s
        args = [*shlex.split(flags), "-z", str(duration_s)]
        try:
            return throughput(run, queue, args, duration_s + THROUGHPUT_MARGIN_S)
        finally:
            clean_up(run, [queue])

    return run_timed


def tls_timed(flags: str) -> Runner:
    """`timed` over the broker's TLS URL (n/a without one); set-up and clean-up stay on
    its plain URL."""

    def run_tls(run: Run) -> dict[str, float]:
        if run.broker.tls_url is None:
            raise ScenarioError(f"no TLS URL for {run.broker.name} (--tls-url-...)")
        queue = run.name()
        duration_s = run.settings.duration_s
        args = [*shlex.split(flags), "-z", str(duration_s)]
        try:
            return throughput(
                run, queue, args, duration_s + THROUGHPUT_MARGIN_S, run.broker.tls_url
            )
        finally:
            clean_up(run, [queue])

    return run_tls


def stream_timed(flags: str) -> Runner:
    """`timed` on a stream queue, n/a on a broker without stream queues."""
    run_timed = timed(f"{flags} {_STREAM_ARGS}")

    def run_stream(run: Run) -> dict[str, float]:
        require_streams(run.broker.url, run.name("-probe"))
        return run_timed(run)

    return run_stream


def fill(run: Run, queue: str, count: int) -> None:
    """Publish `count` 16-byte messages to `queue` and wait until it holds them all."""
    timeout_s = count / FILL_RATE_MIN + THROUGHPUT_MARGIN_S
    throughput(run, queue, ["-x", "1", "-y", "0", "-s", "16", "-C", str(count)], timeout_s)
    wait_for_depth(run.broker.url, queue, count, timeout_s)


def consume_queued(run: Run) -> dict[str, float]:
    """Fill a queue, then time one no-ack consumer taking every message."""
    return consume_queued_with("")(run)


def consume_queued_with(flags: str) -> Runner:
    """Fill a queue, then time one consumer with `flags` (none: no-ack) taking every
    message."""

    def run_consume(run: Run) -> dict[str, float]:
        queue, count = run.name(), run.settings.consume_count
        timeout_s = count / FILL_RATE_MIN + THROUGHPUT_MARGIN_S
        args = ["-x", "0", "-y", "1", "-D", str(count), *shlex.split(flags)]
        try:
            fill(run, queue, count)
            return throughput(run, queue, args, timeout_s)
        finally:
            clean_up(run, [queue])

    return run_consume


def fanout(run: Run) -> dict[str, float]:
    """Publish to a fanout exchange with `FANOUT_QUEUES` queues bound. perf declares and
    binds the first queue itself; the others are declared here."""
    exchange = run.name("-fanout")
    queues = [run.name(f"-{index}") for index in range(FANOUT_QUEUES)]
    duration_s = run.settings.duration_s
    args = ["-x", "1", "-y", "0", "-s", "16", "-e", exchange, "-z", str(duration_s)]
    try:
        declare_fanout(run.broker.url, exchange, queues[1:])
        return throughput(run, queues[0], args, duration_s + THROUGHPUT_MARGIN_S)
    finally:
        clean_up(run, queues, (exchange,))


def _steady_pid(run: Run) -> int:
    """The broker's pid, once its RSS has stopped moving. Raises `ScenarioError` without
    a pid."""
    if run.broker.pid is None:
        raise ScenarioError("memory scenarios need the broker's pid (--pid-a, --pid-b)")
    if not wait_for_steady_rss(run.broker.pid):
        print(f"warning: {run.broker.name}: RSS still moving", file=sys.stderr)
    return run.broker.pid


def connections(run: Run) -> dict[str, float]:
    """`streamq perf connections`: the broker's RSS growth per idle connection."""
    args = [
        "connections",
        str(CONNECTIONS),
        "--uri",
        run.broker.url,
        "--pid",
        str(_steady_pid(run)),
    ]
    args += ["--hold", str(CONNECTION_HOLD_S)]
    result = run_perf(run.settings.streamq, args, FOOTPRINT_TIMEOUT_S)
    return {"kib_per_connection": _number(result, "kib_each")}


def queues(run: Run) -> dict[str, float]:
    """`streamq perf queues`: the broker's RSS growth per queue (perf deletes them)."""
    args = ["queues", str(QUEUES), "--uri", run.broker.url, "--pid", str(_steady_pid(run))]
    args += ["--prefix", run.name("-")]
    result = run_perf(run.settings.streamq, args, FOOTPRINT_TIMEOUT_S)
    return {"kib_per_queue": _number(result, "kib_each")}


def queued_memory(run: Run) -> dict[str, float]:
    """The broker's RSS growth per message while `queued_count` 16-byte messages wait."""
    pid, queue, count = _steady_pid(run), run.name(), run.settings.queued_count
    try:
        rss_before_kib = read_status_kib(pid, "VmRSS")
        fill(run, queue, count)
        time.sleep(SETTLE_S)
        rss_after_kib = read_status_kib(pid, "VmRSS")
    finally:
        clean_up(run, [queue])
    if rss_before_kib is None or rss_after_kib is None:
        raise ScenarioError(f"cannot read the memory of pid {pid}")
    return {
        "bytes_per_message": (rss_after_kib - rss_before_kib) * _KIB / count,
        "rss_queued_mib": rss_after_kib / _KIB,
    }


def idle_memory(run: Run) -> dict[str, float]:
    """The broker's RSS once steady after every other run, its queues deleted."""
    pid = _steady_pid(run)
    rss_kib = read_status_kib(pid, "VmRSS")
    if rss_kib is None:
        raise ScenarioError(f"cannot read the memory of pid {pid}")
    return {"rss_idle_mib": rss_kib / _KIB}


def matrix(settings: Settings) -> list[Scenario]:
    """The scenarios of the perf issue, in its order."""
    consume_count, queued_count = settings.consume_count, settings.queued_count
    stream_flags = "-x 1 -y 1 -c 1000 -a 100 -P 1000 -s 16"
    stream_each_flags = f"-x 1 -y 1 -c 1000 {ACK_EACH} -s 16"
    return [
        _timed("publish-16", "publish only, 16 B", "-x 1 -y 0 -s 16", (PUBLISH,)),
        _timed("publish-1024", "publish only, 1 KiB", "-x 1 -y 0 -s 1024", (PUBLISH,)),
        _timed("publish-65536", "publish only, 64 KiB", "-x 1 -y 0 -s 65536", (PUBLISH,)),
        _timed("confirms", "persistent, confirms", "-x 1 -y 0 -p -c 1000 -s 16", (CONFIRM,)),
        _timed("ack", "1 pub + 1 cons, manual ack", "-x 1 -y 1 -a 100 -P 1000 -s 16",
               (PUBLISH, CONSUME)),
        _timed("latency", "latency at 10k msgs/s", "-x 1 -y 1 -a 100 -P 1000 -s 16 -r 10000 -l",
               (LATENCY_P50, LATENCY_P99)),
        Scenario("consume", f"consume only, {consume_count:,} queued",
                 f"-C {consume_count}, then -x 0 -y 1 -D {consume_count}", (CONSUME,),
                 consume_queued),
        Scenario("stream", "stream, confirms, read from first",
                 f"{stream_flags} + stream queue, offset first", (CONFIRM, CONSUME),
                 stream_timed(stream_flags)),
        Scenario("fanout", f"fanout to {FANOUT_QUEUES} queues", "-x 1 -y 0 -s 16 -e FANOUT",
                 (PUBLISH,), fanout),
        Scenario("connections", f"{CONNECTIONS:,} idle connections", f"connections {CONNECTIONS}",
                 (PER_CONNECTION,), connections, runs_first=True),
        Scenario("queues", f"{QUEUES:,} queues", f"queues {QUEUES}", (PER_QUEUE,), queues,
                 runs_first=True),
        Scenario("queued", f"{queued_count:,} queued messages, 16 B",
                 f"-x 1 -y 0 -s 16 -C {queued_count}", (PER_MESSAGE, RSS_QUEUED), queued_memory,
                 runs_first=True),
        # Issue 19: consumers that ack each message with its own basic.ack.
        _timed("ack-each", "1 pub + 1 cons, prefetch 1000, per-message acks",
               f"-x 1 -y 1 {ACK_EACH} -s 16", (PUBLISH, CONSUME)),
        Scenario("consume-ack-each",
                 f"consume only, {consume_count:,} queued, prefetch 1000, per-message acks",
                 f"-C {consume_count}, then -x 0 -y 1 -D {consume_count} {ACK_EACH}",
                 (CONSUME,), consume_queued_with(ACK_EACH)),
        Scenario("stream-ack-each", "stream, read from first over AMQP, per-message acks",
                 f"{stream_each_flags} + stream queue, offset first", (CONFIRM, CONSUME),
                 stream_timed(stream_each_flags)),
        # Issue 20: AMQP over TLS, beside the same runs over TCP above.
        Scenario("tls-publish-16", "TLS: publish only, 16 B", "-x 1 -y 0 -s 16 over amqps",
                 (PUBLISH,), tls_timed("-x 1 -y 0 -s 16")),
        Scenario("tls-publish-1024", "TLS: publish only, 1 KiB", "-x 1 -y 0 -s 1024 over amqps",
                 (PUBLISH,), tls_timed("-x 1 -y 0 -s 1024")),
        Scenario("tls-ack", "TLS: 1 pub + 1 cons, manual ack",
                 "-x 1 -y 1 -a 100 -P 1000 -s 16 over amqps", (PUBLISH, CONSUME),
                 tls_timed("-x 1 -y 1 -a 100 -P 1000 -s 16")),
        Scenario("idle", "after the runs, queues deleted, idle", "none: VmRSS once steady",
                 (RSS_IDLE,), idle_memory, runs_last=True),
    ]  # fmt: skip


def _timed(key: str, title: str, flags: str, metrics: tuple[Metric, ...]) -> Scenario:
    return Scenario(key, title, flags, metrics, timed(flags))
