"""Catching up: a follower SIGKILLed and restarted under load gets back into the in-sync
set; a new node with an empty data directory joins a running cluster and becomes in sync.
Each is then proven to hold everything: the other nodes are stopped or killed so that it is
the only one left to lead, and every confirmed message and durable entity is there."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aio_pika
import pytest

from tests.cluster.cluster_nodes import Cluster, ClusterNode
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.workload import (
    Ledger,
    Publisher,
    check_ledger,
    drain,
    start_workload,
    stop_workload,
)

LEASE_TTL_S = 3
IN_SYNC_TIMEOUT_S = 45.0
TAKEOVER_TIMEOUT_S = LEASE_TTL_S + 15.0
LOAD_S = 2.0
STOP_WORKLOAD_S = 15.0


async def load_for(seconds: float, ledger: Ledger, before: float) -> None:
    """Sleeps `seconds`, then checks that confirms kept coming during them."""
    await asyncio.sleep(seconds)
    assert ledger.last_confirm_at > before, "no confirm while under load"


def only_survivor_leads(cluster: Cluster, survivor: ClusterNode) -> ClusterNode:
    """Stops every other follower (SIGTERM), kills the leader: `survivor`, in sync, must
    take over with everything; returns the new leader."""
    leader = cluster.wait_leader(TAKEOVER_TIMEOUT_S)
    assert leader is not survivor
    for node in cluster.nodes:
        if node not in (leader, survivor):
            node.stop()
    leader.kill()
    return cluster.wait_leader(TAKEOVER_TIMEOUT_S, (leader,))


@pytest.mark.timeout(240)
async def test_a_killed_follower_catches_up_under_load(etcd: EtcdServer, tmp_path: Path) -> None:
    with Cluster(tmp_path / "cluster", etcd.endpoint, 3, lease_ttl_s=LEASE_TTL_S) as cluster:
        leader = await asyncio.to_thread(cluster.start)
        ledger, stop, tasks = start_workload(lambda: [node.amqp_port for node in cluster.nodes])
        try:
            follower = next(node for node in cluster.nodes if node is not leader)
            await load_for(LOAD_S, ledger, time.monotonic())
            await asyncio.to_thread(follower.kill)
            await load_for(LOAD_S, ledger, time.monotonic())  # confirms go on without it
            follower.start()
            started = time.monotonic()
            await asyncio.to_thread(cluster.wait_in_sync, cluster.nodes, IN_SYNC_TIMEOUT_S)
            print(f"{follower.name} back in sync {time.monotonic() - started:.2f} s after restart")
            await load_for(LOAD_S, ledger, time.monotonic())
        finally:
            await stop_workload(tasks, stop, STOP_WORKLOAD_S)
        assert await asyncio.to_thread(only_survivor_leads, cluster, follower) is follower
        await drain(follower.amqp_port, ledger)
        print(f"{len(ledger.confirmed)} confirmed, {len(ledger.deliveries)} delivered")
        check_ledger(ledger)


@pytest.mark.timeout(240)
async def test_a_new_empty_node_joins_and_becomes_in_sync(etcd: EtcdServer, tmp_path: Path) -> None:
    with Cluster(tmp_path / "cluster", etcd.endpoint, 3, lease_ttl_s=LEASE_TTL_S) as cluster:
        leader = await asyncio.to_thread(cluster.start)
        connection = await aio_pika.connect(leader.url, timeout=5)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            await channel.declare_exchange("orders", aio_pika.ExchangeType.TOPIC, durable=True)
        ports = lambda: [node.amqp_port for node in cluster.nodes]  # noqa: E731
        ledger, stop = Ledger(), asyncio.Event()
        tasks = [asyncio.create_task(Publisher(ports, ledger).run(stop))]
        try:
            await load_for(LOAD_S, ledger, time.monotonic())
            joined = cluster.add_node()
            started = time.monotonic()
            await asyncio.to_thread(cluster.wait_in_sync, cluster.nodes, IN_SYNC_TIMEOUT_S)
            print(f"{joined.name} in sync {time.monotonic() - started:.2f} s after it started")
            await load_for(LOAD_S, ledger, time.monotonic())
        finally:
            await stop_workload(tasks, stop, STOP_WORKLOAD_S)
        assert await asyncio.to_thread(only_survivor_leads, cluster, joined) is joined
        connection = await aio_pika.connect(joined.url, timeout=5)
        async with connection:
            channel = await connection.channel()
            await channel.declare_exchange("orders", passive=True)  # the durable entity is there
        await drain(joined.amqp_port, ledger)
        print(f"{len(ledger.confirmed)} confirmed, all found on {joined.name}")
        check_ledger(ledger)
