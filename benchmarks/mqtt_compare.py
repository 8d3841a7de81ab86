"""streamq's MQTT gateway and RabbitMQ 3.10's rabbitmq_mqtt, side by side in one run.

Both brokers run at once, each on loopback ports of its own with a fresh data directory;
each scenario runs on one, then the other, `--rounds` times (A B A B...), with the same
client against both: `streamq perf mqtt` (separate publisher and consumer processes) and
paho-mqtt for a real client's row. Issue 33's scenarios:

- `qos1-publish`: one QoS 1 publisher, `--inflight` unacknowledged, to a durable queue
  bound to `amq.topic` (so PUBACK waits for the disk on both: streamq's fsync round,
  RabbitMQ's confirm); the rate of PUBACKs. `paho-qos1`: the same with paho.
- `qos1-fanin`: 100 QoS 1 publishers to one AMQP consumer (`streamq perf throughput`,
  acks every 100, prefetch 1000) of a durable queue bound to their topic; the consume rate.
- `qos0`: one QoS 0 publisher to one QoS 0 subscriber; the subscriber's rate.
  `paho-qos0`: paho's (benchmarks/mqtt_publish.py's `qos0_fanout`).
- `idle`: `--connections` idle MQTT connections with a 60 s keep-alive (pinged); the
  broker's VmRSS before and after, per connection.

Prints one line per run with the load average, then the medians and their ratio.
`--baseline DIR` runs a third broker, streamq from another source tree (a `git archive`
of an earlier commit, its C extensions built in place), in the same rotation, so that a
change's before and after are both measured against RabbitMQ under the same load.

    PYTHONPATH=. python -m benchmarks.mqtt_compare --seconds 10 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pika

from benchmarks.machine import cpu_model
from benchmarks.mqtt_publish import qos0_fanout, qos1_publish
from tests.differential.peers import RabbitMQServer, free_port

START_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 1800.0
SINK_QUEUE = "bench-sink"
FANIN_QUEUE = "bench-fanin"


@dataclass
class Broker:
    name: str
    mqtt_port: int
    amqp_port: int
    pid: int

    def uri(self) -> str:
        return f"mqtt://guest:guest@127.0.0.1:{self.mqtt_port}"


def _listening(port: int) -> bool:
    import socket  # noqa: PLC0415

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _wait_listening(port: int, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _listening(port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen on {port}")
        time.sleep(0.2)


@contextmanager
def streamq_broker(
    directory: Path, source: Path | None = None, name: str = "streamq"
) -> Iterator[Broker]:
    """streamq from this tree, or with `source` from that one."""
    mqtt_port, amqp_port = free_port(), free_port()
    command = [
        *(sys.executable, "-m", "streamq", "serve", "--data-dir", str(directory / "data")),
        *("--amqp-port", str(amqp_port), "--http-port", "0", "--stream-port", "-1"),
        *("--mqtt-port", str(mqtt_port)),
    ]
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    with open(directory / "streamq.log", "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=source
        )
    try:
        _wait_listening(mqtt_port, name)
        yield Broker(name, mqtt_port, amqp_port, process.pid)
    finally:
        process.terminate()
        process.wait(60)


@contextmanager
def rabbitmq_broker(directory: Path) -> Iterator[Broker]:
    mqtt_port = free_port()
    server = RabbitMQServer(
        directory,
        plugins=("rabbitmq_mqtt",),
        extra_config=f"mqtt.listeners.tcp.1 = 127.0.0.1:{mqtt_port}\n",
    )
    try:
        _wait_listening(mqtt_port, "RabbitMQ's MQTT listener")
        pid = int((directory / "pid").read_text().strip())
        yield Broker("rabbitmq", mqtt_port, server.amqp_port, pid)
    finally:
        server.stop()


def bind_queue(broker: Broker, queue: str, key: str, *, purge: bool = True) -> None:
    """A durable queue bound to `amq.topic` with `key`, emptied."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, "amq.topic", key)
    if purge:
        channel.queue_purge(queue)
    connection.close()


def perf(*args: str) -> dict[str, object]:
    command = [sys.executable, "-m", "streamq", "perf", *args, "-j"]
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    result: dict[str, object] = json.loads(done.stdout)
    return result


def _rate(result: dict[str, object], key: str) -> float:
    value = result[key]
    assert isinstance(value, int | float)
    return float(value)


def qos1_publish_perf(broker: Broker, args: argparse.Namespace) -> float:
    bind_queue(broker, SINK_QUEUE, "bench.q1")
    result = perf(
        "mqtt", "throughput", "-u", broker.uri(), "--qos", "1", "-y", "0", "-t", "bench/q1",
        "--max-inflight", str(args.inflight), "-z", str(args.seconds), "--clean-session",
        "-s", str(args.size),
    )  # fmt: skip
    return _rate(result, "avg_pub_rate")


def qos1_publish_paho(broker: Broker, args: argparse.Namespace) -> float:
    bind_queue(broker, SINK_QUEUE, "bench.q1")
    return float(qos1_publish(broker.mqtt_port, args.paho_messages, args.inflight))


