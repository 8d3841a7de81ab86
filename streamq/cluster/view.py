"""The leader's `ClusterView`: what /api/nodes, the metrics and `ctl cluster_status` show.

Owns joining the two sources a leader has: the nodes registered in etcd (refreshed every
REFRESH_S on a task, since the management API reads the view synchronously) and the
replication server's live follower states (connection state, ISR membership, lag). It
decides nothing and writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from streamq.broker.cluster_view import FOLLOWER, LEADER, NodeRow
from streamq.cluster.isr import FollowerStatus
from streamq.cluster.leader import ReplicationServer
from streamq.cluster.membership import NodeInfo

logger = logging.getLogger(__name__)

REFRESH_S: Final = 2.0
NODES_MAX: Final = 1000  # of the registered nodes, how many the view lists


def node_rows(
    me: NodeInfo, registered: list[NodeInfo], followers: list[FollowerStatus], isr: frozenset[str]
) -> list[NodeRow]:
    """This node (the leader) first, then every other registered or connected node."""
    rows = [NodeRow(me.node_id, LEADER, True, "serving", 0, 0.0,
                    me.advertised_uri, me.amqp, me.http, True)]  # fmt: skip
    live = {status.node_id: status for status in followers}
    known = {info.node_id: info for info in registered if info.node_id != me.node_id}
    for node_id in sorted(known.keys() | live.keys())[:NODES_MAX]:
        info, status = known.get(node_id), live.get(node_id)
        rows.append(
            NodeRow(
                node_id=node_id,
                cluster_role=FOLLOWER,
                in_isr=node_id in isr,
                state=status.state if status is not None else "disconnected",
                replication_lag_bytes=status.lag_bytes if status is not None else 0,
                replication_lag_seconds=status.lag_s if status is not None else 0.0,
                advertised_uri=info.advertised_uri if info is not None else "",
                amqp=info.amqp if info is not None else "",
                http=info.http if info is not None else "",
                is_self=False,
                stream_advertised=info.stream_advertised if info is not None else "",
            )
        )
    return rows


class LeaderView:
    """`Broker.cluster` on a leader (streamq.broker.cluster_view.ClusterView)."""

    def __init__(
        self,
        me: NodeInfo,
        server: ReplicationServer,
        registered: Callable[[], Awaitable[list[NodeInfo]]],
    ) -> None:
        self._me = me
        self._server = server
        self._registered_source = registered
        self._registered: list[NodeInfo] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def node_id(self) -> str:
        return self._me.node_id

    @property
    def role(self) -> str:
        return LEADER

    @property
    def isr_size(self) -> int:
        return len(self._server.isr)

    def nodes(self) -> list[NodeRow]:
        return node_rows(self._me, self._registered, self._server.followers(), self._server.isr)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._refresh())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _refresh(self) -> None:
        while True:
            try:
                self._registered = await self._registered_source()
            except Exception as exc:  # etcd down: the last list stays shown
                logger.debug("clustering: cannot list the nodes: %s", exc)
            await asyncio.sleep(REFRESH_S)
