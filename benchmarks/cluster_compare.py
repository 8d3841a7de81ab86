"""Persistent publish with confirms on a three-node streamq cluster, against one streamq
node and against a three-node RabbitMQ cluster's quorum queues; and the failover time.

Usage: python benchmarks/cluster_compare.py [--dir DIR] [--seconds S] [--publishers N]
           [--window W] [--sizes 16,1024] [--failovers N] [--lease-ttl S]
           [--only single,cluster,cluster-tls,rabbitmq,failover] [--json FILE]

Every broker runs on free loopback ports with fresh directories under DIR, and is stopped
by its pid:
- single: one `streamq serve` (benchmarks/perf_process.py StreamqServe);
- cluster: three `streamq serve --clustering` and one etcd (tests/cluster/cluster_nodes.py,
  tests/cluster/etcd_server.py) with the default 10 s lease; the load goes to the leader;
- cluster-tls: the same over replication links with mutual TLS (`--clustering-tls-*`,
  P-256 certificates from one CA made by tests/cluster/node_certs.py);
- rabbitmq: three Debian rabbitmq-server nodes clustered (benchmarks/rabbitmq_cluster.py),
  the load to rabbit1, the queue declared with `x-queue-type: quorum` (three replicas).
The load is `streamq perf throughput -x N -y 0 -s SIZE -p -c W -z S` into one durable
queue (a fresh one per row, deleted after it): N publisher processes, W unconfirmed
messages at most each.

failover: on another fresh cluster, N times: wait until all three nodes are in sync,
SIGKILL the leader, and time until a client that tries every node in turn (aio-pika; 3 s
connect and 8 s confirm timeouts, 0.2 s between attempts) has a publish confirmed again;
the killed node is restarted before the next run. p50 and p99 (nearest rank) of N times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pika

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import cpu_model  # noqa: E402
from benchmarks.perf_process import StreamqServe, default_streamq, run_perf  # noqa: E402
from benchmarks.rabbitmq_cluster import QUORUM_ARGS, RabbitMQCluster  # noqa: E402
from tests.cluster.cluster_nodes import Cluster  # noqa: E402
from tests.cluster.etcd_server import EtcdServer  # noqa: E402
from tests.cluster.node_certs import cluster_files  # noqa: E402
from tests.cluster.workload import Ledger, publish_confirmed  # noqa: E402

SECONDS_DEFAULT: Final = 15
PUBLISHERS_DEFAULT: Final = 4
WINDOW_DEFAULT: Final = 1000
FAILOVERS_DEFAULT: Final = 10
LEASE_TTL_DEFAULT_S: Final = 10  # the product's default, as the target assumes
PERF_SLACK_S: Final = 120.0
IN_SYNC_TIMEOUT_S: Final = 120.0
FAILOVER_TIMEOUT_S: Final = 120.0
PROBE_TIMEOUT_S: Final = 8.0
PROBE_PAUSE_S: Final = 0.2
TARGET_VS_SINGLE: Final = 0.5
TARGET_VS_RABBITMQ: Final = 2.0
TARGET_FAILOVER_P99_S: Final = 15.0


def perf_args(port: int, queue: str, size: int, args: argparse.Namespace) -> list[str]:
    return [
        "throughput", "--uri", f"amqp://guest:guest@127.0.0.1:{port}/%2f",
        "-x", str(args.publishers), "-y", "0", "-s", str(size), "-p",
        "-c", str(args.window), "-z", str(args.seconds), "-u", queue, "-q",
    ]  # fmt: skip


def publish_rate(port: int, queue: str, size: int, args: argparse.Namespace, *extra: str) -> float:
    """msgs/s of one `streamq perf throughput` run (this checkout's, through PYTHONPATH)."""
    summary = run_perf(
        default_streamq(),
        [*perf_args(port, queue, size, args), *extra],
        args.seconds + PERF_SLACK_S,
    )
    rate = summary["avg_pub_rate"]
    assert isinstance(rate, int | float), summary
    return float(rate)


def delete_queue(port: int, queue: str) -> None:
    """What a row published goes, so that the next row and the failover runs start from
    a broker of the same (small) size for every product."""
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=60)
    )
    try:
        connection.channel().queue_delete(queue)
    finally:
        connection.close()


def sizes_rates(port: int, name: str, args: argparse.Namespace, *extra: str) -> dict[str, float]:
    """One row per body size, each into a fresh queue (deleted after); printed as it goes."""
    rates = {}
    for size in args.sizes:
        queue = f"bench-{name}-{size}"
        # The last row's writes reach the disk now, not during this row: without it the
        # second of two clusters run one after the other measured up to 2x slower.
        os.sync()
        rate = publish_rate(port, queue, size, args, *extra)
        delete_queue(port, queue)
        print(f"{name}: {size} B: {rate:,.0f} msgs/s", flush=True)
        rates[str(size)] = rate
    return rates


