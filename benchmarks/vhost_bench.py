"""Micro benchmark of a vhost's per-message path in process: route, publish, drain, settle.

Measures, best of `ROUNDS`, messages per CPU-second of the calling thread
(`time.thread_time`: on a loaded machine, wall time measures the other processes as
much as this one; the log's writer thread is left out, it does the same work either
way) through the `VHost` calls the AMQP gateway makes, with no sockets and no AMQP
framing (a `RecordingConsumer` from the unit tests takes the deliveries), 16 B messages:
- `publish`: `route` + `publish` per message to one classic queue with no consumer;
- `publish-run`: `publish_run` of 256 messages at a time to that queue;
- `deliver-ack`: a run of 1000 published, drained to one consumer (prefetch 1000) and
  settled with `settle_classic` (an ack with `multiple`);
- `deliver-ack-ttl`: the same through a queue with `x-message-ttl` (each message goes
  through `take` and its expiry check, one at a time);
- `requeue`: 1000 delivered, requeued with `requeue_many`, delivered again and settled.

It uses only `VHost`'s public calls, so the same script measures two trees side by side:
`--compare A B` runs it under each tree's `PYTHONPATH` in turn, A B A B..., and prints
the median of each side's best rounds and the ratio. Issue 30 item 7 recorded the split of
the VHost hub with it (docs/perf.md, "The VHost hub taken apart"). The log's fsync
thread is idle: nothing is synced while measuring. Reports CPU, Python and load average.

Run: python benchmarks/vhost_bench.py [--scale N]
     python benchmarks/vhost_bench.py --compare TREE_A TREE_B [--pairs 3] [--scale N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Final

from amqp_gateway.codec import BasicProperties, encode_properties
from amqp_gateway.deaths import AmqpPropertiesCodec
from streamq.broker.vhost import VHost
from streamq.log.syncer import Syncer
from tests.unit.broker.consumers import RecordingConsumer

ROUNDS: Final = 7
MESSAGES: Final = 100_000  # per round at --scale 1
RUN_MESSAGES: Final = 256  # per publish_run, as a fast publisher's read holds
BATCH: Final = 1000  # delivered and settled per step (the consumer's prefetch)
BODY: Final = b"0123456789abcdef"


def _vhost(directory: str) -> VHost:
    vhost = VHost("/", directory, Syncer())
    vhost.properties_codec = AmqpPropertiesCodec()
    return vhost


def _scenarios(messages: int) -> dict[str, Callable[[str], float]]:
    """Each scenario takes a fresh directory and returns its seconds for `messages`."""
    properties = encode_properties(BasicProperties(delivery_mode=1))

    def publish(directory: str) -> float:
        vhost = _vhost(directory)
        queue = vhost.declare_queue("q", False, True, False, False, {}, None)
        route, store = vhost.route, vhost.publish
        started = time.thread_time()
        for _ in range(messages):
            store("", "q", properties, BODY, route("", "q", None), 0)
        elapsed = time.thread_time() - started
        assert queue.cursor.message_count == messages
        vhost.close()
        return elapsed

    def publish_run(directory: str) -> float:
        vhost = _vhost(directory)
        queue = vhost.declare_queue("q", False, True, False, False, {}, None)
        run = [(properties, BODY, "", "q", 0)] * RUN_MESSAGES
        started = time.thread_time()
        for _ in range(messages // RUN_MESSAGES):
            queues = vhost.route_run("", "q")
            vhost.publish_run("", "q", run, queues, 0)
        elapsed = time.thread_time() - started
        assert queue.cursor.message_count == messages // RUN_MESSAGES * RUN_MESSAGES
        vhost.close()
        return elapsed

    def deliver_ack(arguments: dict[str, object], requeue: bool) -> Callable[[str], float]:
        def scenario(directory: str) -> float:
            vhost = _vhost(directory)
            queue = vhost.declare_queue("q", False, True, False, False, arguments, None)
            consumer = RecordingConsumer(BATCH)
            vhost.add_consumer(queue, consumer)
            run = [(properties, BODY, "", "q", 0)] * BATCH
            now_ms = int(time.time() * 1000)
            started = time.thread_time()
            for _ in range(messages // BATCH):
                vhost.publish_run("", "q", run, [queue], now_ms)
                vhost.drain()
                if requeue:
                    taken, consumer.unacked = consumer.unacked, []
                    vhost.requeue_many([(queue, o, consumer) for o in taken], deliver=True)
                taken, consumer.unacked = consumer.unacked, []
                vhost.settle_classic(queue, taken)
                consumer.bodies.clear()
                consumer.received.clear()
                consumer.runs.clear()
            elapsed = time.thread_time() - started
            vhost.close()
            return elapsed

        return scenario

    return {
        "publish": publish,
        "publish-run": publish_run,
        "deliver-ack": deliver_ack({}, requeue=False),
        "deliver-ack-ttl": deliver_ack({"x-message-ttl": 3_600_000}, requeue=False),
        "requeue": deliver_ack({}, requeue=True),
    }


def measure(scale: float) -> dict[str, float]:
    """Best messages/s of each scenario over ROUNDS rounds."""
    messages = int(MESSAGES * scale)
    best: dict[str, float] = {}
    for name, scenario in _scenarios(messages).items():
        seconds = []
        for _ in range(ROUNDS):
            with tempfile.TemporaryDirectory() as directory:
                seconds.append(scenario(directory))
        best[name] = messages / min(seconds)
    return best


def compare(tree_a: str, tree_b: str, pairs: int, scale: float) -> None:
    """Run `measure` under each tree in turn, A B A B..., and print medians and ratios."""
    results: dict[str, list[dict[str, float]]] = {tree_a: [], tree_b: []}
    for _ in range(pairs):
        for tree in (tree_a, tree_b):
            env = dict(os.environ, PYTHONPATH=tree)
            out = subprocess.run(
                [sys.executable, __file__, "--scale", str(scale), "--json"],
                env=env,
                cwd=tree,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[tree].append(json.loads(out))
    print(f"load average {os.getloadavg()}, {platform.processor() or platform.machine()},")
    print(f"Python {platform.python_version()}; best of {ROUNDS} rounds, {pairs} pairs A B")
    print(f"| scenario | A: {tree_a} | B: {tree_b} | A/B |")
    print("|---|---|---|---|")
    for name in results[tree_a][0]:
        a = statistics.median(r[name] for r in results[tree_a])
        b = statistics.median(r[name] for r in results[tree_b])
        spread_a = ", ".join(f"{r[name] / 1e3:.0f}k" for r in results[tree_a])
        spread_b = ", ".join(f"{r[name] / 1e3:.0f}k" for r in results[tree_b])
        print(
            f"| {name} | {a / 1e3:.0f}k ({spread_a}) | {b / 1e3:.0f}k ({spread_b}) | {a / b:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="messages per round x N")
    parser.add_argument("--json", action="store_true", help="print the bests as JSON")
    parser.add_argument("--compare", nargs=2, metavar=("TREE_A", "TREE_B"))
    parser.add_argument("--pairs", type=int, default=3, help="A B runs with --compare")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare[0], args.compare[1], args.pairs, args.scale)
        return
    best = measure(args.scale)
    if args.json:
        print(json.dumps(best))
        return
    print(f"load average {os.getloadavg()}, Python {platform.python_version()}")
    for name, rate in best.items():
        print(f"{name}: {rate / 1e3:.0f}k msgs/s (best of {ROUNDS})")


if __name__ == "__main__":
    main()
