"""`streamq perf throughput`: the parent process of a throughput run.

Owns the run's life cycle: declare the queue (and bind it to `-e`), start one process per
publisher and per consumer, raise `go` once all are connected, print the live line once
a second from the shared counters, stop at `-z`, on ^C or when every worker is done, and
print the summary. A worker's error stops the run and becomes the one-line error of the
command. Every wait here has a timeout; workers are ended only by their own handles.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Final, TextIO

from amqp_gateway.codec import methods as m
from streamq.perf import report
from streamq.perf.client import IO_TIMEOUT_S, AmqpClient
from streamq.perf.consumer import consume
from streamq.perf.errors import PerfError
from streamq.perf.latency import latency_summary
from streamq.perf.options import ThroughputConfig
from streamq.perf.publisher import publish
from streamq.perf.shared import Shared, process_context
from streamq.perf.worker import GO_TIMEOUT_S, run_worker

TICK_S: Final = 1.0
STOP_TIMEOUT_S: Final = IO_TIMEOUT_S + 5.0
"""How long stopped workers get to drain confirms, commit and close."""
KILL_TIMEOUT_S: Final = 2.0


@dataclass
class Worker:
    name: str
    process: BaseProcess
    pipe: Connection
    result: tuple[str, object] | None = None
    latency: list[bytes] = field(default_factory=list)

    def receive(self) -> None:
        """Take the worker's one message, or note that it died without one."""
        try:
            kind, payload = self.pipe.recv()
        except (EOFError, OSError):
            self.process.join(KILL_TIMEOUT_S)
            kind, payload = "error", f"exited with status {self.process.exitcode}"
        self.result = (kind, payload)
        if kind == "done" and isinstance(payload, bytes):
            self.latency.append(payload)

    def error(self) -> str | None:
        if self.result is not None and self.result[0] == "error":
            return f"{self.name}: {self.result[1]}"
        return None


def declare_queue(config: ThroughputConfig) -> None:
    """Declare the queue (durable, with `--queue-args`) and bind it to `-e`."""
    client = AmqpClient.connect(config.uri)
    try:
        declare = m.QueueDeclare(queue=config.queue, durable=True, arguments=config.queue_args)
        client.call(declare, m.QueueDeclareOk)
        if config.exchange:
            bind = m.QueueBind(
                queue=config.queue, exchange=config.exchange, routing_key=config.routing_key
            )
            client.call(bind, m.QueueBindOk)
    finally:
        client.close()


def start_workers(context: BaseContext, config: ThroughputConfig, shared: Shared) -> list[Worker]:
    workers = []
    roles = [("publisher", publish, config.publishers), ("consumer", consume, config.consumers)]
    for role, target, count in roles:
        for index in range(count):
            parent_end, child_end = context.Pipe(duplex=False)
            work = functools.partial(target, config, shared, index)
            process = context.Process(  # type: ignore[attr-defined]  # BaseContext lacks it in typeshed
                target=run_worker, args=(work, child_end), name=f"{role}-{index + 1}", daemon=True
            )
            process.start()
            child_end.close()
            workers.append(Worker(f"{role} {index + 1}", process, parent_end))
    return workers


def run_throughput(config: ThroughputConfig) -> int:
    """Run the test and print the summary; 0 on success. Raises `PerfError`."""
    declare_queue(config)
    context = process_context()
    shared = Shared(
        context, config.publishers, config.consumers, config.publish_max, config.consume_max
    )
    workers = start_workers(context, config, shared)
    live = sys.stderr if config.json else sys.stdout
    measured = measure(
        workers,
        shared,
        Ticker(shared, bool(config.confirm_max), config.quiet, live),
        config.duration_s,
        ack_frames=bool(config.ack_every),
    )
    raise_first_error(workers)
    summary = report.summarize(
        measured.elapsed_s,
        config.publishers,
        config.consumers,
        config.body_bytes,
        measured.counts,
        latency_summary([part for worker in workers for part in worker.latency]),
        measured.ack_frames,
    )
    print(report.summary_json(summary) if config.json else report.summary_table(summary))
    return 0


