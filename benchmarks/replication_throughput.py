"""Replication throughput: how fast a follower applies the leader's action stream with
fsync (issue 22, streamq/cluster/follower.py).

An in-process leader (a real FileTap and ReplicationServer on a loopback port) and one
follower (a ReplicationClient into a temporary directory). Once the follower is synced,
the tap records N MiB of segment appends (WRITE actions of --write-kib each, a new 64 MiB
file every 64 MiB, as the log rolls segments) while the follower streams, applies with an
ActionApplier and fdatasyncs each group before acking. Prints MB/s of actions applied and
acked, and how many acks (group commits) that took. The leader does not write its own
files here: what is measured is the stream, the follower's disk and its fsyncs.

  .venv/bin/python benchmarks/replication_throughput.py --mib 512 --dir /var/tmp

With --tls the link is mutual TLS (`--clustering-tls-*`'s contexts, P-256 certificates
from tests/cluster/node_certs.py) and both ends run on uvloop, as the broker does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvloop

from streamq.app import ServeConfig
from streamq.cluster.follower import ReplicationClient
from streamq.cluster.leader import ReplicationServer
from streamq.cluster.link_tls import LinkTls, link_tls
from streamq.log.tap import FileTap
from tests.cluster.node_certs import cluster_files

SEGMENT_BYTES = 64 << 20
TIMEOUT_S = 600.0


class _Store:
    async def set_isr(self, ids: frozenset[str]) -> bool:
        return True


def make_tls(base: Path) -> LinkTls:
    _ca, (files,) = cluster_files(base / "certs", 1)
    config = ServeConfig(
        clustering_tls_cert=str(files.cert),
        clustering_tls_key=str(files.key),
        clustering_tls_ca=str(files.ca),
    )
    tls = link_tls(config)
    assert tls is not None
    return tls


async def measure(
    base: Path, total_bytes: int, write_bytes: int, tls: LinkTls | None = None
) -> tuple[float, int]:
    leader_dir, follower_dir = base / "leader", base / "follower"
    leader_dir.mkdir()
    tap = FileTap(str(leader_dir), retain_bytes_max=total_bytes + (64 << 20))
    server = ReplicationServer(tap, "leader", "secret", _Store(), lease_valid=lambda: True,
                               tls=tls.server if tls else None)  # fmt: skip
    port = await server.start("127.0.0.1", 0)
    client = ReplicationClient(str(follower_dir), "f", "secret", f"tcp://127.0.0.1:{port}",
                               tls.client if tls else None)  # fmt: skip
    task = asyncio.create_task(client.run())
    acks = 0
    try:
        while not client.synced:
            await asyncio.sleep(0.01)
        data = os.urandom(write_bytes)
        started = time.perf_counter()
        for at in range(0, total_bytes, write_bytes):
            segment = at // SEGMENT_BYTES
            tap.write(str(leader_dir / f"log/{segment:08d}.seg"), at % SEGMENT_BYTES, data)
            if at % (4 << 20) == 0:
                await asyncio.sleep(0)  # let the stream go out while recording
        end, last = tap.position, client.acked
        while client.acked < end:
            if client.acked != last:
                acks, last = acks + 1, client.acked
            assert time.perf_counter() - started < TIMEOUT_S, "follower did not catch up"
            await asyncio.sleep(0.001)
        return time.perf_counter() - started, acks
    finally:
        client.stop()
        await task
        await server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="stream bytes to replicate")
    parser.add_argument("--write-kib", type=int, default=64, help="bytes per WRITE action")
    parser.add_argument("--dir", default=None, help="where the two data dirs go")
    parser.add_argument("--tls", action="store_true", help="over mutual TLS (on uvloop)")
    args = parser.parse_args()
    total = args.mib << 20
    with tempfile.TemporaryDirectory(dir=args.dir) as base:
        if args.tls:
            tls = make_tls(Path(base))
            run = measure(Path(base), total, args.write_kib << 10, tls)
            seconds, acks = uvloop.run(run)
        else:
            seconds, acks = asyncio.run(measure(Path(base), total, args.write_kib << 10))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus")
    link = "mutual TLS, uvloop" if args.tls else "clear text, asyncio"
    print(f"directory: {args.dir or tempfile.gettempdir()} (fdatasync per group); {link}")
    print(f"replicated {args.mib} MiB in {args.write_kib} KiB writes: {seconds:.2f} s")
    print(f"  {total / seconds / 1e6:.1f} MB/s applied with fsync, ~{acks} acks seen")


if __name__ == "__main__":
    main()
