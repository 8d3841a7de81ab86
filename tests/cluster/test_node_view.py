"""The pure parts of a node: its registered addresses and the leader's node rows."""

from __future__ import annotations

import socket

from streamq.app import ServeConfig
from streamq.broker.cluster_view import FOLLOWER, LEADER
from streamq.cluster.controller import advertised_uri, node_info
from streamq.cluster.isr import FollowerStatus
from streamq.cluster.membership import NodeInfo
from streamq.cluster.view import node_rows


def test_the_advertised_uri_defaults_to_the_clustering_bind_and_port() -> None:
    assert advertised_uri(ServeConfig()) == "tcp://127.0.0.1:5679"
    assert advertised_uri(ServeConfig(clustering_bind="::1", clustering_port=7)) == "tcp://[::1]:7"
    given = ServeConfig(clustering_advertised_uri="tcp://n1.example:5679")
    assert advertised_uri(given) == "tcp://n1.example:5679"


def test_registered_addresses_replace_wildcards_with_the_advertised_host() -> None:
    config = ServeConfig(
        bind="0.0.0.0",
        http_bind="127.0.0.3",
        amqp_port=5672,
        http_port=15672,
        amqps_port=5671,
        clustering_advertised_uri="tcp://10.0.0.1:5679",
    )
    assert node_info(config, "n1") == NodeInfo(
        node_id="n1",
        advertised_uri="tcp://10.0.0.1:5679",
        amqp="10.0.0.1:5672",
        http="127.0.0.3:15672",
        amqps="10.0.0.1:5671",
        https="",  # -1: off
        stream="10.0.0.1:5552",
        stream_advertised=f"{socket.gethostname()}:5552",  # as the stream gateway's default
        mqtt="10.0.0.1:1883",  # [mqtt] bind unset: `bind`'s wildcard, the advertised host
        mqtts="",
    )


def test_the_stream_port_is_registered_with_its_advertised_address() -> None:
    config = ServeConfig(stream_port=5553, stream_advertised_host="s1.example",
                         stream_advertised_port=6000)  # fmt: skip
    info = node_info(config, "n1")
    assert (info.stream, info.stream_advertised) == ("127.0.0.1:5553", "s1.example:6000")
    off = node_info(ServeConfig(stream_port=-1), "n1")
    assert (off.stream, off.stream_advertised) == ("", "")


def test_rows_join_registered_nodes_and_live_followers() -> None:
    me = NodeInfo("a", "tcp://h:1", "h:2", "h:3")
    registered = [
        me,
        NodeInfo("b", "tcp://h:11", "h:12", "h:13"),
        NodeInfo("c", "tcp://h:21", "", ""),
    ]
    live = [
        FollowerStatus("b", "127.0.0.1", "streaming", True, 100, 5, 0.25),
        FollowerStatus("d", "127.0.0.2", "syncing", False, 0, 900, 2.0),  # not registered (yet)
    ]
    rows = node_rows(me, registered, live, frozenset({"a", "b"}))
    assert [(r.node_id, r.cluster_role, r.in_isr, r.state) for r in rows] == [
        ("a", LEADER, True, "serving"),
        ("b", FOLLOWER, True, "streaming"),
        ("c", FOLLOWER, False, "disconnected"),
        ("d", FOLLOWER, False, "syncing"),
    ]
    assert (rows[1].replication_lag_bytes, rows[1].replication_lag_seconds) == (5, 0.25)
    assert rows[1].amqp == "h:12" and rows[3].amqp == ""
    assert rows[0].is_self and not any(r.is_self for r in rows[1:])
    assert [r.connected for r in rows] == [True, True, False, True]
