"""A node's follower mode: mirror the leader's data directory and forward clients to it.

Owns one `Following` per leader followed: the replication client (`ReplicationClient`,
restarted after FOLLOW_RETRY_S whenever its connection ends, while the same leader is
elected; in replication version 3, or 2 for a leader that closed before greeting 3), the
forwarders on this node's client ports (`proxy.Forwarder`: AMQP with a PROXY v1 header,
HTTP, MQTT with a PROXY v1 header, and the TLS ports when both nodes have them) and, when
the leader has a stream port, the stream port (`stream_proxy.StreamProxy`: piped to the
leader's, with subscriptions served from this node's copy up to what `ReplicaProgress`
allows). `close()` stops both and returns only once the replication client's last write
to the data directory is done, so that the caller may then open a broker on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from streamq.app import ServeConfig
from streamq.cluster import replication as wire
from streamq.cluster.follower import ReplicationClient
from streamq.cluster.membership import NodeInfo
from streamq.cluster.proxy import Forwarder, split_address
from streamq.cluster.replica_progress import ReplicaProgress
from streamq.cluster.replication import ReplicationError
from streamq.cluster.stream_proxy import StreamProxy

logger = logging.getLogger("streamq")

FOLLOW_RETRY_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class ForwardedPort:
    what: str  # "AMQP", "HTTP", "AMQPS", "HTTPS", "MQTT", "MQTTS"
    host: str  # this node's listening address
    port: int
    target: str  # the leader's "host:port"
    proxy_header: bool


def forwarded_ports(config: ServeConfig, leader: NodeInfo) -> list[ForwardedPort]:
    """This node's client ports and the leader's matching addresses: AMQP (with a PROXY
    header: the leader's AMQP listener trusts its followers' headers), HTTP, MQTT (with a
    PROXY header too) where both nodes have it, and the TLS ports where this node has
    one and the leader advertises one."""
    http_bind = config.bind if config.http_bind is None else config.http_bind
    ports = [
        ForwardedPort("AMQP", config.bind, config.amqp_port, leader.amqp, True),
        ForwardedPort("HTTP", http_bind, config.http_port, leader.http, False),
    ]
    if config.amqps_port >= 0 and leader.amqps:
        ports.append(ForwardedPort("AMQPS", config.bind, config.amqps_port, leader.amqps, False))
    if config.https_port >= 0 and leader.https:
        ports.append(ForwardedPort("HTTPS", http_bind, config.https_port, leader.https, False))
    mqtt_bind = config.bind if config.mqtt_bind is None else config.mqtt_bind
    if config.mqtt_port >= 0 and leader.mqtt:
        ports.append(ForwardedPort("MQTT", mqtt_bind, config.mqtt_port, leader.mqtt, True))
    if config.mqtts_port >= 0 and leader.mqtts:
        ports.append(ForwardedPort("MQTTS", mqtt_bind, config.mqtts_port, leader.mqtts, False))
    return ports


class Following:
    """Following `leader` into `config.data_dir` as node `node_id`."""

    def __init__(
        self,
        config: ServeConfig,
        node_id: str,
        secret: str,
        leader: NodeInfo,
        tls: Callable[[], ssl.SSLContext] | None = None,
    ):
        self.config = config
        self.node_id = node_id
        self.secret = secret
        self.leader = leader
        self.tls = tls  # the replication link's client context now (None: clear text)
        self.client: ReplicationClient | None = None
        self.replica = ReplicaProgress()
        self.version = wire.VERSION
        self._forwarders: list[Forwarder] = []
        self._stream_proxy: StreamProxy | None = None
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def synced(self) -> bool:
        return self.client is not None and self.client.synced

    async def start(self) -> None:
        logger.info(
            "clustering: following leader %s at %s",
            self.leader.node_id,
            self.leader.advertised_uri,
        )
        for port in forwarded_ports(self.config, self.leader):
            await self._forward(port)
        await self._proxy_streams()
        self._task = asyncio.get_running_loop().create_task(self._replicate())

    async def _forward(self, port: ForwardedPort) -> None:
        forwarder = Forwarder(port.what, split_address(port.target), proxy_header=port.proxy_header)
        try:
            await forwarder.start(port.host, port.port)
        except OSError as exc:
            logger.error(
                "clustering: cannot forward %s on %s:%s to the leader: %s",
                port.what, port.host, port.port, exc.strerror,
            )  # fmt: skip
            return
        self._forwarders.append(forwarder)

    async def _proxy_streams(self) -> None:
        """The stream port, when both this node and the leader have one."""
        config = self.config
        if config.stream_port < 0 or not self.leader.stream:
            return
        advertised = (config.stream_advertised_host or socket.gethostname(),
                      config.stream_advertised_port)  # fmt: skip
        proxy = StreamProxy(split_address(self.leader.stream), config.data_dir, self.replica,
                            advertised=advertised, frame_max=config.stream_frame_max)  # fmt: skip
        try:
            await proxy.start(config.bind, config.stream_port)
        except OSError as exc:
            logger.error("clustering: cannot open the stream port %s:%s: %s",
                         config.bind, config.stream_port, exc.strerror)  # fmt: skip
            return
        self._stream_proxy = proxy

    async def _replicate(self) -> None:
        while not self._stopping.is_set():
            self.client = ReplicationClient(
                self.config.data_dir,
                self.node_id,
                self.secret,
                self.leader.advertised_uri,
                self.tls() if self.tls is not None else None,  # read at each connection
                version=self.version,
                replica=self.replica,
            )
            try:
                await self.client.run()
            except ReplicationError as exc:
                logger.warning("clustering: replication from %s ended: %s", self.leader.node_id,
                               exc)  # fmt: skip
                if exc.before_greeting:
                    # A leader of version 2 closes at a hello of 3 (a rolling upgrade):
                    # the next attempt says 2, the one after 3 again, and so on.
                    oldest = min(wire.VERSIONS_ACCEPTED)
                    self.version = wire.VERSION if self.version == oldest else oldest
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), FOLLOW_RETRY_S)

    async def close(self) -> None:
        """Close the forwarders (and their clients' connections), stop replicating; the
        data directory is not written once this returns."""
        self._stopping.set()
        for forwarder in self._forwarders:
            await forwarder.close()
        self._forwarders.clear()
        if self._stream_proxy is not None:
            await self._stream_proxy.close()
            self._stream_proxy = None
        if self.client is not None:
            self.client.stop()  # run() returns after its writes are done
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
