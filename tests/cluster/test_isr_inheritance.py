"""A new leader keeps the followers that were in sync at its election in the ISR (rule 4
of streamq.cluster.isr), so a second failover right after the first can elect any of
them and loses nothing. Three real nodes and a real etcd: the leader is killed, the ISR
in etcd is read the moment the next leader serves (the third node is in it, before it
has even reconnected), then that leader is killed too, once the third node streams from
it: the third node takes over with every confirmed message."""

from __future__ import annotations

import base64
import json
import urllib.request
from pathlib import Path

import pika

from tests.cluster.cluster_nodes import PREFIX, Cluster
from tests.cluster.etcd_server import EtcdServer

LEASE_TTL_S = 3
TAKEOVER_TIMEOUT_S = LEASE_TTL_S + 15.0
IN_SYNC_TIMEOUT_S = 45.0
MESSAGES = 200
QUEUE = "kept"


def etcd_isr(endpoint: str) -> set[str]:
    """The ISR as etcd holds it now."""
    query = {"key": base64.b64encode(f"{PREFIX}/isr".encode()).decode()}
    request = urllib.request.Request(f"http://{endpoint}/v3/kv/range", json.dumps(query).encode())
    with urllib.request.urlopen(request, timeout=5) as response:
        kvs = json.loads(response.read()).get("kvs") or []
    value = base64.b64decode(kvs[0]["value"]).decode() if kvs else ""
    return {node for node in value.split(",") if node}


def publish_confirmed(port: int, count: int) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(QUEUE, durable=True)
        for n in range(count):
            channel.basic_publish("", QUEUE, b"m%d" % n, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


def depth(port: int) -> int:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        return int(connection.channel().queue_declare(QUEUE, passive=True).method.message_count)
    finally:
        connection.close()


def test_a_second_failover_right_after_the_first_elects_a_kept_follower(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    with Cluster(tmp_path / "cluster", etcd.endpoint, 3, lease_ttl_s=LEASE_TTL_S) as cluster:
        first = cluster.start()
        publish_confirmed(first.amqp_port, MESSAGES)
        cluster.wait_in_sync(cluster.nodes, IN_SYNC_TIMEOUT_S)
        assert etcd_isr(etcd.endpoint) == {node.node_id for node in cluster.nodes}

        first.kill()
        second = cluster.wait_leader(TAKEOVER_TIMEOUT_S, (first,))
        third = next(node for node in cluster.nodes if node not in (first, second))
        # The third node is kept from the start (the first one too: still registered
        # until its lease runs out), not only once it has synced from the new leader.
        assert third.node_id in etcd_isr(etcd.endpoint), cluster.log_tails()
        assert b"clustering: keeping " in second.log()

        publish_confirmed(second.amqp_port, MESSAGES)  # these wait for the third node
        cluster.wait_in_sync([second, third], IN_SYNC_TIMEOUT_S)
        second.kill()
        new = cluster.wait_leader(TAKEOVER_TIMEOUT_S, (first, second))
        assert new is third
        assert depth(third.amqp_port) == 2 * MESSAGES