def wait_until_ready(workers: list[Worker], shared: Shared) -> None:
    deadline = time.monotonic() + GO_TIMEOUT_S
    while shared.ready() < len(workers):
        if time.monotonic() > deadline:
            raise PerfError("timed out waiting for the workers to connect")
        for pipe in wait([worker.pipe for worker in workers if worker.result is None], 0.01):
            worker = next(worker for worker in workers if worker.pipe is pipe)
            worker.receive()
            raise_first_error(workers)


@dataclass(frozen=True, slots=True)
class Measured:
    """What a run moved: (published, confirmed or None, consumed), and in how long."""

    elapsed_s: float
    counts: tuple[int, int | None, int]
    ack_frames: int | None


class Ticker:
    """The live line a second: what moved since the one before, and what is unconfirmed
    when publishers wait for confirms (or PUBACKs)."""

    def __init__(self, shared: Shared, confirms: bool, quiet: bool, live: TextIO) -> None:
        self.shared = shared
        self.confirms = confirms
        self.quiet = quiet
        self.live = live
        self.last = (0, 0)

    def tick(self, second: int) -> None:
        shared = self.shared
        published, consumed = shared.published(), shared.consumed()
        unconfirmed = published - shared.confirmed() if self.confirms else None
        if not self.quiet:
            moved = (published - self.last[0], consumed - self.last[1])
            print(report.live_line(second, *moved, unconfirmed), file=self.live, flush=True)
        self.last = (published, consumed)


def measure(
    workers: list[Worker],
    shared: Shared,
    ticker: Ticker,
    duration_s: float,
    *,
    ack_frames: bool,
) -> Measured:
    """Start the workers once all are ready, let them run (`duration_s`, 0: until they
    finish) with a live line a second, and stop them. The counts are read first, then
    the time: the workers count on until they see the stop, and what they count after
    the measured span must not be divided by it (a `-R 50` MQTT consumer counted 153 in
    3.004 s)."""
    try:
        wait_until_ready(workers, shared)
        started = run_until_done(workers, shared, ticker, duration_s)
        counts = (
            shared.published(),
            shared.confirmed() if ticker.confirms else None,
            shared.consumed(),
        )
        acks = shared.ack_frames() if ack_frames else None
        return Measured(time.monotonic() - started, counts, acks)
    finally:
        shared.stop()
        stop_workers(workers)


def run_until_done(
    workers: list[Worker], shared: Shared, ticker: Ticker, duration_s: float
) -> float:
    """Let the workers run; a live line a second. Returns when they started (the
    monotonic clock's time of the go)."""
    shared.go()
    started = time.monotonic()
    stop_at = started + duration_s if duration_s else float("inf")
    next_tick = started + TICK_S
    try:
        while any(worker.result is None for worker in workers):
            now = time.monotonic()
            running = [worker.pipe for worker in workers if worker.result is None]
            for pipe in wait(running, max(0.0, min(next_tick, stop_at) - now)):
                next(worker for worker in workers if worker.pipe is pipe).receive()
            if any(worker.error() for worker in workers):
                break
            now = time.monotonic()
            if now >= next_tick:
                ticker.tick(round(now - started))
                next_tick += TICK_S
            if now >= stop_at:
                break
    except KeyboardInterrupt:
        pass  # ^C ends the run early; the summary still comes.
    return started


def stop_workers(workers: list[Worker]) -> None:
    """Collect every worker's message, ending (by handle) those that do not stop."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for worker in workers:
        if worker.result is None:
            if worker.pipe.poll(max(0.0, deadline - time.monotonic())):
                worker.receive()
            else:
                worker.process.terminate()
                worker.result = ("error", "did not stop in time")
        worker.process.join(KILL_TIMEOUT_S)
        worker.pipe.close()


def raise_first_error(workers: list[Worker]) -> None:
    for worker in workers:
        error = worker.error()
        if error is not None:
            raise PerfError(error)
