"""Health and readiness in a real two-node cluster (etcd, two `streamq serve --clustering`
processes). The leader is quorum-critical exactly while it has durable queues and no
other in-sync replica is connected to take over: alone at first, ok once the follower
streams, 503 naming every durable queue (not the transient one) once it stops. The
follower, started with a real NOTIFY_SOCKET, reports itself to systemd as such: READY=1
once it forwards, with a STATUS= line naming the leader, and STOPPING=1 at SIGTERM.
"""

from __future__ import annotations

import json
import socket
import tempfile
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cluster_nodes import START_TIMEOUT_S, Cluster, ClusterNode
from tests.cluster.etcd_server import EtcdServer

CHECK = "/api/health/checks/node-is-quorum-critical"
MIRROR_CRITICAL = "There are classic mirrored queues without online synchronised mirrors"
CRITICAL = "There are quorum queues that would lose their quorum if the target node is shut down"


def check(node: ClusterNode, path: str = CHECK) -> tuple[int, Any]:
    try:
        return 200, node.api(path)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def notifications(sock: socket.socket, until_line: str) -> list[str]:
    """Lines received until one equal to `until_line` (included)."""
    lines: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT_S
    while until_line not in lines:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        lines += sock.recv(4096).decode().split("\n")
    return lines


def test_quorum_critical_and_a_follower_notifying_systemd(
    tmp_path: Path, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        Cluster(tmp_path / "cluster", etcd.endpoint, size=2) as cluster,
        tempfile.TemporaryDirectory(prefix="sdn-", dir="/tmp") as directory,
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock,
    ):
        leader, follower = cluster.nodes
        critical = {
            "status": "failed",
            "reason": CRITICAL,
            "queues": [
                {
                    "readable_name": "queue 'kept' in vhost '/'",
                    "name": "kept",
                    "virtual_host": "/",
                    "type": "classic",
                }
            ],
        }
        leader.start()
        cluster.wait_leader(START_TIMEOUT_S)
        assert check(leader) == (200, {"status": "ok"})  # nothing to lose yet
        leader.api("/api/queues/%2F/kept", "PUT", {"durable": True})
        leader.api("/api/queues/%2F/transient", "PUT", {"durable": False})
        assert check(leader) == (503, critical)  # alone: no replica would take over
        address = str(Path(directory) / "notify")
        sock.bind(address)
        monkeypatch.setenv("NOTIFY_SOCKET", address)  # the follower's environment only
        follower.start()
        lines = notifications(sock, "READY=1")
        status = next(line for line in lines if line.startswith("STATUS=cluster follower"))
        assert f"forwarding to leader {leader.node_id}" in status, lines
        cluster.wait_in_sync(cluster.nodes, START_TIMEOUT_S)
        assert check(leader) == (200, {"status": "ok"})
        assert check(follower) == (200, {"status": "ok"})  # forwarded: the leader answers
        follower.stop()
        assert "STOPPING=1" in notifications(sock, "STOPPING=1")
        cluster.wait_for(lambda: check(leader)[0] == 503, START_TIMEOUT_S, "a critical leader")
        assert check(leader) == (503, critical)
        mirrors = check(leader, "/api/health/checks/node-is-mirror-sync-critical")
        assert mirrors == (503, {**critical, "reason": MIRROR_CRITICAL})
