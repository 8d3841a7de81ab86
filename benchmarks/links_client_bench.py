"""Throughput of the links' outbound AMQP client (streamq/links/amqp) against streamq.

Starts two brokers (`streamq serve`, in processes of their own, data under a temporary
directory, fsync as configured by default), then, with the client on one uvloop in this
process:
1. publish N persistent 16 B messages to a durable queue of broker A under confirms,
   at most `--window` unconfirmed;
2. move them to broker B as an on-confirm shovel does: consume from A with a prefetch
   of `--prefetch` (the shovel's src-prefetch-count default is 1000), publish each batch
   to B under confirms, ack A with `multiple` once B confirmed;
3. consume them from B with acks (`multiple`, one per read).
Prints msgs/s for each phase, with the machine, Python and message size.

Run: .venv/bin/python benchmarks/links_client_bench.py [--messages 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amqp_gateway import codec
from benchmarks.machine import cpu_model
from streamq.links.amqp.client import Channel, Connection, Delivery
from streamq.links.amqp.uri import parse_uri
from tests.integration.broker_process import BrokerProcess

BODY = b"0123456789abcdef"  # 16 B
PERSISTENT = codec.encode_properties(codec.BasicProperties(delivery_mode=2))
QUEUE = "links-bench"
PUBLISH_BATCH = 1000


class Settled:
    """Confirms of one publishing channel: the highest contiguous sequence number."""

    def __init__(self) -> None:
        self.upto = 0
        self._above: set[int] = set()
        self.nacked = 0
        self.changed = asyncio.Event()

    def __call__(self, seq: int, multiple: bool, ack: bool) -> None:
        self.nacked += not ack
        if multiple:
            self.upto = max(self.upto, seq)
            self._above = {s for s in self._above if s > seq}
        else:
            self._above.add(seq)
        while self.upto + 1 in self._above:
            self.upto += 1
            self._above.discard(self.upto)
        self.changed.set()

    async def wait(self, seq: int) -> None:
        while self.upto < seq:
            self.changed.clear()
            await self.changed.wait()


async def open_channel(port: int, name: str) -> tuple[Connection, Channel]:
    connection = await Connection.connect(parse_uri(f"amqp://127.0.0.1:{port}"), name=name)
    channel = await connection.channel()
    await channel.declare_queue(QUEUE, durable=True)
    return connection, channel


async def publish(port: int, messages: int, window: int) -> float:
    connection, channel = await open_channel(port, "bench publisher")
    settled = Settled()
    channel.on_confirm = settled
    await channel.confirm_select()
    started = time.perf_counter()
    seq = 0
    while seq < messages:
        for _ in range(min(PUBLISH_BATCH, messages - seq)):
            seq = channel.publish("", QUEUE, PERSISTENT, BODY)
        await channel.writable()
        await settled.wait(seq - window)
    await settled.wait(seq)
    elapsed = time.perf_counter() - started
    await connection.close()
    assert settled.nacked == 0
    return messages / elapsed


async def shovel(source_port: int, dest_port: int, messages: int, prefetch: int) -> float:
    """On-confirm: A's deliveries acked (multiple) once B confirmed the publishes."""
    source_connection, source = await open_channel(source_port, "bench shovel source")
    dest_connection, dest = await open_channel(dest_port, "bench shovel destination")
    settled = Settled()
    await dest.confirm_select()
    await source.qos(prefetch)
    pending: deque[tuple[int, int]] = deque()  # (last publish seq, source delivery tag)
    done = asyncio.Event()
    moved = 0

    def on_confirm(seq: int, multiple: bool, ack: bool) -> None:
        nonlocal moved
        settled(seq, multiple, ack)
        last_tag = 0
        while pending and pending[0][0] <= settled.upto:
            _, last_tag = pending.popleft()
        if last_tag:
            source.ack(last_tag, multiple=True)
        if settled.upto >= messages:
            done.set()

    def on_deliveries(deliveries: list[Delivery]) -> None:
        seq = 0
        for delivery in deliveries:
            seq = dest.publish("", QUEUE, delivery.properties, delivery.body)
        pending.append((seq, deliveries[-1].delivery_tag))

    dest.on_confirm = on_confirm
    started = time.perf_counter()
    await source.consume(QUEUE, on_deliveries)
    await done.wait()
    elapsed = time.perf_counter() - started
    await source_connection.close()
    await dest_connection.close()
    return messages / elapsed


async def consume(port: int, messages: int, prefetch: int) -> float:
    connection, channel = await open_channel(port, "bench consumer")
    await channel.qos(prefetch)
    done = asyncio.Event()
    count = 0

    def on_deliveries(deliveries: list[Delivery]) -> None:
        nonlocal count
        count += len(deliveries)
        channel.ack(deliveries[-1].delivery_tag, multiple=True)
        if count >= messages:
            done.set()

    started = time.perf_counter()
    await channel.consume(QUEUE, on_deliveries)
    await done.wait()
    elapsed = time.perf_counter() - started
    await connection.close()
    return messages / elapsed


async def bench(args: argparse.Namespace, a: BrokerProcess, b: BrokerProcess) -> None:
    n = args.messages
    rate = await publish(a.amqp_port, n, args.window)
    print(f"publish, confirms (window {args.window}): {rate:,.0f} msgs/s", flush=True)
    rate = await shovel(a.amqp_port, b.amqp_port, n, args.prefetch)
    print(f"move A -> B on-confirm (prefetch {args.prefetch}): {rate:,.0f} msgs/s", flush=True)
    rate = await consume(b.amqp_port, n, args.prefetch)
    print(f"consume, acks multiple (prefetch {args.prefetch}): {rate:,.0f} msgs/s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--window", type=int, default=20_000, help="unconfirmed at most")
    parser.add_argument("--prefetch", type=int, default=1000)
    args = parser.parse_args()
    print(f"{cpu_model()}, Python {platform.python_version()}, uvloop, 16 B persistent bodies")
    print(f"{args.messages:,} messages; brokers: streamq serve, default fsync settings")
    with tempfile.TemporaryDirectory() as base:
        a = BrokerProcess(Path(base) / "a")
        b = BrokerProcess(Path(base) / "b")
        try:
            uvloop.run(bench(args, a, b))
        finally:
            a.stop()
            b.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
