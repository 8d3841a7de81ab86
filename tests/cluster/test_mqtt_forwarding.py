"""MQTT in a cluster: a follower forwards MQTT connections to the leader (with a PROXY
v1 header naming the client), and a persistent session survives a leader failover.

Method: two `streamq serve --clustering` nodes with MQTT listeners of their own and a
real etcd (tests/cluster/cluster_nodes.py). paho-mqtt opens a persistent session (clean
session 0) through the follower, subscribes at QoS 1 and goes away; another client
publishes QoS 1 messages through the follower, each PUBACKed (on disk and replicated:
the leader's sync rounds wait for the in-sync followers). The leader is SIGKILLed; the
follower takes over; the old leader, restarted, follows it. The subscriber comes back
through the old leader, now a follower: its session is present and every message
published before the failover is delivered."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.cluster_nodes import Cluster, ClusterNode, http_json
from tests.cluster.etcd_server import EtcdServer
from tests.differential.peers import free_port
from tests.mqtt.clients import Paho, eventually

MESSAGES = 20
TIMEOUT_S = 30.0


class MqttClusterNode(ClusterNode):
    """A node with an MQTT listener on a port of its own (kept across restarts)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.mqtt_port = free_port()

    def mqtt_off(self) -> tuple[str, ...]:
        return ("--mqtt-port", str(self.mqtt_port))


class MqttCluster(Cluster):
    def _new_node(self) -> ClusterNode:
        name = f"n{len(self.nodes)}"
        node = MqttClusterNode(
            name, self.base / name, self.etcd_endpoint, lease_ttl_s=self.lease_ttl_s
        )
        self.nodes.append(node)
        return node


def mqtt_port(node: ClusterNode) -> int:
    assert isinstance(node, MqttClusterNode)
    return node.mqtt_port


@pytest.mark.timeout(180)
def test_mqtt_through_a_follower_and_a_persistent_session_across_failover(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    with MqttCluster(tmp_path / "c", etcd.endpoint, 2) as cluster:
        leader = cluster.start()
        follower = cluster.nodes[1]
        assert follower.role() == "follower"

        sub = Paho(mqtt_port(follower), "plant-sub", clean=False)
        assert sub.connect() == (False, 0)
        listed = http_json(leader.http_port, "/api/connections")
        # The leader serves it, and shows the client (PROXY header), not the follower.
        [connection] = [c for c in listed if c["client_properties"]["client_id"] == "plant-sub"]
        assert connection["protocol"] == "MQTT 3.1.1"
        assert (connection["peer_host"], connection["port"]) == ("127.0.0.1", mqtt_port(follower))
        assert connection["peer_port"] == sub.client.socket().getsockname()[1]
        assert sub.subscribe("plant/#", 1) == [1]
        sub.disconnect()

        pub = Paho(mqtt_port(follower), "plant-pub")
        assert pub.connect() == (False, 0)
        for i in range(MESSAGES):
            pub.publish(f"plant/line{i % 3}", b"m%d" % i, 1)  # waits for each PUBACK
        pub.disconnect()

        leader.kill()
        new_leader = cluster.wait_leader(TIMEOUT_S, exclude=(leader,))
        assert new_leader is follower
        leader.start()  # comes back as a follower of the new leader
        assert eventually(lambda: leader.role() == "follower", TIMEOUT_S), cluster.log_tails()
        cluster.wait_in_sync(cluster.nodes, TIMEOUT_S)

        again = Paho(mqtt_port(leader), "plant-sub", clean=False)  # through the new follower
        assert again.connect() == (True, 0)  # the session is present
        got = again.receive(MESSAGES, timeout_s=TIMEOUT_S)
        assert sorted(m.payload for m in got) == sorted(b"m%d" % i for i in range(MESSAGES))
        assert all(m.qos == 1 for m in got)
        assert again.nothing_more()
        again.disconnect()
