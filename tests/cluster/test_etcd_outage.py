"""etcd unavailable (SIGSTOP, sockets open, no answers) while a follower is also down: the
leader cannot write the smaller in-sync set that would let it confirm without that
follower, so a publish's confirm must wait rather than go out unreplicated; and as its lease
cannot be kept alive, the leader steps down within the lease TTL plus a few seconds. Once
etcd is back the cluster elects a leader again with every confirmed message."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aio_pika
import pytest

from tests.cluster.cluster_nodes import Cluster
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.workload import (
    QUEUE,
    Ledger,
    acked,
    check_ledger,
    drain,
    publish_confirmed,
    publish_pending,
)

LEASE_TTL_S = 3
STEP_DOWN_BOUND_S = LEASE_TTL_S + 5.0
RECOVER_TIMEOUT_S = 45.0
BEFORE = 100


@pytest.mark.timeout(180)
async def test_confirms_wait_while_etcd_is_down_and_the_leader_steps_down(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    with Cluster(tmp_path / "cluster", etcd.endpoint, 3, lease_ttl_s=LEASE_TTL_S) as cluster:
        leader = await asyncio.to_thread(cluster.start)
        ledger = Ledger()
        await publish_confirmed(leader.amqp_port, range(BEFORE), ledger)
        connection = await aio_pika.connect(
            f"amqp://guest:guest@127.0.0.1:{leader.amqp_port}/?heartbeat=0", timeout=5
        )
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(QUEUE, durable=True)
        follower = next(node for node in cluster.nodes if node is not leader)
        etcd.pause()
        try:
            paused_at = time.monotonic()
            await asyncio.to_thread(follower.kill)
            pending = asyncio.create_task(publish_pending(channel, BEFORE))
            await asyncio.to_thread(
                cluster.wait_for,
                lambda: leader.role() != "leader",
                STEP_DOWN_BOUND_S,
                "step-down of the leader cut off from etcd",
            )
            took_s = time.monotonic() - paused_at
            print(f"{leader.name} stepped down {took_s:.2f} s after etcd stopped")
            await asyncio.wait([pending], timeout=1.0)
            assert not acked(pending), "confirmed with a follower down and etcd unreachable"
            pending.cancel()
        finally:
            etcd.resume()
        follower.start()
        leader_again = await asyncio.to_thread(cluster.wait_leader, RECOVER_TIMEOUT_S)
        print(f"{leader_again.name} leads {time.monotonic() - paused_at:.2f} s after etcd stopped")
        await publish_to_leader(cluster, range(BEFORE + 1, BEFORE + 11), ledger)
        await drain_from_leader(cluster, ledger)
        check_ledger(ledger)


async def publish_to_leader(cluster: Cluster, ids: range, ledger: Ledger) -> None:
    """Publish `ids`, each confirmed, to whichever node leads. As for the drain below, the
    leadership may move once more right after the outage: the node answering 506 ("no
    longer the cluster leader") closes the connection, and this publishes again to the new
    leader, under ids not used before (a message of the cut attempt may be stored without
    its confirm: the same id again would be a second message, not a redelivery). What was
    confirmed stays in the ledger and must survive; the bound is RECOVER_TIMEOUT_S."""
    deadline = time.monotonic() + RECOVER_TIMEOUT_S
    while True:
        leader = await asyncio.to_thread(cluster.wait_leader, RECOVER_TIMEOUT_S)
        try:
            await publish_confirmed(leader.amqp_port, ids, ledger)
            return
        except (aio_pika.exceptions.AMQPConnectionError, ConnectionError):
            assert time.monotonic() < deadline, "no confirmed publish within the recovery bound"
            print(f"{leader.name} stopped leading during the publish; again from the new leader")
            ids = range(ids.stop + len(ids), ids.stop + 2 * len(ids))


async def drain_from_leader(cluster: Cluster, ledger: Ledger) -> None:
    """Drain the queue from whichever node leads: right after an outage the leadership
    may move once more (a node elected as etcd came back may lose its lease to the
    others' campaigns), closing the drain's connection with 320; a client reconnects to
    the new leader, and so does this (bounded). Acked messages stay acked: a second
    drain gets what the first had not."""
    deadline = time.monotonic() + RECOVER_TIMEOUT_S
    while True:
        leader = await asyncio.to_thread(cluster.wait_leader, RECOVER_TIMEOUT_S)
        try:
            await drain(leader.amqp_port, ledger)
            return
        except (aio_pika.exceptions.AMQPConnectionError, ConnectionError):
            assert time.monotonic() < deadline, "no drain within the recovery bound"
            print(f"{leader.name} stopped leading during the drain; again from the new leader")
