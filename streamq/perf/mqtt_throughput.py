"""`streamq perf mqtt throughput`: the parent process of an MQTT throughput run.

Owns the run's life cycle, as `throughput` does for AMQP: start one process for the
publishers and one for the consumers (`mqtt_roles`; each holds all its clients on one
event loop), raise `go` once both are connected (consumers subscribed), print the live
line once a second from the shared counters, stop at `-z`, on ^C or when every worker
is done, and print the summary (the AMQP mode's table and JSON, `report`). A worker's
error stops the run and becomes the command's one-line error.
"""

from __future__ import annotations

import functools
import sys
import time
from multiprocessing.connection import wait
from typing import Final, TextIO

from streamq.perf import report
from streamq.perf.mqtt_options import MqttThroughputConfig
from streamq.perf.mqtt_roles import run_consumers, run_loop, run_publishers
from streamq.perf.shared import Shared, process_context
from streamq.perf.throughput import (
    Worker,
    raise_first_error,
    stop_workers,
    wait_until_ready,
)
from streamq.perf.worker import run_worker

TICK_S: Final = 1.0


def start_workers(config: MqttThroughputConfig, shared: Shared) -> list[Worker]:
    context = process_context()
    workers = []
    roles = [
        ("publishers", run_publishers, config.publishers),
        ("consumers", run_consumers, config.consumers),
    ]
    for role, target, count in roles:
        if count == 0:
            continue
        parent_end, child_end = context.Pipe(duplex=False)
        work = functools.partial(run_loop, functools.partial(target, config, shared))
        process = context.Process(  # type: ignore[attr-defined]  # BaseContext lacks it in typeshed
            target=run_worker, args=(work, child_end), name=f"mqtt-{role}", daemon=True
        )
        process.start()
        child_end.close()
        workers.append(Worker(role, process, parent_end))
    return workers


def run_mqtt_throughput(config: MqttThroughputConfig) -> int:
    """Run the test and print the summary; 0 on success. Raises `PerfError`."""
    shared = Shared(
        process_context(),
        config.publishers,
        config.consumers,
        config.publish_max,
        config.consume_max,
    )
    workers = start_workers(config, shared)
    live = sys.stderr if config.json else sys.stdout
    try:
        wait_until_ready(workers, shared)
        started = run_until_done(config, workers, shared, live)
        # The counts first, then the time: the workers count on until they see the stop,
        # and what they count after the measured span must not be divided by it (a
        # `-R 50` consumer counted 153 in 3.004 s).
        counts = (shared.published(), shared.confirmed() if config.qos else None, shared.consumed())
        ack_frames = shared.ack_frames() if config.qos else None
        elapsed_s = time.monotonic() - started
    finally:
        shared.stop()
        stop_workers(workers)
    raise_first_error(workers)
    summary = report.summarize(
        elapsed_s,
        config.publishers,
        config.consumers,
        config.body_bytes,
        counts,
        None,
        ack_frames,
    )
    print(report.summary_json(summary) if config.json else report.summary_table(summary))
    return 0


def run_until_done(
    config: MqttThroughputConfig, workers: list[Worker], shared: Shared, live: TextIO
) -> float:
    """Let the workers run; print a live line a second. Returns when they started (the
    monotonic clock's time of the go)."""
    shared.go()
    started = time.monotonic()
    stop_at = started + config.duration_s if config.duration_s else float("inf")
    next_tick = started + TICK_S
    last = (0, 0)
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
                published, consumed = shared.published(), shared.consumed()
                unacked = published - shared.confirmed() if config.qos else None
                if not config.quiet:
                    line = report.live_line(
                        round(now - started), published - last[0], consumed - last[1], unacked
                    )
                    print(line, file=live, flush=True)
                last = (published, consumed)
                next_tick += TICK_S
            if now >= stop_at:
                break
    except KeyboardInterrupt:
        pass  # ^C ends the run early; the summary still comes.
    return started
