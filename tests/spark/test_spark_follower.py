"""Analytics off the leader: the Spark source reads a follower's data directory (its mirror
of the leader's) and finds every message of a stream the leader confirmed; the leader's own
directory is never opened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pika
import pytest

from tests.cluster.cluster_nodes import Cluster
from tests.cluster.conftest import etcd  # noqa: F401 (the etcd fixture)
from tests.cluster.etcd_server import EtcdServer

pytestmark = pytest.mark.spark

LEASE_TTL_S = 3
MESSAGES = 500
SMALL_SEGMENTS = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}


def publish_stream(port: int, stream: str, count: int) -> None:
    """`count` messages under confirms, body b"msg-<n>": confirmed means every in-sync
    follower has them on its disk."""
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=10)
    )
    try:
        channel = connection.channel()
        channel.queue_declare(stream, durable=True, arguments=SMALL_SEGMENTS)
        channel.confirm_delivery()
        for n in range(count):
            channel.basic_publish("", stream, f"msg-{n}".encode())
    finally:
        connection.close()


@pytest.mark.timeout(240)
def test_spark_reads_a_followers_data_directory(
    spark: Any,
    etcd: EtcdServer,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    with Cluster(tmp_path / "cluster", etcd.endpoint, 2, lease_ttl_s=LEASE_TTL_S) as cluster:
        leader = cluster.start()
        follower = next(node for node in cluster.nodes if node is not leader)
        publish_stream(leader.amqp_port, "events", MESSAGES)
        assert follower.node_id in cluster.isr_ids()  # so the confirms waited for it
        df = (
            spark.read.format("streamq")
            .option("path", str(follower.data_dir))
            .option("stream", "events")
            .load()
        )
        rows = sorted(df.select("offset", "body").collect(), key=lambda row: row.offset)
        assert [row.offset for row in rows] == list(range(MESSAGES))
        assert [bytes(row.body) for row in rows] == [f"msg-{n}".encode() for n in range(MESSAGES)]
