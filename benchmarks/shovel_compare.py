"""A shovel between two brokers: streamq's against RabbitMQ's shovel plugin, in one run.

Usage: python benchmarks/shovel_compare.py [--dir DIR] [--messages N] [--only streamq|rabbitmq]

For each product, two brokers on free loopback ports with fresh directories under DIR
(two `streamq serve` processes; two Debian rabbitmq-server nodes with rabbitmq_shovel,
tests/differential/peers.py): N persistent 16 B messages are published to the durable
queue `shovel-src` on the first (`streamq perf throughput -y 0 -p -c 1000`, confirmed, not
timed), then the dynamic shovel is created on the first broker through
`PUT /api/parameters/shovel/%2F/bench` (src-uri `amqp://`, this broker; dest-uri the second
broker; dest-queue `shovel-dest`; ack-mode on-confirm; src-prefetch-count 1000, both
products' default) and the clock runs until the second broker's `shovel-dest` holds N
messages (its count read with a passive queue.declare every 50 ms, which RabbitMQ answers
from the queue itself, not from its 5 s statistics). Every process is stopped by its pid.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Final, Protocol

import pika

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import cpu_model  # noqa: E402
from benchmarks.perf_process import StreamqServe  # noqa: E402
from tests.differential.peers import RabbitMQServer  # noqa: E402

MESSAGES_DEFAULT: Final = 1_000_000
BODY_BYTES: Final = 16
PREFETCH: Final = 1000
POLL_S: Final = 0.05
TRANSFER_TIMEOUT_S: Final = 900.0
SOURCE: Final = "shovel-src"
DEST: Final = "shovel-dest"


class Node(Protocol):
    amqp_port: int
    http_port: int

    def stop(self) -> None: ...


def streamq_node(directory: Path) -> StreamqServe:
    """`streamq serve` of this checkout (`python -m streamq`), on free loopback ports."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return StreamqServe([sys.executable, "-m", "streamq"], directory, env=env)


def uri(port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/%2f"


def preload(port: int, messages: int) -> float:
    """Publish `messages` persistent 16 B messages to SOURCE under confirms; msgs/s."""
    command = [
        sys.executable, "-m", "streamq", "perf", "throughput", "--uri", uri(port),
        "-x", "1", "-y", "0", "-s", str(BODY_BYTES), "-p", "-c", "1000", "-u", SOURCE,
        "-C", str(messages), "-q", "-j",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"preload failed: {out.stderr[-2000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    return float(summary["avg_pub_rate"])


def queue_length(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def put_shovel(http_port: int, dest_amqp_port: int) -> None:
    value = {
        "src-uri": "amqp://",
        "src-queue": SOURCE,
        "src-prefetch-count": PREFETCH,
        "dest-uri": uri(dest_amqp_port),
        "dest-queue": DEST,
        "ack-mode": "on-confirm",
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/api/parameters/shovel/%2F/bench",
        data=json.dumps({"value": value}).encode(),
        method="PUT",
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 201, 204), response.status


def transfer(source: Node, dest: Node, messages: int) -> dict[str, float]:
    """Create the shovel and time it until DEST on `dest` holds `messages`."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", dest.amqp_port))
    channel = connection.channel()
    channel.queue_declare(DEST, durable=True)
    started = time.monotonic()
    put_shovel(source.http_port, dest.amqp_port)
    arrived = 0
    while arrived < messages:
        if time.monotonic() - started > TRANSFER_TIMEOUT_S:
            raise RuntimeError(f"only {arrived} of {messages} arrived")
        time.sleep(POLL_S)
        arrived = queue_length(channel, DEST)
    elapsed_s = time.monotonic() - started
    connection.close()
    return {"seconds": elapsed_s, "msgs_per_s": messages / elapsed_s, "arrived": arrived}


def run_product(name: str, base: Path, messages: int) -> dict[str, float]:
    nodes: list[Node] = []
    try:
        for side in ("a", "b"):
            if name == "streamq":
                nodes.append(streamq_node(base / f"streamq-{side}"))
            else:
                plugins = ("rabbitmq_shovel", "rabbitmq_shovel_management")
                nodes.append(RabbitMQServer(base / f"rabbitmq-{side}", plugins=plugins))
        preload_rate = preload(nodes[0].amqp_port, messages)
        print(f"{name}: preloaded {messages} ({preload_rate:.0f} msgs/s)", flush=True)
        result = transfer(nodes[0], nodes[1], messages)
        print(
            f"{name}: {messages} messages shovelled in {result['seconds']:.2f} s "
            f"= {result['msgs_per_s']:.0f} msgs/s",
            flush=True,
        )
        return result
    finally:
        for node in nodes:
            node.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where the brokers live (a fresh temp dir)")
    parser.add_argument("--messages", type=int, default=MESSAGES_DEFAULT)
    parser.add_argument("--only", choices=("streamq", "rabbitmq"))
    args = parser.parse_args(argv)
    base = args.dir or Path(tempfile.mkdtemp(prefix="shovel-compare-"))
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} "
        f"{platform.release()}; {args.messages} persistent {BODY_BYTES} B messages, "
        f"on-confirm, prefetch {PREFETCH}",
        flush=True,
    )
    results = {}
    for name in ("streamq", "rabbitmq"):
        if args.only in (None, name):
            results[name] = run_product(name, base, args.messages)
    if len(results) == 2:
        ratio = results["streamq"]["msgs_per_s"] / results["rabbitmq"]["msgs_per_s"]
        print(f"streamq / RabbitMQ shovel: {ratio:.2f}x", flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
