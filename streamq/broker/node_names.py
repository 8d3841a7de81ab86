"""What a node is called, as RabbitMQ names its nodes (`rabbit@host`): the management
API's `node` fields, `/api/nodes` and the `node` server property of an AMQP connection
all use these names. A single broker is named after its host; a cluster node after its
node id, which is unique where host names may not be (nodes in containers or network
namespaces share theirs)."""

from __future__ import annotations

import socket
from typing import Final

from streamq.broker.broker import Broker

PRODUCT_NAME: Final = "streamq"


def node_name() -> str:
    """A single broker's name, RabbitMQ style (`rabbit@host`)."""
    return f"{PRODUCT_NAME}@{socket.gethostname()}"


def cluster_node_name(node_id: str) -> str:
    """A cluster node's name: `streamq@<node id>`."""
    return f"{PRODUCT_NAME}@{node_id}"


def this_node_name(broker: Broker) -> str:
    """The name of the node `broker` runs on."""
    return node_name() if broker.cluster is None else cluster_node_name(broker.cluster.node_id)
