"""What the management API sees of the cluster a broker serves in: `Broker.cluster`.

Owns the `ClusterView` protocol, the one way the HTTP gateway reads the cluster (nodes,
roles, the in-sync replica set, replication lag) without importing `streamq.cluster`,
which sits above it (the node controller implements the view and sets `Broker.cluster`
on the broker it opens as leader). A single-node broker has no view (None). It holds no
state and starts nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

LEADER = "leader"
FOLLOWER = "follower"


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One cluster node as the leader sees it. `state` is "serving" for the leader,
    "syncing" or "streaming" for a connected follower, "disconnected" for a registered
    node with no replication connection; lag is in stream bytes and in seconds (the age of
    the oldest byte it has not acked), 0 for the leader."""

    node_id: str
    cluster_role: str  # LEADER or FOLLOWER
    in_isr: bool
    state: str
    replication_lag_bytes: int
    replication_lag_seconds: float
    advertised_uri: str
    amqp: str  # host:port of its AMQP listener
    http: str
    is_self: bool
    # What stream clients are told of its stream port ("host:port"; "" without one):
    # Metadata lists in-sync followers with one as the streams' replicas.
    stream_advertised: str = ""

    @property
    def connected(self) -> bool:
        return self.cluster_role == LEADER or self.state != "disconnected"


class ClusterView(Protocol):
    """The leader's view of its cluster (read on the event loop)."""

    @property
    def node_id(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def isr_size(self) -> int: ...

    def nodes(self) -> list[NodeRow]:
        """Every known node, this one first."""
        ...
