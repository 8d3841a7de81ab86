"""Reads that scale with replicas: the aggregate read rate of 8 stream consumers against
one streamq node, and against a three-node cluster whose followers serve reads.

Usage: python benchmarks/replica_reads.py [--dir DIR] [--messages N] [--size BYTES]
           [--consumers 8] [--rounds 2] [--json FILE]

For each setup a fresh stream of N messages of SIZE bytes (AMQP 1.0 data sections, as
stream clients send them) is published with confirms, then C consumers
(`benchmarks/stream_client.py`: they count records from chunk headers and decode
nothing, so the broker is measured) read it from first at once, each over its own
connection, all in one client process. The rate is C x N / the time until the last one
has every record, and the CPU seconds the serving node(s) used meanwhile: messages per
CPU-second says what each node costs per message, whatever the machine's load. Setups:
- single: one `streamq serve` (benchmarks/perf_process.py), every consumer on it;
- cluster: three `streamq serve --clustering` on one etcd (tests/cluster/), the stream
  published to the leader, the consumers spread over the two followers' stream ports
  (where rstream's Consumer goes: it prefers a replica) and served from their copies.
Every process runs on free loopback ports with fresh directories under DIR and is
stopped by its pid. `rounds` runs each setup that many times (the best is reported,
all are printed); the load average is printed beside each number: on a shared machine
the three nodes compete with the client for the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Final, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import cpu_model  # noqa: E402
from benchmarks.perf_process import StreamqServe  # noqa: E402
from benchmarks.stream_client import StreamClient, amqp10_data  # noqa: E402
from tests.cluster.cluster_nodes import Cluster  # noqa: E402
from tests.cluster.etcd_server import EtcdServer  # noqa: E402
from tests.differential.peers import free_port  # noqa: E402

HOST: Final = "127.0.0.1"
BATCH: Final = 100
WINDOW: Final = 5000
CREDIT: Final = 10
METADATA_WAIT_S: Final = 10.0


async def fill(port: int, stream: str, messages: int, size: int) -> None:
    client = await StreamClient.connect(HOST, port)
    try:
        await client.create(stream)
        await client.publish(stream, amqp10_data(b"x" * size), messages, BATCH, WINDOW)
    finally:
        await client.close()


async def read_all(ports: list[int], stream: str, messages: int, consumers: int) -> float:
    """Seconds until `consumers` consumers (round robin over `ports`) read every record."""
    clients = [await StreamClient.connect(HOST, ports[i % len(ports)]) for i in range(consumers)]
    try:
        started = time.perf_counter()
        await asyncio.gather(*(client.consume(stream, messages, CREDIT) for client in clients))
        return time.perf_counter() - started
    finally:
        await asyncio.gather(*(client.close() for client in clients))


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds the processes used so far (/proc/PID/stat)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def measured_read(pids: list[int], ports: list[int], args: argparse.Namespace) -> Run:
    before = cpu_s(pids)
    seconds = asyncio.run(read_all(ports, "bench", args.messages, args.consumers))
    return Run(seconds, cpu_s(pids) - before)


class Run(NamedTuple):
    seconds: float  # until the last consumer had every record
    serving_cpu_s: float  # CPU the serving nodes used meanwhile


def run_single(base: Path, args: argparse.Namespace) -> Run:
    port = free_port()
    serve = StreamqServe([sys.executable, "-m", "streamq"], base, "--stream-port", str(port),
                         "--stream-advertised-host", HOST)  # fmt: skip
    try:
        asyncio.run(fill(port, "bench", args.messages, args.size))
        return measured_read([serve.process.pid], [port], args)
    finally:
        serve.stop()


def run_cluster(base: Path, args: argparse.Namespace) -> Run:
    with EtcdServer(base / "etcd") as etcd, Cluster(base / "nodes", etcd.endpoint, 3) as cluster:
        ports = {}
        for node in cluster.nodes:
            ports[node.name] = free_port()
            node.extra = ("--stream-port", str(ports[node.name]), "--stream-advertised-host",
                          HOST)  # fmt: skip
        leader = cluster.start()
        asyncio.run(fill(ports[leader.name], "bench", args.messages, args.size))
        # Every confirmed record is on the followers; their reads wait for COMMITTED.
        followers = [node for node in cluster.nodes if node is not leader]
        return measured_read([node.pid for node in followers],
                             [ports[node.name] for node in followers], args)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--consumers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="replica-reads-"))
    results: dict[str, list[dict[str, float]]] = {"single": [], "cluster": []}
    for n in range(args.rounds):
        for name, run in (("single", run_single), ("cluster", run_cluster)):
            seconds, cpu = run(base / f"{name}-{n}", args)
            delivered = args.consumers * args.messages
            rate = delivered / seconds
            load = os.getloadavg()
            results[name].append({"msgs_per_s": rate, "seconds": seconds, "load_1m": load[0],
                                  "serving_cpu_s": cpu})  # fmt: skip
            loads = " ".join(f"{value:.1f}" for value in load)
            print(f"{name:8} round {n}: {rate:12,.0f} msgs/s aggregate "
                  f"({rate * args.size / 1e6:,.0f} MB/s of bodies) in {seconds:.2f} s; serving "
                  f"nodes' CPU {cpu:.1f} s ({delivered / max(cpu, 0.01):,.0f} msgs per CPU-s); "
                  f"load average {loads}", flush=True)  # fmt: skip
    best = {name: max(r["msgs_per_s"] for r in rows) for name, rows in results.items()}
    print(f"best: single {best['single']:,.0f} msgs/s, cluster {best['cluster']:,.0f} msgs/s "
          f"({best['cluster'] / best['single']:.2f}x); {args.consumers} consumers, "
          f"{args.messages} x {args.size} B, {cpu_model()}, {os.cpu_count()} cores, "
          f"{platform.python_version()}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"dir": str(base), "json": None},
                                         "results": results}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
