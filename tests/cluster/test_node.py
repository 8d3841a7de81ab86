"""A cluster node as operators and clients see it: two `streamq serve --clustering`
processes and a real etcd on loopback.

Goal: the first node leads and the second follows; a client on the follower's AMQP port
is served by the leader, which shows the client's own address (PROXY v1 from the
follower); HTTP through the follower answers; /api/nodes, `streamq ctl cluster_status`
and /metrics show both nodes, their roles and the ISR; the leadership hooks run; a leader
stopped with SIGTERM resigns, so the follower takes over well before the lease TTL.
Method: tests/cluster/cluster_nodes.py's processes (each signalled by its own pid),
clients from this process, every wait bounded.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pika
import pytest

from tests.cluster.cluster_nodes import ROOT, Cluster, ClusterNode, http_json
from tests.cluster.etcd_server import EtcdServer
from tests.integration.test_transports import raw_handshake

TIMEOUT_S = 30.0
HOOK_SUFFIX = "-elected"


def hooks(directory: Path) -> tuple[str, ...]:
    """Hooks that leave a file named after the node that ran them."""
    elected = f'echo "$STREAMQ_LEADER_URI" > {directory}/"$STREAMQ_NODE_ID"{HOOK_SUFFIX}'
    lost = f'touch {directory}/"$STREAMQ_NODE_ID"-lost'
    return ("--clustering-on-leader-elected", elected, "--clustering-on-leader-lost", lost)


def wait_until(check: object, what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]  # a callable
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def ctl(node: ClusterNode, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "streamq", "ctl", "--uri", f"http://127.0.0.1:{node.http_port}",
         *args],
        capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.timeout(120)
def test_two_nodes_leader_and_follower(etcd: EtcdServer, tmp_path: Path) -> None:
    marks = tmp_path / "hooks"
    marks.mkdir()
    with Cluster(tmp_path / "c", etcd.endpoint, 2, extra=hooks(marks)) as cluster:
        leader = cluster.start()
        follower = cluster.nodes[1]
        assert follower.role() == "follower"
        assert b"clustering: following leader " + leader.node_id.encode() in follower.log()

        # AMQP through the follower, with the client's own address at the leader.
        with socket.create_connection(("127.0.0.1", follower.amqp_port), TIMEOUT_S) as sock:
            client_port = sock.getsockname()[1]
            raw_handshake(sock)
            listed = http_json(leader.http_port, "/api/connections")
            assert [(c["peer_host"], c["peer_port"]) for c in listed] == [
                ("127.0.0.1", client_port)
            ]
            assert listed[0]["port"] == follower.amqp_port  # the address the client dialled

        # A publisher with confirms through the follower; the leader has the messages.
        connection = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", follower.amqp_port, socket_timeout=TIMEOUT_S)
        )
        # The server properties name the node that serves it: the leader.
        assert connection._impl.server_properties["node"] == f"streamq@{leader.node_id}"
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("through", durable=True)
        for i in range(100):
            channel.basic_publish("", "through", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        connection.close()
        queue = http_json(leader.http_port, "/api/queues/%2F/through")
        assert queue["messages"] == 100

        # HTTP through the follower is the leader's API.
        assert follower.api("/api/overview")["node"] == f"streamq@{leader.node_id}"

        nodes = {entry["node_id"]: entry for entry in follower.api("/api/nodes")}
        assert set(nodes) == {leader.node_id, follower.node_id}
        assert nodes[leader.node_id]["cluster_role"] == "leader"
        assert nodes[leader.node_id]["state"] == "serving"
        assert nodes[leader.node_id]["mem_used"] > 0  # RabbitMQ's fields for the leader
        assert nodes[follower.node_id]["cluster_role"] == "follower"
        assert nodes[follower.node_id]["state"] == "streaming"
        assert all(entry["in_isr"] for entry in nodes.values())
        assert nodes[follower.node_id]["replication_lag_seconds"] < 5

        lines = ctl(follower, "cluster_status").splitlines()
        assert lines[0].split() == ["name", "role", "in_isr", "state", "lag_bytes", "lag_s"]
        rows = {line.split()[0]: line.split() for line in lines[1:]}
        assert rows[f"streamq@{leader.node_id}"][1:4] == ["leader", "true", "serving"]
        assert rows[f"streamq@{follower.node_id}"][1:4] == ["follower", "true", "streaming"]
        as_json = json.loads(ctl(follower, "cluster_status", "--format", "json"))
        assert {row["role"] for row in as_json} == {"leader", "follower"}

        with urllib.request.urlopen(
            f"http://127.0.0.1:{leader.http_port}/metrics", timeout=TIMEOUT_S
        ) as response:
            metrics = response.read().decode()
        assert "streamq_cluster_isr_size 2\n" in metrics
        assert "streamq_cluster_followers 1\n" in metrics
        assert f'streamq_cluster_follower_lag_bytes{{node="{follower.node_id}"}}' in metrics

        elected = marks / f"{leader.node_id}{HOOK_SUFFIX}"
        wait_until(elected.exists, "the on_leader_elected hook")
        assert elected.read_text().strip() == f"tcp://127.0.0.1:{leader.clustering_port}"
        assert not (marks / f"{follower.node_id}{HOOK_SUFFIX}").exists()


@pytest.mark.timeout(120)
def test_a_leader_stopped_with_sigterm_resigns(etcd: EtcdServer, tmp_path: Path) -> None:
    """With a 10 s lease, a follower serving within a few seconds of the SIGTERM shows
    that the leader resigned rather than letting its lease expire."""
    marks = tmp_path / "hooks"
    marks.mkdir()
    with Cluster(tmp_path / "c", etcd.endpoint, 2, lease_ttl_s=10, extra=hooks(marks)) as cluster:
        leader = cluster.start()
        follower = cluster.nodes[1]
        started = time.monotonic()
        leader.stop()
        assert leader.process is not None and leader.process.returncode == 0
        assert b"clustering: lost leadership: shutdown" in leader.log()
        assert (marks / f"{leader.node_id}-lost").exists()
        cluster.wait_leader(TIMEOUT_S, exclude=(leader,))
        took = time.monotonic() - started
        assert cluster.leader() is follower
        assert took < 8, f"the follower took {took:.1f} s: the leader did not resign"
        wait_until((marks / f"{follower.node_id}{HOOK_SUFFIX}").exists, "the new leader's hook")


@pytest.mark.timeout(60)
def test_without_etcd_no_client_port_opens_and_sigterm_stops(tmp_path: Path) -> None:
    """etcd unreachable at start: the node keeps retrying, listens on no client port
    (a client is refused at once, not left hanging), and stops promptly on SIGTERM."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{unused.getsockname()[1]}"  # bound, never listening
    node = ClusterNode("alone", tmp_path / "alone", nowhere)
    node.start()
    try:
        wait_until(lambda: b"clustering: etcd unavailable" in node.log(), "the retry log line")
        for port in (node.amqp_port, node.http_port):
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), TIMEOUT_S).close()
        assert node.alive
        started = time.monotonic()
        node.stop()
        assert time.monotonic() - started < 10
        assert node.process is not None and node.process.returncode == 0
    finally:
        node.stop()
