"""No split brain: a leader SIGSTOPped past its lease, while the others elect a new leader,
must not confirm anything it is sent meanwhile once it runs again (SIGCONT), and rejoins
as a follower. A client stays connected straight to the stopped leader's AMQP port (no
follower in between) with publishes waiting in its socket: the case fencing exists for."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import aio_pika
import pytest

from tests.cluster.cluster_nodes import Cluster
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.workload import (
    Ledger,
    acked,
    check_ledger,
    drain,
    publish_confirmed,
    publish_pending,
)

LEASE_TTL_S = 3
TAKEOVER_TIMEOUT_S = LEASE_TTL_S + 10.0
AFTER_RESUME_S = LEASE_TTL_S + 5.0  # how long the resumed node gets to (wrongly) confirm
REJOIN_TIMEOUT_S = 30.0
BEFORE = 100  # confirmed before the stop
DURING = 50  # sent to the stopped leader
AFTER = 100  # confirmed by the new leader


@pytest.mark.timeout(180)
async def test_a_stopped_leader_confirms_nothing_and_rejoins_as_follower(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    with Cluster(tmp_path / "cluster", etcd.endpoint, 3, lease_ttl_s=LEASE_TTL_S) as cluster:
        old = await asyncio.to_thread(cluster.start)
        ledger = Ledger()
        await publish_confirmed(old.amqp_port, range(BEFORE), ledger)
        # No heartbeats: the client must still be connected when the old leader wakes up.
        connection = await aio_pika.connect(
            f"amqp://guest:guest@127.0.0.1:{old.amqp_port}/?heartbeat=0", timeout=5
        )
        channel = await connection.channel(publisher_confirms=True)
        old.pause()
        stopped_at = time.monotonic()
        pending = [
            asyncio.create_task(publish_pending(channel, i)) for i in range(BEFORE, BEFORE + DURING)
        ]
        new = await asyncio.to_thread(cluster.wait_leader, TAKEOVER_TIMEOUT_S, (old,))
        print(f"{new.name} serves {time.monotonic() - stopped_at:.2f} s after SIGSTOP")
        await publish_confirmed(
            new.amqp_port, range(BEFORE + DURING, BEFORE + DURING + AFTER), ledger
        )
        old.resume()
        done, _ = await asyncio.wait(pending, timeout=AFTER_RESUME_S)
        confirmed = [task for task in done if acked(task)]
        assert not confirmed, (
            f"the stopped leader confirmed {len(confirmed)} messages after SIGCONT"
        )
        for task in pending:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.close(), 2)
        await asyncio.to_thread(
            cluster.wait_for,
            lambda: old.role() == "follower",
            REJOIN_TIMEOUT_S,
            "old leader following",
        )
        await asyncio.to_thread(cluster.wait_in_sync, cluster.nodes, REJOIN_TIMEOUT_S)
        rows = {row["node_id"]: row for row in cluster.api_nodes()}
        assert rows[old.node_id]["cluster_role"] == "follower"
        assert rows[new.node_id]["cluster_role"] == "leader"
        assert cluster.leader() is new
        await drain(new.amqp_port, ledger)
        check_ledger(ledger)
