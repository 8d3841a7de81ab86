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

from streamq.perf import report
from streamq.perf.mqtt_options import MqttThroughputConfig
from streamq.perf.mqtt_roles import run_consumers, run_loop, run_publishers
from streamq.perf.shared import Shared, process_context
from streamq.perf.throughput import Ticker, Worker, measure, raise_first_error
from streamq.perf.worker import run_worker


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
    ticker = Ticker(shared, bool(config.qos), config.quiet, live)
    measured = measure(workers, shared, ticker, config.duration_s, ack_frames=bool(config.qos))
    raise_first_error(workers)
    summary = report.summarize(
        measured.elapsed_s,
        config.publishers,
        config.consumers,
        config.body_bytes,
        measured.counts,
        None,
        measured.ack_frames,
    )
    print(report.summary_json(summary) if config.json else report.summary_table(summary))
    return 0