def run_single(base: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    node = StreamqServe([sys.executable, "-m", "streamq"], base / "single", env=env)
    try:
        return sizes_rates(node.amqp_port, "single", args)
    finally:
        node.stop()


def run_cluster(base: Path, args: argparse.Namespace, what: str) -> object:
    """On a fresh cluster under base/what: the publish rows on the leader ("cluster", or
    "cluster-tls" over TLS replication links), or the failover runs ("failover")."""
    with (
        EtcdServer(base / what / "etcd") as etcd,
        Cluster(base / what, etcd.endpoint, 3, lease_ttl_s=args.lease_ttl) as cluster,
    ):
        if what == "cluster-tls":
            _ca, files = cluster_files(base / what / "certs", len(cluster.nodes))
            for node, node_files in zip(cluster.nodes, files, strict=True):
                node.extra = node_files.flags()
        leader = cluster.start(IN_SYNC_TIMEOUT_S)
        if what in ("cluster", "cluster-tls"):
            return sizes_rates(leader.amqp_port, what, args)
        return failovers(cluster, args.failovers)


def run_rabbitmq(base: Path, args: argparse.Namespace) -> dict[str, float]:
    with RabbitMQCluster(base / "rabbitmq") as cluster:
        port = cluster.nodes[0].amqp_port
        return sizes_rates(port, "rabbitmq", args, "--queue-args", QUORUM_ARGS)


async def confirmed_again(ports: list[int], deadline: float) -> float:
    """Tries each node in turn until a publish is confirmed; the monotonic time it was."""
    ledger, attempt = Ledger(), 0
    while True:
        assert time.monotonic() < deadline, "no confirmed publish before the deadline"
        port = ports[attempt % len(ports)]
        attempt += 1
        try:
            await asyncio.wait_for(
                publish_confirmed(port, range(attempt, attempt + 1), ledger), PROBE_TIMEOUT_S
            )
            return time.monotonic()
        except Exception:
            await asyncio.sleep(PROBE_PAUSE_S)


def failovers(cluster: Cluster, runs: int) -> list[float]:
    """Seconds from SIGKILL of the leader to the next confirmed publish, `runs` times."""
    times = []
    ports = [node.amqp_port for node in cluster.nodes]
    for run in range(runs):
        cluster.wait_in_sync(cluster.nodes, IN_SYNC_TIMEOUT_S)
        leader = cluster.wait_leader(FAILOVER_TIMEOUT_S)
        killed_at = time.monotonic()
        leader.kill()
        back_at = asyncio.run(confirmed_again(ports, killed_at + FAILOVER_TIMEOUT_S))
        times.append(back_at - killed_at)
        print(f"failover {run + 1}: {leader.name} killed, confirms again after "
              f"{times[-1]:.2f} s", flush=True)  # fmt: skip
        leader.start()
    return times


def nearest_rank(values: list[float], percent: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]


def ratio_lines(results: dict[str, object], sizes: list[int]) -> list[str]:
    rates = results.get("cluster")
    lines = []
    for size in map(str, sizes):
        for name, target in (("single", TARGET_VS_SINGLE), ("rabbitmq", TARGET_VS_RABBITMQ)):
            other = results.get(name)
            if isinstance(rates, dict) and isinstance(other, dict):
                ratio = rates[size] / other[size]
                lines.append(f"{size} B: cluster / {name} = {ratio:.2f}x (target >= {target})")
        tls = results.get("cluster-tls")
        if isinstance(rates, dict) and isinstance(tls, dict):
            lines.append(f"{size} B: cluster-tls / cluster = {tls[size] / rates[size]:.2f}x")
    return lines


def failover_line(times: list[float], lease_ttl_s: int) -> str:
    p50, p99 = nearest_rank(times, 50), nearest_rank(times, 99)
    return (
        f"failover ({len(times)} runs, {lease_ttl_s} s lease): p50 {p50:.2f} s, "
        f"p99 {p99:.2f} s, max {max(times):.2f} s (target p99 < {TARGET_FAILOVER_P99_S} s)"
    )


def report(results: dict[str, object], args: argparse.Namespace) -> None:
    for line in ratio_lines(results, args.sizes):
        print(line)
    times = results.get("failover")
    if isinstance(times, list) and times:
        print(failover_line(times, args.lease_ttl))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where the brokers live (a fresh temp dir)")
    parser.add_argument("--seconds", type=int, default=SECONDS_DEFAULT, help="per row")
    parser.add_argument("--publishers", type=int, default=PUBLISHERS_DEFAULT)
    parser.add_argument("--window", type=int, default=WINDOW_DEFAULT, help="unconfirmed max")
    parser.add_argument("--sizes", default="16,1024", help="body sizes in bytes")
    parser.add_argument("--failovers", type=int, default=FAILOVERS_DEFAULT)
    parser.add_argument("--lease-ttl", type=int, default=LEASE_TTL_DEFAULT_S)
    parser.add_argument("--only", default="single,cluster,rabbitmq,failover")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    args.sizes = [int(size) for size in args.sizes.split(",")]
    args.only = args.only.split(",")  # the clusters run in this order
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)  # a refused connect is expected
    logging.getLogger("aio_pika").setLevel(logging.CRITICAL)
    os.environ["PYTHONPATH"] = str(ROOT)  # the perf tool and brokers of this checkout
    base = args.dir or Path(tempfile.mkdtemp(prefix="cluster-compare-"))
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} "
        f"{platform.release()}; persistent messages, confirms (window {args.window}), "
        f"{args.publishers} publishers, {args.seconds} s per row; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        flush=True,
    )
    results: dict[str, object] = {}
    runs: dict[str, Callable[[Path, argparse.Namespace], object]] = {
        "single": run_single,
        "rabbitmq": run_rabbitmq,
    }
    for name, run in runs.items():
        if name in args.only:
            results[name] = run(base, args)
    for what in args.only:
        if what in ("cluster", "cluster-tls", "failover"):
            results[what] = run_cluster(base, args, what)
    report(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