def qos1_fanin(broker: Broker, args: argparse.Namespace) -> float:
    bind_queue(broker, FANIN_QUEUE, "bench.fanin")
    amqp = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/%2f"
    consumer = subprocess.Popen(
        [
            *(sys.executable, "-m", "streamq", "perf", "throughput", "--uri", amqp),
            *("-x", "0", "-y", "1", "-u", FANIN_QUEUE, "-a", "100", "-P", "1000"),
            *("-z", str(args.seconds + 5), "-j"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        perf(
            "mqtt", "throughput", "-u", broker.uri(), "--qos", "1", "-x", "100", "-y", "0",
            "-t", "bench/fanin", "--max-inflight", "10", "-z", str(args.seconds),
            "--clean-session", "-s", str(args.size),
        )  # fmt: skip
        out, err = consumer.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if consumer.poll() is None:
            consumer.terminate()
            consumer.wait(30)
    if consumer.returncode != 0:
        raise RuntimeError(f"AMQP consumer: {err.strip()}")
    result = json.loads(out)
    # Consumed over the consumer's whole run (the publishers' seconds plus its tail).
    seconds: int = args.seconds
    return float(result["consumed"]) / seconds


def qos0_perf(broker: Broker, args: argparse.Namespace) -> float:
    result = perf(
        "mqtt", "throughput", "-u", broker.uri(), "-t", "bench/q0", "-z", str(args.seconds),
        "--clean-session", "-s", str(args.size),
    )  # fmt: skip
    return _rate(result, "avg_consume_rate")


def qos0_paho(broker: Broker, args: argparse.Namespace) -> float:
    return float(qos0_fanout(broker.mqtt_port, args.paho_messages, args.inflight))


def idle(broker: Broker, args: argparse.Namespace) -> float:
    result = perf(
        "mqtt", "connections", str(args.connections), "-u", broker.uri(), "--keepalive", "60",
        "--hold", "2", "--pid", str(broker.pid),
    )  # fmt: skip
    return _rate(result, "kib_each")


Scenario = Callable[[Broker, argparse.Namespace], float]
SCENARIOS: dict[str, tuple[Scenario, str]] = {
    "qos1-publish": (qos1_publish_perf, "PUBACKs/s"),
    "paho-qos1": (qos1_publish_paho, "PUBACKs/s"),
    "qos1-fanin": (qos1_fanin, "consumed/s"),
    "qos0": (qos0_perf, "consumed/s"),
    "paho-qos0": (qos0_paho, "received/s"),
    "idle": (idle, "KiB/conn"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--size", type=int, default=16, help="body bytes")
    parser.add_argument("--inflight", type=int, default=100)
    parser.add_argument("--paho-messages", type=int, default=10000)
    parser.add_argument("--connections", type=int, default=10000)
    parser.add_argument("--only", default=",".join(SCENARIOS), help="scenarios, comma-separated")
    parser.add_argument("--baseline", type=Path, help="also run streamq from this source tree")
    args = parser.parse_args(argv)
    names = args.only.split(",")
    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores; bodies {args.size} bytes", flush=True)
    results: dict[tuple[str, str], list[float]] = {}
    with contextlib.ExitStack() as stack:
        sq_dir, base_dir, rmq_dir = (
            Path(stack.enter_context(tempfile.TemporaryDirectory())) for _ in range(3)
        )
        brokers = [stack.enter_context(streamq_broker(sq_dir))]
        if args.baseline is not None:
            base = streamq_broker(base_dir, args.baseline.resolve(), "baseline")
            brokers.append(stack.enter_context(base))
        rabbitmq = stack.enter_context(rabbitmq_broker(rmq_dir))
        brokers.append(rabbitmq)
        for name in names:
            run, unit = SCENARIOS[name]
            rounds = 1 if name == "idle" else args.rounds
            for _ in range(rounds):
                for broker in brokers:
                    load = os.getloadavg()[0]
                    value = run(broker, args)
                    results.setdefault((name, broker.name), []).append(value)
                    print(
                        f"{name:13} {broker.name:9} {value:12.1f} {unit}  load {load:.1f}",
                        flush=True,
                    )
    _print_medians(names, [b.name for b in brokers], results)
    return 0


def _print_medians(
    names: list[str], brokers: list[str], results: dict[tuple[str, str], list[float]]
) -> None:
    """The medians per scenario and broker, each streamq's over RabbitMQ's."""
    ours = brokers[:-1]
    print("median       " + "".join(f"{b:>14}" for b in brokers) + "".join(
        f"  {b}/rabbitmq" for b in ours
    ))  # fmt: skip
    for name in names:
        medians = [statistics.median(results[(name, b)]) for b in brokers]
        ratios = "".join(
            f"  {m / medians[-1]:{len(b) + 9}.2f}" for m, b in zip(medians[:-1], ours, strict=True)
        )
        print(f"{name:13}" + "".join(f"{m:14.1f}" for m in medians) + ratios)


if __name__ == "__main__":
    sys.exit(main())
