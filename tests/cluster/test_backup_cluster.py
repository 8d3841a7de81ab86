"""`streamq ctl backup` in a cluster: asked of a follower, the leader takes it (the follower
forwards the management API); replication goes on through it, since the backup's tap
passes every change on to the leader's; the copy starts as a standalone broker with every
message confirmed before the backup, and without the node's own files.

Method: two `streamq serve --clustering` processes and a real etcd (tests/cluster/), pika
publishing with confirms (a confirm needs the follower's ack) before and during the
backup, the real `streamq ctl`. Then the leader is SIGKILLed: the follower, now leader,
must have every message confirmed (a backup tap that kept changes from the leader's would
lose those made during the backup there).
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pika

from tests.cluster.cluster_nodes import Cluster, ClusterNode
from tests.cluster.etcd_server import EtcdServer
from tests.integration.broker_process import BrokerProcess, streamq

TIMEOUT_S = 30.0
QUEUE = "orders"


def publish_confirmed(
    node: ClusterNode, first: int, count: int, confirmed: list[int] | None = None
) -> None:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(node.address, node.amqp_port, blocked_connection_timeout=30)
    )
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(QUEUE, durable=True)
    for n in range(first, first + count):
        channel.basic_publish("", QUEUE, b"%d" % n)
        if confirmed is not None:
            confirmed.append(n)
    connection.close()


def drain(host: str, port: int) -> list[int]:
    connection = pika.BlockingConnection(pika.ConnectionParameters(host, port))
    channel = connection.channel()
    bodies = []
    while (got := channel.basic_get(QUEUE, auto_ack=True))[0] is not None:
        bodies.append(int(got[2]))
    connection.close()
    return bodies


def test_a_backup_asked_of_a_follower_is_taken_by_the_leader(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    with Cluster(tmp_path / "cluster", etcd.endpoint, size=2) as cluster:
        leader = cluster.start()
        follower = cluster.nodes[1]
        publish_confirmed(leader, 0, 200)
        target = tmp_path / "backup"
        confirmed: list[int] = []
        during = threading.Thread(target=publish_confirmed, args=(leader, 200, 300, confirmed))
        during.start()
        uri = f"http://guest:guest@127.0.0.1:{follower.http_port}"
        done = subprocess.run(streamq("ctl", "backup", str(target)), capture_output=True,
                              env={**os.environ, "STREAMQ_CTL_URI": uri}, timeout=120,
                              check=False)  # fmt: skip
        during.join(TIMEOUT_S)
        assert not during.is_alive() and confirmed == list(range(200, 500))
        assert done.returncode == 0, done.stderr
        assert f"Backed up {leader.data_dir}".encode() in done.stdout, done.stdout
        leader.kill()
        new = cluster.wait_leader(TIMEOUT_S, (leader,))
        assert new is follower
        assert drain(follower.address, follower.amqp_port) == list(range(500))
    assert not (target / ".clustering_id").exists()
    restored = BrokerProcess(target)
    try:
        bodies = drain("127.0.0.1", restored.amqp_port)
    finally:
        restored.stop()
    assert bodies[:200] == list(range(200))  # and what was confirmed during it, maybe
    assert bodies == list(range(len(bodies)))
