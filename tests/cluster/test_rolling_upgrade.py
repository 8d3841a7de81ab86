"""A rolling upgrade of a three-node cluster under load (issue 34, item 2): every node
starts on the released streamq the upgrade fixtures come from (tests/upgrade/data,
version 0.1.0 at commit OLD_COMMIT, its source taken from this repository's history and
its C modules built), then the followers are restarted one at a time on this checkout,
then the old leader is stopped (a failover to an upgraded follower) and restarted on this
checkout too. A publisher with confirms and a consumer that acks run throughout, both
reconnecting to any node. Not one confirmed message may be lost, a message delivered
again must be flagged redelivered, and the workload must make progress between every
two steps. Which code a node runs is read from the C modules its process mapped
(/proc/PID/maps), not assumed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Final

import pytest

from tests.cluster.cluster_nodes import ROOT, Cluster, ClusterNode
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.workload import (
    Ledger,
    check_ledger,
    drain,
    start_workload,
    stop_workload,
    wait_confirms_after,
)

OLD_VERSION: Final = "0.1.0"
OLD_COMMIT: Final = "85ad199e5d"  # tests/upgrade/data/0.1.0-85ad199e5d-*.tar.gz
BUILD_TIMEOUT_S: Final = 300
LEASE_TTL_S: Final = 3
IN_SYNC_TIMEOUT_S: Final = 60.0
LEADER_TIMEOUT_S: Final = LEASE_TTL_S + 20.0
PROGRESS_TIMEOUT_S: Final = 20.0
STOP_WORKLOAD_S: Final = 15.0
C_MODULE: Final = "_records.cpython"  # streamq/log's C module: mapped by every node


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OLD_COMMIT's source tree with its C modules built in place."""
    tree = tmp_path_factory.mktemp(f"streamq-{OLD_VERSION}")
    archive = tree / "source.tar"
    result = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), OLD_COMMIT],
        check=False,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert result.returncode == 0, (
        f"the rolling upgrade needs streamq {OLD_VERSION} ({OLD_COMMIT}) from this "
        f"repository's history (a full clone): git archive said {result.stderr.strip()}"
    )
    with tarfile.open(archive) as source:
        source.extractall(tree, filter="data")
    archive.unlink()
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree,
        check=True,
        capture_output=True,
        timeout=BUILD_TIMEOUT_S,
    )
    return tree


def runs_code_of(node: ClusterNode) -> Path:
    """The tree whose C module the node's process has mapped."""
    for line in Path(f"/proc/{node.pid}/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[-1]
        if C_MODULE in path:
            return Path(path).resolve().parents[2]  # <tree>/streamq/log/_records...so
    raise AssertionError(f"{node.name} (pid {node.pid}) has no {C_MODULE} mapped")


async def wait_started(cluster: Cluster, node: ClusterNode) -> None:
    """Until `node` is running (its C modules loaded) and the whole cluster is in sync."""
    await asyncio.to_thread(cluster.wait_in_sync, cluster.nodes, IN_SYNC_TIMEOUT_S)
    assert node.alive, f"{node.name} exited\n{node.log_tail()}"


async def wait_progress(ledger: Ledger, what: str) -> None:
    """Until a message published from now on is confirmed (bounded)."""
    await wait_confirms_after(ledger, time.monotonic(), PROGRESS_TIMEOUT_S, what)


async def upgrade(cluster: Cluster, node: ClusterNode, ledger: Ledger) -> None:
    """Stops `node` (SIGTERM), restarts it on this checkout, waits for the cluster to be
    in sync again and for the workload to go on."""
    await asyncio.to_thread(node.stop)
    node.code_root = ROOT
    node.start()
    await wait_started(cluster, node)
    assert runs_code_of(node) == ROOT.resolve()
    await wait_progress(ledger, f"after {node.name} was upgraded")
    print(f"{node.name} upgraded: {len(ledger.confirmed)} confirmed so far")


@pytest.mark.timeout(300)
async def test_a_rolling_upgrade_under_load_loses_no_confirmed_message(
    etcd: EtcdServer, tmp_path: Path, old_tree: Path
) -> None:
    with Cluster(tmp_path / "cluster", etcd.endpoint, 3, lease_ttl_s=LEASE_TTL_S) as cluster:
        for node in cluster.nodes:
            node.code_root = old_tree
        leader = await asyncio.to_thread(cluster.start)
        assert {runs_code_of(node) for node in cluster.nodes} == {old_tree.resolve()}
        ledger, stop, tasks = start_workload(lambda: [node.amqp_port for node in cluster.nodes])
        try:
            await wait_progress(ledger, f"on {OLD_VERSION}")
            for follower in [node for node in cluster.nodes if node is not leader]:
                await upgrade(cluster, follower, ledger)
            old_leader = leader
            await asyncio.to_thread(old_leader.stop)
            leader = await asyncio.to_thread(cluster.wait_leader, LEADER_TIMEOUT_S, (old_leader,))
            assert runs_code_of(leader) == ROOT.resolve()
            await wait_progress(ledger, f"after the failover to {leader.name}")
            old_leader.code_root = ROOT
            old_leader.start()
            await wait_started(cluster, old_leader)
            await wait_progress(ledger, "with every node upgraded")
        finally:
            await stop_workload(tasks, stop, STOP_WORKLOAD_S)
        assert {runs_code_of(node) for node in cluster.nodes} == {ROOT.resolve()}
        leader = await asyncio.to_thread(cluster.wait_leader, LEADER_TIMEOUT_S)
        drained = await drain(leader.amqp_port, ledger)
        print(
            f"rolling upgrade {OLD_VERSION} -> this checkout: {ledger.published} published, "
            f"{len(ledger.confirmed)} confirmed, {len(ledger.deliveries)} delivered "
            f"({drained} drained at the end), {ledger.reconnects} reconnects"
        )
        check_ledger(ledger)
