"""Full disks in a cluster, with a real etcd and `streamq serve --clustering` nodes, a
node's data directory on a small tmpfs (tests/small_fs.py) filled by the test:

- a follower whose disk fills while the leader takes confirmed publishes: its replication
  fails (ENOSPC, logged), the connection ends and is tried again every second; the
  leader drops it from the ISR after its ack timeout and goes on confirming; once room
  returns the follower catches up with no restart, is in sync again, and holds every
  confirmed message (it takes over when the leader stops, and serves them all);
- a node's first start with no room for its node id (ENOSPC on that file alone, by the
  LD_PRELOAD shim tests/eio_shim.c): held, tried again every second with a log line, and
  it starts once there is room.
"""

from __future__ import annotations

import errno
import threading
import time
from pathlib import Path

import pika
import pytest

from tests.cluster.cluster_nodes import Cluster, ClusterNode
from tests.cluster.etcd_server import EtcdServer
from tests.eio_shim import EioShim
from tests.small_fs import fill, small_filesystem

LEASE_TTL_S = 3
SMALL_FS = "64m"
ROOM_LEFT_BYTES = 2 << 20
BODY = b"x" * (128 << 10)
MESSAGES = 64  # 8 MiB: four times the room the follower has left
AFTER = 8  # published once the follower is back
TIMEOUT_S = 60.0
NO_SPACE = b"No space left on device"


def wait_log(node: ClusterNode, text: bytes, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in node.log():
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{node.log_tail()}"
        time.sleep(0.1)


def publish(node: ClusterNode, first: int, count: int) -> None:
    """Publish `count` durable messages to "q" through `node`, each confirmed; a watchdog
    kills the node if they are not all confirmed within TIMEOUT_S (pika would wait on)."""
    watchdog = threading.Timer(TIMEOUT_S, node.kill)
    watchdog.start()
    try:
        connection = pika.BlockingConnection(pika.URLParameters(node.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("q", durable=True)
        properties = pika.BasicProperties(delivery_mode=2)
        for n in range(first, first + count):
            channel.basic_publish("", "q", str(n).encode() + BODY, properties, mandatory=True)
        connection.close()
    finally:
        watchdog.cancel()


def drain(node: ClusterNode) -> list[int]:
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    found = []
    while True:
        method, _, body = channel.basic_get("q", auto_ack=True)
        if method is None:
            break
        found.append(int(body[: body.index(b"x")]))
    connection.close()
    return found


def test_a_follower_on_a_full_disk_drops_out_and_catches_up_when_room_returns(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    cluster = Cluster(tmp_path / "cluster", etcd.endpoint, 2, lease_ttl_s=LEASE_TTL_S)
    follower = cluster.nodes[1]
    with small_filesystem(tmp_path / "small", SMALL_FS) as small, cluster:
        follower.data_dir = small / "data"
        leader = cluster.start(TIMEOUT_S)
        filler = fill(small / "filler", ROOM_LEFT_BYTES)
        publish(leader, 0, MESSAGES)  # all confirmed, the follower's disk full meanwhile
        wait_log(follower, NO_SPACE, TIMEOUT_S)
        assert cluster.isr_ids() == {leader.node_id}
        filler.unlink()
        cluster.wait_in_sync(cluster.nodes, TIMEOUT_S)
        publish(leader, MESSAGES, AFTER)
        cluster.wait_in_sync(cluster.nodes, TIMEOUT_S)
        leader.stop()  # resigns: the follower, in sync, takes over
        assert cluster.wait_leader(TIMEOUT_S) is follower
        got = drain(follower)
    assert got == list(range(MESSAGES + AFTER))
    assert b"Traceback" not in follower.log(), follower.log_tail()


def test_a_first_start_on_a_full_disk_waits_for_room(
    etcd: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ENOSPC on the node id's writes alone (the LD_PRELOAD shim): the rest of the start
    # (the data directory's lock file) has room.
    shim = EioShim(tmp_path / "shim", ".clustering_id", write_errno=errno.ENOSPC)
    for name, value in shim.environment().items():
        monkeypatch.setenv(name, value)  # the node's process inherits them
    shim.fail(writes=True)
    cluster = Cluster(tmp_path / "cluster", etcd.endpoint, 1, lease_ttl_s=LEASE_TTL_S)
    node = cluster.nodes[0]
    with cluster:
        node.start()
        wait_log(node, b"clustering: no room to write the node id (" + NO_SPACE, TIMEOUT_S)
        time.sleep(1.5)  # and again: held, not given up
        assert node.alive and node.log().count(b"no room to write the node id") >= 2
        shim.fail()
        assert cluster.wait_leader(TIMEOUT_S) is node
    assert b"Traceback" not in node.log(), node.log_tail()


def test_a_follower_whose_writes_come_out_short_copies_every_byte(
    etcd: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every write of the second node's data files writes half of what it was given (a
    # filling disk's short writes): its full sync must write on from where each stopped.
    shim = EioShim(tmp_path / "shim", "/n1/data/")
    for name, value in shim.environment().items():
        monkeypatch.setenv(name, value)
    shim.fail(short=True)
    cluster = Cluster(tmp_path / "cluster", etcd.endpoint, 1, lease_ttl_s=LEASE_TTL_S)
    with cluster:
        leader = cluster.start(TIMEOUT_S)
        publish(leader, 0, MESSAGES)  # on the leader's disk before the follower comes
        follower = cluster.add_node()  # n1: copies them in its full sync
        cluster.wait_in_sync(cluster.nodes, TIMEOUT_S)
        leader.stop()
        assert cluster.wait_leader(TIMEOUT_S) is follower
        got = drain(follower)
    assert got == list(range(MESSAGES))
